"""Helpers for integration tests: a producer and a collector against the session's broker,
and waiting on records with a deadline (the agents run in real time in another process)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from perf.collector import Collector
from schemas import topics
from schemas.records import Node, Record
from streams.connection import KafkaConnection
from streams.producer import RecordProducer

PARTITIONS = 4
ALL_OUTPUTS = [topics.NODES, topics.PODS, topics.STATE_CHANGES, topics.BINDINGS, topics.FEEDBACK, topics.REQUEUE, topics.DEAD_LETTER,
               topics.HOLDS, topics.NODE_INBOX, topics.EVICTIONS, topics.RESERVATIONS, topics.SCALE_DOWN,
               topics.DISRUPTION_BUDGETS, topics.SANDBOX, topics.SANDBOX_STATUS]
R = TypeVar("R", bound=Record)


class Harness:
    """`kafka`: a PLAINTEXT broker's address, or a connection (a secured broker's)."""

    def __init__(self, kafka: KafkaConnection | str) -> None:
        self.kafka = KafkaConnection.of(kafka)
        self.bootstrap = self.kafka.bootstrap
        self.producer = RecordProducer(self.kafka, PARTITIONS)
        self.collector = Collector(self.kafka, ALL_OUTPUTS, PARTITIONS)

    async def __aenter__(self) -> Harness:
        await self.producer.__aenter__()
        await self.collector.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.collector.stop()
        await self.producer.__aexit__(None, None, None)

    async def publish(self, topic: str, records: list[Record]) -> None:
        await self.producer.flush(await self.producer.publish(topic, records))

    def allocatable(self) -> dict[str, dict[str, int]]:
        """Every node published in this session (tests share one cluster)."""
        return {r.name: dict(r.allocatable) for r in self.seen(Node, topic=topics.NODES)}

    def seen(self, kind: type[R], where: Callable[[R], bool] = lambda r: True, topic: str | None = None) -> list[R]:
        return [r for _, t, r in self.collector.records
                if isinstance(r, kind) and where(r) and (topic is None or t == topic)]

    async def wait_for(self, kind: type[R], where: Callable[[R], bool], count: int = 1,
                       timeout: float = 60.0, topic: str | None = None) -> list[R]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.seen(kind, where, topic)
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"waited {timeout}s for {count} {kind.__name__}, saw {len(found)}")
            await asyncio.sleep(0.05)
