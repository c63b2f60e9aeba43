"""The pools in the shared stateful loop (no broker): a run whose transaction aborts is read
again against the table it left in memory, so its outputs and its timer must come from the
replay (before, the replay sent neither: the refill pods were never published and the pool
waited for a tick nobody had armed). And the forwarder of their pods' outcomes never lets
faust acknowledge a batch it could not deliver."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Sequence
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError

from agents.adapters.sandbox import SandboxCore, outcomes_sender
from agents.adapters.starts import ReadFromStart
from agents.adapters.stateful import ForwarderStarts, forward_batch
from agents.adapters.transactions import TransactionalSink
from agents.ports import Output
from schemas import topics
from schemas.codec import encode
from schemas.records import (
    Binding,
    Pod,
    SandboxClaimStatus,
    SandboxTick,
)
from tests.builders import make_pool, make_sandbox_claim, sandbox_bound
from tests.unit.test_adapter_loop import (
    FakeEvent,
    FakeMessage,
    FakeOutbox,
    FakeTxnProducer,
    Rig,
    assign,
    rig,
    run_of,
    settle,
)

POOL = make_pool(2)


def pools_rig() -> tuple[Rig, dict[str, BaseException]]:
    """The pools' core in the loop, with transactional producers that fail when told to."""
    core = SandboxCore(retention_s=600.0)
    r = rig(core=core, topic=topics.SANDBOX)
    core.clock = lambda: r.clock.now
    failures: dict[str, BaseException] = {}
    outboxes: list[FakeOutbox] = []

    def make_outbox(send: Any) -> FakeOutbox:
        outboxes.append(FakeOutbox())
        return outboxes[-1]

    r.loop.sink = TransactionalSink(table=r.table, ownership=r.ownership, make_outbox=make_outbox, app_id="ks",
                                    agent="pools", group_id="ks", kafka="unused:9092", producer_options={},
                                    producer_factory=lambda txn_id: FakeTxnProducer(txn_id, [], failures))

    async def seek(topic: str, partition: int, offset: int) -> None:
        return None

    r.loop.seek = seek
    r.loop.outboxes = outboxes  # type: ignore[attr-defined]
    return r, failures


def sent(r: Rig) -> list[Any]:
    return [o.record for box in r.loop.outboxes for o in box.sent]  # type: ignore[attr-defined]


async def test_a_pool_run_read_again_after_its_transaction_aborted_re_sends_its_outputs_and_its_tick() -> None:
    r, failures = pools_rig()
    await assign(r, {0}, generation=2, topic=topics.SANDBOX)
    await r.loop.process([run_of(topics.SANDBOX, 0, 2, [POOL], first_offset=0, timestamp=1.0)])
    pods = [p for p in sent(r) if isinstance(p, Pod)]
    assert len(pods) == 2
    binds = [sandbox_bound(p.uid) for p in pods]
    await r.loop.process([run_of(topics.SANDBOX, 0, 2, binds, first_offset=1, timestamp=2.0)])

    # A claim takes a ready sandbox and leaves the pool short: its run asks for a tick, and aborts.
    failures["commit"] = KafkaTimeoutError()
    claim = make_sandbox_claim("a")
    assert (await r.loop.process([run_of(topics.SANDBOX, 0, 2, [claim], first_offset=3, timestamp=3.0)])).failed
    assert not r.loop.timers.armed  # armed only for durable runs
    before = len(sent(r))
    again = await r.loop.process([run_of(topics.SANDBOX, 0, 2, [claim], first_offset=3, timestamp=3.0)])
    assert again.durable
    assert [s.phase for s in sent(r)[before:] if isinstance(s, SandboxClaimStatus)] == ["Ready"]
    assert r.loop.timers.armed  # the tick the pool waits for

    # The tick's round starts the missing sandbox; its run aborts too.
    r.clock.advance(10.0)  # past the log time it was asked for (this worker's clock started at 0)
    await settle(r.loop.timers)
    [tick] = [o.record for o in r.outbox.sent if isinstance(o.record, SandboxTick)]
    failures["commit"] = KafkaTimeoutError()
    first = len(sent(r))
    assert (await r.loop.process([run_of(topics.SANDBOX, 0, 2, [tick], first_offset=4, timestamp=4.0)])).failed
    lost = [p.uid for p in sent(r)[first:] if isinstance(p, Pod)]
    assert len(lost) == 1  # sent inside the aborted transaction: never visible
    before = len(sent(r))
    assert (await r.loop.process([run_of(topics.SANDBOX, 0, 2, [tick], first_offset=4, timestamp=4.0)])).durable
    assert [p.uid for p in sent(r)[before:] if isinstance(p, Pod)] == lost


class FailingOutbox(FakeOutbox):
    async def send(self, outputs: Sequence[Output]) -> list[Awaitable[object]]:
        raise KafkaTimeoutError()


async def test_a_batch_of_outcomes_the_forwarder_cannot_deliver_is_never_acknowledged() -> None:
    """Before, the forwarder's agent failed and faust acknowledged (and committed) the batch:
    its Bindings never reached the pool, whose sandboxes then stayed starting for good."""
    bound = sandbox_bound("sbx~agents~p~x-0")
    events = [FakeEvent(FakeMessage(topics.BINDINGS, 0, i, 1, encode(r)))
              for i, r in enumerate([bound, Binding(uid="other", namespace="ns", name="o", node="n0", attempt=0,
                                                    decision_key="other")])]
    with pytest.raises(KafkaTimeoutError):
        await forward_batch(events, None, outcomes_sender(FailingOutbox()))
    assert all(e.message.acked for e in events)  # withheld: faust skips them, never commits past them
    outbox = FakeOutbox()
    fresh = [FakeEvent(dataclasses.replace(e.message, acked=False)) for e in events]
    await forward_batch(fresh, None, outcomes_sender(outbox))
    assert [(o.topic, o.key, o.record) for o in outbox.sent] == [(topics.SANDBOX, "p", bound)]
    assert not any(e.message.acked for e in fresh)  # acknowledged by faust, as usual


async def test_the_forwarder_reads_a_partition_again_that_began_past_its_committed_offset() -> None:
    """faust can lose what it fetched of a newly assigned partition around a rebalance and read
    on past it, then fill the gap and commit past what it lost (CI: a pool's Binding never
    forwarded after its state worker was killed, a claim never Ready). The forwarder's start
    check reads the partition again from the first record after the group's committed offset,
    and withholds what it dropped meanwhile from faust's acknowledgements."""
    bindings = [sandbox_bound(f"sbx~agents~p~x-{i}") for i in range(6)]
    sought: list[tuple[str, int, int]] = []

    async def probe(topic: str, partition: int) -> int | None:
        return 2  # the group's committed offset: records 2.. were never forwarded

    async def seek(topic: str, partition: int, offset: int) -> None:
        sought.append((topic, partition, offset))

    starts = ForwarderStarts.__new__(ForwarderStarts)  # its rebalance signals are faust's: driven here
    starts.starts = ReadFromStart(probe, seek)
    starts.starts.assigned({(topics.BINDINGS, 0)}, 1)
    outbox = FakeOutbox()
    late = [FakeEvent(FakeMessage(topics.BINDINGS, 0, i, 1, encode(bindings[i]))) for i in (4, 5)]
    await forward_batch(late, starts, outcomes_sender(outbox))
    assert outbox.sent == [] and sought == [(topics.BINDINGS, 0, 2)]
    assert all(e.message.acked for e in late)  # withheld: faust never commits past the lost records
    again = [FakeEvent(FakeMessage(topics.BINDINGS, 0, i, 1, encode(bindings[i]))) for i in range(2, 6)]
    await forward_batch(again, starts, outcomes_sender(outbox))
    assert [o.record for o in outbox.sent] == bindings[2:]
    assert not any(e.message.acked for e in again)  # acknowledged by faust, as usual
