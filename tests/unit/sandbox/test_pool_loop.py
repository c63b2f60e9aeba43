"""The pools in the shared stateful loop (no broker): a run whose transaction aborts is read
again against the table it left in memory, so its outputs and its timer must come from the
replay (before, the replay sent neither: the refill pods were never published and the pool
waited for a tick nobody had armed)."""

from __future__ import annotations

from typing import Any

from aiokafka.errors import KafkaTimeoutError

from agents.adapters.sandbox import SandboxCore
from agents.adapters.transactions import TransactionalSink
from schemas import topics
from schemas.records import (
    Pod,
    SandboxClaimStatus,
    SandboxTick,
)
from tests.builders import make_pool, make_sandbox_claim, sandbox_bound
from tests.unit.test_adapter_loop import (
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
