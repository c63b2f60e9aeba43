"""The physical limit of a run: a no-op pipeline that moves the same pod records through the
same broker with the same client library (aiokafka), codec, producer (`RecordProducer`, the
per-partition batching outbox) and micro-batch size as the scheduler's hot path, doing no
scheduling at all: consume a pod record, produce a Binding for it (one hop).

`noop_limit` publishes the pods to a fresh input topic, runs the hop, and returns the pods per
second from the first pod published to the last Binding read back. A run reports its own
throughput as a ratio to this limit.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition

from perf.collector import Collector
from schemas.codec import decode_message
from schemas.records import Binding, Pod
from streams.admin import ensure_topics
from streams.catalogue import TopicSpec
from streams.connection import KafkaConnection
from streams.producer import RecordProducer


async def noop_limit(kafka: KafkaConnection | str, partitions: int, pods: Sequence[Pod], batch: int = 1000,
                     timeout_s: float = 120.0) -> float:
    """Pods per second through the one-hop no-op pipeline (0.0 when it did not finish)."""
    run = uuid.uuid4().hex[:8]
    source, sink = f"noop-pods-{run}", f"noop-bindings-{run}"
    conn = KafkaConnection.of(kafka)
    await ensure_topics(conn, [TopicSpec(source, "pod uid", partitions), TopicSpec(sink, "pod uid", partitions)])
    consumer = conn.consumer(group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                             fetch_max_wait_ms=20)
    await consumer.start()
    consumer.assign([TopicPartition(source, p) for p in range(partitions)])
    collector = Collector(conn, [sink], partitions)
    await collector.start()
    try:
        async with RecordProducer(conn, partitions) as producer:
            start = time.perf_counter()
            pending = await producer.publish(source, pods)
            hop = asyncio.create_task(_hop(consumer, producer, sink, batch, len(pods)))
            await producer.flush(pending)
            deadline = time.monotonic() + timeout_s
            while len(collector.records) < len(pods):  # the sink holds Bindings only
                if time.monotonic() > deadline:
                    hop.cancel()
                    return 0.0
                await asyncio.sleep(0.01)
            elapsed = time.perf_counter() - start
            await hop
    finally:
        await collector.stop()
        await consumer.stop()
    return round(len(pods) / elapsed, 1)


async def _hop(consumer: AIOKafkaConsumer, producer: RecordProducer, sink: str, batch: int, total: int) -> None:
    moved = 0
    while moved < total:
        batches = await consumer.getmany(timeout_ms=20, max_records=batch)
        out = []
        for messages in batches.values():
            for m in messages:
                for r in decode_message(m.value):
                    if isinstance(r, Pod):
                        out.append(Binding(uid=r.uid, namespace=r.namespace, name=r.name, node="noop", attempt=0,
                                           decision_key=r.uid))
        if out:
            await producer.flush(await producer.publish(sink, out))
            moved += len(out)
        elif not batches:
            await asyncio.sleep(0)
