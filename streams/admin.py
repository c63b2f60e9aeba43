"""Explicit topic creation from the catalogue, before any agent starts.

A topic auto-created on first use gets the broker's default partition count, which breaks
co-partitioning and faust's changelogs, so every topic is created here, and an existing topic
with another partition count is an error that names it. Each topic is created with its log
settings from the catalogue (`TopicSpec.configs()`: cleanup policy, segment size and age,
retention, compaction lag and dirty ratio, tombstone retention); the embedded Tansu broker
accepts and stores them (it compacts nothing), Apache Kafka applies them. A topic the broker
refuses to create is an error that names it and the broker's reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka.admin import NewTopic

from agents.adapters.connection import KafkaConnection
from streams.catalogue import TopicSpec

TOPIC_ALREADY_EXISTS = 36  # another creator was first: fine


class TopicMismatch(RuntimeError):
    pass


class TopicCreationFailed(RuntimeError):
    pass


async def ensure_topics(kafka: KafkaConnection | str, specs: Iterable[TopicSpec]) -> list[str]:
    """Create the missing topics; returns the names created."""
    specs = list(specs)
    admin = KafkaConnection.of(kafka).admin(request_timeout_ms=10000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            response = await admin.create_topics([
                NewTopic(s.name, s.partitions, 1, topic_configs=s.configs())
                for s in missing
            ])
            failed = [e for e in response.to_object()["topic_errors"]
                      if e["error_code"] not in (0, TOPIC_ALREADY_EXISTS)]
            if failed:
                raise TopicCreationFailed("; ".join(
                    f"topic {e['topic']!r} not created: error {e['error_code']} {e.get('error_message') or ''}".rstrip()
                    for e in failed))
        present = [s for s in specs if s.name in existing]
        if present:
            described = await admin.describe_topics([s.name for s in present])
            counts = {d["topic"]: len(d["partitions"]) for d in described}
            for s in present:
                if counts.get(s.name) != s.partitions:
                    raise TopicMismatch(
                        f"topic {s.name!r} has {counts.get(s.name)} partitions, the catalogue says {s.partitions}: "
                        "delete it or set kafka.partitions to match"
                    )
        return [s.name for s in missing]
    finally:
        await admin.close()
