"""The independent checker, table-driven: it must catch what it exists to catch."""

import pytest

from perf.checker import Placement, check

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
    ],
    ids=["fits", "overcommit", "termination-frees", "termination-late", "double-bound", "duplicate-read",
         "pod-count", "unknown-node"],
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
