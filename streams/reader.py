"""`koordstream read TOPIC`: print a topic's records as JSON lines (explicit partition
assignment, no consumer group), from the beginning or only new ones."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TextIO

from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.codec import decode_message, encode
from schemas.errors import SchemaError
from streams.settings import Settings


async def read_topic(settings: Settings, topic: str, *, from_beginning: bool, limit: int | None,
                     idle_s: float, out: TextIO = sys.stdout) -> int:
    """Print records until `limit` are printed or nothing arrived for `idle_s` seconds."""
    k = settings.kafka
    consumer = AIOKafkaConsumer(bootstrap_servers=k.bootstrap, group_id=None, enable_auto_commit=False,
                                fetch_max_wait_ms=k.fetch_max_wait_ms)
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


def run_read(settings: Settings, topic: str, from_beginning: bool, limit: int | None, idle_s: float) -> int:
    return asyncio.run(read_topic(settings, topic, from_beginning=from_beginning, limit=limit, idle_s=idle_s))
