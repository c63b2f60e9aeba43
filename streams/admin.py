"""Explicit topic creation from the catalogue, before any agent starts.

A topic auto-created on first use gets the broker's default partition count, which breaks
co-partitioning and faust's changelogs, so every topic is created here, and an existing topic
with another partition count is an error that names it.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.catalogue import TopicSpec


class TopicMismatch(RuntimeError):
    pass


async def ensure_topics(bootstrap: str, specs: Iterable[TopicSpec]) -> list[str]:
    """Create the missing topics; returns the names created."""
    specs = list(specs)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            await admin.create_topics([
                NewTopic(
                    s.name, s.partitions, 1,
                    topic_configs={"cleanup.policy": "compact" if s.compacted else "delete",
                                   **({"retention.ms": str(s.retention_ms)} if s.retention_ms else {})},
                )
                for s in missing
            ])
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
