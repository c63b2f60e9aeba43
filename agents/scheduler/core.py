"""The scheduler core: queue, profiles and the shared cluster state, records in and out.

One `SchedulerCore` per worker. It owns one `ClusterState` (with its nominator) and one
`Framework` per profile over it, and one `SchedulingQueue`. Data flow:

- `add(pod)`: a pod for one of our profiles (`schedulerName`) enters the queue, admitted
  through its runtime class first when it names one (`agents.sandbox.runtimes`: the class's
  overhead, selector, tolerations and QoS rule; the pod as it was sent is kept beside it,
  `SENT`), with Koordinator's QoS class and priority defaults filled in (`koordinator`). Pods
  that can never be placed as they are (an unknown profile or runtime class, a refusal of
  their runtime class, an unknown or negative resource, a QoS label Koordinator does not
  know) get a final SchedulingFeedback at once and are not retried until the pod changes.
  `add_reservation(r)`: a Reservation enters the same way, as a pod made from its template;
  a reservation that cannot be valid (no owners, an unknown allocatePolicy, ttl and expires
  both set) gets final feedback naming the field.
- `schedule(limit)`: pops up to `limit` pods in queue order, hands each run of consecutive
  pods of one profile to that profile's framework (equivalence classes are found there), and
  turns the placements into records: Claims (Bind), Nominations and EvictionCommands
  (preemption), SchedulingFeedback (why a pod fits nowhere). A pod that fits nowhere waits
  in the queue for a cluster event that could change that.
- `apply_state_changes(changes)`: owners' reports update the state; bound pods leave for good
  (decisions are final); freed capacity or changed nodes move waiting pods back.
- `requeue(r)`: the decider sends a pod back (its claim was rejected or released): its
  reservation is undone (Unreserve) and it backs off. A Requeue read before its pod (a
  restarted or newly assigned replica reads `pods` and `requeue` from their start, in no
  order between the two) is kept until the pod comes, so the pod starts from its latest
  attempt, not from 0 (a claim of an attempt the decider moved past would wait for ever).
- `delete(d)`: forget the pod, clear its nomination, forward the deletion to its decider: under
  the key its committed hold was claimed with (the owners' reports carry it), else the key of
  the first version read here, bound or not (`known_key`), else what the deletion says. A
  replica that restarted or took the partition over may read a bound pod only now, or only
  its deletion: the reports still name the gang's decider.
- `revoke(partitions)`: the worker lost those partitions of `pods` / `requeue` (a rebalance):
  their pods stop being placed at once (DESIGN.md, safety rule 4). Each pod remembers the
  partition it came in on (`add(..., partition=)`). A claim already out stays assumed in the
  state until its outcome (held, committed, released, rejected) shows in `state-changes`,
  which ends every assumption by hold id whoever placed it; the pod's new owner re-reads it.
- `unclaim(claims)`: claims whose send the broker did not acknowledge: no owner will ever
  decide them, so their pods go back to the queue as on a requeue (same attempt: the decider
  never saw it), or, for a pod no longer tracked here, the assumption is dropped.

Sandboxes (`agents.sandbox.runtimes.is_sandbox`) that fail get a hint on their feedback
(`agents.sandbox.feedback`): the core is the advisor's `Probe` (`place`, `capacity`,
`pool_size`: the same profile's filters over the same state, changing nothing), computes a hint
once per equivalence class per batch (`_hint`), and tells the advisor's `Lifetimes` when a
bound sandbox starts and ends (`apply_state_changes`, on the injected clock).

Outstanding claims (`claims_out`, what `scheduling.max_outstanding_claims` limits): a claim is
out from its placement until it is decided, as the owners report it (committed, released,
rejected, terminated: not held), or its pod is requeued past it, deleted, or its send failed.

Pod states here: queued -> claimed (a Claim is out, assumed in the state) -> gone when bound;
claimed -> queued on requeue or a failed send; waiting (Permit) -> claimed | queued; failed
(bad input) until the pod changes; any -> gone when its partition is revoked.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agents.ports import Clock, Output
from agents.sandbox.feedback import Advisor, Capacity, Hint, Lifetimes, shape
from agents.sandbox.runtimes import AdmissionError, RuntimeTable, is_sandbox
from agents.scheduler import koordinator
from agents.scheduler.cluster import ClusterEvent, ClusterState
from agents.scheduler.framework.interface import PodInfo
from agents.scheduler.framework.profiles import SchedulerConfig, default_config
from agents.scheduler.framework.runtime import Evaluation, Framework, Placement
from agents.scheduler.framework.status import Code
from agents.scheduler.plugins.reservation import DERIVED as RESERVATION
from agents.scheduler.queue import SchedulingQueue
from agents.state import devices
from agents.state import reservations as rsv
from agents.state.gangs import gang_spec
from agents.state.resources import ResourceSpace, UnknownResource, Vector
from schemas import topics
from schemas.errors import FieldError
from schemas.records import (
    DEFAULT_SCHEDULER,
    GANG_MIN_AVAILABLE_ANNOTATION,
    Claim,
    EvictionCommand,
    HoldId,
    HoldStatus,
    NodeStateChange,
    NominationCleared,
    Pod,
    PodDeleted,
    Requeue,
    Reservation,
    SchedulingFeedback,
    decision_key,
    hold_id,
)

QUEUED, CLAIMED, WAITING, FAILED = "queued", "claimed", "waiting", "failed"
SCHEDULER_NAMES = (DEFAULT_SCHEDULER, "koordstream")
SENT = "sandbox/sent"  # PodInfo.derived: the pod as it was sent, when its runtime class changed it


@dataclass
class Tracked:
    info: PodInfo
    state: str = QUEUED
    failures: int = 0
    row: int = -1
    profile: str = ""
    partition: int | None = None  # of `pods` / `requeue` it came in on (None: library use)


class SchedulerCore:
    def __init__(
        self,
        space: ResourceSpace,
        state: ClusterState,
        clock: Clock,
        *,
        config: SchedulerConfig | None = None,
        timer: Callable[[], int] = time.perf_counter_ns,
        backoff_initial_s: float = 0.01,
        backoff_max_s: float = 1.0,
        flush_s: float = 30.0,
        batching: bool = True,
        gather: bool = True,
        runtimes: RuntimeTable | None = None,
    ) -> None:
        self.space = space
        self.state = state
        self.clock = clock
        self.config = config or default_config(SCHEDULER_NAMES)
        self.frameworks = {p.name: Framework(p, state, timer=timer, clock=clock) for p in self.config.profiles}
        self.queue = SchedulingQueue(self.config.queue_sort.sort_key, clock, backoff_initial_s=backoff_initial_s,
                                     backoff_max_s=backoff_max_s, flush_s=flush_s)
        self.batching = batching
        self.gather = gather
        self.pods: dict[str, Tracked] = {}
        self.decision_keys: dict[str, str] = {}  # fixed by a pod's first version
        self.bound: set[str] = set()  # uids whose commit the state has seen
        self.requeued: dict[str, int] = {}  # uid -> latest attempt of a Requeue read before its pod
        # uid -> hold id of its claim that is out and not decided yet (`scheduling.
        # max_outstanding_claims`): a held claim still waits for its decider, its assumption does not.
        self.claims_out: dict[str, str] = {}
        # Partitions whose pods are read but not placed yet (`hold`), with those pods' uids.
        self.held: dict[int, set[str]] = {}
        # Scheduling attempts by (profile, result), results named as kube-scheduler's
        # scheduler_schedule_attempts_total: scheduled (a claim went out), unschedulable (no node
        # fits), error (Reserve or Permit refused). A claim the owner refuses is a new attempt.
        self.attempts: Counter[tuple[str, str]] = Counter()
        # Of the scheduled attempts, per profile, the pods placed as members of an equivalence
        # class (the fast path) rather than by the full path.
        self.batched: Counter[str] = Counter()
        self._arrival = 0
        self._group_arrival: dict[str, int] = {}  # gang's decision key -> arrival of its first pod
        self._gang_members: dict[str, int] = {}  # gang's decision key -> its uids in decision_keys
        # Request vectors by request map: pods of one template share one (read-only) vector.
        self._requests: dict[tuple[tuple[str, int], ...], tuple[Vector, npt.NDArray[np.intp], bytes]] = {}
        self.runtimes = runtimes if runtimes is not None else RuntimeTable()
        self.lifetimes = Lifetimes()
        self.advisor = Advisor(self, self.runtimes, self.lifetimes, clock)

    # -- inputs -------------------------------------------------------------------------------

    def pod_info(self, pod: Pod) -> PodInfo:
        """The framework's view of a pod; raises ValueError naming the field for bad requests."""
        return self._info(pod, self._key(pod))

    def _info(self, pod: Pod, key: str) -> PodInfo:
        signature = tuple(pod.requests.items())
        known = self._requests.get(signature)
        if known is None:
            for name, amount in pod.requests.items():
                if amount < 0:
                    raise ValueError(f"requests.{name}={amount}: a request cannot be negative")
            try:
                request = self.space.pod_request(devices.with_gpu_totals(pod.requests))
            except UnknownResource as exc:
                raise ValueError(f"requests.{exc.name}: unknown resource (known: {', '.join(self.space.names)})") from exc
            if len(self._requests) > 65536:
                self._requests.clear()
            known = self._requests[signature] = (request, np.flatnonzero(request), request.tobytes())
        qos, priority = koordinator.defaults(pod)
        info = PodInfo(pod, known[0], known[1], key, profile=pod.scheduler_name, request_key=known[2],
                       priority=priority, qos=qos)
        if GANG_MIN_AVAILABLE_ANNOTATION in pod.annotations:
            info.derived["gang"] = gang_spec(pod.annotations)
        return info

    def _key(self, pod: Pod) -> str:
        """The pod's decision key, fixed by the first version read here (DESIGN.md, rule 5)."""
        key = self.decision_keys.get(pod.uid)
        if key is None:
            key = self.decision_keys[pod.uid] = decision_key(pod.namespace, pod.labels, pod.annotations, pod.uid)
            if key != pod.uid:
                self._gang_members[key] = self._gang_members.get(key, 0) + 1
        return key

    def known_key(self, uid: str) -> str | None:
        """The decision key a pod was decided under, if this replica can know it: the key its
        committed hold was claimed with (the owners' reports carry it: right even when the
        first version read here came after a label change), else the first version's."""
        placed = self.state.bound.get(uid)
        if placed is not None and placed.pod.decision_key:
            return placed.pod.decision_key
        return self.decision_keys.get(uid)

    def add_reservation(self, r: Reservation, *, partition: int | None = None) -> list[Output]:
        """A Reservation: scheduled like a pod made from its template (a "reserve pod")."""
        pod = Pod(uid=r.uid, name=r.name, namespace="", labels=r.labels, scheduler_name=r.scheduler_name,
                  priority=r.priority, priority_class_name=r.priority_class_name, requests=r.requests,
                  node_selector=r.node_selector, affinity=r.affinity, tolerations=r.tolerations,
                  creation_timestamp=r.creation_timestamp)
        return self.add(pod, reservation=r, partition=partition)

    def add(self, pod: Pod, *, reservation: Reservation | None = None, partition: int | None = None) -> list[Output]:
        """A new or updated pod, read on `partition` of `pods` (see `revoke`). Returns final
        feedback for pods that cannot be placed as they are."""
        if pod.node_name or pod.uid in self.bound:
            # Nothing to place, but its deletion must reach its decider: a replica that restarted
            # (or took the partition over) may read the pod only now, bound, and its deletion
            # record carries no gang annotation.
            self._key(pod)
            self.requeued.pop(pod.uid, None)
            return []
        tracked = self.pods.get(pod.uid)
        if tracked is not None and partition is not None:
            tracked.partition = partition
        sent = pod
        try:
            pod = self.runtimes.admit(sent)
        except AdmissionError as exc:
            refusal: AdmissionError | None = exc
        else:
            refusal = None
        if tracked is not None and tracked.state in (CLAIMED, WAITING):
            if refusal is None:  # (a refused one: runtimeClassName cannot change on a pod)
                tracked.info.pod = pod  # an update while a claim is out: the next attempt uses it
            return []
        if sent.scheduler_name not in self.frameworks:
            return self._refuse(sent, partition, f"no scheduler profile named {sent.scheduler_name!r} "
                                f"(profiles: {', '.join(self.frameworks)})")
        if refusal is not None:
            return self._refuse(sent, partition, str(refusal), refusal)
        try:
            unsupported = [k for k in ("podAffinity", "podAntiAffinity") if pod.affinity.get(k)] if pod.affinity else ()
            if unsupported:
                raise ValueError(f"affinity.{unsupported[0]}: inter-pod affinity is not supported yet; "
                                 "remove it or use another scheduler for this pod")
            if reservation is not None:
                rsv.validate(reservation)
            info = self.pod_info(pod)
            if reservation is not None:
                info.derived[RESERVATION] = reservation
            if pod is not sent:
                info.derived[SENT] = sent
        except ValueError as exc:
            return self._refuse(sent, partition, str(exc), exc if isinstance(exc, FieldError) else None)
        if tracked is not None and tracked.state == QUEUED:
            info.attempt, info.arrival = tracked.info.attempt, tracked.info.arrival
            info.group_arrival = tracked.info.group_arrival
            tracked.info = info
            if not self._held(pod.uid, partition):
                self.queue.update(info)
            return []
        self._arrival += 1
        info.arrival = self._arrival
        info.group_arrival = self._arrival if info.decision_key == pod.uid \
            else self._group_arrival.setdefault(info.decision_key, self._arrival)
        if tracked is not None:
            info.attempt = tracked.info.attempt
        info.attempt = max(info.attempt, self.requeued.pop(pod.uid, 0))
        self.pods[pod.uid] = Tracked(info, partition=partition)
        if not self._held(pod.uid, partition):
            self.queue.add(info)
        return []

    def _refuse(self, pod: Pod, partition: int | None, message: str, error: FieldError | None = None
                ) -> list[Output]:
        """A version of a pod that no profile here can place: finally refused until a later
        version changes that. An earlier version still queued leaves the queue (else it would
        be placed as it was, and its claim would make the refused pod claimed again). A
        sandbox's feedback carries a hint (`error`: what refused it, naming the field)."""
        self.queue.remove(pod.uid)
        self.pods[pod.uid] = Tracked(PodInfo(pod, self.space.vector({}), np.empty(0, np.intp), pod.uid), FAILED,
                                     partition=partition)
        hint = self._refused_hint(pod, error or FieldError("", "", message)) if is_sandbox(pod) else None
        return [self._feedback(pod, 0, message, {}, final=True, hint=hint)]

    def map_sizes(self) -> dict[str, int]:
        """How many entries each map of the replica keeps (`koordstream_replica_map_entries`):
        all of them follow the live pods (DESIGN.md, rule 10)."""
        return {
            "pods": len(self.pods), "decision_keys": len(self.decision_keys), "bound": len(self.bound),
            "requeued": len(self.requeued), "claims_out": len(self.claims_out), "gang_members": len(self._gang_members),
            "group_arrival": len(self._group_arrival), "assumptions": len(self.state.assumptions),
            "held": sum(len(h) for h in self.held.values()), "queue": len(self.queue),
            "sandbox_starts": self.lifetimes.running,
        }

    def hold(self, partitions: Iterable[int]) -> None:
        """Read the pods of these partitions, but place none of them until `release`: a replica
        that reads a partition from its first record places nothing before it has read up to
        where the partition stood (a pod and, further on, its deletion: placing the pod in
        between would claim a pod deleted long ago, which its decider may have forgotten)."""
        for partition in partitions:
            held = self.held.setdefault(partition, set())
            for uid, tracked in self.pods.items():  # a partition read again: its queued pods wait too
                if tracked.partition == partition and tracked.state == QUEUED and self.queue.remove(uid) is not None:
                    held.add(uid)

    def release(self, partition: int, home: Callable[[str], int | None] | None = None) -> int:
        """Place the held pods of `partition` from now on; returns how many were waiting. The
        Requeues kept for pods of the partition (`home`: a uid's partition) that were not read
        by then are dropped: those pods are gone, or bound, or not this replica's."""
        if home is not None:
            for uid in [u for u in self.requeued if u not in self.pods and home(u) == partition]:
                del self.requeued[uid]
        held = self.held.pop(partition, set())
        released = 0
        for uid in held:
            tracked = self.pods.get(uid)
            if tracked is not None and tracked.state == QUEUED and tracked.partition == partition:
                self.queue.add(tracked.info, failures=tracked.failures)
                released += 1
        return released

    def _held(self, uid: str, partition: int | None) -> bool:
        """The pod's partition is held: note the pod there instead of queueing it."""
        held = self.held.get(partition) if partition is not None else None
        if held is None:
            return False
        held.add(uid)
        return True

    def delete(self, deleted: PodDeleted) -> list[Output]:
        """Forget the pod, clear its nomination, and forward the deletion to its decider."""
        key = self.known_key(deleted.uid) or deleted.decision_key or decision_key(
            deleted.namespace, deleted.labels, deleted.annotations, deleted.uid)
        self.bound.discard(deleted.uid)
        self.requeued.pop(deleted.uid, None)
        self.claims_out.pop(deleted.uid, None)  # its decider releases the claim: no more to wait for
        self._forget_key(deleted.uid)
        outputs: list[Output] = []
        tracked = self.pods.pop(deleted.uid, None)
        if tracked is not None:
            self.queue.remove(deleted.uid)
            if tracked.state in (CLAIMED, WAITING):
                fw = self.frameworks[tracked.profile]
                fw.waiting.pop(deleted.uid, None)
                fw.unreserve(tracked.info, tracked.row)
        nomination = self.state.nominator.clear(deleted.uid)
        if nomination is not None:
            outputs.append(Output(topics.NODE_INBOX, nomination.node, _cleared(nomination.uid, nomination.node)))
        outputs.append(Output(topics.HOLDS, key, PodDeleted(
            uid=deleted.uid, name=deleted.name, namespace=deleted.namespace, labels=deleted.labels,
            annotations=deleted.annotations, decision_key=key,
        )))
        return outputs

    def _forget_key(self, uid: str) -> None:
        """A deleted pod leaves the decision keys, and a gang whose every pod was deleted
        leaves the arrival order (nothing of a deleted pod stays in the replica's maps)."""
        key = self.decision_keys.pop(uid, None)
        if key is None or key == uid:
            return
        left = self._gang_members.get(key, 1) - 1
        if left > 0:
            self._gang_members[key] = left
        else:
            self._gang_members.pop(key, None)
            self._group_arrival.pop(key, None)

    def requeue(self, requeue: Requeue, *, partition: int | None = None) -> None:
        """Retry a claimed pod with the decider's attempt number (always the latest it knows).
        A Requeue of a pod not tracked is kept for when the pod is read, while its partition
        (`partition` of `requeue`, the pod's too) is still being read up to where it stood
        (`hold`); after that the pod is gone or not this replica's, and it is dropped."""
        out = self.claims_out.get(requeue.uid)
        if out is not None and HoldId.parse(out).attempt < requeue.attempt:
            del self.claims_out[requeue.uid]  # decided: released or rejected
        tracked = self.pods.get(requeue.uid)
        if tracked is None:
            if requeue.uid not in self.bound and (partition is None or partition in self.held):
                self.requeued[requeue.uid] = max(self.requeued.get(requeue.uid, 0), requeue.attempt)
            return
        if requeue.attempt <= tracked.info.attempt:
            return  # a replayed requeue
        if tracked.state not in (CLAIMED, WAITING):
            tracked.info.attempt = requeue.attempt  # e.g. re-read after a restart: adopt the count
            return
        fw = self.frameworks[tracked.profile]
        # What it reserved, given back under its current attempt's hold id before the attempt
        # changes (else that assumption would never end); one waiting in Permit leaves it.
        if tracked.state != WAITING or fw.reject(requeue.uid, "requeued while waiting in Permit") is None:
            fw.unreserve(tracked.info, tracked.row)
        tracked.info.attempt = requeue.attempt
        tracked.state = QUEUED
        tracked.failures += 1
        self.queue.add(tracked.info, failures=tracked.failures)

    def unclaim(self, claims: Iterable[Claim]) -> None:
        """The broker did not acknowledge these claims: none of them reaches an owner, so none
        will ever be decided. A pod still waiting for that very claim goes back to the queue as
        on a requeue (its reservation undone, backing off), keeping its attempt, which its
        decider never saw; a pod no longer tracked here (revoked, deleted) leaves no
        assumption behind. A claim that did reach its owner after all (an ack lost, not the
        record) is harmless: the decider binds once and releases the other hold."""
        for claim in claims:
            hid = claim.hold_id
            if self.claims_out.get(claim.uid) == hid:
                del self.claims_out[claim.uid]
            tracked = self.pods.get(claim.uid)
            if tracked is None:
                if claim.uid not in self.bound:
                    self.state.forget(hid)
                    self.state.forget_quota(hid)
                continue
            if (tracked.state != CLAIMED or tracked.info.attempt != claim.attempt
                    or self.state.names[tracked.row] != claim.node):
                continue  # already requeued, re-placed or bound since: that claim is not the pod's now
            self.frameworks[tracked.profile].unreserve(tracked.info, tracked.row)
            tracked.state = QUEUED
            tracked.failures += 1
            self.queue.add(tracked.info, failures=tracked.failures)

    def revoke(self, partitions: Iterable[int]) -> int:
        """Stop placing the pods read on `partitions` (no longer this worker's): they leave the
        queue and the pod map at once. A pod waiting in Permit gives back what it reserved (no
        claim is out); a claim already out stays assumed in the state until the owner reports
        its hold (any status ends an assumption: `ClusterState.apply`). Returns how many pods
        left."""
        gone = set(partitions)
        for partition in gone:
            self.held.pop(partition, None)
        leaving = [uid for uid, t in self.pods.items() if t.partition is not None and t.partition in gone]
        for uid in leaving:
            tracked = self.pods.pop(uid)
            self.queue.remove(uid)
            if tracked.state == WAITING:
                fw = self.frameworks[tracked.profile]
                if fw.reject(uid, "partition revoked") is None:
                    fw.unreserve(tracked.info, tracked.row)
        return len(leaving)

    def apply_state_changes(self, changes: Iterable[NodeStateChange], *, current: bool = False) -> None:
        """Update the state; bound pods leave the queue; cluster events move waiting pods.
        `current`: the nodes as they are now (a replica's start), not reports in log order:
        a terminated hold was bound, tracked here or not (no deletion read before it to undo)."""
        event = ClusterEvent.NONE
        now: float | None = None
        for change in changes:
            event |= self.state.apply(change)
            for bound in change.committed:
                if bound.sandbox:
                    now = self.clock() if now is None else now
                    self.lifetimes.start(bound.uid, now, known=not current)
            for hid, status in change.holds.items():
                uid = HoldId.parse(hid).uid
                if status == HoldStatus.TERMINATED:
                    now = self.clock() if now is None else now
                    self.lifetimes.end(uid, now)
                if status != HoldStatus.HELD and self.claims_out.get(uid) == hid:
                    del self.claims_out[uid]  # decided (or refused by its owner)
                if status == HoldStatus.COMMITTED or (status == HoldStatus.TERMINATED and (current or uid in self.pods)):
                    # Bound, and decisions are final: whatever is still queued for the pod (a
                    # replay of `pods` after a restart, a second claim) is moot. Terminated
                    # too: only a committed hold is, even one terminated at once on its commit
                    # (its node gone or changed), whose report never says committed; but only
                    # for a pod tracked here: the termination of a pod already deleted here
                    # (its deletion read before its owner's report) must not bring it back.
                    self.bound.add(uid)
                    self.requeued.pop(uid, None)
                    if self.pods.pop(uid, None) is not None:
                        self.queue.remove(uid)
                    self.state.nominator.clear(uid)  # its decider clears it at the owner
        if event:
            self.advisor.new_batch()  # hints computed before the change may no longer hold
        self.queue.on_event(event)

    # -- scheduling ---------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        return len(self.queue)

    def next_wakeup(self) -> float | None:
        times = [t for t in (self.queue.next_wakeup(),) if t is not None]
        times += [w.deadline for fw in self.frameworks.values() for w in fw.waiting.values()]
        return min(times) if times else None

    def schedule(self, limit: int = 512) -> list[Output]:
        """Place up to `limit` ready pods; returns Claims, preemption records and feedback."""
        outputs: list[Output] = []
        self.advisor.new_batch()
        for fw in self.frameworks.values():
            for placement in fw.expire_waiting():
                outputs += self._handle(placement)
        batch = self.queue.pop(limit)
        i = 0
        while i < len(batch):
            profile = batch[i].profile
            j = i + 1
            while j < len(batch) and batch[j].profile == profile:
                j += 1
            for placement in self.frameworks[profile].schedule(batch[i:j], batching=self.batching,
                                                               gather=self.gather):
                outputs += self._handle(placement)
            i = j
        return outputs

    def allow(self, uid: str) -> list[Output]:
        """Permit: let a waiting pod bind."""
        tracked = self.pods.get(uid)
        placement = self.frameworks[tracked.profile].allow(uid) if tracked is not None else None
        return self._handle(placement) if placement is not None else []

    def reject(self, uid: str, reason: str = "rejected while waiting") -> list[Output]:
        """Permit: send a waiting pod back to the queue."""
        tracked = self.pods.get(uid)
        placement = self.frameworks[tracked.profile].reject(uid, reason) if tracked is not None else None
        return self._handle(placement) if placement is not None else []

    def _handle(self, placement: Placement) -> list[Output]:
        info = placement.pod
        tracked = self.pods.get(info.uid)
        if tracked is None:
            return []
        tracked.profile = info.profile
        if placement.placed:
            tracked.state, tracked.row = CLAIMED, placement.row
            self.claims_out[info.uid] = hold_id(info.uid, info.attempt, placement.node)
            self.attempts[info.profile, "scheduled"] += 1
            if placement.batched:
                self.batched[info.profile] += 1
            return placement.outputs
        if placement.status.code == Code.WAIT:
            tracked.state, tracked.row = WAITING, placement.row
            return []
        tracked.failures += 1
        tracked.state = QUEUED
        diagnosis = placement.diagnosis
        self.attempts[info.profile, "error" if diagnosis is None else "unschedulable"] += 1
        if diagnosis is None:  # Reserve or Permit said no: back off and retry
            self.queue.add(info, failures=tracked.failures)
            return [self._feedback(info.pod, info.attempt, placement.status.message(), {}, final=False)]
        if diagnosis.status is not None and diagnosis.status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
            tracked.state = FAILED  # a PreFilter found the pod itself wrong: only a change helps
            return [self._feedback(info.pod, info.attempt, diagnosis.message(), {}, final=True,
                                   hint=self._hint(info, {}, unresolvable=True))]
        events = ClusterEvent.NONE
        fw = self.frameworks[info.profile]
        for plugin in fw.profile.filter:
            if plugin.NAME in diagnosis.rejected_by:
                events |= getattr(plugin, "EVENTS", ClusterEvent.ANY)
        self.queue.park(info, events or ClusterEvent.ANY, tracked.failures)
        outputs = [self._feedback(info.pod, info.attempt, diagnosis.message(), diagnosis.reasons, final=False,
                                  hint=self._hint(info, diagnosis.reasons))]
        if placement.preemption is not None:
            outputs += self._preempt(placement)
        return outputs

    def _preempt(self, placement: Placement) -> list[Output]:
        assert placement.preemption is not None
        nomination, victims = placement.preemption.nomination, placement.preemption.victims
        outputs: list[Output] = []
        replaced = self.state.nominator.nominate(nomination)
        if replaced is not None:
            outputs.append(Output(topics.NODE_INBOX, replaced.node, _cleared(replaced.uid, replaced.node)))
        outputs.append(Output(topics.NODE_INBOX, nomination.node, nomination))
        for victim in victims:
            outputs.append(Output(topics.EVICTIONS, victim.pod.uid, EvictionCommand(
                uid=victim.pod.uid, namespace=victim.pod.namespace, name=victim.pod.name, node=nomination.node,
                reason=f"preempted by {placement.pod.pod.namespace}/{placement.pod.pod.name}",
                preemptor_uid=placement.pod.uid,
            )))
        return outputs

    # -- the library's view -------------------------------------------------------------------

    def explain(self, pod: Pod) -> Evaluation:
        """Filter and score `pod` over every node without placing it (scores, rejections)."""
        fw = self.frameworks.get(pod.scheduler_name)
        if fw is None:
            raise ValueError(f"schedulerName={pod.scheduler_name!r}: no such profile (profiles: {', '.join(self.frameworks)})")
        return fw.evaluate(self.pod_info(self.runtimes.admit(pod)), partial=False)

    def timings(self) -> dict[tuple[str, str], int]:
        """Nanoseconds per (plugin, extension point), over every profile."""
        out: dict[tuple[str, str], int] = {}
        for fw in self.frameworks.values():
            for key, ns in fw.timings.items():
                out[key] = out.get(key, 0) + ns
        return out

    @staticmethod
    def _feedback(pod: Pod, attempt: int, message: str, reasons: dict[str, int], *, final: bool,
                  hint: Hint | None = None) -> Output:
        if hint is None:
            return Output(topics.FEEDBACK, pod.uid, SchedulingFeedback(
                uid=pod.uid, namespace=pod.namespace, name=pod.name, attempt=attempt,
                message=message, reasons=reasons, final=final,
            ))
        return Output(topics.FEEDBACK, pod.uid, SchedulingFeedback(
            uid=pod.uid, namespace=pod.namespace, name=pod.name, attempt=attempt, message=message, reasons=reasons,
            final=final, reason=hint.reason, next_step=hint.next_step, retry_after_s=hint.retry_after_s,
            alternatives=hint.alternatives,
        ))

    # -- the sandbox feedback's probe (agents.sandbox.feedback.Probe) -------------------------

    def _hint(self, info: PodInfo, reasons: dict[str, int], *, unresolvable: bool = False) -> Hint | None:
        """The hint for a failed sandbox (None for other pods), once per equivalence class per
        batch: pods with equal signatures, runtime, QoS class, pool and containers share it."""
        if not is_sandbox(info.pod):
            return None
        return self._failed_hint(self.frameworks[info.profile], info, info.derived.get(SENT, info.pod), reasons,
                                 unresolvable)

    def _failed_hint(self, fw: Framework, info: PodInfo, sent: Pod, reasons: dict[str, int],
                     unresolvable: bool) -> Hint:
        signature = fw.signature(info)
        key = (info.profile, unresolvable, shape(sent), _shape_key(sent) if signature is None else signature)
        return self.advisor.hint(key, info.pod, sent, reasons=reasons, unresolvable=unresolvable)

    def _refused_hint(self, pod: Pod, error: FieldError) -> Hint:
        return self.advisor.hint(("refused", pod.scheduler_name, str(error), _shape_key(pod)), pod, pod, refusal=error)

    def advise(self, pod: Pod) -> Hint | None:
        """The hint `pod` (as it would be sent: the warm pools ask with a pod made from their
        template) would get if it were scheduled now, None if a node takes it now; for any pod,
        sandbox or not. Changes nothing but the advisor's cache."""
        try:
            admitted = self.runtimes.admit(pod)
        except AdmissionError as exc:
            return self._refused_hint(pod, exc)
        probe = self._probe(admitted)
        if probe is None:
            return self._refused_hint(pod, FieldError("spec.schedulerName", pod.scheduler_name,
                                                      "no such profile, or a request it cannot take"))
        fw, info = probe
        ev = fw.evaluate(info, partial=False)
        if ev.best() >= 0:
            return None
        diagnosis = ev.diagnosis
        return self._failed_hint(fw, info, pod, diagnosis.reasons if diagnosis is not None else {},
                                 diagnosis is not None and diagnosis.status is not None)

    def _probe(self, pod: Pod) -> tuple[Framework, PodInfo] | None:
        fw = self.frameworks.get(pod.scheduler_name)
        if fw is None:
            return None
        try:  # the key of the pod of that uid, if known: nothing is recorded for a pod only probed
            return fw, self._info(pod, self.decision_keys.get(pod.uid) or pod.uid)
        except ValueError:
            return None

    def place(self, pod: Pod) -> str:
        """The node `pod` (admitted) would be placed on now by its profile, "" for none; the
        state, the queue and the decision keys stay as they were."""
        probe = self._probe(pod)
        if probe is None:
            return ""
        row = probe[0].evaluate(probe[1], partial=False).best()
        return self.state.names[row] if row >= 0 else ""

    def capacity(self, pod: Pod) -> Capacity | None:
        """What the advisor needs to shrink the pod's request or estimate a wait: the nodes
        that pass its profile's filters that do not depend on allocation, their free capacity,
        and the sandboxes bound there."""
        probe = self._probe(pod)
        if probe is None:
            return None
        fw, info = probe
        ev = fw.evaluate(info, partial=False)
        if ev.diagnosis is not None and ev.diagnosis.status is not None:
            return None
        state = self.state
        candidates = state.schedulable_rows().copy()
        for plugin in fw.profile.filter:
            mask = ev.masks.get(plugin.NAME)
            if mask is not None and not plugin.DYNAMIC:
                candidates &= mask
        rows = np.flatnonzero(candidates)
        where = np.full(state.size, -1, dtype=np.intp)
        where[rows] = np.arange(len(rows))
        bound = state.bound_arrays()
        running = bound.sandboxes & (where[bound.rows] >= 0) if len(bound.pods) else np.zeros(0, dtype=bool)
        picked = np.flatnonzero(running)
        return Capacity(nodes=[state.names[r] for r in rows.tolist()], free=state.free[rows].copy(),
                        request=info.request, overhead=self.space.known(pod.overhead), columns=self.space.index,
                        running_rows=where[bound.rows[picked]], running_vectors=bound.vectors[picked],
                        running_uids=tuple(bound.pods[i].pod.uid for i in picked.tolist()))

    def pool_size(self, pool: str) -> int:
        """Bound pods of warm pool `pool`."""
        bound = self.state.bound_arrays()
        return int((bound.pools == pool).sum()) if len(bound.pods) else 0


def _shape_key(pod: Pod) -> str:
    """A pod's whole shape but its identity: what two pods of one template share."""
    return repr(dataclasses.replace(pod, uid="", name="", resource_version="", creation_timestamp=0.0,
                                    owner_references=()))


def _cleared(uid: str, node: str) -> NominationCleared:
    return NominationCleared(uid=uid, node=node)


def schedule_all(core: SchedulerCore, pods: Sequence[Pod], batch: int = 1000) -> list[Output]:
    """Library helper: enqueue `pods` and schedule until the queue has nothing ready."""
    outputs: list[Output] = []
    for pod in pods:
        outputs += core.add(pod)
    while True:
        produced = core.schedule(batch)
        if not produced:
            return outputs
        outputs += produced
