"""The scheduling queue: order, backoff on the injected clock, unschedulable pods and the
cluster events that move them, the periodic flush."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.scheduler.cluster import ClusterEvent
from agents.scheduler.plugins.prioritysort import PrioritySort
from agents.scheduler.queue import SchedulingQueue
from tests.builders import make_pod
from tests.unit.scheduler.conftest import info


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def queue(clock: Clock) -> SchedulingQueue:
    return SchedulingQueue(PrioritySort().sort_key, clock, backoff_initial_s=1.0, backoff_max_s=8.0, flush_s=60.0)


def pod(uid: str, priority: int = 0, arrival: int = 0):  # noqa: ANN201
    p = info(make_pod(uid, priority=priority))
    p.arrival = arrival
    return p


def test_active_is_priority_then_arrival_and_pop_respects_limit() -> None:
    q = queue(Clock())
    for i, prio in enumerate([0, 5, 5, 1]):
        q.add(pod(f"p{i}", prio, i))
    assert [p.uid for p in q.pop(3)] == ["p1", "p2", "p3"]
    assert [p.uid for p in q.pop(3)] == ["p0"] and len(q) == 0


def test_backoff_doubles_and_is_capped() -> None:
    clock = Clock()
    q = queue(clock)
    q.add(pod("a"), failures=1)
    assert q.pop(10) == [] and q.next_wakeup() == 1.0
    clock.now = 1.0
    assert [p.uid for p in q.pop(10)] == ["a"]
    q.add(pod("a"), failures=3)
    assert q.next_wakeup() == 1.0 + 4.0
    q.add(pod("b"), failures=10)
    assert q.counts()["backoff"] == 2
    clock.now = 1.0 + 8.0
    assert {p.uid for p in q.pop(10)} == {"a", "b"}  # 2^9 capped at 8 s


def test_unschedulable_pods_move_only_on_events_they_care_about() -> None:
    clock = Clock()
    q = queue(clock)
    q.park(pod("needs-capacity"), ClusterEvent.CAPACITY_FREED | ClusterEvent.NODE_ADDED, failures=1)
    q.park(pod("needs-labels"), ClusterEvent.NODE_CHANGED | ClusterEvent.NODE_ADDED, failures=1)
    clock.now = 5.0  # both backoffs are over
    assert q.pop(10) == []
    assert q.on_event(ClusterEvent.CAPACITY_FREED) == 1
    assert [p.uid for p in q.pop(10)] == ["needs-capacity"]
    assert q.on_event(ClusterEvent.NODE_ADDED) == 1
    assert [p.uid for p in q.pop(10)] == ["needs-labels"]


def test_an_event_within_the_backoff_goes_through_backoff() -> None:
    clock = Clock()
    q = queue(clock)
    q.park(pod("a"), ClusterEvent.ANY, failures=2)  # backoff 2 s
    clock.now = 0.5
    q.on_event(ClusterEvent.NODE_ADDED)
    assert q.pop(10) == []
    clock.now = 2.0
    assert [p.uid for p in q.pop(10)] == ["a"]


def test_parked_pods_are_flushed_after_a_while_and_updates_retry_them() -> None:
    clock = Clock()
    q = queue(clock)
    q.park(pod("old"), ClusterEvent.NODE_CHANGED, failures=1)
    q.park(pod("edited"), ClusterEvent.NODE_CHANGED, failures=1)
    assert q.update(pod("edited"))  # the pod changed: worth another try
    assert [p.uid for p in q.pop(10)] == ["edited"]
    assert q.next_wakeup() == 60.0
    clock.now = 60.0
    assert [p.uid for p in q.pop(10)] == ["old"]


def test_removed_pods_are_never_popped() -> None:
    q = queue(Clock())
    q.add(pod("a"))
    q.add(pod("b"))
    assert q.remove("a") is not None
    assert [p.uid for p in q.pop(10)] == ["b"]


@settings(max_examples=300)
@given(st.lists(st.one_of(st.tuples(st.just("add"), st.integers(0, 3)), st.tuples(st.just("pop"), st.integers(1, 4)),
                          st.tuples(st.just("remove"), st.integers(0, 30)),
                          st.tuples(st.just("update"), st.integers(0, 30))), max_size=60))
def test_pops_come_in_sort_order_whatever_the_order_pods_came_in(ops: list[tuple[str, int]]) -> None:
    """Pods in order go to the run, the others to the heap: every pop gives the smallest keys
    of the pods active then, as one sorted list would (updates keep their place)."""
    q = queue(Clock())
    active: dict[str, tuple[int, int]] = {}  # uid -> (-priority, arrival): the reference
    uids: list[str] = []
    for op, n in ops:
        if op == "add":
            uid = f"p{len(uids)}"
            uids.append(uid)
            q.add(pod(uid, n, len(uids)))
            active[uid] = (-n, len(uids))
        elif op == "pop":
            want = sorted(active, key=active.__getitem__)[:n]
            assert [p.uid for p in q.pop(n)] == want
            for uid in want:
                del active[uid]
        elif uids:
            uid = uids[n % len(uids)]
            if op == "remove":
                q.remove(uid)
                active.pop(uid, None)
            elif uid in active:
                priority, arrival = -active[uid][0], active[uid][1]
                assert q.update(pod(uid, priority, arrival))
    assert [p.uid for p in q.pop(len(uids) + 1)] == sorted(active, key=active.__getitem__)
