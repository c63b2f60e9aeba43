"""ReservationFirst moves (Koordinator's PodMigrationJob) as a pure state machine over the
`MigrationJob` record: every input returns the job's next version and the records to send.

    Pending --start--> Running/reserving --Available elsewhere--> Running/evicting
        --evicted--> Running/replacing --reservation consumed by a replacement--> Succeeded
    EvictDirectly: Pending --start--> Running/evicting --evicted--> Running/terminating
        --pod deleted--> Succeeded

1. `start`: a Reservation for the pod's replacement, owned by the pod's controller (so the
   pod it recreates consumes it), with the pod's request, scheduler, priority, tolerations and
   node selector, allocate-once, its ttl the job's (MigrationController's `defaultJobTTL` when
   the job began, counted from the job's creation), and pinned
   to the planned destination by a required node affinity on `metadata.name` (`reservation_of`:
   built from the job and its pod alone, so a new leader sends the same one again).
   `EvictDirectly` skips it and evicts at once.
2. `on_reservation`: Available on a node other than the source: the job asks to evict (the
   actuator sends the EvictionCommand when arbitration and the rate limit allow and at least
   the margin `evictionTTLMargin` of the ttl is left (`ttl_left`: a pod evicted at the ttl's
   edge would find its reservation deleted at the ttl), `evicted` records it; a new leader
   sends a recorded eviction again as it is, its margin and budget judged when it was
   decided). Available on the source, or Failed (expired, node lost): Aborted.
   Succeeded (an allocate-once reservation consumed) after the eviction: Succeeded when the
   event's `current_owners` name a replacement (a pod of the job's namespace other than the
   evicted one, of the job's workload when that pod is known: the reservation's owner is the
   workload's controller, so only its pods can consume it), else Aborted; before the eviction
   (another pod of the workload took it): Aborted, nothing evicted. Several moves of one
   workload share an owner, so the scheduler may put a replacement into any of their
   reservations; a job decides only from its own reservation's consumer, never from a
   sibling's (the one that waits for its replacement keeps its reservation until it is
   consumed or the ttl ends the job).
3. `on_unschedulable`: the reservation fits nowhere (its final feedback): Aborted.
4. `on_pod_gone`: the source pod went before the eviction: Aborted, its reservation deleted.
   After the eviction it is what the job waited for: an EvictDirectly job is Succeeded (only
   then: a job recorded as evicting whose eviction was lost is not Succeeded, and a new
   leader sends the eviction again).
5. `on_eviction_refused`: the Eviction API's 429 (a PodDisruptionBudget): the job keeps
   waiting to evict and says why.
6. `on_tick`: past `created + ttl_s` and not finished: Aborted (TTL), the reservation deleted
   unless the replacement already took it.

An Aborted or Failed job leaves nothing held: its reservation is deleted in the same step,
and the record says so (`released`), so that a new leader sends the deletion again if it may
have been lost. Finished jobs ignore every later input (a redelivered event changes nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from agents.ports import Output
from agents.rebalance.args import JOB_TTL_S
from agents.rebalance.evictor import controller_of, workload_of
from agents.state import reservations
from schemas import topics
from schemas.records import (
    EvictionCommand,
    MigrationJob,
    Pod,
    PodDeleted,
    Reservation,
    ReservationEvent,
    ReservationOwner,
)

PENDING, RUNNING, SUCCEEDED, FAILED, ABORTED = "Pending", "Running", "Succeeded", "Failed", "Aborted"
RESERVING, EVICTING, REPLACING, TERMINATING = "reserving", "evicting", "replacing", "terminating"
FINISHED = frozenset({SUCCEEDED, FAILED, ABORTED})
RESERVATION_FIRST, EVICT_DIRECTLY = "ReservationFirst", "EvictDirectly"

TTL = "timed out (ttl)"
UNSCHEDULABLE = "reservation unschedulable"
EXPIRED = "reservation expired"
RESERVATION_FAILED = "reservation failed"
ON_SOURCE = "reservation on the source node"
SOURCE_GONE = "source pod gone"
EVICTION_REFUSED = "eviction refused (PodDisruptionBudget); retrying"
EVICTION_REJECTED = "eviction refused by the API server"
NO_CONTROLLER = "no controller to recreate the pod"
DONE = "replacement bound into the reservation"
CONSUMED_EARLY = "reservation consumed before the eviction"
CONSUMED_BY_OTHER = "reservation consumed by a pod that is not the replacement"
EVICTED = "evicted"

RESERVATION_SUFFIX = "-reservation"  # a job's reservation is named after it

Step = tuple[MigrationJob, list[Output]]


def new_job(pod: Pod, *, source: str, destination: str, now: float, mode: str = RESERVATION_FIRST,
            ttl_s: float = JOB_TTL_S, sequence: int = 0) -> MigrationJob:
    return MigrationJob(uid=f"migrate-{pod.uid}-{sequence}", pod_uid=pod.uid, namespace=pod.namespace,
                        pod_name=pod.name, workload=workload_of(pod), source=source, destination=destination,
                        mode=mode, created=now, ttl_s=ttl_s, updated=now)


def pinned(node: str) -> dict[str, object]:
    """A required node affinity that only `node` passes (matchFields on metadata.name)."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def _record(job: MigrationJob, outputs: list[Output]) -> Step:
    job = replace(job, version=job.version + 1)
    return job, [*outputs, Output(topics.MIGRATIONS, job.uid, job)]


def deletion(job: MigrationJob) -> PodDeleted:
    """The deletion of the job's reservation (sent again, unchanged, by a leader that took over)."""
    return PodDeleted(uid=job.reservation, name=job.reservation, namespace=job.namespace)


def _end(job: MigrationJob, phase: str, reason: str, now: float, *, release: bool) -> Step:
    released = release and bool(job.reservation)
    outputs = [Output(topics.PODS, job.reservation, deletion(job))] if released else []
    return _record(replace(job, phase=phase, step="", reason=reason, updated=now, released=released), outputs)


def reservation_of(job: MigrationJob, pod: Pod) -> Reservation | None:
    """The Reservation a ReservationFirst job holds for its pod's replacement (None: the pod
    has no controller), the same whenever it is built: from the job and its pod only."""
    owner = controller_of(pod)
    if owner is None:
        return None
    kind, name, uid = owner
    name_ = job.uid + RESERVATION_SUFFIX
    return Reservation(
        uid=name_, name=name_,
        owners=(ReservationOwner(controller_uid=uid, controller_namespace=pod.namespace, controller_kind=kind,
                                 controller_name=name),),
        requests=pod.requests, ttl_s=job.ttl_s, allocate_once=True, creation_timestamp=job.created,
        labels={"koordstream.io/migration-job": job.uid}, scheduler_name=pod.scheduler_name, priority=pod.priority,
        priority_class_name=pod.priority_class_name, node_selector=pod.node_selector,
        affinity=pinned(job.destination) if job.destination else pod.affinity, tolerations=pod.tolerations)


def start(job: MigrationJob, pod: Pod, now: float) -> Step:
    """Begin a Pending job: reserve for the replacement (or, EvictDirectly, evict at once)."""
    if job.phase != PENDING:
        return job, []
    if job.mode == EVICT_DIRECTLY:
        return _record(replace(job, phase=RUNNING, step=EVICTING, updated=now), [])
    reservation = reservation_of(job, pod)
    if reservation is None:
        return _end(job, ABORTED, NO_CONTROLLER, now, release=False)
    return _record(replace(job, phase=RUNNING, step=RESERVING, reservation=reservation.uid, updated=now),
                   [Output(topics.PODS, reservation.uid, reservation)])


def replacement(job: MigrationJob, event: ReservationEvent, pods: Mapping[str, Pod]) -> str:
    """The uid of the pod the event says consumed the job's reservation, if it can be the
    replacement of the job's pod: of the job's namespace, not the evicted pod, and of the job's
    workload when `pods` knows it ("" for none)."""
    for owner in event.current_owners:
        pod = pods.get(owner.uid)
        if (owner.uid != job.pod_uid and owner.namespace in ("", job.namespace)
                and (pod is None or workload_of(pod) == job.workload)):
            return owner.uid
    return ""


def on_reservation(job: MigrationJob, event: ReservationEvent, now: float,
                   pods: Mapping[str, Pod] | None = None) -> Step:
    if job.phase in FINISHED or event.uid != job.reservation:
        return job, []
    if event.phase == reservations.AVAILABLE:
        if job.step != RESERVING or not event.node:
            return job, []  # an Available event that names no node says nothing about where
        if event.node == job.source:
            return _end(job, ABORTED, ON_SOURCE, now, release=True)
        return _record(replace(job, step=EVICTING, reserved_on=event.node, updated=now), [])
    if event.phase == reservations.SUCCEEDED:
        if job.step == REPLACING:  # consumed, so it holds nothing to delete
            if replacement(job, event, pods or {}):
                return _end(job, SUCCEEDED, DONE, now, release=False)
            return _end(job, ABORTED, CONSUMED_BY_OTHER, now, release=False)
        # Consumed before the eviction, by another pod of the workload: evicting now would
        # leave the source's replacement without the capacity it was promised.
        return _end(job, ABORTED, CONSUMED_EARLY, now, release=False)
    if event.phase == reservations.FAILED:
        reason = EXPIRED if event.reason == reservations.REASON_EXPIRED else f"{RESERVATION_FAILED}: {event.reason}"
        return _end(job, ABORTED, reason, now, release=True)  # it holds nothing, but the record goes too
    return job, []


def on_unschedulable(job: MigrationJob, reservation_uid: str, now: float) -> Step:
    if job.phase in FINISHED or reservation_uid != job.reservation or job.step != RESERVING:
        return job, []
    return _end(job, ABORTED, UNSCHEDULABLE, now, release=True)


def eviction(job: MigrationJob, reason: str = "rebalance: FragmentationAware") -> EvictionCommand | None:
    """The eviction a job waits to send (None when it waits for nothing)."""
    if job.phase != RUNNING or job.step != EVICTING:
        return None
    return command(job, reason)


def ttl_left(job: MigrationJob, now: float) -> float:
    """Seconds until the job's ttl (and its reservation's) runs out; negative past it."""
    return job.created + job.ttl_s - now


def command(job: MigrationJob, reason: str) -> EvictionCommand:
    """The job's EvictionCommand (sent again, unchanged, by a leader that took over)."""
    return EvictionCommand(uid=job.pod_uid, namespace=job.namespace, name=job.pod_name, node=job.source,
                           reason=f"{reason} (migration {job.uid})")


def evicted(job: MigrationJob, now: float) -> Step:
    """The actuator sent the job's eviction."""
    if job.phase != RUNNING or job.step != EVICTING:
        return job, []
    return _record(replace(job, step=TERMINATING if job.mode == EVICT_DIRECTLY else REPLACING, updated=now), [])


def sent_eviction(job: MigrationJob) -> bool:
    """Whether the job's record says its eviction was sent (it waits for what follows it)."""
    return job.phase == RUNNING and job.step in (REPLACING, TERMINATING)


def on_eviction_refused(job: MigrationJob, now: float) -> Step:
    if job.phase != RUNNING or job.step != EVICTING or job.reason == EVICTION_REFUSED:
        return job, []
    return _record(replace(job, reason=EVICTION_REFUSED, updated=now), [])


def on_eviction_rejected(job: MigrationJob, reason: str, now: float) -> Step:
    """The API server refused the eviction the job sent (`EvictionRefused`): its pod stays, so
    the move ends, its reservation deleted."""
    if not sent_eviction(job):
        return job, []
    return _end(job, ABORTED, f"{EVICTION_REJECTED}: {reason}", now, release=True)


def on_pod_gone(job: MigrationJob, uid: str, now: float) -> Step:
    if job.phase in FINISHED or uid != job.pod_uid or job.step == REPLACING:
        return job, []
    if job.step == TERMINATING:  # the evicted pod went: the scale-down happened
        return _end(job, SUCCEEDED, EVICTED, now, release=False)
    return _end(job, ABORTED, SOURCE_GONE, now, release=True)


def on_tick(job: MigrationJob, now: float) -> Step:
    if job.phase in FINISHED or now < job.created + job.ttl_s:
        return job, []
    return _end(job, ABORTED, TTL, now, release=True)

