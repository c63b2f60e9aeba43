"""The figures the planners are judged by: node std as BalancedAllocation computes it, and
stranded capacity (free capacity that the workload's typical pods cannot use)."""

from __future__ import annotations

import numpy as np
import pytest

from agents.rebalance.objective import measure, stranded_pct, typical_requests
from agents.rebalance.view import ClusterView
from agents.scheduler.plugins.noderesources.balanced_allocation import balanced_score
from tests.builders import GI, make_node
from tests.unit.rebalance.conftest import replica


def test_node_std_is_balanced_allocations() -> None:
    view = ClusterView.build([make_node("n0", cpu=8000, memory=8 * GI), make_node("n1", cpu=8000, memory=8 * GI)],
                             [replica("a", "n0", cpu=6000, memory=2 * GI), replica("b", "n1", cpu=2000, memory=2 * GI)])
    cols = view.columns(("cpu", "memory"))
    std = view.std(cols)
    assert std.tolist() == [pytest.approx(0.25), 0.0]
    assert ((1 - std) * 100).astype(int).tolist() == balanced_score(view.requested[:, cols], view.allocatable[:, cols]).tolist()
    assert view.columns(("cpu", "example.com/widget")).tolist() == [view.space.index["cpu"]]


@pytest.mark.parametrize(("free", "kinds", "freq", "pct"), [
    ([[1000, 0]], [[500, 1]], [1.0], 100.0),  # no memory left: all of the node's free cpu is stranded
    ([[1000, 4]], [[500, 1]], [1.0], 0.0),  # fits: nothing stranded
    ([[1000, 4], [1000, 0]], [[500, 1]], [1.0], 100 / 3),  # normalised: (0.5 + 0) of (0.5 + 0.5 + 0.5)
    ([[1000, 0]], [[500, 1], [500, 0]], [0.5, 0.5], 50.0),  # a cpu-only pod still fits there
    ([[0, 0]], [[500, 1]], [1.0], 0.0),  # nothing free, nothing stranded
])
def test_stranded_pct(free: list[list[int]], kinds: list[list[int]], freq: list[float], pct: float) -> None:
    free_a = np.array(free, dtype=np.int64)
    alloc = np.full_like(free_a, 1000)
    alloc[:, 1] = 4
    assert stranded_pct(free_a, alloc, np.array(kinds, dtype=np.int64), np.array(freq)) == pytest.approx(pct)


def test_typical_requests_by_frequency() -> None:
    vectors = np.array([[1, 2, 9], [1, 2, 8], [3, 4, 0], [0, 0, 5]], dtype=np.int64)
    kinds, freq = typical_requests(vectors, np.array([0, 1]))
    assert kinds.tolist() == [[1, 2], [3, 4]] and freq.tolist() == pytest.approx([2 / 3, 1 / 3])


def test_measure_counts_every_pod() -> None:
    view = ClusterView.build([make_node("n0", cpu=4000, memory=4 * GI)],
                             [replica("a", "n0", cpu=4000, memory=GI), replica("x", "gone", cpu=1)])
    objective = measure(view, view.columns(("cpu", "memory")))
    assert view.unplaced == 1 and objective.std_sum == pytest.approx(0.375) and objective.std_max == objective.std_sum
