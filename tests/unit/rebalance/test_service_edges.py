"""The rebalancer service under crafted sequences: an adversarial review's findings
(2026-12-03), each a sequence that broke an invariant before its fix: a scale-down answered
twice or by a follower, a finished job brought back by a late or equal version, limits that
forgot migrations whose pod was deleted, a backward clock step, a bad count blamed on the
wrong field, a job uid that crashed the reader, memory that grew with history, a Failed
reservation left on `pods`, an Available event naming no node."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agents.rebalance import migration as mg
from agents.rebalance.arbitration import TokenBucket
from agents.rebalance.service import GONE_KEEP_S, PRUNE_EVERY_S
from schemas.records import (
    Binding,
    EvictionCommand,
    MigrationJob,
    Pod,
    PodDeleted,
    ReservationEvent,
    ScaleDownEvent,
    SchedulingFeedback,
)
from tests.unit.rebalance.test_service import MOVES, available, consumed, service

EVICT_DIRECTLY = ("profiles: [{name: p, plugins: {balance: {enabled: [ScaleDownBinPack]}}, "
                  "pluginConfig: [{name: ScaleDownBinPack, args: {strategy: EvictDirectly, maxPodsToEvict: 2}}]}]")


def _evictions(svc: Any, now: list[float], rounds: int = 6) -> list[str]:
    """Call actuate `rounds` times, 0.1 s apart (one token each at 10/s, burst 1)."""
    sent: list[str] = []
    for _ in range(rounds):
        sent += [o.record.uid for o in svc.actuate(now[0]) if isinstance(o.record, EvictionCommand)]
        now[0] += 0.1
    return sent


# --- invariant 3: no pod gets two unfinished jobs; no pod is evicted twice ------------------

def test_redelivered_scale_down_evicts_the_same_pods_twice() -> None:
    """Invariant 3 (and the adapter's claim, adapters/rebalancer.py:16-18, that an answer
    given twice "finds the victims' jobs begun: the pods are in flight").

    Sequence: the same EvictDirectly ScaleDownEvent answered twice (a new leader re-answers
    an event whose offset the last leader never committed). `scale_down`
    (service.py:266-268) calls `_start` for every victim without looking at `self.active`,
    and the victims are still bound (no PodDeleted yet), so the second answer plans the same
    victims again: each pod gets a second unfinished job, and actuate evicts each pod twice."""
    svc, now = service(EVICT_DIRECTLY)
    event = ScaleDownEvent(workload="ReplicaSet/mem", replicas=2)
    svc.scale_down(event, now[0])
    svc.scale_down(event, now[0])
    unfinished: dict[str, int] = {}
    for j in svc.jobs.values():
        if j.phase not in mg.FINISHED:
            unfinished[j.pod_uid] = unfinished.get(j.pod_uid, 0) + 1
    sent = _evictions(svc, now)
    assert all(n == 1 for n in unfinished.values()), f"two unfinished jobs per pod: {unfinished}"
    assert len(sent) == len(set(sent)), f"pods evicted twice: {sent}"


def test_a_second_scale_down_evicts_an_already_evicted_pod() -> None:
    """Invariant 3 (no pod is evicted twice).

    Sequence: EvictDirectly scale-down by 2; actuate evicts both victims (jobs Succeeded,
    they leave `active`); before their PodDeleted arrives (graceful termination) a second,
    different ScaleDownEvent of the same workload arrives. The evicted pods are still in
    `pods`/`bound`, so `placed()` offers them to the ranker again and they are the cheapest
    victims: they are evicted a second time while the workload loses no further pod."""
    svc, now = service(EVICT_DIRECTLY)
    svc.scale_down(ScaleDownEvent(workload="ReplicaSet/mem", replicas=2), now[0])
    first = _evictions(svc, now)
    svc.scale_down(ScaleDownEvent(workload="ReplicaSet/mem", replicas=1), now[0])
    second = _evictions(svc, now)
    assert not set(first) & set(second), f"evicted again: {set(first) & set(second)}"


# --- invariant 4: a follower returns no outputs ----------------------------------------------

def test_a_follower_answers_a_scale_down() -> None:
    """Invariant 4. `scale_down` (service.py:251) never checks `self.leading`, unlike cycle,
    actuate and _apply. A follower returns the victims' Reservation-less jobs (EvictDirectly)
    and keeps them in `jobs`/`active`, so a later `lead()` + `actuate` evicts them again on top
    of what the real leader did. (The adapter only calls it when leading, but the service
    claims every method of a follower is silent.)"""
    follower, now = service(EVICT_DIRECTLY, leading=False)
    out, problems = follower.scale_down(ScaleDownEvent(workload="ReplicaSet/mem", replicas=2), now[0])
    assert out == [] and not follower.jobs, f"follower wrote {[type(o.record).__name__ for o in out]}"


# --- invariant 5: a finished job read back is never resurrected ------------------------------

def test_an_older_version_read_after_the_finished_one_resurrects_the_job_and_evicts() -> None:
    """Invariants 5, 1, 2 and 3.

    Sequence (follower): v1 (reserving), v2 (evicting), v3 (Aborted by ttl; the leader also
    wrote PodDeleted for its reservation), then v2 again (redelivered / out of order; equal or
    older versions also come from a deposed leader). `_read_back` (service.py:128-138) pops a
    finished job, so nothing remembers that the uid is finished; the later v2 finds `mine is
    None` and is stored as an unfinished EVICTING job. When this worker leads, actuate sends an
    EvictionCommand for a pod whose move was aborted and whose reservation was deleted: an
    eviction with no reservation held (inv 1), an aborted job that still acts (inv 2/5)."""
    leader, now = service()
    written = [o.record for o in leader.cycle(now[0]) if isinstance(o.record, MigrationJob)]
    job = written[0]
    stepped = [o.record for o in leader.on_records([available(job)]) if isinstance(o.record, MigrationJob)]
    ended = [o.record for o in leader.tick(now[0] + 301)
             if isinstance(o.record, MigrationJob) and o.record.uid == job.uid]
    assert ended[0].phase == mg.ABORTED
    follower, _ = service(leading=False)
    follower.on_records([*written, *stepped, *ended])
    assert job.uid not in follower.jobs
    follower.on_records([stepped[0]])  # v2 read again after v3
    follower.lead(now[0])
    sent = [o.record.uid for o in follower.actuate(now[0]) if isinstance(o.record, EvictionCommand)]
    assert job.uid not in follower.jobs, "a finished job came back"
    assert job.pod_uid not in sent, "evicted the pod of an aborted job (its reservation was deleted)"


# --- invariant 7: arbitration limits across actuate calls / cycles ---------------------------

def test_evicted_pods_stop_counting_once_deleted_so_more_of_the_workload_goes() -> None:
    """Invariant 7 (maxUnavailablePerWorkload; the same filter drops them from
    maxMigratingPerNode/Namespace/Globally).

    Sequence: lopsided cluster (workload cpu: 6 replicas, default limit 2). A cycle plans c00,
    c01 off n0; both reservations Available; actuate evicts both; their PodDeleted arrive (the
    replacements are not running yet: the jobs are still Running/replacing). A second cycle and
    actuate one second later plan and evict two more cpu pods. Cause: `in_flight()`
    (service.py:193-194) and actuate's pre-admission (service.py:224-226) count an unfinished
    job only while `job.pod_uid in self.pods`; after the source pod is deleted the migration is
    forgotten although its replacement has not come up, and `Arbitrator.over(self.placed())`
    even shrinks the workload's replica count. Result: 4 of 6 cpu replicas gone at once."""
    svc, now = service()
    svc.cycle(now[0])
    svc.on_records([available(j) for j in svc.jobs.values()])
    first = _evictions(svc, now)
    cpu_first = [u for u in first if u.startswith("c")]
    assert len(cpu_first) == 2
    # control: while the evicted pods are still known, nothing more of cpu moves
    assert not [o for o in svc.cycle(now[0]) if isinstance(o.record, MigrationJob)]
    svc.on_records([PodDeleted(uid=u, name=u) for u in first])
    now[0] += 1.0
    svc.cycle(now[0])
    svc.on_records([available(j) for j in svc.jobs.values() if j.step == mg.RESERVING])
    second = _evictions(svc, now)
    in_flight_cpu = {j.pod_uid for j in svc.jobs.values()
                     if j.phase not in mg.FINISHED and j.workload.endswith("/cpu")}
    assert len(in_flight_cpu) <= 2, f"cpu migrations in flight: {sorted(in_flight_cpu)} (evicted {first + second})"


def test_max_migrating_per_node_forgets_jobs_whose_pod_is_deleted() -> None:
    """Invariant 7 (maxMigratingPerNode 2), actuate alone.

    Sequence: c00, c01 (n0) evicted -> Running/replacing; a third job off n0 (c02) waits to
    evict (read back as a leader recorded it; the cycle can plan it for the same reason, see
    in_flight()). While c00/c01 are still in `pods` actuate refuses c02 (PER_NODE). Once their
    PodDeleted arrive, actuate's pre-admission (service.py:224-226, `job.pod_uid in self.pods`)
    no longer counts the two replacing jobs and evicts c02: 3 migrations in flight off n0."""
    cfg = ("profiles: [{name: p, plugins: {balance: {enabled: [FragmentationAware]}}, "
           "pluginConfig: [{name: FragmentationAware, args: {minPodAge: 0}}, "
           "{name: MigrationController, args: {maxUnavailablePerWorkload: '50%'}}]}]")
    svc, now = service(cfg)
    svc.cycle(now[0])
    n0 = [j for j in svc.jobs.values() if j.source == "n0"]
    svc.on_records([available(j) for j in n0])
    evicted = _evictions(svc, now, 4)
    assert sorted(evicted) == ["c00", "c01"]
    extra = MigrationJob(uid="migrate-c02-99", pod_uid="c02", pod_name="c02", workload="default/ReplicaSet/cpu",
                         source="n0", destination="n2", phase="Running", step=mg.EVICTING,
                         reservation="migrate-c02-99-reservation", reserved_on="n2", created=now[0], updated=now[0],
                         version=2)
    svc.on_records([extra])
    assert _evictions(svc, now, 2) == []  # control: refused while c00/c01 are known
    svc.on_records([PodDeleted(uid=u, name=u) for u in evicted])
    _evictions(svc, now, 2)
    per_node = sum(1 for j in svc.jobs.values() if j.phase not in mg.FINISHED and j.source == "n0"
                   and j.step == mg.REPLACING)
    assert per_node <= 2, f"{per_node} evicted, unfinished migrations off n0"


def test_a_backward_clock_step_gives_the_bucket_a_free_token() -> None:
    """Invariant 7 (eviction rate limit on the injected clock; clock jumps).

    TokenBucket.take (arbitration.py:238-240) uses `tokens < 0` as "not started yet", but a
    backward clock step makes `(now - stamp) * rate` negative, so `tokens` goes negative and the
    next take re-initialises the bucket to a full burst. Sequence: evict at t=100, the clock
    steps back to 99.0 (NTP; the adapter's default clock is time.time), two actuate calls:
    the second one evicts although no time has passed. With 10/s burst 1, two evictions ~0 s
    apart."""
    t = [100.0]
    bucket = TokenBucket(10.0, 1, lambda: t[0])
    assert bucket.take()
    t[0] = 99.0
    got = [bucket.take(), bucket.take()]
    assert got == [False, False], f"takes after a backward step: {got}"


def test_a_backward_clock_step_lets_actuate_exceed_the_rate() -> None:
    """Invariant 7, through the service: the same free token as above via actuate."""
    svc, now = service(EVICT_DIRECTLY)
    svc.scale_down(ScaleDownEvent(workload="ReplicaSet/mem", replicas=2), now[0])
    sent = [o.record.uid for o in svc.actuate(now[0]) if isinstance(o.record, EvictionCommand)]
    now[0] -= 1.0  # the wall clock steps back
    for _ in range(2):
        sent += [o.record.uid for o in svc.actuate(now[0]) if isinstance(o.record, EvictionCommand)]
    assert len(sent) == 1, f"{len(sent)} evictions with no time passed: {sent}"


# --- invariant 8: bad ScaleDownEvent -> Problem naming the field and value -------------------

def test_zero_replicas_is_blamed_on_the_workload_field() -> None:
    """Invariant 8. replicas=0 passes the `< 0` check (service.py:255), plan_scale_down raises
    ValueError("replicas=0: ..."), and the blanket `except ValueError` (service.py:260-261)
    reports it as Problem(field="workload", value="default/ReplicaSet/mem"): the wrong field and
    value are named."""
    svc, now = service(EVICT_DIRECTLY)
    out, problems = svc.scale_down(ScaleDownEvent(workload="ReplicaSet/mem", replicas=0), now[0])
    assert out == [] and len(problems) == 1
    assert (problems[0].field, problems[0].value) == ("replicas", "0"), problems[0]


# --- crash on a valid record -----------------------------------------------------------------

def test_a_job_uid_ending_in_a_digit_but_not_in_dash_number_crashes_on_read() -> None:
    """'Crashes on any sequence of valid records'. `_read_back` (service.py:132) checks only
    that the uid's LAST CHARACTER is a digit and then int()s everything after the last '-':
    a MigrationJob with uid "job1" (or "migrate-x-a1", or "x-²") raises ValueError out of
    on_records, which kills the adapter loop (no try around service.on_records)."""
    svc, _ = service(leading=False)
    svc.on_records([MigrationJob(uid="job1", pod_uid="c00")])


# --- invariant 9: memory bounded for a follower ----------------------------------------------

def test_events_and_feedback_for_finished_jobs_stay_forever() -> None:
    """Invariant 9. `events` and `unschedulable` are only cleaned by `_forget`, which runs when
    the job finishes. A ReservationEvent or final SchedulingFeedback read AFTER the job's
    finished version (the reservation's own expiry at created+ttl racing the job's ttl abort;
    redelivery; or simply a restart, where the tail reads `migrations` and `reservations`
    interleaved in arbitrary partition order) is stored (service.py:115, 118) for a job that
    will never be read again: one entry per historical migration."""
    leader, now = service()
    written = [o.record for o in leader.cycle(now[0]) if isinstance(o.record, MigrationJob)]
    follower, _ = service(leading=False)
    follower.on_records(written)
    follower.on_records([o.record for o in leader.tick(now[0] + 301) if isinstance(o.record, MigrationJob)])
    assert not follower.jobs
    follower.on_records([ReservationEvent(name=j.reservation, uid=j.reservation, phase="Failed", reason="Expired")
                         for j in written])
    follower.on_records([SchedulingFeedback(uid=j.reservation, namespace="default", name=j.reservation, attempt=1,
                                            message="x", final=True) for j in written])
    assert not follower.events, f"{len(follower.events)} events kept for finished jobs"
    assert not follower.unschedulable, f"{len(follower.unschedulable)} reservations kept"


def test_moved_at_keeps_every_migrated_pod_forever() -> None:
    """Invariant 9. `moved_at` is popped on PodDeleted only when the pod has NO active job
    (service.py:105-109). A migrated pod is deleted exactly while its job is active
    (Running/replacing), so its entry is never removed; the finished job read back afterwards
    even re-adds it (service.py:131). Every successful migration leaves one entry for a pod
    that no longer exists."""
    leader, now = service()
    written = [o.record for o in leader.cycle(now[0]) if isinstance(o.record, MigrationJob)]
    log = [o.record for o in leader.on_records([available(j) for j in written]) if isinstance(o.record, MigrationJob)]
    for _ in range(5):
        log += [o.record for o in leader.actuate(now[0]) if isinstance(o.record, MigrationJob)]
        now[0] += 0.1
    deleted = [PodDeleted(uid=j.pod_uid, name=j.pod_name) for j in written]
    done = [consumed(j) for j in written]
    log += [o.record for o in leader.on_records([*deleted, *done]) if isinstance(o.record, MigrationJob)]
    follower, _ = service(leading=False)
    follower.on_records([*written, *deleted, *done, *log])
    assert not leader.jobs and leader.finished[(mg.SUCCEEDED, mg.DONE)] == len(written)
    gone = {j.pod_uid for j in written}
    assert not gone & set(follower.moved_at), f"moved_at keeps deleted pods: {sorted(gone & set(follower.moved_at))}"


def test_bindings_read_after_their_pods_deletion_leave_no_entries() -> None:
    """Issue 28, item 11. The tail reads `pods` and `bindings` interleaved in no fixed order,
    so a short-lived pod's Binding can be read after its PodDeleted: it was kept in `bound`
    for ever (10,000 such pods left 10,000 entries). A deleted uid is remembered for
    `GONE_KEEP_S` and its late Binding dropped; a Binding read before its Pod still counts."""
    svc, now = service(leading=False)
    before = len(svc.bound)
    for i in range(10_000):
        uid = f"short-{i}"
        svc.on_records([Pod(uid=uid, name=uid, phase="Running"), PodDeleted(uid=uid, name=uid),
                        Binding(uid=uid, namespace="default", name=uid, node="n0", attempt=0, decision_key=uid)])
        now[0] += 0.1
        svc.prune(now[0])
    assert len(svc.bound) == before, f"{len(svc.bound) - before} Bindings of deleted pods kept"
    assert len(svc.gone) <= (GONE_KEEP_S + PRUNE_EVERY_S) / 0.1 + 1  # bounded by time, not history
    now[0] += GONE_KEEP_S + PRUNE_EVERY_S
    svc.prune(now[0])
    assert not svc.gone
    early = Binding(uid="early", namespace="default", name="early", node="n0", attempt=0, decision_key="early")
    svc.on_records([early, Pod(uid="early", name="early", phase="Running")])
    assert svc.bound["early"] == "n0" and "early" in {p.uid for p in svc.placed()}


def test_the_leader_keeps_every_scale_down_plan() -> None:
    """Invariant 9 (leader side). `scale_downs` (service.py:264) is appended to on every
    answered ScaleDownEvent and never trimmed; nothing in the service reads it back."""
    svc, now = service("profiles: [{name: p, plugins: {balance: {enabled: [ScaleDownBinPack]}}}]")
    for _ in range(50):
        svc.scale_down(ScaleDownEvent(workload="mem", replicas=1), now[0])
    assert len(svc.scale_downs) <= 1, f"{len(svc.scale_downs)} plans kept"


# --- invariant 2 (literal) -------------------------------------------------------------------

def test_a_job_aborted_by_a_failed_reservation_emits_no_pod_deleted() -> None:
    """Invariant 2 as stated ("its reservation gets a PodDeleted output unless consumed";
    migration.py:25 "its reservation is deleted in the same step"). on_reservation(FAILED)
    ends the job with release=False (migration.py:132-134). The owners no longer hold capacity
    for a Failed reservation, so nothing is *held*; but the Reservation object written to
    `pods` by `start` is never deleted (the compacted topic keeps it forever), unlike every
    other abort path. Low severity: the literal claim fails, the capacity claim holds."""
    svc, now = service()
    svc.cycle(now[0])
    job = next(iter(svc.jobs.values()))
    out = svc.on_records([ReservationEvent(name=job.reservation, uid=job.reservation, phase="Failed",
                                           reason="Expired")])
    assert job.uid in svc.done and svc.finished[(mg.ABORTED, mg.EXPIRED)] == 1
    assert job.reservation in {o.record.uid for o in out if isinstance(o.record, PodDeleted)}


def test_same_version_written_by_a_deposed_leader_after_the_finish_resurrects() -> None:
    """Invariant 5, the deposed-leader variant. Leaders B and A (deposed, still writing) both
    step v1 to v2: B's v2 Aborted lands first, A's v2 evicting after it. `_read_back` pops the
    finished v2 and then, holding nothing, keeps A's equal-version v2 as a live EVICTING job.
    In the reverse order the finished one wins; the outcome depends on arrival order."""
    leader, now = service()
    job = [o.record for o in leader.cycle(now[0]) if isinstance(o.record, MigrationJob)][0]
    follower, _ = service(leading=False)
    follower.on_records([job])
    aborted = replace(job, phase=mg.ABORTED, step="", reason=mg.TTL, version=2)
    evicting = replace(job, step=mg.EVICTING, reserved_on="n2", version=2)
    follower.on_records([aborted, evicting])
    assert job.uid not in follower.jobs


def test_an_available_event_without_a_node_lets_the_move_evict() -> None:
    """Invariant 1 (Available on a node *other than the source*). on_reservation
    (migration.py:120-125) only compares `event.node == job.source`; a schema-valid
    ReservationEvent(phase=Available) with the default node "" moves the job to evicting and
    actuate evicts the pod with no known destination (reserved_on=""). Low severity: the
    owners are not seen producing such an event, but nothing rejects it."""
    svc, now = service()
    job = [o.record for o in svc.cycle(now[0]) if isinstance(o.record, MigrationJob)][0]
    svc.on_records([ReservationEvent(name=job.reservation, uid=job.reservation, phase="Available", node="")])
    sent = [o.record.uid for o in svc.actuate(now[0]) if isinstance(o.record, EvictionCommand)]
    assert job.pod_uid not in sent


# --- issue 28, item 7: no eviction at the ttl's edge -------------------------------------------

def test_a_late_available_event_does_not_evict_at_the_ttls_edge() -> None:
    """Issue 28, item 7. A ReservationFirst job's reservation Available at 299.9 s of its
    300 s ttl: `actuate` evicted, and at 300 s the job aborted and deleted the reservation, a
    pod evicted with no reservation for its replacement. With less than `evictionTTLMargin`
    (MigrationController, default 30 s) of the ttl left, the job sends no eviction and ends at
    its ttl; with the margin configured to 0 the old edge is back (the setting is read)."""
    for margin, evicts in (("", False), ("0s", True)):
        text = MOVES if not margin else MOVES.replace(
            "pluginConfig: [", f"pluginConfig: [{{name: MigrationController, args: {{evictionTTLMargin: {margin}}}}}, ", 1)
        svc, now = service(text)
        job = [o.record for o in svc.cycle(now[0]) if isinstance(o.record, MigrationJob)][0]
        now[0] += job.ttl_s - 0.1
        svc.on_records([available(job)])
        sent = [o.record.uid for o in svc.actuate(now[0]) if isinstance(o.record, EvictionCommand)]
        assert (job.pod_uid in sent) == evicts, f"margin {margin or 'default'}: evicted {sent}"
        if not evicts:
            now[0] += 0.1
            out = svc.tick(now[0])
            assert job.uid in svc.done and job.reservation in {o.record.uid for o in out if isinstance(o.record, PodDeleted)}
            assert not [o for o in svc.actuate(now[0]) if isinstance(o.record, EvictionCommand)]


def test_an_available_event_with_the_margin_left_still_evicts() -> None:
    svc, now = service()
    job = [o.record for o in svc.cycle(now[0]) if isinstance(o.record, MigrationJob)][0]
    now[0] += job.ttl_s - 30.0  # exactly the default margin left
    svc.on_records([available(job)])
    assert job.pod_uid in [o.record.uid for o in svc.actuate(now[0]) if isinstance(o.record, EvictionCommand)]
