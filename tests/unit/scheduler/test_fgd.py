"""FGD as a scheduler plugin: the same placements, GPU by GPU, as the trace replay's FGD on the
same cluster and pods (both compute fragmentation in `agents.scheduler.fragmentation`); shares
go to the GPU FGD prefers; bad args name the field; pods without GPUs still batch."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from agents.scheduler import fragmentation as frag
from agents.scheduler.framework.profiles import ProfileError, load
from agents.scheduler.library import Scheduler
from agents.scheduler.plugins import fgd
from agents.state import devices
from perf import trace
from schemas.records import GpuDevice, Node, Pod, ResourceList

GI = 2**30
FGD_YAML = Path(__file__).parents[3] / "perf" / "profiles" / "fgd.yaml"
SHAPES = [(4000, 1, 50), (8000, 1, 30), (2000, 1, 20), (16000, 1, 100), (32000, 2, 100), (64000, 4, 100),
          (6000, 1, 70), (1000, 0, 0)]
WEIGHTS = [30, 20, 15, 12, 8, 4, 6, 5]


def gpu_node(name: str, gpus: int, cpu: int) -> Node:
    alloc = ResourceList(cpu=cpu, memory=512 * GI, pods=110)
    return Node(name=name, allocatable=alloc, capacity=alloc,
                gpus=tuple(GpuDevice(minor=i, model="V100", core=100, memory_ratio=100) for i in range(gpus)))


def gpu_pod(uid: str, cpu: int, gpus: int, core: int) -> Pod:
    requests = ResourceList(cpu=cpu, memory=GI)
    if gpus == 1 and core < 100:
        requests.update({devices.GPU_CORE: core, devices.GPU_RATIO: core})
    elif gpus:
        requests[devices.NVIDIA_GPU] = gpus
    return Pod(uid=uid, name=uid, requests=requests, scheduler_name="gpu-fgd")


PROFILE = """
profiles:
  - schedulerName: gpu-fgd
    plugins:
      multiPoint: {enabled: [{name: FGD, weight: 100}]}
      score: {disabled: [{name: "*"}]}
    pluginConfig:
      - name: FGD
        args:
          typicalPods:
""" + "".join(f"            - {{cpu: {c}m, gpus: {g}, gpuCore: {k}, weight: {w}}}\n"
              for (c, g, k), w in zip(SHAPES, WEIGHTS, strict=True) if g)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_plugin_places_like_the_trace_replay(seed: int) -> None:
    rng = random.Random(seed)
    specs = [(f"n{i}", rng.choice([2, 4, 8]), rng.choice([32000, 64000, 96000])) for i in range(12)]
    pods = [rng.choices(SHAPES, WEIGHTS)[0] for _ in range(90)]
    sched = Scheduler([gpu_node(*s) for s in specs], profiles=PROFILE)
    decisions = sched.schedule([gpu_pod(f"p{i}", *shape) for i, shape in enumerate(pods)])

    width = max(g for _, g, _ in specs)
    gpu_left = np.full((len(specs), width), -1, dtype=np.int64)
    for i, (_, g, _) in enumerate(specs):
        gpu_left[i, :g] = frag.MILLI
    cpu = np.array([c for *_, c in specs], dtype=np.int64)
    cluster = trace.Cluster(cpu=cpu.copy(), memory=np.full(len(specs), 512 * 1024, dtype=np.int64),
                            gpu_left=gpu_left, gpu_count=np.array([g for _, g, _ in specs], dtype=np.int64),
                            model=["V100"] * len(specs), cpu_cap=cpu)
    typical = fgd.typical_pods(Counter({s: w for s, w in zip(SHAPES, WEIGHTS, strict=True) if s[1]}))
    replay = trace.Replay(cluster, "FGD", typical, seed)
    placed = [replay.place(trace.TracePod(c, 1024, g, k * 10 if g else 0, frozenset())) for c, g, k in pods]

    assert [bool(d.node) for d in decisions] == placed
    used = sched.state.gpus.core_used[: len(specs), :width] * 10  # milli-GPU per GPU, by the scheduler
    expected = np.where(replay.c.gpu_left >= 0, frag.MILLI - replay.c.gpu_left, 0)
    assert (used == expected).all()


def test_a_share_goes_to_the_gpu_that_fragments_least() -> None:
    # GPU 0 has 50 free, GPU 1 has 80 free; typical pods want 50: a 30 share on GPU 1 leaves 50
    # there (still usable), on GPU 0 it leaves 20 (fragment). Best-fit packing would pick GPU 0.
    sched = Scheduler([gpu_node("a", 2, 64000)], profiles="""
profiles:
  - schedulerName: gpu-fgd
    plugins: {multiPoint: {enabled: [{name: FGD, weight: 100}]}}
    pluginConfig: [{name: FGD, args: {typicalPods: [{cpu: "1", gpus: 1, gpuCore: 50, weight: 1}]}}]
""")
    sched.schedule([gpu_pod("x", 1000, 1, 50), gpu_pod("y", 1000, 1, 20)])  # GPU 0 at 50, GPU 1 at 80
    assert sched.state.gpus.core_used[0, :2].tolist() == [50, 20]
    sched.schedule([gpu_pod("z", 1000, 1, 30)])
    assert sched.state.gpus.core_used[0, :2].tolist() == [50, 50]


@pytest.mark.parametrize(("item", "field"), [
    ({"gpus": 0}, "typicalPods[0].gpus"),
    ({"gpuCore": 150}, "typicalPods[0].gpuCore"),
    ({"gpus": 2, "gpuCore": 50}, "typicalPods[0].gpuCore"),
    ({"weight": 0}, "typicalPods[0].weight"),
    ({"cpu": "lots"}, "typicalPods[0].cpu"),
    ({"colour": "red"}, "typicalPods[0].colour"),
])
def test_bad_typical_pods_name_the_field(item: dict[str, object], field: str) -> None:
    args = {"cpu": "1", "gpus": 1, "gpuCore": 50, "weight": 1, **item}
    with pytest.raises(ProfileError) as exc:
        load(yaml.safe_dump({"profiles": [{"schedulerName": "g",
                                          "pluginConfig": [{"name": "FGD", "args": {"typicalPods": [args]}}]}]}))
    assert field in str(exc.value)


def test_pods_without_gpus_still_batch_and_gpu_pods_learn_typical_pods() -> None:
    sched = Scheduler([gpu_node(f"n{i}", 8, 64000) for i in range(3)], profiles=FGD_YAML.read_text())
    fw = sched.core.frameworks["gpu-fgd"]
    cpu_pod = Pod(uid="c", name="c", requests=ResourceList(cpu=1000), scheduler_name="gpu-fgd")
    assert fw.signature(sched.core.pod_info(cpu_pod)) is not None
    assert fw.signature(sched.core.pod_info(gpu_pod("g", 1000, 1, 50))) is None
    decisions = sched.schedule([gpu_pod(f"g{i}", 1000, 1, 50) for i in range(4)])
    assert all(d.node for d in decisions)
    [plugin] = [p for p in fw.profile.all() if p.NAME == "FGD"]
    assert plugin.learned == {(1000, 1, 50): 4}
