"""The faust app factory and the wiring of every agent into one worker.

`build_app(settings, transactions)` makes the faust App (memory store with changelog-backed
tables, our own topic creation, no web server), declares the channels with raw serializers
(the agents decode themselves, so bad input reaches the dead-letter topic), and registers the
agents (`agents.adapters`): node forwarder and owners, deciders, scheduler (agent, loop, and the
replica feed, which starts from the nodes as the owners' changelog has them and then reads every
`state-changes` partition from where it stood before that, with aiokafka consumers outside any
group), and the scheduler's Prometheus endpoint when `worker.metrics_port` is set.

Transactions (`kafka.transactions`, resolved by `resolve_transactions` before the app is
built): owners and deciders then process each micro-batch as one transaction per input
partition (`agents.adapters.transactions`); their input channels have faust's acks disabled
(the transactions commit the offsets), the worker's consumer and the tables' restore read
`read_committed` (`koordstream-committed://`, `agents.adapters.recovery`), and so does the
replica feed (always: without transactions it reads the same records).

Every Kafka client here connects as `streams.connection.connect(settings.kafka)` says: faust's
(its consumer, producer and table restores) through `broker_credentials`, the adapters' own
(transactional producers, start probes, restore tails, the rebalancer's consumers, the replica
feed) through the `KafkaConnection` they are handed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import faust
import orjson
from aiokafka import TopicPartition
from aiokafka.errors import BrokerResponseError, KafkaError
from prometheus_client.registry import CollectorRegistry

from agents.adapters import deciders, owners
from agents.adapters import rebalancer as rebalancer_agent
from agents.adapters import sandbox as sandbox_agent
from agents.adapters import scheduler as scheduler_agent
from agents.adapters.connection import KafkaConnection
from agents.adapters.positions import CommittedStart
from agents.adapters.recovery import table_manager
from agents.adapters.stateful import Transactions
from agents.adapters.tables import ChangelogRecord, UnreadableState
from agents.intake import RawMessage, origin_from_headers
from agents.ports import AgentConfig
from agents.rebalance import config as rebalance_config
from agents.rebalance.rebalancer import Rebalancer
from agents.rebalance.service import RebalancerService
from agents.scheduler.agent import SchedulerService
from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.scheduler.framework import profiles
from agents.state.resources import DEFAULT_RESOURCES, ResourceSpace
from schemas import topics
from schemas.records import NodeStateChange
from streams import gaps, transport
from streams.catalogue import TABLE_NODE_STATE, TABLE_POD_LEDGER, TABLE_SANDBOX_POOLS
from streams.connection import connect
from streams.gaps import GapGuard
from streams.metrics import registry_for, serve_metrics
from streams.outbox import PartitionedOutbox
from streams.process import GcPacer
from streams.reader import read_to_end
from streams.settings import Settings, runtime_table

CHANGELOG_BUFFER = 10_000
log = logging.getLogger("koordstream.app")


async def broker_accepts_transactions(kafka: KafkaConnection | str, timeout_s: float = 15.0) -> bool:
    """Whether the broker grants a producer id (InitProducerId): Apache Kafka does, the
    embedded Tansu broker refuses (UnknownError). Only a refusal in the broker's answer counts
    as no; a broker not reached, or an answer to try again, is asked again until `timeout_s`,
    then raises (a guess would turn transactions off on an Apache Kafka that was restarting,
    and guard its consumers against gaps that are its transaction markers)."""
    conn = KafkaConnection.of(kafka)
    deadline = time.monotonic() + timeout_s
    while True:
        producer = conn.producer(enable_idempotence=True)
        try:
            await asyncio.wait_for(producer.start(), max(0.1, deadline - time.monotonic()))
            return True
        except BrokerResponseError as exc:
            if not exc.retriable:
                log.info("the broker at %s refuses InitProducerId (%r): no transactions", conn.bootstrap, exc)
                return False
            failure: BaseException = exc
        except (TimeoutError, KafkaError, OSError) as exc:
            failure = exc
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), 5.0)
        if time.monotonic() >= deadline:
            raise RuntimeError(f"kafka.bootstrap={conn.bootstrap}: cannot tell whether the broker grants producer ids "
                               f"(InitProducerId) within {timeout_s}s: {failure!r}")
        await asyncio.sleep(0.5)


async def resolve_transactions(settings: Settings, accepts_transactions: bool | None = None) -> bool:
    """`kafka.transactions` as a decision: `auto` asks the broker (unless `accepts_transactions`
    tells what it answered)."""
    mode = settings.kafka.transactions
    if mode == "off" or "state" not in settings.worker.roles:
        return False
    accepted = accepts_transactions
    if accepted is None:
        accepted = await broker_accepts_transactions(connect(settings.kafka))
    if mode == "on" and not accepted:
        raise ValueError(f"kafka.transactions: on, but the broker at {settings.kafka.bootstrap} refuses "
                         "InitProducerId (no transactional producers); use auto or off")
    return accepted


async def guard_gaps(settings: Settings, accepts_transactions: bool | None = None) -> GapGuard | None:
    """`kafka.contiguous_offsets` as a decision: with `on`, or `auto` and a broker that refuses
    InitProducerId (asked unless `accepts_transactions` tells), every aiokafka consumer of this
    process waits at offset gaps (`streams.gaps`). Returns the guard installed, if any."""
    mode = settings.kafka.contiguous_offsets
    if mode == "off":
        return None
    if mode == "auto":
        if accepts_transactions is None:
            accepts_transactions = await broker_accepts_transactions(connect(settings.kafka))
        if accepts_transactions:
            return None
    guard = gaps.install(settings.kafka.bootstrap, settings.kafka.gap_wait_s)
    log.info("consumers wait up to %ss for the records of an offset gap (kafka.contiguous_offsets=%s)",
             settings.kafka.gap_wait_s, mode)
    return guard


def build_app(settings: Settings, transactions: bool = False, datadir: Path | None = None) -> faust.App:
    """`datadir`: where faust keeps its data (`streams.worker.state_dir`); None: faust's default."""
    k = settings.kafka
    if not k.bootstrap:
        raise ValueError("kafka.bootstrap: the worker needs a broker address (`koordstream up` starts one)")
    transport.FETCH_MAX_WAIT_MS = k.fetch_max_wait_ms
    conn = connect(k)
    app = faust.App(
        group_id(settings),
        broker=f"{transport.COMMITTED_SCHEME if transactions else transport.SCHEME}://{k.bootstrap}",
        # SASL and TLS: faust hands these to its consumer, its producer and its restores' clients.
        broker_credentials=conn.faust_credentials(),
        store="memory://",
        datadir=str((datadir or Path()) / "{conf.name}-data"),  # faust's own default under datadir
        web_enabled=False,
        topic_partitions=k.partitions,
        topic_allow_declare=False,  # streams.admin creates every topic explicitly
        topic_disable_leader=True,
        broker_rebalance_timeout=k.rebalance_timeout_s,
        broker_session_timeout=k.session_timeout_s,
        broker_heartbeat_interval=1.0,
        broker_commit_every=1000,
        broker_commit_interval=1.0,
        consumer_auto_offset_reset="earliest",
        # Every agent awaits the acknowledgement of what a batch wrote (changelog, then outputs)
        # before its next batch, so a linger only delays each of those round trips; requests
        # still carry whatever is ready at once. 0 against 2 ms: the warm pools' claims at
        # 1,000/s answered sooner (p50 about 10% lower), sandbox-burst and mixed-100k at 20,000
        # pods no slower (measured 2026-12-07: the message of commit 1bec1b5).
        producer_linger_ms=0,
        # Changelog and output batches compress to a fraction of their size (zstd, level 3;
        # lz4 at aiokafka's fixed level 9 took a seventh of the state worker's CPU in mixed-100k).
        producer_compression_type=transport.COMPRESSION,
        producer_max_request_size=4 * 1024 * 1024,
        # A produce request carries one batch per partition: at aiokafka's default 16 KiB, an
        # owners' micro-batch (a changelog record per touched node) took dozens of round trips.
        producer_max_batch_size=transport.MAX_BATCH_BYTES,
        stream_wait_empty=False,
        table_cleanup_interval=3600.0,
        # A standby copy of a memory-store table does not shorten a takeover (faust restores a
        # newly active partition from its changelog's start anyway): it would only cost CPU.
        table_standby_replicas=0,
        # Restores end at each changelog's last record as read from the partition, not at the end
        # offset ListOffsets answers (`agents.adapters.recovery`: wrong under transactions, and on
        # Tansu, which answers the base offset of the last record batch plus one).
        TableManager=table_manager(conn, read_committed=transactions),
    )
    # Table writes queue changelog records in faust's producer buffer, which stalls every
    # stream once 100 are pending; a micro-batch touches hundreds of keys at once.
    app.producer.buffer.max_messages = CHANGELOG_BUFFER
    wire(app, settings, transactions, conn)
    return app


def group_id(settings: Settings) -> str:
    """The consumer group (and faust app id) of a worker.

    Workers that run the `state` role share `kafka.app_id`, which also names the tables'
    changelogs; scheduler-only workers form their own group, `<app_id>-scheduler`, since they
    consume other topics and keep no tables; rebalancer-only workers consume nothing through
    faust (`<app_id>-rebalancer-worker`; their leadership group is the rebalancer's own).
    """
    roles = settings.worker.roles
    if "state" in roles:
        return settings.kafka.app_id
    return f"{settings.kafka.app_id}-{'scheduler' if 'scheduler' in roles else 'rebalancer-worker'}"


def _channel(app: faust.App, *names: str, partitions: int, acks: bool = True) -> faust.TopicT:
    return app.topic(*names, key_type=bytes, value_type=bytes, key_serializer="raw",
                     value_serializer="raw", partitions=partitions, acks=acks)


def wire(app: faust.App, settings: Settings, transactions: bool = False, kafka: KafkaConnection | None = None) -> None:
    conn = kafka or connect(settings.kafka)
    p = settings.kafka.partitions
    s = settings.scheduling

    async def send(topic: str, key: bytes | None, value: bytes, partition: int,
                   headers: list[tuple[str, bytes]] | None) -> Awaitable[object]:
        fut: Awaitable[object] = await app.producer.send(topic, key, value, partition, None, headers)
        return fut

    batched = settings.kafka.record_batches
    outbox = PartitionedOutbox(send, p, batched=batched)

    # The deciders keep the elastic quotas' ledgers (`agents.state.quotas`): the same profiles
    # as the schedulers', so that the max a scheduler pre-filters with is the one guaranteed.
    quotas = tuple(profiles.quota_tree(profiles.load(Path(s.profiles).read_text()) if s.profiles else None)
                   .specs.values()) if "state" in settings.worker.roles else ()

    def config(table: str = "") -> AgentConfig:
        return AgentConfig(partitions=p, batch_size=s.batch_size, batch_within_s=s.batch_within_s, table_name=table,
                           retention_s=settings.worker.state_retention_s, commit_inputs=s.commit_input_offsets,
                           max_clock_skew_s=settings.worker.clock_skew_s(), quotas=quotas,
                           nomination_ttl_s=s.nomination_ttl_s)

    if "state" in settings.worker.roles:
        k = settings.kafka
        txns = Transactions(
            enabled=transactions, app_id=k.app_id, group_id=group_id(settings), kafka=conn,
            producer_options={"compression_type": transport.COMPRESSION,
                              "max_batch_size": transport.MAX_BATCH_BYTES, "max_request_size": 4 * 1024 * 1024,
                              "retry_backoff_ms": 10},
            make_outbox=lambda send_fn: PartitionedOutbox(send_fn, p, batched=batched))
        # With transactions the input offsets are committed inside each batch's transaction:
        # faust must not commit them too (acks off on the channel).
        loops = [
            owners.register(app, _channel(app, topics.NODES, partitions=p),
                            _channel(app, topics.NODE_INBOX, partitions=p, acks=not transactions), outbox,
                            config(TABLE_NODE_STATE), txns),
            deciders.register(app, _channel(app, topics.HOLDS, partitions=p, acks=not transactions), outbox,
                              config(TABLE_POD_LEDGER), txns),
            sandbox_agent.register(app, _channel(app, topics.BINDINGS, topics.FEEDBACK, partitions=p),
                                   _channel(app, topics.SANDBOX, partitions=p, acks=not transactions), outbox,
                                   config(TABLE_SANDBOX_POOLS), txns),
        ]
    else:
        loops = []
    pacer = GcPacer(settings.worker.gc_freeze_s, settings.worker.gc_full_s)

    @app.task  # type: ignore[untyped-decorator]
    async def pace_gc() -> None:
        await pacer.run()

    rebalancing = wire_rebalancer(app, settings, outbox, conn) if "rebalancer" in settings.worker.roles else None
    if "scheduler" not in settings.worker.roles:
        if settings.worker.metrics_port:
            _serve_metrics(app, registry_for(loops=loops, rebalancer=rebalancing), settings.worker.metrics_port)
        return

    service = SchedulerService(build_core(settings), outbox, time.monotonic, s.batch_size, linger_s=s.cycle_linger_s,
                               max_claims=s.max_outstanding_claims)
    # faust never commits the scheduler's input offsets (acks=False). With
    # `scheduling.commit_input_offsets` the scheduler commits those before which it needs no
    # record (`SchedulerService.commit_points`) and a restarted worker rebuilds its queue from
    # there; otherwise from the start (DESIGN.md, "Queue").
    inputs = app.topic(topics.PODS, topics.REQUEUE, key_type=bytes, value_type=bytes, key_serializer="raw",
                       value_serializer="raw", partitions=p, acks=False)
    scheduler_agent.register(app, inputs, service, config(),
                             CommittedStart(conn, group_id(settings), read_committed=transactions))

    @app.task  # type: ignore[untyped-decorator]
    async def replica_feed() -> None:
        await feed_state_changes(settings, service, conn)

    if settings.worker.metrics_port:
        _serve_metrics(app, registry_for(service.core, loops, rebalancing), settings.worker.metrics_port)


def rebalancer_service(settings: Settings) -> RebalancerService:
    """The rebalancer role's service: `rebalancer.config`, simulating with the scheduler's profiles."""
    s = settings.scheduling
    config = rebalance_config.load(Path(settings.rebalancer.config).read_text()) if settings.rebalancer.config else None
    scheduler = profiles.load(Path(s.profiles).read_text()) if s.profiles else None
    return RebalancerService(Rebalancer(config, scheduler), time.time)


async def run_rebalancer(settings: Settings, service: RebalancerService, outbox: PartitionedOutbox,
                         kafka: KafkaConnection | None = None) -> None:
    k = settings.kafka
    await rebalancer_agent.run(service, outbox, kafka=kafka or connect(k), partitions=k.partitions, app_id=k.app_id,
                               tick_s=settings.rebalancer.tick_s, session_timeout_s=k.session_timeout_s,
                               fetch_max_wait_ms=k.fetch_max_wait_ms)


def wire_rebalancer(app: faust.App, settings: Settings, outbox: PartitionedOutbox,
                    kafka: KafkaConnection | None = None) -> RebalancerService:
    """The rebalancer role beside other agents: a task of the faust app
    (`agents.adapters.rebalancer`); a worker with only this role runs it without faust
    (`streams.worker`)."""
    service = rebalancer_service(settings)

    @app.task  # type: ignore[untyped-decorator]
    async def rebalancer() -> None:
        await run_rebalancer(settings, service, outbox, kafka)

    return service


def _serve_metrics(app: faust.App, registry: CollectorRegistry, port: int) -> None:
    @app.task  # type: ignore[untyped-decorator]
    async def metrics_endpoint() -> None:
        server = await serve_metrics(registry, port)
        async with server:
            await server.serve_forever()


def build_core(settings: Settings) -> SchedulerCore:
    """The scheduler core of a worker: resource space, cluster state, profiles, queue, runtime
    classes."""
    s = settings.scheduling
    space = ResourceSpace(DEFAULT_RESOURCES + tuple(r for r in s.resources if r not in DEFAULT_RESOURCES))
    config = profiles.load(Path(s.profiles).read_text()) if s.profiles else None
    return SchedulerCore(space, ClusterState(space), time.monotonic, config=config,
                         backoff_initial_s=s.backoff_initial_s, backoff_max_s=s.backoff_max_s,
                         flush_s=s.unschedulable_flush_s, batching=s.equivalence_batching,
                         gather=s.gather_classes, runtimes=runtime_table(settings))


async def current_state(settings: Settings, kafka: KafkaConnection | None = None
                        ) -> tuple[list[NodeStateChange], dict[int, int]] | None:
    """The owners' changelog read whole (committed records), as one report per node as it is
    now, and per partition the newest epoch written there; None when a value cannot be read."""
    k = settings.kafka
    records: list[ChangelogRecord] = []

    def seen(m: Any) -> None:
        records.append((m.key, None if m.value is None else orjson.loads(m.value), m.partition))

    count, seconds = await read_to_end(kafka or connect(k), [f"{k.app_id}-{TABLE_NODE_STATE}-changelog"],
                                       k.partitions, seen)
    try:
        reports, epochs = owners.current_reports(records)
    except UnreadableState as exc:
        log.error("replica: the owners' changelog cannot be read (%s): reading the state-changes history instead", exc)
        return None
    log.info("replica: %d nodes as they are now, from %d changelog records read in %.1f s", len(reports), count,
             seconds)
    return reports, epochs


async def feed_state_changes(settings: Settings, service: SchedulerService, kafka: KafkaConnection | None = None
                             ) -> None:
    """Start the replica from the nodes as they are now (the owners' changelog), then read
    every `state-changes` partition from where it ended before that (no group, committed
    records only): every change the changelog may lack is reported after that point, and a
    report read again only sets what a later one sets anew."""
    k = settings.kafka
    conn = kafka or connect(k)
    # read_committed: an aborted transaction's NodeStateChange never reaches the replica.
    consumer = conn.consumer(enable_auto_commit=False, auto_offset_reset="earliest", group_id=None,
                             fetch_max_wait_ms=k.fetch_max_wait_ms, isolation_level="read_committed")
    await consumer.start()
    try:
        partitions = [TopicPartition(topics.STATE_CHANGES, i) for i in range(k.partitions)]
        consumer.assign(partitions)
        # Tansu answers ListOffsets short of the end (below): an earlier start is safe.
        start = await consumer.end_offsets(partitions)
        current = await current_state(settings, conn)
        if current is None:
            await consumer.seek_to_beginning()
        else:
            service.on_current_state(*current)
            for tp in partitions:
                consumer.seek(tp, start[tp])
        history = await consumer.end_offsets(partitions)
        # Tansu answers ListOffsets with the base offset of the last record batch plus one: the
        # history ends where the first fetch response of each partition says it does.
        unsure = set(partitions)
        started = last_report = time.monotonic()
        while True:
            for tp in list(unsure):
                fetched_end = consumer.last_stable_offset(tp)
                if fetched_end is None or fetched_end < 0:
                    fetched_end = consumer.highwater(tp)
                if fetched_end is not None:
                    history[tp] = max(history.get(tp, 0), fetched_end)
                    unsure.discard(tp)
            if history and not unsure and all([await consumer.position(tp) >= end for tp, end in history.items()]):
                log.info("replica: caught up with the state-changes history in %.1f s",
                         time.monotonic() - started)
                history = {}
                service.mark_replica_ready()
            elif history and time.monotonic() - last_report >= 10:
                last_report = time.monotonic()
                behind = {tp.partition: (await consumer.position(tp), end) for tp, end in history.items()}
                log.warning("replica: still reading the state-changes history after %.0f s "
                            "(partition: (position, end)): %s; not sure of the ends of %s",
                            last_report - started, behind, sorted(tp.partition for tp in unsure))
            batches = await consumer.getmany(timeout_ms=200, max_records=5000)
            messages = [RawMessage(m.value, m.topic, m.partition, m.offset, origin=origin_from_headers(m.headers))
                        for msgs in batches.values() for m in msgs]
            if messages:
                await service.on_state_changes(messages)
    finally:
        await consumer.stop()
