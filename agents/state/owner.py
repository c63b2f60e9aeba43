"""Node owners: the one writer of a node's capacity, holds and nominations.

Everything that changes a node enters its `node-inbox` partition, so one owner sees one order
of claims, commit / release decisions, terminations, nominations and node changes. The hold
state machine lives here:

    claim --fits--> held --Commit--> committed --PodTerminated / NodeDeleted--> terminated
                      \\--Release--> released
                      \\--Commit, node deleted--> terminated at once (a ghost)
                      \\--Commit, node changed and the claim no longer fits--> terminated at once
    claim --does not fit / node gone / pod terminated--> rejected

Replays re-send, never re-decide (DESIGN.md, rules 1 and 12). A crash may come after the
table (changelog) write and before the outputs are delivered, so a restarted owner sees inputs
again against a state that already has them. Every input's outcome is recorded, with what it
takes to build all the outputs it caused, and a redelivered input re-sends them in full, built
from the record, never from the redelivered message:

- Claim: recorded per hold id (`HoldEntry`: the claim as held, the outcome, the reason, the
  gangs it asked to yield). Re-sent: Held, or Rejected and its Yields. A claim that differs
  from the recorded one under the same hold id is a `Problem` (dead letter), and still gets
  the recorded answer.
- Commit: the hold's status. Re-sent: a reservation's Available event and expiry timer (and
  its end event if it ended since, so the last event says its phase now), the end of an
  allocate-once reservation the commit consumed (`ended_by` on the reservation's entry; its
  event and its deletion), and
  for a Commit that came after the node's deletion (rule 9: committed and terminated at once,
  `terminated_by`), its PodTerminated to the decider and SchedulingFeedback. The same for a
  Commit of a claim that the node, deleted and added again or updated since the claim was held,
  no longer fits (less allocatable, a claimed GPU, NIC or CPU gone): committing it as held would
  over-commit the node; the reason is recorded in the hold's `reason`. A Commit also drops
  the pod's nomination on the node: it is bound here.
- NodeDeleted: which holds it terminated (`terminated_by`) and which reservations it failed.
  Re-sent: their PodTerminated records (to the deciders) and ReservationEvents.
- ReservationExpired: the end it recorded on the reservation. Re-sent: that ReservationEvent
  and the reservation's deletion (an ended reservation's end is always sent with it).
- Every batch reports a `NodeStateChange` (so one lost in a crash is sent again by the
  replay), with the current status of every hold the batch was about (a claim's, a commit's or
  release's, a terminated pod's, those a node deletion terminated) and, for the committed ones,
  their `BoundPod` entries as a first commit reports them: a replica converges to the owner's
  view whatever it missed.

A Release of a committed hold is ignored (decisions are final); a Commit of a hold that is not
held is a `Problem` (dead letter and alarm). Terminated pods leave tombstones so that nothing
late re-allocates them, and a nomination of a pod bound here (or gone) is moot.

Retention (`agents.state.retention`, DESIGN.md rule 10): a hold released, rejected or
terminated, a tombstone, and the reservation entry of a hold that leaves are forgotten a
retention after the batch that finished them, measured in the log times of the node's records;
a claim read more than half the retention after its scheduling cycle began is rejected
(`REASON_STALE`).

Wound-wait between gangs (DESIGN.md, rule 6): a gang member's claim that does not fit, but
would once the held, not yet accepted, claims of lower-ranked gangs are gone, is rejected
softly; each such gang's decider gets a `Yield` naming its holds here, and the claimant is
nominated on the node so the capacity they free is its. Gangs rank by `gangs.rank` (priority,
then the gang's decision key): one rank per gang, computed the same by every owner and replica.
Owners report held gang claims (`NodeStateChange.gang_holds`) so that schedulers may claim such
capacity at all.

Reservations (`agents.state.reservations`) ride on the same machine: a claim that carries
`reserving` is a reservation; once committed it is Available and holds its remainder (what
its consumers have not taken). A claim that names a `reservation` consumes it first. The
owner reports the phase changes as ReservationEvents (an end event names the pods consuming
the reservation when it ended, recorded with the end: Koordinator's `status.currentOwners`,
which the rebalancer's jobs decide from), asks its agent for an expiry timer
(`OwnerResult.timers`) and ends the reservation when the `ReservationExpired` record the
timer appends comes back through the inbox. The ttl counts from the reservation's creation
time, or, without one, from the log time its claim was first read here (`HoldEntry.seen`).
A reservation that ends (consumed, expired, its node deleted) leaves like a finished pod:
its hold is terminated (`_fold`: it counts nothing once ended), its uid buried, and it is
deleted from `pods` (`_end_outputs`), so the scheduler and the decider forget it too.

`NodeOwner.apply(state, records, result, times, now)` is pure: it updates the state and adds to `result`
the outputs (Held / Rejected / Yield and PodTerminated to the deciders, feedback,
ReservationEvents, one `NodeStateChange` per batch for the schedulers' replicas), the problems
and the timers.

A NodeDeleted names the object it deleted (`uid`, the node's `metadata.uid`): a deletion
delivered again after the node was added again (the table already has the new node, another
uid) terminates nothing (`NodeOwner.deletes`). A deletion or a Node without a uid (records
written before uids were carried) deletes the node of that name, whichever it is.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from itertools import repeat
from typing import Any, TypeVar, final

from agents.ports import Entries, Output, Problem
from agents.state import admission, cpus, devices, gangs
from agents.state import reservations as rsv
from agents.state import usage as keys
from agents.state.resources import DEFAULT_MAX_PODS
from agents.state.retention import DEFAULT_RETENTION_S, expired, stale
from schemas import topics
from schemas.codec import decode_object, to_plain
from schemas.records import (
    BoundPod,
    Claim,
    Commit,
    CurrentOwner,
    GangHold,
    Held,
    HoldStatus,
    Node,
    NodeDeleted,
    NodeStateChange,
    Nomination,
    NominationCleared,
    NominationLapsed,
    PodDeleted,
    PodTerminated,
    Record,
    Rejected,
    Release,
    Reservation,
    ReservationEvent,
    ReservationExpired,
    ReservationState,
    ResourceList,
    SchedulingFeedback,
    Yield,
    carry,
    replace,
)

HELD, COMMITTED, RELEASED, REJECTED, TERMINATED = (HoldStatus.HELD, HoldStatus.COMMITTED, HoldStatus.RELEASED,
                                                   HoldStatus.REJECTED, HoldStatus.TERMINATED)
COUNTED = (HELD, COMMITTED)
FINISHED = (RELEASED, REJECTED, TERMINATED)

REASON_NODE_NOT_FOUND = "node not found"
REASON_NODE_UNSCHEDULABLE = "node is unschedulable"
REASON_POD_TERMINATED = "pod already terminated"
REASON_INSUFFICIENT = "Insufficient {}"
REASON_INSUFFICIENT_PREFIX = "Insufficient "
REASON_NODE_DELETED = "node deleted"
REASON_STALE = "the claim is older than half the state retention"

# Which input ended a hold or a reservation, when it was not a record about that pod
# (`HoldEntry.terminated_by`, a reservation entry's `ended_by`): a redelivery of that input
# re-sends what it caused.
BY_NODE_DELETED = "NodeDeleted"  # committed, then its node was deleted
BY_COMMIT_ON_DELETED_NODE = "Commit"  # committed after its node was deleted, terminated at once
BY_EXPIRY = "ReservationExpired"  # a reservation's expiry (else the hold id of the consumer that ended it)


@final
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
    created: float = 0.0  # the pod's creation time (reported in GangHold)
    soft: bool = False  # rejected while lower-ranked gangs were asked to yield
    fellow: bool = False  # rejected only for what fellow members of its own gang hold here
    yields: dict[str, list[str]] = field(default_factory=dict)  # loser gang -> its holds, asked to yield
    gang_waiting_s: float = 0.0  # as claimed: the Held re-sent on a redelivery carries them
    gang_strict: bool = True
    terminated_by: str = ""  # BY_NODE_DELETED or BY_COMMIT_ON_DELETED_NODE: that input re-sends its PodTerminated
    scheduled_at: float = 0.0  # as claimed: the Held or Rejected carries it
    finished: float = 0.0  # the log time it was released, rejected or terminated: forgotten a retention later
    # A reservation without a creation time (a user's manifest): the log time its claim was
    # first read here, from which its ttl counts (`NodeState.expires_at`).
    seen: float = 0.0
    sandbox: bool = False  # as claimed: reported with the bound pod
    warm_pool: str = ""

    def __setattr__(self, name: str, value: Any) -> None:
        attributes = self.__dict__  # (plain attributes: a store in the dict is what object.__setattr__ does)
        member: tuple[Holds, str] | None = attributes.get("_in")
        if member is not None and dict.get(member[0], member[1]) is self:
            holds = member[0]
            holds.changed[member[1]] = None
            if name in _TALLIED:
                holds.untally(self)
                attributes[name] = value
                holds.tally(self)
            else:
                attributes[name] = value
        else:
            attributes[name] = value
        attributes["_plain"] = None  # any change: `plain` computes again

    def __getstate__(self) -> dict[str, Any]:
        """A copy or a pickle is in no `Holds` (the one it is put into adopts it)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_in", "_plain")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def plain(self) -> dict[str, Any]:
        """As JSON, without the fields that hold their defaults (`HoldEntry(**plain)` restores
        them). Kept until a field is assigned (the cores assign fields, never change their
        contents in place): the same object means an unchanged hold, which the owners' table
        does not write again (`agents.adapters.tables`, "Split values")."""
        cached: dict[str, Any] | None = self.__dict__.get("_plain")
        if cached is None:
            cached = {k: v for k, v in self.__dict__.items()
                      if k in _HOLD_REQUIRED or (k in _HOLD_DEFAULTS and v != _HOLD_DEFAULTS[k])}
            object.__setattr__(self, "_plain", cached)
        return cached


_TALLIED = frozenset({"status", "requests", "reserving", "devices", "gang_min"})  # what `Holds` counts depends on


def _count(total: dict[str, int], names: dict[str, int], amounts: Iterable[tuple[str, int]], sign: int) -> None:
    """Add (`sign` 1) or take back (-1) one hold's amounts in a sum that keeps, per key, how
    many holds name it: a key leaves the sum when none does (as a pass over the holds gives)."""
    for name, amount in amounts:
        left = names.get(name, 0) + sign
        if left:
            names[name] = left
            total[name] = total.get(name, 0) + sign * amount
        else:
            del names[name], total[name]


V = TypeVar("V")


class Tracked(dict[str, V]):
    """A map that keeps which keys were set or removed since `NodeState.to_json` last looked
    (`changed`, in the order they changed), so that the table value is made from what changed:
    the node's tombstones (a mixed workload piles them up by the dozen on a node), and its
    holds (`Holds`). Every way of changing it goes through `__setitem__` and `__delitem__`."""

    def __init__(self, items: Mapping[str, V] | None = None) -> None:
        super().__init__(items or {})
        self.changed: dict[str, None] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        return Tracked, (dict(self),)

    def __setitem__(self, key: str, value: V) -> None:
        self.changed[key] = None
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self.changed[key] = None

    _MISSING: Any = object()

    def pop(self, key: str, default: Any = _MISSING) -> Any:
        if key not in self:
            if default is Tracked._MISSING:
                raise KeyError(key)
            return default
        value = self[key]
        del self[key]
        return value

    def popitem(self) -> tuple[str, V]:
        if not self:
            raise KeyError("popitem(): the map is empty")
        key = next(reversed(self))
        return key, self.pop(key)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def clear(self) -> None:
        for key in list(self):
            del self[key]

    def __ior__(self, other: Any) -> Tracked[V]:  # type: ignore[override,misc]
        self.update(other)
        return self


class Holds(Tracked[HoldEntry]):
    """One node's holds by hold id, keeping what `NodeState.used` sums: the requests of the
    counted holds (held or committed) that reserve nothing, per resource, and how many holds
    reserve (their part depends on the reservation's phase, which changes in place; while
    there are any, `used` sums afresh). And what `device_usage` sums (the devices of the
    counted holds) and how many gang members are held: a node with none answers its report's
    gang holds without a pass over its holds. And which hold ids were added, removed or had a
    field assigned since `NodeState.to_json` last looked (`changed`), so that the table value
    is made from what changed. Each hold knows the one `Holds` it is in, and tells it when one
    of its fields is assigned (the cores assign, never change a hold's fields in place:
    `HoldEntry.plain`). A hold put into another `Holds`, or under a second hold id, while it is
    still in the first: the first no longer hears of its changes, and its sums and table value
    are made afresh from then on (`tracked`). The cores never do either."""

    def __init__(self, items: Mapping[str, HoldEntry] | None = None) -> None:
        super().__init__()  # empty: the holds are put one by one below, tallied
        self.total: dict[str, int] = {}
        self.names: dict[str, int] = {}  # resource -> counted holds that name it (a key of `total` while > 0)
        self.reserving = 0
        self.with_devices = 0
        # `device_usage`'s sum: amounts per key, how many counted holds name each key, and how
        # many mark each CPU key used (a CPU is 1 while any does).
        self.device_total: dict[str, int] = {}
        self.device_names: dict[str, int] = {}
        self.device_marks: dict[str, int] = {}
        self.gang_held = 0
        self.tracked = True
        for hid, hold in (items or {}).items():
            self[hid] = hold

    def __reduce__(self) -> tuple[Any, ...]:
        """Copied or pickled as its holds: the copy tallies them afresh."""
        return Holds, (dict(self),)

    def tally(self, hold: HoldEntry, sign: int = 1) -> None:
        if hold.status not in COUNTED:
            return
        if hold.devices:
            self.with_devices += sign
            added, marked = devices.usage_of(tuple(hold.devices))
            _count(self.device_total, self.device_names, added, sign)
            marks = self.device_marks
            for key in marked:
                left = marks.get(key, 0) + sign
                if left:
                    marks[key] = left
                else:
                    del marks[key]
        if hold.status == HELD and hold.gang_min > 1:
            self.gang_held += sign
        if hold.reserving is not None:
            self.reserving += sign
            return
        _count(self.total, self.names, hold.requests.items(), sign)

    def untally(self, hold: HoldEntry) -> None:
        self.tally(hold, -1)

    def _adopt(self, hid: str, hold: HoldEntry) -> None:
        attributes = hold.__dict__
        before: tuple[Holds, str] | None = attributes.get("_in")
        if before is not None and dict.get(before[0], before[1]) is hold:
            before[0].tracked = False  # still there too: that tally no longer follows this hold
        attributes["_in"] = (self, hid)
        self.tally(hold)

    def _leave(self, hid: str, hold: HoldEntry) -> None:
        self.untally(hold)
        member = hold.__dict__.get("_in")
        if member is not None and member[0] is self and member[1] == hid:
            del hold.__dict__["_in"]

    def __setitem__(self, hid: str, hold: HoldEntry) -> None:
        old = self.get(hid)
        if old is hold:
            return
        super().__setitem__(hid, hold)
        if old is not None:
            self._leave(hid, old)
        self._adopt(hid, hold)

    def __delitem__(self, hid: str) -> None:
        hold = self[hid]
        super().__delitem__(hid)
        self._leave(hid, hold)


def _entries_of(current: dict[str, Any], kept: tuple[dict[str, Any], object] | None,
                changed: Iterable[str] | None) -> Entries:
    """`current` as a split field's table value: against the map last made (`kept`: the map
    it was made from and its token), naming what `changed` since, when it is the same map and
    its changes are known (else None: the table compares every entry)."""
    if changed is not None and kept is not None and kept[0] is current:
        return Entries(current, kept[1], list(changed))
    return Entries(current)


def _quick_hold_init() -> None:
    """Give `HoldEntry` an `__init__` that stores its fields straight into the new object's
    dict: what the dataclass's `__init__` leaves there (through `__setattr__`, which for an
    object in no `Holds` stores the value and clears `_plain`), at a third of the cost. The
    owners make a hold per claim; `tests/unit/test_holds_tally.py` checks that both build the
    same holds. So a hold is made once (never initialised again while in a `Holds`, whose
    tallies would not see it) and `HoldEntry` is final (a subclass's `__setattr__` would not
    run at its creation)."""
    original = inspect.signature(HoldEntry.__init__).parameters
    params, body, scope = ["self"], ["    d = self.__dict__"], {}
    for index, f in enumerate(fields(HoldEntry)):
        if f.default is not MISSING:
            scope[f"default{index}"] = f.default
            params.append(f"{f.name}=default{index}")
            value = f.name
        elif f.default_factory is not MISSING:
            # The marker dataclasses gives such a parameter as its default: the same signature.
            scope[f"factory{index}"], scope["marker"] = f.default_factory, original[f.name].default
            params.append(f"{f.name}=marker")
            value = f"factory{index}() if {f.name} is marker else {f.name}"
        else:
            params.append(f.name)
            value = f.name
        body.append(f"    d[{f.name!r}] = {value}")
        if index == 0:
            body.append("    d['_plain'] = None")  # where `__setattr__` puts it first
    exec(f"def __init__({', '.join(params)}):\n" + "\n".join(body), scope)  # noqa: S102 - from the fields above
    init = scope["__init__"]
    init.__qualname__, init.__module__ = "HoldEntry.__init__", __name__
    init.__annotations__ = dict(HoldEntry.__init__.__annotations__)
    HoldEntry.__dataclass_init__ = HoldEntry.__init__  # type: ignore[attr-defined]  # kept for the test
    HoldEntry.__init__ = init  # type: ignore[method-assign]


_quick_hold_init()
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
    nominated_at: dict[str, float] = field(default_factory=dict)  # uid -> the log time its nomination was recorded
    tombstones: dict[str, float] = field(default_factory=dict)  # uid -> the log time it was terminated here
    seq: int = 0
    record: dict[str, Any] | None = None  # the Node as last published, as plain JSON
    # uid -> {hold, phase}; once ended also {reason, allocated, ended_by}: the event its end sent
    reservations: dict[str, dict[str, Any]] = field(default_factory=dict)

    # The log time after which something this node finished may be forgotten (None: not known,
    # as after a restore; the next batch looks at everything): `NodeOwner._forget`.
    _sweep_after: float | None = field(default=None, init=False, repr=False, compare=False)
    _unstamped: list[str] = field(default_factory=list, init=False, repr=False, compare=False)  # new tombstones
    # Holds newly held by batches that sent no report (`NodeOwner.apply`), in order: the next
    # report names them too. Not kept in the table: after a restore the scheduler that claimed
    # them counts them twice (its assumption and the owner's `used`) until their next report.
    _unreported: dict[str, None] = field(default_factory=dict, init=False, repr=False, compare=False)
    # (the holds it was made of, their table map, that map's `Entries.token`) as `to_json` last made it
    _holds_plain: tuple[dict[str, HoldEntry], dict[str, dict[str, Any]], object] | None = field(
        default=None, init=False, repr=False, compare=False)

    # (the tombstones, the record) as `to_json` last gave them, with their `Entries.token`s
    _tombstones_made: tuple[dict[str, float], object] | None = field(default=None, init=False, repr=False,
                                                                    compare=False)
    _record_made: tuple[dict[str, Any], object] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.holds, Holds):
            self.holds = Holds(self.holds)
        self.tombstones = Tracked(self.tombstones)  # its own (`dataclasses.replace` passes the map it had)

    def __getstate__(self) -> dict[str, Any]:
        """A copy or a pickle makes its next table value afresh: its holds are tallied anew,
        and what changed before the copy (a hold removed) is not known to them."""
        return {**self.__dict__, "tombstones": Tracked(self.tombstones),  # changes seen by one copy alone
                "_holds_plain": None, "_tombstones_made": None, "_record_made": None}

    def nominate(self, nomination: Nomination, at: float) -> None:
        self.nominations[nomination.uid] = nomination
        self.nominated_at[nomination.uid] = at

    def drop_nomination(self, uid: str) -> None:
        self.nominations.pop(uid, None)
        self.nominated_at.pop(uid, None)

    def bury(self, uid: str) -> None:
        """A tombstone for `uid`, its time the batch's (`NodeOwner._forget` stamps it)."""
        if uid not in self.tombstones:
            self.tombstones[uid] = 0.0
            self._unstamped.append(uid)

    def used(self, ignoring: frozenset[str] = frozenset()) -> dict[str, int]:
        """Pods' full requests, plus what each reservation still holds for its consumers
        (less the holds in `ignoring`).

        An owner asks this about four times per pod (the claim, its commit, and the report
        after each): the holds keep the sum as they change (`Holds`), so it costs no pass
        over them. Summed afresh with reservations (their phases change in place)."""
        holds = self.holds
        if ignoring or self.reservations or not isinstance(holds, Holds) or holds.reserving or not holds.tracked:
            total = self.count_used(ignoring)
        else:
            total = holds.total
        return dict(sorted(total.items()))  # by name: a report sent again after a restore is the same bytes

    def count_used(self, ignoring: frozenset[str] = frozenset()) -> dict[str, int]:
        """`used`, summed afresh."""
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

    def gang_held(self) -> bool:
        """Whether a gang member is held here (False only when the holds' tally says so)."""
        holds = self.holds
        return not isinstance(holds, Holds) or not holds.tracked or holds.gang_held > 0

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

    def expires_at(self, uid: str) -> float | None:
        """When reservation `uid` expires (log time; None: never). Its ttl counts from its
        creation time, or, for one that has none, from the log time its claim was first read
        here (`HoldEntry.seen`): recorded with the hold, so a replay or a restore arms the
        same expiry."""
        hold = self.holds[self.reservations[uid]["hold"]]
        reservation = self.reservation(uid)
        if not reservation.creation_timestamp and hold.seen:
            reservation = replace(reservation, creation_timestamp=hold.seen)
        return reservation.expires_at

    def available_reservations(self) -> tuple[ReservationState, ...]:
        out = []
        consumed = self.consumptions()
        for uid, entry in sorted(self.reservations.items()):
            if entry["phase"] == rsv.AVAILABLE:
                taken, count = consumed.get(uid, ({}, 0))
                out.append(ReservationState(self.reservation(uid), ResourceList(taken), count))
        return tuple(out)

    def promised(self, priority: int, uid: str) -> list[Nomination]:
        """The nominations here that count against a claim of pod `uid` at `priority`
        (`admission.counts_against`)."""
        return [n for n in self.nominations.values() if admission.counts_against(n.priority, n.uid, priority, uid)]

    def device_usage(self, ignoring: frozenset[str] = frozenset()) -> dict[str, int]:
        """Per device, what committed and held claims use (less the holds in `ignoring`): GPU
        core and memory-ratio, RDMA virtual functions, bound CPUs and NUMA memory per cell."""
        holds = self.holds
        if isinstance(holds, Holds) and holds.tracked:
            if not holds.with_devices:
                return {}
            if not any(hid in holds and holds[hid].devices and holds[hid].status in COUNTED for hid in ignoring):
                usage = dict(holds.device_total)
                for key in holds.device_marks:
                    usage[key] = 1
                return usage
        usage = {}
        for hid, hold in holds.items():
            if hold.status in COUNTED and hid not in ignoring:
                devices.add_usage(usage, hold.devices)
        return usage

    def nics(self) -> dict[int, int]:
        """minor -> virtual functions, from the Node record."""
        return {int(n["minor"]): int(n.get("vfs", 0)) for n in (self.record or {}).get("rdma", ())}

    def gpus(self) -> dict[int, tuple[int, int]]:
        """minor -> (core, memory-ratio) capacity, from the Node record."""
        return {int(g["minor"]): (int(g.get("core", 100)), int(g.get("memory_ratio", 100)))
                for g in (self.record or {}).get("gpus", ())}

    def _holds_json(self) -> Entries:
        """The holds as the table value carries them (`HoldEntry.plain` by hold id, in the
        holds' order): the map made for the last value, with what changed since made again;
        it tells the table which entries those are (`Entries`)."""
        holds = self.holds
        kept = self._holds_plain
        if kept is None or kept[0] is not holds or not isinstance(holds, Holds) or not holds.tracked:
            plain = {hid: h.plain() for hid, h in holds.items()}
            made = Entries(plain)
        else:
            plain = kept[1]
            for hid in holds.changed:
                hold = dict.get(holds, hid)
                if hold is None:
                    plain.pop(hid, None)
                else:
                    plain[hid] = hold.plain()
            made = Entries(plain, kept[2], list(holds.changed))
        if isinstance(holds, Holds):
            holds.changed.clear()
        self._holds_plain = (holds, plain, made.token)
        return made  # a copy: the table's value never changes behind it

    def _tombstones_json(self) -> Entries:
        tombstones = self.tombstones
        changed = tombstones.changed if isinstance(tombstones, Tracked) else None
        made = _entries_of(tombstones, self._tombstones_made, changed)
        if changed is not None:
            changed.clear()
        self._tombstones_made = (tombstones, made.token)
        return made

    def _record_json(self) -> Entries:
        """The Node record as a map written field by field ({} while none). The cores replace
        the record whole, never change it in place: the same object is the same record."""
        record = self.record or {}
        made = _entries_of(record, self._record_made, () if self.record is not None else None)
        self._record_made = (record, made.token)
        return made

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "exists": self.exists,
            "allocatable": self.allocatable,
            "unschedulable": self.unschedulable,
            "holds": self._holds_json(),
            "nominations": {uid: to_plain(n) for uid, n in self.nominations.items()},
            "nominated_at": self.nominated_at,
            "tombstones": self._tombstones_json(),
            "seq": self.seq,
            "record": self._record_json(),
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
            nominated_at=dict(raw.get("nominated_at") or {}),  # none in states written before nominations lapsed
            # A list in states written before tombstones had times: their retention starts now.
            tombstones=(dict(raw["tombstones"]) if isinstance(raw["tombstones"], dict)
                        else dict.fromkeys(raw["tombstones"], 0.0)),
            seq=raw["seq"],
            record=raw.get("record") or None,
            reservations={uid: dict(e) for uid, e in (raw.get("reservations") or {}).items()},
        )


@dataclass
class OwnerResult:
    outputs: list[Output] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    timers: list[tuple[str, str, float]] = field(default_factory=list)  # (node, reservation uid, expires at)
    lapses: list[tuple[str, str, float]] = field(default_factory=list)  # (node, nominated uid, since): `NominationLapsed`


R = TypeVar("R", bound=Record)


def _quietly_held(claim: Claim, hold: HoldEntry | None) -> bool:
    """The claim made a plain hold: held, and nothing of it that the report's other fields
    carry (a gang's held members, devices, reservations, nominations), nor counted against an
    elastic quota (its decider may deny it and requeue the pod at once: the claimer then drops
    its assumption, and only the report shows the hold until its Release is reported)."""
    return (hold is not None and hold.status == HELD and claim.gang_min <= 1 and not claim.devices
            and not claim.reservation and claim.reserving is None and not claim.nominated_node
            and not claim.quota)


def _less(amounts: dict[str, int], taken: dict[str, int]) -> dict[str, int]:
    return {name: max(amount - taken.get(name, 0), 0) for name, amount in amounts.items()}


def _decode(raw: dict[str, Any], kind: type[R]) -> R:
    record = decode_object(raw, kind)
    assert isinstance(record, kind)
    return record


def _differences(hold: HoldEntry, claim: Claim) -> list[str]:
    """The claim's fields that differ from the claim recorded in `hold` (same hold id). The
    gang's waiting time and mode are left out: they are the decider's, and states written
    before they were recorded hold their defaults."""
    out = [name for name, mine, theirs in (
        ("decision_key", hold.decision_key, claim.decision_key),
        ("requests", hold.requests, dict(claim.requests)),
        ("priority", hold.priority, claim.priority),
        ("devices", hold.devices, list(claim.devices)),
        ("gang_min", hold.gang_min, claim.gang_min),
        ("nominated_node", hold.nominated_node, claim.nominated_node),
        ("namespace", hold.namespace, claim.namespace),
        ("name", hold.name, claim.name),
        ("quota", hold.quota, claim.quota),
        ("creation_timestamp", hold.created, claim.creation_timestamp),
        ("reserving", hold.reserving, to_plain(claim.reserving) if claim.reserving is not None else None),
    ) if mine != theirs]
    if hold.status != REJECTED and hold.reservation != claim.reservation:  # recorded for held claims only
        out.append("reservation")
    return out


class NodeOwner:
    """Applies a batch of one node's inbox records to its state (see module docstring)."""

    def __init__(self, retention_s: float = DEFAULT_RETENTION_S) -> None:
        self.retention_s = retention_s

    @staticmethod
    def lapses(state: NodeState) -> list[tuple[str, str, float]]:
        """(node, uid, since) of every nomination here: the lapse timers a restored node needs."""
        return [(state.name, uid, state.nominated_at.get(uid, 0.0)) for uid in sorted(state.nominations)]

    def apply(self, state: NodeState, records: Iterable[Record], result: OwnerResult,
              times: Iterable[float] | None = None, now: float = 0.0) -> NodeState:
        """`times`: each record's log time; `now`: the newest log time of the batch (by
        default unknown: no claim is stale, nothing is forgotten)."""
        report: dict[str, None] = {}  # hold ids the batch is about, in order: reported as they are now
        node_changed = False
        seen = False
        quiet = True  # only plain claims newly held so far: see below
        holds = state.holds
        for record, t in zip(records, times if times is not None else repeat(0.0), strict=False):
            seen = True
            now = max(now, t)
            hid = record.hold_id if quiet and isinstance(record, Claim) else ""  # a new hold, if any
            fresh = bool(hid) and hid not in holds
            self._apply_one(state, record, result, report, t, now)
            node_changed |= isinstance(record, (Node, NodeDeleted))
            quiet = fresh and _quietly_held(record, holds.get(hid))  # type: ignore[arg-type]
        if seen:
            state.seq += 1
            if quiet:
                # Every batch reports (so a report lost in a crash is re-sent by the replay), except
                # one whose records only made plain holds (`_quietly_held`): what it changed, the
                # scheduler that claimed them assumes already, and the next report (their
                # commit's, at the latest) names them. A spread placement saves one report of its
                # two a pod (docs/architecture.md, "Data flow").
                state._unreported.update(report)
            else:
                if state._unreported:
                    report = {**state._unreported, **report}
                    state._unreported.clear()
                result.outputs.append(Output(topics.STATE_CHANGES, state.name,
                                             self._report(state, report, node_changed)))
        self._forget(state, report, now)
        return state

    def _forget(self, state: NodeState, report: dict[str, None], now: float) -> None:
        """Stamp what the batch finished (holds released, rejected or terminated; tombstones)
        with `now`, and forget what finished more than the retention before it: the node
        state holds what is live (allocatable, committed and held pods, nominations,
        reservations) and what a late or redelivered record may still need."""
        if not now:  # no log time to stamp with: the next batch that has one looks at everything
            if any(h is not None and h.status in FINISHED and not h.finished for h in map(state.holds.get, report)):
                state._sweep_after = None
            return
        retention = self.retention_s
        stamped = False
        for hid in report:
            hold = state.holds.get(hid)
            if hold is not None and hold.status in FINISHED and not hold.finished:
                hold.finished = now
                stamped = True
        tombstones = state.tombstones
        for uid in state._unstamped:
            if tombstones.get(uid) == 0.0:
                tombstones[uid] = now
                stamped = True
        state._unstamped.clear()
        after = state._sweep_after
        if after is not None:
            # Nothing expires before the first time stamped expires: only then a pass over the
            # node (what a batch finishes, it stamps above). Forgetting is never earlier than
            # the retention says; what an earlier pass missed (a hold that finished outside a
            # report) is stamped, and forgotten, a pass later.
            state._sweep_after = min(after, now + retention) if stamped else after
            if now <= after:
                return
        gone = []
        first = float("inf")
        for hid, hold in state.holds.items():
            if hold.status in FINISHED:
                if not hold.finished:  # a state written before holds had times: from now
                    hold.finished = now
                if expired(hold.finished, now, retention):
                    gone.append(hid)
                else:
                    first = min(first, hold.finished)
        for hid in gone:
            hold = state.holds.pop(hid)
            entry = state.reservations.get(hold.uid)
            if entry is not None and entry["hold"] == hid:
                del state.reservations[hold.uid]
        for uid, at in list(tombstones.items()):
            if not at:
                tombstones[uid] = at = now
            if expired(at, now, retention):
                del tombstones[uid]
            else:
                first = min(first, at)
        state._sweep_after = first + retention

    @staticmethod
    def current(state: NodeState) -> NodeStateChange:
        """The node as it is now, in one report: every hold it keeps, with the Node record (what
        a starting scheduler replica reads instead of the reports' history)."""
        return NodeOwner._report(state, dict.fromkeys(state.holds), node_changed=True)

    @staticmethod
    def _report(state: NodeState, report: dict[str, None], node_changed: bool) -> NodeStateChange:
        reported = [(hid, state.holds[hid]) for hid in report]
        return NodeStateChange(
            node=state.name,
            seq=state.seq,
            allocatable=ResourceList(state.allocatable),
            used=ResourceList(state.used()),
            unschedulable=state.unschedulable,
            deleted=not state.exists,
            holds={hid: h.status for hid, h in reported},
            node_record=_decode(state.record, Node) if node_changed and state.record else None,
            nominations=tuple(state.nominations.values()),
            device_usage=state.device_usage(),
            committed=tuple(
                BoundPod(uid=h.uid, namespace=h.namespace, name=h.name, priority=h.priority,
                         requests=ResourceList(h.requests), quota=h.quota, devices=tuple(h.devices),
                         decision_key=h.decision_key, sandbox=h.sandbox, warm_pool=h.warm_pool)
                for _, h in reported if h.status == COMMITTED and h.reserving is None  # a reservation is no victim
            ),
            reservations=state.available_reservations() if state.reservations else (),
            gang_holds=tuple(
                GangHold(hold_id=hid, decision_key=h.decision_key, priority=h.priority, created=h.created,
                         requests=ResourceList(h.requests))
                for hid, h in state.holds.items() if h.status == HELD and h.gang_min > 1
            ) if state.gang_held() else (),
        )

    def _apply_one(self, state: NodeState, record: Record, result: OwnerResult, report: dict[str, None],
                   t: float, now: float) -> None:
        if isinstance(record, Claim):
            self._claim(state, record, result, report, t, now)
        elif isinstance(record, Commit):
            self._commit(state, record, result, report)
        elif isinstance(record, Release):
            hold = state.holds.get(record.hold_id)
            if hold is not None:
                if hold.status == HELD:
                    hold.status = RELEASED
                report[record.hold_id] = None
        elif isinstance(record, PodTerminated):
            self._pod_terminated(state, record.uid, report, result)
        elif isinstance(record, ReservationExpired):
            self._expired(state, record.uid, result, report)
        elif isinstance(record, Node):
            state.record = to_plain(record)
            state.exists = True
            state.allocatable = devices.node_gpu_totals(record.allocatable, record.gpus, record.rdma)
            state.allocatable.setdefault("pods", DEFAULT_MAX_PODS)
            state.unschedulable = record.unschedulable
        elif isinstance(record, NodeDeleted):
            self._node_deleted(state, record, result, report)
        elif isinstance(record, Nomination):
            if not self._placed_here(state, record.uid):  # moot once the pod is bound here (or gone)
                self._nominate(state, record, result, now)
        elif isinstance(record, NominationCleared):
            state.drop_nomination(record.uid)
        elif isinstance(record, NominationLapsed):
            if record.uid in state.nominations and state.nominated_at.get(record.uid, 0.0) == record.since:
                state.drop_nomination(record.uid)  # not made again since its timer was armed
        else:
            result.problems.append(Problem("kind", record.KIND, f"{record.KIND} does not belong on node-inbox", record))

    @staticmethod
    def _nominate(state: NodeState, nomination: Nomination, result: OwnerResult, now: float) -> None:
        """Record the nomination with the batch's log time, and ask for its lapse timer (rule 8:
        a nomination whose preemptor is never bound, or a copy of a cleared one delivered late,
        does not stay)."""
        state.nominate(nomination, now)
        result.lapses.append((state.name, nomination.uid, now))

    # -- claims -------------------------------------------------------------------------------

    def _claim(self, state: NodeState, claim: Claim, result: OwnerResult, report: dict[str, None], t: float,
               now: float) -> None:
        hid = claim.hold_id
        hold = state.holds.get(hid)
        if hold is None:
            hold = self._decide(state, claim, stale(claim.scheduled_at, t, self.retention_s), result, now)
            if claim.reserving is not None and not claim.reserving.creation_timestamp:
                hold.seen = t  # a user's manifest has no creation time: its ttl counts from here
            state.holds[hid] = hold
        else:  # redelivered: the recorded answer again, nothing changes
            differs = _differences(hold, claim)
            if differs:
                result.problems.append(Problem(
                    "hold_id", hid,
                    f"Claim differs from the claim recorded for this hold id in {', '.join(differs)}; "
                    "answered with the recorded outcome", claim,
                ))
        report[hid] = None
        self._answer(state, hold, result)

    def _decide(self, state: NodeState, claim: Claim, too_old: bool, result: OwnerResult, now: float) -> HoldEntry:
        """A new claim: hold it, or reject it (asking lower-ranked gangs to yield when that
        would make it fit; refusing it outright when it is too old to act on); the outcome,
        recorded."""
        reason = REASON_STALE if too_old else self._refusal(state, claim)
        yields = self._yields(state, claim) if reason.startswith(REASON_INSUFFICIENT_PREFIX) else {}
        if yields:
            reason = f"waiting for gang(s) {', '.join(sorted(yields))} to yield the capacity (wound-wait)"
        fellow = bool(reason) and not yields and self._fellows_only(state, claim)
        if fellow:
            reason += " (held by fellow members of its gang)"
        hold: HoldEntry = carry(  # the claim's fields of the same names, and:
            HoldEntry, claim, requests=dict(claim.requests), status=REJECTED if reason else HELD, reason=reason,
            reservation="", reserving=to_plain(claim.reserving) if claim.reserving is not None else None,
            created=claim.creation_timestamp, soft=bool(yields), fellow=fellow, yields=yields,
        )
        if yields:  # the winner is promised what the losers free (DESIGN.md, rule 6)
            self._nominate(state, Nomination(uid=claim.uid, node=state.name, priority=claim.priority,
                                             requests=claim.requests, devices=claim.devices), result, now)
        if claim.reservation and not reason:
            hold.reservation = claim.reservation
            hold.consumed = rsv.consumed(claim.requests, state.remaining(claim.reservation))
        return hold

    @staticmethod
    def _answer(state: NodeState, hold: HoldEntry, result: OwnerResult) -> None:
        """The claim's answer (Held, or Rejected and the Yields it asked for), from the record."""
        if hold.status == REJECTED:
            result.outputs.append(Output(topics.HOLDS, hold.decision_key, Rejected(
                uid=hold.uid, attempt=hold.attempt, node=state.name,
                decision_key=hold.decision_key, reason=hold.reason, soft=hold.soft, fellow=hold.fellow,
                scheduled_at=hold.scheduled_at,
            )))
            for key, holds in sorted(hold.yields.items()):
                result.outputs.append(Output(topics.HOLDS, key, Yield(
                    decision_key=key, node=state.name, holds=tuple(holds), winner=hold.decision_key,
                )))
        else:  # held, and whatever became of it since: the answer was Held
            result.outputs.append(Output(topics.HOLDS, hold.decision_key, carry(Held, hold, node=state.name)))

    # -- commit -------------------------------------------------------------------------------

    def _commit(self, state: NodeState, commit: Commit, result: OwnerResult, report: dict[str, None]) -> None:
        hid = commit.hold_id
        hold = state.holds.get(hid)
        if hold is not None:
            report[hid] = None
        if hold is not None and hold.status == HELD:
            misfit = self._misfit(state, hid, hold)
            hold.status = COMMITTED
            if not misfit:
                self._committed(state, hid, hold)
            else:  # its node is gone, or no longer fits it: terminated at once, as Kubernetes' pod GC does (rule 9)
                hold.terminated_by = BY_COMMIT_ON_DELETED_NODE
                if misfit != REASON_NODE_DELETED:
                    hold.reason = misfit  # recorded: its redelivery re-sends the same termination
                self._terminate(state, hold.uid)
                if hold.reserving is not None:
                    failed = rsv.REASON_NODE_DELETED if misfit == REASON_NODE_DELETED else misfit
                    state.reservations[hold.uid] = {"hold": hid, "phase": rsv.FAILED, "reason": failed,
                                                    "allocated": {}, "ended_by": hid,
                                                    "owners": []}
        elif hold is None or hold.status not in (COMMITTED, TERMINATED):
            result.problems.append(Problem(
                "hold_id", hid,
                f"Commit for a hold that is not held (state: {hold.status if hold else 'unknown'})", commit,
            ))
            return
        state.drop_nomination(hold.uid)  # bound here: its nomination is moot
        if hold.terminated_by == BY_COMMIT_ON_DELETED_NODE:  # (a redelivery too: its first report may be lost)
            report.update((other, None) for other, h in state.holds.items() if h.uid == hold.uid)
        self._commit_outputs(state, hid, hold, result, report)

    def _committed(self, state: NodeState, hid: str, hold: HoldEntry) -> None:
        """A reservation becomes Available; a pod consuming an allocate-once reservation ends
        it, and the reservation's hold folds away (`_fold`)."""
        if hold.reserving is not None:
            state.reservations[hold.uid] = {"hold": hid, "phase": rsv.AVAILABLE}
        elif hold.reservation:
            entry = state.reservations.get(hold.reservation)
            if entry is not None and entry["phase"] == rsv.AVAILABLE and state.reservation(hold.reservation).allocate_once:
                self._end_reservation(state, hold.reservation, rsv.SUCCEEDED, "", ended_by=hid)
                self._fold(state, hold.reservation)

    def _commit_outputs(self, state: NodeState, hid: str, hold: HoldEntry, result: OwnerResult,
                        report: dict[str, None]) -> None:
        """What a Commit sends, the first time and whenever it is redelivered, from the record:
        a ghost's termination and feedback; a reservation's Available event and expiry timer
        (then its end, if it ended since, so the last event is its phase now); the end of the
        reservation whose commit ended it."""
        if hold.terminated_by == BY_COMMIT_ON_DELETED_NODE:
            reason = hold.reason or REASON_NODE_DELETED
            happened = (f"node {state.name} was deleted" if reason == REASON_NODE_DELETED
                        else f"the claim stopped fitting node {state.name} ({reason}: deleted and added again, "
                             "or updated, since it was held)")
            result.outputs.append(Output(topics.HOLDS, hold.decision_key, PodTerminated(
                uid=hold.uid, node=state.name, decision_key=hold.decision_key, reason=reason,
            )))
            result.outputs.append(Output(topics.FEEDBACK, hold.uid, SchedulingFeedback(
                uid=hold.uid, namespace=hold.namespace, name=hold.name, attempt=hold.attempt,
                message=f"{happened} before the pod's binding was committed there: "
                        "the pod is terminated (as Kubernetes' pod garbage collector does)",
                reasons={reason: 1},
            )))
        if hold.reserving is not None:
            if hold.terminated_by != BY_COMMIT_ON_DELETED_NODE:
                result.outputs.append(self._event(state, hold, rsv.AVAILABLE, "", {}))
                expires_at = state.expires_at(hold.uid)
                if expires_at is not None:
                    result.timers.append((state.name, hold.uid, expires_at))
            entry = state.reservations.get(hold.uid)
            if entry is not None and "ended_by" in entry:
                self._end_outputs(state, hold.uid, result, report)
        elif hold.reservation:
            entry = state.reservations.get(hold.reservation)
            if entry is not None and entry.get("ended_by") == hid:
                self._end_outputs(state, hold.reservation, result, report)

    # -- reservations -------------------------------------------------------------------------

    @staticmethod
    def _end_reservation(state: NodeState, uid: str, phase: str, reason: str, ended_by: str) -> None:
        """An available reservation stops holding its remainder (its consumers keep theirs).
        Recorded with what was allocated when it ended, which input ended it, and the pods
        that consumed it then (its current owners: every redelivery's event names the same)."""
        entry = state.reservations[uid]
        owners = [[h.uid, h.namespace, h.name] for h in state.holds.values()
                  if h.reservation == uid and h.status in COUNTED]
        entry.update(phase=phase, reason=reason, allocated=dict(state.consumption(uid)[0]), ended_by=ended_by,
                     owners=sorted(owners))

    @staticmethod
    def _fold(state: NodeState, uid: str) -> None:
        """An ended reservation (consumed or expired) leaves the node like a finished pod: its
        committed hold is terminated (it counts nothing once not available, so nothing is freed
        twice: its consumers count in full) and forgotten a retention later with its entry; a
        tombstone keeps a late claim of it from holding here again."""
        hold = state.holds[state.reservations[uid]["hold"]]
        if hold.status == COMMITTED:
            hold.status = TERMINATED
        state.bury(uid)

    def _expired(self, state: NodeState, uid: str, result: OwnerResult, report: dict[str, None]) -> None:
        entry = state.reservations.get(uid)
        if entry is None:
            return
        if entry["phase"] == rsv.AVAILABLE:
            self._end_reservation(state, uid, rsv.FAILED, rsv.REASON_EXPIRED, ended_by=BY_EXPIRY)
            self._fold(state, uid)
        if entry.get("ended_by") == BY_EXPIRY:  # the first time, and on every redelivery
            self._end_outputs(state, uid, result, report)

    def _end_outputs(self, state: NodeState, uid: str, result: OwnerResult, report: dict[str, None]) -> None:
        """What an ended reservation sends, whenever the input that ended it comes again: its
        end event, and its deletion on `pods`. An ended reservation is never scheduled again,
        so it leaves the scheduling input as a deleted pod does: the scheduler that has it
        forgets it and forwards the deletion to its decider, whose ledger then forgets it by
        the retention rules; a replica that reads `pods` again reads the deletion after the
        reservation. Its hold is reported (terminated)."""
        entry = state.reservations[uid]
        hold = state.holds[entry["hold"]]
        assert hold.reserving is not None
        result.outputs.append(self._end_event(state, uid))
        result.outputs.append(Output(topics.PODS, uid, PodDeleted(
            uid=uid, name=hold.reserving["name"], namespace="", decision_key=hold.decision_key,
        )))
        report[entry["hold"]] = None

    def _end_event(self, state: NodeState, uid: str) -> Output:
        entry = state.reservations[uid]
        owners = entry.get("owners")
        if owners is None:  # ended by an owner older than the record of its owners: its consumer, if known
            consumer = state.holds.get(entry.get("ended_by", ""))
            owners = ([[consumer.uid, consumer.namespace, consumer.name]]
                      if consumer is not None and consumer.reservation == uid else [])
        return self._event(state, state.holds[entry["hold"]], entry["phase"], entry.get("reason", ""),
                           entry.get("allocated", {}), tuple(CurrentOwner(*o) for o in owners))

    @staticmethod
    def _event(state: NodeState, hold: HoldEntry, phase: str, reason: str, allocated: dict[str, int],
               current_owners: tuple[CurrentOwner, ...] = ()) -> Output:
        assert hold.reserving is not None
        return Output(topics.RESERVATIONS, hold.uid, ReservationEvent(
            name=hold.reserving["name"], uid=hold.uid, phase=phase, node=state.name, reason=reason,
            requests=ResourceList(hold.requests), allocated=ResourceList(allocated), current_owners=current_owners,
        ))

    # -- terminations and deletions -----------------------------------------------------------

    @staticmethod
    def _terminate(state: NodeState, uid: str) -> None:
        """The pod's committed holds here end (the caller reports every hold of the pod)."""
        state.bury(uid)
        for hold in state.holds.values():
            if hold.uid == uid and hold.status == COMMITTED:
                hold.status = TERMINATED

    def _pod_terminated(self, state: NodeState, uid: str, report: dict[str, None], result: OwnerResult) -> None:
        """The pod is gone. Its decider is told when the pod counts against an elastic quota
        (the decider then gives its grant back to the quota's ledger: only once the capacity
        here is freed, so the quota is never free before the node); re-sent on redelivery."""
        self._terminate(state, uid)
        for hid, hold in state.holds.items():
            if hold.uid == uid:
                report[hid] = None
                if hold.quota and hold.status == TERMINATED and not hold.terminated_by:
                    result.outputs.append(Output(topics.HOLDS, hold.decision_key, PodTerminated(
                        uid=uid, node=state.name, decision_key=hold.decision_key, reason="pod terminated")))
        state.drop_nomination(uid)  # gone: its nomination is moot
        entry = state.reservations.get(uid)
        if entry is not None and entry["phase"] == rsv.AVAILABLE:  # a reservation deleted
            entry["phase"] = rsv.DELETED

    @staticmethod
    def deletes(state: NodeState, deleted: NodeDeleted) -> bool:
        """Whether the deletion is of the node object the owner has: the same uid, or either
        uid unknown (a record written before uids were carried: the node of that name). A
        deletion of another object of the name (one deleted before the node was added again,
        delivered again after that) deletes nothing."""
        current = (state.record or {}).get("uid", "")
        return not deleted.uid or not current or deleted.uid == current

    def _node_deleted(self, state: NodeState, deleted: NodeDeleted, result: OwnerResult,
                      report: dict[str, None]) -> None:
        """Available reservations fail and committed pods are terminated (their deciders told);
        open holds wait for their deciders. A redelivered deletion re-sends what it sent. The
        deletion of an earlier object of the name (`deletes`) changes nothing: it re-sends
        what the deletions of the node sent, as a redelivery does."""
        if state.exists and self.deletes(state, deleted):
            state.exists = False
            for uid, entry in state.reservations.items():
                if entry["phase"] == rsv.AVAILABLE:
                    self._end_reservation(state, uid, rsv.FAILED, rsv.REASON_NODE_DELETED, ended_by=BY_NODE_DELETED)
            for hold in state.holds.values():
                if hold.status == COMMITTED:
                    hold.status, hold.terminated_by = TERMINATED, BY_NODE_DELETED
                    state.bury(hold.uid)
        for uid, entry in state.reservations.items():
            if entry.get("ended_by") == BY_NODE_DELETED:
                self._end_outputs(state, uid, result, report)
        for hid, hold in state.holds.items():
            if hold.terminated_by == BY_NODE_DELETED:
                report[hid] = None
                result.outputs.append(Output(topics.HOLDS, hold.decision_key, PodTerminated(
                    uid=hold.uid, node=state.name, decision_key=hold.decision_key, reason=REASON_NODE_DELETED,
                )))

    @staticmethod
    def _placed_here(state: NodeState, uid: str) -> bool:
        """The pod was bound on this node (committed, or terminated since)."""
        return uid in state.tombstones or any(h.uid == uid and h.status == COMMITTED for h in state.holds.values())

    def _refusal(self, state: NodeState, claim: Claim, ignoring: frozenset[str] = frozenset()) -> str:
        if not state.exists:
            return REASON_NODE_NOT_FOUND
        if claim.uid in state.tombstones:
            return REASON_POD_TERMINATED
        if state.unschedulable:
            return REASON_NODE_UNSCHEDULABLE
        reserved = None
        if claim.reservation:
            refusal = self._reservation_refusal(state, claim)
            if refusal:
                return refusal
            reserved = state.remaining(claim.reservation)  # what the pod may take of it
        short = admission.shortfall(state.allocatable, state.used(ignoring), claim.requests,
                                    [n.requests for n in state.promised(claim.priority, claim.uid)], reserved)
        if short:
            return REASON_INSUFFICIENT.format(short)
        return self._device_refusal(state, claim.uid, claim.priority, claim.devices, ignoring=ignoring)

    def _fellows_only(self, state: NodeState, claim: Claim) -> bool:
        """The claim of a gang member fits once the held (not yet accepted) claims of its own
        gang here are left out: two of its members (placed by two schedulers at once, each
        with its own replica) asked for the same capacity or device. Such a rejection does not
        take the gang down in Strict mode (its decider requeues this member alone, and its
        scheduler then sees its fellows' holds); otherwise a gang whose members all retry
        together would collide with itself on every round."""
        return bool(self._fits_without(state, claim, lambda h: h.decision_key == claim.decision_key))

    def _yields(self, state: NodeState, claim: Claim) -> dict[str, list[str]]:
        """Wound-wait: when the claim of a gang member fits once lower-ranked gangs' held (not
        yet accepted) claims are gone, those gangs, with their holds here; else nothing."""
        mine = gangs.rank(claim.priority, claim.decision_key)
        losers = self._fits_without(state, claim, lambda h: h.decision_key != claim.decision_key
                                    and gangs.rank(h.priority, h.decision_key) > mine)
        out: dict[str, list[str]] = {}
        for hid, h in sorted(losers.items()):
            out.setdefault(h.decision_key, []).append(hid)
        return out

    def _fits_without(self, state: NodeState, claim: Claim,
                      which: Callable[[HoldEntry], bool]) -> dict[str, HoldEntry]:
        """The held (not yet accepted) gang claims here that `which` picks, when a gang
        member's claim fits once they are left out; else nothing."""
        if claim.gang_min <= 1:
            return {}
        picked = {hid: h for hid, h in state.holds.items() if h.status == HELD and h.gang_min > 1 and which(h)}
        if not picked or self._refusal(state, claim, ignoring=frozenset(picked)):
            return {}
        return picked

    def _misfit(self, state: NodeState, hid: str, hold: HoldEntry) -> str:
        """Why a held claim cannot be committed as it was held ("" when it can): its node is
        gone; or the node it was held on was deleted and added again, or updated, and the claim
        no longer fits the node as it is now (resources, or the very devices it names); or its
        pod was terminated here already. Holds are only taken when they fit, so only a change
        of the node makes one stop fitting, and committing it would over-commit the node."""
        if not state.exists:
            return REASON_NODE_DELETED
        if hold.uid in state.tombstones:
            return REASON_POD_TERMINATED
        used = state.used()  # the hold is counted: after its commit, nothing changes
        for name, amount in sorted(hold.requests.items()):
            if amount > 0 and used.get(name, 0) > state.allocatable.get(name, 0):
                return REASON_INSUFFICIENT.format(name)
        if hold.devices:
            return self._device_refusal(state, hold.uid, hold.priority, hold.devices,
                                        usage=state.device_usage(ignoring=frozenset({hid})))
        return ""

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
    def _device_refusal(state: NodeState, pod: str, priority: int, encoded: Iterable[str],
                        usage: dict[str, int] | None = None, ignoring: frozenset[str] = frozenset()) -> str:
        """The claimed GPUs exist and have room for their share (devices, not only totals).
        `usage`: what others use (default: every hold but those in `ignoring`, and the
        nominations that outrank it)."""
        encoded = list(encoded)
        claimed, vfs, cpusets = devices.decode(encoded), devices.decode_rdma(encoded), cpus.decode(encoded)
        if not claimed and not vfs and not cpusets:
            return ""
        gpus, nics = state.gpus(), state.nics()
        if usage is None:
            usage = state.device_usage(ignoring)
            for nomination in state.promised(priority, pod):  # others' promised devices, as for totals
                devices.add_usage(usage, nomination.devices)
        else:
            usage = dict(usage)
        # Each allocation is added to `usage` once checked: a claim that names a device twice
        # (a GPU share, a NIC's VFs, a CPU) is checked against its own earlier parts too.
        if cpusets:
            cells = (state.record or {}).get("numa", ())
            known = {c for cell in cells for c in cell.get("cpus", ())}
            cell_memory = {int(cell.get("id", 0)): int(cell.get("memory", 0) or 0) for cell in cells}
            for cpuset in cpusets:
                for cpu in cpuset.cpus:
                    if cpu not in known:
                        return f"cpu {cpu} does not exist on the node"
                    if usage.get(keys.cpu_used(cpu)):
                        return f"cpu {cpu} is bound to another pod"
                    usage[keys.cpu_used(cpu)] = 1
                memory = cell_memory.get(cpuset.cell, 0)
                key = keys.numa_memory(cpuset.cell)
                if cpuset.memory and memory and usage.get(key, 0) + cpuset.memory > memory:
                    return f"Insufficient memory in NUMA node {cpuset.cell}"
                usage[key] = usage.get(key, 0) + cpuset.memory
        for n in vfs:
            if n.minor not in nics:
                return f"rdma {n.minor} does not exist on the node"
            key = keys.rdma_vfs(n.minor)
            if usage.get(key, 0) + n.vfs > nics[n.minor]:
                return f"Insufficient rdma {n.minor}"
            usage[key] = usage.get(key, 0) + n.vfs
        for a in claimed:
            if a.minor not in gpus:
                return f"gpu {a.minor} does not exist on the node"
            core, ratio = gpus[a.minor]
            used_core = usage.get(keys.gpu_core(a.minor), 0) + a.core
            used_ratio = usage.get(keys.gpu_ratio(a.minor), 0) + a.ratio
            if used_core > core or used_ratio > ratio:
                return f"Insufficient gpu {a.minor}"
            usage[keys.gpu_core(a.minor)], usage[keys.gpu_ratio(a.minor)] = used_core, used_ratio
        return ""
