"""The framework runtime: extension points in order, Reserve / Unreserve symmetric and
idempotent, Permit waiting, partial node search, and what `explain` shows."""

from __future__ import annotations

from typing import ClassVar

import pytest

from agents.scheduler.cluster import ClusterState
from agents.scheduler.framework import status
from agents.scheduler.framework.interface import CycleState, PodInfo
from agents.scheduler.framework.profiles import default_config
from agents.scheduler.framework.runtime import (
    Framework,
    ProfilePlugins,
    rejections_table,
    scores_table,
)
from agents.scheduler.framework.status import Code, Status
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
