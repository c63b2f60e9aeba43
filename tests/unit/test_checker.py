"""The independent checker, table-driven: it must catch what it exists to catch."""

import json

import pytest

from perf.checker import (
    BudgetSpec,
    DevicePlacement,
    Placement,
    PodSeen,
    check,
    device_amounts,
    devices_overcommitted,
    partial_gangs,
    pdb_violations,
    quotas_overcommitted,
)

ALLOC = {"n1": {"cpu": 1000, "pods": 110}, "n2": {"cpu": 1000, "pods": 2}}
REQ = {"a": {"cpu": 600}, "b": {"cpu": 600}, "c": {"cpu": 100}}


@pytest.mark.parametrize(
    ("bindings", "terminations", "double", "over"),
    [
        ([Placement(1, "a", "n1"), Placement(2, "c", "n1")], [], 0, 0),
        ([Placement(1, "a", "n1"), Placement(2, "b", "n1")], [], 0, 1),  # 1200m on 1000m
        ([Placement(1, "a", "n1"), Placement(3, "b", "n1")], [Placement(2, "a", "n1")], 0, 0),  # freed first
        ([Placement(1, "a", "n1"), Placement(2, "b", "n1")], [Placement(3, "a", "n1")], 0, 1),  # freed too late
        ([Placement(1, "a", "n1"), Placement(2, "a", "n2")], [], 1, 0),
        ([Placement(1, "a", "n1"), Placement(2, "a", "n1")], [], 0, 0),  # the same binding read twice
        ([Placement(1, "c", "n2"), Placement(2, "a", "n2"), Placement(3, "b", "n2")], [], 0, 1),  # pods cap too
        ([Placement(1, "c", "unknown-node")], [], 0, 1),  # a node nobody published has nothing
        # a pod deleted while its hold waited: its Binding and termination sent in one batch
        ([Placement(1, "a", "n1"), Placement(2, "b", "n1")], [Placement(1, "a", "n1")], 0, 0),
        ([Placement(1, "a", "n1"), Placement(2, "b", "n1")], [Placement(0.5, "a", "n1")], 0, 0),
    ],
    ids=["fits", "overcommit", "termination-frees", "termination-late", "double-bound", "duplicate-read",
         "pod-count", "unknown-node", "ended-with-its-binding", "ended-before-its-binding"],
)
def test_checker(bindings, terminations, double, over) -> None:
    result = check(ALLOC, REQ, bindings, terminations)
    assert (result.pods_double_bound, result.nodes_overcommitted) == (double, over)
    assert result.consistent == (double == 0 and over == 0)


def test_counts_bound_and_unschedulable() -> None:
    result = check(ALLOC, REQ, [Placement(1, "a", "n1")], unschedulable=["b", "a"])
    assert (result.pods_total, result.pods_bound, result.pods_unschedulable) == (3, 1, 1)


def test_counted_limits_the_counts_but_not_the_consistency_check() -> None:
    result = check(ALLOC, REQ, [Placement(1, "a", "n1"), Placement(2, "b", "n1")], counted=["a"])
    assert (result.pods_total, result.pods_bound, result.nodes_overcommitted) == (1, 1, 1)


GPU = "koordinator.sh/gpu-core"
RATIO = "koordinator.sh/gpu-memory-ratio"


def _gpu(minor: int, share: int) -> str:
    return json.dumps({"gpu": [{"minor": minor, "resources": {GPU: str(share), RATIO: str(share)}}]})


CAPACITY = {"n1": {"gpu/0/core": 100, "gpu/0/ratio": 100, "gpu/1/core": 100, "gpu/1/ratio": 100,
                   "rdma/0/vfs": 2}}


@pytest.mark.parametrize(
    ("placements", "terminations", "over"),
    [
        ([("a", _gpu(0, 60)), ("b", _gpu(1, 60))], [], []),
        ([("a", _gpu(0, 60)), ("b", _gpu(0, 60))], [], ["n1/gpu/0/core", "n1/gpu/0/ratio"]),  # totals fit, GPU 0 not
        ([("a", _gpu(0, 60)), ("b", _gpu(0, 60))], [Placement(1.5, "a", "n1")], []),  # a freed GPU 0 first
        ([("a", _gpu(0, 60)), ("a", _gpu(0, 60))], [], []),  # the same binding read twice
        ([("a", json.dumps({"rdma": [{"minor": 0, "resources": {"koordinator.sh/rdma": "2"}}]})),
          ("b", json.dumps({"rdma": [{"minor": 0, "resources": {"koordinator.sh/rdma": "1"}}]}))], [],
         ["n1/rdma/0/vfs"]),
        ([("a", ""), ("b", "")], [], []),  # no devices
        ([("a", _gpu(0, 60)), ("b", _gpu(0, 60))], [Placement(1.0, "a", "n1")], []),  # ended with its binding
    ],
    ids=["two-gpus", "one-gpu-twice", "freed-first", "read-twice", "rdma-vfs", "no-devices", "ended-with-binding"],
)
def test_devices_overcommitted(placements: list[tuple[str, str]], terminations: list[Placement],
                               over: list[str]) -> None:
    found = devices_overcommitted(
        CAPACITY, [DevicePlacement(float(i + 1), uid, "n1", device_amounts(a)) for i, (uid, a) in enumerate(placements)],
        terminations)
    assert sorted(found) == over


@pytest.mark.parametrize(
    ("bound", "partial"),
    [(set(), []), ({"g0", "g1"}, []), ({"g0"}, ["g"]), ({"g0", "g1", "g2"}, []), ({"x"}, [])],
    ids=["none", "min-available", "one-of-two", "all", "others"],
)
def test_partial_gangs(bound: set[str], partial: list[str]) -> None:
    assert partial_gangs({"g": (2, ["g0", "g1", "g2"])}, bound) == partial


# --- elastic quotas: committed usage replayed from the Bindings and the pods' ends -------------

QUOTA_MAX = {"q": {"cpu": 2000}}
IN_QUOTA = {"a1": "q", "a2": "q", "b1": "q", "b2": "q"}
QUOTA_REQ = {uid: {"cpu": 1000, "memory": 1} for uid in IN_QUOTA} | {"free": {"cpu": 5000}}


@pytest.mark.parametrize(
    ("bindings", "ends", "over"),
    [
        # two replicas each admit two pods of a quota of two: all four commit (issue 28, item 2)
        ([Placement(1, "a1", "n1"), Placement(1.1, "a2", "n1"), Placement(1.2, "b1", "n2"),
          Placement(1.3, "b2", "n2")], [], 2),
        # the same four, each admitted once another had ended
        ([Placement(1, "a1", "n1"), Placement(1.1, "a2", "n1"), Placement(3, "b1", "n2"),
          Placement(4, "b2", "n2")], [(2, "a1"), (3, "a2")], 0),  # an end at the binding's time frees first
        # an end read after the next binding frees too late
        ([Placement(1, "a1", "n1"), Placement(1.1, "a2", "n1"), Placement(3, "b1", "n2")], [(3.5, "a1")], 1),
        # a Binding read twice (or on two nodes) counts once; pods without a quota count nothing
        ([Placement(1, "a1", "n1"), Placement(2, "a1", "n1"), Placement(3, "a1", "n2"), Placement(4, "a2", "n1"),
          Placement(5, "free", "n1")], [], 0),
        # a pod deleted while its hold waited: bound after its end, it never ran
        ([Placement(1, "a1", "n1"), Placement(1.1, "a2", "n1"), Placement(2, "b1", "n2")], [(1.5, "b1")], 0),
        # a Binding read again after its pod ended does not bring it back
        ([Placement(1, "a1", "n1"), Placement(1.1, "a2", "n1"), Placement(3, "b1", "n2"), Placement(4, "a1", "n1")],
         [(2, "a1")], 0),
    ],
    ids=["two-replicas-overcommit", "admitted-after-ends", "end-too-late", "duplicates-and-unquoted",
         "deleted-while-held", "late-duplicate"],
)
def test_quotas_overcommitted(bindings: list[Placement], ends: list[tuple[float, str]], over: int) -> None:
    found = quotas_overcommitted(QUOTA_MAX, IN_QUOTA, QUOTA_REQ, bindings, ends)
    assert len(found) == over, found
    if over:
        assert found[0].startswith("q: cpu 3000 > 2000 after ")


# --- PodDisruptionBudgets from the outside: healthy pods per budget over time ------------------

MIN4 = BudgetSpec("ns/keep", "ns", {"app": "keep"}, min_available=4)


def _up(t: float, uid: str, healthy: bool = True, app: str = "keep") -> PodSeen:
    return PodSeen(t, uid, "ns", {"app": app}, healthy=healthy)


def _gone(t: float, uid: str) -> PodSeen:
    return PodSeen(t, uid, gone=True)


FIVE_RUNNING = [_up(0, f"p{i}", healthy=False) for i in range(5)] + [_up(1, f"p{i}") for i in range(5)]


def test_a_scale_down_that_evicts_three_of_five_under_min_available_four_is_caught() -> None:
    # issue 28, item 4: EvictDirectly ignores the budget: 3 evictions, 2 healthy left
    events = FIVE_RUNNING + [_gone(2, "p0"), _gone(2, "p1"), _gone(2, "p2")]
    (v,) = pdb_violations([MIN4], events, sample_s=0.25, until=4.0)
    assert (v.budget, v.samples, v.lowest) == ("ns/keep", 8, 2)  # 2.0 .. 3.75: eight samples
    assert v.first.startswith("healthy 2 < desired 4 of 2 at 2.000")


def test_evictions_the_budget_allows_are_not_violations() -> None:
    events = FIVE_RUNNING + [_gone(2, "p0"), _up(2, "p5", healthy=False), _up(3, "p5"), _gone(4, "p1")]
    assert pdb_violations([MIN4], events, until=10.0) == []


def test_a_budget_is_judged_once_satisfied_and_counts_each_dip() -> None:
    max1 = BudgetSpec("ns/keep", "ns", {"app": "keep"}, max_unavailable=1)
    starting = [_up(0, f"p{i}", healthy=False) for i in range(3)] + [_up(0.5, "p0")]  # 1 of 3: still starting
    whole = [_up(1, "p1"), _up(1, "p2")]
    # two pods evicted at once (replacements created Pending): 1 healthy of 3, desired 2, for 1 s
    dip = [_gone(2, "p0"), _gone(2, "p1"), _up(2, "p3", healthy=False), _up(2, "p4", healthy=False),
           _up(3, "p3"), _up(3.1, "p4")]
    # a dip shorter than a sample still counts once; other namespaces and labels are not covered
    short = [_gone(5, "p2"), _gone(5, "p3"), _up(5, "p5", healthy=False), _up(5, "p6", healthy=False),
             _up(5.01, "p5"), _up(6, "p6"), _up(5, "x", app="other"), _gone(5.5, "x")]
    (v,) = pdb_violations([max1], starting + whole + dip + short, sample_s=0.25)
    assert (v.samples, v.lowest) == (4 + 1, 1)


def test_a_pod_gone_stays_gone_and_percentages_round_up() -> None:
    half = BudgetSpec("ns/keep", "ns", {"app": "keep"}, min_available="50%")
    assert [half.desired_healthy(n) for n in (0, 1, 3, 4)] == [0, 1, 2, 2]
    # expected counts the pods that exist: the controller creates a replacement when one goes
    events = [_up(0, "p0"), _up(0, "p1"), _up(0, "p2"), _gone(1, "p0"), _gone(1, "p1"),
              _up(1, "p3", healthy=False), _up(1, "p4", healthy=False),
              _up(1.5, "p0")]  # a late version of an evicted pod is not a pod again
    (v,) = pdb_violations([half], events, until=2.0)
    assert (v.samples, v.lowest) == (4, 1)
    assert pdb_violations([half], []) == []
