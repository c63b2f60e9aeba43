"""FragmentationAware's two planners: table-driven cases, and the invariants as properties (a
plan never over-commits a destination or breaks an arbitration limit or a budget; the
koordinator mode moves at most one pod per node per cycle; a global plan never raises the
cluster's summed or max std)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.rebalance import fragmentation as frag
from agents.rebalance.arbitration import ArbitrationArgs, Budget
from agents.rebalance.evictor import workload_of
from agents.rebalance.fragmentation import FragmentationArgs, MovePlan, plan_moves
from agents.rebalance.selectors import LabelSelector, Namespaces, PodSelectors
from agents.rebalance.view import ClusterView
from schemas.records import OwnerReference, Pod, Taint
from tests.builders import GI, make_node
from tests.unit.rebalance.conftest import NOW, nodes, planning, replica


def lopsided() -> tuple[list[Any], list[Pod]]:
    """Two nodes full of CPU-heavy pods, two full of memory-heavy ones."""
    pods = [replica(f"c{n}{k}", f"n{n}", workload="cpu", cpu=2000, memory=GI) for n in (0, 1) for k in range(3)]
    pods += [replica(f"m{n}{k}", f"n{n}", workload="mem", cpu=250, memory=8 * GI) for n in (2, 3) for k in range(3)]
    return nodes(4), pods


def plan(node_list: list[Any], pods: list[Pod], arbitration: ArbitrationArgs | None = None,
         budgets: tuple[Budget, ...] = (), **args: Any) -> MovePlan:
    view, sim, arb = planning(node_list, pods, arbitration, budgets)
    args.setdefault("min_pod_age_s", 0.0)
    return plan_moves(view, FragmentationArgs(**args), sim, arb, now=NOW)


@pytest.mark.parametrize("mode", frag.MODES)
def test_lopsided_nodes_are_evened_out(mode: str) -> None:
    p = plan(*lopsided(), ArbitrationArgs(max_unavailable_per_workload=3), mode=mode)
    assert p.moves and p.after.std_sum < p.before.std_sum
    for m in p.moves:
        assert m.destination and m.destination != m.source
        assert m.source_std[1] < m.source_std[0]


def test_global_swaps_kinds_between_nodes() -> None:
    p = plan(*lopsided(), ArbitrationArgs(max_unavailable_per_workload=5, max_migrating_per_node=6), mode="global")
    assert p.after.std_sum <= p.before.std_sum / 2
    kinds = {(m.workload.split("/")[-1], m.source[:1], m.destination) for m in p.moves}
    assert all(w == "cpu" and d in ("n2", "n3") or w == "mem" and d in ("n0", "n1") for w, _, d in kinds)


BALANCED: list[tuple[str, dict[str, Any], str]] = [
    ("below the threshold", {"imbalance_threshold": 0.45}, ""),
    ("paused", {"paused": True}, "paused"),
    ("namespace excluded", {"evictable_namespaces": Namespaces(exclude=frozenset({"default"}))}, frag.NAMESPACE),
    ("pods too young", {"min_pod_age_s": 2 * NOW}, frag.YOUNG),
    ("selector matches nothing", {"pod_selectors": PodSelectors((("x", LabelSelector({"app": "x"})),))},
     frag.SELECTOR),
    ("node selector matches nothing", {"node_selector": LabelSelector({"pool": "x"})}, ""),
]


@pytest.mark.parametrize("mode", frag.MODES)
@pytest.mark.parametrize(("args", "reason"), [b[1:] for b in BALANCED], ids=[b[0] for b in BALANCED])
def test_nothing_moves(mode: str, args: dict[str, Any], reason: str) -> None:
    p = plan(*lopsided(), mode=mode, **args)
    assert p.moves == () and p.after == p.before
    if reason:
        assert p.skipped.get(reason, 0) >= 1


def test_recently_moved_pods_stay() -> None:
    node_list, pods = lopsided()
    view, sim, arb = planning(node_list, pods)
    moved = {p.uid: NOW - 60 for p in pods}
    p = plan_moves(view, FragmentationArgs(min_pod_age_s=0.0), sim, arb, now=NOW, moved_at=moved)
    assert p.moves == () and p.skipped[frag.RECENT] == len(pods)


@pytest.mark.parametrize("mode", frag.MODES)
def test_protected_pods_stay(mode: str) -> None:
    node_list, pods = lopsided()
    daemon = (OwnerReference(kind="DaemonSet", name="d", uid="d", controller=True),)
    pods = [replace(p, owner_references=daemon) for p in pods]
    p = plan(node_list, pods, mode=mode)
    assert p.moves == () and p.skipped["DaemonSet pod"] == len(pods)


def test_destinations_pass_the_real_filters() -> None:
    """The only balanced destination is tainted: the global planner must not use it."""
    taint = (Taint(key="dedicated", value="x", effect="NoSchedule"),)
    node_list = [make_node("n0", cpu=8000, memory=32 * GI), make_node("n1", cpu=8000, memory=32 * GI, taints=taint)]
    pods = [replica(f"c{k}", "n0", cpu=2000, memory=GI) for k in range(3)]
    pods += [replica(f"m{k}", "n1", workload="mem", cpu=250, memory=8 * GI) for k in range(3)]
    p = plan(node_list, pods, mode="global")
    assert all(m.destination != "n1" for m in p.moves)
    assert not any(m.workload.endswith("/web") for m in p.moves)


def test_koordinator_mode_needs_another_node_with_nodefit() -> None:
    node_list = [make_node("n0", cpu=8000, memory=32 * GI), make_node("n1", cpu=1000, memory=GI)]
    pods = [replica(f"c{k}", "n0", cpu=2000, memory=GI) for k in range(3)]
    p = plan(node_list, pods, mode="koordinator")
    assert p.moves == () and p.skipped[frag.NO_FIT] == 1
    p = plan(node_list, pods, mode="koordinator", node_fit=False)
    assert len(p.moves) == 1 and p.moves[0].destination == ""


# -- properties ---------------------------------------------------------------------------------

@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Any], list[Pod], ArbitrationArgs, tuple[Budget, ...], dict[str, Any]]:
    count = draw(st.integers(2, 7))
    node_list = [make_node(f"n{i}", cpu=draw(st.sampled_from([4000, 8000, 16000])),
                           memory=draw(st.sampled_from([8, 16, 32])) * GI) for i in range(count)]
    free = {n.name: [n.allocatable["cpu"], n.allocatable["memory"]] for n in node_list}
    pods = []
    for k in range(draw(st.integers(1, 30))):
        cpu = draw(st.sampled_from([100, 250, 500, 1000, 2000]))
        mem = draw(st.sampled_from([1, 2, 4, 6])) * GI // 2
        node = draw(st.sampled_from(sorted(free)))
        if free[node][0] >= cpu and free[node][1] >= mem:
            free[node][0] -= cpu
            free[node][1] -= mem
            w = draw(st.sampled_from(["a", "b", "c", "d"]))
            pods.append(replica(f"p{k}", node, workload=w, cpu=cpu, memory=mem, labels={"app": w}))
    arbitration = ArbitrationArgs(max_migrating_per_node=draw(st.sampled_from([1, 2, 5])),
                                  max_unavailable_per_workload=draw(st.sampled_from([None, 1, 3, "50%"])),
                                  max_migrating_globally=draw(st.sampled_from([None, 3])))
    budgets = tuple(Budget("default", f"pdb-{w}", LabelSelector({"app": w}), min_available=m)
                    for w, m in draw(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 8)), max_size=2)))
    args = {"imbalance_threshold": draw(st.sampled_from([0.0, 0.05, 0.15])),
            "min_improvement_threshold": draw(st.sampled_from([0.0, 0.01, 0.02]))}
    return node_list, pods, arbitration, budgets, args


def _check_common(view: ClusterView, p: MovePlan, pods: list[Pod], arbitration: ArbitrationArgs,
                  budgets: tuple[Budget, ...]) -> None:
    by_uid = {pod.uid: pod for pod in pods}
    assert len({m.uid for m in p.moves}) == len(p.moves), "a pod moved twice"
    # No destination over-committed, counting no capacity a planned eviction frees.
    arriving = view.requested.copy()
    for m in p.moves:
        if m.destination:
            arriving[view.index[m.destination]] += view.vectors[view.pods.index(by_uid[m.uid])]
    assert (arriving <= np.maximum(view.allocatable, view.requested)).all()
    replicas = Counter(workload_of(pod) for pod in pods)
    per_node = Counter(m.source for m in p.moves)
    per_workload = Counter(m.workload for m in p.moves)
    if arbitration.max_migrating_per_node is not None:
        assert max(per_node.values(), default=0) <= arbitration.max_migrating_per_node
    if arbitration.max_migrating_globally is not None:
        assert len(p.moves) <= arbitration.max_migrating_globally
    for w, n in per_workload.items():
        assert replicas[w] > 1 and n <= arbitration.max_unavailable(replicas[w])
    for b in budgets:
        covered = [pod for pod in pods if b.covers(pod)]
        moved = sum(1 for m in p.moves if b.covers(by_uid[m.uid]))
        assert moved <= b.allowed(len(covered), len(covered))


Case = tuple[list[Any], list[Pod], ArbitrationArgs, tuple[Budget, ...], dict[str, Any]]


def _planned(case: Case, mode: str) -> tuple[ClusterView, MovePlan, dict[str, Any]]:
    """Plan `case` in `mode` and check what every plan keeps."""
    node_list, pods, arbitration, budgets, args = case
    view, sim, arb = planning(node_list, pods, arbitration, budgets)
    p = plan_moves(view, FragmentationArgs(mode=mode, min_pod_age_s=0.0, **args), sim, arb, now=NOW)
    _check_common(view, p, pods, arbitration, budgets)
    return view, p, args


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_global_plan_invariants(case: Case) -> None:
    view, p, args = _planned(case, "global")
    assert p.after.std_sum <= p.before.std_sum + 1e-9
    assert p.after.std_max <= p.before.std_max + 1e-9
    for m in p.moves:
        assert m.gain >= args["min_improvement_threshold"] - 1e-12
        assert m.destination_std[1] <= m.destination_std[0] + 1e-9
    # The plan's figure is what applying it gives, recomputed from the view.
    requested = view.requested.copy()
    for m in p.moves:
        i = next(k for k, pod in enumerate(view.pods) if pod.uid == m.uid)
        requested[view.index[m.source]] -= view.vectors[i]
        requested[view.index[m.destination]] += view.vectors[i]
    assert view.std(view.columns(("cpu", "memory")), requested).sum() == pytest.approx(p.after.std_sum, abs=1e-9)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_koordinator_plan_invariants(case: Case) -> None:
    _, p, args = _planned(case, "koordinator")
    assert max(Counter(m.source for m in p.moves).values(), default=0) <= 1
    for m in p.moves:
        assert m.source_std[0] - m.source_std[1] >= args["min_improvement_threshold"] - 1e-12


@pytest.mark.parametrize("evicted", [False, True])
def test_a_cycle_with_moves_in_flight_plans_from_where_they_leave_the_cluster(evicted: bool) -> None:
    """The last cycle's moves are still running (their pods on their sources, or evicted and
    their replacements not bound yet): the next global cycle plans from the objective they will
    leave, so it does not drain their sources or fill their destinations again, and what both
    cycles do together is no worse than the first."""
    node_list, pods = lopsided()
    generous = ArbitrationArgs(max_unavailable_per_workload=5, max_migrating_per_node=6)
    first = plan(node_list, pods, generous, mode="global")
    assert first.moves
    by_uid = {p.uid: p for p in pods}
    in_flight = [(by_uid[m.uid], m.source, m.destination) for m in first.moves]
    staying = [p for p in pods if not evicted or p.uid not in {m.uid for m in first.moves}]
    view, sim, arb = planning(node_list, staying, generous)
    for pod, source, destination in in_flight:
        sim.place(pod, view.index[destination])
        arb.admit(pod, source)
    second = plan_moves(view, FragmentationArgs(min_pod_age_s=0.0), sim, arb, now=NOW, in_flight=in_flight)
    whole = ClusterView.build(node_list, pods)
    requested = whole.requested.copy()
    for m in (*first.moves, *second.moves):
        i = next(k for k, pod in enumerate(whole.pods) if pod.uid == m.uid)
        requested[whole.index[m.source]] -= whole.vectors[i]
        requested[whole.index[m.destination]] += whole.vectors[i]
    both = whole.std(whole.columns(("cpu", "memory")), requested).sum()
    assert both == pytest.approx(second.after.std_sum, abs=1e-9)
    assert both <= first.after.std_sum + 1e-9
    assert not {m.uid for m in second.moves} & {m.uid for m in first.moves}
