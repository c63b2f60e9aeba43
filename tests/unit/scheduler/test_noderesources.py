"""NodeResourcesFit and NodeResourcesBalancedAllocation, table-driven, with kube-scheduler's
numbers; the one-node paths agree with the vectorized ones."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.scheduler.framework.interface import ALL
from agents.scheduler.plugins.args import ArgsError
from agents.scheduler.plugins.noderesources import (
    BalancedAllocation,
    BalancedAllocationArgs,
    Fit,
    FitArgs,
)
from agents.scheduler.plugins.noderesources.balanced_allocation import balanced_score
from agents.scheduler.plugins.noderesources.fit import least_allocated, most_allocated
from agents.scheduler.plugins.noderesources.resources import ResourceSpec
from schemas.records import BoundPod, Node, Nomination, Pod, ResourceList
from tests.builders import make_node, make_pod
from tests.unit.scheduler.conftest import info, prepared, run_filter, run_score, state_of

GI = 2**30


@pytest.mark.parametrize(("cpu", "memory", "used_cpu", "expected", "reasons"), [
    (1000, GI, 0, [True], {}),
    (4000, GI, 0, [True], {}),
    (4001, GI, 0, [False], {"Insufficient cpu": 1}),
    (1000, GI, 3500, [False], {"Insufficient cpu": 1}),
    (1000, 9 * GI, 0, [False], {"Insufficient memory": 1}),
    (5000, 9 * GI, 0, [False], {"Insufficient cpu": 1, "Insufficient memory": 1}),
], ids=["fits", "exactly", "over-cpu", "used", "over-memory", "both"])
def test_fit_filter(cpu: int, memory: int, used_cpu: int, expected: list[bool], reasons: dict[str, int]) -> None:
    bound = {"n1": [BoundPod("old", requests=ResourceList(cpu=used_cpu))]} if used_cpu else None
    state = state_of(make_node("n1", cpu=4000, memory=8 * GI), bound=bound)
    pod = make_pod("p", cpu=cpu, memory=memory)
    assert run_filter(Fit(), pod, state) == expected
    p = info(pod)
    cycle = prepared(Fit(), p, state)
    failed = ~np.asarray(expected)
    if failed.any():
        assert Fit().explain(cycle, p, state, failed) == reasons


def test_fit_counts_one_pod_slot_per_pod() -> None:
    state = state_of(make_node("n1", pods=1), bound={"n1": [BoundPod("old")]})
    p = info(make_pod("p", cpu=1, memory=1))
    cycle = prepared(Fit(), p, state)
    assert not Fit().filter(cycle, p, state, ALL)[0]
    assert Fit().explain(cycle, p, state, np.array([True])) == {"Too many pods": 1}


@pytest.mark.parametrize(("nominee_priority", "pod_priority", "nominee", "fits"), [
    (10, 5, "other", False),   # a higher-priority nomination holds the capacity
    (5, 5, "other", False),    # equal priority counts too
    (1, 5, "other", True),     # a lower-priority nomination does not
    (10, 5, "p", True),        # a pod is not blocked by its own nomination
], ids=["higher", "equal", "lower", "own"])
def test_fit_accounts_for_nominations(nominee_priority: int, pod_priority: int, nominee: str, fits: bool) -> None:
    state = state_of(make_node("n1", cpu=4000))
    state.nominator.nominate(Nomination(uid=nominee, node="n1", priority=nominee_priority,
                                        requests=ResourceList(cpu=3000, pods=1)))
    pod = make_pod("p", cpu=2000, memory=0, priority=pod_priority)
    assert run_filter(Fit(), pod, state) == [fits]


# kube-scheduler's least_allocated_test "differently sized nodes": node1 4000m/10000,
# node2 6000m/10000, pod 3000m/5000 -> node1 (25 + 50) / 2 = 37, node2 (50 + 50) / 2 = 50.
@pytest.mark.parametrize(("strategy", "expected"), [
    ("LeastAllocated", [37, 50]),
    ("MostAllocated", [62, 50]),
], ids=["least", "most"])
def test_fit_scores_like_kube_scheduler(strategy: str, expected: list[int]) -> None:
    state = state_of(make_node("n1", cpu=4000, memory=10000), make_node("n2", cpu=6000, memory=10000))
    pod = make_pod("p", cpu=3000, memory=5000)
    assert run_score(Fit(FitArgs(strategy=strategy)), pod, state) == expected


def test_fit_weights_and_missing_resources() -> None:
    requested = np.array([[1000, 0], [3000, 5]], dtype=np.int64)
    alloc = np.array([[4000, 0], [4000, 10]], dtype=np.int64)
    weights = np.array([3, 1], dtype=np.int64)
    # node 0 has no second resource: only the first counts; node 1: (25 x 3 + 50 x 1) / 4
    assert least_allocated(requested, alloc, weights).tolist() == [75, 31]
    assert most_allocated(requested, alloc, weights).tolist() == [25, 68]


@pytest.mark.parametrize(("args", "field"), [
    ({"scoringStrategy": {"type": "Fastest"}}, "scoringStrategy.type"),
    ({"scoringStrategy": {"resources": [{"name": "cpu", "weight": 0}]}}, "scoringStrategy.resources[0].weight"),
    ({"scoringStrategy": {"resources": [{"name": "cpu"}, {"name": "cpu"}]}}, "scoringStrategy.resources[1].name"),
    ({"strategy": "x"}, "strategy"),
], ids=["type", "weight", "duplicate", "unknown"])
def test_fit_args_validation_names_the_field(args: dict[str, object], field: str) -> None:
    with pytest.raises(ArgsError) as err:
        FitArgs.from_mapping(args).validate()
    assert err.value.field == field


# kube-scheduler's balanced_allocation_test: node1 4000m/10000, node2 6000m/10000, pod
# 3000m/5000: node1 fractions 0.75 / 0.5 -> std 0.125 -> 87; node2 0.5 / 0.5 -> 100.
def test_balanced_allocation_like_kube_scheduler() -> None:
    state = state_of(make_node("n1", cpu=4000, memory=10000), make_node("n2", cpu=6000, memory=10000))
    assert run_score(BalancedAllocation(), make_pod("p", cpu=3000, memory=5000), state) == [87, 100]


def test_balanced_allocation_caps_fractions_and_skips_empty_pods() -> None:
    state = state_of(make_node("n1", cpu=1000, memory=10000))
    # cpu 2000/1000 caps at 1, memory 0.5 -> std 0.25 -> 75
    assert run_score(BalancedAllocation(), make_pod("p", cpu=2000, memory=5000), state) == [75]
    assert run_score(BalancedAllocation(), make_pod("p", cpu=0, memory=0), state) is None


def test_balanced_allocation_counts_an_extended_resource_only_when_requested_and_present() -> None:
    args = BalancedAllocationArgs(resources=(ResourceSpec("cpu"), ResourceSpec("memory"), ResourceSpec("nvidia.com/gpu")))
    gpu_node = Node(name="g", allocatable=ResourceList({"cpu": 4000, "memory": 4000, "nvidia.com/gpu": 4}))
    plain = make_node("c", cpu=4000, memory=4000)
    state = state_of(gpu_node, plain)
    cpu_only = make_pod("p", cpu=2000, memory=2000)
    # no gpu request: both nodes 0.5 / 0.5 -> 100
    assert run_score(BalancedAllocation(args), cpu_only, state) == [100, 100]
    gpu_pod = Pod(uid="q", name="q", requests=ResourceList({"cpu": 2000, "memory": 2000, "nvidia.com/gpu": 1}))
    # gpu node: 0.5, 0.5, 0.25 -> population std 0.1178 -> 88; plain node lacks gpus: 100
    assert run_score(BalancedAllocation(args), gpu_pod, state) == [88, 100]


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1, max_size=20),
       st.tuples(st.integers(0, 10**5), st.integers(0, 10**5)))
def test_one_node_paths_agree_with_vectorized(nodes: list[tuple[int, int]], request: tuple[int, int]) -> None:
    state = state_of(*[make_node(f"n{i}", cpu=c, memory=m) for i, (c, m) in enumerate(nodes)])
    p = info(make_pod("p", cpu=request[0], memory=request[1]))
    for plugin in (Fit(), Fit(FitArgs(strategy="MostAllocated")), BalancedAllocation()):
        cycle = prepared(plugin, p, state)
        if hasattr(plugin, "pre_score") and plugin.pre_score(cycle, p, state, state.schedulable_rows()).code == 5:
            continue
        vector = plugin.score(cycle, p, state, ALL).tolist()
        assert vector == [plugin.score_steps(cycle, p, state, row, 1)[0] for row in range(state.size)]
    fit = Fit()
    cycle = prepared(fit, p, state)
    assert fit.filter(cycle, p, state, ALL).tolist() == [fit.fit_steps(cycle, p, state, r, 1) == 1
                                                         for r in range(state.size)]


@given(st.integers(1, 64).map(lambda c: c * 500), st.integers(1, 64).map(lambda m: m * 2**28),
       st.integers(0, 4000), st.integers(1, 2**31), st.integers(1, 12))
def test_steps_agree_with_placing_pods_one_by_one(cpu: int, memory: int, pod_cpu: int, pod_memory: int,
                                                  steps: int) -> None:
    """`fit_steps` and `score_steps` predict what the vectorized plugins say after each of
    the next pods lands on the node."""
    state = state_of(make_node("n", cpu=cpu, memory=memory))
    p = info(make_pod("p", cpu=pod_cpu, memory=pod_memory))
    plugins = [Fit(), Fit(FitArgs(strategy="MostAllocated")), BalancedAllocation()]
    cycles = []
    for plugin in plugins:
        cycle = prepared(plugin, p, state)
        if hasattr(plugin, "pre_score"):
            plugin.pre_score(cycle, p, state, state.schedulable_rows())
        cycles.append(cycle)
    fitting = plugins[0].fit_steps(cycles[0], p, state, 0, steps)
    predicted = [plugin.score_steps(cycle, p, state, 0, fitting) for plugin, cycle in zip(plugins, cycles, strict=True)]
    actual: list[list[int]] = [[] for _ in plugins]
    placed = 0
    while placed < steps and plugins[0].filter(cycles[0], p, state, ALL)[0]:
        for i, (plugin, cycle) in enumerate(zip(plugins, cycles, strict=True)):
            if plugin.NAME in cycle.skip_score:
                continue
            actual[i].append(int(plugin.score(cycle, p, state, ALL)[0]))
        state.assume(f"p/{placed}/n", 0, p.request)
        placed += 1
    assert fitting == placed
    for plugin, cycle, want, got in zip(plugins, cycles, actual, predicted, strict=True):
        if plugin.NAME not in cycle.skip_score:
            assert got == want


def test_balanced_score_matches_the_formula_for_three_resources() -> None:
    got = balanced_score(np.array([[1, 2, 3]]), np.array([[4, 4, 4]]))
    fractions = np.array([0.25, 0.5, 0.75])
    assert got.tolist() == [int((1 - fractions.std()) * 100)]
