"""CPUs bound on NUMA nodes: requests, bind and topology policies, the plugin through the core,
owners checking CPUs, the resource-status annotation, and a preemptor's CPUs kept by its
nomination from lower-priority pods of any profile."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.scheduler.framework.profiles import load
from agents.state import cpus
from agents.state.cpus import Cell, CpuRequest, CpuSet
from agents.state.ledger import Decider, Decision, LedgerState
from agents.state.owner import NodeOwner, NodeState, OwnerResult
from agents.state.resources import ResourceSpace
from schemas.records import (
    BoundPod,
    Claim,
    EvictionCommand,
    Held,
    Node,
    NodeStateChange,
    Nomination,
    NumaCell,
    Pod,
    Rejected,
    ResourceList,
)

LSR = {"koordinator.sh/qosClass": "LSR"}
SPREAD = {cpus.RESOURCE_SPEC: json.dumps({"preferredCPUBindPolicy": "SpreadByPCPUs"})}


@pytest.mark.parametrize(("qos", "millis", "annotations", "expected"), [
    ("LSR", 4000, {}, CpuRequest(4, cpus.FULL_PCPUS)),
    ("LSE", 2000, SPREAD, CpuRequest(2, cpus.SPREAD_BY_PCPUS)),
    ("LS", 4000, {}, None),
    ("LSR", 1500, {}, None),
], ids=["lsr", "lse-spread", "ls-not-bound", "fractional-not-bound"])
def test_cpu_requests(qos: str, millis: int, annotations: dict[str, str], expected: CpuRequest | None) -> None:
    assert cpus.cpu_request(qos, millis, annotations) == expected


@pytest.mark.parametrize(("annotations", "field"), [
    ({cpus.RESOURCE_SPEC: "{nope"}, f"metadata.annotations.{cpus.RESOURCE_SPEC}"),
    ({cpus.RESOURCE_SPEC: '{"preferredCPUBindPolicy": "Anywhere"}'},
     f"metadata.annotations.{cpus.RESOURCE_SPEC}.preferredCPUBindPolicy"),
], ids=["not-json", "unknown-policy"])
def test_bad_resource_spec_names_the_field(annotations: dict[str, str], field: str) -> None:
    with pytest.raises(cpus.CpuError) as err:
        cpus.cpu_request("LSR", 2000, annotations)
    assert err.value.field == field


CELLS = [Cell(0, (0, 1, 2, 3), (0, 0, 1, 1)), Cell(1, (4, 5, 6, 7), (2, 2, 3, 3))]


@pytest.mark.parametrize(("req", "used", "policy", "expected"), [
    (CpuRequest(2), set(), "None", [CpuSet(0, (0, 1))]),  # a whole core
    (CpuRequest(2, cpus.SPREAD_BY_PCPUS), set(), "None", [CpuSet(0, (0, 2))]),  # one thread of two cores
    (CpuRequest(2), {0}, "None", [CpuSet(0, (2, 3))]),  # the fullest cell that fits; core 0 is not whole
    (CpuRequest(6), set(), "SingleNUMANode", None),
    (CpuRequest(6), set(), "BestEffort", [CpuSet(0, (0, 1, 2, 3)), CpuSet(1, (4, 5))]),
    (CpuRequest(4), {0, 4}, "Restricted", None),  # 3 + 3 free: two cells needed, whole cores too few
], ids=["full-core", "spread", "pack", "single-numa-too-big", "best-effort-spans", "restricted"])
def test_choose(req: CpuRequest, used: set[int], policy: str, expected: list[CpuSet] | None) -> None:
    assert cpus.choose(req, CELLS, used, policy) == expected


def numa_node(name: str, policy: str = "SingleNUMANode") -> Node:
    return Node(name=name, labels={cpus.NUMA_POLICY_LABEL: policy},
                allocatable=ResourceList({"cpu": 8000, "memory": 64 * 2**30}),
                numa=(NumaCell(0, (0, 1, 2, 3), cores=(0, 0, 1, 1)), NumaCell(1, (4, 5, 6, 7), cores=(2, 2, 3, 3))))


def bound_pod(uid: str, cpu: int, **kw: object) -> Pod:
    return Pod(uid=uid, name=uid, labels=dict(LSR), requests=ResourceList(cpu=cpu), **kw)  # type: ignore[arg-type]


PROFILES = load("profiles: [{schedulerName: default-scheduler}, {schedulerName: other}]")


def claims(outputs: list) -> list[Claim]:  # type: ignore[type-arg]
    return [o.record for o in outputs if isinstance(o.record, Claim)]


def test_bound_pods_get_cpusets_and_single_numa_nodes_refuse_what_spans_cells() -> None:
    space = ResourceSpace()
    core = SchedulerCore(space, ClusterState.from_records(space, [numa_node("n")]), lambda: 0.0, config=PROFILES)
    core.add(bound_pod("a", 2000))
    core.add(bound_pod("b", 4000))
    core.add(bound_pod("c", 6000))  # fits by totals (2 left), never in one cell
    got = {c.uid: c.devices for c in claims(core.schedule())}
    assert got == {"a": ("cpuset/0/0,1",), "b": ("cpuset/1/4,5,6,7",)}


def test_owners_check_cpus_and_the_binding_carries_resource_status() -> None:
    state, owner = NodeState("n"), NodeOwner()
    owner.apply(state, [numa_node("n")], OwnerResult())
    result = OwnerResult()
    claims_ = [Claim(uid=uid, attempt=0, node="n", decision_key=uid, requests=ResourceList(cpu=2000, pods=1),
                     devices=(devices,)) for uid, devices in (("a", "cpuset/0/0,1"), ("b", "cpuset/0/1,2"),
                                                             ("c", "cpuset/1/9"))]
    owner.apply(state, claims_, result)
    verdicts = {r.uid: getattr(r, "reason", "held") for r in (o.record for o in result.outputs)
                if isinstance(r, (Held, Rejected))}
    assert verdicts == {"a": "held", "b": "cpu 1 is bound to another pod", "c": "cpu 9 does not exist on the node"}
    [held] = [o.record for o in result.outputs if isinstance(o.record, Held)]
    decision = Decision()
    Decider().apply(LedgerState("a"), [held], decision)
    [binding] = [o.record for o in decision.after_commit]
    assert json.loads(binding.annotations[cpus.RESOURCE_STATUS]) == {
        "cpuset": "0-1", "numaNodeResources": [{"node": 0, "resources": {"cpu": "2"}}]}


def test_a_preemptors_numa_bound_cpus_stay_its_own() -> None:
    space = ResourceSpace()
    state = ClusterState.from_records(space, [numa_node("n")], {"n": [
        BoundPod(uid=f"v{i}", name=f"v{i}", priority=1, requests=ResourceList(cpu=2000, pods=1),
                 devices=(f"cpuset/{i // 2}/{2 * i},{2 * i + 1}",)) for i in range(4)]})
    for i in range(4):
        state.cpus.used.setdefault(state.index["n"], set()).update({2 * i, 2 * i + 1})
    core = SchedulerCore(space, state, lambda: 1000.0, config=PROFILES)
    core.add(bound_pod("boss", 4000, priority=100))
    outputs = core.schedule()
    [nomination] = [o.record for o in outputs if isinstance(o.record, Nomination)]
    victims = {o.record.uid for o in outputs if isinstance(o.record, EvictionCommand)}
    assert nomination.node == "n" and victims == {"v2", "v3"}
    assert nomination.devices == ("cpuset/1/4,5,6,7",)  # the CPUs its victims free are promised to it
    allocatable = ResourceList({"cpu": 8000, "memory": 64 * 2**30, "pods": 110})
    used = {f"cpu/{c}/used": 1 for i in range(4) if f"v{i}" not in victims for c in (2 * i, 2 * i + 1)}
    core.apply_state_changes([NodeStateChange(node="n", seq=3, allocatable=allocatable,
                                              used=ResourceList(cpu=4000, pods=2), device_usage=used,
                                              holds={f"{v}/0/n": "terminated" for v in victims},
                                              nominations=(nomination,))])
    core.add(bound_pod("small", 2000, priority=50, scheduler_name="other"))
    core.queue.clock = lambda: 2000.0
    got = claims(core.schedule())
    assert [c.uid for c in got] == ["boss"] and len(got[0].devices) == 1


GIB = 2**30
MEM_CELLS = [Cell(0, (0, 1, 2, 3), (0, 0, 1, 1), 8 * GIB), Cell(1, (4, 5, 6, 7), (2, 2, 3, 3), 8 * GIB)]


@pytest.mark.parametrize(("req", "used", "memory_used", "policy", "expected"), [
    (CpuRequest(2, memory=6 * GIB), {0, 1}, {0: 4 * GIB}, "SingleNUMANode",  # cell 0 has the CPUs, not the memory
     [CpuSet(1, (4, 5), 6 * GIB)]),
    (CpuRequest(2, memory=10 * GIB), set(), {}, "SingleNUMANode", None),  # no cell has 10Gi
    (CpuRequest(2, memory=10 * GIB), set(), {}, "BestEffort",  # CPUs in one cell, memory from two
     [CpuSet(0, (0, 1), 8 * GIB), CpuSet(1, (), 2 * GIB)]),
    (CpuRequest(2, memory=6 * GIB), set(), {0: 6 * GIB, 1: 6 * GIB}, "BestEffort", None),  # 4Gi left in all
], ids=["memory-picks-the-cell", "single-numa-memory-too-big", "best-effort-spans-memory", "memory-short"])
def test_choose_binds_memory_to_cells(req: CpuRequest, used: set[int], memory_used: dict[int, int], policy: str,
                                      expected: list[CpuSet] | None) -> None:
    assert cpus.choose(req, MEM_CELLS, used, policy, memory_used) == expected


def test_memory_per_cell_through_the_scheduler_the_owner_and_the_binding() -> None:
    node = replace(numa_node("n"), numa=(NumaCell(0, (0, 1, 2, 3), 8 * GIB, (0, 0, 1, 1)),
                                         NumaCell(1, (4, 5, 6, 7), 8 * GIB, (2, 2, 3, 3))))
    space = ResourceSpace()
    core = SchedulerCore(space, ClusterState.from_records(space, [node]), lambda: 0.0, config=PROFILES)
    for uid, cpu, memory in (("a", 2000, 6 * GIB), ("b", 2000, 6 * GIB), ("c", 2000, 6 * GIB)):
        core.add(Pod(uid=uid, name=uid, labels=dict(LSR), requests=ResourceList(cpu=cpu, memory=memory)))
    got = {c.uid: c.devices for c in claims(core.schedule())}
    # a and b each take a cell's memory; c has CPUs left in both cells but 2Gi of memory in each.
    assert got == {"a": (f"cpuset/0/0,1/{6 * GIB}",), "b": (f"cpuset/1/4,5/{6 * GIB}",)}
    state, owner = NodeState("n"), NodeOwner()
    owner.apply(state, [node], OwnerResult())
    result = OwnerResult()
    over = Claim(uid="x", attempt=0, node="n", decision_key="x", requests=ResourceList(cpu=2000, pods=1),
                 devices=(f"cpuset/0/2,3/{4 * GIB}",))
    owner.apply(state, [Claim(uid="a", attempt=0, node="n", decision_key="a", requests=ResourceList(cpu=2000, pods=1),
                              devices=got["a"]), over], result)
    verdicts = {r.uid: getattr(r, "reason", "held") for r in (o.record for o in result.outputs)
                if isinstance(r, (Held, Rejected))}
    assert verdicts == {"a": "held", "x": "Insufficient memory in NUMA node 0"}
    assert json.loads(cpus.annotation(cpus.decode(got["a"])))["numaNodeResources"] == [
        {"node": 0, "resources": {"cpu": "2", "memory": str(6 * GIB)}}]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.booleans()), max_size=40))
def test_the_cpu_tables_rows_are_the_nodes_with_cells_whatever_the_order_of_updates(
        updates: list[tuple[int, bool]]) -> None:
    """`CpuTable.rows` (the rows NodeNUMAResource looks at) is made again only when a node gains
    or loses its cells; after any sequence of registrations and updates it lists exactly the
    rows whose node has cells, in order."""
    from agents.scheduler.cluster import CpuTable

    table, has = CpuTable(), {}
    for row, with_cells in updates:
        numa = (NumaCell(id=0, cpus=(0, 1)), NumaCell(id=1, cpus=(2, 3))) if with_cells else ()
        table.set_node(row, Node(name=f"n{row}", numa=numa))
        has[row] = with_cells
        assert table.rows.tolist() == sorted(r for r, c in has.items() if c)
