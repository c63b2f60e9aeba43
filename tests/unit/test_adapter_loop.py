"""The shared adapter loop of the stateful agents, without a broker.

- Timers are re-armed after every restore, for the partitions owned then, and disarmed for the
  others (faust's own recovery-completed event is set once and never cleared, so a partition
  that moved to a running worker used to keep its gangs waiting forever).
- The epoch stamped on a batch's table writes and outputs is the one of the assignment the
  batch was fetched in; a batch whose partition was revoked, or whose generation changed,
  between fetch and flush is neither written nor delivered, and faust never commits its offsets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import faust
import pytest
from faust.types import TP

from agents.adapters.batches import Fetched, split
from agents.adapters.deciders import DeciderCore, gang_timer
from agents.adapters.loop import Flushed, StatefulLoop, Work
from agents.adapters.owners import OwnerCore
from agents.adapters.ownership import Ownership
from agents.adapters.tables import VersionedState
from agents.adapters.timers import RecordTimers, TimerRequest, rearm
from agents.adapters.transactions import PlainSink
from agents.intake import RawMessage
from agents.ports import Output
from schemas import topics
from schemas.codec import encode
from schemas.partitioner import partition_for
from schemas.records import (
    Binding,
    Claim,
    GangTimeout,
    Held,
    Node,
    PodDeleted,
    Rejected,
    ReservationExpired,
    ResourceList,
)


class FakeClock:
    """A scheduler like `loop.call_later` on a clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0
        self.due: list[tuple[float, Callable[[], object], FakeHandle]] = []

    def call_later(self, delay: float, fn: Callable[[], object]) -> FakeHandle:
        handle = FakeHandle()
        self.due.append((self.now + delay, fn, handle))
        return handle

    def advance(self, seconds: float) -> int:
        self.now += seconds
        ready = [d for d in self.due if d[0] <= self.now and not d[2].cancelled]
        self.due = [d for d in self.due if d not in ready and not d[2].cancelled]
        for _, fn, _ in sorted(ready, key=lambda d: d[0]):
            fn()
        return len(ready)


@dataclass
class FakeHandle:
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeOutbox:
    def __init__(self) -> None:
        self.sent: list[Output] = []

    async def send(self, outputs: Sequence[Output]) -> list[Awaitable[object]]:
        self.sent += outputs
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return [done]


async def settle(timers: RecordTimers) -> None:
    while timers.pending:
        await asyncio.gather(*list(timers.pending))


def gang_timeouts(outbox: FakeOutbox) -> list[tuple[str, int]]:
    return sorted((o.record.decision_key, o.record.round) for o in outbox.sent if isinstance(o.record, GangTimeout))


# -- timers ---------------------------------------------------------------------------------


async def test_arming_a_key_twice_keeps_the_first_timer() -> None:
    clock, outbox = FakeClock(), FakeOutbox()
    timers = RecordTimers(outbox, schedule=clock.call_later)
    timers.arm(gang_timer("g", 0, 5.0), partition=1)
    clock.advance(2.0)
    timers.arm(gang_timer("g", 0, 5.0), partition=1)  # a replay asks again
    assert clock.advance(3.0) == 1
    assert clock.advance(5.0) == 0
    await settle(timers)
    assert gang_timeouts(outbox) == [("g", 0)]


async def test_a_round_whose_timer_is_shortened_times_out_at_the_shorter() -> None:
    """A fellow refusal shortens the round (`agents.state.ledger.FELLOW_GRACE_S`): a timer of
    its own, which fires first; the full one fires later for a round already over."""
    clock, outbox = FakeClock(), FakeOutbox()
    timers = RecordTimers(outbox, schedule=clock.call_later)
    timers.arm(gang_timer("g", 0, 600.0), partition=1)
    timers.arm(gang_timer("g", 0, 15.0), partition=1)
    assert clock.advance(15.0) == 1
    await settle(timers)
    assert gang_timeouts(outbox) == [("g", 0)]


async def test_rearm_after_a_restore_follows_the_partitions() -> None:
    clock, outbox = FakeClock(), FakeOutbox()
    owned = {0, 1}
    timers = RecordTimers(outbox, owned=lambda p: p in owned, schedule=clock.call_later)
    asks = {0: [gang_timer("g0", 0, 10.0)], 1: [gang_timer("g1", 0, 10.0)], 2: [gang_timer("g2", 3, 10.0)]}
    rearm(timers, owned, lambda p: asks[p])
    clock.advance(4.0)
    owned = {1, 2}  # partition 0 moved away, partition 2 moved here from a worker still running
    rearm(timers, owned, lambda p: asks[p])
    assert {k[:2] for k in timers.armed} == {("g1", 0), ("g2", 3)}
    assert clock.advance(6.0) == 1  # g1 kept its first timer (armed at 0, due at 10)
    await settle(timers)
    assert gang_timeouts(outbox) == [("g1", 0)]
    assert clock.advance(4.0) == 1  # g2: a full waiting time from its restore (4 + 10)
    await settle(timers)
    assert gang_timeouts(outbox) == [("g1", 0), ("g2", 3)]  # never g0: disarmed


async def test_a_timer_whose_record_is_not_delivered_fires_again() -> None:
    """A failed send (the producer not started yet, or stopping) must not lose a gang's
    timeout: the timer fires again while its partition is owned here."""
    from faust.exceptions import NotReady

    class Flaky(FakeOutbox):
        fails = 1

        async def send(self, outputs: Sequence[Output]) -> list[Awaitable[object]]:
            if self.fails:
                self.fails -= 1
                raise NotReady("Producer service not yet started")
            return await super().send(outputs)

    clock, outbox = FakeClock(), Flaky()
    timers = RecordTimers(outbox, schedule=clock.call_later)
    timers.arm(gang_timer("g", 0, 1.0), partition=0)
    clock.advance(1.0)
    await settle(timers)
    assert outbox.sent == [] and timers.failed == 1 and ("g", 0, 1.0) in timers.armed
    clock.advance(1.0)
    await settle(timers)
    assert gang_timeouts(outbox) == [("g", 0)] and not timers.armed

async def test_a_timer_of_a_partition_no_longer_owned_sends_nothing() -> None:
    clock, outbox = FakeClock(), FakeOutbox()
    owned = {0}
    timers = RecordTimers(outbox, owned=lambda p: p in owned, schedule=clock.call_later)
    timers.arm(gang_timer("g", 0, 1.0), partition=0)
    owned.clear()  # revoked; the restore that would disarm it has not come yet
    clock.advance(1.0)
    await settle(timers)
    assert outbox.sent == [] and timers.skipped == 1


# -- the loop against a real (brokerless) faust table ---------------------------------------


@dataclass
class FakeMessage:
    topic: str
    partition: int
    offset: int
    generation_id: int
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp: float = 0.0
    acked: bool = False


@dataclass
class FakeEvent:
    message: FakeMessage

    @property
    def value(self) -> bytes:
        return self.message.value


def run_of(topic: str, partition: int, generation: int, records: list[Any], first_offset: int = 0,
           timestamp: float = 0.0) -> Fetched:
    events = [FakeEvent(FakeMessage(topic, partition, first_offset + i, generation, encode(r), timestamp=timestamp))
              for i, r in enumerate(records)]
    [run] = split(events)
    return run


class RecordingSink:
    def __init__(self, plain: PlainSink | None = None) -> None:
        self.plain = plain
        self.flushed: list[Work] = []
        self.assignments: list[set[int]] = []

    async def assigned(self, partitions: set[int]) -> None:
        self.assignments.append(set(partitions))

    async def flush(self, work: Sequence[Work]) -> Flushed:
        self.flushed += work
        if self.plain is not None:
            return await self.plain.flush(work)
        return Flushed(durable=list(work))

    async def quiesce(self, partitions: set[int]) -> None:
        return None

    async def close(self) -> None:
        return None


class FakeBatch:
    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes]] = []

    def append(self, key: bytes, value: bytes, timestamp: None) -> object:
        self.records.append((key, value))
        return object()

    def record_count(self) -> int:
        return len(self.records)


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, int, list[tuple[bytes, bytes]]]] = []

    def create_batch(self) -> FakeBatch:
        return FakeBatch()

    async def send_batch(self, batch: FakeBatch, topic: str, partition: int) -> asyncio.Future[object]:
        self.sent.append((topic, partition, batch.records))
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def held(key: str, uid: str, gang_min: int = 3) -> Held:
    return Held(uid=uid, attempt=0, node="n1", decision_key=key, gang_min=gang_min, gang_waiting_s=30.0)


@dataclass
class Rig:
    table: VersionedState
    ownership: Ownership
    sink: RecordingSink
    loop: StatefulLoop
    clock: FakeClock
    outbox: FakeOutbox
    producer: FakeProducer


def rig(core: Any = None, topic: str = topics.HOLDS, plain: bool = False) -> Rig:
    app = faust.App(f"test-{id(object())}", store="memory://", broker="kafka://127.0.0.1:1")
    table = VersionedState(app, "pod-ledger", 4)
    producer = FakeProducer()
    table.faust_producer = lambda: producer  # type: ignore[method-assign]
    ownership = Ownership(topic)
    outbox, clock = FakeOutbox(), FakeClock()
    sink = RecordingSink(PlainSink(table, outbox) if plain else None)
    timers = RecordTimers(outbox, owned=lambda p: p in ownership.owned, schedule=clock.call_later)
    loop = StatefulLoop("deciders", core or DeciderCore(), table, ownership, sink, timers)
    loop.attach()
    return Rig(table, ownership, sink, loop, clock, outbox, producer)


async def assign(r: Rig, partitions: set[int], generation: int, topic: str = topics.HOLDS) -> None:
    """What faust does on a rebalance: revoke everything, assign, restore."""
    await r.loop.on_revoked({TP(topic, p) for p in r.ownership.partitions})
    await r.table.table.on_rebalance({TP(topic, p) for p in partitions}, set(), set(), generation)
    await r.table.table.on_recovery_completed({TP(r.table.changelog, p) for p in partitions}, set())


async def test_gang_timers_are_rearmed_when_a_partition_moves_to_a_running_worker() -> None:
    r = rig()
    await assign(r, {0}, generation=1)
    # Another worker decided these gangs (partition 1 and 2), as a restore would bring them in.
    for key, partition in (("ns/g1", 1), ("ns/g2", 2)):
        r.table.put(key, {"key": key, "pods": {}, "decisions": {}, "waiting": {"u": {}}, "round": 2,
                          "timer_s": 30.0, "gave_up": [], "accepted": False}, partition, epoch=1)
    await assign(r, {0, 1}, generation=2)  # partition 1 moved here: this worker was already running
    assert {k[:2] for k in r.loop.timers.armed} == {("ns/g1", 2)}  # partition 2 is not ours: forgotten, not armed
    assert r.table.get("ns/g2") is None
    r.clock.advance(30.0)
    await settle(r.loop.timers)
    assert gang_timeouts(r.outbox) == [("ns/g1", 2)]
    assert r.sink.assignments == [{0}, {0, 1}]


async def test_a_waiting_gang_decided_here_times_out_and_its_timer_survives_a_rebalance_that_keeps_it() -> None:
    r = rig()
    await assign(r, {0, 1, 2, 3}, generation=1)
    key = "ns/gang"
    partition = 3
    run = run_of(topics.HOLDS, partition, 1, [held(key, "a"), held(key, "b")])
    await r.loop.process([run])
    assert {k[:2] for k in r.loop.timers.armed} == {(key, 0)}
    await assign(r, {partition}, generation=2)  # a rebalance that keeps the partition
    assert {k[:2] for k in r.loop.timers.armed} == {(key, 0)}
    r.clock.advance(30.0)
    await settle(r.loop.timers)
    assert gang_timeouts(r.outbox) == [(key, 0)]


async def test_expiry_timers_follow_the_owners_partitions() -> None:
    from agents.state import reservations as rsv

    class Core(OwnerCore):
        def timers(self, key: str, raw: dict[str, Any]) -> list[TimerRequest]:
            return [TimerRequest(uid, 5.0, Output(topics.NODE_INBOX, key, ReservationExpired(uid=uid, node=key)))
                    for uid, entry in raw.get("reservations", {}).items() if entry["phase"] == rsv.AVAILABLE]

    r = rig(Core(), topic=topics.NODE_INBOX)
    r.table.put("n1", {"reservations": {"r1": {"phase": rsv.AVAILABLE}}}, 2, epoch=0)
    r.table.put("n2", {"reservations": {"r2": {"phase": rsv.AVAILABLE}}}, 3, epoch=0)
    await assign(r, {2}, generation=4, topic=topics.NODE_INBOX)
    assert set(r.loop.timers.armed) == {"r1"}
    await assign(r, {2, 3}, generation=5, topic=topics.NODE_INBOX)
    assert set(r.loop.timers.armed) == {"r1"}  # n2 was forgotten by the first restore (not ours)


# -- epochs and stale batches ---------------------------------------------------------------


async def test_outputs_and_writes_carry_the_epoch_of_the_generation_fetched_in() -> None:
    r = rig()
    r.table.table.restored_epochs[1] = 7  # a predecessor wrote with epoch 7
    await assign(r, {1}, generation=3)
    run = run_of(topics.HOLDS, 1, 3, [held("u1", "u1", gang_min=1)])
    flushed = await r.loop.process([run])
    [work] = flushed.durable
    assert work.epoch == 8 == r.table.raw("u1")["epoch"]  # type: ignore[index]
    assert {o.origin.epoch for o in work.first + work.after if o.origin} == {8}
    assert {o.origin.source for o in work.first + work.after if o.origin} == {"holds/1"}


async def test_a_batch_fetched_in_an_older_generation_is_dropped_not_stamped_with_the_new_epoch() -> None:
    r = rig()
    await assign(r, {1}, generation=3)
    stale = run_of(topics.HOLDS, 1, 2, [held("u1", "u1", gang_min=1)])  # fetched before the rejoin
    flushed = await r.loop.process([stale])
    assert flushed == Flushed() and r.sink.flushed == []
    assert r.table.get("u1") is None  # not decided, not written
    assert all(e.message.acked for e in stale.events)  # faust will never commit these offsets
    assert r.ownership.dropped == 1


async def test_a_batch_whose_partition_is_revoked_before_it_is_flushed_is_neither_written_nor_delivered() -> None:
    class RevokedMidway(DeciderCore):
        def apply(self, *args: Any) -> dict[str, Any]:
            state = super().apply(*args)
            loop.ownership.revoke({TP(topics.HOLDS, 0)})  # a rebalance starts while the batch is decided
            return state

    r = rig(RevokedMidway(), plain=True)
    loop = r.loop
    await assign(r, {0, 1}, generation=5)
    revoked = run_of(topics.HOLDS, 0, 5, [held("u0", "u0", gang_min=1)])
    flushed = await r.loop.process([revoked])
    assert flushed == Flushed() and r.outbox.sent == [] and r.producer.sent == []
    assert all(e.message.acked for e in revoked.events)


async def test_of_two_partitions_only_the_revoked_ones_batch_is_dropped() -> None:
    r = rig(plain=True)
    await assign(r, {0, 1}, generation=5)
    await r.loop.on_revoked({TP(topics.HOLDS, 0)})
    kept = run_of(topics.HOLDS, 1, 5, [held("u1", "u1", gang_min=1)])
    gone = run_of(topics.HOLDS, 0, 5, [held("u0", "u0", gang_min=1)])
    flushed = await r.loop.process([gone, kept])
    assert [w.partition for w in flushed.durable] == [1]
    assert [(topic, p) for topic, p, _ in r.producer.sent] == [(r.table.changelog, 1)]
    assert not any(e.message.acked for e in kept.events)  # acked by faust after the batch, as usual


def test_a_micro_batch_splits_by_partition_and_generation_in_order() -> None:
    node = encode(Node(name="n", allocatable=ResourceList(cpu=1)))
    events = [FakeEvent(FakeMessage("t", p, o, g, node)) for p, o, g in
              [(0, 10, 1), (1, 5, 1), (0, 11, 1), (0, 12, 2), (1, 6, 1)]]
    runs = split(events)
    assert [(r.partition, r.generation, [m.offset for m in r.messages]) for r in runs] == [
        (0, 1, [10, 11]), (1, 1, [5, 6]), (0, 2, [12])]
    assert runs[0].next_offset == 12 and isinstance(runs[0].messages[0], RawMessage)


async def test_plain_sink_acknowledges_commits_and_changelog_before_bindings() -> None:
    order: list[str] = []

    class OrderedOutbox(FakeOutbox):
        async def send(self, outputs: Sequence[Output]) -> list[Awaitable[object]]:
            order.extend(type(o.record).__name__ for o in outputs)
            return await super().send(outputs)

    r = rig(plain=True)
    assert r.sink.plain is not None
    r.sink.plain.outbox = OrderedOutbox()
    await assign(r, {0}, generation=1)
    await r.loop.process([run_of(topics.HOLDS, 0, 1, [held("u0", "u0", gang_min=1)])])
    assert "Commit" in order and order.index("Binding") > order.index("Commit")
    assert r.producer.sent and r.producer.sent[0][0] == r.table.changelog


# -- the zombie fence of a reader -------------------------------------------------------------


def stamped_run(topic: str, partition: int, generation: int, records: list[tuple[Any, str, int]],
                first_offset: int = 0) -> Fetched:
    """A run whose messages carry the origin headers (record, origin source, origin epoch)."""
    from agents.intake import origin_headers
    from agents.ports import Origin

    events = [FakeEvent(FakeMessage(topic, partition, first_offset + i, generation, encode(r),
                                    origin_headers(Origin(source, epoch))))
              for i, (r, source, epoch) in enumerate(records)]
    [run] = split(events)
    return run


def bound(r: Rig) -> list[str]:
    """The uids bound (a replay re-sends a Binding: counted once)."""
    return sorted({o.record.uid for o in r.outbox.sent if type(o.record).__name__ == "Binding"})


async def test_an_older_epoch_in_another_input_partition_is_not_a_zombies() -> None:
    """An owner's Helds go to every `holds` partition: after node-inbox/1 moved to a new owner
    (epoch 2), its old owner's Helds (epoch 1) sent before the move can still be unread in
    another partition. A fence shared by the partitions dropped them, and they were never
    decided: holds left held for ever (the chaos run's leaked holds)."""
    r = rig(plain=True)
    await assign(r, {0, 1}, generation=3)
    newer = stamped_run(topics.HOLDS, 1, 3, [(held("u1", "u1", gang_min=1), "node-inbox/1", 2)])
    older = stamped_run(topics.HOLDS, 0, 3, [(held("u0", "u0", gang_min=1), "node-inbox/1", 1)])
    await r.loop.process([newer, older])
    assert bound(r) == ["u0", "u1"]


async def test_a_partition_read_again_after_a_rebalance_is_fenced_afresh() -> None:
    """A kept partition is read again from its committed offset after a rebalance: an older
    epoch that precedes a newer one in its log is no zombie's."""
    r = rig(plain=True)
    await assign(r, {0}, generation=3)
    records = [(held("u0", "u0", gang_min=1), "node-inbox/1", 1), (held("u1", "u1", gang_min=1), "node-inbox/1", 2)]
    await r.loop.process([stamped_run(topics.HOLDS, 0, 3, records[1:], first_offset=11)])  # 10 not yet fetched
    await assign(r, {0}, generation=4)  # faust seeks partition 0 back to its committed offset, 10
    await r.loop.process([stamped_run(topics.HOLDS, 0, 4, records, first_offset=10)])
    assert bound(r) == ["u0", "u1"]


async def test_a_zombies_older_epoch_after_a_newer_one_in_the_same_partition_is_dropped() -> None:
    r = rig(plain=True)
    await assign(r, {0}, generation=3)
    await r.loop.process([stamped_run(topics.HOLDS, 0, 3, [(held("u1", "u1", gang_min=1), "node-inbox/1", 2),
                                                            (held("u0", "u0", gang_min=1), "node-inbox/1", 1)])])
    assert bound(r) == ["u1"]


# -- a pod's Binding comes before its termination ---------------------------------------------


class WaveOutbox(FakeOutbox):
    """Records the kinds of each delivery (the plain sink awaits each one's acknowledgements)."""

    def __init__(self) -> None:
        super().__init__()
        self.waves: list[list[str]] = []

    async def send(self, outputs: Sequence[Output]) -> list[Awaitable[object]]:
        self.waves.append([f"{type(o.record).__name__}:{o.record.uid}" for o in outputs])  # type: ignore[attr-defined]
        return await super().send(outputs)

    def wave_of(self, what: str) -> list[int]:
        return [i for i, wave in enumerate(self.waves) if what in wave]


def deleted(uid: str) -> PodDeleted:
    return PodDeleted(uid=uid, decision_key=uid)


async def test_a_pod_accepted_and_deleted_in_one_batch_is_terminated_after_its_binding() -> None:
    """A takeover replays a pod's Held and its deletion in one batch: the core puts the Commit
    and the PodTerminated in `first`, the Binding in `after`. Sent in that order, the Binding
    reached consumers after the termination, and counted as bound again: the chaos checker saw
    the pod's GPU given to the next pod as well."""
    r = rig(plain=True)
    assert r.sink.plain is not None
    outbox = r.sink.plain.outbox = WaveOutbox()
    await assign(r, {0}, generation=1)
    await r.loop.process([run_of(topics.HOLDS, 0, 1, [held("u0", "u0", gang_min=1), deleted("u0")])])
    [commit], [binding], [terminated] = (outbox.wave_of(f"{k}:u0") for k in ("Commit", "Binding", "PodTerminated"))
    assert commit < binding < terminated


async def test_a_held_redelivered_after_its_pod_was_terminated_sends_no_binding_again() -> None:
    """An owner that took over re-sends its Helds; one can reach the decider after the pod's
    deletion. The core re-sends the pod's acceptance; its Binding went out before the
    termination, and a copy after it would count as a new binding."""
    r = rig(plain=True)
    assert r.sink.plain is not None
    outbox = r.sink.plain.outbox = WaveOutbox()
    await assign(r, {0}, generation=1)
    await r.loop.process([run_of(topics.HOLDS, 0, 1, [held("u0", "u0", gang_min=1)])])
    await r.loop.process([run_of(topics.HOLDS, 0, 1, [deleted("u0")], first_offset=1)])
    await r.loop.process([run_of(topics.HOLDS, 0, 1, [held("u0", "u0", gang_min=1)], first_offset=2)])
    [terminated] = outbox.wave_of("PodTerminated:u0")
    assert outbox.wave_of("Binding:u0") == [1] and terminated == 2  # waves: Commit, Binding, PodTerminated, ...
    assert len(outbox.wave_of("Commit:u0")) == 2  # the Commit is re-sent (owners ignore it on a terminated hold)


async def test_a_batch_whose_delivery_fails_is_never_acknowledged() -> None:
    """faust acknowledges a take() batch when the loop body ends, by an exception too, and then
    commits it: a batch whose delivery failed was skipped for good."""
    from aiokafka.errors import KafkaTimeoutError

    class FailingSink(RecordingSink):
        async def flush(self, work: Sequence[Work]) -> Flushed:
            raise KafkaTimeoutError()

    r = rig()
    r.loop.sink = FailingSink()
    await assign(r, {0}, generation=1)
    run = run_of(topics.HOLDS, 0, 1, [held("u0", "u0", gang_min=1)])
    with pytest.raises(KafkaTimeoutError):
        await r.loop.process([run])
    assert all(e.message.acked for e in run.events)  # faust will never commit these offsets



async def test_a_stored_state_that_cannot_be_read_stops_the_batch_unacknowledged() -> None:
    """A table value from an incompatible version: a clear error naming the table and the key,
    and nothing of the batch acknowledged (faust would otherwise commit it on the way down)."""
    from agents.adapters.tables import UnreadableState

    r = rig()
    await assign(r, {0}, generation=1)
    r.table.put("g", {"key": "g", "format": "from the future"}, 0, 1)
    run = run_of(topics.HOLDS, 0, 1, [held("g", "u0")])
    with pytest.raises(UnreadableState, match=r"pod-ledger: the stored state of 'g' cannot be read \(KeyError: 'pods'\)"):
        await r.loop.process([run])
    assert all(e.message.acked for e in run.events) and r.sink.flushed == []

if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])


# -- the transactional sink, with fake producers ---------------------------------------------


class FakeTxnProducer(FakeProducer):
    """Records the transactional calls; `fail_on` names a call that raises."""

    def __init__(self, txn_id: str, log: list[tuple[str, str]], fail_on: dict[str, BaseException]) -> None:
        super().__init__()
        self.txn_id, self.log, self.fail_on = txn_id, log, fail_on
        self.offsets: list[tuple[dict[Any, int], str]] = []

    def _call(self, name: str) -> None:
        self.log.append((self.txn_id, name))
        exc = self.fail_on.pop(name, None)
        if exc is not None:
            raise exc

    async def start(self) -> None:
        self._call("start")

    async def stop(self) -> None:
        self._call("stop")

    async def begin_transaction(self) -> None:
        self._call("begin")

    async def send_batch(self, batch: FakeBatch, topic: str, partition: int) -> asyncio.Future[object]:
        self._call(f"changelog:{topic}/{partition}")
        return await super().send_batch(batch, topic, partition)

    async def send_offsets_to_transaction(self, offsets: dict[Any, int], group_id: str) -> None:
        self._call("offsets")
        self.offsets.append((offsets, group_id))

    async def commit_transaction(self) -> None:
        self._call("commit")

    async def abort_transaction(self) -> None:
        self._call("abort")


def txn_rig(fail_on: dict[str, BaseException] | None = None) -> tuple[Rig, list[tuple[str, str]], dict[str, FakeTxnProducer]]:
    from agents.adapters.transactions import TransactionalSink

    r = rig(plain=False)
    calls: list[tuple[str, str]] = []
    producers: dict[str, FakeTxnProducer] = {}
    failures = fail_on if fail_on is not None else {}

    def factory(txn_id: str) -> FakeTxnProducer:
        producers[txn_id] = FakeTxnProducer(txn_id, calls, failures)
        return producers[txn_id]

    outboxes: list[FakeOutbox] = []

    def make_outbox(send: Any) -> FakeOutbox:
        outboxes.append(FakeOutbox())
        return outboxes[-1]

    sink = TransactionalSink(table=r.table, ownership=r.ownership, make_outbox=make_outbox, app_id="ks",
                             agent="deciders", group_id="ks", kafka="unused:9092", producer_options={},
                             producer_factory=factory)
    r.loop.sink = sink
    r.outbox = FakeOutbox()
    r.sink.assignments = []
    seeks: list[tuple[str, int, int]] = []

    async def seek(topic: str, partition: int, offset: int) -> None:
        seeks.append((topic, partition, offset))

    r.loop.seek = seek
    r.loop.seeks = seeks  # type: ignore[attr-defined]
    r.loop.outboxes = outboxes  # type: ignore[attr-defined]
    return r, calls, producers


async def test_a_batch_is_one_transaction_per_input_partition_with_its_offsets() -> None:
    r, calls, producers = txn_rig()
    await assign(r, {0, 1}, generation=2)
    assert sorted(producers) == ["ks-deciders-holds-0", "ks-deciders-holds-1"]  # started on assignment
    runs = [run_of(topics.HOLDS, 0, 2, [held("u0", "u0", gang_min=1)], first_offset=40),
            run_of(topics.HOLDS, 1, 2, [held("u1", "u1", gang_min=1)], first_offset=7)]
    flushed = await r.loop.process(runs)
    assert [w.partition for w in flushed.durable] == [0, 1]
    changelog = r.table.changelog
    for partition, next_offset in ((0, 41), (1, 8)):
        txn_id = f"ks-deciders-holds-{partition}"
        mine = [name for who, name in calls if who == txn_id]
        assert mine == ["start", "begin", f"changelog:{changelog}/{partition}", "offsets", "commit"]
        [(offsets, group)] = producers[txn_id].offsets
        assert group == "ks" and {(tp.topic, tp.partition): o for tp, o in offsets.items()} == {
            (topics.HOLDS, partition): next_offset}
    sent = [type(o.record).__name__ for box in r.loop.outboxes for o in box.sent]  # type: ignore[attr-defined]
    assert sent.count("Commit") == 2 and sent.count("Binding") == 2  # Commit and Binding in one transaction


async def test_a_revoked_partitions_producer_is_stopped_and_a_fenced_one_loses_the_partition() -> None:
    from aiokafka.errors import ProducerFenced

    r, calls, producers = txn_rig({"commit": ProducerFenced()})
    await assign(r, {0, 1}, generation=2)
    flushed = await r.loop.process([run_of(topics.HOLDS, 0, 2, [held("u0", "u0", gang_min=1)])])
    assert flushed.lost and not flushed.durable and r.ownership.partitions == {1}
    assert ("ks-deciders-holds-0", "stop") in calls
    later = run_of(topics.HOLDS, 0, 2, [held("u2", "u2", gang_min=1)], first_offset=1)
    assert await r.loop.process([later]) == Flushed()  # dropped until the partition is assigned again
    await assign(r, {1}, generation=3)  # the rebalance that follows: partition 0 went elsewhere
    assert ("ks-deciders-holds-1", "stop") not in calls  # kept partitions keep their producer


async def test_a_failed_transaction_is_aborted_and_its_partition_read_again_from_the_run() -> None:
    from aiokafka.errors import KafkaTimeoutError

    r, calls, _ = txn_rig({"offsets": KafkaTimeoutError()})
    await assign(r, {0}, generation=2)
    first = run_of(topics.HOLDS, 0, 2, [held("u0", "u0", gang_min=1), held("u1", "u1", gang_min=1)], first_offset=10)
    flushed = await r.loop.process([first])
    assert flushed.failed and ("ks-deciders-holds-0", "abort") in calls
    assert r.loop.seeks == [(topics.HOLDS, 0, 10)]  # type: ignore[attr-defined]
    # What was fetched before the seek took effect is skipped; the partition resumes at offset 10.
    assert await r.loop.process([run_of(topics.HOLDS, 0, 2, [held("u2", "u2", gang_min=1)], first_offset=12)]) == Flushed()
    again = await r.loop.process([run_of(topics.HOLDS, 0, 2, [held("u0", "u0", gang_min=1),
                                                                held("u1", "u1", gang_min=1)], first_offset=10)])
    assert [w.fetched.first_offset for w in again.durable] == [10]


async def test_messages_fetched_again_after_faust_seeks_are_skipped_not_decided_twice() -> None:
    """faust resumes a newly assigned partition before its seek to the committed offset ends:
    what it fetched first comes again after the seek, even within one run."""
    r = rig(plain=True)
    await assign(r, {0}, generation=2)
    first = run_of(topics.HOLDS, 0, 2, [held("u0", "u0", gang_min=1), held("u1", "u1", gang_min=1)], first_offset=25)
    await r.loop.process([first])
    again = run_of(topics.HOLDS, 0, 2, [held("u0", "u0", gang_min=1), held("u1", "u1", gang_min=1),
                                        held("u2", "u2", gang_min=1)], first_offset=25)
    flushed = await r.loop.process([again])
    [work] = flushed.durable
    assert [m.offset for m in work.fetched.messages] == [27] and r.loop.repeated == 2
    bindings = [o.record.uid for o in r.outbox.sent if type(o.record).__name__ == "Binding"]
    assert bindings == ["u0", "u1", "u2"]  # each once
    await assign(r, {0}, generation=3)  # a new assignment starts afresh (faust seeks again)
    assert r.loop.next_offsets == {}


def probed(r: Rig, first_after_committed: int | None) -> list[tuple[str, int, int]]:
    """Give the loop a probe that finds the first record after the committed offset at
    `first_after_committed`, and a seek that records where it was asked to read from."""
    seeks: list[tuple[str, int, int]] = []

    async def probe(topic: str, partition: int) -> int | None:
        return first_after_committed

    async def seek(topic: str, partition: int, offset: int) -> None:
        seeks.append((topic, partition, offset))

    r.loop.probe, r.loop.seek = probe, seek
    return seeks


async def test_an_assignment_that_begins_past_the_committed_offset_reads_again_from_there() -> None:
    """A running worker took over a partition and faust began it at its end: the records after
    the committed offset (here from 60) were never decided by anyone. The run from 100 is not
    decided; the partition is read again from 60, what was fetched before is skipped until 60
    comes (the seek is made again meanwhile: faust's fetch loop may have moved its read offset
    past it), and from there every record is decided once."""
    r = rig(plain=True)
    seeks = probed(r, 60)
    await assign(r, {0}, generation=4)
    late = run_of(topics.HOLDS, 0, 4, [held("u9", "u9", gang_min=1)], first_offset=100)
    assert (await r.loop.process([late])).durable == []
    assert seeks == [(topics.HOLDS, 0, 60)] and all(e.message.acked for e in late.events) and r.loop.restarted == 1
    buffered = run_of(topics.HOLDS, 0, 4, [held("u10", "u10", gang_min=1)], first_offset=101)
    assert (await r.loop.process([buffered])).durable == []  # fetched before the seek: skipped,
    assert all(e.message.acked for e in buffered.events)  # never acknowledged (faust would commit
    assert seeks == [(topics.HOLDS, 0, 60)] * 2 and r.loop.reseeks == 1  # past 60), and the seek made again
    again = run_of(topics.HOLDS, 0, 4, [held(f"u{i}", f"u{i}", gang_min=1) for i in range(11)], first_offset=60)
    [work] = (await r.loop.process([again])).durable
    assert [m.offset for m in work.fetched.messages] == list(range(60, 71))
    bindings = [o.record.uid for o in r.outbox.sent if type(o.record).__name__ == "Binding"]
    assert sorted(bindings) == sorted(f"u{i}" for i in range(11))


@pytest.mark.parametrize("first_after_committed", [40, 60, None])
async def test_an_assignment_that_begins_at_or_before_the_first_record_after_the_committed_offset_goes_on(
        first_after_committed: int | None) -> None:
    """At the committed record (markers of other transactions may lie between: 40 is past an
    offset committed at 38), or before it (a repeat, answered from the records), or with
    nothing found after it: the run is decided as it is, and the check is made once."""
    r = rig(plain=True)
    seeks = probed(r, first_after_committed)
    await assign(r, {0}, generation=4)
    run = run_of(topics.HOLDS, 0, 4, [held("u0", "u0", gang_min=1)], first_offset=40)
    assert len((await r.loop.process([run])).durable) == 1 and seeks == []
    r.loop.probe = None  # not asked again in this assignment
    assert len((await r.loop.process([run_of(topics.HOLDS, 0, 4, [held("u1", "u1", gang_min=1)],
                                             first_offset=41)])).durable) == 1


async def test_a_partition_with_records_waiting_but_nothing_read_after_its_restore_is_read_again() -> None:
    """faust can drop every record of a newly assigned partition up to its end: no run comes
    to be checked, so after the restore the loop looks (each `watch_every_s`, on an injected
    sleep) and reads such a partition again from the first record after the committed offset;
    a partition that had its run, or has nothing waiting, is left alone, and the watch ends."""
    r = rig(plain=True)
    firsts = {0: 60, 1: 5, 2: None}
    seeks: list[tuple[str, int, int]] = []

    async def probe(topic: str, partition: int) -> int | None:
        return firsts[partition]

    async def seek(topic: str, partition: int, offset: int) -> None:
        seeks.append((topic, partition, offset))

    naps: list[float] = []

    async def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) > 1:
            raise AssertionError("the watch goes on after every partition was dealt with")

    r.loop.probe, r.loop.seek, r.loop.sleep = probe, seek, sleep
    await r.loop.on_revoked({TP(topics.HOLDS, p) for p in r.ownership.partitions})
    await r.table.table.on_rebalance({TP(topics.HOLDS, p) for p in (0, 1, 2)}, set(), set(), 4)
    assert len((await r.loop.process([run_of(topics.HOLDS, 1, 4, [held("u0", "u0", gang_min=1)],
                                             first_offset=5)])).durable) == 1  # partition 1 had its run
    await r.loop.on_restored({0, 1, 2})
    [watch] = list(r.loop._watches)
    await watch
    assert seeks == [(topics.HOLDS, 0, 60)] and r.loop.resume_at == {0: 60} and r.loop.restarted == 1
    assert naps == [r.loop.watch_every_s]  # each partition looked at once, then the watch ended
    [work] = (await r.loop.process([run_of(topics.HOLDS, 0, 4, [held("u1", "u1", gang_min=1)],
                                           first_offset=60)])).durable
    assert work.fetched.first_offset == 60

async def test_a_start_that_cannot_be_checked_is_read_again_and_checked_then() -> None:
    r = rig(plain=True)
    seeks = probed(r, 60)
    calls = []

    async def failing(topic: str, partition: int) -> int | None:
        calls.append(partition)
        if len(calls) == 1:
            raise ConnectionError("broker restarting")
        return 60

    r.loop.probe = failing
    await assign(r, {0}, generation=4)
    run = run_of(topics.HOLDS, 0, 4, [held("u0", "u0", gang_min=1)], first_offset=60)
    assert (await r.loop.process([run])).durable == [] and seeks == [(topics.HOLDS, 0, 60)]
    assert len((await r.loop.process([run_of(topics.HOLDS, 0, 4, [held("u0", "u0", gang_min=1)],
                                             first_offset=60)])).durable) == 1
    assert calls == [0, 0]

def gated(r: Rig, answers: list[int | BaseException]) -> tuple[asyncio.Event, list[tuple[int, int]], list[int]]:
    """A probe whose first answer waits for `gate` (a rebalance comes meanwhile); each call
    answers the next of `answers` (an exception is raised). Seeks are recorded."""
    gate = asyncio.Event()
    seeks: list[tuple[int, int]] = []
    probes: list[int] = []

    async def probe(topic: str, partition: int) -> int | None:
        probes.append(partition)
        if len(probes) == 1:
            await gate.wait()
        answer = answers[min(len(probes), len(answers)) - 1]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def seek(topic: str, partition: int, offset: int) -> None:
        seeks.append((partition, offset))

    async def sleep(seconds: float) -> None:
        raise asyncio.CancelledError  # no watch after the restores here: the runs are checked

    r.loop.probe, r.loop.seek, r.loop.sleep = probe, seek, sleep
    return gate, seeks, probes


@pytest.mark.parametrize("first_answer", [60, ConnectionError("coordinator busy")])
async def test_a_probe_answered_after_a_rebalance_leaves_the_new_assignment_alone(first_answer: int | BaseException) -> None:
    """The probe of generation 4's first run (a stale record at 100) answers after a rebalance
    that kept the partition (generation 5). Its answer used to leak into generation 5: a
    rewind to 100 that generation 5 then sought forward to, past 60..99 (lost), or a rewind
    that kept generation 5 from checking its own start. Now it is dropped."""
    r = rig(plain=True)
    gate, seeks, probes = gated(r, [first_answer, 60])
    await assign(r, {0}, generation=4)
    stale = run_of(topics.HOLDS, 0, 4, [held("u100", "u100", gang_min=1)], first_offset=100)
    processing = asyncio.ensure_future(r.loop.process([stale]))
    await asyncio.sleep(0)
    await assign(r, {0}, generation=5)
    gate.set()
    assert (await processing).durable == [] and all(e.message.acked for e in stale.events)
    assert seeks == [] and r.loop.resume_at == {}
    fresh = run_of(topics.HOLDS, 0, 5, [held(f"u{i}", f"u{i}", gang_min=1) for i in range(60, 65)], first_offset=60)
    [work] = (await r.loop.process([fresh])).durable
    assert [m.offset for m in work.fetched.messages] == list(range(60, 65)) and probes == [0, 0]


async def test_a_probe_answered_after_its_partition_moved_away_seeks_nothing() -> None:
    """aiokafka refuses to seek a partition not assigned (the worker would crash)."""
    r = rig(plain=True)
    gate, seeks, _ = gated(r, [60])
    await assign(r, {0, 1}, generation=4)
    processing = asyncio.ensure_future(r.loop.process([run_of(topics.HOLDS, 0, 4, [held("u9", "u9", gang_min=1)],
                                                              first_offset=100)]))
    await asyncio.sleep(0)
    await assign(r, {1}, generation=5)
    gate.set()
    await processing
    assert seeks == []

async def test_a_restore_holds_faust_flow_control_until_its_seek_is_done() -> None:
    r = rig()
    r.table.app.flow_control.resume()
    await assign(r, {0}, generation=1)
    assert not r.table.app.flow_control.is_active()  # faust resumes it after seeking the inputs


async def test_a_revocation_waits_for_the_transaction_in_flight_and_later_ones_drop_their_batch() -> None:
    r, calls, producers = txn_rig()
    await assign(r, {0}, generation=2)
    release = asyncio.Event()
    producer = producers["ks-deciders-holds-0"]
    original_commit = producer.commit_transaction

    async def slow_commit() -> None:
        await release.wait()
        await original_commit()

    producer.commit_transaction = slow_commit  # type: ignore[method-assign]
    in_flight = asyncio.create_task(r.loop.process([run_of(topics.HOLDS, 0, 2, [held("u0", "u0", gang_min=1)])]))
    await asyncio.sleep(0.01)
    revoking = asyncio.create_task(r.loop.on_revoked({TP(topics.HOLDS, 0)}))
    await asyncio.sleep(0.01)
    assert not revoking.done()  # faust's rebalance waits: it reads the committed offsets next
    release.set()
    await revoking
    assert [w.partition for w in (await in_flight).durable] == [0]
    # A batch decided before the revocation but reaching its transaction after it is dropped.
    sink = r.loop.sink
    late = run_of(topics.HOLDS, 0, 2, [held("u1", "u1", gang_min=1)], first_offset=1)
    flushed = await sink.flush([Work(late, 2, [], [], [])])
    assert flushed.lost and calls.count(("ks-deciders-holds-0", "begin")) == 1


async def test_a_producer_whose_sender_was_fenced_loses_the_partition_and_fences_no_one() -> None:
    """aiokafka's sender meets ProducerFenced (AddPartitionsToTxn) and the next send refuses
    with IllegalOperation, which is no KafkaError: the batch is lost, the partition with it, and
    no producer is started again under that id (it would fence the partition's new owner)."""
    from aiokafka.errors import IllegalOperation, ProducerFenced

    failures: dict[str, BaseException] = {}
    r, calls, producers = txn_rig(failures)
    await assign(r, {0, 1}, generation=2)
    failures[f"changelog:{r.table.changelog}/0"] = IllegalOperation("Can't send messages while not in transaction")
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiter.set_exception(ProducerFenced())

    class FatalManager:
        _transaction_waiter = waiter

        def is_fatal_error(self) -> bool:
            return True

    producers["ks-deciders-holds-0"]._txn_manager = FatalManager()  # type: ignore[attr-defined]
    flushed = await r.loop.process([run_of(topics.HOLDS, 0, 2, [held("u0", "u0", gang_min=1)])])
    assert flushed.lost and not flushed.failed and r.ownership.partitions == {1}
    assert calls.count(("ks-deciders-holds-0", "start")) == 1 and ("ks-deciders-holds-0", "stop") in calls


async def test_an_abort_that_finds_the_producer_fenced_loses_the_partition_and_fences_no_one() -> None:
    from aiokafka.errors import KafkaTimeoutError, ProducerFenced

    r, calls, _ = txn_rig({"offsets": KafkaTimeoutError(), "abort": ProducerFenced()})
    await assign(r, {0}, generation=2)
    flushed = await r.loop.process([run_of(topics.HOLDS, 0, 2, [held("u0", "u0", gang_min=1)])])
    assert flushed.lost and not flushed.failed and r.ownership.partitions == set()
    assert calls.count(("ks-deciders-holds-0", "start")) == 1  # before: restarted, fencing the new owner
    assert r.loop.seeks == []  # type: ignore[attr-defined]


def broker_down(r: Rig, refusals: list[BaseException]) -> list[float]:
    """The sink's next producers refuse to start with `refusals`, one each, as aiokafka's
    start does while the broker cannot be reached; returns the back-off delays the sink waits
    (on a clock that moves only by them)."""
    sink = r.loop.sink
    make = sink.producer_factory  # type: ignore[attr-defined]
    waited: list[float] = []
    sink.clock = lambda: sum(waited)  # type: ignore[attr-defined]

    def factory(txn_id: str) -> FakeTxnProducer:
        producer: FakeTxnProducer = make(txn_id)
        if refusals:
            refusal = refusals.pop(0)

            async def start() -> None:
                producer.log.append((txn_id, "start"))
                raise refusal

            producer.start = start  # type: ignore[method-assign]
        return producer

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    sink.producer_factory = factory  # type: ignore[attr-defined]
    sink.sleep = sleep  # type: ignore[attr-defined]
    return waited


async def test_a_producer_that_cannot_be_restarted_while_the_broker_is_down_is_retried_and_its_run_read_again() -> None:
    """A chaos run on Apache Kafka (broker killed and restarted): a transaction failed, its
    producer was left in aiokafka's fatal state (the abort refused), and the new producer could
    not bootstrap. The partition was given up as if another worker had it, though no rebalance
    came: its batches were dropped for good (57 holds leaked). Now the producer is started
    again with back-off until the broker answers, and the run is read again from its offset."""
    from aiokafka.errors import KafkaConnectionError, KafkaError

    r, calls, producers = txn_rig({"offsets": KafkaError("Unexpected error during batch delivery"),
                                   "abort": AssertionError("Invalid state transition TransactionState.FATAL_ERROR "
                                                           "-> TransactionState.ABORTING_TRANSACTION")})
    await assign(r, {0, 1}, generation=2)
    waited = broker_down(r, [KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 52785)]")] * 3)
    first = run_of(topics.HOLDS, 0, 2, [held("u0", "u0", gang_min=1)], first_offset=198)
    flushed = await r.loop.process([first])
    assert [w.fetched.first_offset for w in flushed.failed] == [198] and not flushed.lost
    assert r.ownership.partitions == {0, 1}  # still ours: nobody else took it
    assert calls.count(("ks-deciders-holds-0", "start")) == 5  # assigned, 3 refused, the one that answered
    assert len(waited) == 3 and waited == sorted(waited)  # backing off between the attempts
    assert r.loop.seeks == [(topics.HOLDS, 0, 198)]  # type: ignore[attr-defined]
    again = await r.loop.process([run_of(topics.HOLDS, 0, 2, [held("u0", "u0", gang_min=1)], first_offset=198)])
    [work] = again.durable
    assert work.fetched.first_offset == 198
    [(offsets, _)] = producers["ks-deciders-holds-0"].offsets  # the new producer committed the run
    assert {(tp.topic, tp.partition): o for tp, o in offsets.items()} == {(topics.HOLDS, 0): 199}
    later = await r.loop.process([run_of(topics.HOLDS, 0, 2, [held("u1", "u1", gang_min=1)], first_offset=199)])
    assert [w.fetched.first_offset for w in later.durable] == [199]  # and the partition goes on


async def test_a_restart_refused_because_another_worker_took_the_partition_gives_it_up() -> None:
    from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, ProducerFenced

    r, calls, _ = txn_rig({"offsets": KafkaTimeoutError(), "abort": AssertionError("fatal")})
    await assign(r, {0}, generation=2)
    broker_down(r, [KafkaConnectionError("down"), ProducerFenced()])
    flushed = await r.loop.process([run_of(topics.HOLDS, 0, 2, [held("u0", "u0", gang_min=1)], first_offset=3)])
    assert flushed.lost and not flushed.failed and r.ownership.partitions == set()
    assert calls.count(("ks-deciders-holds-0", "start")) == 3  # no attempt after the fence
    assert r.loop.seeks == []  # type: ignore[attr-defined]


async def test_a_restart_waiting_for_the_broker_stops_when_its_partition_is_revoked() -> None:
    """A rebalance while the producer cannot be started: the attempts stop (a later one would
    fence the partition's new owner), the run is dropped, and a new assignment of the
    partition starts its producer afresh."""
    from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError

    r, calls, producers = txn_rig({"offsets": KafkaTimeoutError(), "abort": AssertionError("fatal")})
    await assign(r, {0}, generation=2)
    refusals: list[BaseException] = [KafkaConnectionError("down")] * 100
    waited = broker_down(r, refusals)
    sleep = r.loop.sink.sleep  # type: ignore[attr-defined]
    revoking: list[asyncio.Task[None]] = []

    async def revoked_meanwhile(seconds: float) -> None:
        await sleep(seconds)
        if len(waited) == 2:  # faust's rebalance, in its own task: it waits for the attempt to end
            revoking.append(asyncio.create_task(r.loop.on_revoked({TP(topics.HOLDS, 0)})))
            await asyncio.sleep(0)

    r.loop.sink.sleep = revoked_meanwhile  # type: ignore[attr-defined]
    flushed = await r.loop.process([run_of(topics.HOLDS, 0, 2, [held("u0", "u0", gang_min=1)], first_offset=3)])
    assert flushed.lost and not flushed.failed and r.loop.seeks == []  # type: ignore[attr-defined]
    assert calls.count(("ks-deciders-holds-0", "start")) == 3  # assigned, then two refused
    await asyncio.wait_for(revoking[0], 1.0)  # the revocation did not wait out its timeout
    refusals.clear()  # the broker is back
    await assign(r, {0}, generation=3)
    assert calls.count(("ks-deciders-holds-0", "start")) == 4
    flushed = await r.loop.process([run_of(topics.HOLDS, 0, 3, [held("u0", "u0", gang_min=1)], first_offset=3)])
    assert [w.fetched.first_offset for w in flushed.durable] == [3]


async def test_a_producer_that_cannot_start_on_assignment_is_started_again_before_the_restore() -> None:
    """The same at assignment: the producer must start before the restore (its InitProducerId
    fences the previous owner), so the assignment waits for it, with back-off."""
    from aiokafka.errors import KafkaConnectionError

    r, calls, _ = txn_rig()
    waited = broker_down(r, [KafkaConnectionError("down")] * 2)
    await assign(r, {0}, generation=2)
    assert r.ownership.partitions == {0} and len(waited) == 2
    assert calls.count(("ks-deciders-holds-0", "start")) == 3
    flushed = await r.loop.process([run_of(topics.HOLDS, 0, 2, [held("u0", "u0", gang_min=1)], first_offset=3)])
    assert [w.fetched.first_offset for w in flushed.durable] == [3]


async def test_an_assignment_whose_producer_cannot_start_for_long_stops_the_worker_not_the_partition() -> None:
    """faust's assignment callback pauses the group's heartbeats, so it waits only so long;
    then the error reaches faust, which stops the worker (it rejoins once restarted), instead
    of the partition being left unread until a rebalance that may never come."""
    from aiokafka.errors import KafkaConnectionError

    from agents.adapters.transactions import ASSIGNED_START_WITHIN_S

    r, calls, _ = txn_rig()
    waited = broker_down(r, [KafkaConnectionError("down")] * 100)
    with pytest.raises(RuntimeError, match=r"holds partitions \[0\]"):
        await assign(r, {0}, generation=2)
    assert sum(waited) <= ASSIGNED_START_WITHIN_S and len(waited) >= 4
    assert calls.count(("ks-deciders-holds-0", "start")) == len(waited) + 1


async def test_a_key_with_pods_deleted_a_retention_ago_is_forgotten_in_a_later_run_and_its_changelog_gets_a_tombstone() -> None:
    retention = 600.0
    r = rig(DeciderCore(retention), plain=True)
    await assign(r, {0, 1, 2, 3}, generation=1)
    partition = partition_for("u1", 4)
    other = next(k for k in (f"v{i}" for i in range(100)) if partition_for(k, 4) == partition)
    await r.loop.process([run_of(topics.HOLDS, partition, 1, [held("u1", "u1", gang_min=1)], timestamp=1000.0)])
    await r.loop.process([run_of(topics.HOLDS, partition, 1, [PodDeleted(uid="u1", decision_key="u1")],
                                 first_offset=1, timestamp=1010.0)])
    assert r.table.get("u1") is not None  # kept: a late Held of u1 must still find it deleted
    await r.loop.process([run_of(topics.HOLDS, partition, 1, [held(other, other, gang_min=1)], first_offset=2,
                                 timestamp=1010.0 + retention / 2)])
    assert r.table.get("u1") is not None and r.loop.swept == 0
    await r.loop.process([run_of(topics.HOLDS, partition, 1, [held(other, other + "b", gang_min=1)], first_offset=3,
                                 timestamp=1011.0 + retention)])
    assert r.table.get("u1") is None and r.loop.swept == 1
    assert (b"u1", None) in r.producer.sent[-1][2]  # the changelog's tombstone: a restore forgets it too
    assert r.table.get(other) is not None  # live: its pod is bound


async def test_a_restore_applies_a_tombstone_as_a_deletion() -> None:
    r = rig()
    await assign(r, {0, 1, 2, 3}, generation=1)
    partition = partition_for("k", 4)
    r.table.put("k", {"key": "k"}, partition, epoch=1)
    r.table.delete("k", partition)
    await r.table.write_changelog(r.producer)
    assert r.producer.sent[-1][2] == [(b"k", None)]

    @dataclass
    class ChangelogEvent:
        key: bytes
        value: Any
        message: FakeMessage

    def event(value: Any, offset: int) -> ChangelogEvent:
        return ChangelogEvent(b"k", value, FakeMessage(r.table.changelog, partition, offset, 1, value))

    r.table.table.apply_changelog_batch([event({"epoch": 1, "seq": 1, "state": {"key": "k"}}, 0), event(None, 1)])
    assert r.table.get("k") is None and b"k" not in r.table.table.partition_of


def timed_run(partition: int, generation: int, records: list[tuple[Any, int, float]],
              topic: str = topics.HOLDS) -> Fetched:
    """A run of (record, offset, log time)."""
    [run] = split([FakeEvent(FakeMessage(topic, partition, offset, generation, encode(r), timestamp=ts))
                   for r, offset, ts in records])
    return run


async def test_a_replay_after_a_key_was_forgotten_is_judged_at_the_partitions_clock() -> None:
    """Adversarial review (R3): catching up a backlog, a decider covers a retention of log time
    in moments; it forgets a deleted pod and is killed before its offset commit. The replayed
    Held, old by its own log time but not by its claim's, must not bind the pod again."""
    retention = 600.0
    r = rig(DeciderCore(retention), plain=True)
    await assign(r, {0, 1, 2, 3}, generation=1)
    p = partition_for("u1", 4)
    other = next(k for k in (f"v{i}" for i in range(100)) if partition_for(k, 4) == p)
    log = [(Held(uid="u1", attempt=0, node="n1", decision_key="u1", scheduled_at=999.0), 0, 1000.0),
           (PodDeleted(uid="u1", decision_key="u1"), 1, 1010.0),
           (Held(uid=other, attempt=0, node="n1", decision_key=other, scheduled_at=1011.0 + retention), 2,
            1011.5 + retention)]
    for record in log:
        await r.loop.process([timed_run(p, 1, [record])])
    assert r.table.get("u1") is None and r.table.clock(p) == 1011.5 + retention
    bound = sum(1 for w in r.sink.flushed for o in w.after if o.record.uid == "u1")
    await assign(r, {0, 1, 2, 3}, generation=2)  # killed before its offset commit: read again from 0
    await r.loop.process([timed_run(p, 2, log[:1])])
    assert sum(1 for w in r.sink.flushed for o in w.after if o.record.uid == "u1") == bound
    assert r.table.get("u1") is None  # answered (released and requeued), nothing recorded


async def test_a_key_is_swept_once_however_often_it_was_written() -> None:
    """Adversarial review (R7): the loop swept a key once per write it had."""
    r = rig(DeciderCore(600.0), plain=True)
    await assign(r, {0, 1, 2, 3}, generation=1)
    key = "ns/gang"
    p = partition_for(key, 4)
    other = next(k for k in (f"v{i}" for i in range(100)) if partition_for(k, 4) == p)
    records = [(Held(uid=u, attempt=0, node="n1", decision_key=key, gang_min=2, scheduled_at=99.0), 100.0)
               for u in ("a", "b")]
    records += [(PodDeleted(uid="a", decision_key=key), 110.0)]
    records += [(Held(uid=f"c{i}", attempt=0, node="n1", decision_key=key, gang_min=2, scheduled_at=119.0 + i),
                 120.0 + i) for i in range(20)]
    for offset, (record, ts) in enumerate(records):
        await r.loop.process([timed_run(p, 1, [(record, offset, ts)])])
    await r.loop.process([timed_run(p, 1, [(Held(uid=other, attempt=0, node="n1", decision_key=other,
                                                   scheduled_at=800.0), len(records), 800.0)])])
    assert r.loop.swept == 1


# -- time from outside (issue 28, item 3) ----------------------------------------------------

DAY = 86400.0


def answers(r: Rig, kind: type) -> list[Any]:
    return [o.record for w in r.sink.flushed for o in w.first + w.after if isinstance(o.record, kind)]


async def test_a_node_update_stamped_a_day_ahead_does_not_make_its_partition_refuse_fresh_claims() -> None:
    """Issue 28, item 3: a Node update with a log time one day ahead (a producer's clock) raised
    the partition's clock to it, saved with the table, and every fresh claim on the partition
    was Rejected as older than half the retention, across restarts."""
    wall = 50_000.0
    r = rig(OwnerCore(retention_s=600.0), topic=topics.NODE_INBOX, plain=True)
    r.loop.wall = lambda: wall
    await assign(r, {0, 1, 2, 3}, generation=1, topic=topics.NODE_INBOX)
    p = partition_for("n1", 4)
    alloc = ResourceList(cpu=4000, memory=2**34, pods=110)

    def claim(uid: str) -> Claim:
        return Claim(uid=uid, attempt=0, node="n1", decision_key=uid, requests=ResourceList(cpu=100, pods=1),
                     scheduled_at=wall - 0.5)

    await r.loop.process([timed_run(p, 1, [(Node(name="n1", capacity=alloc, allocatable=alloc), 0, wall + DAY)],
                                    topic=topics.NODE_INBOX)])
    await r.loop.process([timed_run(p, 1, [(claim("u1"), 1, wall)], topic=topics.NODE_INBOX)])
    await assign(r, {0, 1, 2, 3}, generation=2, topic=topics.NODE_INBOX)  # the clock is kept across a restart
    wall += 1.0
    await r.loop.process([timed_run(p, 2, [(claim("u2"), 2, wall)], topic=topics.NODE_INBOX)])
    assert answers(r, Rejected) == []
    assert sorted(h.uid for h in answers(r, Held)) == ["u1", "u2"]
    assert r.loop.future == 1 and r.table.clock(p) <= wall + r.loop.max_skew_s  # counted, and taken at the bound


async def test_a_record_stamped_a_day_ahead_on_holds_does_not_make_its_partition_release_fresh_helds() -> None:
    wall = 50_000.0
    r = rig(DeciderCore(600.0), plain=True)
    r.loop.wall = lambda: wall
    await assign(r, {0, 1, 2, 3}, generation=1)
    p = partition_for("u1", 4)
    other = next(k for k in (f"v{i}" for i in range(100)) if partition_for(k, 4) == p)
    await r.loop.process([timed_run(p, 1, [(PodDeleted(uid=other, decision_key=other), 0, wall + DAY)])])
    await r.loop.process([timed_run(p, 1, [(Held(uid="u1", attempt=0, node="n1", decision_key="u1",
                                                 scheduled_at=wall - 0.5), 1, wall)])])
    assert [b.uid for b in answers(r, Binding)] == ["u1"]


async def test_a_replay_judges_what_was_decided_at_the_saved_clock_whatever_the_wall_says() -> None:
    """A record stamped ahead is judged by the wall clock once, when it is first decided: read
    again after a crash (the wall moved on), it is judged at the partition's saved clock, so a
    replay computes its times from the log and the table alone; what follows it is new."""
    wall = 50_000.0
    r = rig(DeciderCore(600.0), plain=True)
    r.loop.wall = lambda: wall
    await assign(r, {0, 1, 2, 3}, generation=1)
    p = partition_for("u1", 4)
    log = [(PodDeleted(uid="u1", decision_key="u1"), 0, wall + DAY)]
    await r.loop.process([timed_run(p, 1, log)])
    assert (r.table.clock(p), r.table.decided(p), r.loop.future) == (wall + r.loop.max_skew_s, 1, 1)
    wall += 500.0
    await assign(r, {0, 1, 2, 3}, generation=2)  # killed before its offset commit: read again from 0
    await r.loop.process([timed_run(p, 2, log)])
    assert (r.table.clock(p), r.loop.future) == (50_000.0 + r.loop.max_skew_s, 1)
    await r.loop.process([timed_run(p, 2, [(PodDeleted(uid="u2", decision_key="u2"), 1, wall + DAY)])])
    assert (r.table.clock(p), r.table.decided(p), r.loop.future) == (wall + r.loop.max_skew_s, 2, 2)


async def test_a_clock_written_before_it_recorded_its_offset_still_reads() -> None:
    r = rig()
    await assign(r, {0}, generation=1)
    r.table.put("\x00clock/0", {"now": 5.0}, 0, epoch=1)
    assert (r.table.clock(0), r.table.decided(0)) == (5.0, 0)
    r.table.advance(0, 4.0, 1, next_offset=3)  # the offset moves on, the clock never back
    assert (r.table.clock(0), r.table.decided(0)) == (5.0, 3)
