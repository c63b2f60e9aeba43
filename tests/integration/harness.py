"""Helpers for integration tests: a producer and a collector against the session's broker,
waiting on records with a deadline (the agents run in real time in another process), and
worker processes a test starts, kills and replaces."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import IO, TypeVar

from perf.collector import Collector
from schemas import topics
from schemas.records import Node, Record
from streams.connection import KafkaConnection
from streams.process import spawn_tied, stop
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
                       timeout: float = 60.0, topic: str | None = None,
                       distinct: Callable[[R], Hashable] | None = None) -> list[R]:
        """Every record seen so far that matches, once `count` match; with `distinct`, once
        `count` distinct keys match (a record delivered twice, or forwarded to a second topic
        the collector also reads, then counts once)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.seen(kind, where, topic)
            if len(found if distinct is None else {distinct(r) for r in found}) >= count:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"waited {timeout}s for {count} {kind.__name__}, saw {len(found)}")
            await asyncio.sleep(0.05)


class Workers:
    """`koordstream worker` processes a test starts by name, each with its roles and its output
    in `<folder>/<name>.log`; `kill` sends SIGKILL and waits; all are stopped on leaving."""

    def __init__(self, env: Mapping[str, str], folder: Path) -> None:
        self.env = dict(env)
        self.folder = folder
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, IO[bytes]] = {}

    def start(self, name: str, roles: str) -> subprocess.Popen[bytes]:
        self.logs[name] = (self.folder / f"{name}.log").open("ab")
        self.procs[name] = spawn_tied([sys.executable, "-m", "cli.main", "worker"],
                                      env={**self.env, "KOORDSTREAM_WORKER_ROLES": roles},
                                      stdout=self.logs[name], stderr=subprocess.STDOUT)
        return self.procs[name]

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    def log(self, name: str) -> bytes:
        return (self.folder / f"{name}.log").read_bytes()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs.values():
            stop(proc, 5)
        for out in self.logs.values():
            out.close()
