"""ReservationFirst moves as a state machine: the happy path, every abort path with its reason,
and as a property over any sequence of inputs: a finished job never changes, and a job that
ends Aborted or Failed leaves no reservation behind."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.ports import Output
from agents.rebalance import migration as mg
from agents.scheduler.plugins.nodeaffinity import parse
from schemas import topics
from schemas.records import CurrentOwner, MigrationJob, PodDeleted, Reservation, ReservationEvent
from tests.unit.rebalance.conftest import NOW, replica

POD = replica("web-1", "n0", cpu=1500)


def started(mode: str = mg.RESERVATION_FIRST, destination: str = "n2") -> tuple[MigrationJob, list[Output]]:
    job = mg.new_job(POD, source="n0", destination=destination, now=NOW, mode=mode)
    return mg.start(job, POD, NOW)


REPLACEMENT = CurrentOwner(uid="web-2", namespace="default", name="web-2")


def event(job: MigrationJob, phase: str, node: str = "n2", reason: str = "",
          owners: tuple[CurrentOwner, ...] = ()) -> ReservationEvent:
    if phase == "Succeeded" and not owners:
        owners = (REPLACEMENT,)  # consumed by a new pod of the workload
    return ReservationEvent(name=job.reservation, uid=job.reservation, phase=phase, node=node, reason=reason,
                            current_owners=owners)


def deleted_reservations(outputs: list[Output]) -> list[str]:
    return [o.record.uid for o in outputs if isinstance(o.record, PodDeleted)]


def test_reservation_first_happy_path() -> None:
    job, out = started()
    [res] = [o.record for o in out if isinstance(o.record, Reservation)]
    assert (job.phase, job.step, job.reservation) == ("Running", "reserving", res.uid)
    assert res.requests == POD.requests and res.allocate_once and res.ttl_s == job.ttl_s
    assert res.owners[0].controller_name == "web" and res.owners[0].controller_kind == "ReplicaSet"
    assert parse(res.node_selector, res.affinity).required is not None  # pinned to n2
    assert out[-1].topic == topics.MIGRATIONS and out[-1].record == job
    assert mg.eviction(job) is None
    job, _ = mg.on_reservation(job, event(job, "Available"), NOW + 1)
    assert (job.step, job.reserved_on) == ("evicting", "n2")
    command = mg.eviction(job)
    assert command is not None and (command.uid, command.node) == (POD.uid, "n0")
    job, _ = mg.on_eviction_refused(job, NOW + 2)
    assert job.reason == mg.EVICTION_REFUSED and job.step == "evicting"
    job, _ = mg.evicted(job, NOW + 3)
    assert job.step == "replacing"
    job, out = mg.on_pod_gone(job, POD.uid, NOW + 4)  # what it waited for: nothing changes
    assert job.step == "replacing" and out == []
    job, out = mg.on_reservation(job, event(job, "Succeeded"), NOW + 5)
    assert (job.phase, job.reason) == ("Succeeded", mg.DONE) and deleted_reservations(out) == []


def test_evict_directly_skips_the_reservation() -> None:
    job, out = started(mg.EVICT_DIRECTLY)
    assert job.reservation == "" and not any(isinstance(o.record, Reservation) for o in out)
    assert mg.eviction(job) is not None
    job, out = mg.evicted(job, NOW)
    assert (job.phase, job.step) == ("Running", "terminating") and mg.sent_eviction(job)  # not Succeeded yet
    assert mg.on_tick(job, NOW + 1) == (job, [])
    job, out = mg.on_pod_gone(job, POD.uid, NOW + 2)  # the eviction happened
    assert (job.phase, job.reason) == ("Succeeded", mg.EVICTED) and deleted_reservations(out) == []


def test_only_a_replacement_consuming_its_own_reservation_ends_a_move_succeeded() -> None:
    """After the eviction, the job's reservation consumed: Succeeded only when the event names
    a pod that can be the replacement (not the evicted pod, of the job's namespace and, when
    known, of its workload); the reservation is consumed either way, so nothing is deleted."""
    job, _ = started()
    job, _ = mg.on_reservation(job, event(job, "Available"), NOW + 1)
    job, _ = mg.evicted(job, NOW + 2)
    stranger = replica("db-0", "n3", workload="db")
    others = {
        "unnamed": ReservationEvent(name=job.reservation, uid=job.reservation, phase="Succeeded", node="n2"),
        "the evicted pod": event(job, "Succeeded", owners=(CurrentOwner(uid=POD.uid, namespace="default"),)),
        "another namespace": event(job, "Succeeded", owners=(CurrentOwner(uid="x", namespace="other"),)),
        "another workload": event(job, "Succeeded", owners=(CurrentOwner(uid=stranger.uid, namespace="default"),)),
    }
    for name, other in others.items():
        ended, out = mg.on_reservation(job, other, NOW + 3, pods={stranger.uid: stranger})
        assert (ended.phase, ended.reason, deleted_reservations(out)) == ("Aborted", mg.CONSUMED_BY_OTHER, []), name
    new = replica("web-2", "n2")
    ended, _ = mg.on_reservation(job, event(job, "Succeeded"), NOW + 3, pods={new.uid: new})
    assert (ended.phase, ended.reason) == ("Succeeded", mg.DONE)


ABORTS: list[tuple[str, Any, str, bool]] = [
    ("reservation on the source", lambda j: mg.on_reservation(j, event(j, "Available", node="n0"), NOW),
     mg.ON_SOURCE, True),
    ("reservation expired", lambda j: mg.on_reservation(j, event(j, "Failed", reason="Expired"), NOW),
     mg.EXPIRED, True),
    ("reservation's node lost", lambda j: mg.on_reservation(j, event(j, "Failed", reason="NodeDeleted"), NOW),
     "reservation failed: NodeDeleted", True),
    ("reservation unschedulable", lambda j: mg.on_unschedulable(j, j.reservation, NOW), mg.UNSCHEDULABLE, True),
    ("source pod gone", lambda j: mg.on_pod_gone(j, POD.uid, NOW), mg.SOURCE_GONE, True),
    ("ttl", lambda j: mg.on_tick(j, NOW + j.ttl_s), mg.TTL, True),
    ("reservation consumed before the eviction", lambda j: mg.on_reservation(j, event(j, "Succeeded"), NOW),
     mg.CONSUMED_EARLY, False),
]


@pytest.mark.parametrize(("step", "reason", "deletes"), [a[1:] for a in ABORTS], ids=[a[0] for a in ABORTS])
def test_abort_paths(step: Any, reason: str, deletes: bool) -> None:
    job, _ = started()
    job, out = step(job)
    assert (job.phase, job.reason) == ("Aborted", reason)
    assert deleted_reservations(out) == ([job.reservation] if deletes else [])
    assert step(job) == (job, [])  # finished: a redelivered input changes nothing


def test_a_bare_pod_cannot_be_moved_reservation_first() -> None:
    bare = replica("bare", "n0", owner_references=())
    job = mg.new_job(bare, source="n0", destination="", now=NOW)
    job, out = mg.start(job, bare, NOW)
    assert (job.phase, job.reason) == ("Aborted", mg.NO_CONTROLLER) and len(out) == 1


INPUTS = st.sampled_from(["available", "available-source", "succeeded", "succeeded-by-source", "expired",
                          "unschedulable", "gone", "refused", "evicted", "tick", "tick-late", "other-reservation"])


def apply(job: MigrationJob, name: str) -> tuple[MigrationJob, list[Output]]:
    steps: dict[str, Any] = {
        "available": lambda: mg.on_reservation(job, event(job, "Available"), NOW),
        "available-source": lambda: mg.on_reservation(job, event(job, "Available", node="n0"), NOW),
        "succeeded": lambda: mg.on_reservation(job, event(job, "Succeeded"), NOW),
        "succeeded-by-source": lambda: mg.on_reservation(
            job, event(job, "Succeeded", owners=(CurrentOwner(uid=POD.uid, namespace="default"),)), NOW),
        "expired": lambda: mg.on_reservation(job, event(job, "Failed", reason="Expired"), NOW),
        "unschedulable": lambda: mg.on_unschedulable(job, job.reservation, NOW),
        "gone": lambda: mg.on_pod_gone(job, POD.uid, NOW),
        "refused": lambda: mg.on_eviction_refused(job, NOW),
        "evicted": lambda: mg.evicted(job, NOW),
        "tick": lambda: mg.on_tick(job, NOW + 1),
        "tick-late": lambda: mg.on_tick(job, NOW + job.ttl_s + 1),
        "other-reservation": lambda: mg.on_reservation(job, ReservationEvent(name="x", uid="x", phase="Failed"), NOW),
    }
    result: tuple[MigrationJob, list[Output]] = steps[name]()
    return result


@settings(max_examples=300, deadline=None)
@given(st.lists(INPUTS, max_size=12))
def test_any_sequence_ends_cleanly(names: list[str]) -> None:
    job, _ = started()
    reservation_live, evicted_once, replaced = True, 0, False
    for name in names:
        before = job
        job, out = apply(job, name)
        if before.phase in mg.FINISHED:
            assert (job, out) == (before, [])
        if job != before:
            assert out[-1].record == job  # every change is recorded on `migrations`
        if deleted_reservations(out):
            reservation_live = False
        if name == "expired" and job.phase == "Aborted" and before.phase not in mg.FINISHED:
            reservation_live = False  # the owner ended it
        if name.startswith("succeeded") and before.phase not in mg.FINISHED:
            reservation_live = False  # consumed (by the replacement, or early by another pod)
            replaced = name == "succeeded" and before.step == "replacing"
        if before.step == "evicting" and job.step != "evicting" and job.phase == "Running":
            evicted_once += 1
    if job.phase in ("Aborted", "Failed"):
        assert not reservation_live, "an aborted job left its reservation held"
    assert evicted_once <= 1
    if job.phase == "Succeeded":
        assert job.reason == mg.DONE and replaced, "Succeeded without its replacement in its own reservation"
    if job.reason == mg.CONSUMED_EARLY:
        assert evicted_once == 0


def test_the_real_scheduler_places_the_reservation_on_its_pinned_node() -> None:
    from agents.scheduler.library import Scheduler
    from schemas.records import Claim
    from tests.unit.rebalance.conftest import nodes

    _, out = started(destination="n2")
    [res] = [o.record for o in out if isinstance(o.record, Reservation)]
    sched = Scheduler(nodes(4))  # n0 would win otherwise: every node is empty, ties go to the first
    placed = [o.record for o in sched.core.add_reservation(res) + sched.core.schedule() if isinstance(o.record, Claim)]
    assert [c.node for c in placed] == ["n2"]
