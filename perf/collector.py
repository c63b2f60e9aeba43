"""Reads the agents' outputs back from the topics, with explicit partition assignment (no
consumer group, so no join delay), from the beginning, committed records only, into plain
lists."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.codec import decode_message
from schemas.errors import SchemaError
from schemas.records import Record
from streams.connection import KafkaConnection

R = TypeVar("R", bound=Record)


class Collector:
    """`records` holds (broker timestamp in seconds, topic, record) for every record read, and
    `received` at the same index the local time it was read (unix seconds); with `kinds`, only
    records of those classes, and messages whose value names none of them (`"kind":"<name>"`)
    are not decoded at all (a busy topic read for one kind of record)."""

    def __init__(self, kafka: KafkaConnection | str, topic_names: Iterable[str], partitions: int,
                 kinds: tuple[type[Record], ...] = ()) -> None:
        self.kafka = KafkaConnection.of(kafka)
        self.topic_names = list(topic_names)
        self.partitions = partitions
        self.kinds = kinds
        self._markers = tuple(f'"kind":"{k.__name__}"'.encode() for k in kinds)
        self.records: list[tuple[float, str, Record]] = []
        self.received: list[float] = []
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # read_committed: a transaction the agents aborted (e.g. its worker was killed) must not
        # look like a double binding; the broker shows only what committed.
        consumer = self.kafka.consumer(group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                                       fetch_max_wait_ms=20, isolation_level="read_committed")
        await consumer.start()
        consumer.assign([TopicPartition(t, p) for t in self.topic_names for p in range(self.partitions)])
        await consumer.seek_to_beginning()
        self._task = asyncio.create_task(self._run(consumer))

    async def _run(self, consumer: AIOKafkaConsumer) -> None:
        try:
            while True:
                batches = await consumer.getmany(timeout_ms=100, max_records=10000)
                now = time.time()
                for tp, messages in batches.items():
                    for m in messages:
                        if self._markers and not any(k in (m.value or b"") for k in self._markers):
                            continue
                        for r in decode_message(m.value):
                            if not isinstance(r, SchemaError) and (not self.kinds or isinstance(r, self.kinds)):
                                self.records.append((m.timestamp / 1000.0, tp.topic, r))
                                self.received.append(now)
                if batches:
                    self.changed.set()
        finally:
            await consumer.stop()

    def of(self, kind: type[R]) -> list[tuple[float, R]]:
        return [(ts, r) for ts, _, r in self.records if isinstance(r, kind)]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
