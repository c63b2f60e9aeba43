"""Equivalence classes: for random clusters and pod lists, batched placement equals one-by-one
placement in the same order (DESIGN.md, "Equivalence classes"), including nodes filling up,
scores normalized over the feasible nodes, nominations, GPUs chosen device by device, and pods
that fit nowhere."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.scheduler.cluster import ClusterState
from agents.scheduler.framework.profiles import load
from agents.scheduler.framework.runtime import Framework, gathered
from agents.state.cpus import NUMA_POLICY_LABEL
from agents.state.devices import GPU_CORE, GPU_RATIO
from schemas.records import (
    GangHold,
    GpuDevice,
    Node,
    Nomination,
    NumaCell,
    Pod,
    ResourceList,
    Taint,
    Toleration,
)
from tests.unit.scheduler.conftest import SPACE, info

PROFILES = load("""
profiles:
  - schedulerName: default-scheduler
  - schedulerName: packer
    pluginConfig:
      - name: NodeResourcesFit
        args: {scoringStrategy: {type: MostAllocated}}
""").by_name()

PREFER_ZONE = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 20, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}},
    {"weight": 5, "preference": {"matchExpressions": [{"key": "disk", "operator": "Exists"}]}},
]}}

nodes = st.lists(st.builds(
    lambda i, cpu, mem, zone, disk, taint, cordoned, gpus, numa: (cpu, mem, zone, disk, taint, cordoned, gpus, numa),
    st.integers(), st.integers(1, 16).map(lambda c: c * 500), st.integers(1, 16).map(lambda m: m * 2**28),
    st.sampled_from(["z1", "z2", "z3"]), st.booleans(),
    st.sampled_from([None, "soft", "hard"]), st.booleans(), st.sampled_from([0, 0, 1, 2, 4]),
    st.sampled_from([None, None, "None", "SingleNUMANode", "Restricted"]),  # NUMA topology policy
), min_size=1, max_size=12)

templates = st.lists(st.tuples(
    st.integers(0, 8).map(lambda c: c * 250),   # cpu (0: best effort)
    st.integers(0, 8).map(lambda m: m * 2**27),  # memory
    st.sampled_from([0, 5, 10]),                 # priority
    st.booleans(),                               # tolerates the soft taint
    st.booleans(),                               # prefers zone z1
    st.sampled_from([{}, {"zone": "z2"}]),       # node selector
    st.sampled_from([0, 0, 30, 50, 60, 100, 200]),  # GPU: a share of one (koordinator.sh/gpu-core), or whole ones
    st.booleans(),                               # LSR: bound to CPUs when it asks for whole ones
), min_size=1, max_size=4)


def build(node_specs: list[tuple], nominated: bool) -> ClusterState:  # type: ignore[type-arg]
    out = []
    for i, (cpu, mem, zone, disk, taint, cordoned, gpus, numa) in enumerate(node_specs):
        taints = () if taint is None else (Taint("spot", "1", "PreferNoSchedule" if taint == "soft" else "NoSchedule"),)
        labels = {"zone": zone, **({"disk": "ssd"} if disk else {}), **({NUMA_POLICY_LABEL: numa} if numa else {})}
        per_cell = cpu // 2000  # two cells of whole CPUs, two threads per core
        cells = tuple(NumaCell(c, tuple(range(c * per_cell, (c + 1) * per_cell)),
                               memory=mem // 3 if i % 2 else 0,  # odd nodes bind memory to cells too
                               cores=tuple(x // 2 for x in range(c * per_cell, (c + 1) * per_cell))) for c in range(2))
        out.append(Node(name=f"n{i:02d}", labels=labels, taints=taints, unschedulable=cordoned,
                        allocatable=ResourceList({"cpu": cpu, "memory": mem, "pods": 6}),
                        gpus=tuple(GpuDevice(minor=g) for g in range(gpus)), numa=cells if numa else ()))
    state = ClusterState.from_records(SPACE, out)
    if nominated:
        state.nominator.nominate(Nomination(uid="someone", node="n00", priority=5,
                                            requests=ResourceList(cpu=500, memory=2**28, pods=1)))
    return state


def pods_from(tpl: list[tuple], runs: list[tuple[int, int]]) -> list[Pod]:  # type: ignore[type-arg]
    out = []
    for t_index, count in runs:
        cpu, mem, prio, tolerate, prefer, selector, gpu, lsr = tpl[t_index % len(tpl)]
        gpu_requests = {GPU_CORE: gpu, GPU_RATIO: gpu} if gpu else {}
        for _ in range(count):
            uid = f"p{len(out):03d}"
            out.append(Pod(uid=uid, name=uid, priority=prio, qos_class="LSR" if lsr else "",
                           requests=ResourceList({"cpu": cpu, "memory": mem, **gpu_requests}),
                           tolerations=(Toleration("spot", "Exists"),) if tolerate else (),
                           affinity=PREFER_ZONE if prefer else {}, node_selector=selector))
    return out


def place(node_specs: list[tuple], nominated: bool, pods: list[Pod], profile: str, batching: bool,  # type: ignore[type-arg]
          gather: bool = False) -> list[tuple]:  # type: ignore[type-arg]
    state = build(node_specs, nominated)
    fw = Framework(PROFILES[profile], state, timer=lambda: 0)
    infos = [info(p) for p in pods]
    for i, p in enumerate(infos):
        p.arrival = i
        p.attempt = int(p.pod.uid[1:]) % 3  # pods back for another attempt share classes with new ones
    return [(p.pod.uid, p.node, p.status.code, p.diagnosis.message() if p.diagnosis else "",
             p.outputs)  # the Claims whole: devices, requests, nomination, gang, sandbox
            for p in fw.schedule(infos, batching=batching, gather=gather)]


@settings(max_examples=300)
@given(nodes, templates, st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12)), min_size=1, max_size=6),
       st.booleans(), st.sampled_from(["default-scheduler", "packer"]))
def test_batched_placement_equals_one_by_one(node_specs, tpl, runs, nominated, profile) -> None:  # type: ignore[no-untyped-def]
    pods = pods_from(tpl, runs)
    batched = place(node_specs, nominated, pods, profile, batching=True)
    one_by_one = place(node_specs, nominated, pods, profile, batching=False)
    assert batched == one_by_one


small_templates = st.lists(st.tuples(
    st.sampled_from([0, 10, 100, 250, 1000]),        # cpu: small, so that scores stay level for a while
    st.sampled_from([0, 2**20, 2**26, 2**28]),       # memory
    st.sampled_from([0, 5, 10]), st.booleans(), st.booleans(), st.sampled_from([{}, {"zone": "z2"}]),
    st.sampled_from([0, 0, 0, 30, 100]), st.booleans(),
), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=2, max_size=40), nodes, small_templates,
       st.lists(st.tuples(st.integers(0, 3), st.integers(1, 60)), min_size=1, max_size=4),
       st.booleans(), st.sampled_from(["default-scheduler", "packer"]))
def test_classes_over_many_equal_nodes_equal_one_by_one(kinds, node_specs, tpl, runs, nominated, profile) -> None:  # type: ignore[no-untyped-def]
    """Nodes of a few kinds, many of each, and long classes: the nodes that share the best
    score are decided together (`Framework._tier_runs`), through ties with nodes scored again,
    nodes filling up and the pods running out."""
    many = [node_specs[k % len(node_specs)] for k in kinds]
    pods = pods_from(tpl, runs)
    assert place(many, nominated, pods, profile, batching=True) == place(many, nominated, pods, profile, batching=False)


@settings(max_examples=200)
@given(nodes, templates, st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6)), min_size=1, max_size=8),
       st.booleans(), st.sampled_from(["default-scheduler", "packer"]))
def test_gathered_placement_equals_one_by_one_in_the_gathered_order(node_specs, tpl, runs, nominated, profile) -> None:  # type: ignore[no-untyped-def]
    """Gathering only reorders: equal signatures move up to the first of them, the rest keep
    their order, and the placements are those of one by one in that order."""
    pods = pods_from(tpl, runs)
    fw = Framework(PROFILES[profile], build(node_specs, nominated), timer=lambda: 0)
    order = gathered([fw.signature(info(p)) for p in pods])
    assert sorted(order) == list(range(len(pods)))
    gathered_pods = [pods[k] for k in order]
    by_uid = sorted(place(node_specs, nominated, pods, profile, batching=True, gather=True))
    assert by_uid == sorted(place(node_specs, nominated, gathered_pods, profile, batching=False))


def test_gathering_brings_equal_signatures_to_the_first_of_them() -> None:
    assert gathered(["a", "b", None, "a", "b", "c", "a"]) == [0, 3, 6, 1, 4, 2, 5]


def test_a_run_of_identical_pods_is_one_class() -> None:
    node_specs = [(4000, 2**33, "z1", False, None, False, 0, None)] * 3
    pods = pods_from([(500, 2**28, 0, False, False, {}, 0, False)], [(0, 9)])
    state = build(node_specs, nominated=False)
    fw = Framework(PROFILES["default-scheduler"], state, timer=lambda: 0)
    infos = [info(p) for p in pods]
    assert len({fw.signature(p) for p in infos}) == 1
    placed = [p.node for p in fw.schedule(infos)]
    assert sorted(placed) == ["n00"] * 3 + ["n01"] * 3 + ["n02"] * 3


def test_cell_memory_limits_a_class_like_one_by_one() -> None:
    # Nodes of 8 CPUs (two cells of 4) and 6Gi; LSR pods of 2 CPUs and 1.5Gi. n00 states no cell
    # memory: 4 fit (CPUs and node memory). n01's cells hold 2Gi each: one pod per cell, by
    # memory, not CPUs. The class path must stop where one by one does.
    node_specs = [(8000, 6 * 2**30, "z1", False, None, False, 0, "SingleNUMANode")] * 2
    pods = pods_from([(2000, 3 * 2**29, 0, False, False, {}, 0, True)], [(0, 10)])
    batched = place(node_specs, False, pods, "default-scheduler", batching=True)
    assert batched == place(node_specs, False, pods, "default-scheduler", batching=False)
    assert sorted(p[1] for p in batched if p[1]) == ["n00"] * 4 + ["n01"] * 2


class _ThirdWhenFirstIsFull:
    """A static score normalized over the feasible nodes, made so that the first node leaving
    the feasible set lifts the third above the rest: the ranking must be built again there."""

    NAME = "ThirdWhenFirstIsFull"
    DYNAMIC = False
    NORMALIZES = True
    SIGNATURE_FREE = True

    def score(self, cycle, pod, state, rows):  # type: ignore[no-untyped-def]
        return np.zeros(state.size, dtype=np.int64)[rows]

    def normalize(self, cycle, raw, feasible):  # type: ignore[no-untyped-def]
        out = np.zeros(len(raw), dtype=np.int64)
        if not feasible[0]:
            out[2] = 100
        return out


def test_a_node_filling_up_inside_a_tier_ranks_the_rest_anew() -> None:
    """Four equal nodes of two pods each share the best score; the first fills up, the static
    score lifts the third, so the next pods go there, as one by one gives (not to the second,
    as the tier's runs computed before it would)."""
    base = PROFILES["default-scheduler"]
    profile = replace(base, score=base.score + ((_ThirdWhenFirstIsFull(), 1),))
    node_specs = [(4000, 2**33, "z1", False, None, False, 0, None)] * 4
    pods = pods_from([(0, 0, 0, False, False, {}, 0, False)], [(0, 5)])
    nodes_of = []
    for batching in (True, False):
        state = build(node_specs, nominated=False)
        for row in range(4):  # two pods a node: four taken of its six
            for k in range(4):
                state.assume(f"x{row}/{k}", row, info(pods[0]).request)
        fw = Framework(profile, state, timer=lambda: 0)
        assert fw.batching
        nodes_of.append([p.node for p in fw.schedule([info(p) for p in pods], batching=batching)])
    assert nodes_of[0] == nodes_of[1] == ["n00", "n00", "n02", "n02", "n01"]


def test_members_of_different_gangs_are_different_classes() -> None:
    """Gang b holds a CPU on n0, not accepted: gang a outranks it (wound-wait: b would yield
    it to a), gang c does not. A class of a's and c's pods would give c's pods a's room
    (found by an adversarial review); their signatures differ, and batched placement equals
    one by one."""
    gangs = ["a", "c", "c"]
    pods = [Pod(uid=f"p{i}", name=f"p{i}", requests=ResourceList(cpu=1000, memory=2**20),
                annotations={"gang.scheduling.koordinator.sh/name": gang,
                             "gang.scheduling.koordinator.sh/min-available": "1"}) for i, gang in enumerate(gangs)]
    placed = []
    for batching in (True, False):
        nodes = [Node(name=f"n{i}", allocatable=ResourceList(cpu=2000, memory=2**32, pods=10)) for i in range(2)]
        state = ClusterState.from_records(SPACE, nodes)
        state.assume("hold-b", 0, SPACE.pod_request({"cpu": 1000}))
        state.gang_holds[0] = (GangHold("hold-b", "default/b", 0, 0.0, ResourceList(cpu=1000)),)
        fw = Framework(PROFILES["packer"], state, timer=lambda: 0)
        infos = [info(p) for p in pods]
        assert len({fw.signature(p) for p in infos}) == 2
        placed.append([p.node for p in fw.schedule(infos, batching=batching)])
    assert placed[0] == placed[1] == ["n0", "n1", "n1"]
