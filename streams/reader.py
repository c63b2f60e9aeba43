"""`koordstream read TOPIC`: print a topic's records as JSON lines (explicit partition
assignment, no consumer group), from the beginning or only new ones; and `read_to_end`, which
reads topics whole (a soak's restart reads, a scheduler replica's start)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TextIO

from aiokafka import TopicPartition

from schemas import topics
from schemas.codec import decode_message, encode
from schemas.errors import SchemaError
from schemas.records import Binding, Node, NodeDeleted, Pod, PodDeleted, PodDisruptionBudget
from streams.connection import KafkaConnection, check, connect
from streams.settings import Settings


async def read_topic(settings: Settings, topic: str, *, from_beginning: bool, limit: int | None,
                     idle_s: float, out: TextIO = sys.stdout) -> int:
    """Print records until `limit` are printed or nothing arrived for `idle_s` seconds."""
    k = settings.kafka
    conn = connect(k)
    await check(conn)
    consumer = conn.consumer(group_id=None, enable_auto_commit=False, fetch_max_wait_ms=k.fetch_max_wait_ms)
    await consumer.start()
    printed = 0
    try:
        partitions = [TopicPartition(topic, p) for p in range(k.partitions)]
        consumer.assign(partitions)
        await (consumer.seek_to_beginning() if from_beginning else consumer.seek_to_end())
        last = time.monotonic()
        while limit is None or printed < limit:
            batches = await consumer.getmany(timeout_ms=200)
            if not batches and time.monotonic() - last > idle_s:
                break
            for msgs in batches.values():
                for m in msgs:
                    last = time.monotonic()
                    for r in decode_message(m.value):
                        if limit is not None and printed >= limit:
                            break
                        line = f'{{"undecodable": "{r}"}}' if isinstance(r, SchemaError) else encode(r).decode()
                        out.write(line + "\n")
                        printed += 1
            out.flush()
    finally:
        await consumer.stop()
    return printed


async def read_to_end(kafka: KafkaConnection | str, names: list[str], partitions: int,
                      seen: Callable[[Any], None] | None = None) -> tuple[int, float]:
    """How many records `names` hold (read committed, from the beginning to the end a fetch
    reports), and how long reading them took; `seen` gets each record."""
    started = time.perf_counter()
    consumer = KafkaConnection.of(kafka).consumer(group_id=None, enable_auto_commit=False,
                                                  isolation_level="read_committed", fetch_max_wait_ms=20,
                                                  max_partition_fetch_bytes=8 * 2**20)
    await consumer.start()
    count = 0
    try:
        tps = [TopicPartition(t, p) for t in names for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning()
        ends: dict[TopicPartition, int] = {}
        while True:
            batches = await consumer.getmany(timeout_ms=200, max_records=20_000)
            count += sum(len(ms) for ms in batches.values())
            if seen is not None:
                for ms in batches.values():
                    for m in ms:
                        seen(m)
            for tp in tps:
                if tp not in ends:
                    end = consumer.last_stable_offset(tp)
                    if end is None or end < 0:  # Tansu reports none
                        end = consumer.highwater(tp)
                    if end is not None:
                        ends[tp] = end
            if len(ends) == len(tps) and all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                break
    finally:
        await consumer.stop()
    return count, time.perf_counter() - started


async def read_cluster(kafka: KafkaConnection | str, partitions: int
                       ) -> tuple[list[Node], list[Pod], list[PodDisruptionBudget]]:
    """The cluster as the topics hold it now (`koordstream rebalance plan --bootstrap`): every
    node (its latest record, deletions applied), every pod that a Binding placed and no
    PodDeleted removed, with `node_name` set to its binding's node, and every
    PodDisruptionBudget not deleted. Reads `nodes`, `pods`, `bindings` and
    `disruption-budgets` whole (O(their history): a dry-run tool's price); records that do not decode
    are skipped (they went to the dead-letter topic when they were produced)."""
    nodes: dict[str, Node] = {}
    pods: dict[str, Pod] = {}
    bound: dict[str, str] = {}
    deleted: set[str] = set()
    budgets: dict[str, PodDisruptionBudget] = {}

    def seen(m: Any) -> None:
        for r in decode_message(m.value):
            if isinstance(r, Node):
                nodes[r.name] = r
            elif isinstance(r, NodeDeleted):
                nodes.pop(r.name, None)
            elif isinstance(r, Pod):
                pods[r.uid] = r
            elif isinstance(r, PodDeleted):
                deleted.add(r.uid)
            elif isinstance(r, Binding):
                bound[r.uid] = r.node
            elif isinstance(r, PodDisruptionBudget):
                budgets[r.uid] = r

    await check(kafka)
    await read_to_end(kafka, [topics.NODES, topics.PODS, topics.BINDINGS, topics.DISRUPTION_BUDGETS], partitions,
                      seen)
    placed = [replace(p, node_name=bound[uid]) for uid, p in pods.items() if uid in bound and uid not in deleted]
    return list(nodes.values()), placed, [b for b in budgets.values() if not b.deleted]


def run_read(settings: Settings, topic: str, from_beginning: bool, limit: int | None, idle_s: float) -> int:
    return asyncio.run(read_topic(settings, topic, from_beginning=from_beginning, limit=limit, idle_s=idle_s))
