"""The protocol's safety model: owners, deciders and a scheduler replica under crashes and replays.

A stronger sibling of `test_protocol_safety`: the real cores (`NodeOwner`, `Decider`, the
scheduler's `ClusterState` as the replica) on logs that stand in for Kafka partitions, driven
by hypothesis through gangs (one member beyond min-available, deletions while waiting, gang
timeouts), two gangs competing (wound-wait, with nominations), GPUs claimed device by device
(and the same hold claimed again with other devices), node deletion and re-creation (also
smaller, with one GPU fewer; a deletion read again after the node came back), preemption nominations (moved, cleared on deletion, carried by
the claims, delivered again after their clearing, lapsing on the owners' timers, old lapses firing
after a nomination was made again), two reservations (one allocate-once; claimed, consumed by two pods, expiring
on their timers, deleted),
two scheduler replicas claiming the same pods, schedulers that lost count of a pod's attempts
(a restart) claiming an older attempt, deletions routed by a scheduler replica that restarted
and re-read the pods (bound ones as first read, as a later version without the gang
annotation, or not at all: its committed offset passed them; a deletion record carries no
gang annotation), records stamped a day ahead by a producer's clock, gangs losing round after
round, two replicas sharing an elastic quota (max 1200m of the 2600m asked; the replicas claim
with no pre-filter, so the quota's ledger at the deciders alone keeps the max), and crashes
at every point between table write, outputs and offset commit:

- an actor (an owner or a decider) takes one record at a time from its log (the records it
  decides while its outputs wait are one batch, as the loop's: `Actor.batch`); `persist` writes
  its table (the changelog may run ahead of the committed offset), `commit` commits its offset
  once its outputs are acknowledged (with the table), `crash` restores the last persisted
  table, rewinds to the committed offset and loses what was not acknowledged; `abort` does
  the same but keeps the table in memory (a transaction aborted, or a producer restarted,
  while the partition stays ours);
- outputs reach the broker when flushed, in order, possibly in part, each destination's records
  of a flush through the codec as one message of `Batch`es (`through_the_wire`), the table written first
  (the loop writes a run's table before its outputs, or with them in a transaction); records
  may be delivered twice; timers fire as records on the deciders' and owners' own logs,
  re-armed from their tables after a crash.

Invariants, at every step and at quiescence (everything drained, every timer fired):
no pod with two distinct Bindings; no node over-committed in the owners' accounting or as the
independent checker recomputes it from Bindings and terminations, GPU by GPU included; no gang
partially bound, and a member of an accepted gang never given up for the gang's waiting time;
every pod the ledger holds bound has its Binding; no hold left held; no Commit of a hold that
was not held; no Commit that leaves its node over-committed in what the pod asks for (its node
may have shrunk since the hold); no committed pod left on a deleted node; no two gangs asked
to yield to each other; no nomination left for a pod that is bound or deleted; every claim
answered (its pod bound or deleted, or a Requeue past its attempt: no scheduler waits for
ever); no claim refused as stale unless it is older than half the retention less the admitted
clock skew; no gang ledger keeping more lost rounds than its gang has members; the last
ReservationEvent of the reservation says its phase at its owner; no quota's committed usage
(its pods from their Binding until their node frees them) exceeds its max at any time, and at
rest its ledger grants exactly the quota's committed pods; and every
replica's view of every node equals the owner's (used capacity, bound pods, quota usage,
available reservations, no assumption left).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agents.ports import Output, Problem
from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.state import devices
from agents.state import reservations as rsv
from agents.state.ledger import (
    BOUND,
    DELETED,
    REASON_STALE,
    TERMINATED,
    Decider,
    Decision,
    LedgerState,
)
from agents.state.owner import (
    BY_COMMIT_ON_DELETED_NODE,
    COMMITTED,
    HELD,
    NodeOwner,
    NodeState,
    OwnerResult,
)
from agents.state.owner import REASON_STALE as CLAIM_STALE
from agents.state.quotas import QuotaLedger, QuotaLedgerState, QuotaSpec, QuotaTree, is_quota_key
from agents.state.resources import ResourceSpace
from perf.checker import (
    DevicePlacement,
    Placement,
    check,
    device_amounts,
    devices_overcommitted,
    partial_gangs,
)
from schemas import topics
from schemas.codec import decode_message, encode_batch
from schemas.records import (
    GANG_MIN_AVAILABLE_ANNOTATION,
    GANG_NAME_ANNOTATION,
    Binding,
    Claim,
    GangTimeout,
    GpuDevice,
    Held,
    Node,
    NodeDeleted,
    NodeStateChange,
    Nomination,
    NominationCleared,
    NominationLapsed,
    Pod,
    PodDeleted,
    PodTerminated,
    Record,
    Rejected,
    Release,
    Requeue,
    Reservation,
    ReservationEvent,
    ReservationExpired,
    ReservationOwner,
    ResourceList,
    Yield,
)
from tests.logs import Actor

NODES = ["n0", "n1", "n2"]
RETENTION_S = 600.0
SKEW_S = RETENTION_S / 10  # `worker.max_clock_skew_s` (its default)
DAY = 86400.0
CPU_PER_NODE = 1000
QUOTA = "q"  # every pod counts against one elastic quota (reservations do not)
QUOTA_MAX_CPU = 1200  # of the 2600m the pods ask for; claimed by both replicas with no pre-filter
QUOTAS = QuotaTree([QuotaSpec(QUOTA, max={"cpu": QUOTA_MAX_CPU})])
QUOTA_KEY = QUOTAS.key(QUOTA)


@dataclass(frozen=True)
class PodSpec:
    uid: str
    key: str  # decision key: the gang, or the uid
    cpu: int
    gpu: int = 0  # GPU share (core and memory-ratio) on one GPU
    gang_min: int = 0
    priority: int = 0
    created: float = 0.0
    strict: bool = True  # the gang's mode


# Gangs g (three members, min-available two: g2 is beyond; Strict) and h (NonStrict) compete at
# equal priority; their members' creation times interleave (g0 < h0 < g1), so ranking by a
# member's own creation time would let each gang outrank the other.
PODS = {p.uid: p for p in [
    PodSpec("a", "a", 500, gpu=60),
    PodSpec("b", "b", 400, gpu=50),
    PodSpec("g0", "g", 300, gpu=40, gang_min=2, created=10.0),
    PodSpec("g1", "g", 300, gang_min=2, created=12.0),
    PodSpec("g2", "g", 300, gang_min=2, created=13.0),
    PodSpec("h0", "h", 400, gang_min=2, created=11.0, strict=False),
    PodSpec("h1", "h", 400, gang_min=2, created=11.0, strict=False),
    PodSpec("r", "r", 600),  # reservations, consumed by a and b ("claim-r")
    PodSpec("s", "s", 500),
]}
UIDS = list(PODS)
KEYS = sorted({p.key for p in PODS.values()})
GANGS = {key: (PODS[members[0]].gang_min, members) for key in KEYS
         for members in ([u for u, p in PODS.items() if p.key == key],) if PODS[members[0]].gang_min}
RESERVATIONS = {uid: Reservation(uid=uid, name=uid, owners=(ReservationOwner(match_labels={"app": "x"}),),
                                 requests=ResourceList(cpu=PODS[uid].cpu), allocate_once=once, ttl_s=60.0)
                for uid, once in (("r", False), ("s", True))}
CONSUMERS = ("a", "b")


def through_the_wire(outputs: list[Output]) -> list[Output]:
    """The outputs as their readers get them: each destination's records of a flush encoded as
    one message, runs of one kind as `Batch`es (so a crash part-way through a batch's records
    replays the rest, and a re-sent batch has other members than the first), and decoded."""
    by_destination: dict[tuple[str, str], list[int]] = {}
    for index, out in enumerate(outputs):
        by_destination.setdefault((out.topic, out.key), []).append(index)
    read = list(outputs)
    for indexes in by_destination.values():
        decoded = decode_message(encode_batch([outputs[i].record for i in indexes]))
        for i, record in zip(indexes, decoded, strict=True):
            assert isinstance(record, Record), record
            read[i] = Output(outputs[i].topic, outputs[i].key, record, outputs[i].origin)
    return read


def node_record(name: str, small: bool = False, incarnation: int = 0) -> Node:
    """The node; `small`: added again with less cpu and one GPU fewer; `incarnation`: how many
    times it was deleted and added again (another object: another uid)."""
    alloc = ResourceList(cpu=CPU_PER_NODE * 6 // 10 if small else CPU_PER_NODE, memory=64 * 2**30, pods=110)
    return Node(name=name, capacity=alloc, allocatable=alloc, gpus=(GpuDevice(0),) if small else (GpuDevice(0), GpuDevice(1)),
                uid=f"{name}#{incarnation}")


def pod_record(uid: str, *, relabelled: bool = False) -> Pod:
    """The pod as `pods` carries it (its gang as Koordinator's annotations, in namespace
    "default": the scheduler's key is "default/<gang>", the model's "<gang>"); `relabelled`: a
    later version of a bound pod whose gang annotation is gone."""
    p = PODS[uid]
    gang = {GANG_NAME_ANNOTATION: p.key, GANG_MIN_AVAILABLE_ANNOTATION: str(p.gang_min)} if p.gang_min else {}
    return Pod(uid=uid, name=uid, namespace="default", annotations={} if relabelled else gang,
               requests=ResourceList(cpu=p.cpu), node_name="n0" if relabelled else "")


class World:
    def __init__(self) -> None:
        self.owners = {n: Actor(state=NodeState(n)) for n in NODES}
        self.deciders = {k: Actor(state=LedgerState(k)) for k in KEYS}
        self.quota = Actor(state=QuotaLedgerState(QUOTA_KEY))  # the quota's ledger, beside the deciders
        for n, owner in self.owners.items():
            owner.log.append(node_record(n))
        self.space = ResourceSpace()
        self.replicas = [ClusterState(self.space), ClusterState(self.space)]  # two scheduler replicas
        self.replica = self.replicas[0]
        self.attempt = dict.fromkeys(UIDS, 0)  # the scheduler's count: the latest Requeue it read
        self.claims: list[tuple[str, int]] = []  # (uid, attempt) of every claim sent: each needs an answer
        self.nominated: dict[str, str] = {}  # the schedulers' nominator: uid -> node (preemption)
        self.owner_timers: dict[tuple[str, str], float] = {}  # (node, reservation) -> expiry asked for
        self.lapse_timers: set[tuple[str, str, float]] = set()  # (node, uid, since): nomination lapses asked for
        self.late_nominations: set[str] = set()  # pods whose Nomination was delivered again, late
        self.reservation_events: list[ReservationEvent] = []
        self.deleted: set[str] = set()
        self.bindings: list[tuple[int, Binding]] = []
        self.frees: list[Placement] = []
        self.yields: set[tuple[str, str]] = set()  # (loser, winner)
        self.violations: list[str] = []
        self.problems: list[str] = []
        self.clock = 0
        self.now = 1000.0  # wall and log time (s): claims are stamped with it, records read at it
        self.incarnation = dict.fromkeys(NODES, 0)  # per node: its object now (deleted and added again: the next)
        self.node_gone: set[str] = set()  # nodes deleted and not added again since
        self.deleted_at: dict[str, float] = {}
        self.deleted_durably: dict[str, set[str]] = {}  # decision key -> pods whose deletion its decider persisted
        # The scheduler replica that forwards deletions to their deciders (`SchedulerCore.delete`):
        # it read every pod, and reads every report.
        self.router = SchedulerCore(self.space, ClusterState(self.space), lambda: self.now)
        for uid in UIDS:
            self.router.add(pod_record(uid))
        self.first_claimed: dict[str, float] = {}  # uid -> when a claim of it was first sent
        self.expiries: dict[tuple[str, str], float] = {}  # (node, reservation) -> the expiry first asked for
        for n in NODES:  # every node registered and reported before the run
            self.step_owner(n)
            self.flush(self.owners[n], 99)
            self.owners[n].commit()
        for d in [*self.deciders.values(), self.quota]:
            d.commit()

    # -- the broker ------------------------------------------------------------------------------

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def route(self, outputs: list[Output]) -> None:
        for out in through_the_wire(outputs):
            r = out.record
            if out.topic == topics.NODE_INBOX:
                self.owners[out.key].log.append(r)
            elif out.topic == topics.HOLDS and is_quota_key(out.key):
                assert out.key == QUOTA_KEY, out
                self.quota.log.append(r)
            elif out.topic == topics.HOLDS:
                self.deciders[out.key].log.append(r)
                if isinstance(r, Yield):
                    self.yields.add((r.decision_key, r.winner))
            elif out.topic == topics.REQUEUE:
                assert isinstance(r, Requeue)
                self.attempt[r.uid] = max(self.attempt[r.uid], r.attempt)
                self.replica_forget(r.uid, r.attempt)
                key = PODS[r.uid].key
                if key in GANGS and "waiting time" in r.reason and any(
                        b.uid in GANGS[key][1] for _, b in self.bindings):
                    self.violations.append(f"{r.uid}: given up for the waiting time of gang {key}, already accepted")
            elif out.topic == topics.BINDINGS:
                assert isinstance(r, Binding)
                self.bindings.append((self.tick(), r))
                self.nominated.pop(r.uid, None)  # bound: the scheduler's nominator forgets it
            elif out.topic == topics.STATE_CHANGES:
                assert isinstance(r, NodeStateChange)
                for replica in self.replicas:
                    replica.apply(r)
                self.router.apply_state_changes([r])
            elif out.topic == topics.RESERVATIONS:
                assert isinstance(r, ReservationEvent)
                self.reservation_events.append(r)
            elif out.topic == topics.PODS:  # an owner deletes a reservation that ended
                assert isinstance(r, PodDeleted) and r.uid in RESERVATIONS, r
                self.deleted.add(r.uid)
                self.deleted_at.setdefault(r.uid, self.now)
                # The scheduler that has it forgets it and forwards the deletion to its decider.
                self.deciders[PODS[r.uid].key].log.append(PodDeleted(uid=r.uid, name=r.name, decision_key=r.decision_key))

    def replica_forget(self, uid: str, attempt: int) -> None:
        for replica in self.replicas:
            for hid in list(replica.assumptions):
                u, a, _ = hid.split("/", 2)
                if u == uid and int(a) < attempt:
                    replica.forget(hid)
                    replica.forget_quota(hid)

    def flush(self, actor: Actor, count: int) -> None:
        sent, actor.outgoing = actor.outgoing[:count], actor.outgoing[count:]
        if sent:
            # The loop makes a run's table (its states and the partition's clock, with the offset
            # after the records it covers) durable before any of its outputs goes out (the plain
            # sink writes the changelog first; a transaction writes both at once): no output is
            # ever out while what it followed from is lost. A crash after this replays the
            # records at the saved clock, exactly as decided; without it, a replay after a wait
            # judged a record stamped a day ahead again at the later wall clock, and a claim
            # whose Held had gone out was then rejected (FUTURE_NODE_CRASH).
            actor.persist_state()
            self.note_durable(actor)
        self.route(sent)

    # -- the agents ------------------------------------------------------------------------------

    def step_owner(self, node: str) -> None:
        actor = self.owners[node]
        taken = actor.take_timed(self.now)
        if taken is None:
            return
        record, t = taken
        t = actor.judge(t, self.now + SKEW_S)  # as the loop judges it: never before what was decided
        state = actor.state
        assert isinstance(state, NodeState)
        status_before = {hid: h.status for hid, h in state.holds.items()}
        object_before, existed = (state.record or {}).get("uid", ""), state.exists
        used_before = state.used()
        result = OwnerResult()
        NodeOwner(RETENTION_S).apply(state, [record], result, [t], t)
        self.problems += [p.error for p in result.problems if "Commit" in p.error]
        now = self.tick()
        if isinstance(record, NodeDeleted) and object_before and record.uid != object_before:
            # The deletion of an object deleted before the node was added again (a record read
            # again after the owner's table ran ahead, a duplicate): it deletes nothing new.
            ended = sorted(hid for hid, h in state.holds.items()
                           if status_before.get(hid) == COMMITTED and h.status != COMMITTED)
            if ended or state.exists != existed:
                self.violations.append(f"{node}: the deletion of {record.uid} ended {ended} on {object_before}")
        for hid, h in state.holds.items():
            was = status_before.get(hid)
            if was == COMMITTED and h.status != COMMITTED:
                self.frees.append(Placement(now, h.uid, node))
            if was == HELD and h.status == COMMITTED:  # a commit: the node must not be over-committed for it
                used = state.used()
                over = sorted(n for n, a in h.requests.items()
                              if a > 0 and used.get(n, 0) > state.allocatable.get(n, 0))
                usage, gpus = state.device_usage(), state.gpus()
                over += [f"gpu {a.minor}" for a in devices.decode(h.devices)
                         if a.minor not in gpus or usage.get(f"gpu/{a.minor}/core", 0) > gpus[a.minor][0]]
                if over:
                    self.violations.append(f"{node}: {hid} committed over-committing {over}")
        if state.exists and isinstance(record, Claim):  # a claim never over-commits (a shrink may)
            for name, amount in state.used().items():
                limit = state.allocatable.get(name, 0)
                if amount > limit and amount > used_before.get(name, 0):
                    self.violations.append(f"{node} over-committed in the owner's accounting: {name} {amount} > {limit}")
        self.lapse_timers.update(result.lapses)
        for n, uid, at in result.timers:
            self.owner_timers[(n, uid)] = at
            # The ttl counts from the reservation's creation or, without one (these have none),
            # from when its owner first read its claim: never before the first claim was sent,
            # and the same expiry whenever the commit is replayed or the table restored.
            ttl = RESERVATIONS[uid].ttl_s or 0.0
            if at < self.first_claimed[uid] + ttl:
                self.violations.append(f"{n}: {uid} expires at {at}, before its ttl counted from {self.first_claimed[uid]}")
            if self.expiries.setdefault((n, uid), at) != at:
                self.violations.append(f"{n}: {uid} asked to expire at {at}, before at {self.expiries[(n, uid)]}")
        for o in result.outputs:  # the claim a Rejected answers is the one it records (the first of its hold id)
            if isinstance(o.record, Rejected) and o.record.reason == CLAIM_STALE:
                self.refused_fresh(o.record.hold_id, o.record.scheduled_at, [o.record])
        actor.outgoing += result.outputs

    def step_decider(self, key: str) -> None:
        actor = self.deciders[key]
        taken = actor.take_timed(self.now)
        if taken is None:
            return
        record, t = taken
        t = actor.judge(t, self.now + SKEW_S)  # as the loop judges it: never before what was decided
        state = actor.state
        assert isinstance(state, LedgerState)
        terminated = {u for u, e in state.pods.items() if e.status == TERMINATED}
        decision = Decision()
        Decider(RETENTION_S, QUOTAS).apply(state, [record], decision, [t], t, batch=actor.batch())
        if key in GANGS and len(state.gave_up) > len(GANGS[key][1]):
            # A batch gives up at most a round per member (a member given up waits again only
            # with the attempt its Requeue announced, which goes out after the batch), and a
            # ledger keeps the rounds of one batch: not one per round lost (issue 28, item 10).
            self.violations.append(f"{key}: the ledger keeps {len(state.gave_up)} rounds lost")
        # As `DeciderCore` does: no Binding of a pod terminated before the batch.
        after = [o for o in decision.after_commit if not (isinstance(o.record, Binding) and o.record.uid in terminated)]
        if isinstance(record, Held):
            self.refused_fresh(record.hold_id, record.scheduled_at, [
                o.record for o in decision.first
                if isinstance(o.record, Release) and o.record.reason == REASON_STALE
                and o.record.hold_id == record.hold_id])
        durable = self.deleted_durably.get(key, set())
        self.violations += [f"{o.record.uid}: bound after its deletion was decided and persisted"
                            for o in after if isinstance(o.record, Binding) and o.record.uid in durable]
        actor.outgoing += decision.first + after

    def step_quota(self) -> None:
        """The quota's ledger takes one record (an ask or a return)."""
        actor = self.quota
        if actor.take() is None:
            return
        state = actor.state
        assert isinstance(state, QuotaLedgerState)
        outputs: list[Output] = []
        problems: list[Problem] = []
        QuotaLedger(QUOTAS).apply(state, [actor.log[actor.pos - 1]], outputs, problems)
        self.problems += [p.error for p in problems]
        actor.outgoing += outputs

    def refused_fresh(self, hid: str, scheduled_at: float, refusals: list[object]) -> None:
        """A claim refused as older than half the retention must be that old by the clock of
        its readers, give or take the skew they admit: a producer's clock ahead (a record
        stamped a day ahead) must not make a partition refuse every fresh claim."""
        if refusals and self.now - scheduled_at <= RETENTION_S / 2 - SKEW_S:
            self.violations.append(f"{hid}: refused as stale {self.now - scheduled_at:g}s after its cycle began")

    def note_durable(self, actor: Actor) -> None:
        """The deletions a decider has persisted: none of those pods may be bound from then on."""
        for key, d in self.deciders.items():
            if d is actor and isinstance(d.saved_state, LedgerState):
                sent = d.saved_state.sent
                self.deleted_durably.setdefault(key, set()).update(
                    u for u in UIDS if f"deleted:{u}" in sent)

    def sweep(self) -> None:
        """The deciders' loop applies a key with something to forget, with no records, at the
        log time of the newest record read (here: now)."""
        for actor in self.deciders.values():
            state = actor.state
            assert isinstance(state, LedgerState)
            decision = Decision()
            actor.clock = max(actor.clock, self.now)
            Decider(RETENTION_S, QUOTAS).apply(state, [], decision, [], actor.clock, batch=actor.batch())
            actor.outgoing += decision.first + decision.after_commit

    # -- the outside world -----------------------------------------------------------------------

    def unanswered(self, uid: str) -> bool:
        """A claim of the pod waits for its answer (neither bound nor requeued past it)."""
        return uid not in self.bound() and uid not in self.deleted and any(
            u == uid and a >= self.attempt[uid] for u, a in self.claims)

    def bound(self) -> set[str]:
        return {b.uid for _, b in self.bindings}

    def claim(self, uid: str, node: str, minor: int, *, replica: int = 0, attempt: int | None = None,
              consume: str = "", scheduled_at: float | None = None) -> None:
        """A scheduler replica claims (and assumes) `uid` on `node` with its current attempt (or
        `attempt`: a scheduler that lost count); a claim of the same hold id again may name
        another GPU. `consume`: the reservation the pod consumes."""
        p = PODS[uid]
        requests = ResourceList(cpu=p.cpu, pods=1)
        claimed: tuple[str, ...] = ()
        if p.gpu:
            requests.update({devices.GPU_CORE: p.gpu, devices.GPU_RATIO: p.gpu})
            claimed = (devices.GpuAllocation(minor, p.gpu, p.gpu).encode(),)
        reserving = RESERVATIONS.get(uid)
        claim = Claim(uid=uid, attempt=self.attempt[uid] if attempt is None else attempt, node=node, decision_key=p.key,
                      requests=requests, priority=p.priority, name=uid, creation_timestamp=p.created, devices=claimed,
                      gang_min=p.gang_min, gang_waiting_s=30.0, gang_strict=p.strict, quota="" if reserving else QUOTA,
                      nominated_node=self.nominated.get(uid, ""), reservation=consume,
                      reserving=reserving, scheduled_at=self.now if scheduled_at is None else scheduled_at)
        self.claims.append((uid, claim.attempt))
        self.first_claimed.setdefault(uid, self.now)
        self.owners[node].log.append(claim)
        state = self.replicas[replica]
        row = state.index.get(node)
        if row is not None:
            request = self.space.pod_request(requests)
            state.assume(claim.hold_id, row, request)
            if not reserving:
                state.assume_quota(claim.hold_id, QUOTA, request)
            available = [a for a in state.reservations.by_row.get(row, []) if a.reservation.uid == consume]
            if consume and available:
                state.assume_reservation(claim.hold_id, row, consume,
                                         np.minimum(request, state.reservations.remaining(available[0])))

    def nominate(self, uid: str, node: str, minor: int) -> None:
        """Preemption nominates `uid` on `node` with its full claim (a scheduler only nominates a
        pod it is placing: none of its claims is waiting for an answer); a nomination moved
        clears the old one."""
        if uid in self.deleted or uid in self.bound() or self.unanswered(uid) or uid in RESERVATIONS:
            return
        p = PODS[uid]
        old = self.nominated.get(uid)
        if old is not None and old != node:
            self.owners[old].log.append(NominationCleared(uid=uid, node=old))
        claimed = (devices.GpuAllocation(minor, p.gpu, p.gpu).encode(),) if p.gpu else ()
        requests = ResourceList(cpu=p.cpu, pods=1)
        if p.gpu:
            requests.update({devices.GPU_CORE: p.gpu, devices.GPU_RATIO: p.gpu})
        self.owners[node].log.append(Nomination(uid=uid, node=node, priority=p.priority, requests=requests,
                                                devices=claimed))
        self.nominated[uid] = node

    def delete(self, uid: str) -> None:
        self.deleted.add(uid)
        self.deleted_at[uid] = self.now
        old = self.nominated.pop(uid, None)
        if old is not None:  # the scheduler clears the pod's nomination and forwards the deletion
            self.owners[old].log.append(NominationCleared(uid=uid, node=old))
        # The router forwards it, from a deletion record with no gang annotation (as the
        # harnesses publish them); a deletion sent to another decider is lost for this one.
        sent = [o.key.removeprefix("default/") for o in self.router.delete(PodDeleted(uid=uid, name=uid))
                if o.topic == topics.HOLDS]
        if sent != [PODS[uid].key]:
            self.violations.append(f"{uid}: its deletion went to decider {sent}, not to {PODS[uid].key}")
            return
        self.deciders[PODS[uid].key].log.append(PodDeleted(uid=uid, name=uid, decision_key=PODS[uid].key))

    def added(self, node: str) -> int:
        """The node is added (or updated): a node deleted since its last add comes back as
        another object. Returns its incarnation."""
        if node in self.node_gone:
            self.node_gone.discard(node)
            self.incarnation[node] += 1
        return self.incarnation[node]

    def restart_router(self, mode: int) -> None:
        """The router restarts (or its partition moves): the new one starts from the owners'
        tables as they are now (which hold whatever was reported: the table is written first)
        and re-reads the pods not deleted: unbound ones from their first version; those the
        old one saw bound (it let the committed offset pass them) and the tables show
        committed, as first read (mode 0), as a later version without the gang annotation (1),
        or not at all (2). Not modelled, a known gap (docs/architecture.md): a pod terminated
        and not deleted, whose first version the new one does not read."""
        old = self.router
        self.router = SchedulerCore(self.space, ClusterState(self.space), lambda: self.now)
        current = [NodeOwner.current(a.state) for a in self.owners.values()]  # type: ignore[arg-type]
        self.router.apply_state_changes(current, current=True)
        for uid in UIDS:
            committed = uid in old.bound and uid in self.router.state.bound
            if uid in self.deleted or (committed and mode == 2):
                continue
            self.router.add(pod_record(uid, relabelled=committed and mode == 1))

    def fire_timers(self) -> None:
        """The agents' timers: a gang waiting in a round gets its GangTimeout (re-armed from the
        table after a crash, so from the decider's current state); an available reservation
        its ReservationExpired (the owners' timers, re-armed from the table after a crash)."""
        for key, actor in self.deciders.items():
            state = actor.state
            assert isinstance(state, LedgerState)
            if state.waiting:
                actor.log.append(GangTimeout(decision_key=key, round=state.round))
        for node, actor in self.owners.items():
            state = actor.state
            assert isinstance(state, NodeState)
            armed = {uid for (n, uid) in self.owner_timers if n == node}
            armed |= {uid for uid, e in state.reservations.items() if e["phase"] == rsv.AVAILABLE}
            for uid in sorted(armed):
                actor.log.append(ReservationExpired(uid=uid, node=node))
            self.owner_timers = {k: v for k, v in self.owner_timers.items() if k[0] != node}

    def redeliver(self, actor: Actor, record: Record, stamped: float | None = None) -> None:
        """A record delivered again, late. A Nomination re-appended after its clearing is taken
        for a new one (nothing in the record tells them apart): only its lapse ends it."""
        if isinstance(record, Nomination):
            self.late_nominations.add(record.uid)
        if stamped is None:
            actor.log.append(record)
        else:
            actor.append(record, stamped=stamped)

    def fire_lapses(self, current: bool = True) -> None:
        """The owners' nomination lapse timers: every one asked for (older ones too, for a
        nomination made again since), and those a restore re-arms from the table; with
        `current` off, only those of nominations made again since (they must end nothing)."""
        for node, actor in self.owners.items():
            state = actor.state
            assert isinstance(state, NodeState)
            armed = {t for t in self.lapse_timers if t[0] == node} | set(NodeOwner.lapses(state))
            if not current:
                armed -= set(NodeOwner.lapses(state))
            for n, uid, since in sorted(armed):
                actor.log.append(NominationLapsed(uid=uid, node=n, since=since))
            self.lapse_timers -= armed

    def actors(self) -> list[Actor]:
        return [*self.owners.values(), *self.deciders.values(), self.quota]

    def busy(self) -> bool:
        return any(a.pos < len(a.log) or a.outgoing for a in self.actors())

    def drain(self) -> None:
        for _ in range(50):
            while self.busy():
                for n in NODES:
                    self.step_owner(n)
                for k in KEYS:
                    self.step_decider(k)
                self.step_quota()
                for a in self.actors():
                    self.flush(a, len(a.outgoing))
            self.fire_timers()
            if not self.busy():
                return
        raise AssertionError("the protocol did not come to rest")


ACTIONS = st.tuples(
    st.sampled_from(["owner", "decider", "flush", "claim", "reclaim", "persist", "commit", "crash", "duplicate",
                     "delete", "terminate", "node-delete", "node-add", "timer",
                     "claim-b", "stale-claim", "claim-r", "nominate", "node-add-small", "wait", "late-claim",
                     "sweep", "restart", "future-node", "future-duplicate", "abort", "quota", "lapse"]),
    st.integers(0, 99), st.integers(0, 99),
)


def run(actions: list[tuple[str, int, int]]) -> World:
    world = World()
    for action, i, j in actions:
        node, uid = NODES[i % len(NODES)], UIDS[j % len(UIDS)]
        actors = world.actors()
        actor = actors[(i + j) % len(actors)]
        if action == "owner":
            world.step_owner(node)
            if j % 2:
                world.flush(world.owners[node], 99)
        elif action == "decider":
            key = KEYS[j % len(KEYS)]
            world.step_decider(key)
            if i % 2:
                world.flush(world.deciders[key], 99)
        elif action == "flush":
            world.flush(actor, i % 4)
        elif action in ("claim", "claim-b"):  # claim-b: the other replica claims it (two replicas, one pod)
            if uid not in world.deleted:
                world.claim(uid, node, i % 2, replica=int(action == "claim-b"))
        elif action == "stale-claim":  # a scheduler that restarted and lost count claims an older attempt
            if uid not in world.deleted:
                world.claim(uid, node, i % 2, attempt=(i // 3) % (world.attempt[uid] + 1), replica=i % 2)
        elif action == "claim-r":  # a or b claims consuming a reservation
            consumer = CONSUMERS[j % 2]
            if consumer not in world.deleted:
                world.claim(consumer, node, i % 2, consume=sorted(RESERVATIONS)[(j // 2) % 2])
        elif action == "reclaim":  # the same hold id claimed again, with the other GPU
            # A deleted pod is claimed only by a replica that had not read its deletion, whose
            # cycle began before it (as "late-claim"): a scheduler never claims a pod it knows
            # deleted, nor one whose deletion it read before its cycle (it dropped the pod from
            # its queue first). Claimed fresh, a pod its decider had forgotten was bound after
            # its deletion, or kept in its ledger past the retention (RECLAIM_AFTER_FORGETTING).
            world.claim(uid, node, (i + 1) % 2,
                        scheduled_at=world.deleted_at[uid] - 1.0 if uid in world.deleted else None)
        elif action == "nominate":
            world.nominate(uid, node, i % 2)
        elif action == "persist":
            actor.persist_state()
            world.note_durable(actor)
        elif action == "commit":
            actor.commit()
            world.note_durable(actor)
        elif action == "crash":
            actor.crash()
        elif action == "abort":  # read again from the committed offset, the table kept in memory
            actor.abort()
        elif action == "duplicate":  # a record delivered again, late
            if actor.log:
                world.redeliver(actor, actor.log[i % len(actor.log)])
        elif action == "delete":
            if uid not in world.deleted:
                world.delete(uid)
        elif action == "terminate":  # the cluster reports a bound pod gone, racing the pipeline
            bound = [b for _, b in world.bindings if b.uid == uid]
            if bound:
                world.owners[bound[0].node].log.append(PodTerminated(uid=uid, node=bound[0].node,
                                                                     decision_key=PODS[uid].key))
        elif action == "node-delete":
            world.owners[node].log.append(NodeDeleted(name=node, uid=node_record(node, incarnation=world.incarnation[node]).uid))
            world.node_gone.add(node)
        elif action in ("node-add", "node-add-small"):
            world.owners[node].log.append(node_record(node, small=action == "node-add-small", incarnation=world.added(node)))
        elif action == "timer":
            world.fire_timers()
        elif action == "wait":  # time passes: a quarter of the retention to all of it
            world.now += RETENTION_S * ((i % 4) + 1) / 4
        elif action == "late-claim":  # a replica that had not read the pod's deletion claims it
            if uid in world.deleted and uid not in RESERVATIONS:
                world.claim(uid, node, i % 2, replica=i % 2, scheduled_at=world.deleted_at[uid] - 1.0)
        elif action == "sweep":
            world.sweep()
        elif action == "quota":  # the quota's ledger decides an ask or a return
            world.step_quota()
            if i % 2:
                world.flush(world.quota, 99)
        elif action == "restart":  # the scheduler replica that forwards deletions
            world.restart_router(i % 3)
        elif action == "future-node":  # the node updated by a producer whose clock runs a day ahead
            world.owners[node].append(node_record(node, incarnation=world.added(node)), stamped=world.now + DAY)
        elif action == "future-duplicate" and actor.log:  # a record delivered again by a producer a day ahead
            world.redeliver(actor, actor.log[i % len(actor.log)], stamped=world.now + DAY)
        elif action == "lapse":
            world.fire_lapses(current=j % 2 == 0)
    world.drain()
    return world


def verify(world: World) -> None:
    assert world.violations == [], world.violations
    assert world.problems == [], world.problems
    # Bindings: one distinct Binding per pod (node and devices).
    distinct: dict[str, set[tuple[str, str]]] = {}
    for _, b in world.bindings:
        distinct.setdefault(b.uid, set()).add((b.node, json.dumps(b.annotations, sort_keys=True)))
    assert all(len(v) == 1 for v in distinct.values()), f"pods with two distinct Bindings: {distinct}"
    # Every claim answered: its pod bound or deleted, or requeued past it (a scheduler reads
    # every Requeue of its pods, from the start of the partition after a restart).
    unanswered = sorted({(u, a) for u, a in world.claims
                         if u not in distinct and u not in world.deleted and world.attempt[u] <= a})
    assert unanswered == [], f"claims never answered (their schedulers wait for ever): {unanswered}"
    # The independent checker: nodes and GPUs, from Bindings and the owners' terminations. A
    # pod terminated at once on commit (its node gone or shrunk) never ran; the reservation is
    # no pod (its consumers count in full, its remainder in the owners' accounting).
    ghosts = {(e.uid, n) for n, a in world.owners.items() for e in a.state.holds.values()  # type: ignore[attr-defined]
              if e.terminated_by == BY_COMMIT_ON_DELETED_NODE}
    ran = [(t, b) for t, b in world.bindings if (b.uid, b.node) not in ghosts and b.uid not in RESERVATIONS]
    requests = {u: {"cpu": p.cpu, devices.GPU_CORE: p.gpu, devices.GPU_RATIO: p.gpu} for u, p in PODS.items()}
    alloc = devices.node_gpu_totals(node_record("x").allocatable, node_record("x").gpus)
    binds = [Placement(t, b.uid, b.node) for t, b in ran]
    result = check({n: alloc for n in NODES}, requests, binds, world.frees)
    assert result.nodes_overcommitted == 0, result.overcommitted
    capacity = {n: {f"gpu/{m}/{r}": 100 for m in (0, 1) for r in ("core", "ratio")} for n in NODES}
    placements = [DevicePlacement(t, b.uid, b.node, device_amounts(b.annotations.get(devices.DEVICE_ALLOCATED, "")))
                  for t, b in ran]
    assert devices_overcommitted(capacity, placements, world.frees) == {}
    # Elastic quota: at no time do the quota's pods, from their Binding until their node frees
    # them, request more than its max (two replicas claim with no pre-filter: the ledger alone
    # guarantees it).
    peak = quota_peak(ran, world.frees)
    assert peak <= QUOTA_MAX_CPU, f"quota {QUOTA}: {peak}m committed at once against a max of {QUOTA_MAX_CPU}m"
    # Gangs: all or nothing.
    assert partial_gangs(GANGS, distinct) == [], f"gangs partially bound: {distinct}"
    # The ledger's word matches the Bindings out there.
    for key, actor in world.deciders.items():
        state = actor.state
        assert isinstance(state, LedgerState)
        for uid, entry in state.pods.items():
            if entry.status == BOUND:
                assert uid in distinct, f"{uid} is bound in the ledger of {key}, but no Binding was published"
            if entry.status == DELETED:
                assert uid not in distinct or uid in world.deleted
    # Owners at rest: nothing held, no ghost on a deleted node, no stale nomination.
    bound_or_deleted = set(distinct) | world.deleted
    for node, actor in world.owners.items():
        state = actor.state
        assert isinstance(state, NodeState)
        assert [h for h, e in state.holds.items() if e.status == HELD] == [], f"{node}: holds never decided"
        running_deleted = sorted({e.uid for e in state.holds.values() if e.status == COMMITTED} & world.deleted)
        assert running_deleted == [], f"{node}: deleted pods still run there: {running_deleted}"
        if not state.exists:
            ghosts_left = [e.uid for e in state.holds.values() if e.status == COMMITTED]
            assert ghosts_left == [], f"{node} is deleted but still runs {ghosts_left}"
        stale = sorted(set(state.nominations) & bound_or_deleted - world.late_nominations)
        assert stale == [], f"{node}: nominations left for pods bound or deleted: {stale}"
        # The reservation: its last event says its phase here (a deleted one sends none); one
        # that ended holds nothing here any more, as a finished pod.
        for uid, entry in state.reservations.items():
            events = [e.phase for e in world.reservation_events if e.uid == uid and e.node == node]
            if entry["phase"] != rsv.DELETED:
                assert events and events[-1] == entry["phase"], f"{node}: {uid} is {entry['phase']}, said {events}"
            if entry["phase"] != rsv.AVAILABLE:
                assert state.holds[entry["hold"]].status != COMMITTED, f"{node}: {uid} ended, its hold still committed"
    # The quota's ledger counts what runs: a grant per committed pod of the quota, no more (none
    # leaked by a pod that ended, a group given up or denied, a replay), no less.
    ledger = world.quota.state
    assert isinstance(ledger, QuotaLedgerState)
    committed_quota = {e.uid for a in world.owners.values() for e in a.state.holds.values()  # type: ignore[attr-defined]
                       if e.status == COMMITTED and e.quota}
    assert set(ledger.grants) == committed_quota, f"the quota ledger grants {sorted(ledger.grants)}, " \
                                                   f"the owners run {sorted(committed_quota)}"
    # Wound-wait: never both ways.
    mutual = {(a, b) for a, b in world.yields if (b, a) in world.yields}
    assert not mutual, f"gangs asked to yield to each other: {mutual}"
    # Every replica converged to the owners, its quota usage and reservations too.
    running = [world.space.known(e.requests) for a in world.owners.values() for e in a.state.holds.values()  # type: ignore[attr-defined]
               if e.status == COMMITTED and e.reserving is None]
    want_quota = sum(running, world.space.known({})).tolist()
    for i, replica in enumerate(world.replicas):
        assert dict(replica.assumptions) == {}, f"replica {i}: assumptions never ended: {sorted(replica.assumptions)}"
        assert replica.reservations._assumed == {}, f"replica {i}: reservation consumption assumed for ever"
        got_quota = replica.quota_used.get(QUOTA, world.space.known({})).tolist()
        assert got_quota == want_quota, f"replica {i} counts {got_quota} against the quota, the owners {want_quota}"
        for node, actor in world.owners.items():
            state = actor.state
            assert isinstance(state, NodeState)
            row = replica.index[node]
            if state.exists:
                want = world.space.known(state.used()).tolist()
                assert replica.used[row].tolist() == want, f"{node}: replica used {replica.used[row]} != owner {want}"
            owner_bound = {e.uid for e in state.holds.values() if e.status == COMMITTED and e.reserving is None}
            replica_bound = {uid for uid, p in replica.bound.items() if p.row == row}
            assert replica_bound == owner_bound, f"{node}: replica sees {replica_bound} bound, owner {owner_bound}"
            want_rsv = [(s.reservation.uid, dict(s.allocated), s.consumers) for s in state.available_reservations()]
            got_rsv = [(a.reservation.uid, world.space.to_map(a.allocated), a.consumers)
                       for a in replica.reservations.by_row.get(row, [])]
            assert got_rsv == want_rsv, f"{node}: replica's reservations {got_rsv} != owner's {want_rsv}"
            noms = replica.nominator.arrays()
            got_noms = sorted(str(u) for r, u in zip(noms.rows.tolist(), noms.uids.tolist(), strict=True) if r == row)
            assert got_noms == sorted(state.nominations), f"{node}: replica's nominations {got_noms} != owner's"
    # Every nomination lapses on its timer, late copies of cleared ones included, and the
    # replicas forget it with the owner.
    world.fire_lapses()
    world.drain()
    for node, actor in world.owners.items():
        state = actor.state
        assert isinstance(state, NodeState)
        stale = sorted(set(state.nominations) & (set(distinct) | world.deleted))
        assert stale == [], f"{node}: nominations left after their lapse for pods bound or deleted: {stale}"
        for i, replica in enumerate(world.replicas):
            noms = replica.nominator.arrays()
            row = replica.index[node]
            got = sorted(str(u) for r, u in zip(noms.rows.tolist(), noms.uids.tolist(), strict=True) if r == row)
            assert got == sorted(state.nominations), f"replica {i}, {node}: nominations {got} != owner's"


# Fault 1: a gang's completion lost on replay. g0 waits (offset committed); g1 completes the gang;
# the decider persists and crashes before anything is acknowledged; only g1's Held is replayed.
GANG_COMPLETION = [
    ("claim", 0, 2), ("claim", 1, 3), ("owner", 0, 1), ("owner", 0, 1), ("owner", 1, 1), ("owner", 1, 1),
    ("decider", 0, KEYS.index("g")), ("commit", 3 + KEYS.index("g"), 0),
    ("decider", 0, KEYS.index("g")), ("persist", 3 + KEYS.index("g"), 0), ("crash", 3 + KEYS.index("g"), 0),
]
# Fault 2: deleting a waiting member: the Held's offset committed, the deletion decided and
# persisted, a crash before the Release is acknowledged, the deletion replayed.
WAITING_DELETION = [
    ("claim", 0, 2), ("owner", 0, 1), ("owner", 0, 1), ("decider", 1, KEYS.index("g")),
    ("commit", 3 + KEYS.index("g"), 0), ("delete", 0, 2), ("decider", 0, KEYS.index("g")),
    ("persist", 3 + KEYS.index("g"), 0), ("crash", 3 + KEYS.index("g"), 0),
]
# Fault 3: an owner's report lost: the Commit applied and persisted, a crash before the report is
# acknowledged; the replayed Commit must report again, or the replica never sees the pod bound.
LOST_REPORT = [
    ("claim", 0, 1), ("owner", 0, 1), ("decider", 1, 1), ("commit", 0, 0), ("owner", 0, 0), ("persist", 0, 0),
    ("crash", 0, 0),
]
# Fault 4: the same hold id claimed again with the other GPU, after the first was held.
RECLAIM_OTHER_GPU = [
    ("claim", 0, 0), ("owner", 0, 1), ("owner", 0, 1), ("reclaim", 0, 0), ("owner", 0, 1), ("decider", 1, 0),
]
# Fault 5: the node is deleted while a claim is held; the Commit arrives after.
COMMIT_AFTER_NODE_DELETE = [
    ("claim", 0, 1), ("owner", 0, 1), ("owner", 0, 1), ("node-delete", 0, 0), ("owner", 0, 1),
    ("decider", 1, 1),
]
# Fault 6: a member beyond min-available arrives once the gang was accepted.
MEMBER_BEYOND_MIN = [
    ("claim", 0, 2), ("claim", 1, 3), ("owner", 0, 1), ("owner", 0, 1), ("owner", 1, 1), ("owner", 1, 1),
    ("decider", 1, KEYS.index("g")), ("decider", 1, KEYS.index("g")), ("claim", 2, 4), ("owner", 2, 1),
    ("owner", 2, 1),
]
# Fault 7: wound-wait between g and h, whose members' creation times interleave: h1 finds g1
# holding on n0 while g0 finds h0 holding on n1.
WOUND_WAIT = [
    ("claim", 0, 0), ("claim", 0, 3), ("claim", 1, 1), ("claim", 1, 5), ("owner", 0, 1), ("owner", 0, 1),
    ("owner", 1, 1), ("owner", 1, 1), ("claim", 0, 6), ("claim", 1, 2), ("owner", 0, 1), ("owner", 1, 1),
]

# Fault 8: h holds on n0, g0's claim there makes h yield and nominates g0 on n0; g0's retry binds
# on n1 (with g1): the nomination on n0 must not stay.
NOMINATION_LEAK = [
    ("claim", 0, 0), ("claim", 0, 5), ("owner", 0, 1), ("owner", 0, 1), ("claim", 0, 2), ("owner", 0, 1),
    ("decider", 1, KEYS.index("g")), ("claim", 1, 2), ("claim", 1, 3), ("owner", 1, 1), ("owner", 1, 1),
    ("decider", 1, KEYS.index("g")), ("decider", 1, KEYS.index("g")),
]

# Fault 9: a held claim, then its node updated to one GPU fewer; the Commit would bind the pod to
# a GPU that is gone (and, shrunk further, over the node's cpu).
COMMIT_AFTER_SHRINK = [("claim", 1, 0), ("owner", 1, 1), ("node-add-small", 1, 0)]
# Fault 10: NonStrict gang h; h0's claim waits on n0, a second claim of the same attempt (another
# replica, or a send whose ack was lost) is rejected on the deleted n1 and requeued to attempt 1;
# that attempt's claim is released (another claim waits); the timeout's Requeue must pass 1.
NONSTRICT_SECOND_CLAIM = [
    ("claim", 0, 5), ("owner", 0, 1), ("decider", 1, KEYS.index("h")), ("node-delete", 1, 0), ("claim-b", 1, 5),
    ("owner", 1, 1), ("owner", 1, 1), ("decider", 1, KEYS.index("h")), ("claim", 2, 5), ("owner", 2, 1),
    ("decider", 1, KEYS.index("h")),
]


# Retention: a's claim is held, its Held not yet delivered when a is deleted; a retention later
# the decider has forgotten a, and the Held arrives: too old to act on, it binds nothing.
HELD_AFTER_FORGETTING = [
    ("claim", 0, 0), ("owner", 0, 0), ("delete", 0, 0), ("decider", 1, KEYS.index("a")), ("wait", 3, 0),
    ("wait", 0, 0), ("sweep", 0, 0), ("flush", 1, 8), ("decider", 0, KEYS.index("a")),
]


# Retention, found by an adversarial review: a decider that catches up a backlog covers more than
# a retention of log time in moments; it forgets a deleted pod, persists, and crashes before its
# offset commit. The replayed Held (its own log time old) must be judged at the decider's clock.
_A = 3 + KEYS.index("a")  # the actor index of a's decider in "persist" / "crash"
REPLAY_AFTER_FORGETTING = [
    ("claim", 0, 0), ("owner", 0, 1), ("owner", 0, 1), ("delete", 0, 0), ("decider", 1, KEYS.index("a")),
    ("decider", 1, KEYS.index("a")), ("persist", _A, 0), ("wait", 3, 0), ("wait", 0, 0), ("sweep", 0, 0),
    ("persist", _A, 0), ("crash", _A, 0), ("decider", 1, KEYS.index("a")),
]


# Issue 28, item 1: gang g (g0, g1) bound; the scheduler replica restarts and re-reads g0, bound
# (or only reads its deletion); g0's deletion must reach decider g, which terminates it.
_G = KEYS.index("g")
GANG_BOUND = [("claim", 0, 2), ("claim", 1, 3), ("owner", 0, 1), ("owner", 1, 1), ("decider", 1, _G),
              ("decider", 1, _G), ("owner", 0, 1), ("owner", 1, 1)]
DELETION_AFTER_RESTART = [*GANG_BOUND, ("restart", 0, 0), ("delete", 0, 2)]
DELETION_AFTER_RESTART_RELABELLED = [*GANG_BOUND, ("restart", 1, 0), ("delete", 0, 2)]
DELETION_AFTER_RESTART_UNREAD = [*GANG_BOUND, ("restart", 2, 0), ("delete", 0, 2)]

# Issue 28, item 3: a Node update stamped a day ahead (a producer's clock) raised n0's partition
# clock to it, and b's fresh claim there was refused as older than half the retention.
FUTURE_NODE = [("future-node", 0, 0), ("owner", 0, 1), ("claim", 0, 1), ("owner", 0, 1)]
# The same on holds: g0 waits; its Held delivered again, stamped a day ahead; g1's fresh Held
# completes the gang, and must not be released as stale.
_GD = 3 + KEYS.index("g")  # the decider actor of key g
FUTURE_HELD = [
    ("claim", 0, 2), ("owner", 0, 1), ("decider", 1, KEYS.index("g")), ("future-duplicate", _GD, 0),
    ("decider", 1, KEYS.index("g")), ("claim", 1, 3), ("owner", 1, 1), ("decider", 1, KEYS.index("g")),
]

# Issue 28, item 10: gang g loses round after round (g0 held, the rest never), each given up by
# its timer; its ledger must not keep a record per round lost.
GANG_LOSES_ROUNDS = [("claim", 0, 2), ("owner", 0, 1), ("owner", 0, 1), ("decider", 1, KEYS.index("g")),
                     ("timer", 0, 0), ("decider", 1, KEYS.index("g"))] * 5

# The same, found while bounding it: g0's round is given up and its outputs wait; g1 waits in
# the next round, which is given up too, then a crash. Decided as batches of their own (not one
# batch while outputs wait, `Actor.batch`), the second give-up forgot the first, whose timer,
# replayed, then re-sent nothing: g0's hold never released, its claim never answered.
ROUND_FORGOTTEN_IN_FLIGHT = [
    ("claim", 0, 2), ("owner", 0, 1), ("owner", 0, 1), ("decider", 0, KEYS.index("g")), ("commit", _GD, 0),
    ("timer", 0, 0), ("decider", 0, KEYS.index("g")), ("claim", 1, 3), ("owner", 1, 1), ("owner", 1, 1),
    ("decider", 0, KEYS.index("g")), ("timer", 0, 0), ("decider", 0, KEYS.index("g")), ("persist", _GD, 0),
    ("crash", _GD, 0),
]

# Reservations that end: s (allocate-once) on n0 consumed by a, r on n1 expiring on its timer.
# Both must leave the owners' and deciders' tables a retention later (an ended reservation's
# hold, ledger and uid were kept for ever); both have no creation time, so their ttl counts
# from when their owners first read their claims (it was counted from 0: expired at once).
RESERVATIONS_END = [
    ("claim", 0, UIDS.index("s")), ("claim", 1, UIDS.index("r")), ("owner", 0, 1), ("owner", 1, 1),
    ("decider", 1, KEYS.index("s")), ("decider", 1, KEYS.index("r")), ("owner", 0, 1), ("owner", 1, 1),
    ("claim-r", 0, 2),
]

# A node deleted and added again (another object), b bound on it; the owner's table ran ahead of
# its offset (persisted, then a crash): the old object's deletion is read again and must not
# terminate b (a NodeDeleted carried no identity of the object it deleted).
NODE_DELETION_REPLAYED = [
    ("node-delete", 0, 0), ("owner", 0, 1), ("node-add", 0, 0), ("owner", 0, 1), ("claim", 0, 1), ("owner", 0, 1),
    ("decider", 1, KEYS.index("b")), ("owner", 0, 1), ("persist", 0, 0), ("crash", 0, 0),
]


# Issue 28, item 2: two replicas claim against one quota (max 1200m): a, b (900m) held by one,
# h0, h1 (800m) by the other; the ledger grants first come, first served, and the rest is
# denied, released and requeued.
QUOTA_TWO_REPLICAS = [("claim", 0, UIDS.index("a")), ("claim-b", 1, UIDS.index("b")),
                      ("claim", 1, UIDS.index("h0")), ("claim-b", 2, UIDS.index("h1"))]
# The same, the gang's denial decided and persisted, then a crash before its outputs went: the
# redelivered denial must re-send them (its holds released, its members requeued).
_H = KEYS.index("h")
QUOTA_DENIED_GANG_REPLAYED = [
    ("claim", 0, UIDS.index("a")), ("claim-b", 1, UIDS.index("b")), ("owner", 0, 1), ("owner", 1, 1),
    ("decider", 1, KEYS.index("a")), ("decider", 1, KEYS.index("b")), ("quota", 1, 0), ("quota", 1, 0),
    ("claim", 1, UIDS.index("h0")), ("claim-b", 2, UIDS.index("h1")), ("owner", 1, 1), ("owner", 2, 1),
    ("decider", 1, _H), ("decider", 1, _H), ("quota", 1, 0), ("decider", 0, _H), ("persist", 3 + _H, 0),
    ("crash", 3 + _H, 0),
]


# Found by a longer run: h holds n0, g0's claim there is rejected softly (h asked to yield, g0
# nominated on n0) and its Rejected is late (an owner that lagged more than the retention read
# the claim at its old log time); meanwhile g0 is deleted and forgotten by its decider, which
# then reads the Rejected as stale, of a pod it does not know: the nomination must be cleared.
_GK = KEYS.index("g")
SOFT_REJECTED_AFTER_FORGETTING = [
    ("claim", 0, UIDS.index("h0")), ("claim", 0, UIDS.index("h1")), ("owner", 0, 0), ("owner", 0, 0),
    ("claim", 0, UIDS.index("g0")), ("owner", 0, 0), ("delete", 0, UIDS.index("g0")), ("decider", 0, _GK),
    ("wait", 3, 0), ("wait", 3, 0), ("sweep", 0, 0), ("owner", 0, 1),
]

# Found by a longer run: n0 updated by a producer a day ahead; b's claim held there and its Held
# committed by b's decider; n0's owner crashes a retention later, its table never saved. Its
# outputs went out, so its table (and clock) were durable first: the replayed claim is judged
# as it was, held again (it was rejected as stale: "Commit for a hold that is not held").
FUTURE_NODE_CRASH = [("future-node", 0, 0), ("owner", 0, 0), ("claim", 0, UIDS.index("b")), ("owner", 0, 1),
                     ("decider", 1, KEYS.index("b")), ("wait", 3, 0), ("crash", 0, 0)]
# Found by a longer run: a deleted and forgotten; a replica claims it again with the other GPU.
# Only one that had not read the deletion does, with a cycle begun before it: refused as stale.
RECLAIM_AFTER_FORGETTING = [("delete", 0, 0), ("decider", 1, KEYS.index("a")), ("wait", 3, 0), ("wait", 3, 0),
                            ("sweep", 0, 0), ("reclaim", 0, 0)]

# A Nomination delivered again after its clearing (b nominated on n0, deleted, the copy read
# after the NominationCleared) is taken for a new one: only its lapse timer ends it.
LATE_NOMINATION = [("nominate", 0, 1), ("owner", 0, 0), ("delete", 0, 1), ("owner", 0, 0), ("duplicate", 1, 9),
                   ("owner", 0, 0), ("owner", 0, 0)]
# b nominated on n0 twice: the first nomination's lapse fires after the second was recorded (and
# after a crash that restores the table and replays both).
OLD_LAPSE = [("nominate", 0, 1), ("owner", 0, 0), ("wait", 0, 0), ("nominate", 0, 1), ("owner", 0, 0),
             ("persist", 0, 0), ("crash", 0, 0), ("lapse", 0, 1), ("owner", 0, 0), ("owner", 0, 0)]

@settings(max_examples=300, deadline=None)
@given(st.lists(ACTIONS, min_size=1, max_size=100))
@example(GANG_COMPLETION)
@example(WAITING_DELETION)
@example(LOST_REPORT)
@example(RECLAIM_OTHER_GPU)
@example(COMMIT_AFTER_NODE_DELETE)
@example(MEMBER_BEYOND_MIN)
@example(WOUND_WAIT)
@example(NOMINATION_LEAK)
@example(COMMIT_AFTER_SHRINK)
@example(NONSTRICT_SECOND_CLAIM)
@example(HELD_AFTER_FORGETTING)
@example(REPLAY_AFTER_FORGETTING)
@example(DELETION_AFTER_RESTART)
@example(DELETION_AFTER_RESTART_RELABELLED)
@example(DELETION_AFTER_RESTART_UNREAD)
@example(FUTURE_NODE)
@example(FUTURE_HELD)
@example(GANG_LOSES_ROUNDS)
@example(ROUND_FORGOTTEN_IN_FLIGHT)
@example(RESERVATIONS_END)
@example(QUOTA_TWO_REPLICAS)
@example(QUOTA_DENIED_GANG_REPLAYED)
@example(SOFT_REJECTED_AFTER_FORGETTING)
@example(FUTURE_NODE_CRASH)
@example(RECLAIM_AFTER_FORGETTING)
@example(NODE_DELETION_REPLAYED)
@example(LATE_NOMINATION)
@example(OLD_LAPSE)
def test_protocol_is_safe_under_crashes_and_replays(actions: list[tuple[str, int, int]]) -> None:
    world = run(actions)
    verify(world)
    verify_forgotten(world)


def quota_peak(ran: list[tuple[int, Binding]], frees: list[Placement]) -> int:
    """The most cpu the quota's pods took at once: each from its first Binding until its node
    first freed it after that (a pod is bound once: decisions are final)."""
    spans: dict[str, tuple[int, float]] = {}
    for t, b in ran:
        if b.uid not in spans:  # (`ran` holds no reservation: they count against no quota)
            spans[b.uid] = (t, min((f.time for f in frees if f.uid == b.uid and f.node == b.node and f.time > t),
                                   default=float("inf")))
    moments = sorted(start for start, _ in spans.values())
    return max((sum(PODS[u].cpu for u, (start, end) in spans.items() if start <= m < end) for m in moments),
               default=0)


def verify_forgotten(world: World) -> None:
    """A retention later, what finished is forgotten (owners keep what is live, deciders forget
    deleted pods); and the late claims the retention must still stop (each deleted pod claimed
    again by a replica that had not read its deletion, then redelivered to its owners and
    deciders) bind nothing."""
    world.now += RETENTION_S + SKEW_S + 1.0  # a clock may have been judged up to the skew ahead
    for node, actor in world.owners.items():  # any record of the node's: owners forget in its batches
        actor.log.append(NominationCleared(uid="nobody", node=node))
    world.sweep()
    world.drain()
    world.sweep()
    for node, actor in world.owners.items():
        state = actor.state
        assert isinstance(state, NodeState)
        finished = sorted(h for h, e in state.holds.items() if e.status not in (HELD, COMMITTED))
        assert finished == [], f"{node}: finished holds kept past the retention: {finished}"
        assert state.tombstones == {}, f"{node}: tombstones kept past the retention: {state.tombstones}"
    ended = {e.uid for e in world.reservation_events if e.phase in (rsv.SUCCEEDED, rsv.FAILED)}
    for key, actor in world.deciders.items():
        state = actor.state
        assert isinstance(state, LedgerState)
        ended_kept = sorted(set(state.pods) & ended)
        assert ended_kept == [], f"{key}: reservations that ended (consumed, expired, node gone) kept: {ended_kept}"
        kept = sorted(set(state.pods) & world.deleted)
        assert kept == [], f"{key}: deleted pods kept past the retention: {kept}"
        left = [k for table in (state.decisions, state.accepted, state.reasons, state.sent) for k in table
                if k.split("/")[0].split(":")[-1] in world.deleted]
        assert left == [], f"{key}: records of deleted pods kept past the retention: {left}"
    ledger = world.quota.state
    assert isinstance(ledger, QuotaLedgerState)
    assert set(ledger.grants) & world.deleted == set(), f"the quota ledger keeps deleted pods: {sorted(ledger.grants)}"
    bound_before = len(world.bindings)
    for uid in sorted(world.deleted - set(RESERVATIONS)):
        for node in NODES:
            world.claim(uid, node, 0, scheduled_at=world.deleted_at[uid] - 1.0)
    world.drain()
    late = [b.uid for _, b in world.bindings[bound_before:]]
    assert late == [], f"deleted pods bound by claims older than the retention: {late}"
