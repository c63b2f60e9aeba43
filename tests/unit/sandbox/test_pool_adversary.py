"""Faults an adversarial review of the warm pool found, one regression test each: replays after a
crash between the table write and the outputs, claims re-created under another uid, log times
that go back, ticks whose timers died, state that never shrank, uids used twice, and claims
decided past their shutdown time."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from agents.adapters.loop import Outcome
from agents.adapters.sandbox import SandboxCore
from agents.sandbox import templates as tpl
from agents.sandbox.pool import PoolCore, PoolResult, PoolState
from schemas.codec import to_plain
from schemas.jsonschema import ROUTES
from schemas.records import (
    Pod,
    PodDeleted,
    Record,
    Reservation,
    SandboxBurst,
    SandboxClaimStatus,
    SandboxPoolStatus,
    SandboxWarmPoolDeleted,
    SchedulingFeedback,
)
from tests.builders import SANDBOX_NS as NS
from tests.builders import SANDBOX_POOL as KEY
from tests.builders import make_pool as pool
from tests.builders import make_sandbox_claim as claim
from tests.builders import pool_tick as tick
from tests.builders import sandbox_bound as bind
from tests.builders import sandbox_claim_deleted as deleted
from tests.builders import tick_at


def restored(st: PoolState) -> PoolState:
    """The state as a restore reads it back from the changelog."""
    return PoolState.from_json(orjson.loads(orjson.dumps(st.to_json())))


def apply(st: PoolState, records: list[Record], at: float, retention_s: float = 60.0) -> PoolResult:
    result = PoolResult()
    PoolCore(retention_s).apply(st, records, [at] * len(records), at, result)
    return result


def meaning(result: PoolResult) -> list[tuple[str, str, Any]]:
    """The outputs, a pool status without the time it was sent at."""
    out = []
    for o in result.outputs:
        record = dataclasses.replace(o.record, at=0.0) if isinstance(o.record, SandboxPoolStatus) else o.record
        out.append((o.topic, o.key, orjson.dumps(to_plain(record), option=orjson.OPT_SORT_KEYS)))
    return out


def of(result: PoolResult, kind: type) -> list[Any]:
    return [o.record for o in result.outputs if isinstance(o.record, kind)]


def filled(replicas: int = 2, **kw: Any) -> PoolState:
    """A pool whose replicas are bound (ready)."""
    st = PoolState(KEY)
    apply(st, [pool(replicas, **kw)], 1.0)
    apply(st, [bind(u) for u in list(st.sandboxes)], 2.0)
    return restored(st)


def starting_claimed() -> PoolState:
    st = PoolState(KEY)
    apply(st, [pool(1)], 1.0)
    apply(st, [claim("a")], 2.0)  # takes the starting sandbox
    return restored(st)


def claimed() -> PoolState:
    st = filled(2)
    apply(st, [claim("a", shutdown_time=10.0)], 3.0)
    return restored(st)


def with_cold() -> PoolState:
    st = PoolState(KEY)
    apply(st, [pool(0)], 1.0)
    return restored(st)


def cold_pending() -> PoolState:
    st = with_cold()
    apply(st, [claim("a")], 2.0)
    return restored(st)


SETUPS: dict[str, tuple[Callable[[], PoolState], Callable[[PoolState], list[Record]], float]] = {
    # name: (the state before the batch, the batch, its log time)
    "pool-created": (lambda: PoolState(KEY), lambda st: [pool(3)], 1.0),
    "refill-tick": (lambda: apply_and(filled(2), [claim("a"), claim("b")], 3.0), lambda st: [tick(3.0)], 3.0),
    "cold-claim": (with_cold, lambda st: [claim("a")], 2.0),
    "warm-claim-metadata": (lambda: filled(2), lambda st: [claim("a", labels={"team": "x"})], 3.0),
    "starting-claim-metadata": (lambda: apply_and(PoolState(KEY), [pool(1)], 1.0),
                                lambda st: [claim("a", annotations={"trace": "t1"})], 2.0),
    "ready-at-binding": (starting_claimed, lambda st: [bind(next(iter(st.sandboxes)))], 3.0),
    "cold-ready-at-binding": (cold_pending, lambda st: [bind(next(iter(st.sandboxes)))], 3.0),
    "feedback": (cold_pending, lambda st: [SchedulingFeedback(uid=next(iter(st.sandboxes)), namespace=NS, name="a",
                                                              attempt=1, message="0/3 nodes are available")], 3.0),
    "claim-deleted": (claimed, lambda st: [deleted("a")], 4.0),
    "shrink": (lambda: filled(3), lambda st: [pool(1)], 4.0),
    "expiry": (claimed, lambda st: [tick(10.0)], 10.0),
    "burst": (lambda: filled(1), lambda st: [SandboxBurst(namespace=NS, name="b", warm_pool="p", count=2)], 4.0),
    "pool-deleted": (lambda: filled(2), lambda st: [SandboxWarmPoolDeleted(namespace=NS, name="p")], 4.0),
}


def apply_and(st: PoolState, records: list[Record], at: float) -> PoolState:
    apply(st, records, at)
    return restored(st)


@pytest.mark.parametrize("case", sorted(SETUPS))
def test_a_batch_replayed_after_a_crash_re_sends_its_outputs_and_decides_nothing_new(case: str) -> None:
    """The crash between the table write and the outputs: the batch is read again against the
    state it left (the outputs may never have gone out) or the one before it (nothing was
    written). Before the fix, the replay against the state it left sent nothing: refill and cold
    pods never published (their sandboxes starting for good), PodDeleted never sent (pods
    leaked), a claim's Ready or Deleted never said, a burst's reservations never made."""
    make, batch, at = SETUPS[case]
    before = make()
    records = batch(before)
    first = apply(after := restored(before), records, at)
    assert first.outputs, "the batch must have decided something"
    again = apply(restored(after), records, at)
    assert sorted(set(meaning(again))) == sorted(set(meaning(first)))
    assert meaning(apply(restored(before), records, at)) == meaning(first)  # nothing written: decided alike


@pytest.mark.parametrize("lost", [[SandboxWarmPoolDeleted(namespace=NS, name="p")], [pool(1)]], ids=["deleted", "shrunk"])
def test_a_replay_that_begins_with_an_older_pool_record_still_re_sends_the_lost_batch(lost: list[Record]) -> None:
    """The replay starts at the committed offset, before the lost batch: the pool record read
    again first is an older version, a change, not a repeat. Before, nothing was re-sent, and
    the PodDeleted of the lost batch's sandboxes (deleted with the pool, or shrunk away) never
    went out: leaked pods."""
    st = filled(3)
    apply(st, [pool(3)], 3.0)  # the batch before (delivered), then the lost one
    first = apply(st, lost, 4.0)
    deleted_first = {d.uid for d in of(first, PodDeleted)}
    assert deleted_first
    again = apply(restored(st), [pool(3), *lost], 4.0)
    assert deleted_first <= {d.uid for d in of(again, PodDeleted)}


def test_a_claim_recreated_under_another_uid_is_never_answered_again_when_its_batch_is_replayed() -> None:
    """Before: the replayed old claim ended the new one (deleting its sandbox) and took another
    sandbox, and the new claim then started cold: three sandboxes for two claims."""
    st = filled(3)
    batch = [claim("c", "u1"), deleted("c", "u1"), claim("c", "u2")]
    first = apply(st, batch, 3.0)
    again = apply(restored(st), batch, 3.0)
    sandboxes: dict[str, set[str]] = {}
    for s in of(first, SandboxClaimStatus) + of(again, SandboxClaimStatus):
        sandboxes.setdefault(s.uid, set()).add(s.pod_uid)
    assert all(len(v) == 1 for v in sandboxes.values()), sandboxes
    assert not of(again, Pod) and {d.uid for d in of(again, PodDeleted)} <= {d.uid for d in of(first, PodDeleted)}
    assert all(o.key == o.record.uid for o in again.outputs if isinstance(o.record, SandboxClaimStatus))


def test_log_times_that_go_back_refund_no_tokens() -> None:
    """Producers' clocks differ, so a partition's log times can go back within a run. Before,
    the rate limiter counted negative elapsed time: tokens went negative, and the next round
    got back what the earlier one had spent (4 pods in one instant at 1 pod/s in rounds of 2)."""
    st = filled(2, refill_batch=2, refill_per_s=1.0)  # its first round spent its tokens at 1.0
    apply(st, [claim("a"), claim("b")], 1.0)
    apply(st, [tick(0.0)], 0.0)  # a tick stamped by a clock behind
    assert st.tokens >= 0.0
    started = len(of(apply(st, [tick(1.0)], 1.0), Pod))
    assert started == 0  # no time passed since the round at 1.0


def sandbox_core(clock: list[float]) -> SandboxCore:
    return SandboxCore(retention_s=60.0, clock=lambda: clock[0])


def core_apply(core: SandboxCore, stored: dict[str, Any] | None, records: list[Record],
               at: float) -> tuple[dict[str, Any] | None, Outcome]:
    outcome = Outcome()
    return core.apply(KEY, stored, records, [at] * len(records), at, outcome), outcome


def restore(core: SandboxCore, stored: dict[str, Any] | None) -> dict[str, Any] | None:
    core.decoded.clear()
    return None if stored is None else orjson.loads(orjson.dumps(stored))


def ticks(outcome: Outcome) -> list[float]:
    return [tick_at(t) for t in outcome.timers]


def test_a_restore_on_a_worker_whose_clock_is_behind_the_log_leaves_no_pool_below_its_replicas() -> None:
    """The restored worker's tick comes at its own clock, before the tick recorded as armed (at
    the log's time); before, that tick did not clear it, and every later tick it asked for came
    later than the armed one, so none was asked for: two sandboxes missing for good."""
    clock = [90.0]
    core = sandbox_core(clock)
    s, _ = core_apply(core, None, [pool(4, refill_batch=2, refill_per_s=1.0)], 90.0)
    s, _ = core_apply(core, s, [tick(92.0)], 92.0)
    assert s is not None
    s, _ = core_apply(core, s, [bind(u) for u in s["sandboxes"]], 93.0)
    s, _ = core_apply(core, s, [claim(x) for x in "abcd"], 100.0)
    clock[0] = 99.0  # the new worker's clock is a second behind the log
    s = restore(core, s)
    assert s is not None
    timers = core.timers(KEY, s)
    s, out = core_apply(core, s, [timers[0].output.record], 100.0)
    assert len([o for o in out.first if isinstance(o.record, Pod)]) == 2
    assert ticks(out) == [102.0]  # the next round's


def test_a_tick_armed_before_a_restore_that_found_nothing_due_blocks_no_later_tick() -> None:
    """A shutdown time armed a tick; the claim was deleted and the worker restarted (nothing
    due: no timer). Before, the armed time stayed recorded and every later need, due after
    it, asked for no tick."""
    clock = [0.0]
    core = sandbox_core(clock)
    s, _ = core_apply(core, None, [pool(1)], 1.0)
    assert s is not None
    s, _ = core_apply(core, s, [bind(u) for u in s["sandboxes"]], 2.0)
    s, out = core_apply(core, s, [claim("a", shutdown_time=100.0)], 3.0)
    s, _ = core_apply(core, s, [tick(3.0)], 3.0)  # refilled
    assert s is not None
    s, _ = core_apply(core, s, [bind(u) for u, x in s["sandboxes"].items() if not x["node"]], 4.0)
    s, _ = core_apply(core, s, [deleted("a")], 5.0)
    clock[0] = 6.0
    s = restore(core, s)
    assert s is not None and core.timers(KEY, s) == []
    s, out = core_apply(core, s, [claim("b")], 200.0)  # takes the ready one: a round is due
    assert ticks(out) == [200.0]


def test_a_batch_read_again_after_its_transaction_aborted_asks_for_its_tick_again() -> None:
    """The timers of a run are armed only once it is durable; an aborted run is read again
    against the table it left in memory. Before, the recorded armed time kept the replay from
    asking again: the pool stayed below its replicas."""
    core = sandbox_core([0.0])
    s, _ = core_apply(core, None, [pool(2)], 1.0)
    assert s is not None
    s, _ = core_apply(core, s, [bind(u) for u in s["sandboxes"]], 2.0)
    s, out = core_apply(core, s, [claim("a")], 3.0)
    assert ticks(out) == [3.0]  # lost with the aborted transaction
    s, out = core_apply(core, s, [claim("a")], 3.0)
    assert ticks(out) == [3.0]


def test_a_deleted_pool_with_a_burst_leaves_the_table() -> None:
    """Before, nothing ever visited a deleted pool whose burst was recorded (no tick, nothing to
    expire), so its key stayed for good."""
    core = sandbox_core([0.0])
    s, _ = core_apply(core, None, [pool(1), SandboxBurst(namespace=NS, name="b", warm_pool="p", count=1, ttl_s=5)],
                      1.0)
    s, out = core_apply(core, s, [SandboxWarmPoolDeleted(namespace=NS, name="p")], 2.0)
    assert s is not None
    at = 2.0
    for _ in range(5):  # the loop: fire what is asked for, visit what expires
        if s is None:
            break
        due: list[Record] = [t.output.record for t in core.timers(KEY, s)]
        expires = core.expires(KEY, s)
        if due:
            at = max(at, tick_at(core.timers(KEY, s)[0]))
            s, out = core_apply(core, s, due, at)
        elif expires:
            at = max(at, expires + 1)
            s, out = core_apply(core, s, [], at)
        else:
            break
    assert s is None


def test_a_pool_created_again_after_it_was_forgotten_uses_new_pod_uids_and_names() -> None:
    """Before, sandbox numbers started at 0 again once the pool's key was deleted: the new pod
    had the uid (and name) of one deleted moments before, which its decider still remembers as
    deleted."""
    core = sandbox_core([0.0])
    s, first = core_apply(core, None, [pool(1)], 1.0)
    s, gone = core_apply(core, s, [SandboxWarmPoolDeleted(namespace=NS, name="p")], 2.0)
    assert s is not None and [o.record for o in gone.first if isinstance(o.record, PodDeleted)]
    s, _ = core_apply(core, s, [], core.expires(KEY, s) + 1)  # the deletion sent, a retention ago
    assert s is None
    s, again = core_apply(core, s, [pool(1)], 100.0)
    old = [o.record for o in first.first if isinstance(o.record, Pod)]
    new = [o.record for o in again.first if isinstance(o.record, Pod)]
    assert old and new and {p.uid for p in old}.isdisjoint(p.uid for p in new)
    assert {p.name for p in old}.isdisjoint(p.name for p in new)
    assert all(tpl.pool_of(p.uid) == KEY for p in old + new)


def test_a_claim_decided_past_its_shutdown_time_takes_no_sandbox() -> None:
    """Before, it adopted a ready sandbox, was answered Ready, and the next tick deleted it."""
    st = filled(1)
    r = apply(st, [claim("late", shutdown_time=2.5)], 3.0)
    statuses = of(r, SandboxClaimStatus)
    assert [s.phase for s in statuses] == ["Expired"] and not statuses[0].pod_uid
    assert st.unclaimed() == 1 and not of(r, PodDeleted)
    d = apply(st, [claim("gone", shutdown_time=2.5, shutdown_policy="Delete")], 3.0)
    assert [s.phase for s in of(d, SandboxClaimStatus)] == ["Deleted"] and st.unclaimed() == 1


def test_a_claim_uid_used_again_under_another_name_is_refused() -> None:
    """A uid names one object: a second claim with it is bad input, not a second sandbox for it."""
    st = filled(2)
    apply(st, [claim("a", "u")], 3.0)
    r = apply(st, [claim("b", "u")], 4.0)
    assert not [s for s in of(r, SandboxClaimStatus) if s.pod_uid] and r.problems
    assert r.problems[0].field == "metadata.uid" and st.unclaimed() == 1


def test_a_burst_redelivered_after_its_ttl_is_not_reserved_again() -> None:
    """Before, a burst was forgotten at the first tick after its ttl, so a redelivery moments later
    published its reservations again."""
    st = filled(1)
    burst = SandboxBurst(namespace=NS, name="b", warm_pool="p", count=2, ttl_s=5.0)
    assert len(of(apply(st, [burst], 3.0), Reservation)) == 2
    apply(st, [tick(9.0)], 9.0)
    assert not of(apply(restored(st), [burst], 10.0), Reservation)


def test_a_restore_changes_no_sandbox_a_claim_adopts_when_log_times_went_back() -> None:
    """The ready sandboxes are picked oldest first; before, a restore sorted them by their
    binding's log time while the running pool kept arrival order, so a claim took another
    sandbox after a restore than without one."""
    st = PoolState(KEY)
    apply(st, [pool(2)], 1.0)
    a, b = list(st.sandboxes)
    apply(st, [bind(a)], 5.0)
    apply(st, [bind(b)], 4.0)  # stamped by a clock behind
    back = of(apply(restored(st), [claim("c")], 6.0), SandboxClaimStatus)
    kept = of(apply(st, [claim("c")], 6.0), SandboxClaimStatus)
    assert kept[0].pod_uid == back[0].pod_uid


def test_every_output_is_keyed_as_the_schemas_routes_say() -> None:
    """Outside consumers find a record's partition from `schemas.jsonschema.ROUTES` (and the
    topic catalogue): a claim's status by its uid, a pool's by its name. Before, statuses were
    keyed `namespace/name`: a consumer that looked for a claim's answers where its uid goes
    looked in the wrong partition."""
    st = filled(2)
    outputs = apply(st, [claim("a"), claim("b"), claim("c")], 3.0).outputs
    outputs += apply(st, [tick(3.0), deleted("a")], 4.0).outputs
    assert {type(o.record).__name__ for o in outputs} >= {"SandboxClaimStatus", "SandboxPoolStatus", "Pod", "PodDeleted"}
    for o in outputs:
        routes = ROUTES[type(o.record).__name__]
        assert (o.topic, o.key) in {(topic, str(getattr(o.record, name))) for topic, name in routes}, o
