"""DefaultPreemption: candidates, victims (fewest, lowest priority, reprieved from the top),
the node with the least disruption, nomination and eviction through the core."""

from __future__ import annotations

from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.scheduler.framework.profiles import default_config
from agents.scheduler.framework.runtime import Framework
from agents.state.resources import ResourceSpace
from schemas.records import (
    BoundPod,
    Claim,
    EvictionCommand,
    Nomination,
    ResourceList,
    SchedulingFeedback,
    Taint,
)
from tests.builders import make_node, make_pod
from tests.unit.scheduler.conftest import info, state_of


def bound(uid: str, cpu: int, priority: int) -> BoundPod:
    return BoundPod(uid=uid, name=uid, priority=priority, requests=ResourceList(cpu=cpu))


def preempt(state: ClusterState, pod_cpu: int, priority: int = 100):  # noqa: ANN201
    fw = Framework(default_config().profiles[0], state, timer=lambda: 0)
    [placement] = fw.schedule([info(make_pod("boss", cpu=pod_cpu, memory=0, priority=priority))])
    assert not placement.placed
    return placement.preemption, fw


def test_victims_are_reprieved_from_the_highest_priority_down() -> None:
    state = state_of(make_node("a", cpu=4000), bound={"a": [bound("v1", 1000, 1), bound("v2", 3000, 2)]})
    result, _ = preempt(state, 2500)
    assert result is not None
    assert result.nomination.node == "a" and [v.pod.uid for v in result.victims] == ["v2"]


def test_the_node_with_the_least_disruption_wins() -> None:
    state = state_of(make_node("a", cpu=2000), make_node("b", cpu=2000), make_node("c", cpu=2000), bound={
        "a": [bound("a1", 2000, 50)],
        "b": [bound("b1", 1000, 5), bound("b2", 1000, 5)],
        "c": [bound("c1", 2000, 5)],
    })
    result, _ = preempt(state, 2000)
    # a's victim has priority 50; b and c have 5, but c needs one victim, b two
    assert result is not None and result.nomination.node == "c" and [v.pod.uid for v in result.victims] == ["c1"]


def test_no_preemption_of_equal_or_higher_priority_or_past_other_filters() -> None:
    state = state_of(make_node("a", cpu=2000), make_node("b", cpu=2000, taints=(Taint("x", "y", "NoSchedule"),)),
                     bound={"a": [bound("peer", 2000, 100)], "b": [bound("low", 2000, 1)]})
    result, _ = preempt(state, 2000, priority=100)
    assert result is None  # a holds an equal-priority pod; b has a taint preemption cannot fix


def test_a_preemptor_waits_for_its_victims_instead_of_preempting_again() -> None:
    state = state_of(make_node("a", cpu=2000), make_node("b", cpu=2000),
                     bound={"a": [bound("v", 2000, 1)], "b": [bound("w", 2000, 1)]})
    result, fw = preempt(state, 2000)
    assert result is not None and result.nomination.node == "a"
    state.nominator.nominate(result.nomination)
    [again] = fw.schedule([info(make_pod("boss", cpu=2000, memory=0, priority=100))])
    assert again.preemption is None  # "v" is still running: it waits rather than evict "w" too


def test_core_nominates_evicts_and_keeps_others_off_the_nominated_capacity() -> None:
    space = ResourceSpace()
    state = ClusterState.from_records(space, [make_node("a", cpu=2000)], {"a": [bound("victim", 2000, 1)]})
    core = SchedulerCore(space, state, lambda: 0.0)
    core.add(make_pod("boss", cpu=2000, memory=0, priority=100))
    outputs = core.schedule()
    records = [o.record for o in outputs]
    assert any(isinstance(r, SchedulingFeedback) for r in records)
    [nomination] = [r for r in records if isinstance(r, Nomination)]
    [eviction] = [r for r in records if isinstance(r, EvictionCommand)]
    assert (nomination.node, nomination.uid, eviction.uid, eviction.preemptor_uid) == ("a", "boss", "victim", "boss")
    # The victim leaves; a lower-priority pod arriving first does not get the promised capacity.
    from schemas.records import NodeStateChange

    core.apply_state_changes([NodeStateChange(node="a", seq=9, allocatable=ResourceList(cpu=2000, pods=110),
                                              holds={"victim/0/a": "terminated"}, nominations=(nomination,))])
    core.add(make_pod("late", cpu=2000, memory=0, priority=1))
    core.queue.clock = lambda: 100.0  # past every backoff
    claims = [o.record for o in core.schedule() if isinstance(o.record, Claim)]
    assert [(c.uid, c.node, c.nominated_node) for c in claims] == [("boss", "a", "a")]


def test_nominations_are_cleared_when_the_pod_is_deleted_or_nominated_elsewhere() -> None:
    from schemas.records import NominationCleared, PodDeleted

    space = ResourceSpace()
    state = ClusterState.from_records(space, [make_node("a", cpu=2000), make_node("b", cpu=2000)],
                                      {"a": [bound("va", 2000, 1)], "b": [bound("vb", 2000, 1)]})
    core = SchedulerCore(space, state, lambda: 0.0)
    core.add(make_pod("boss", cpu=2000, memory=0, priority=100))
    [nomination] = [o.record for o in core.schedule() if isinstance(o.record, Nomination)]
    assert nomination.node == "a"
    # Nominated elsewhere: the old node is told.
    moved = Nomination(uid="boss", node="b", priority=100, requests=nomination.requests)
    assert core.state.nominator.nominate(moved) == nomination
    # Deleted: the scheduler clears the nomination at its node and forwards the deletion.
    outputs = core.delete(PodDeleted(uid="boss", name="boss"))
    cleared = [(o.key, o.record) for o in outputs if isinstance(o.record, NominationCleared)]
    assert cleared == [("b", NominationCleared(uid="boss", node="b"))]
    assert core.state.nominator.of("boss") is None


def test_lower_priority_sums_per_row_are_exact_past_float64() -> None:
    """The sums preemption counts as removable per node equal `np.add.at`'s, in the requested
    columns, also where float64 could not add them exactly (the slow path) and where a value
    is negative."""
    import numpy as np

    from agents.scheduler.plugins.defaultpreemption import _sums_by_row

    rng = np.random.default_rng(7)
    rows = rng.integers(0, 50, 4000)
    for high in (10**6, 2**62 // 4000, 2**62):
        vectors = rng.integers(0, high, (4000, 4), dtype=np.int64)
        vectors[0, 3] = -1
        expected = np.zeros((50, 4), dtype=np.int64)
        with np.errstate(over="ignore"):
            np.add.at(expected, rows, vectors)
        got = _sums_by_row(rows, vectors, np.array([0, 1, 3]), 50, 4)
        assert (got[:, [0, 1, 3]] == expected[:, [0, 1, 3]]).all() and not got[:, 2].any()
