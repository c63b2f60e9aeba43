"""faust registration of a stateful agent: a table, its ownership, its sink and timers, and
the shared loop (`agents.adapters.loop.StatefulLoop`) as a faust agent on its input channel."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import faust
from faust.types import TP

from agents.adapters.batches import fetched_batches, micro_batch_events, split, to_raw
from agents.adapters.connection import KafkaConnection
from agents.adapters.loop import Core, Seek, Sink, StatefulLoop
from agents.adapters.ownership import Ownership
from agents.adapters.positions import CommittedStart
from agents.adapters.starts import ReadFromStart
from agents.adapters.tables import VersionedState
from agents.adapters.timers import RecordTimers
from agents.adapters.transactions import MakeOutbox, PlainSink, TransactionalSink
from agents.intake import RawMessage
from agents.ports import AgentConfig, Outbox

log = logging.getLogger("koordstream.agents")


@dataclass(frozen=True)
class Transactions:
    """How the stateful agents make a batch durable, handed in by `streams`.

    `enabled`: one transaction per input partition per batch (the input channels then have
    faust's acks disabled); otherwise the plain path. `kafka`: where the transactional
    producers and the start probes (`CommittedStart`) connect, and how (None: no probes; the
    transactional path needs it). The rest configures the transactional producers: the app id
    that prefixes their ids, the consumer group their offsets commit to, aiokafka producer
    options (compression, sizes), and how to build an outbox (the catalogue's routing) around a
    producer's send function."""

    enabled: bool = False
    app_id: str = "koordstream"
    group_id: str = "koordstream"
    kafka: KafkaConnection | None = None
    producer_options: Mapping[str, Any] = field(default_factory=dict)
    make_outbox: MakeOutbox | None = None


def forget_gaps(consumer: Any, tp: TP, offset: int) -> None:
    """After a seek back to `offset`: without transactions faust commits what is acknowledged,
    filling the gaps it noted between the offsets it delivered; gaps at or after `offset` are
    stale (what lies there is read again), and filling them would commit past records that
    are not decided yet."""
    gaps = getattr(consumer, "_gap", {})
    if tp in gaps:
        gaps[tp].chop(offset, 2**63)


def seeker(app: faust.App) -> Seek:
    """Read a partition of the app's consumer again from an offset: in the consumer's own
    thread (faust's `seek` changes the fetcher from this one: a chaos run saw it delete a
    partition's fetched records under the fetch loop, which crashed), faust's read offset with
    it, and the gaps faust noted past it forgotten."""

    async def seek(topic: str, partition: int, offset: int) -> None:
        tp = TP(topic, partition)
        await app.consumer.seek_wait({tp: offset})
        forget_gaps(app.consumer, tp, offset)

    return seek


def register_stateful(app: faust.App, name: str, channel: faust.TopicT, core: Core, outbox: Outbox,
                      config: AgentConfig, transactions: Transactions) -> StatefulLoop:
    """Declare the table and the faust agent `koordstream.<name>` that runs `core`."""
    table = VersionedState(app, config.table_name, config.partitions, split=core.split)
    topics = list(channel.topics)
    if len(topics) != 1:
        raise ValueError(f"{name}: a stateful agent reads one topic, got {topics}")
    ownership = Ownership(topics[0])
    sink: Sink
    if transactions.enabled:
        if transactions.make_outbox is None or transactions.kafka is None:
            raise ValueError(f"{name}: transactions need an outbox factory and a Kafka connection")
        sink = TransactionalSink(table=table, ownership=ownership, make_outbox=transactions.make_outbox,
                                 app_id=transactions.app_id, agent=name, group_id=transactions.group_id,
                                 kafka=transactions.kafka, producer_options=transactions.producer_options)
    else:
        sink = PlainSink(table, outbox)
    timers = RecordTimers(outbox, owned=lambda partition: partition in ownership.owned)

    # The start check (`StatefulLoop._starts_right`, `watch_starts`) runs on both brokers: the
    # faust losses it catches are faust's, not the broker's. (It once ran with transactions only:
    # on Tansu, two clean-clone CI runs with it on left pods unbound; the cause was a gang
    # livelock, fixed since: docs/history.md, "A gang stuck on Tansu".)
    probe = CommittedStart(transactions.kafka, transactions.group_id, read_committed=transactions.enabled) \
        if transactions.kafka is not None else None
    loop = StatefulLoop(name, core, table, ownership, sink, timers, seek=seeker(app), probe=probe,
                        max_skew_s=config.max_clock_skew_s)
    loop.attach()

    async def on_revoked(sender: Any, revoked: set[Any], **kwargs: Any) -> None:
        await loop.on_revoked(revoked)

    async def on_shutdown(sender: Any, **kwargs: Any) -> None:
        await sink.close()
        if probe is not None:
            await probe.close()

    # mode's SignalHandlerT admits no function under mypy (its NamedArg "signal"), hence the ignores.
    app.on_partitions_revoked.connect(on_revoked)  # type: ignore[arg-type]
    app.on_before_shutdown.connect(on_shutdown)  # type: ignore[arg-type]

    @app.agent(channel, name=f"koordstream.{name}")
    async def agent(stream: faust.StreamT[Any]) -> None:
        try:
            await loop.run(fetched_batches(stream, config))
        except Exception as exc:
            # A batch failed to become durable (its acks withheld by the loop). faust would restart
            # the agent at its read position, past that batch, and decide what follows without
            # it: stop the worker instead; whoever owns the partitions next reads them again from
            # their committed offsets.
            log.error("%s: a batch failed (%r): the worker stops", name, exc)
            await app.crash(exc)
            await asyncio.Future()  # no restart of this agent past the batch: wait to be stopped

    return loop


class ForwarderStarts:
    """The start check of a stateless forwarder (`koordstream.sandbox-outcomes`,
    `koordstream.nodes`): faust commits what such an agent acknowledges, and can lose what it
    fetched of a newly assigned partition around a rebalance while its read position moves
    past it (`agents.adapters.starts`); it then fills the gap it notes and commits past the
    lost records, so no worker ever reads them again (seen on CI: a pool's Binding never
    forwarded after a state worker was killed, its claim never Ready). Each partition of the
    forwarder's topics is checked once per assignment against the group's committed offset
    (`ReadFromStart`, with `CommittedStart` as its probe), read again from there if it began
    past it, and what is dropped meanwhile is withheld from faust's acknowledgements."""

    def __init__(self, app: faust.App, channel: faust.TopicT, transactions: Transactions) -> None:
        if transactions.kafka is None:
            raise ValueError("a forwarder's start check needs a Kafka connection")
        names = set(channel.topics)
        self.probe = CommittedStart(transactions.kafka, transactions.group_id, read_committed=transactions.enabled)
        self.starts = ReadFromStart(self.probe, seeker(app))

        # faust sends these after a rebalance's revocation and with the whole new assignment (args: the TPs).
        async def revoked(sender: Any, *args: Any, **kwargs: Any) -> None:
            self.starts.revoked((tp.topic, tp.partition) for tp in args[0] if tp.topic in names)

        async def assigned(sender: Any, *args: Any, **kwargs: Any) -> None:
            self.starts.assigned({(tp.topic, tp.partition) for tp in args[0] if tp.topic in names},
                                 app.consumer_generation_id)

        async def rebalanced(sender: Any, **kwargs: Any) -> None:
            self.starts.rebalanced()

        async def shutdown(sender: Any, **kwargs: Any) -> None:
            self.starts.close()
            await self.probe.close()

        app.on_partitions_revoked.connect(revoked)  # type: ignore[arg-type]
        app.on_partitions_assigned.connect(assigned)  # type: ignore[arg-type]
        app.on_rebalance_complete.connect(rebalanced)  # type: ignore[arg-type]
        app.on_before_shutdown.connect(shutdown)  # type: ignore[arg-type]

    async def admit(self, events: Sequence[Any]) -> list[RawMessage]:
        """The messages of a micro-batch (faust events) the forwarder may take, in order; the
        others are withheld from faust's acknowledgements (they come again)."""
        runs = split(events)
        taken = await self.starts.admit(runs)
        if len(taken) == len(events):  # the usual case: nothing dropped
            return taken
        kept = {(m.topic, m.partition, m.offset) for m in taken}
        for run in runs:
            for event, m in zip(run.events, run.messages, strict=True):
                if (m.topic, m.partition, m.offset) not in kept:
                    event.message.acked = True  # as `Fetched.withhold_acks`
        return taken


async def forward_batch(events: Sequence[Any], starts: ForwarderStarts | None,
                        send: Callable[[list[RawMessage]], Awaitable[None]]) -> None:
    """A stateless forwarder's micro-batch (faust events): the messages `starts` admits (all of
    them without it) handed to `send`. If `send` raises, the batch's messages are withheld from
    faust's acknowledgements and the error is raised: faust acknowledges (and commits) a batch
    whose agent failed, and what it forwards would be lost."""
    messages = [to_raw(e) for e in events] if starts is None else await starts.admit(events)
    try:
        await send(messages)
    except BaseException:
        for run in split(events):
            run.withhold_acks()
        raise


def register_forwarder(app: faust.App, channel: faust.TopicT, name: str, config: AgentConfig,
                       transactions: Transactions, send: Callable[[list[RawMessage]], Awaitable[None]]) -> None:
    """The faust agent `name` that hands each micro-batch of `channel` to `send` (`forward_batch`),
    with the start check where the worker has a Kafka connection (`ForwarderStarts`)."""
    starts = ForwarderStarts(app, channel, transactions) if transactions.kafka is not None else None

    @app.agent(channel, name=name)
    async def forwarder(stream: faust.StreamT[Any]) -> None:
        try:
            async for events in micro_batch_events(stream, config):
                await forward_batch(events, starts, send)
        except Exception as exc:
            # As the stateful agents: faust would restart the agent past the batch; whoever
            # reads the partitions next reads it again.
            log.error("%s: a batch was not forwarded (%r): the worker stops", name, exc)
            await app.crash(exc)
            await asyncio.Future()  # no restart of this agent past the batch: wait to be stopped
