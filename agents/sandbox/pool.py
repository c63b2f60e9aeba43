"""The warm pool's core: one writer per pool, so no two claims ever adopt the same sandbox.

Everything about a pool arrives on its own `sandbox` partition, keyed `namespace/pool`: the
pool (with its template resolved), its claims and their deletions, its bursts, the Bindings
and SchedulingFeedback of its pods (forwarded there by uid: `templates.pool_of`) and its
timer ticks. `PoolCore.apply` takes a batch of them in log order and decides; the agent
(`agents.adapters.sandbox`) runs it in the stateful loop, so the pool's state is written in
the same step as its outputs and a replay after a crash re-sends, never re-decides.

The state of a pool (`PoolState`): the pool record; its sandboxes by uid, each starting
(published, not bound yet), ready (bound, unclaimed) or claimed (by one claim); its claims by
`namespace/name`, each with the status last sent (the recorded answer); its bursts; the refill
rate limiter's tokens; the tick armed. Rules:

1. **A claim is decided once.** A claim whose uid is recorded gets its recorded status again
   (a redelivery, even with changed fields, changes nothing). Otherwise it is validated
   (a bad claim, an unknown or deleted pool, env the template refuses: Refused, naming the
   field, and a problem for the dead-letter topic), then it takes, in this order: the oldest
   ready sandbox (path `warm`: Ready at once, no scheduling cycle), the oldest starting one
   (path `starting`: Ready when its Binding arrives), or, when the pool's `overflow` is Allow,
   a pod started for it through the scheduler (path `cold`: its pod carries the claim's uid
   label, so a burst's reservations take it first); with Deny it is Refused with what to do.
   Claim-time env and metadata never disqualify adoption: they travel on the status.
2. **A sandbox has at most one claim**: a sandbox leaves the ready and starting sets when it
   is claimed, and only unclaimed sandboxes are ever picked (property-tested).
3. **Refill** keeps `replicas` unclaimed sandboxes (ready + starting): at most `refill_batch`
   per round and `refill_per_s` a second (tokens counted in log time). Rounds happen at ticks
   and pool changes only, in log order: a claim that leaves a deficit arms a tick (when the
   next round's tokens are there), so a batch of claims decides as the same claims one by one. A pool above its replicas (shrunk, deleted) deletes unclaimed sandboxes, starting
   ones first. Recreate deletes unclaimed sandboxes of an older template at once;
   OnReplenish lets them be claimed.
4. **Lifecycles**: a claim's `shutdown_time` deletes its sandbox (status Expired with Retain,
   Deleted otherwise); a deleted claim deletes its sandbox. Ended claims are kept for
   `retention_s` of log time (a redelivery in that window still gets its answer), then dropped.
5. **Bursts** become Reservations (`templates.burst_reservations`) once per burst name.

Time is the log's: `times` (each record's log time) and `now` (the batch's newest), never a
clock read here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
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
    PodDeleted,
    Record,
    SandboxBurst,
    SandboxClaim,
    SandboxClaimDeleted,
    SandboxClaimStatus,
    SandboxPoolStatus,
    SandboxTick,
    SandboxWarmPool,
    SandboxWarmPoolDeleted,
    SchedulingFeedback,
)

STARTING, READY, CLAIMED = "starting", "ready", "claimed"
WARM, VIA_STARTING, COLD = "warm", "starting", "cold"
READY_PHASE, PENDING, REFUSED, EXPIRED, DELETED = "Ready", "Pending", "Refused", "Expired", "Deleted"
NOT_FOUND, POOL_EMPTY, INVALID, UNSCHEDULABLE = "WarmPoolNotFound", "WarmPoolEmpty", "InvalidClaim", "Unschedulable"
ENDED = frozenset({REFUSED, EXPIRED, DELETED})
POOL_KINDS = (SandboxWarmPool, SandboxWarmPoolDeleted, SandboxClaim, SandboxClaimDeleted, SandboxBurst, SandboxTick,
              Binding, SchedulingFeedback)


def claim_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def _status(entry: dict[str, Any]) -> SandboxClaimStatus:
    """A claim's recorded status."""
    return cast(SandboxClaimStatus, decode_object(entry["status"], SandboxClaimStatus))


class Tracked(dict[str, Any]):
    """A map that remembers which keys were set or removed since `changed` was last cleared."""

    def __init__(self, items: dict[str, Any] | None = None) -> None:
        super().__init__(items or {})
        self.changed: set[str] = set()

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self.changed.add(key)

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
    seq: int = 0  # the next sandbox's number
    sandboxes: Tracked = field(default_factory=Tracked)  # uid -> {name, state, node, claim, since, hash}
    claims: Tracked = field(default_factory=Tracked)  # ns/name -> {uid, sandbox, path, status, shutdown, gone}
    bursts: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {mode, count, until}
    tokens: float = 0.0
    tokens_at: float = 0.0
    armed: float | None = None  # the log time of the tick asked for (None: none pending)
    stats: dict[str, int] = field(default_factory=dict)
    message: str = ""
    # In memory only: unclaimed sandboxes in pick order, rebuilt on load.
    _ready: dict[str, None] = field(default_factory=dict, repr=False, compare=False)
    _starting: dict[str, None] = field(default_factory=dict, repr=False, compare=False)
    _plain: dict[str, tuple[dict[str, Any], object]] = field(default_factory=dict, repr=False, compare=False)

    def index(self) -> None:
        """Rebuild the pick order from the sandboxes (oldest first: by since, then number)."""
        def order(uid: str) -> tuple[float, int, str]:
            s = self.sandboxes[uid]
            return (float(s["since"]), int(s.get("n", 0)), uid)
        self._ready = {u: None for u in sorted((u for u, s in self.sandboxes.items() if s["state"] == READY), key=order)}
        self._starting = {u: None for u in sorted(
            (u for u, s in self.sandboxes.items() if s["state"] == STARTING), key=order)}

    def unclaimed(self) -> int:
        return len(self._ready) + len(self._starting)

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
            "seq": self.seq,
            "sandboxes": self._entries("sandboxes", self.sandboxes),
            "claims": self._entries("claims", self.claims),
            "bursts": self.bursts,
            "tokens": self.tokens,
            "tokens_at": self.tokens_at,
            "armed": self.armed,
            "stats": self.stats,
            "message": self.message,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PoolState:
        pool = raw.get("pool")
        state = cls(
            key=str(raw["key"]),
            pool=cast(SandboxWarmPool, decode_object(pool, SandboxWarmPool)) if pool else None,
            deleted=bool(raw.get("deleted", False)),
            seq=int(raw.get("seq", 0)),
            sandboxes=Tracked({k: dict(v) for k, v in (raw.get("sandboxes") or {}).items()}),
            claims=Tracked({k: dict(v) for k, v in (raw.get("claims") or {}).items()}),
            bursts={k: dict(v) for k, v in (raw.get("bursts") or {}).items()},
            tokens=float(raw.get("tokens", 0.0)),
            tokens_at=float(raw.get("tokens_at", 0.0)),
            armed=raw.get("armed"),
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


class PoolCore:
    """Decides a pool's batches (module docstring). Pure: no Kafka, no clock."""

    def __init__(self, retention_s: float = 600.0) -> None:
        self.retention_s = retention_s

    # --- the batch ---------------------------------------------------------------------

    def apply(self, st: PoolState, records: Iterable[Record], times: Iterable[float], now: float,
              result: PoolResult) -> None:
        before = self._status_view(st)
        for record, t in zip(records, times, strict=True):
            if isinstance(record, SandboxClaim):
                self._claim(st, record, t, result)
            elif isinstance(record, Binding):
                self._bound(st, record, t, result)
            elif isinstance(record, SandboxWarmPool):
                self._pool(st, record, result)
                self._advance(st, t, result)
            elif isinstance(record, SandboxClaimDeleted):
                self._claim_deleted(st, record, t, result)
            elif isinstance(record, SchedulingFeedback):
                self._feedback(st, record, t, result)
            elif isinstance(record, SandboxWarmPoolDeleted):
                st.deleted = True
                self._advance(st, t, result)
            elif isinstance(record, SandboxBurst):
                self._burst(st, record, t, result)
            elif isinstance(record, SandboxTick):
                if st.armed is not None and record.at >= st.armed - 1e-6:
                    st.armed = None
                self._advance(st, t, result)
        self._settle(st, now, result)
        if self._status_view(st) != before:
            result.outputs.append(self._pool_status(st, now))

    @staticmethod
    def empty(st: PoolState) -> bool:
        return (st.pool is None or st.deleted) and not st.sandboxes and not st.claims and not st.bursts

    def expires(self, st: PoolState) -> float:
        gone = [float(c["gone"]) for c in st.claims.values() if c.get("gone") is not None]
        return min(gone) + self.retention_s if gone else 0.0

    def due(self, st: PoolState, now: float) -> float | None:
        """When the pool next needs a tick (a refill deficit, a shutdown time), else None."""
        wants: list[float] = []
        pool = st.pool
        deficit = 0 if pool is None or st.deleted else pool.replicas - st.unclaimed()
        if pool is not None and deficit > 0:  # when the next round's tokens are there: a batch, or what is missing
            need = min(deficit, pool.refill_batch)
            wants.append(st.tokens_at + max(0.0, need - st.tokens) / pool.refill_per_s)
        shutdowns = [float(c["shutdown"]) for c in st.claims.values()
                     if c.get("shutdown") is not None and c.get("gone") is None and c["status"]["phase"] not in ENDED]
        if shutdowns:
            wants.append(min(shutdowns))
        return max(min(wants), now) if wants else None

    # --- inputs ------------------------------------------------------------------------

    def _pool(self, st: PoolState, pool: SandboxWarmPool, result: PoolResult) -> None:
        try:
            tpl.validate_pool(pool)
        except FieldError as exc:
            result.problems.append(Problem(exc.field, str(exc.value), str(exc), pool))
            return
        pool = dataclasses.replace(pool, template=tpl.with_hash(pool.template))
        if st.pool is None or st.deleted:
            st.tokens = float(pool.refill_batch)  # a new pool starts with a full round
        st.pool, st.deleted = pool, False

    def _claim(self, st: PoolState, claim: SandboxClaim, t: float, result: PoolResult) -> None:
        ck = claim_key(claim.namespace, claim.name)
        entry = st.claims.get(ck)
        if entry is not None and entry["uid"] == claim.uid:
            result.outputs.append(Output(topics.SANDBOX_STATUS, ck, _status(entry)))
            return
        if entry is not None and entry.get("gone") is None:
            self._end_claim(st, ck, DELETED, "replaced by a claim of the same name with another uid", t, result)
        self._count(st, "claims")
        base = SandboxClaimStatus(uid=claim.uid, namespace=claim.namespace, name=claim.name,
                                  warm_pool=claim.warm_pool, phase=PENDING, env=claim.env, labels=claim.labels,
                                  annotations=claim.annotations, claimed_at=claim.created, answered_at=t)
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
            status = dataclasses.replace(base, phase=REFUSED, reason=reason, message=str(refusal),
                                         next_step="FixClaim" if reason == INVALID else "CreateWarmPool")
            self._record(st, ck, claim, status, "", "", t, result, gone=t)
            self._count(st, "refused")
            return
        assert pool is not None
        if st._ready:
            uid = next(iter(st._ready))
            sandbox = self._take(st, uid, ck)
            status = dataclasses.replace(base, phase=READY_PHASE, path=WARM, sandbox=sandbox["name"], pod_uid=uid,
                                         node=sandbox["node"])
            self._record(st, ck, claim, status, uid, WARM, t, result)
            self._count(st, "warm_hits")
        elif st._starting:
            uid = next(iter(st._starting))
            sandbox = self._take(st, uid, ck)
            status = dataclasses.replace(base, path=VIA_STARTING, sandbox=sandbox["name"], pod_uid=uid,
                                         reason=POOL_EMPTY, message="no ready sandbox: took one that is starting")
            self._record(st, ck, claim, status, uid, VIA_STARTING, t, result)
            self._count(st, "starting_hits")
        elif pool.overflow == "Allow":
            uid = tpl.cold_uid(claim.namespace, claim.warm_pool, claim.uid)
            pod = tpl.sandbox_pod(pool, uid, claim.name, t, claim)
            st.sandboxes[uid] = {"name": claim.name, "state": CLAIMED, "node": "", "claim": ck, "since": t,
                                 "hash": pool.template.hash, "n": -1, "cold": True}
            result.outputs.append(Output(topics.PODS, uid, pod))
            status = dataclasses.replace(base, path=COLD, sandbox=claim.name, pod_uid=uid, reason=POOL_EMPTY,
                                         message="the warm pool is empty: a sandbox is starting through the scheduler")
            self._record(st, ck, claim, status, uid, COLD, t, result)
            self._count(st, "cold")
        else:
            wait = self._refill_eta(st, t)
            alternatives = [Alternative("ScaleWarmPool", f"raise spec.replicas of {pool.name} above "
                                               f"{pool.replicas}", {"spec.replicas": str(pool.replicas + 1)})]
            if wait is not None:
                alternatives.insert(0, Alternative(
                    "Wait", f"a sandbox of the pool is expected ready in {wait:.1f}s", {"retryAfterSeconds": f"{wait:.1f}"}))
            status = dataclasses.replace(
                base, phase=REFUSED, reason=POOL_EMPTY, retry_after_s=wait, alternatives=tuple(alternatives),
                next_step="Retry" if wait is not None else "ScaleWarmPool",
                message=f"warm pool {pool.name} has no unclaimed sandbox and its overflow policy is Deny")
            self._record(st, ck, claim, status, "", "", t, result, gone=t)
            self._count(st, "refused")

    def _bound(self, st: PoolState, binding: Binding, t: float, result: PoolResult) -> None:
        sandbox = st.sandboxes.get(binding.uid)
        if sandbox is None or sandbox["node"]:
            return  # not ours any more, or a redelivery
        sandbox = {**sandbox, "node": binding.node, "since": t}
        if sandbox["state"] == STARTING:
            sandbox["state"] = READY
            st._starting.pop(binding.uid, None)
            st._ready[binding.uid] = None
            st.sandboxes[binding.uid] = sandbox
            return
        st.sandboxes[binding.uid] = sandbox
        ck: str = sandbox.get("claim") or ""
        entry = st.claims.get(ck) if ck else None
        if entry is None or entry["status"]["phase"] != PENDING:
            return
        status = dataclasses.replace(_status(entry), phase=READY_PHASE,
                                     node=binding.node, reason="", message="", answered_at=t)
        self._update(st, ck, status, result)

    def _feedback(self, st: PoolState, fb: SchedulingFeedback, t: float, result: PoolResult) -> None:
        sandbox = st.sandboxes.get(fb.uid)
        if sandbox is None or sandbox["node"]:
            return
        ck: str = sandbox.get("claim") or ""
        entry = st.claims.get(ck) if ck else None
        if entry is None:
            st.message = fb.message  # a refill that cannot be placed: the pool's status says why
            return
        old = _status(entry)
        if old.phase != PENDING:
            return
        hint: dict[str, Any] = {"reason": fb.reason or UNSCHEDULABLE, "next_step": fb.next_step or "Wait",
                                "retry_after_s": fb.retry_after_s}
        alts = fb.alternatives
        status = dataclasses.replace(old, message=fb.message, alternatives=alts, answered_at=t, **hint)
        if status != dataclasses.replace(old, answered_at=t):
            self._update(st, ck, status, result)

    def _claim_deleted(self, st: PoolState, gone: SandboxClaimDeleted, t: float, result: PoolResult) -> None:
        ck = claim_key(gone.namespace, gone.name)
        entry = st.claims.get(ck)
        if entry is None or entry["uid"] != gone.uid or entry.get("gone") is not None:
            return
        self._end_claim(st, ck, DELETED, "the claim was deleted", t, result)

    def _burst(self, st: PoolState, burst: SandboxBurst, t: float, result: PoolResult) -> None:
        try:
            tpl.validate_burst(burst)
        except FieldError as exc:
            result.problems.append(Problem(exc.field, str(exc.value), str(exc), burst))
            return
        if burst.name in st.bursts:
            return  # decided once
        pool = st.pool
        if pool is None or st.deleted:
            result.problems.append(Problem("spec.warmPoolRef.name", burst.warm_pool, f"no SandboxWarmPool "
                                           f"{burst.warm_pool!r} in namespace {burst.namespace!r}", burst))
            return
        created = burst.created or t
        for r in tpl.burst_reservations(pool, burst, created):
            result.outputs.append(Output(topics.PODS, r.uid, r))
        st.bursts[burst.name] = {"mode": burst.mode, "count": burst.count, "until": created + burst.ttl_s}

    # --- after the batch ---------------------------------------------------------------

    def _settle(self, st: PoolState, now: float, result: PoolResult) -> None:
        """Forget claims ended a retention ago; ask for a tick when one is due."""
        for ck in [ck for ck, c in st.claims.items()
                   if c.get("gone") is not None and float(c["gone"]) + self.retention_s <= now]:
            del st.claims[ck]
        due = self.due(st, now)
        if due is not None and (st.armed is None or due < st.armed - 1e-6):
            st.armed = due
            result.ticks.append(due)

    def _advance(self, st: PoolState, t: float, result: PoolResult) -> None:
        """What time `t` brings (at a tick, or a pool's change, in log order; never at a claim, so
        a batch of claims decides as the same claims one by one): shutdown times that passed,
        bursts that ended, then the pool brought to its replicas (shrunk, or refilled within
        the rate limit)."""
        for ck, entry in list(st.claims.items()):
            if (entry.get("gone") is None and entry.get("shutdown") is not None and float(entry["shutdown"]) <= t
                    and entry["status"]["phase"] not in ENDED):
                phase = EXPIRED if entry.get("policy", "Retain") == "Retain" else DELETED
                self._end_claim(st, ck, phase, "the claim's shutdown time passed", t, result)
        for name in [n for n, b in st.bursts.items() if float(b["until"]) <= t]:
            del st.bursts[name]
        pool = st.pool
        now = t
        replicas = 0 if pool is None or st.deleted else pool.replicas
        if pool is not None and pool.update_strategy == "Recreate":
            for uid in [u for u in (*st._starting, *st._ready) if st.sandboxes[u]["hash"] != pool.template.hash]:
                self._delete_sandbox(st, uid, result)
        surplus = st.unclaimed() - replicas
        if surplus > 0:
            victims = list(reversed(st._starting))[:surplus]
            victims += list(reversed(st._ready))[:surplus - len(victims)]
            for uid in victims:
                self._delete_sandbox(st, uid, result)
        elif surplus < 0 and pool is not None:
            st.tokens = min(float(pool.refill_batch), st.tokens + (now - st.tokens_at) * pool.refill_per_s)
            st.tokens_at = now
            n = min(-surplus, int(math.floor(st.tokens + 1e-9)))
            st.tokens -= n
            for _ in range(n):
                self._start(st, pool, now, result)
        elif pool is not None:
            st.tokens = min(float(pool.refill_batch), st.tokens + (now - st.tokens_at) * pool.refill_per_s)
            st.tokens_at = now

    def _start(self, st: PoolState, pool: SandboxWarmPool, now: float, result: PoolResult) -> None:
        n = st.seq
        st.seq += 1
        uid = tpl.sandbox_uid(pool.namespace, pool.name, n)
        name = f"{pool.name}-{n}"
        st.sandboxes[uid] = {"name": name, "state": STARTING, "node": "", "claim": "", "since": now,
                             "hash": pool.template.hash, "n": n}
        st._starting[uid] = None
        result.outputs.append(Output(topics.PODS, uid, tpl.sandbox_pod(pool, uid, name, now)))

    def _delete_sandbox(self, st: PoolState, uid: str, result: PoolResult) -> None:
        sandbox = st.sandboxes.pop(uid, None)
        st.sandboxes.touch(uid)
        st._ready.pop(uid, None)
        st._starting.pop(uid, None)
        if sandbox is not None:
            result.outputs.append(Output(topics.PODS, uid, PodDeleted(uid=uid, name=sandbox["name"],
                                                                     namespace=st.key.split("/", 1)[0])))

    def _take(self, st: PoolState, uid: str, ck: str) -> dict[str, Any]:
        sandbox = {**st.sandboxes[uid], "state": CLAIMED, "claim": ck}
        st._ready.pop(uid, None)
        st._starting.pop(uid, None)
        st.sandboxes[uid] = sandbox
        return sandbox

    def _end_claim(self, st: PoolState, ck: str, phase: str, message: str, t: float, result: PoolResult) -> None:
        entry = st.claims[ck]
        if entry.get("sandbox"):
            self._delete_sandbox(st, entry["sandbox"], result)
        old = _status(entry)
        status = dataclasses.replace(old, phase=phase, message=message, reason="", next_step="",
                                     retry_after_s=None, alternatives=(), answered_at=t)
        # Expired (Retain) keeps the claim until it is deleted; the others are gone from now.
        st.claims[ck] = {**entry, "sandbox": "", "status": to_plain(status), "shutdown": None,
                         "gone": None if phase == EXPIRED else t}
        result.outputs.append(Output(topics.SANDBOX_STATUS, ck, status))

    def _record(self, st: PoolState, ck: str, claim: SandboxClaim, status: SandboxClaimStatus, sandbox: str,
                path: str, t: float, result: PoolResult, gone: float | None = None) -> None:
        st.claims[ck] = {"uid": claim.uid, "sandbox": sandbox, "path": path, "status": to_plain(status),
                         "shutdown": claim.shutdown_time, "policy": claim.shutdown_policy, "gone": gone}
        result.outputs.append(Output(topics.SANDBOX_STATUS, ck, status))

    def _update(self, st: PoolState, ck: str, status: SandboxClaimStatus, result: PoolResult) -> None:
        st.claims[ck] = {**st.claims[ck], "status": to_plain(status)}
        result.outputs.append(Output(topics.SANDBOX_STATUS, ck, status))

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
    def _status_view(st: PoolState) -> tuple[Any, ...]:
        return (len(st._ready), len(st._starting), len(st.sandboxes), tuple(sorted(st.stats.items())),
                st.message, None if st.pool is None else st.pool.replicas, st.deleted,
                sum(int(b["count"]) for b in st.bursts.values()))

    def _pool_status(self, st: PoolState, now: float) -> Output:
        namespace, name = st.key.split("/", 1)
        s = st.stats
        status = SandboxPoolStatus(
            namespace=namespace, name=name, replicas=0 if st.pool is None or st.deleted else st.pool.replicas,
            ready=len(st._ready), starting=len(st._starting), claimed=len(st.sandboxes) - st.unclaimed(),
            claims=s.get("claims", 0), warm_hits=s.get("warm_hits", 0), starting_hits=s.get("starting_hits", 0),
            cold=s.get("cold", 0), refused=s.get("refused", 0),
            reserved=sum(int(b["count"]) for b in st.bursts.values()), message=st.message, at=now)
        return Output(topics.SANDBOX_STATUS, st.key, status)
