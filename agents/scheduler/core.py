"""The scheduler's queue and placement core (the walking skeleton's first scheduler).

Data flow: pods arrive (`add`), wait in an active queue ordered by priority then arrival, and
are placed in micro-batches (`schedule`): a numpy fit mask over all nodes (resource fit) and a
least-allocated score (kube-scheduler's LeastAllocated over cpu and memory), ties broken by
the lowest node index. Each placement becomes a Claim to the node's owner and an assumption in
the replica until the owner's state change or a Requeue arrives. Requeued pods wait in a
backoff queue (exponential, from the injected clock); pods that fit nowhere are parked and
move back on a cluster event that could make them fit. Deletions are forwarded to the deciders.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from agents.ports import Clock, Output
from agents.scheduler.replica import ClusterReplica
from agents.state.resources import ResourceSpace, UnknownResource, Vector
from schemas import topics
from schemas.records import (
    DEFAULT_SCHEDULER,
    GANG_MIN_AVAILABLE_ANNOTATION,
    Claim,
    NodeStateChange,
    Pod,
    PodDeleted,
    Requeue,
    ResourceList,
    SchedulingFeedback,
    decision_key,
    hold_id,
)

WAITING, CLAIMED, PARKED, FAILED = "waiting", "claimed", "parked", "failed"
SCHEDULER_NAMES = frozenset({DEFAULT_SCHEDULER, "koordstream"})


@dataclass
class QueuedPod:
    pod: Pod
    decision_key: str
    request: Vector | None
    seq: int
    attempt: int = 0
    state: str = WAITING
    claimed_node: str = ""


class SchedulerCore:
    def __init__(
        self,
        space: ResourceSpace,
        replica: ClusterReplica,
        clock: Clock,
        *,
        scheduler_names: frozenset[str] = SCHEDULER_NAMES,
        backoff_initial_s: float = 0.01,
        backoff_max_s: float = 1.0,
        park_flush_s: float = 30.0,
    ) -> None:
        self.space = space
        self.replica = replica
        self.clock = clock
        self.scheduler_names = scheduler_names
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.park_flush_s = park_flush_s
        self.pods: dict[str, QueuedPod] = {}
        self.decision_keys: dict[str, str] = {}  # fixed by a pod's first version
        self.bound: set[str] = set()  # uids whose commit the replica has seen
        self._active: list[tuple[int, int, str]] = []
        self._backoff: list[tuple[float, int, str]] = []
        self._parked: set[str] = set()
        self._last_flush = clock()
        self._seq = 0
        cpu, mem = space.index.get("cpu"), space.index.get("memory")
        self._score_columns = np.asarray([c for c in (cpu, mem) if c is not None], dtype=np.intp)

    # -- inputs -------------------------------------------------------------------------------

    def add(self, pod: Pod) -> list[Output]:
        """A new or updated pod. Returns feedback for pods that can never be placed."""
        if pod.scheduler_name not in self.scheduler_names or pod.node_name or pod.uid in self.bound:
            return []
        key = self.decision_keys.setdefault(pod.uid, decision_key(pod.namespace, pod.labels, pod.annotations, pod.uid))
        queued = self.pods.get(pod.uid)
        if queued is not None:
            queued.pod = pod  # an update: keep its place, attempt and decision key
            return []
        self._seq += 1
        try:
            request: Vector | None = self.space.pod_request(pod.requests)
        except UnknownResource as exc:
            request = None
            self.pods[pod.uid] = QueuedPod(pod, key, None, self._seq, state=FAILED)
            return [self._feedback(pod, 0, f"unknown resource {exc.name!r} in requests", {}, final=True)]
        self.pods[pod.uid] = QueuedPod(pod, key, request, self._seq)
        heapq.heappush(self._active, (-pod.priority, self._seq, pod.uid))
        return []

    def delete(self, deleted: PodDeleted) -> list[Output]:
        """Forget the pod and forward the deletion to its decider (by the first version's key)."""
        key = self.decision_keys.get(deleted.uid) or deleted.decision_key or decision_key(
            deleted.namespace, deleted.labels, deleted.annotations, deleted.uid)
        self.bound.discard(deleted.uid)
        queued = self.pods.pop(deleted.uid, None)
        if queued is not None and queued.state == CLAIMED:
            self.replica.forget(hold_id(deleted.uid, queued.attempt, queued.claimed_node))
        self._parked.discard(deleted.uid)
        return [Output(topics.HOLDS, key, PodDeleted(
            uid=deleted.uid, name=deleted.name, namespace=deleted.namespace, labels=deleted.labels,
            annotations=deleted.annotations, decision_key=key,
        ))]

    def requeue(self, requeue: Requeue) -> None:
        """Retry a claimed pod with the decider's attempt number (always the latest it knows)."""
        queued = self.pods.get(requeue.uid)
        if queued is None or requeue.attempt <= queued.attempt:
            return  # unknown, already bound, or a replayed requeue
        if queued.state != CLAIMED:
            queued.attempt = requeue.attempt  # e.g. re-read after a restart: adopt the count
            return
        self.replica.forget(hold_id(requeue.uid, queued.attempt, queued.claimed_node))
        queued.attempt = requeue.attempt
        queued.state = WAITING
        delay = min(self.backoff_max_s, self.backoff_initial_s * (2 ** min(queued.attempt, 20)))
        heapq.heappush(self._backoff, (self.clock() + delay, queued.seq, requeue.uid))

    def apply_state_changes(self, changes: Iterable[NodeStateChange]) -> None:
        """Update the replica; bound pods leave the queue; freed capacity unparks pods."""
        event = False
        for change in changes:
            event |= self.replica.apply(change)
            for hid, status in change.holds.items():
                if status == "committed":
                    # Bound, and decisions are final: whatever this scheduler still has queued
                    # for the pod (a replay of `pods` after a restart, a second claim) is moot.
                    uid = hid.split("/", 1)[0]
                    self.bound.add(uid)
                    queued = self.pods.pop(uid, None)
                    if queued is not None and queued.state == CLAIMED:
                        self.replica.forget(hold_id(uid, queued.attempt, queued.claimed_node))
        if event:
            self._unpark()

    # -- the queue ----------------------------------------------------------------------------

    def _unpark(self) -> None:
        for uid in self._parked:
            queued = self.pods.get(uid)
            if queued is not None and queued.state == PARKED:
                queued.state = WAITING
                heapq.heappush(self._active, (-queued.pod.priority, queued.seq, uid))
        self._parked.clear()
        self._last_flush = self.clock()

    def _promote_backoff(self, now: float) -> None:
        while self._backoff and self._backoff[0][0] <= now:
            _, seq, uid = heapq.heappop(self._backoff)
            queued = self.pods.get(uid)
            if queued is not None and queued.state == WAITING:
                heapq.heappush(self._active, (-queued.pod.priority, seq, uid))

    def next_wakeup(self) -> float | None:
        """When backoff or the parked-pod flush next needs the loop, if nothing arrives first."""
        times = [self._backoff[0][0]] if self._backoff else []
        if self._parked:
            times.append(self._last_flush + self.park_flush_s)
        return min(times) if times else None

    @property
    def pending(self) -> int:
        return len(self._active)

    def _pop_ready(self, limit: int) -> list[QueuedPod]:
        now = self.clock()
        self._promote_backoff(now)
        if self._parked and now - self._last_flush >= self.park_flush_s:
            self._unpark()
        batch: list[QueuedPod] = []
        while self._active and len(batch) < limit:
            _, _, uid = heapq.heappop(self._active)
            queued = self.pods.get(uid)
            if queued is not None and queued.state == WAITING:
                batch.append(queued)
        return batch

    # -- placement ----------------------------------------------------------------------------

    def schedule(self, limit: int = 512) -> list[Output]:
        """Place up to `limit` ready pods; returns Claims and SchedulingFeedback."""
        batch = self._pop_ready(limit)
        if not batch:
            return []
        replica = self.replica
        n = replica.size
        free = replica.free()
        schedulable = replica.schedulable[:n]
        cols = self._score_columns
        # LeastAllocated divides by allocatable; nodes without cpu/memory score 0 on it.
        alloc = replica.allocatable[:n][:, cols].astype(np.float64)
        inverse = np.divide(1.0, alloc, out=np.zeros_like(alloc), where=alloc > 0) / max(len(cols), 1)
        nominated = replica.nominated()
        outputs: list[Output] = []
        for queued in batch:
            request = queued.request
            assert request is not None
            columns = np.flatnonzero(request)
            # Fit counts others' nominations of equal or higher priority; the score does not.
            room = nominated.free_for(free, queued.pod.priority, queued.pod.uid)
            fits = schedulable & (room[:, columns] >= request[columns]).all(axis=1)
            if not fits.any():
                outputs.append(self._unschedulable(queued, room, columns, schedulable))
                continue
            row = self._best(fits, free, inverse, request)
            node = replica.names[row]
            pod = queued.pod
            free[row] -= request
            replica.assume(hold_id(pod.uid, queued.attempt, node), row, request)
            queued.state, queued.claimed_node = CLAIMED, node
            gang_min = pod.annotations.get(GANG_MIN_AVAILABLE_ANNOTATION, "0")
            outputs.append(Output(topics.NODE_INBOX, node, Claim(
                uid=pod.uid, attempt=queued.attempt, node=node, decision_key=queued.decision_key,
                requests=ResourceList(self.space.to_map(request)), priority=pod.priority, namespace=pod.namespace,
                name=pod.name, creation_timestamp=pod.creation_timestamp,
                gang_min=int(gang_min) if gang_min.isdigit() else 0,
            )))
        return outputs

    def _best(self, fits: np.ndarray, free: np.ndarray, inverse: np.ndarray, request: Vector) -> int:
        """LeastAllocated: score = floor(100 x mean over cpu, memory of (free - request) / allocatable).

        Scores are integers as in kube-scheduler, so equal scores tie and the lowest node
        index wins (argmax returns the first maximum).
        """
        cols = self._score_columns
        left = (free[:, cols] - request[cols]) * inverse
        scores = np.floor(left.sum(axis=1) * 100.0)
        scores[~fits] = -np.inf
        return int(np.argmax(scores))

    def _unschedulable(self, queued: QueuedPod, free: np.ndarray, columns: np.ndarray, schedulable: np.ndarray) -> Output:
        reasons: dict[str, int] = {}
        blocked = int((~schedulable).sum())
        if blocked:
            reasons["node is unschedulable or deleted"] = blocked
        request = queued.request
        assert request is not None
        for col in columns:
            short = int((schedulable & (free[:, col] < request[col])).sum())
            if short:
                reasons[f"Insufficient {self.space.names[col]}"] = short
        queued.state = PARKED
        self._parked.add(queued.pod.uid)
        n = self.replica.size
        return self._feedback(queued.pod, queued.attempt, f"0/{n} nodes are available", reasons, final=False)

    @staticmethod
    def _feedback(pod: Pod, attempt: int, message: str, reasons: dict[str, int], *, final: bool) -> Output:
        return Output(topics.FEEDBACK, pod.uid, SchedulingFeedback(
            uid=pod.uid, namespace=pod.namespace, name=pod.name, attempt=attempt,
            message=message, reasons=reasons, final=final,
        ))
