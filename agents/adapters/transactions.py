"""How a decided batch leaves the worker: as one transaction per input partition (Apache
Kafka), or delivered and acknowledged before faust commits its offsets (brokers without
transactions, such as the embedded Tansu).

`TransactionalSink` keeps one aiokafka transactional producer per owned input partition,
with the transactional id `{app_id}-{agent}-{topic}-{partition}` (as faust's own exactly_once
mode names them). It is started when the partition is assigned, before the table's restore:
InitProducerId fences the previous owner's producer and aborts its open transaction, so the
restore (read_committed) sees every committed write and none of a zombie's. It is stopped
when the partition is revoked. A run is one transaction: the changelog writes of its keys,
its outputs, and its input offset (`send_offsets_to_transaction`, to the agents' consumer
group). The input channel has faust's acks disabled, so faust never commits these offsets
itself and cannot race the transactions. A fenced producer loses the partition (someone else
owns it); any other failure aborts the transaction and the partition is read again from the
run's first offset (its in-memory table entries are ahead of the changelog then, which the
cores answer by re-sending their recorded outputs, DESIGN.md rule 1). A producer that cannot
abort (aiokafka's fatal state) is replaced by a new one. A producer that cannot be started
(the broker is down or restarting) is started again with back-off for as long as the
partition is ours: being fenced is the one way to lose a partition, since nothing else gives
it back before the next rebalance, which may never come (a chaos run on Apache Kafka saw a
partition given up while its broker restarted, and its holds leaked for the rest of the run).

`PlainSink` is the path for brokers that refuse InitProducerId: the changelog writes are
produced and acknowledged, then the `first` outputs, acknowledged, then the `after` outputs (deciders: Bindings only once
their Commits are on the broker), acknowledged, then the `last` ones (a PodTerminated after
its pod's Binding); faust commits the offsets after the batch.

faust's own `processing_guarantee="exactly_once"` is not used: it wraps faust's producer
in a transaction manager keyed by faust's partition groups, commits on its own commit timer
(not per batch), and sends our directly produced changelog batches outside it; driving
aiokafka's transactional producers here keeps one batch = one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    IllegalOperation,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    KafkaError,
    ProducerFenced,
    TransactionCoordinatorFenced,
)

from agents.adapters.connection import KafkaConnection
from agents.adapters.loop import Flushed, Work
from agents.adapters.ownership import Ownership
from agents.adapters.tables import VersionedState
from agents.ports import Outbox, deliver

log = logging.getLogger("koordstream.transactions")

FENCED = (ProducerFenced, InvalidProducerEpoch, InvalidProducerIdMapping, TransactionCoordinatorFenced)
START_BACKOFF_S = 0.5  # the first wait before a producer that could not start is started again
START_BACKOFF_MAX_S = 5.0  # doubled up to this: a revocation waits at most this long for the next look
# How long an assignment tries to start its producers before the worker stops. The group's
# heartbeats pause while faust's assignment callback runs: stopping well within faust's
# session timeout (60 s; an attempt itself may take `timeout_s`) lets the worker rejoin, where
# waiting on would get it evicted while it still believed it owned the partitions.
ASSIGNED_START_WITHIN_S = 20.0
Headers = list[tuple[str, bytes]]
SendFn = Callable[[str, bytes | None, bytes, int, Headers | None], Awaitable[Awaitable[object]]]
MakeOutbox = Callable[[SendFn], Outbox]


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _fatal_cause(producer: Any) -> BaseException | None:
    """Why an aiokafka transactional producer's transaction manager is in its fatal error state
    (its sender failed), if it is."""
    manager = getattr(producer, "_txn_manager", None)
    if manager is None or not manager.is_fatal_error():
        return None
    waiter = manager._transaction_waiter
    return waiter.exception() if waiter.done() and not waiter.cancelled() else None


class PlainSink:
    def __init__(self, table: VersionedState, outbox: Outbox) -> None:
        self.table = table
        self.outbox = outbox

    async def assigned(self, partitions: set[int]) -> None:
        return None

    async def quiesce(self, partitions: set[int]) -> None:
        return None

    async def flush(self, work: Sequence[Work]) -> Flushed:
        # The table first: an output (a report on `state-changes`) is never visible before the
        # state it follows from, which a starting scheduler replica reads (`streams.app`).
        for ack in await self.table.write_changelog(partitions=[w.partition for w in work]):
            await ack
        for w in work:
            self.table.settle(w.partition, durable=True)
        await deliver(self.outbox, [o for w in work for o in w.first])
        for wave in ([o for w in work for o in w.after], [o for w in work for o in w.last]):
            if wave:
                await deliver(self.outbox, wave)
        return Flushed(durable=list(work))

    async def close(self) -> None:
        return None


def transactional_id(app_id: str, agent: str, topic: str, partition: int) -> str:
    return f"{app_id}-{agent}-{topic}-{partition}"


class TransactionalSink:
    def __init__(self, *, table: VersionedState, ownership: Ownership, make_outbox: MakeOutbox, app_id: str,
                 agent: str, group_id: str, kafka: KafkaConnection | str, producer_options: Mapping[str, Any],
                 timeout_s: float = 30.0, producer_factory: Callable[[str], Any] | None = None) -> None:
        self.table = table
        self.ownership = ownership
        self.make_outbox = make_outbox
        self.app_id = app_id
        self.agent = agent
        self.group_id = group_id
        self.kafka = KafkaConnection.of(kafka)  # where the producers connect, and how
        self.producer_options = dict(producer_options)  # the rest of their options (sizes, compression)
        self.timeout_s = timeout_s
        self.producer_factory = producer_factory or self._aiokafka_producer
        self.producers: dict[int, Any] = {}  # partition -> its transactional producer
        self.outboxes: dict[int, Outbox] = {}
        self.locks: dict[int, asyncio.Lock] = {}
        self.committed = 0
        self.aborted = 0
        self.start_failures = 0  # producer starts that failed and were tried again
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self.clock: Callable[[], float] = time.monotonic  # only bounds how long an assignment waits
        self.closed = False

    @property
    def topic(self) -> str:
        return self.ownership.topic

    def txn_id(self, partition: int) -> str:
        return transactional_id(self.app_id, self.agent, self.topic, partition)

    async def assigned(self, partitions: set[int]) -> None:
        gone = [p for p in self.producers if p not in partitions]
        new = [p for p in sorted(partitions) if p not in self.producers]
        await asyncio.gather(*(self._stop(p) for p in gone))
        # Before the restore (its InitProducerId fences the previous owner): the assignment
        # waits for producers that cannot start yet, for a while.
        results = await asyncio.gather(*(self._start_while_owned(p, self.ownership.owned.get(p, -1),
                                                                 within_s=ASSIGNED_START_WITHIN_S) for p in new),
                                       return_exceptions=True)
        failed = [(p, r) for p, r in zip(new, results, strict=True) if isinstance(r, BaseException)]
        for partition, result in failed:
            if not isinstance(result, Exception):
                raise result
            log.error("%s: no transactional producer for %s/%s: %r", self.agent, self.topic, partition, result)
        if failed:
            # Giving the partitions up would leave them unread until a rebalance that may never
            # come; faust stops the worker on this error, which rejoins when restarted.
            raise RuntimeError(f"{self.agent}: no transactional producer for {self.topic} partitions "
                               f"{[p for p, _ in failed]} within {ASSIGNED_START_WITHIN_S}s of the assignment")

    def _aiokafka_producer(self, txn_id: str) -> AIOKafkaProducer:
        return self.kafka.producer(transactional_id=txn_id, **self.producer_options)

    async def _start(self, partition: int) -> None:
        # start() sends InitProducerId: the broker fences the producer of the previous owner
        # of this transactional id and aborts its open transaction.
        producer = self.producer_factory(self.txn_id(partition))
        try:
            await asyncio.wait_for(producer.start(), self.timeout_s)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), 5.0)
            raise
        self.producers[partition] = producer
        self.locks.setdefault(partition, asyncio.Lock())

        async def send(topic: str, key: bytes | None, value: bytes, to: int, headers: Headers | None) -> Awaitable[object]:
            fut: Awaitable[object] = await producer.send(topic, value, key=key, partition=to, headers=headers)
            return fut

        self.outboxes[partition] = self.make_outbox(send)
        log.info("%s: transactional producer %s started", self.agent, self.txn_id(partition))

    async def _start_while_owned(self, partition: int, generation: int, within_s: float | None = None) -> bool:
        """Start the partition's producer, again with back-off while it cannot be started (the
        broker unreachable, or its transaction coordinator not ready); False when the partition
        is not ours in `generation` any more (revoked meanwhile: its next owner starts one, and
        a start of ours after that would fence it), the producer was fenced, or we close. With
        `within_s`, the last failure is raised once the next attempt would come later than that."""
        delay = START_BACKOFF_S
        deadline = None if within_s is None else self.clock() + within_s
        while not self.closed and self.ownership.owns(partition, generation):
            try:
                await self._start(partition)
                return True
            except FENCED as exc:  # another worker's producer began after ours: the partition is its
                log.warning("%s: producer %s fenced on start (%r): the partition belongs to another worker",
                            self.agent, self.txn_id(partition), exc)
                self.ownership.lose(partition)
                return False
            except Exception as exc:  # noqa: BLE001 - unreachable for now: the partition's batches wait
                self.start_failures += 1
                if deadline is not None and self.clock() + delay > deadline:
                    raise
                log.error("%s: cannot start producer %s (%r): trying again in %.1fs", self.agent,
                          self.txn_id(partition), exc, delay)
            await self.sleep(delay)
            delay = min(2 * delay, START_BACKOFF_MAX_S)
        return False

    async def _stop(self, partition: int) -> None:
        producer = self.producers.pop(partition, None)
        self.outboxes.pop(partition, None)
        if producer is None:
            return
        lock = self.locks[partition]
        with contextlib.suppress(asyncio.TimeoutError):  # a transaction in flight: let it end first
            await asyncio.wait_for(lock.acquire(), self.timeout_s)
        try:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), 5.0)
        finally:
            if lock.locked():
                lock.release()
        log.info("%s: transactional producer %s stopped", self.agent, self.txn_id(partition))

    async def flush(self, work: Sequence[Work]) -> Flushed:
        flushed = Flushed()
        results = await asyncio.gather(*(self._transaction(w) for w in work))
        for w, result in zip(work, results, strict=True):
            {"durable": flushed.durable, "lost": flushed.lost, "failed": flushed.failed}[result].append(w)
        return flushed

    async def _transaction(self, w: Work) -> str:
        partition = w.partition
        producer: Any = self.producers.get(partition)
        outbox = self.outboxes.get(partition)
        if producer is None or outbox is None:
            self.table.discard(partition)
            return "lost"
        async with self.locks[partition]:
            if not self._current(partition, producer):  # stopped while we waited
                self.table.discard(partition)
                return "lost"
            if not self.ownership.owns(partition, w.fetched.generation):  # revoked while we waited
                self.table.discard(partition)
                w.fetched.withhold_acks()
                return "lost"
            acks: list[Awaitable[object]] = []
            try:
                await producer.begin_transaction()
                acks += await self.table.write_changelog(producer, [partition])
                acks += await outbox.send(w.first + w.after + w.last)
                await asyncio.wait_for(producer.send_offsets_to_transaction(
                    {TopicPartition(self.topic, partition): w.fetched.next_offset}, self.group_id), self.timeout_s)
                await asyncio.wait_for(producer.commit_transaction(), self.timeout_s)
                self.table.settle(partition, durable=True)
                self.committed += 1
                return "durable"
            except FENCED as exc:
                await self._fenced(partition, producer, exc)
                return "lost"
            except IllegalOperation as exc:
                # The producer left its transaction: its sender failed, usually on being fenced
                # (the sender's AddPartitionsToTxn met ProducerFenced and the next send refuses).
                cause = _fatal_cause(producer)
                if isinstance(cause, FENCED):
                    await self._fenced(partition, producer, cause)
                    return "lost"
                log.error("%s: transaction of %s/%s from offset %s failed: %r (%r); aborting", self.agent,
                          self.topic, partition, w.fetched.first_offset, exc, cause)
                self.aborted += 1
                return "failed" if await self._abort(partition, producer, w.fetched.generation) else "lost"
            except (TimeoutError, KafkaError) as exc:
                log.error("%s: transaction of %s/%s from offset %s failed: %r; aborting", self.agent, self.topic,
                          partition, w.fetched.first_offset, exc)
                self.aborted += 1
                return "failed" if await self._abort(partition, producer, w.fetched.generation) else "lost"
            finally:
                self.table.discard(partition)
                self.table.settle(partition, durable=False)  # given back unless it committed
                for ack in acks:  # the commit judged them; retrieve their outcome all the same
                    if isinstance(ack, asyncio.Future):
                        ack.add_done_callback(_retrieve)

    async def quiesce(self, partitions: set[int]) -> None:
        """Wait for the transactions in flight on `partitions` to end (a rebalance starts: faust
        reads the committed offsets after it, so a commit landing later would be read again).
        Transactions that have not started by then see the revocation and drop their batch."""
        async def drain(partition: int) -> None:
            lock = self.locks.get(partition)
            if lock is None:
                return
            try:
                await asyncio.wait_for(lock.acquire(), self.timeout_s)
            except TimeoutError:
                log.warning("%s: a transaction of %s/%s did not end within %ss of the revocation",
                            self.agent, self.topic, partition, self.timeout_s)
                return
            lock.release()

        await asyncio.gather(*(drain(p) for p in partitions))

    def _current(self, partition: int, producer: object) -> bool:
        return self.producers.get(partition) is producer

    async def _fenced(self, partition: int, producer: Any, exc: BaseException) -> None:
        log.warning("%s: producer %s fenced (%r): the partition belongs to another worker",
                    self.agent, self.txn_id(partition), exc)
        self.ownership.lose(partition)
        self.producers.pop(partition, None)
        self.outboxes.pop(partition, None)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), 5.0)

    async def _abort(self, partition: int, producer: Any, generation: int) -> bool:
        """Abort the open transaction; False when the partition turned out to be lost. Runs under
        the partition's lock, so a revocation waits for a restart attempt in flight."""
        try:
            await asyncio.wait_for(producer.abort_transaction(), self.timeout_s)
        except FENCED as exc:  # a new producer would fence the partition's new owner in turn
            await self._fenced(partition, producer, exc)
            return False
        except Exception as exc:  # noqa: BLE001 - the producer is unusable: start a new one
            log.warning("%s: abort failed (%r): restarting producer %s", self.agent, exc, self.txn_id(partition))
            self.producers.pop(partition, None)
            self.outboxes.pop(partition, None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), 5.0)
            # The new producer's InitProducerId aborts the transaction the old one left open.
            return await self._start_while_owned(partition, generation)
        return True

    async def close(self) -> None:
        self.closed = True
        await asyncio.gather(*(self._stop(p) for p in list(self.producers)))
