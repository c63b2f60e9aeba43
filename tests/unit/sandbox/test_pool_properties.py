"""The warm pool's invariants, property-tested through the agent's core (`SandboxCore`: the
stored JSON round-tripped as a restore reads it, `timers()` after a restore, `expires()` swept as
the loop sweeps) under any interleaving of claims, deletions, Bindings, feedback, ticks (due,
early, late, repeated), pool changes and deletions, bursts, redeliveries, restores, and crashes
between the table write and the outputs (the batch read again against the state it left, the
state before it, or from an earlier committed offset):

- no sandbox is ever adopted by two claims, and a claim's answers always name one sandbox;
- once a round ran, a pool never has more unclaimed sandboxes than its replicas, never starts
  more pods in a round than its `refill_batch`, and its tokens never go negative;
- nothing leaks or hangs: every pod published that the pool no longer holds was deleted after
  it, every sandbox it holds unbound had its pod published, every claimed sandbox is its claim's,
  every claim it holds had its recorded answer said last; once the scheduler binds what is pending and the timers fire, the
  pool is at its replicas; once the pool and its claims are deleted, its key leaves the table;
- batched adoption equals one by one: the same records as one batch or one per batch (at the
  same log times) give every claim the same answers and publish and delete the same pods; and a
  restore between batches changes no output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.adapters.loop import Outcome
from agents.adapters.sandbox import SandboxCore
from agents.sandbox.pool import PoolCore, PoolResult, PoolState
from schemas.codec import to_plain
from schemas.records import (
    Pod,
    PodDeleted,
    PodTerminated,
    Record,
    Reservation,
    SandboxBurst,
    SandboxClaimStatus,
    SandboxTick,
    SandboxWarmPool,
    SandboxWarmPoolDeleted,
    SchedulingFeedback,
)
from tests.builders import SANDBOX_NS as NS
from tests.builders import SANDBOX_POOL as KEY
from tests.builders import (
    make_pool,
    make_sandbox_claim,
    make_template,
    pool_tick,
    sandbox_bound,
    sandbox_claim_deleted,
    tick_at,
)

R = 1e6  # redeliveries come within a retention (docs/architecture.md)
TEMPLATES = [make_template(cpu) for cpu in (250, 500)]
NAMES = "abc"

# --- abstract actions, resolved against what the driver has seen -----------------------------

pools = st.builds(lambda replicas, batch, rate, overflow, strategy, template: (
    "pool", replicas, batch, rate, overflow, strategy, template),
    st.integers(0, 4), st.integers(1, 3), st.sampled_from([0.5, 1.0, 4.0]), st.sampled_from(["Allow", "Deny"]),
    st.sampled_from(["OnReplenish", "Recreate"]), st.integers(0, 1))
records = st.one_of(
    pools,
    st.just(("pool-deleted",)),
    st.tuples(st.just("claim"), st.sampled_from(NAMES), st.booleans(),
              st.one_of(st.none(), st.floats(-2.0, 12.0)), st.sampled_from(["Retain", "Delete"])),
    st.tuples(st.just("claim-deleted"), st.sampled_from(NAMES), st.booleans()),
    st.tuples(st.just("bind"), st.integers(0, 30), st.sampled_from(["n0", "n1"])),
    st.tuples(st.just("feedback"), st.integers(0, 30), st.integers(0, 2), st.sampled_from(["full", "taints"])),
    st.tuples(st.just("lost"), st.integers(0, 30), st.booleans()),  # removed by someone else (deciders send it on)
    st.tuples(st.just("tick"), st.sampled_from(["due", "due", "early", "late", "again"])),
    st.tuples(st.just("burst"), st.sampled_from(["b1", "b2"]), st.integers(1, 3), st.floats(1.0, 20.0)),
    st.tuples(st.just("redeliver"), st.integers(0, 7)),
)
steps = st.one_of(
    st.tuples(st.just("batch"), st.lists(st.tuples(records, st.floats(-1.0, 0.0)), min_size=1, max_size=6),
              st.floats(0.0, 4.0)),
    st.tuples(st.just("restore"), st.floats(-1.5, 1.5)),
    st.tuples(st.just("crash"), st.sampled_from(["after", "after-in-memory", "before", "earlier"])),
)


@dataclasses.dataclass
class Batch:
    records: list[Record]
    times: list[float]
    now: float
    stored: dict[str, Any] | None  # the stored value before it
    seen: int  # how many visible outputs there were before it
    timers: set[float]  # the ticks it asked for (armed only once it is durable)


class Driver:
    """One pool's key through `SandboxCore`, as the stateful loop drives it, with the outside
    world's view: the outputs visible on the topics, and the timers armed."""

    def __init__(self) -> None:
        self.core = SandboxCore(retention_s=R, clock=lambda: self.clock)
        self.stored: dict[str, Any] | None = None
        self.clock = 0.0  # the log's time (and this worker's clock, up to a skew at restores)
        self.visible: list[Any] = []  # outputs that reached their topics, in order
        self.ever: set[str] = set()  # every pod uid ever sent, lost sends included
        self.timers: set[float] = set()  # ticks asked for and armed on this worker
        self.fired: list[float] = []
        self.lost: set[str] = set()  # pods removed by someone else: gone without the pool's deletion
        self.inputs: list[Record] = []
        self.batches: list[Batch] = []
        self.gens: dict[str, int] = {}  # claim name -> its current uid's generation
        self.rounds = False  # a round ran: the replicas bound holds from then on

    # -- resolving abstract records --

    def uid(self, name: str, gen: int | None = None) -> str:
        return f"u-{name}-{self.gens.get(name, 0) if gen is None else gen}"

    def published(self) -> list[str]:
        return sorted({o.record.uid for o in self.visible if isinstance(o.record, Pod)})

    def resolve(self, action: tuple[Any, ...]) -> Record | None:
        kind = action[0]
        if kind == "pool":
            _, replicas, batch, rate, overflow, strategy, template = action
            return make_pool(replicas, template=TEMPLATES[template], refill_batch=batch, refill_per_s=rate,
                             overflow=overflow, update_strategy=strategy)
        if kind == "pool-deleted":
            return SandboxWarmPoolDeleted(namespace=NS, name="p")
        if kind == "claim":
            _, name, new, shutdown, policy = action
            if new:
                self.gens[name] = self.gens.get(name, 0) + 1
            return make_sandbox_claim(name, self.uid(name), shutdown_time=None if shutdown is None
                                      else self.clock + shutdown, shutdown_policy=policy)
        if kind == "claim-deleted":
            _, name, old = action
            gen = max(0, self.gens.get(name, 0) - 1) if old else None
            return sandbox_claim_deleted(name, self.uid(name, gen))
        if kind in ("bind", "feedback", "lost"):
            pods = self.published()
            if not pods:
                return None
            uid = pods[action[1] % len(pods)]
            if kind == "lost":
                self.lost.add(uid)
                return PodDeleted(uid=uid, namespace=NS) if action[2] else PodTerminated(
                    uid=uid, node="n0", decision_key=uid, reason="NodeDeleted")
            if kind == "bind":
                return sandbox_bound(uid, action[2])
            return SchedulingFeedback(uid=uid, namespace=NS, name=uid, attempt=action[2], message=action[3])
        if kind == "tick":
            how = action[1]
            if how == "due" and self.timers:
                at = min(self.timers)
                self.timers.discard(at)
            elif how == "again" and self.fired:
                at = self.fired[-1]
            elif how == "late":
                at = self.clock - 5.0
            else:
                at = self.clock + 3.0
            self.fired.append(at)
            return pool_tick(at)
        if kind == "burst":
            _, name, count, ttl = action
            return SandboxBurst(namespace=NS, name=name, warm_pool="p", count=count, ttl_s=ttl)
        if kind == "redeliver":
            recent = self.inputs[-8:]  # mostly what was read lately (a forwarder's or producer's retry)
            return recent[action[1] % len(recent)] if recent else None
        raise AssertionError(kind)

    # -- the loop --

    def restore(self, skew: float = 0.0) -> None:
        """A new worker: the state read back from the changelog, the timers re-armed from it."""
        self.core.decoded.clear()
        self.stored = None if self.stored is None else orjson.loads(orjson.dumps(self.stored))
        self.timers = set()
        if self.stored is not None:
            self.core.clock = lambda: self.clock + skew
            self.timers = {tick_at(t) for t in self.core.timers(KEY, self.stored)}
            self.core.clock = lambda: self.clock

    def apply(self, records: list[Record], times: list[float], now: float) -> Outcome:
        before = self.stored
        outcome = Outcome()
        self.stored = self.core.apply(KEY, self.stored, records, times, now, outcome)
        asked = {tick_at(t) for t in outcome.timers}
        self.batches.append(Batch(records, times, now, before, len(self.visible), asked))
        self.visible += outcome.first
        self.timers |= asked
        self.inputs += records
        if any(isinstance(r, (SandboxTick, SandboxWarmPool, SandboxWarmPoolDeleted)) for r in records):
            self.rounds = True
        self.check_batch(records, outcome)
        expires = self.core.expires(KEY, self.stored) if self.stored is not None else 0.0
        if 0 < expires < now:  # the loop's visit of a key with something to forget
            visit = Outcome()
            self.stored = self.core.apply(KEY, self.stored, [], [], now, visit)
            self.visible += visit.first
            self.timers |= {tick_at(t) for t in visit.timers}
        self.check()
        return outcome

    def floor(self) -> float:
        """The partition's clock: the newest log time decided (the loop judges no record earlier)."""
        return max((b.now for b in self.batches), default=0.0)

    def batch(self, actions: list[tuple[tuple[Any, ...], float]], advance: float) -> None:
        floor = self.floor()
        self.clock = max(self.clock, floor) + advance
        # Producers' clocks differ: a record may be stamped before the one ahead of it in the
        # log, never before the partition's clock.
        resolved = [(r, max(floor, self.clock + jitter)) for a, jitter in actions if (r := self.resolve(a)) is not None]
        if resolved:
            self.apply([r for r, _ in resolved], [t for _, t in resolved], self.clock)

    def crash(self, how: str) -> None:
        """The worker died after writing the last batch's state, before its outputs went out
        (or before writing its state): the batch is read again."""
        if not self.batches:
            return
        last = self.batches.pop()
        del self.visible[last.seen:]  # its outputs never reached their topics
        records, times, now = last.records, last.times, last.now
        if how == "before":  # its state was not written either: decided again as it was
            self.stored = last.stored
        else:  # read again against the state it left: judged at the partition's clock
            if how == "earlier" and self.batches:  # from an earlier committed offset (that batch's
                records = self.batches[-1].records + records  # outputs went out)
            times = [now] * len(records)
        if how == "after-in-memory":  # an aborted transaction: the table ahead in memory
            self.timers -= last.timers
        else:
            self.restore()
        self.apply(records, times, now)

    # -- what must hold --

    def state(self) -> PoolState | None:
        return None if self.stored is None else PoolState.from_json(orjson.loads(orjson.dumps(self.stored)))

    def check_batch(self, records: list[Record], outcome: Outcome) -> None:
        st = self.state()
        assert st is None or st.tokens >= -1e-9, st.tokens
        rounds = sum(isinstance(r, (SandboxTick, SandboxWarmPool, SandboxWarmPoolDeleted)) for r in records)
        started = {o.record.uid for o in outcome.first if isinstance(o.record, Pod)
                   and "~c-" not in o.record.uid} - self.ever
        self.ever |= {o.record.uid for o in outcome.first if isinstance(o.record, Pod)}
        batches = [r.refill_batch for r in records if isinstance(r, SandboxWarmPool)]
        limit = max([st.pool.refill_batch if st is not None and st.pool is not None else 0, *batches])
        assert len(started) <= rounds * limit, (len(started), rounds, limit)

    def check(self) -> None:
        answers: dict[str, set[str]] = {}
        holders: dict[str, set[str]] = {}
        reserved: dict[str, Reservation] = {}
        for o in self.visible:
            if isinstance(o.record, Reservation):  # a burst is reserved once: sent again only as it was
                assert reserved.setdefault(o.record.uid, o.record) == o.record, o.record.uid
            elif isinstance(o.record, SandboxClaimStatus):
                answers.setdefault(o.record.uid, set()).add(o.record.pod_uid)
                if o.record.pod_uid:
                    holders.setdefault(o.record.pod_uid, set()).add(o.record.uid)
        assert all(len(v) == 1 for v in answers.values()), {k: v for k, v in answers.items() if len(v) > 1}
        assert all(len(v) == 1 for v in holders.values()), {k: v for k, v in holders.items() if len(v) > 1}
        st = self.state()
        sandboxes = {} if st is None else dict(st.sandboxes)
        last: dict[str, str] = {}  # pod uid -> what was said of it last
        for o in self.visible:
            if isinstance(o.record, (Pod, PodDeleted)):
                last[o.record.uid] = type(o.record).__name__
        leaked = [u for u, what in last.items() if what == "Pod" and u not in sandboxes and u not in self.lost]
        assert not leaked, leaked
        unpublished = [u for u, s in sandboxes.items() if not s["node"] and last.get(u) != "Pod"]
        assert not unpublished, unpublished
        if st is None:
            return
        said: dict[str, SandboxClaimStatus] = {}
        for o in self.visible:
            if isinstance(o.record, SandboxClaimStatus):
                assert o.key == o.record.uid
                said[o.key] = o.record
        for ck, entry in st.claims.items():
            assert to_plain(said[entry["uid"]]) == entry["status"], ck
        orphans = [u for u, s in sandboxes.items() if s["state"] == "claimed"
                   and st.claims.get(s["claim"], {}).get("sandbox") != u]
        assert not orphans, orphans  # a claimed sandbox is its claim's, or it would never be deleted
        if self.rounds and st.pool is not None:
            replicas = 0 if st.deleted else st.pool.replicas
            assert st.unclaimed() <= replicas, (st.unclaimed(), replicas)

    # -- the end: the scheduler places what is pending, timers fire; then everything goes --

    def drain(self) -> None:
        for _ in range(200):
            st = self.state()
            pending = [u for u, s in (st.sandboxes.items() if st is not None else ()) if not s["node"]]
            if pending:
                self.clock += 0.5
                self.apply([sandbox_bound(u) for u in pending], [self.clock] * len(pending), self.clock)
            elif self.timers:
                at = min(self.timers)
                self.timers.discard(at)
                self.clock = max(self.clock, at) + 0.01
                self.apply([pool_tick(at)], [self.clock], self.clock)
            elif self.stored is not None and self.core.expires(KEY, self.stored):
                self.clock = max(self.clock, self.core.expires(KEY, self.stored)) + 1.0
                self.apply([], [], self.clock)
            else:
                return
        raise AssertionError("the pool never settled")


def run(steps_: Iterable[tuple[Any, ...]]) -> Driver:
    d = Driver()
    for step in steps_:
        if step[0] == "batch":
            d.batch(step[1], step[2])
        elif step[0] == "restore":
            d.restore(step[1])
        else:
            d.crash(step[1])
    return d


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(steps, min_size=1, max_size=25), st.sampled_from([None, "after", "after-in-memory", "before", "earlier"]))
def test_no_sandbox_is_adopted_twice_nothing_leaks_and_the_pool_settles(steps_: list[tuple[Any, ...]],
                                                                        crash: str | None) -> None:
    d = run(steps_)
    if crash is not None:  # the last batch lost (nothing after it heals what it left)
        d.crash(crash)
    d.drain()  # every timer fired, every pod bound: the pool is at its replicas
    st = d.state()
    if st is not None and st.pool is not None and not st.deleted:
        assert st.unclaimed() == st.pool.replicas, (st.unclaimed(), st.pool.replicas)
    # Then the pool and every claim go: nothing of the key is left a retention later.
    d.clock += 1.0
    gone: list[Record] = [SandboxWarmPoolDeleted(namespace=NS, name="p")]
    if st is not None:
        gone += [sandbox_claim_deleted(ck.split("/", 1)[1], c["uid"]) for ck, c in st.claims.items()]
    d.apply(gone, [d.clock] * len(gone), d.clock)
    d.drain()
    assert d.stored is None, d.stored


# --- batched adoption equals one by one --------------------------------------------------------

def decided(outputs: Iterable[Any]) -> tuple[dict[str, list[Any]], dict[str, Any], set[str]]:
    """What a run decided: each claim's answers in order (a repeat of the last one is a re-send),
    the pods published, the pods deleted."""
    answers: dict[str, list[Any]] = {}
    pods: dict[str, Any] = {}
    deleted: set[str] = set()
    for o in outputs:
        r = o.record
        if isinstance(r, SandboxClaimStatus):
            said = answers.setdefault(r.uid, [])
            if r not in said:
                said.append(r)
        elif isinstance(r, Pod):
            assert pods.setdefault(r.uid, r) == r  # sent again, as it was
        elif isinstance(r, PodDeleted):
            deleted.add(r.uid)
    return answers, pods, deleted


def stream(actions: list[tuple[tuple[Any, ...], float]]) -> tuple[list[Record], list[float]]:
    """Records and log times from abstract actions, resolved against a pool run one by one (so
    Bindings name pods it published)."""
    d = Driver()
    out: list[Record] = []
    times: list[float] = []
    for action, step in actions:
        d.clock += step
        record = d.resolve(action)
        if record is None:
            continue
        out.append(record)
        times.append(d.clock)
        d.apply([record], [d.clock], d.clock)
    return out, times


def one_by_one(records: list[Record], times: list[float], restore: bool) -> list[Any]:
    """Each record a batch of its own; a round (a tick, a pool record) starts at most
    `refill_batch` pods of the pool."""
    core, state = PoolCore(retention_s=1e9), PoolState(KEY)
    outputs: list[Any] = []
    for record, t in zip(records, times, strict=True):
        result = PoolResult()
        core.apply(state, [record], [t], t, result)
        seen = {o.record.uid for o in outputs if isinstance(o.record, Pod)}
        started = {o.record.uid for o in result.outputs if isinstance(o.record, Pod) and "~c-" not in o.record.uid}
        assert len(started - seen) <= (state.pool.refill_batch if state.pool is not None else 0)
        outputs += result.outputs
        if restore:
            state = PoolState.from_json(orjson.loads(orjson.dumps(state.to_json())))
    return outputs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(records, st.floats(0.0, 3.0)), min_size=1, max_size=30), st.data())
def test_batched_adoption_equals_one_by_one_and_a_restore_changes_nothing(
        actions: list[tuple[tuple[Any, ...], float]], data: st.DataObject) -> None:
    records_, times = stream(actions)
    if not records_:
        return
    single = one_by_one(records_, times, restore=False)
    assert one_by_one(records_, times, restore=True) == single  # the JSON round trip decides alike
    # The same records cut into batches anywhere (each batch decided at its newest log time).
    cuts = sorted(data.draw(st.sets(st.integers(1, len(records_)), max_size=5)))
    core, state, batched = PoolCore(retention_s=1e9), PoolState(KEY), []
    for lo, hi in zip([0, *cuts], [*cuts, len(records_)], strict=True):
        if lo >= hi:
            continue
        result = PoolResult()
        core.apply(state, records_[lo:hi], times[lo:hi], max(times[lo:hi]), result)
        batched += result.outputs
    assert decided(batched) == decided(single)


# --- the state's time heaps equal a pass over its claims ---------------------------------------

claim_entries = st.fixed_dictionaries({
    "uid": st.just("u"), "gone": st.one_of(st.none(), st.integers(0, 9).map(float)),
    "shutdown": st.one_of(st.none(), st.integers(0, 9).map(float)),
    "status": st.fixed_dictionaries({"phase": st.sampled_from(["Pending", "Ready", "Expired", "Deleted"])})})
heap_steps = st.lists(st.one_of(
    st.tuples(st.just("claim"), st.sampled_from(NAMES), claim_entries),
    st.tuples(st.just("ended"), st.sampled_from(NAMES), st.integers(0, 9).map(float)),
    st.tuples(st.just("forget"), st.sampled_from(["claims", "ended"]), st.sampled_from(NAMES)),
    st.tuples(st.just("reload"))), max_size=150)


@settings(max_examples=300, deadline=None)
@given(heap_steps)
def test_the_earliest_end_and_shutdown_read_from_the_heaps_are_those_of_a_pass_over_the_claims(
        actions: list[tuple[Any, ...]]) -> None:
    state = PoolState(key=KEY)
    for action in actions:
        if action[0] == "claim":
            state.claims[action[1]] = action[2]
        elif action[0] == "ended":
            state.ended[action[1]] = {"ck": action[1], "status": {}, "gone": action[2]}
        elif action[0] == "forget":
            getattr(state, action[1]).pop(action[2], None)
        else:
            state = PoolState.from_json(orjson.loads(orjson.dumps(state.to_json())))
        gone = [float(c["gone"]) for c in state.claims.values() if c["gone"] is not None]
        gone += [float(e["gone"]) for e in state.ended.values()]
        shutdowns = [float(c["shutdown"]) for c in state.claims.values() if c["shutdown"] is not None
                     and c["gone"] is None and c["status"]["phase"] not in ("Expired", "Deleted")]
        assert (None if (g := state.next_gone()) is None else g[0]) == (min(gone) if gone else None)
        assert (None if (s := state.next_shutdown()) is None else s[0]) == (min(shutdowns) if shutdowns else None)
        assert len(state._gone) + len(state._shutdowns) <= 2 * (len(state.claims) + len(state.ended)) + 64 + 1
