"""Node owners: the one writer of a node's capacity, holds and nominations.

Everything that changes a node enters its `node-inbox` partition, so one owner sees one order
of claims, commit / release decisions, terminations, nominations and node changes. The hold
state machine lives here:

    claim --fits--> held --Commit--> committed --PodTerminated--> terminated
                      \\--Release--> released
    claim --does not fit / node gone / pod terminated--> rejected

Replays re-send, never re-decide: every claim's outcome is recorded by hold id, and a
redelivered claim gets the recorded answer. A Release of a committed hold is ignored (decisions
are final); a Commit of a hold that is not held is a `Problem` (dead letter and alarm).
Terminated pods leave tombstones so that nothing late re-allocates them.

Wound-wait between gangs (DESIGN.md, rule 6): a gang member's claim that does not fit, but
would once the held, not yet accepted, claims of lower-ranked gangs (`gangs.rank`) are gone,
is rejected softly; each such gang's decider gets a `Yield` naming its holds here, and the
claimant is nominated on the node so the capacity they free is its. Owners report held gang
claims (`NodeStateChange.gang_holds`) so that schedulers may claim such capacity at all.

Reservations (`agents.state.reservations`) ride on the same machine: a claim that carries
`reserving` is a reservation; once committed it is Available and holds its remainder (what
its consumers have not taken). A claim that names a `reservation` consumes it first. The
owner reports the phase changes as ReservationEvents, asks its agent for an expiry timer
(`OwnerResult.timers`) and ends the reservation when the `ReservationExpired` record the
timer appends comes back through the inbox.

`NodeOwner.apply(state, records)` is pure: it returns the new state, the outputs (Held /
Rejected to the deciders, PodTerminated for pods of a deleted node) and one `NodeStateChange`
per batch for the schedulers' replicas.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from agents.ports import Output, Problem
from agents.state import cpus, devices, gangs
from agents.state import reservations as rsv
from agents.state.resources import DEFAULT_MAX_PODS
from schemas import topics
from schemas.codec import decode_object, to_plain
from schemas.records import (
    BoundPod,
    Claim,
    Commit,
    GangHold,
    Held,
    Node,
    NodeDeleted,
    NodeStateChange,
    Nomination,
    NominationCleared,
    PodTerminated,
    Record,
    Rejected,
    Release,
    Reservation,
    ReservationEvent,
    ReservationExpired,
    ReservationState,
    ResourceList,
    Yield,
)

HELD, COMMITTED, RELEASED, REJECTED, TERMINATED = "held", "committed", "released", "rejected", "terminated"
COUNTED = (HELD, COMMITTED)

REASON_NODE_NOT_FOUND = "node not found"
REASON_NODE_UNSCHEDULABLE = "node is unschedulable"
REASON_POD_TERMINATED = "pod already terminated"
REASON_INSUFFICIENT = "Insufficient {}"
REASON_INSUFFICIENT_PREFIX = "Insufficient "


@dataclass
class HoldEntry:
    uid: str
    attempt: int
    decision_key: str
    requests: dict[str, int]
    priority: int
    status: str
    reason: str = ""  # why it was rejected
    gang_min: int = 0
    nominated_node: str = ""
    namespace: str = ""
    name: str = ""
    devices: list[str] = field(default_factory=list)  # as claimed ("gpu/<minor>/<core>/<ratio>")
    quota: str = ""
    reservation: str = ""  # the reservation it consumes (uid)
    consumed: dict[str, int] = field(default_factory=dict)  # what it takes of that reservation
    reserving: dict[str, Any] | None = None  # the Reservation (plain) when the hold is one
    created: float = 0.0  # the pod's creation time (gangs rank by it)
    soft: bool = False  # rejected while lower-ranked gangs were asked to yield
    yields: dict[str, list[str]] = field(default_factory=dict)  # loser gang -> its holds, asked to yield

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        object.__setattr__(self, "_plain", None)  # any change: `plain` computes again

    def plain(self) -> dict[str, Any]:
        """As JSON, without the fields that hold their defaults (`HoldEntry(**plain)` restores
        them): a node's table value carries every hold it ever had, so this is most of the
        bytes the owners write to their changelog. Kept until a field is assigned (the cores
        assign fields, never change their contents in place), since a node's state is written
        whole for every batch that touches it."""
        cached: dict[str, Any] | None = self.__dict__.get("_plain")
        if cached is None:
            cached = {k: v for k, v in self.__dict__.items()
                      if k in _HOLD_REQUIRED or (k in _HOLD_DEFAULTS and v != _HOLD_DEFAULTS[k])}
            object.__setattr__(self, "_plain", cached)
        return cached


_HOLD_FIELDS = {f.name: f for f in fields(HoldEntry)}
_HOLD_REQUIRED = frozenset(n for n, f in _HOLD_FIELDS.items() if f.default is MISSING and f.default_factory is MISSING)
_HOLD_DEFAULTS = {n: f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc,operator]
                  for n, f in _HOLD_FIELDS.items() if n not in _HOLD_REQUIRED}


@dataclass
class NodeState:
    """One node's state at its owner; the value of the owners' table (keyed by node name)."""

    name: str
    exists: bool = False
    allocatable: dict[str, int] = field(default_factory=dict)
    unschedulable: bool = False
    holds: dict[str, HoldEntry] = field(default_factory=dict)
    nominations: dict[str, Nomination] = field(default_factory=dict)
    tombstones: set[str] = field(default_factory=set)
    seq: int = 0
    record: dict[str, Any] | None = None  # the Node as last published, as plain JSON
    reservations: dict[str, dict[str, str]] = field(default_factory=dict)  # uid -> {hold, phase}

    def used(self, ignoring: frozenset[str] = frozenset()) -> dict[str, int]:
        """Pods' full requests, plus what each reservation still holds for its consumers
        (less the holds in `ignoring`)."""
        consumed = self.consumptions() if self.reservations else {}
        total: dict[str, int] = {}
        for hid, hold in self.holds.items():
            if hold.status not in COUNTED or hid in ignoring:
                continue
            amounts = hold.requests
            if hold.reserving is not None and hold.status == COMMITTED:
                entry = self.reservations.get(hold.uid)
                available = entry is not None and entry["phase"] == rsv.AVAILABLE
                amounts = _less(hold.requests, consumed.get(hold.uid, ({}, 0))[0]) if available else {}
            for name, amount in amounts.items():
                total[name] = total.get(name, 0) + amount
        return total

    def consumptions(self) -> dict[str, tuple[dict[str, int], int]]:
        """Per reservation uid: what its held and committed consumers take of it, and how many
        they are (one pass over the holds)."""
        out: dict[str, tuple[dict[str, int], int]] = {}
        for hold in self.holds.values():
            if hold.reservation and hold.status in COUNTED:
                taken, count = out.get(hold.reservation, ({}, 0))
                for name, amount in hold.consumed.items():
                    taken[name] = taken.get(name, 0) + amount
                out[hold.reservation] = (taken, count + 1)
        return out

    def consumption(self, uid: str) -> tuple[dict[str, int], int]:
        """What the held and committed pods consuming reservation `uid` take of it, and how many."""
        return self.consumptions().get(uid, ({}, 0))

    def remaining(self, uid: str) -> dict[str, int]:
        """What reservation `uid` still holds: its request less its consumers' parts."""
        entry = self.reservations.get(uid)
        if entry is None:
            return {}
        return _less(self.holds[entry["hold"]].requests, self.consumption(uid)[0])

    def reservation(self, uid: str) -> Reservation:
        entry = self.reservations[uid]
        plain = self.holds[entry["hold"]].reserving
        assert plain is not None
        return _decode(plain, Reservation)

    def available_reservations(self) -> tuple[ReservationState, ...]:
        out = []
        consumed = self.consumptions()
        for uid, entry in sorted(self.reservations.items()):
            if entry["phase"] == rsv.AVAILABLE:
                taken, count = consumed.get(uid, ({}, 0))
                out.append(ReservationState(self.reservation(uid), ResourceList(taken), count))
        return tuple(out)

    def device_usage(self) -> dict[str, int]:
        """Per device, what committed and held claims use: GPU core and memory-ratio, RDMA
        virtual functions, bound CPUs and NUMA memory per cell."""
        usage: dict[str, int] = {}
        for hold in self.holds.values():
            if hold.status in COUNTED:
                devices.add_usage(usage, hold.devices)
        return usage

    def nics(self) -> dict[int, int]:
        """minor -> virtual functions, from the Node record."""
        return {int(n["minor"]): int(n.get("vfs", 0)) for n in (self.record or {}).get("rdma", ())}

    def gpus(self) -> dict[int, tuple[int, int]]:
        """minor -> (core, memory-ratio) capacity, from the Node record."""
        return {int(g["minor"]): (int(g.get("core", 100)), int(g.get("memory_ratio", 100)))
                for g in (self.record or {}).get("gpus", ())}

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "exists": self.exists,
            "allocatable": self.allocatable,
            "unschedulable": self.unschedulable,
            "holds": {hid: h.plain() for hid, h in self.holds.items()},
            "nominations": {uid: to_plain(n) for uid, n in self.nominations.items()},
            "tombstones": sorted(self.tombstones),
            "seq": self.seq,
            "record": self.record,
            "reservations": self.reservations,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> NodeState:
        return cls(
            name=raw["name"],
            exists=raw["exists"],
            allocatable=dict(raw["allocatable"]),
            unschedulable=raw["unschedulable"],
            holds={hid: HoldEntry(**h) for hid, h in raw["holds"].items()},
            nominations={uid: _decode(n, Nomination) for uid, n in raw["nominations"].items()},
            tombstones=set(raw["tombstones"]),
            seq=raw["seq"],
            record=raw.get("record"),
            reservations={uid: dict(e) for uid, e in (raw.get("reservations") or {}).items()},
        )


@dataclass
class OwnerResult:
    outputs: list[Output] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    timers: list[tuple[str, str, float]] = field(default_factory=list)  # (node, reservation uid, expires at)


R = TypeVar("R", bound=Record)


def _less(amounts: dict[str, int], taken: dict[str, int]) -> dict[str, int]:
    return {name: max(amount - taken.get(name, 0), 0) for name, amount in amounts.items()}


def _decode(raw: dict[str, Any], kind: type[R]) -> R:
    record = decode_object(raw, kind)
    assert isinstance(record, kind)
    return record


class NodeOwner:
    """Applies a batch of one node's inbox records to its state (see module docstring)."""

    def apply(self, state: NodeState, records: Iterable[Record], result: OwnerResult) -> NodeState:
        touched: dict[str, str] = {}
        changed = False
        record_changed = False
        for record in records:
            changed |= self._apply_one(state, record, result, touched)
            record_changed |= isinstance(record, (Node, NodeDeleted))
        if changed or touched:
            state.seq += 1
            result.outputs.append(Output(topics.STATE_CHANGES, state.name, NodeStateChange(
                node=state.name,
                seq=state.seq,
                allocatable=ResourceList(state.allocatable),
                used=ResourceList(state.used()),
                unschedulable=state.unschedulable,
                deleted=not state.exists,
                holds=touched,
                node_record=_decode(state.record, Node) if record_changed and state.record else None,
                nominations=tuple(state.nominations.values()),
                device_usage=state.device_usage(),
                committed=tuple(
                    BoundPod(uid=h.uid, namespace=h.namespace, name=h.name, priority=h.priority,
                             requests=ResourceList(h.requests), quota=h.quota, devices=tuple(h.devices))
                    for hid, status in touched.items() if status == COMMITTED
                    for h in (state.holds[hid],) if h.reserving is None  # a reservation is no victim
                ),
                reservations=state.available_reservations() if state.reservations else (),
                gang_holds=tuple(
                    GangHold(hold_id=hid, decision_key=h.decision_key, priority=h.priority, created=h.created,
                             requests=ResourceList(h.requests))
                    for hid, h in state.holds.items() if h.status == HELD and h.gang_min > 1
                ),
            )))
        return state

    def _apply_one(self, state: NodeState, record: Record, result: OwnerResult, touched: dict[str, str]) -> bool:
        if isinstance(record, Claim):
            self._claim(state, record, result, touched)
            return False
        if isinstance(record, Commit):
            hold = state.holds.get(record.hold_id)
            if hold is not None and hold.status == HELD:
                hold.status = COMMITTED
                touched[record.hold_id] = COMMITTED
                self._committed(state, record.hold_id, hold, result)
            elif hold is None or hold.status not in (COMMITTED, TERMINATED):
                result.problems.append(Problem(
                    "hold_id", record.hold_id,
                    f"Commit for a hold that is not held (state: {hold.status if hold else 'unknown'})", record,
                ))
            return False
        if isinstance(record, Release):
            hold = state.holds.get(record.hold_id)
            if hold is not None and hold.status == HELD:
                hold.status = RELEASED
                touched[record.hold_id] = RELEASED
            return False
        if isinstance(record, PodTerminated):
            self._terminate(state, record.uid, touched)
            return state.reservations.pop(record.uid, None) is not None  # a reservation deleted
        if isinstance(record, ReservationExpired):
            return self._end_reservation(state, record.uid, rsv.FAILED, rsv.REASON_EXPIRED, result)
        if isinstance(record, Node):
            state.record = to_plain(record)
            state.exists = True
            state.allocatable = devices.node_gpu_totals(record.allocatable, record.gpus, record.rdma)
            state.allocatable.setdefault("pods", DEFAULT_MAX_PODS)
            state.unschedulable = record.unschedulable
            return True
        if isinstance(record, NodeDeleted):
            if not state.exists:
                return False
            state.exists = False
            for uid in list(state.reservations):
                self._end_reservation(state, uid, rsv.FAILED, rsv.REASON_NODE_DELETED, result)
            for hid, hold in list(state.holds.items()):
                if hold.status == COMMITTED:
                    self._terminate(state, hold.uid, touched)
                    result.outputs.append(Output(topics.HOLDS, hold.decision_key, PodTerminated(
                        uid=hold.uid, node=state.name, decision_key=hold.decision_key, reason="node deleted",
                    )))
                    touched[hid] = TERMINATED
            return True
        if isinstance(record, Nomination):
            state.nominations[record.uid] = record
            return True
        if isinstance(record, NominationCleared):
            return state.nominations.pop(record.uid, None) is not None
        result.problems.append(Problem("kind", record.KIND, f"{record.KIND} does not belong on node-inbox", record))
        return False

    def _committed(self, state: NodeState, hid: str, hold: HoldEntry, result: OwnerResult) -> None:
        """A reservation becomes Available (and asks for its expiry timer); a pod consuming an
        allocate-once reservation ends it."""
        if hold.reserving is not None:
            state.reservations[hold.uid] = {"hold": hid, "phase": rsv.AVAILABLE}
            reservation = state.reservation(hold.uid)
            self._event(state, hold.uid, rsv.AVAILABLE, "", result)
            expires_at = reservation.expires_at
            if expires_at is not None:
                result.timers.append((state.name, hold.uid, expires_at))
        elif hold.reservation:
            entry = state.reservations.get(hold.reservation)
            if entry is not None and entry["phase"] == rsv.AVAILABLE and state.reservation(hold.reservation).allocate_once:
                self._end_reservation(state, hold.reservation, rsv.SUCCEEDED, "", result)

    def _end_reservation(self, state: NodeState, uid: str, phase: str, reason: str, result: OwnerResult) -> bool:
        """An available reservation stops holding its remainder (its consumers keep theirs)."""
        entry = state.reservations.get(uid)
        if entry is None or entry["phase"] != rsv.AVAILABLE:
            return False
        self._event(state, uid, phase, reason, result)  # with what was allocated when it ended
        entry["phase"] = phase
        return True

    @staticmethod
    def _event(state: NodeState, uid: str, phase: str, reason: str, result: OwnerResult) -> None:
        reservation = state.reservation(uid)
        taken, _ = state.consumption(uid)
        result.outputs.append(Output(topics.RESERVATIONS, uid, ReservationEvent(
            name=reservation.name, uid=uid, phase=phase, node=state.name, reason=reason,
            requests=ResourceList(state.holds[state.reservations[uid]["hold"]].requests), allocated=ResourceList(taken),
        )))

    def _terminate(self, state: NodeState, uid: str, touched: dict[str, str]) -> None:
        state.tombstones.add(uid)
        for hid, hold in state.holds.items():
            if hold.uid == uid and hold.status == COMMITTED:
                hold.status = TERMINATED
                touched[hid] = TERMINATED

    def _claim(self, state: NodeState, claim: Claim, result: OwnerResult, touched: dict[str, str]) -> None:
        hid = claim.hold_id
        hold = state.holds.get(hid)
        if hold is None:
            reason = self._refusal(state, claim)
            yields = self._yields(state, claim) if reason.startswith(REASON_INSUFFICIENT_PREFIX) else {}
            if yields:
                reason = f"waiting for gang(s) {', '.join(sorted(yields))} to yield the capacity (wound-wait)"
            hold = HoldEntry(
                uid=claim.uid, attempt=claim.attempt, decision_key=claim.decision_key,
                requests=dict(claim.requests), priority=claim.priority,
                status=REJECTED if reason else HELD, reason=reason, gang_min=claim.gang_min,
                nominated_node=claim.nominated_node, namespace=claim.namespace, name=claim.name,
                devices=list(claim.devices), quota=claim.quota,
                reserving=to_plain(claim.reserving) if claim.reserving is not None else None,
                created=claim.creation_timestamp, soft=bool(yields), yields=yields,
            )
            if yields:  # the winner is promised what the losers free (DESIGN.md, rule 6)
                state.nominations[claim.uid] = Nomination(uid=claim.uid, node=state.name, priority=claim.priority,
                                                          requests=claim.requests, devices=claim.devices)
            if claim.reservation and not reason:
                hold.reservation = claim.reservation
                hold.consumed = rsv.consumed(claim.requests, state.remaining(claim.reservation))
            state.holds[hid] = hold
            touched[hid] = hold.status
        # A redelivered claim gets its recorded answer again; nothing changes.
        if hold.status == REJECTED:
            result.outputs.append(Output(topics.HOLDS, claim.decision_key, Rejected(
                uid=claim.uid, attempt=claim.attempt, node=claim.node,
                decision_key=claim.decision_key, reason=hold.reason, soft=hold.soft,
            )))
            for key, holds in sorted(hold.yields.items()):
                result.outputs.append(Output(topics.HOLDS, key, Yield(
                    decision_key=key, node=state.name, holds=tuple(holds), winner=claim.decision_key,
                )))
        else:
            result.outputs.append(Output(topics.HOLDS, claim.decision_key, Held(
                uid=claim.uid, attempt=claim.attempt, node=claim.node, decision_key=claim.decision_key,
                namespace=claim.namespace, name=claim.name, gang_min=claim.gang_min,
                gang_waiting_s=claim.gang_waiting_s, gang_strict=claim.gang_strict,
                nominated_node=claim.nominated_node, devices=claim.devices,
            )))

    def _refusal(self, state: NodeState, claim: Claim, ignoring: frozenset[str] = frozenset()) -> str:
        if not state.exists:
            return REASON_NODE_NOT_FOUND
        if claim.uid in state.tombstones:
            return REASON_POD_TERMINATED
        if state.unschedulable:
            return REASON_NODE_UNSCHEDULABLE
        used = state.used(ignoring)
        if claim.reservation:
            refusal = self._reservation_refusal(state, claim)
            if refusal:
                return refusal
            for name, amount in state.remaining(claim.reservation).items():  # what the pod may take
                used[name] = used.get(name, 0) - amount
        # A preemptor is not blocked by its own nomination; others' count when they outrank it.
        for uid, nomination in state.nominations.items():
            if uid != claim.uid and nomination.priority >= claim.priority:
                for name, amount in nomination.requests.items():
                    used[name] = used.get(name, 0) + amount
        for name, amount in claim.requests.items():
            if amount and state.allocatable.get(name, 0) - used.get(name, 0) < amount:
                return REASON_INSUFFICIENT.format(name)
        return self._device_refusal(state, claim)

    def _yields(self, state: NodeState, claim: Claim) -> dict[str, list[str]]:
        """Wound-wait: when the claim of a gang member fits once lower-ranked gangs' held (not
        yet accepted) claims are gone, those gangs, with their holds here; else nothing."""
        if claim.gang_min <= 1:
            return {}
        mine = gangs.rank(claim.priority, claim.creation_timestamp, claim.decision_key)
        losers = {hid: h for hid, h in state.holds.items()
                  if h.status == HELD and h.gang_min > 1 and h.decision_key != claim.decision_key
                  and gangs.rank(h.priority, h.created, h.decision_key) > mine}
        if not losers or self._refusal(state, claim, ignoring=frozenset(losers)):
            return {}
        out: dict[str, list[str]] = {}
        for hid, h in sorted(losers.items()):
            out.setdefault(h.decision_key, []).append(hid)
        return out

    @staticmethod
    def _reservation_refusal(state: NodeState, claim: Claim) -> str:
        entry = state.reservations.get(claim.reservation)
        if entry is None or entry["phase"] != rsv.AVAILABLE:
            return f"reservation {claim.reservation} is not available on the node"
        reservation = state.reservation(claim.reservation)
        if reservation.allocate_once and state.consumption(claim.reservation)[1]:
            return f"reservation {reservation.name} is allocate-once and already taken"
        if reservation.allocate_policy == rsv.RESTRICTED:
            held = state.holds[state.reservations[claim.reservation]["hold"]].requests
            short = rsv.restricted_shortfall(claim.requests, held, state.remaining(claim.reservation))
            if short:
                return f"Insufficient {short} in reservation {reservation.name} (Restricted)"
        return ""

    @staticmethod
    def _device_refusal(state: NodeState, claim: Claim) -> str:
        """The claimed GPUs exist and have room for their share (devices, not only totals)."""
        claimed, vfs, cpusets = devices.decode(claim.devices), devices.decode_rdma(claim.devices), cpus.decode(claim.devices)
        if not claimed and not vfs and not cpusets:
            return ""
        gpus, usage, nics = state.gpus(), state.device_usage(), state.nics()
        for uid, nomination in state.nominations.items():  # others' promised devices, as for totals
            if uid != claim.uid and nomination.priority >= claim.priority:
                devices.add_usage(usage, nomination.devices)
        if cpusets:
            cells = (state.record or {}).get("numa", ())
            known = {c for cell in cells for c in cell.get("cpus", ())}
            cell_memory = {int(cell.get("id", 0)): int(cell.get("memory", 0) or 0) for cell in cells}
            for cpuset in cpusets:
                for cpu in cpuset.cpus:
                    if cpu not in known:
                        return f"cpu {cpu} does not exist on the node"
                    if usage.get(f"cpu/{cpu}/used"):
                        return f"cpu {cpu} is bound to another pod"
                memory = cell_memory.get(cpuset.cell, 0)
                if cpuset.memory and memory and usage.get(f"numa/{cpuset.cell}/memory", 0) + cpuset.memory > memory:
                    return f"Insufficient memory in NUMA node {cpuset.cell}"
        for n in vfs:
            if n.minor not in nics:
                return f"rdma {n.minor} does not exist on the node"
            if usage.get(f"rdma/{n.minor}/vfs", 0) + n.vfs > nics[n.minor]:
                return f"Insufficient rdma {n.minor}"
        for a in claimed:
            if a.minor not in gpus:
                return f"gpu {a.minor} does not exist on the node"
            core, ratio = gpus[a.minor]
            if usage.get(f"gpu/{a.minor}/core", 0) + a.core > core or usage.get(f"gpu/{a.minor}/ratio", 0) + a.ratio > ratio:
                return f"Insufficient gpu {a.minor}"
        return ""
