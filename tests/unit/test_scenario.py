"""Workload scenarios: the shipped ones read and generate what they say (pools, the mix by
share, gangs as runs, reservations ahead of their pods, bursts, the quick variant); bad files
are refused before a run with the file, the field and the value."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.state import devices
from perf import scenario
from perf.kwok import load_stages
from schemas.records import GANG_NAME_ANNOTATION, QOS_LABEL, Pod, Reservation

ROOT = Path(__file__).parents[2]
SHIPPED = sorted((ROOT / "perf" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_scenarios_read_and_their_stage_files_load(path: Path, tmp_path: Path) -> None:
    s = scenario.load(path)
    assert s.name == path.stem
    load_stages(ROOT / stage for stage in s.stages)
    if s.trace_load:  # nodes and pods come from the trace files
        s = scenario.with_trace(s, *tiny_trace(tmp_path, nodes=40))
    quick = s.quick()
    if s.trace_load:
        quick = scenario.with_trace(quick, *tiny_trace(tmp_path, nodes=40))
        assert len(scenario.nodes(quick)) < len(scenario.nodes(s))
        return
    assert sum(p.count for p in quick.pools) < sum(p.count for p in s.pools)
    records = scenario.arrivals(quick)
    assert 0 < len(records) <= quick.quick_pods * 1.5 + 100
    assert [at for at, _ in records] == sorted(at for at, _ in records)


def test_mixed_generates_the_mix_gangs_gpus_and_reservations() -> None:
    s = scenario.load(ROOT / "perf" / "scenarios" / "mixed-100k.yaml")
    s = s.quick()
    nodes = scenario.nodes(s)
    assert Counter(n.labels["pool"] for n in nodes) == {"cpu": 90, "gpu": 10}
    assert all(len(n.gpus) == 8 and n.allocatable[devices.NVIDIA_GPU] == 8 for n in nodes if n.labels["pool"] == "gpu")
    assert all(len(n.numa) == 2 and len(n.numa[0].cpus) == 32 for n in nodes if n.labels["pool"] == "cpu")
    records = scenario.arrivals(s)
    pods = [r for _, r in records if isinstance(r, Pod)]
    reservations = [r for _, r in records if isinstance(r, Reservation)]
    templates = Counter(p.labels["template"] for p in pods)
    assert 0.40 < templates["web"] / len(pods) < 0.50  # share 45 of 100
    gangs = Counter(p.annotations[GANG_NAME_ANNOTATION] for p in pods if GANG_NAME_ANNOTATION in p.annotations)
    assert all(count == 4 for count in gangs.values())
    assert all(p.requests[devices.GPU_CORE] == 50 for p in pods if p.labels["template"] == "infer")
    uids = [r.uid for _, r in records]
    for r in reservations:  # each reservation is published before the pod it is for
        owner = r.owners[0].object_uid
        assert uids.index(r.uid) < uids.index(owner)
    assert max(at for at, _ in records) == pytest.approx((len(pods) - 4) / s.rate, abs=0.01)


def test_sandbox_pods_carry_their_runtime_class_and_qos_label() -> None:
    s = scenario.load(ROOT / "perf" / "scenarios" / "sandbox-burst.yaml").quick()
    pods = [r for _, r in scenario.arrivals(s) if isinstance(r, Pod)]
    assert pods and {(p.runtime_class_name, p.labels.get(QOS_LABEL)) for p in pods} == {("gvisor", "BE")}


def test_generation_is_deterministic() -> None:
    s = scenario.load(ROOT / "perf" / "scenarios" / "basic.yaml").quick()
    assert scenario.arrivals(s) == scenario.arrivals(s)


BASE: dict[str, Any] = {
    "name": "t", "nodes": [{"pool": "a", "count": 2, "allocatable": {"cpu": "8", "memory": "16Gi"}}],
    "pods": {"total": 10, "mix": [{"name": "x", "share": 1, "requests": {"cpu": "1", "memory": "1Gi"}}]},
}


@pytest.mark.parametrize(("change", "field"), [
    ({"colour": "red"}, "colour"),
    ({"nodes": [{"pool": "a", "count": 0, "allocatable": {"cpu": "8", "memory": "1Gi"}}]}, "nodes[0].count"),
    ({"nodes": [{"pool": "a", "count": 1, "allocatable": {"memory": "1Gi"}}]}, "nodes[0].allocatable.cpu"),
    ({"nodes": [{"pool": "a", "count": 1, "allocatable": {"cpu": "6", "memory": "1Gi"}, "numa": {"cells": 4}}]},
     "nodes[0].numa.cells"),
    ({"nodes": [{"pool": "a", "count": 1, "allocatable": {"cpu": "lots", "memory": "1Gi"}}]},
     "nodes[0].allocatable.cpu"),
    ({"pods": {"total": 10, "mix": [{"name": "x", "requests": {"cpu": "64"}}]}}, "pods.mix[x]"),
    ({"pods": {"total": 10, "mix": [{"name": "x", "requests": {"cpu": "1"}, "gpu": {"share": 150}}]}},
     "pods.mix[0].gpu.share"),
    ({"pods": {"total": 10, "mix": [{"name": "x", "requests": {"cpu": "1"}, "qos": "Gold"}]}}, "pods.mix[0].qos"),
    ({"pods": {"total": 10, "mix": [{"name": "x", "requests": {"cpu": "1"}, "runtimeClassName": "gVisor"}]}},
     "pods.mix[0].runtimeClassName"),
    ({"pods": {"total": 10, "mix": [{"name": "x", "requests": {"cpu": "1"}}],
               "arrival": {"bursts": [{"at": "1s", "template": "y", "count": 5}]}}}, "pods.arrival.bursts[0].template"),
    ({"pods": {"total": 3, "mix": [{"name": "x", "requests": {"cpu": "1"}, "gang": {"size": 4}}]}},
     "pods.mix[x].gang.size"),
])
def test_a_bad_scenario_names_the_file_the_field_and_the_value(tmp_path: Path, change: dict[str, Any],
                                                               field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**BASE, **change}))
    with pytest.raises(scenario.ScenarioError) as exc:
        scenario.load(path)
    assert exc.value.field == field and str(exc.value).startswith(str(path))


def tiny_trace(tmp_path: Path, nodes: int = 3) -> tuple[Path, Path]:
    """A trace in the Alibaba files' format: nodes with 0, 2 or 8 GPUs of two models; pods
    with a share of a GPU, whole GPUs, a GPU model, or no GPU."""
    node_csv, pod_csv = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    rows = ["sn,cpu_milli,memory_mib,gpu,model"] + [
        f"n-{i:03d},64000,262144,{(0, 2, 8)[i % 3]},{('', 'T4', 'V100M32')[i % 3]}" for i in range(nodes)]
    node_csv.write_text("\n".join(rows) + "\n")
    pod_csv.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
                       "deletion_time,scheduled_time\n"
                       "p-0,8000,16384,1,455,,LS,Running,0,1,0\n"
                       "p-1,16000,32768,2,1000,V100M32,LS,Running,0,1,0\n"
                       "p-2,4000,8192,0,0,,BE,Running,0,1,0\n")
    return node_csv, pod_csv


def test_a_trace_scenario_takes_its_nodes_and_pods_from_the_trace_files(tmp_path: Path) -> None:
    s = scenario.with_trace(scenario.load(ROOT / "perf" / "scenarios" / "alibaba.yaml"), *tiny_trace(tmp_path))
    nodes = {n.name: n for n in scenario.nodes(s)}
    assert set(nodes) == {"n-000", "n-001", "n-002"}
    assert len(nodes["n-002"].gpus) == 8 and nodes["n-002"].labels == {scenario.GPU_MODEL_LABEL: "V100M32"}
    assert nodes["n-000"].allocatable["memory"] == 262144 * 2**20 and not nodes["n-000"].gpus
    pods = [r for _, r in scenario.arrivals(s)]
    assert all(isinstance(p, Pod) and p.scheduler_name == "gpu-fgd" for p in pods)
    # GPU capacity 10 GPUs at load 1.0: the shuffled three, then copies up to 10,000 milli-GPU.
    assert sum(p.requests.get(devices.GPU_CORE, 0) * 10 + p.requests.get(devices.NVIDIA_GPU, 0) * 1000
               for p in pods) <= 10_000
    share = next(p for p in pods if devices.GPU_CORE in p.requests)
    assert share.requests[devices.GPU_CORE] == share.requests[devices.GPU_RATIO] == 46  # 455 milli, rounded up
    whole = next(p for p in pods if devices.NVIDIA_GPU in p.requests)
    terms = whole.affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": scenario.GPU_MODEL_LABEL, "operator": "In",
                                            "values": ["V100M32"]}]}]
    assert [at for at, _ in scenario.arrivals(s)][:3] == [0.0, 1 / s.rate, 2 / s.rate]


def test_a_trace_scenario_needs_its_files_and_a_plain_one_refuses_them(tmp_path: Path) -> None:
    with pytest.raises(scenario.ScenarioError) as exc:
        scenario.with_trace(scenario.load(ROOT / "perf" / "scenarios" / "basic.yaml"), *tiny_trace(tmp_path))
    assert exc.value.field == "trace"
    bad = tmp_path / "bad-nodes.csv"
    bad.write_text("sn,cpu_milli,memory_mib,gpu,model\nn-0,lots,1,0,\n")
    with pytest.raises(ValueError, match="bad-nodes.csv:2: cpu_milli='lots'"):
        scenario.with_trace(scenario.load(ROOT / "perf" / "scenarios" / "alibaba.yaml"), bad, tiny_trace(tmp_path)[1])


@pytest.mark.parametrize(("change", "field"), [
    ({"trace": {"load": 0}}, "trace.load"),
    ({"trace": {"lode": 1}}, "trace.lode"),
    ({"profiles": "perf/profiles/missing.yaml"}, "profiles"),
])
def test_bad_trace_fields_are_refused(tmp_path: Path, change: dict[str, Any], field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "t", **change}))
    with pytest.raises(scenario.ScenarioError) as exc:
        scenario.load(path)
    assert exc.value.field == field


@pytest.mark.parametrize(("name", "pods", "pools", "total", "bursts"), [
    ("mixed-100k", 20000, {"cpu": 900, "gpu": 100}, 20000, []),
    ("mixed-100k", 100000, {"cpu": 4500, "gpu": 500}, 100000, []),
    ("sandbox-burst", 10000, {"sandbox": 1000}, 0, [2500] * 4),
    ("basic", 1, {"basic": 1}, 1, []),
], ids=["mixed-fifth", "mixed-whole", "bursts-scaled", "at-least-one-node"])
def test_scaled_keeps_the_ratio_of_nodes_to_pods(name: str, pods: int, pools: dict[str, int], total: int,
                                                 bursts: list[int]) -> None:
    s = scenario.load(ROOT / "perf" / "scenarios" / f"{name}.yaml").scaled(pods)
    assert {p.name: p.count for p in s.pools} == pools
    assert (s.total, [b.count for b in s.bursts]) == (total, bursts)
    assert sum(isinstance(r, Pod) for _, r in scenario.arrivals(s)) == pods
    assert s.name == f"{name} ({pods} pods)"


@pytest.mark.parametrize("pods", [0, -1, 100001], ids=["zero", "negative", "above-its-size"])
def test_scaled_refuses_sizes_it_cannot_scale_to(pods: int) -> None:
    with pytest.raises(scenario.ScenarioError) as err:
        scenario.load(ROOT / "perf" / "scenarios" / "mixed-100k.yaml").scaled(pods)
    assert err.value.field == "pods"


@pytest.mark.parametrize(("name", "namespace"), [
    ("mixed-100k", "mixed-100k"), ("mixed-100k (quick)", "mixed-100k-quick"),
    ("Sandbox_Burst (20000 pods)", "sandbox-burst-20000-pods"), ("(((", "perf"),
], ids=["plain", "quick", "upper-and-underscore", "nothing-left"])
def test_the_pods_namespace_is_a_valid_kubernetes_name(name: str, namespace: str) -> None:
    s = scenario.parse({**BASE, "name": name}, "t.yaml")
    assert s.namespace == namespace
    assert {r.namespace for _, r in scenario.arrivals(s) if isinstance(r, Pod)} == {namespace}


@pytest.mark.parametrize(("rate", "last"), [(100.0, 19.99), (4000.0, 0.49975)], ids=["slower", "faster"])
def test_at_rate_spreads_the_pods_over_the_new_rate(rate: float, last: float) -> None:
    s = scenario.parse({**BASE, "pods": {**BASE["pods"], "total": 2000}}, "t.yaml").at_rate(rate)
    assert s.rate == rate and s.name == f"t at {rate:g} pods/s"
    assert max(at for at, _ in scenario.arrivals(s)) == pytest.approx(last)


def test_at_rate_refuses_no_rate() -> None:
    with pytest.raises(scenario.ScenarioError) as err:
        scenario.parse(BASE, "t.yaml").at_rate(0)
    assert err.value.field == "rate"
