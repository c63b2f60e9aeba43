"""Where a stateful agent's input partition must begin after an assignment: the first record
at or after the consumer group's committed offset (`StatefulLoop._starts_right` checks the
first run against it).

Two aiokafka consumers per agent, started on first use, neither joining the group: one with
the agents' group id that is never assigned a partition reads the group's committed offset,
and one without a group fetches from there to find the first record (the scheduler's probe
too, `agents.adapters.starts`: it commits what it no longer needs). Without a group id the
fetch starts at the partition's beginning. `read_committed` when the topics carry
transactions (their records sit between commit and abort markers, and the partition ends at
its last stable offset); otherwise every record counts and it ends at
the high watermark. Fetches wait 20 ms at most, `wait_ms` in all when nothing is there. The
answer is None only when that fetch reached the partition's end; a fetch that found nothing
short of it raises TimeoutError (the caller then asks again).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiokafka import TopicPartition

from agents.adapters.connection import KafkaConnection


class CommittedStart:
    def __init__(self, kafka: KafkaConnection | str, group_id: str | None, read_committed: bool,
                 wait_ms: int = 500) -> None:
        self.kafka = KafkaConnection.of(kafka)
        self.group_id = group_id
        self.read_committed = read_committed
        self.wait_ms = wait_ms
        self.consumer: Any = None  # fetches: no group (assignments change under it)
        self.offsets: Any = None  # the group's committed offsets: never assigned anything
        self.lock = asyncio.Lock()

    async def _consumer(self) -> Any:
        if self.consumer is None:
            consumer = self.kafka.consumer(group_id=None, enable_auto_commit=False,
                                           isolation_level="read_committed" if self.read_committed
                                           else "read_uncommitted",
                                           auto_offset_reset="earliest", fetch_max_wait_ms=20)
            await consumer.start()
            self.consumer = consumer
        return self.consumer

    async def _committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of `tp`. From a consumer of its own that is never
        assigned a partition: aiokafka's group coordination of a consumer whose manual
        assignment keeps changing failed an assertion (seen with the scheduler's probes) and
        every later call with it."""
        if self.group_id is None:
            return None
        if self.offsets is None:
            offsets = self.kafka.consumer(group_id=self.group_id, enable_auto_commit=False)
            await offsets.start()
            self.offsets = offsets
        committed: int | None = await self.offsets.committed(tp)
        return committed

    async def committed(self, topic: str, partition: int) -> int:
        """The group's committed offset of a partition (0: none, or no group)."""
        async with self.lock:
            return await self._committed(TopicPartition(topic, partition)) or 0

    def _end(self, tp: TopicPartition) -> int | None:
        end: int | None = self.consumer.last_stable_offset(tp) if self.read_committed else self.consumer.highwater(tp)
        return end

    async def end(self, topic: str, partition: int) -> int:
        """Where the partition ends now (its last stable offset when read committed, else its
        high watermark), as a fetch answers it (Tansu's ListOffsets answers too low, see
        docs/architecture.md, "Workarounds for the embedded broker"); a fetch that brings no
        answer raises TimeoutError."""
        async with self.lock:
            await self._consumer()
            tp = TopicPartition(topic, partition)
            self.consumer.assign([tp])  # a new assignment: no end known until a fetch answers
            await self.consumer.seek_to_beginning(tp)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.wait_ms / 1000
            while True:  # short polls: any fetch response carries the end, records or not
                await self.consumer.getmany(tp, timeout_ms=20, max_records=1)
                end = self._end(tp)
                if end is not None:
                    return int(end)
                if loop.time() > deadline:
                    raise TimeoutError(f"{topic}/{partition}: no fetch answered within {self.wait_ms} ms")

    async def __call__(self, topic: str, partition: int) -> int | None:
        async with self.lock:
            await self._consumer()
            tp = TopicPartition(topic, partition)
            committed = await self._committed(tp)
            self.consumer.assign([tp])
            if committed is None:
                await self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek(tp, committed)
            got = await self.consumer.getmany(tp, timeout_ms=self.wait_ms, max_records=1)
            messages = got.get(tp, [])
            if messages:
                return int(messages[0].offset)
            # Nothing fetched: the end of the partition only if the fetch reached it (the position
            # moves past markers and aborted records); a fetch that was slow is no answer.
            position = await self.consumer.position(tp)
            end = self._end(tp)
            if end is not None and position >= end:
                return None
            raise TimeoutError(f"{topic}/{partition}: no record fetched from offset {position} within "
                               f"{self.wait_ms} ms, the partition ends at {end}")

    async def close(self) -> None:
        async with self.lock:  # not under a probe that is using it
            for consumer in (self.consumer, self.offsets):
                if consumer is not None:
                    with contextlib.suppress(Exception):
                        await consumer.stop()
            self.consumer = self.offsets = None
