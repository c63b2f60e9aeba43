"""The producer API for publishers outside the agents (CLI `publish`, the demo, the perf
harness): records in, batch messages out, routed by the catalogue's partitioner rule."""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Sequence
from types import TracebackType

from agents.adapters.connection import KafkaConnection
from agents.ports import Output
from schemas import topics
from schemas.records import (
    Binding,
    Claim,
    Commit,
    Held,
    Node,
    NodeDeleted,
    NodeStateChange,
    Pod,
    PodDeleted,
    PodTerminated,
    Record,
    Rejected,
    Release,
)
from streams.outbox import PartitionedOutbox
from streams.transport import COMPRESSION, MAX_BATCH_BYTES


def key_of(topic: str, record: Record) -> str:
    """The catalogue's key for `record` on `topic`."""
    if isinstance(record, (Node, NodeDeleted)):
        return record.name
    if topic == topics.NODE_INBOX and isinstance(record, (Claim, Commit, Release, PodTerminated)):
        return record.node
    if topic == topics.HOLDS and isinstance(record, (Held, Rejected, PodDeleted, PodTerminated)):
        return record.decision_key or record.uid
    if isinstance(record, NodeStateChange):
        return record.node
    if topic == topics.SANDBOX:  # by pool name: a pool's records share its partition
        pool = getattr(record, "warm_pool", None) or getattr(record, "name", "")
        return str(pool)
    if isinstance(record, (Pod, PodDeleted, Binding)):
        return record.uid
    uid = getattr(record, "uid", None) or getattr(record, "name", None) or getattr(record, "workload", "")
    return str(uid)


class RecordProducer:
    """`async with RecordProducer(kafka, partitions) as p: await p.publish(topic, records)`;
    `kafka`: a `streams.connection.connect(settings.kafka)`, or a PLAINTEXT broker's address."""

    def __init__(self, kafka: KafkaConnection | str, partitions: int, linger_ms: int = 2) -> None:
        self.kafka = KafkaConnection.of(kafka)
        self.bootstrap = self.kafka.bootstrap
        self._producer = self.kafka.producer(linger_ms=linger_ms, max_request_size=4 * 1024 * 1024,
                                             compression_type=COMPRESSION, max_batch_size=MAX_BATCH_BYTES)
        self.outbox = PartitionedOutbox(self._send, partitions, batched=self.kafka.record_batches)

    async def _send(self, topic: str, key: bytes | None, value: bytes, partition: int,
                    headers: list[tuple[str, bytes]] | None) -> Awaitable[object]:
        fut: Awaitable[object] = await self._producer.send(topic, value, key=key, partition=partition, headers=headers)
        return fut

    async def publish(self, topic: str, records: Iterable[Record]) -> list[Awaitable[object]]:
        """Send records to `topic` (not waiting for acknowledgement; see `flush`)."""
        return await self.outbox.send([Output(topic, key_of(topic, r), r) for r in records])

    async def send_raw(self, topic: str, value: bytes, key: bytes | None = None, partition: int = 0,
                       headers: list[tuple[str, bytes]] | None = None) -> None:
        """Send bytes as they are (tests of bad input, tools)."""
        await (await self._producer.send(topic, value, key=key, partition=partition, headers=headers))

    async def flush(self, futures: Sequence[Awaitable[object]] = ()) -> None:
        await self._producer.flush()
        for fut in futures:
            await fut

    async def __aenter__(self) -> RecordProducer:
        await self._producer.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self._producer.stop()
