"""The warm pool's core: one writer per pool, so no two claims ever adopt the same sandbox.

Everything about a pool arrives on its own `sandbox` partition, keyed `namespace/pool`: the
pool (with its template resolved), its claims and their deletions, its bursts, the Bindings
and SchedulingFeedback of its pods (forwarded there by uid: `templates.pool_of`) and its
timer ticks. `PoolCore.apply` takes a batch of them in log order and decides; the agent
(`agents.adapters.sandbox`) runs it in the stateful loop, so the pool's state is written in
the same step as its outputs and a replay after a crash re-sends, never re-decides.

The state of a pool (`PoolState`): the pool record; its sandboxes by uid, each starting
(published, not bound yet), ready (bound, unclaimed) or claimed (by one claim); its claims by
`namespace/name`, each with the status last sent (the recorded answer), and the claims another
of their name replaced, by uid; its bursts; the templates its sandboxes and bursts were made
from; the refill rate limiter's tokens; the last batch's outputs (`sent`). Rules:

1. **A claim is decided once.** A claim whose uid is recorded (as its name's claim, or as one
   that another claim of its name replaced) gets its recorded status again (a redelivery, even
   with changed fields, changes nothing). A uid recorded for another name is bad input.
   Otherwise the claim is validated (a bad claim, an unknown or deleted pool, env the template
   refuses: Refused, naming the field, and a problem for the dead-letter topic); a claim
   decided past its `shutdown_time` ends at once (Expired or Deleted, no sandbox taken); then it
   takes, in this order: the oldest ready sandbox (path `warm`: Ready at once, no scheduling
   cycle), the oldest starting one (path `starting`: Ready when its Binding arrives), or, when
   the pool's `overflow` is Allow, a pod started for it through the scheduler (path `cold`: its
   pod carries the claim's uid label, so a burst's reservations take it first); with Deny it is
   Refused with what to do. Claim-time env and metadata never disqualify adoption: they
   travel on the status.
2. **A sandbox has at most one claim**: a sandbox leaves the ready and starting sets when it
   is claimed, and only unclaimed sandboxes are ever picked (property-tested). Oldest means
   first to enter its set, an order the state records (`k`), so a restore picks as the running
   pool would.
3. **Refill** keeps `replicas` unclaimed sandboxes (ready + starting): at most `refill_batch`
   per round and `refill_per_s` a second (tokens counted in log time, which never runs back
   for them). Rounds happen at ticks and pool changes only, in log order: a claim that leaves
   a deficit asks for a tick (when the next round's tokens are there), so a batch of claims
   decides as the same claims one by one. A pool above its replicas (shrunk, deleted) deletes
   unclaimed sandboxes, starting ones first. Recreate deletes unclaimed sandboxes of an older
   template at once; OnReplenish lets them be claimed. A pool's pods are numbered per life of
   the pool (`life`, named by its creation's log time), so a pool created again after its state
   was forgotten never publishes a uid or name of its earlier life.
4. **Lifecycles**: a claim's `shutdown_time` deletes its sandbox (status Expired with Retain,
   Deleted otherwise); a deleted claim deletes its sandbox; a sandbox pod removed by anyone
   else (the deciders send its PodDeleted or PodTerminated on) leaves the pool, and its claim
   ends Failed; the pool sends the pod's deletion again (a record of the pod it sent, at its
   start, in a replay or with its claim's metadata, may have reached `pods` after the
   removal). Ended claims are kept for `retention_s` of log time (a redelivery in that window
   still gets its answer), then dropped:
   a claim published again after that is decided as a new one (redeliveries come within
   seconds, docs/architecture.md "How long state is kept"; a producer must not publish a
   deleted claim again, or its new sandbox waits for a deletion that never comes).
5. **Bursts** become Reservations (`templates.burst_reservations`) once per burst name; a burst
   counts as reserved until its ttl and is remembered for `retention_s` more (a redelivery then
   reserves nothing again).
6. **Replays re-send the outputs they caused, never decide again** (DESIGN.md, rule 1). A
   crash between the table write and the outputs (or an aborted transaction, after which the
   run is read again against the table it left in memory) leaves the state of a batch whose
   outputs may never have gone out; the batch is then read again. So each batch records what
   it sent (`sent`: its pods, deletions, claims' answers and bursts, as references into the
   state, from which they are rebuilt exactly), and a batch that carries a record the state
   has seen already (a claim or deletion of a recorded uid, a Binding or feedback of a sandbox
   that had it, a burst of a recorded name, a tick no later than one read), or a pool record or
   deletion (which carry no version: a replay that begins before the lost batch can bring an
   older one, a change), re-sends them where that record stands, with the pool's status and
   the tick it waits for. What the recorded batch sent and what the records re-sent since
   are kept until they are settled (a pod bound or gone, a claim forgotten, a deletion older
   than `retention_s`), so a replay of a replay misses nothing. A round that a replayed tick or
   pool record brings runs again against the state as it is: it starts or deletes only what
   the pool still lacks or has too many of.

Time is the log's: `times` (each record's log time) and `now` (the batch's newest), never a
clock read here. The ticks asked for (`armed`) are this worker's memory, not state: a restore
asks again for what the restored state needs (`agents.adapters.sandbox.SandboxCore.timers`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from agents.ports import Entries, Output, Problem
from agents.sandbox import templates as tpl
from schemas import topics
from schemas.codec import decode_object, to_plain
from schemas.errors import FieldError
from schemas.records import (
    Alternative,
    Binding,
    Pod,
    PodDeleted,
    PodTerminated,
    Record,
    SandboxBurst,
    SandboxClaim,
    SandboxClaimDeleted,
    SandboxClaimStatus,
    SandboxPoolStatus,
    SandboxTemplate,
    SandboxTick,
    SandboxWarmPool,
    SandboxWarmPoolDeleted,
    SchedulingFeedback,
    replace,
)

STARTING, READY, CLAIMED = "starting", "ready", "claimed"
WARM, VIA_STARTING, COLD = "warm", "starting", "cold"
READY_PHASE, PENDING, REFUSED, EXPIRED, DELETED, FAILED = "Ready", "Pending", "Refused", "Expired", "Deleted", "Failed"
NOT_FOUND, POOL_EMPTY, INVALID, UNSCHEDULABLE = "WarmPoolNotFound", "WarmPoolEmpty", "InvalidClaim", "Unschedulable"
ENDED = frozenset({REFUSED, EXPIRED, DELETED, FAILED})
POOL_KINDS = (SandboxWarmPool, SandboxWarmPoolDeleted, SandboxClaim, SandboxClaimDeleted, SandboxBurst, SandboxTick,
              Binding, SchedulingFeedback, PodDeleted, PodTerminated)
EPS = 1e-6
# What a batch sent, as references into the state (`PoolState.sent`, rule 6).
POD, GONE, ANSWER, BURST, POOL, META = "pod", "deleted", "claim", "burst", "pool", "metadata"


def claim_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def _status(entry: Mapping[str, Any]) -> SandboxClaimStatus:
    """A claim's recorded status."""
    return cast(SandboxClaimStatus, decode_object(entry["status"], SandboxClaimStatus))


def _ident(ref: Sequence[Any]) -> tuple[Any, ...]:
    """What a reference to a sent output is about (a pod, a deletion, a claim's answer, a burst)."""
    return tuple(ref[:3]) if ref[0] in (ANSWER, GONE) else tuple(ref[:2])


def ended_times(claims: Mapping[str, Any], ended: Mapping[str, Any]) -> list[float]:
    """When the ended claims and the replaced claims of a stored state ended (a pass over all:
    `PoolState` keeps them in a heap)."""
    return [float(c["gone"]) for c in claims.values() if c.get("gone") is not None] + [
        float(e["gone"]) for e in ended.values()]


def forget_at(gone: Iterable[float], bursts: Mapping[str, Any], sent: Sequence[Sequence[Any]],
              retention_s: float) -> float:
    """The log time after which a pool's state has something to forget: ended claims and
    replaced claims (`gone`: when they ended, or the earliest of those), bursts past their ttl
    and deletions sent, a retention after they ended (0: nothing)."""
    times = list(gone)
    times += [float(b["until"]) for b in bursts.values()]
    times += [float(ref[3]) for ref in sent if ref[0] == GONE]
    return min(times) + retention_s if times else 0.0


def _shutdown_pending(entry: Mapping[str, Any]) -> bool:
    """A claim with a shutdown time still to come (not ended, not gone)."""
    return (entry.get("shutdown") is not None and entry.get("gone") is None
            and entry["status"]["phase"] not in ENDED)


class Tracked(dict[str, Any]):
    """A map that remembers which keys were set or removed since `changed` was last cleared,
    and tells `on_set` of every value set (entries are replaced whole, never changed in place,
    except through `touch`)."""

    def __init__(self, items: dict[str, Any] | None = None) -> None:
        super().__init__(items or {})
        self.changed: set[str] = set()
        self.on_set: Callable[[str, Any], None] | None = None

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self.changed.add(key)
        if self.on_set is not None:
            self.on_set(key, value)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self.changed.add(key)

    def touch(self, key: str) -> None:
        self.changed.add(key)


@dataclass
class PoolState:
    key: str
    pool: SandboxWarmPool | None = None
    deleted: bool = False
    life: str = ""  # this life of the pool, in its pods' uids and names (rule 3)
    seq: int = 0  # the next sandbox's number
    order: int = 0  # the last pick-order stamp given (`k` of a sandbox: when it entered its set)
    # uid -> {name, state, node, claim, since, born, hash, tpl, n, k[, cold][, fb]}
    sandboxes: Tracked = field(default_factory=Tracked)
    claims: Tracked = field(default_factory=Tracked)  # ns/name -> {uid, sandbox, path, status, shutdown, policy, gone}
    ended: Tracked = field(default_factory=Tracked)  # claim uid -> {ck, status, gone}: replaced by another claim
    bursts: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {mode, count, ttl, created, until, tpl, ended}
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)  # template_key -> the template, plain
    tokens: float = 0.0
    tokens_at: float = 0.0
    ticked: float | None = None  # the latest tick's `at` read
    sent: list[list[Any]] = field(default_factory=list)  # the last batch's outputs, as references (rule 6)
    stats: dict[str, int] = field(default_factory=dict)
    message: str = ""
    # In memory only: the tick this worker asked for (None: none), unclaimed sandboxes in pick
    # order, claims' uids, the pool's template key and decoded templates, rebuilt on load.
    armed: float | None = field(default=None, repr=False, compare=False)
    _ready: dict[str, None] = field(default_factory=dict, repr=False, compare=False)
    _starting: dict[str, None] = field(default_factory=dict, repr=False, compare=False)
    _uids: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    _tpl: str = field(default="", repr=False, compare=False)
    _decoded: dict[str, SandboxTemplate] = field(default_factory=dict, repr=False, compare=False)
    _plain: dict[str, tuple[dict[str, Any], object]] = field(default_factory=dict, repr=False, compare=False)
    # Heaps of the times a batch looks for, so that it finds what is due without a pass over
    # every claim (a busy pool keeps thousands of ended ones a retention long): (end time,
    # "c" and a claim's key or "e" and a replaced claim's uid), and (shutdown time, claim's
    # key). An entry whose claim no longer has that time is stale and dropped when it comes up.
    _gone: list[tuple[float, str, str]] = field(default_factory=list, repr=False, compare=False)
    _shutdowns: list[tuple[float, str]] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.claims.on_set = self._claim_set
        self.ended.on_set = self._ended_set

    def index(self) -> None:
        """Rebuild what is kept in memory only (pick order: `k`, the order of entering a set)."""
        def order(uid: str) -> tuple[int, str]:
            return (int(self.sandboxes[uid]["k"]), uid)
        self._ready = {u: None for u in sorted((u for u, s in self.sandboxes.items() if s["state"] == READY), key=order)}
        self._starting = {u: None for u in sorted(
            (u for u, s in self.sandboxes.items() if s["state"] == STARTING), key=order)}
        self._uids = {c["uid"]: ck for ck, c in self.claims.items()}
        self._tpl = tpl.template_key(self.pool.template) if self.pool is not None else ""
        self._time_heaps()

    def _claim_set(self, ck: str, entry: Mapping[str, Any]) -> None:
        if entry.get("gone") is not None:
            heapq.heappush(self._gone, (float(entry["gone"]), "c", ck))
        elif _shutdown_pending(entry):
            heapq.heappush(self._shutdowns, (float(entry["shutdown"]), ck))
        self._compact()

    def _ended_set(self, uid: str, ended: Mapping[str, Any]) -> None:
        heapq.heappush(self._gone, (float(ended["gone"]), "e", uid))
        self._compact()

    def _compact(self) -> None:
        """Rebuild the heaps once stale entries outnumber the claims (every update of a claim
        with a shutdown time pushes it again; one far in the future would never come up)."""
        if len(self._gone) + len(self._shutdowns) > 2 * (len(self.claims) + len(self.ended)) + 64:
            self._time_heaps()

    def _time_heaps(self) -> None:
        """The heaps from the claims as they are (no stale entry)."""
        self._gone, self._shutdowns = [], []
        for ck, entry in self.claims.items():
            if entry.get("gone") is not None:
                self._gone.append((float(entry["gone"]), "c", ck))
            elif _shutdown_pending(entry):
                self._shutdowns.append((float(entry["shutdown"]), ck))
        self._gone += [(float(e["gone"]), "e", uid) for uid, e in self.ended.items()]
        heapq.heapify(self._gone)
        heapq.heapify(self._shutdowns)

    def next_gone(self) -> tuple[float, str, str] | None:
        """The earliest end of a claim or a replaced claim still kept (stale entries dropped)."""
        while self._gone:
            at, kind, key = top = self._gone[0]
            entry = (self.claims if kind == "c" else self.ended).get(key)
            if entry is not None and entry.get("gone") is not None and float(entry["gone"]) == at:
                return top
            heapq.heappop(self._gone)
        return None

    def next_shutdown(self) -> tuple[float, str] | None:
        """The earliest shutdown time of a live claim (stale entries dropped)."""
        while self._shutdowns:
            at, ck = top = self._shutdowns[0]
            entry = self.claims.get(ck)
            if entry is not None and _shutdown_pending(entry) and float(entry["shutdown"]) == at:
                return top
            heapq.heappop(self._shutdowns)
        return None

    def unclaimed(self) -> int:
        return len(self._ready) + len(self._starting)

    def stamp(self) -> int:
        self.order += 1
        return self.order

    def _entries(self, name: str, items: Tracked) -> Entries:
        kept = self._plain.get(name)
        if kept is None or kept[0] is not items:
            made = Entries(dict(items))
        else:
            made = Entries(dict(items), kept[1], sorted(items.changed))
        items.changed.clear()
        self._plain[name] = (items, made.token)
        return made

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "pool": to_plain(self.pool) if self.pool is not None else None,
            "deleted": self.deleted,
            "life": self.life,
            "seq": self.seq,
            "order": self.order,
            "sandboxes": self._entries("sandboxes", self.sandboxes),
            "claims": self._entries("claims", self.claims),
            "ended": self._entries("ended", self.ended),
            "bursts": dict(self.bursts),
            "templates": dict(self.templates),
            "tokens": self.tokens,
            "tokens_at": self.tokens_at,
            "ticked": self.ticked,
            "sent": list(self.sent),
            "stats": dict(self.stats),
            "message": self.message,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PoolState:
        pool = raw.get("pool")
        state = cls(
            key=str(raw["key"]),
            pool=cast(SandboxWarmPool, decode_object(pool, SandboxWarmPool)) if pool else None,
            deleted=bool(raw.get("deleted", False)),
            life=str(raw.get("life", "")),
            seq=int(raw.get("seq", 0)),
            order=int(raw.get("order", 0)),
            sandboxes=Tracked({k: dict(v) for k, v in (raw.get("sandboxes") or {}).items()}),
            claims=Tracked({k: dict(v) for k, v in (raw.get("claims") or {}).items()}),
            ended=Tracked({k: dict(v) for k, v in (raw.get("ended") or {}).items()}),
            bursts={k: dict(v) for k, v in (raw.get("bursts") or {}).items()},
            templates={k: dict(v) for k, v in (raw.get("templates") or {}).items()},
            tokens=float(raw.get("tokens", 0.0)),
            tokens_at=float(raw.get("tokens_at", 0.0)),
            ticked=None if raw.get("ticked") is None else float(raw["ticked"]),
            sent=[list(ref) for ref in raw.get("sent") or ()],
            stats={k: int(v) for k, v in (raw.get("stats") or {}).items()},
            message=str(raw.get("message", "")),
        )
        state.index()
        return state


@dataclass
class PoolResult:
    outputs: list[Output] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    ticks: list[float] = field(default_factory=list)  # log times to append a SandboxTick at
    sent: list[list[Any]] = field(default_factory=list)  # the outputs, as references (rule 6)


class PoolCore:
    """Decides a pool's batches (module docstring). Pure: no Kafka, no clock."""

    def __init__(self, retention_s: float = 600.0) -> None:
        self.retention_s = retention_s

    # --- the batch ---------------------------------------------------------------------

    def apply(self, st: PoolState, records: Iterable[Record], times: Iterable[float], now: float,
              result: PoolResult) -> None:
        before = self._status_view(st)
        start = len(result.sent)
        repeated = again = False
        read = 0
        for record, t in zip(records, times, strict=True):
            read += 1
            at, refs_at = len(result.outputs), len(result.sent)
            if self._one(st, record, t, result) and not repeated:
                repeated = True
                again = self._resend(st, now, result, at, refs_at)
        self._settle(st, now, result, repeated)
        if again or self._status_view(st) != before:
            result.outputs.append(self._pool_status(st, now))
            result.sent.append([POOL])
        mine = result.sent[start:]
        # A batch that read records replaces what the last one sent (it re-sent that if it
        # repeated a record); a visit with none (something to forget) adds to it.
        self._settle_sent(st, mine if read else st.sent + mine, now)

    def _one(self, st: PoolState, record: Record, t: float, result: PoolResult) -> bool:
        """Apply one record; True when the state had seen it already (rule 6)."""
        if isinstance(record, SandboxClaim):
            return self._claim(st, record, t, result)
        if isinstance(record, Binding):
            return self._bound(st, record, t, result)
        if isinstance(record, SandboxWarmPool):
            self._pool(st, record, t, result)
            self._advance(st, t, result)
            return True  # a pool record carries no version: an older one read again is a change
        if isinstance(record, SandboxClaimDeleted):
            return self._claim_deleted(st, record, t, result)
        if isinstance(record, SchedulingFeedback):
            return self._feedback(st, record, t, result)
        if isinstance(record, SandboxWarmPoolDeleted):
            st.deleted = True
            self._advance(st, t, result)
            return True  # as a pool record: it may follow an older version of the pool read again
        if isinstance(record, SandboxBurst):
            return self._burst(st, record, t, result)
        if isinstance(record, (PodDeleted, PodTerminated)):
            return self._lost(st, record.uid, t, result)
        if isinstance(record, SandboxTick):
            seen = st.ticked is not None and record.at <= st.ticked + EPS
            st.ticked = record.at if st.ticked is None else max(st.ticked, record.at)
            if st.armed is not None and max(record.at, t) >= st.armed - EPS:
                st.armed = None  # the moment asked for has come (its tick, or a later one)
            self._advance(st, t, result)
            return seen
        return False

    @staticmethod
    def empty(st: PoolState) -> bool:
        return ((st.pool is None or st.deleted) and not st.sandboxes and not st.claims and not st.ended
                and not st.bursts and not any(ref[0] == GONE for ref in st.sent))

    def expires(self, st: PoolState) -> float:
        """`forget_at` of the state, the ended claims' earliest time read from its heap."""
        gone = st.next_gone()
        return forget_at(() if gone is None else (gone[0],), st.bursts, st.sent, self.retention_s)

    def due(self, st: PoolState, now: float) -> float | None:
        """When the pool next needs a tick (a refill deficit, a shutdown time, a burst's end), else None."""
        wants: list[float] = []
        pool = st.pool
        deficit = 0 if pool is None or st.deleted else pool.replicas - st.unclaimed()
        if pool is not None and deficit > 0:  # when the next round's tokens are there: a batch, or what is missing
            need = min(deficit, pool.refill_batch)
            wants.append(st.tokens_at + max(0.0, need - st.tokens) / pool.refill_per_s)
        shutdown = st.next_shutdown()
        if shutdown is not None:
            wants.append(shutdown[0])
        wants += [float(b["until"]) for b in st.bursts.values() if not b.get("ended")]
        return max(min(wants), now) if wants else None

    # --- inputs ------------------------------------------------------------------------

    def _pool(self, st: PoolState, pool: SandboxWarmPool, t: float, result: PoolResult) -> None:
        try:
            tpl.validate_pool(pool)
        except FieldError as exc:
            result.problems.append(Problem(exc.field, str(exc.value), str(exc), pool))
            return
        pool = replace(pool, template=tpl.with_hash(pool.template))
        if st.pool is not None and not st.deleted and pool == st.pool:
            return
        if st.pool is None or st.deleted:
            st.tokens = float(pool.refill_batch)  # a new pool starts with a full round
        if not st.life:
            st.life = tpl.life(t)
        st.pool, st.deleted = pool, False
        st._tpl = tpl.template_key(pool.template)
        if st._tpl not in st.templates:
            st.templates[st._tpl] = to_plain(pool.template)

    def _claim(self, st: PoolState, claim: SandboxClaim, t: float, result: PoolResult) -> bool:
        ck = claim_key(claim.namespace, claim.name)
        entry = st.claims.get(ck)
        if entry is not None and entry["uid"] == claim.uid:
            self._say(st, ck, result)
            return True
        replaced = st.ended.get(claim.uid)
        if replaced is not None and replaced["ck"] == ck:
            self._say_replaced(st, claim.uid, result)
            return True
        other = st._uids.get(claim.uid) or (replaced or {}).get("ck")
        if other is not None:
            result.problems.append(Problem("metadata.uid", claim.uid, f"claim uid {claim.uid!r} is the uid of "
                                           f"claim {other!r}: a uid names one object", claim))
            return False
        if entry is not None:
            if entry.get("gone") is None:
                self._end_claim(st, ck, DELETED, "replaced by a claim of the same name with another uid", t, result)
            self._retire(st, ck, t)
        self._count(st, "claims")
        base = SandboxClaimStatus(uid=claim.uid, namespace=claim.namespace, name=claim.name,
                                  warm_pool=claim.warm_pool, phase=PENDING, env=claim.env, labels=claim.labels,
                                  annotations=claim.annotations, claimed_at=claim.created, answered_at=t,
                                  observed_generation=claim.generation)
        pool = st.pool
        refusal: FieldError | None = None
        try:
            tpl.validate_claim(claim)
        except FieldError as exc:
            refusal = exc
        if refusal is None and (pool is None or st.deleted):
            refusal = FieldError("spec.warmPoolRef.name", claim.warm_pool,
                                 f"no SandboxWarmPool {claim.warm_pool!r} in namespace {claim.namespace!r}")
        if refusal is None and pool is not None:
            refusal = tpl.env_refusal(claim, pool.template)
        if refusal is not None:
            result.problems.append(Problem(refusal.field, str(refusal.value), str(refusal), claim))
            reason = NOT_FOUND if refusal.field == "spec.warmPoolRef.name" else INVALID
            status = replace(base, phase=REFUSED, reason=reason, message=str(refusal),
                             next_step="FixClaim" if reason == INVALID else "CreateWarmPool")
            self._record(st, ck, claim, status, "", "", gone=t)
            self._say(st, ck, result, status)
            self._count(st, "refused")
            return False
        assert pool is not None
        if claim.shutdown_time is not None and claim.shutdown_time <= t:
            phase = EXPIRED if claim.shutdown_policy == "Retain" else DELETED
            status = replace(base, phase=phase, message="the claim's shutdown time had passed when it "
                                                                    "was decided: no sandbox was taken")
            self._record(st, ck, claim, status, "", "", gone=None if phase == EXPIRED else t)
            self._say(st, ck, result, status)
            return False
        if st._ready:
            uid = next(iter(st._ready))
            sandbox = self._take(st, uid, ck)
            status = replace(base, phase=READY_PHASE, path=WARM, sandbox=sandbox["name"], pod_uid=uid,
                             node=sandbox["node"])
            self._record(st, ck, claim, status, uid, WARM)
            self._send_metadata(st, uid, ck, result)
            self._count(st, "warm_hits")
        elif st._starting:
            uid = next(iter(st._starting))
            sandbox = self._take(st, uid, ck)
            status = replace(base, path=VIA_STARTING, sandbox=sandbox["name"], pod_uid=uid,
                             reason=POOL_EMPTY, message="no ready sandbox: took one that is starting")
            self._record(st, ck, claim, status, uid, VIA_STARTING)
            self._send_metadata(st, uid, ck, result)
            self._count(st, "starting_hits")
        elif pool.overflow == "Allow":
            uid = tpl.cold_uid(claim.namespace, claim.warm_pool, claim.uid)
            st.sandboxes[uid] = {"name": claim.name, "state": CLAIMED, "node": "", "claim": ck, "since": t, "born": t,
                                 "hash": pool.template.hash, "tpl": st._tpl, "n": -1, "k": st.stamp(), "cold": True}
            status = replace(base, path=COLD, sandbox=claim.name, pod_uid=uid, reason=POOL_EMPTY,
                             message="the warm pool is empty: a sandbox is starting through the scheduler")
            self._record(st, ck, claim, status, uid, COLD)
            self._send_pod(st, uid, result)  # built from the records just made, as a re-send builds it
            self._count(st, "cold")
        else:
            wait = self._refill_eta(st, t)
            alternatives = [Alternative("ScaleWarmPool", f"raise spec.replicas of {pool.name} above "
                                               f"{pool.replicas}", {"spec.replicas": str(pool.replicas + 1)})]
            if wait is not None:
                alternatives.insert(0, Alternative(
                    "Wait", f"a sandbox of the pool is expected ready in {wait:.1f}s", {"retryAfterSeconds": f"{wait:.1f}"}))
            status = replace(
                base, phase=REFUSED, reason=POOL_EMPTY, retry_after_s=wait, alternatives=tuple(alternatives),
                next_step="Retry" if wait is not None else "ScaleWarmPool",
                message=f"warm pool {pool.name} has no unclaimed sandbox and its overflow policy is Deny")
            self._record(st, ck, claim, status, "", "", gone=t)
            self._count(st, "refused")
        self._say(st, ck, result, status)
        return False

    def _bound(self, st: PoolState, binding: Binding, t: float, result: PoolResult) -> bool:
        sandbox = st.sandboxes.get(binding.uid)
        if sandbox is None or sandbox["node"]:
            return True  # not ours any more, or a redelivery
        sandbox = {**sandbox, "node": binding.node, "since": t}
        sandbox.pop("fb", None)
        if sandbox["state"] == STARTING:
            sandbox["state"], sandbox["k"] = READY, st.stamp()
            st._starting.pop(binding.uid, None)
            st._ready[binding.uid] = None
            st.sandboxes[binding.uid] = sandbox
            return False
        st.sandboxes[binding.uid] = sandbox
        ck: str = sandbox.get("claim") or ""
        entry = st.claims.get(ck) if ck else None
        if entry is not None and entry["status"]["phase"] == PENDING:  # its claim waited for it: Ready
            status = replace(_status(entry), phase=READY_PHASE,
                             node=binding.node, reason="", message="", answered_at=t)
            self._update(st, ck, status, result)
        return False

    def _lost(self, st: PoolState, uid: str, t: float, result: PoolResult) -> bool:
        """A sandbox pod removed by someone else (its node deleted, a user, an eviction: the
        deciders send these on): the pool stops counting it (a tick refills), and its claim, if
        any, ends Failed. Unknown: one the pool deleted itself, or a redelivery."""
        sandbox = st.sandboxes.pop(uid, None)
        if sandbox is None:
            return True
        st.sandboxes.touch(uid)
        st._ready.pop(uid, None)
        st._starting.pop(uid, None)
        # A record of the pod the pool sent (at its start, again in a replay, with its claim's
        # metadata) may have reached `pods` after the removal did: the deletion goes out after it.
        self._send_deleted(st, uid, sandbox["name"], t, result)
        ck: str = sandbox.get("claim") or ""
        entry = st.claims.get(ck) if ck else None
        if entry is not None and entry.get("sandbox") == uid and entry["status"]["phase"] not in ENDED:
            self._end_claim(st, ck, FAILED, "its sandbox's pod was removed (its node deleted, the pod deleted "
                                            "or evicted): claim again for another", t, result)
        return False

    def _feedback(self, st: PoolState, fb: SchedulingFeedback, t: float, result: PoolResult) -> bool:
        sandbox = st.sandboxes.get(fb.uid)
        if sandbox is None or sandbox["node"]:
            return True
        seen = sandbox.get("fb")
        if seen is not None and (fb.attempt < seen[0] or [fb.attempt, fb.message] == seen):
            return True
        st.sandboxes[fb.uid] = {**sandbox, "fb": [fb.attempt, fb.message]}
        ck: str = sandbox.get("claim") or ""
        entry = st.claims.get(ck) if ck else None
        if entry is None:
            st.message = fb.message  # a refill that cannot be placed: the pool's status says why
            return False
        old = _status(entry)
        if old.phase != PENDING:
            return False
        hint: dict[str, Any] = {"reason": fb.reason or UNSCHEDULABLE, "next_step": fb.next_step or "Wait",
                                "retry_after_s": fb.retry_after_s}
        alts = fb.alternatives
        status = replace(old, message=fb.message, alternatives=alts, answered_at=t, **hint)
        if status != replace(old, answered_at=t):
            self._update(st, ck, status, result)
        return False

    def _claim_deleted(self, st: PoolState, gone: SandboxClaimDeleted, t: float, result: PoolResult) -> bool:
        ck = claim_key(gone.namespace, gone.name)
        entry = st.claims.get(ck)
        if entry is None or entry["uid"] != gone.uid or entry.get("gone") is not None:
            return True  # ended already, replaced, or forgotten
        self._end_claim(st, ck, DELETED, "the claim was deleted", t, result)
        return False

    def _burst(self, st: PoolState, burst: SandboxBurst, t: float, result: PoolResult) -> bool:
        try:
            tpl.validate_burst(burst)
        except FieldError as exc:
            result.problems.append(Problem(exc.field, str(exc.value), str(exc), burst))
            return False
        if burst.name in st.bursts:
            return True  # decided once
        if st.pool is None or st.deleted:
            result.problems.append(Problem("spec.warmPoolRef.name", burst.warm_pool, f"no SandboxWarmPool "
                                           f"{burst.warm_pool!r} in namespace {burst.namespace!r}", burst))
            return False
        created = burst.created or t
        st.bursts[burst.name] = {"mode": burst.mode, "count": burst.count, "ttl": burst.ttl_s, "created": created,
                                 "until": created + burst.ttl_s, "tpl": st._tpl, "ended": False}
        self._send_burst(st, burst.name, t, result)
        return False

    # --- after the batch ---------------------------------------------------------------

    def _settle(self, st: PoolState, now: float, result: PoolResult, repeated: bool) -> None:
        """Forget what ended a retention ago, end bursts past their ttl, ask for a tick when one
        is due (again, for a batch that repeated records: the run that asked may have been lost)."""
        horizon = now - self.retention_s
        while (gone := st.next_gone()) is not None and gone[0] <= horizon:
            _, kind, key = heapq.heappop(st._gone)
            if kind == "c":
                st._uids.pop(st.claims[key]["uid"], None)
                del st.claims[key]
            else:
                del st.ended[key]
        for name, b in list(st.bursts.items()):
            if float(b["until"]) <= horizon:
                del st.bursts[name]
            elif not b.get("ended") and float(b["until"]) <= now:
                st.bursts[name] = {**b, "ended": True}
        if len(st.templates) > 1:
            used = {st._tpl, *(s["tpl"] for s in st.sandboxes.values()), *(b["tpl"] for b in st.bursts.values())}
            for key in [k for k in st.templates if k not in used]:
                del st.templates[key]
                st._decoded.pop(key, None)
        due = self.due(st, now)
        if due is None:
            return
        if st.armed is None or due < st.armed - EPS:
            st.armed = due
            result.ticks.append(due)
        elif repeated:
            result.ticks.append(st.armed)

    def _advance(self, st: PoolState, t: float, result: PoolResult) -> None:
        """What time `t` brings (at a tick, or a pool's change, in log order; never at a claim, so
        a batch of claims decides as the same claims one by one): shutdown times that passed,
        then the pool brought to its replicas (shrunk, or refilled within the rate limit)."""
        while (shutdown := st.next_shutdown()) is not None and shutdown[0] <= t:
            ck = heapq.heappop(st._shutdowns)[1]
            phase = EXPIRED if st.claims[ck].get("policy", "Retain") == "Retain" else DELETED
            self._end_claim(st, ck, phase, "the claim's shutdown time passed", t, result)
        pool = st.pool
        replicas = 0 if pool is None or st.deleted else pool.replicas
        if pool is not None and pool.update_strategy == "Recreate":
            for uid in [u for u in (*st._starting, *st._ready) if st.sandboxes[u]["hash"] != pool.template.hash]:
                self._delete_sandbox(st, uid, t, result)
        if pool is not None:  # log times can go back (producers' clocks differ): elapsed time never does
            elapsed = max(0.0, t - st.tokens_at)
            st.tokens = min(float(pool.refill_batch), st.tokens + elapsed * pool.refill_per_s)
            st.tokens_at = max(st.tokens_at, t)
        surplus = st.unclaimed() - replicas
        if surplus > 0:
            victims = list(reversed(st._starting))[:surplus]
            victims += list(reversed(st._ready))[:surplus - len(victims)]
            for uid in victims:
                self._delete_sandbox(st, uid, t, result)
        elif surplus < 0 and pool is not None:
            n = min(-surplus, int(math.floor(st.tokens + 1e-9)))
            st.tokens -= n
            for _ in range(n):
                self._start(st, pool, t, result)

    # --- what the pool sends, and sends again -------------------------------------------

    def _start(self, st: PoolState, pool: SandboxWarmPool, now: float, result: PoolResult) -> None:
        n = st.seq
        st.seq += 1
        uid = tpl.sandbox_uid(pool.namespace, pool.name, n, st.life)
        st.sandboxes[uid] = {"name": tpl.sandbox_name(pool.name, n, st.life), "state": STARTING, "node": "",
                             "claim": "", "since": now, "born": now, "hash": pool.template.hash, "tpl": st._tpl, "n": n,
                             "k": st.stamp()}
        st._starting[uid] = None
        self._send_pod(st, uid, result)

    def _template(self, st: PoolState, key: str) -> SandboxTemplate:
        template = st._decoded.get(key)
        if template is None:  # a template travels only inside a pool: decoded as one's
            carrier = {"kind": SandboxWarmPool.KIND, "namespace": "", "name": "", "template": st.templates[key]}
            template = st._decoded[key] = cast(SandboxWarmPool, decode_object(carrier, SandboxWarmPool)).template
        return template

    def _pod(self, st: PoolState, uid: str) -> Pod:
        """A sandbox's pod, built from its record: its template's, with its claim's metadata
        once claimed (and the claim's uid label for a cold one, started for the claim)."""
        sandbox = st.sandboxes[uid]
        assert st.pool is not None
        pool = st.pool if sandbox["tpl"] == st._tpl else replace(
            st.pool, template=self._template(st, sandbox["tpl"]))
        claim = None
        if sandbox.get("claim"):
            s = _status(st.claims[sandbox["claim"]])
            claim = SandboxClaim(uid=s.uid, namespace=s.namespace, name=s.name, warm_pool=s.warm_pool,
                                 labels=s.labels, annotations=s.annotations)
        return tpl.sandbox_pod(pool, uid, sandbox["name"], float(sandbox.get("born", sandbox["since"])), claim,
                               cold=bool(sandbox.get("cold")))

    def _send_pod(self, st: PoolState, uid: str, result: PoolResult) -> None:
        result.outputs.append(Output(topics.PODS, uid, self._pod(st, uid)))
        result.sent.append([POD, uid])

    def _send_metadata(self, st: PoolState, uid: str, ck: str, result: PoolResult) -> None:
        """An adopted sandbox's pod again, with its claim's labels and annotations (agent-sandbox's
        `additionalPodMetadata`), when the claim has any: readers of `pods` (the rebalancer's
        disruption budgets, the bridge, which writes them onto the pod in the API server) see
        them; the scheduler reads a bound pod's record as nothing to place, a starting one's as
        an update."""
        status = st.claims[ck]["status"]
        if status.get("labels") or status.get("annotations"):
            result.outputs.append(Output(topics.PODS, uid, self._pod(st, uid)))
            result.sent.append([META, uid, ck])

    def _send_burst(self, st: PoolState, name: str, decided: float, result: PoolResult) -> None:
        b = st.bursts[name]
        assert st.pool is not None
        pool = replace(st.pool, template=self._template(st, b["tpl"]))
        burst = SandboxBurst(namespace=pool.namespace, name=name, warm_pool=pool.name, count=int(b["count"]),
                             ttl_s=float(b["ttl"]), mode=str(b["mode"]), created=float(b["created"]))
        for r in tpl.burst_reservations(pool, burst, float(b["created"])):
            result.outputs.append(Output(topics.PODS, r.uid, r))
        result.sent.append([BURST, name, decided])

    def _delete_sandbox(self, st: PoolState, uid: str, t: float, result: PoolResult) -> None:
        sandbox = st.sandboxes.pop(uid, None)
        st.sandboxes.touch(uid)
        st._ready.pop(uid, None)
        st._starting.pop(uid, None)
        if sandbox is not None:
            self._send_deleted(st, uid, sandbox["name"], t, result)

    def _send_deleted(self, st: PoolState, uid: str, name: str, t: float, result: PoolResult) -> None:
        namespace = st.key.split("/", 1)[0]
        result.outputs.append(Output(topics.PODS, uid, PodDeleted(uid=uid, name=name, namespace=namespace)))
        result.sent.append([GONE, uid, name, t])

    def _say(self, st: PoolState, ck: str, result: PoolResult, status: SandboxClaimStatus | None = None) -> None:
        """A claim's recorded status (`status`: the one just recorded, as built), keyed by the
        claim's uid (the catalogue's key: a claim's answers are one object's)."""
        entry = st.claims[ck]
        result.outputs.append(Output(topics.SANDBOX_STATUS, entry["uid"], status or _status(entry)))
        result.sent.append([ANSWER, ck, entry["uid"]])

    def _say_replaced(self, st: PoolState, uid: str, result: PoolResult) -> None:
        """A replaced claim's last status."""
        result.outputs.append(Output(topics.SANDBOX_STATUS, uid, _status(st.ended[uid])))
        result.sent.append([ANSWER, st.ended[uid]["ck"], uid])

    def _resend(self, st: PoolState, now: float, result: PoolResult, at: int, refs_at: int) -> bool:
        """What the last batch sent (`st.sent`), rebuilt from the state, put where the repeated
        record's outputs begin; True if that was a pool status too (sent again at the end)."""
        again = PoolResult()
        status = False
        own = {_ident(ref) for ref in result.sent[refs_at:]}  # what the repeated record sent again itself
        for ref in st.sent:
            kind = ref[0]
            if _ident(ref) in own:
                continue
            if kind == POD:
                sandbox = st.sandboxes.get(ref[1])
                if sandbox is not None and not sandbox["node"]:
                    self._send_pod(st, ref[1], again)
            elif kind == META:
                if self._holds(st, ref):
                    self._send_metadata(st, ref[1], ref[2], again)
            elif kind == GONE:
                if float(ref[3]) > now - self.retention_s:
                    self._send_deleted(st, ref[1], ref[2], float(ref[3]), again)
            elif kind == ANSWER:
                entry = st.claims.get(ref[1])
                if entry is not None and entry["uid"] == ref[2]:
                    self._say(st, ref[1], again)
                elif ref[2] in st.ended:
                    self._say_replaced(st, ref[2], again)
            elif kind == BURST:
                if self._burst_live(st, ref, now):
                    self._send_burst(st, ref[1], float(ref[2]), again)
            else:
                status = True
        result.outputs[at:at] = again.outputs
        result.sent[refs_at:refs_at] = again.sent
        return status

    @staticmethod
    def _holds(st: PoolState, ref: Sequence[Any]) -> bool:
        """The claim of a metadata reference still holds its sandbox."""
        sandbox = st.sandboxes.get(ref[1])
        return sandbox is not None and sandbox.get("claim") == ref[2]

    def _burst_live(self, st: PoolState, ref: Sequence[Any], now: float) -> bool:
        """A burst's reservations are sent again only while it lasts and within a retention of
        its decision (what a redelivery can need): an owner deletes a reservation that was
        consumed, and one sent again after that would be scheduled anew."""
        burst = st.bursts.get(ref[1])
        return burst is not None and not burst.get("ended") and float(ref[2]) > now - self.retention_s

    def _settle_sent(self, st: PoolState, refs: list[list[Any]], now: float) -> None:
        """Keep of `refs` what a replay could still need, each thing once (its last mention)."""
        kept: list[list[Any]] = []
        seen: set[tuple[Any, ...]] = set()
        for ref in reversed(refs):
            ident = _ident(ref)
            if ident in seen:
                continue
            seen.add(ident)
            kind = ref[0]
            if kind == POD:
                sandbox = st.sandboxes.get(ref[1])
                live = sandbox is not None and not sandbox["node"]
            elif kind == META:
                live = self._holds(st, ref)
            elif kind == GONE:
                live = float(ref[3]) > now - self.retention_s
            elif kind == ANSWER:
                entry = st.claims.get(ref[1])
                live = (entry is not None and entry["uid"] == ref[2]) or ref[2] in st.ended
            elif kind == BURST:
                live = self._burst_live(st, ref, now)
            else:
                live = True
            if live:
                kept.append(ref)
        kept.reverse()
        if kept != st.sent:
            st.sent = kept

    # --- state changes -----------------------------------------------------------------

    def _take(self, st: PoolState, uid: str, ck: str) -> dict[str, Any]:
        sandbox = {**st.sandboxes[uid], "state": CLAIMED, "claim": ck}
        st._ready.pop(uid, None)
        st._starting.pop(uid, None)
        st.sandboxes[uid] = sandbox
        return sandbox

    def _end_claim(self, st: PoolState, ck: str, phase: str, message: str, t: float, result: PoolResult) -> None:
        entry = st.claims[ck]
        if entry.get("sandbox"):
            self._delete_sandbox(st, entry["sandbox"], t, result)
        old = _status(entry)
        status = replace(old, phase=phase, message=message, reason="", next_step="",
                         retry_after_s=None, alternatives=(), answered_at=t)
        # Expired (Retain) keeps the claim until it is deleted; the others are gone from now.
        st.claims[ck] = {**entry, "sandbox": "", "status": to_plain(status), "shutdown": None,
                         "gone": None if phase == EXPIRED else t}
        self._say(st, ck, result, status)

    def _retire(self, st: PoolState, ck: str, t: float) -> None:
        """A claim of the name with another uid came: the ended one is kept by uid (rule 1)."""
        entry = st.claims[ck]
        gone = entry.get("gone")
        st.ended[entry["uid"]] = {"ck": ck, "status": entry["status"], "gone": t if gone is None else float(gone)}
        st._uids.pop(entry["uid"], None)

    def _record(self, st: PoolState, ck: str, claim: SandboxClaim, status: SandboxClaimStatus, sandbox: str,
                path: str, gone: float | None = None) -> None:
        st.claims[ck] = {"uid": claim.uid, "sandbox": sandbox, "path": path, "status": to_plain(status),
                         "shutdown": claim.shutdown_time, "policy": claim.shutdown_policy, "gone": gone}
        st._uids[claim.uid] = ck

    def _update(self, st: PoolState, ck: str, status: SandboxClaimStatus, result: PoolResult) -> None:
        st.claims[ck] = {**st.claims[ck], "status": to_plain(status)}
        self._say(st, ck, result, status)

    def _refill_eta(self, st: PoolState, t: float) -> float | None:
        """Seconds until a sandbox of the pool could be ready: none is starting and the pool
        is not refilling (replicas 0): None."""
        pool = st.pool
        if pool is None or pool.replicas == 0:
            return None
        return round(max(0.0, 1.0 - st.tokens) / pool.refill_per_s + 1.0, 1)  # a round, then a scheduling cycle

    @staticmethod
    def _count(st: PoolState, name: str) -> None:
        st.stats[name] = st.stats.get(name, 0) + 1

    @staticmethod
    def _reserved(st: PoolState) -> int:
        return sum(int(b["count"]) for b in st.bursts.values() if not b.get("ended"))

    def _status_view(self, st: PoolState) -> tuple[Any, ...]:
        return (len(st._ready), len(st._starting), len(st.sandboxes), tuple(sorted(st.stats.items())),
                st.message, None if st.pool is None else (st.pool.replicas, st.pool.generation), st.deleted,
                self._reserved(st))

    def _pool_status(self, st: PoolState, now: float) -> Output:
        namespace, name = st.key.split("/", 1)
        s = st.stats
        status = SandboxPoolStatus(
            namespace=namespace, name=name, replicas=0 if st.pool is None or st.deleted else st.pool.replicas,
            ready=len(st._ready), starting=len(st._starting), claimed=len(st.sandboxes) - st.unclaimed(),
            claims=s.get("claims", 0), warm_hits=s.get("warm_hits", 0), starting_hits=s.get("starting_hits", 0),
            cold=s.get("cold", 0), refused=s.get("refused", 0), reserved=self._reserved(st), message=st.message,
            at=now, observed_generation=0 if st.pool is None else st.pool.generation)
        return Output(topics.SANDBOX_STATUS, name, status)  # keyed by the pool's name, as the catalogue says
