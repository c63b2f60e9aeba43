"""The framework runtime: extension points in order, Reserve / Unreserve symmetric and
idempotent, Permit waiting, partial node search, and what `explain` shows."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from agents.scheduler.cluster import ClusterState
from agents.scheduler.framework import status
from agents.scheduler.framework.interface import CycleState, Mask, PodInfo, Rows, Scores
from agents.scheduler.framework.profiles import default_config
from agents.scheduler.framework.runtime import (
    Framework,
    ProfilePlugins,
    nodes_to_find,
    rejections_table,
    scores_table,
)
from agents.scheduler.framework.status import Code, Status
from schemas.records import Nomination, ResourceList
from tests.builders import make_node, make_pod
from tests.unit.scheduler.conftest import info, state_of


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A Reserve and Permit plugin that records calls and answers what it is told."""

    NAME: ClassVar[str] = "Recorder"

    def __init__(self, name: str, log: list[str], reserve: Status = status.SUCCESS,
                 permit: Status = status.SUCCESS) -> None:
        self.name, self.log, self._reserve, self._permit = name, log, reserve, permit

    def reserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> Status:
        self.log.append(f"reserve {self.name}")
        return self._reserve

    def unreserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> None:
        self.log.append(f"unreserve {self.name}")

    def permit(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> Status:
        return self._permit


def framework(state: ClusterState, clock: Clock | None = None, **extra: object) -> Framework:
    base = default_config().profiles[0]
    fields = {k: getattr(base, k) for k in ("name", "pre_filter", "filter", "post_filter", "pre_score", "score",
                                            "bind", "percentage_of_nodes_to_score")}
    fields.update(extra)
    return Framework(ProfilePlugins(**fields), state, timer=lambda: 0, clock=clock)  # type: ignore[arg-type]


def test_reserve_failure_unreserves_in_reverse_order_and_forgets_the_claim() -> None:
    log: list[str] = []
    state = state_of(make_node("a"))
    fw = framework(state, reserve=(Recorder("first", log), Recorder("second", log, reserve=status.error("x", "boom"))))
    [placement] = fw.schedule([info(make_pod("p"))])
    assert placement.status.code == Code.ERROR and placement.outputs == []
    assert log == ["reserve first", "reserve second", "unreserve second", "unreserve first"]
    assert state.assumptions == {} and state.free[0][0] == 4000


def test_unreserve_is_idempotent() -> None:
    log: list[str] = []
    state = state_of(make_node("a"))
    fw = framework(state, reserve=(Recorder("r", log),))
    [placement] = fw.schedule([info(make_pod("p"))])
    assert placement.placed and state.free[0][0] == 3500
    fw.unreserve(placement.pod, placement.row)
    fw.unreserve(placement.pod, placement.row)
    assert state.free[0][0] == 4000 and log == ["reserve r", "unreserve r", "unreserve r"]


def test_permit_wait_then_allow_binds() -> None:
    state = state_of(make_node("a"))
    fw = framework(state, permit=(Recorder("gate", [], permit=status.wait("gate", 5.0)),))
    [placement] = fw.schedule([info(make_pod("p"))])
    assert placement.status.code == Code.WAIT and placement.outputs == [] and state.free[0][0] == 3500
    allowed = fw.allow("p")
    assert allowed is not None and allowed.placed and allowed.outputs[0].record.node == "a"  # type: ignore[attr-defined]


def test_permit_timeout_rejects_and_gives_capacity_back() -> None:
    clock = Clock()
    state = state_of(make_node("a"))
    fw = framework(state, clock, permit=(Recorder("gate", [], permit=status.wait("gate", 5.0)),))
    fw.schedule([info(make_pod("p"))])
    clock.now = 4.9
    assert fw.expire_waiting() == []
    clock.now = 5.0
    [rejected] = fw.expire_waiting()
    assert rejected.status.code == Code.UNSCHEDULABLE and "timed out" in rejected.status.message()
    assert state.free[0][0] == 4000 and fw.waiting == {}


def test_permit_rejection_unreserves() -> None:
    state = state_of(make_node("a"))
    fw = framework(state, permit=(Recorder("gate", [], permit=status.unschedulable("gate", "not now")),))
    [placement] = fw.schedule([info(make_pod("p"))])
    assert placement.status.code == Code.UNSCHEDULABLE and state.assumptions == {}


def test_ties_break_by_node_index_and_placements_are_seen_at_once() -> None:
    state = state_of(make_node("a"), make_node("b"), make_node("c"))
    fw = framework(state)
    placed = [p.node for p in fw.schedule([info(make_pod(f"p{i}", cpu=1000, memory=0)) for i in range(4)],
                                          batching=False)]
    assert placed == ["a", "b", "c", "a"]


def test_percentage_of_nodes_to_score_limits_the_search_from_a_rotating_start() -> None:
    nodes = [make_node(f"n{i:03d}", cpu=4000 + i) for i in range(200)]  # later nodes score higher
    state = state_of(*nodes)
    fw = framework(state, percentage_of_nodes_to_score=10)  # 10% of 200 < the floor of 100 nodes
    first = fw.evaluate(info(make_pod("p", cpu=1, memory=0)))
    assert int(first.feasible.sum()) == 100
    second = fw.evaluate(info(make_pod("q", cpu=1, memory=0)))
    assert int(second.feasible.sum()) == 100 and not (first.feasible & second.feasible).any()


@pytest.mark.parametrize(("nodes", "percentage", "expected"), [
    (50, 0, 50), (100, 0, 100), (1000, 0, 420), (5000, 0, 500), (6000, 0, 300), (20000, 0, 1000),
    (1000, 30, 300), (1000, 100, 1000), (150, 10, 100)])
def test_nodes_to_find_is_kube_schedulers(nodes: int, percentage: int, expected: int) -> None:
    """numFeasibleNodesToFind: adaptive is 50% less a point per 125 nodes, at least 5%; at
    least 100 nodes."""
    assert nodes_to_find(nodes, percentage) == expected


class RowsSeen:
    """A score plugin that records how many rows it was asked to score."""

    NAME: ClassVar[str] = "RowsSeen"
    DYNAMIC: ClassVar[bool] = False
    NORMALIZES: ClassVar[bool] = False

    def __init__(self) -> None:
        self.seen: list[int] = []

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Scores:
        self.seen.append(len(np.arange(state.size)[rows]))
        out: Scores = np.zeros(state.size, dtype=np.int64)[rows]
        return out

    def normalize(self, cycle: CycleState, raw: Scores, feasible: Mask) -> Scores:
        return raw


def test_the_default_search_scores_only_its_share_as_every_node_would_be_scored() -> None:
    nodes = [make_node(f"n{i:03d}", cpu=4000 + 7 * (i % 13)) for i in range(400)]
    state = state_of(*nodes)
    seen = RowsSeen()
    fw = framework(state, score=default_config().profiles[0].score + ((seen, 1),))  # adaptive: 47% of 400
    ev = fw.evaluate(info(make_pod("p", cpu=100, memory=0)))
    assert ev.searched and int(ev.feasible.sum()) == 188 and seen.seen == [188]
    every = framework(state, percentage_of_nodes_to_score=100).evaluate(info(make_pod("p", cpu=100, memory=0)))
    assert not every.searched and ev.total is not None and every.total is not None
    assert np.array_equal(ev.total[ev.feasible], every.total[ev.feasible])


def test_a_search_keeps_the_node_the_pod_is_nominated_to() -> None:
    state = state_of(*[make_node(f"n{i:03d}") for i in range(300)])
    state.nominator.nominate(Nomination(uid="p", node="n299", priority=0, requests=ResourceList(cpu=100)))
    ev = framework(state).evaluate(info(make_pod("p", cpu=100, memory=0)))
    assert ev.searched and ev.feasible[state.index["n299"]] and int(ev.feasible.sum()) == 144 + 1


def test_a_class_is_scored_over_every_node_and_a_single_pod_over_its_share() -> None:
    """Equivalent pods are evaluated once, over every feasible node (cheaper per pod than a
    search each, and no worse); a pod alone searches a rotating share."""
    nodes = [make_node(f"n{i:03d}", cpu=1000 + 10 * i) for i in range(300)]  # later nodes score higher
    state = state_of(*nodes)
    best = state.names[framework(state, percentage_of_nodes_to_score=100).evaluate(
        info(make_pod("x", cpu=100, memory=0))).best()]
    assert best > "n143"  # outside the first search's share (48% of 300: 144 nodes)
    fw = framework(state)
    placed = fw.schedule([info(make_pod(f"c{i}", cpu=100, memory=0)) for i in range(3)])
    assert placed[0].node == best
    [alone] = fw.schedule([info(make_pod("s", cpu=100, memory=0))])
    assert alone.node <= "n143"


def test_explain_shows_scores_per_plugin_and_rejections() -> None:
    state = state_of(make_node("small", cpu=500), make_node("big", cpu=8000), make_node("busy", cpu=4000))
    fw = framework(state)
    ev = fw.evaluate(info(make_pod("p", cpu=1000, memory=0)))
    table = scores_table(ev, state)
    assert set(table) == {"big", "busy"}
    assert table["big"]["NodeResourcesFit"] == (87 + 100) // 2 and table["big"]["total"] > table["busy"]["total"]
    assert rejections_table(ev, state) == {"small": ["NodeResourcesFit"]}


@pytest.mark.parametrize("batching", [True, False], ids=["batched", "one-by-one"])
def test_unschedulable_diagnosis_counts_each_node_once(batching: bool) -> None:
    from schemas.records import Taint

    state = state_of(make_node("a", cpu=500), make_node("b", taints=(Taint("x", "y", "NoSchedule"),), cpu=500))
    fw = framework(state)
    [placement] = fw.schedule([info(make_pod("p", cpu=1000))], batching=batching)
    assert placement.diagnosis is not None
    assert placement.diagnosis.reasons == {"Insufficient cpu": 1, "node(s) had untolerated taint": 1}
    assert placement.diagnosis.message() == "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint"
