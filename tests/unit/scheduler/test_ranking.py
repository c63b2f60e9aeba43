"""The ranking a class of pods walks: nodes by score (highest first), ties by node index, the
same order whether the best nodes are sorted first and the rest later or all at once, with
nodes scored again after a placement merged in."""

from __future__ import annotations

import heapq

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.scheduler.framework.runtime import Ranking


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.booleans()), min_size=1, max_size=3 * Ranking.HEAD),
       st.lists(st.tuples(st.integers(0, 200), st.integers(-5, 20)), max_size=40))
def test_ranking_pops_in_score_then_index_order(nodes: list[tuple[int, bool]], rescored: list[tuple[int, int]]) -> None:
    total = np.array([score for score, _ in nodes], dtype=np.int64)
    feasible = np.array([ok for _, ok in nodes], dtype=bool)
    ranking = Ranking(total, feasible)
    reference = [(-int(total[r]), r) for r in np.flatnonzero(feasible).tolist()]
    heapq.heapify(reference)
    pushes = iter(rescored)
    got, expected = [], []
    while ranking:
        assert ranking.peek() == reference[0]
        got.append(ranking.pop())
        expected.append(heapq.heappop(reference)[1])
        push = next(pushes, None)
        if push is not None:  # the node just taken comes back with a new score
            ranking.push(push[1], got[-1])
            heapq.heappush(reference, (-push[1], got[-1]))
    assert got == expected and not reference


def test_ties_across_the_head_boundary_go_in_node_order() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        total = rng.integers(0, 4, 4 * Ranking.HEAD).astype(np.int64)  # many ties at every score
        feasible = rng.random(len(total)) < 0.8
        ranking = Ranking(total, feasible)
        got = []
        while ranking:
            got.append(ranking.pop())
        assert got == sorted(np.flatnonzero(feasible).tolist(), key=lambda r: (-total[r], r))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=3 * Ranking.HEAD),
       st.lists(st.tuples(st.integers(0, 200), st.integers(-1, 4), st.integers(0, 8)), max_size=40))
def test_a_tier_is_the_next_pops_each_followed_by_one_of_its_score(
        nodes: list[tuple[int, bool]], steps: list[tuple[int, int, int]]) -> None:
    """`tier` gives the nodes `pop` would give next, all at the best score, and after each of
    them the next node in the reference order has that score too (its rival); `skip` takes
    them. Mixed with pops and pushes at few scores, so that ties with the heap happen."""
    total = np.array([score for score, _ in nodes], dtype=np.int64)
    feasible = np.array([ok for _, ok in nodes], dtype=bool)
    ranking = Ranking(total, feasible)
    reference = [(-int(total[r]), r) for r in np.flatnonzero(feasible).tolist()]
    heapq.heapify(reference)
    for _, score, limit in steps:
        if not ranking:
            break
        best, rows = ranking.tier(limit)
        ordered = heapq.nsmallest(len(rows) + 1, reference)
        assert rows == [r for _, r in ordered[:len(rows)]]
        assert all(-key == best for key, _ in ordered[:len(rows) + 1]) if rows else True
        assert len(rows) <= limit
        for _ in rows:
            heapq.heappop(reference)
        ranking.skip(len(rows))
        if ranking:  # one more pop, and the node comes back at a (tied) score
            row = ranking.pop()
            assert heapq.heappop(reference)[1] == row
            ranking.push(score, row)
            heapq.heappush(reference, (-score, row))
    while ranking:
        assert ranking.pop() == heapq.heappop(reference)[1]
    assert not reference
