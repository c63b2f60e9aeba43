"""Versioned faust tables, so that a restore cannot resurrect a zombie's stale state.

Every value the agents write is wrapped as `{"epoch": E, "seq": S, "state": ...}`. E is the
writer's epoch for the key's partition: the larger of its consumer-group generation and one
more than the highest epoch it restored for that partition, so epochs grow with every new
owner even if the group's generations start over. S counts the writes of the key. A worker
that lost its partitions but still finished a batch (a zombie) writes an older epoch, and a
restore keeps, per key, the value with the highest (E, S), so such a late write is dropped
instead of replacing newer state (DESIGN.md, safety rule 4, for restorers). The same epoch
stamps the agents' outputs, so readers can drop a zombie's records too (`EpochFence`).
`supersedes` is the pure rule; `VersionedTable` applies it.

Writes skip faust's per-key changelog path (a FutureMessage and a trip through faust's
producer buffer per write, with stdlib JSON: about a quarter of the state worker's CPU in a
sandbox-burst profile). `put` changes the table in memory and remembers the key; the agent then
calls `write_changelog`, which produces each key's last value of the batch straight to the
changelog partition of its input (orjson, raw key: what faust's restore reads back; built into
record batches per partition), and waits for the broker's acknowledgement together with the
batch's outputs, before the batch's offsets can be committed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, cast

import faust
import orjson
from faust.tables.table import Table

from agents.intake import RawMessage
from agents.ports import Origin

log = logging.getLogger("koordstream.tables")


def supersedes(incoming: Mapping[str, Any] | None, current: Mapping[str, Any] | None) -> bool:
    """True when `incoming` may replace `current` (deletes and first writes always may)."""
    if incoming is None or current is None:
        return True
    return (incoming["epoch"], incoming["seq"]) >= (current["epoch"], current["seq"])


class VersionedTable(Table[bytes, Any]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.restored_epochs: dict[int, int] = {}  # partition -> the highest epoch a restore applied
        super().__init__(*args, **kwargs)

    def apply_changelog_batch(self, batch: Iterable[Any]) -> None:
        restored = self.restored_epochs
        newest: dict[Any, Any] = {}
        kept = []
        for event in batch:
            key, value = event.key, event.value
            current = newest[key] if key in newest else self.data.get(key)
            if supersedes(value, current):
                newest[key] = value
                kept.append(event)
                if value is not None:
                    partition = event.message.partition
                    restored[partition] = max(restored.get(partition, -1), value["epoch"])
            else:
                log.warning("restore of %s dropped a stale write of %r (epoch %s, seq %s)", self.name, key,
                            value["epoch"], value["seq"])  # type: ignore[index]
        super().apply_changelog_batch(kept)


class VersionedState:
    """Read and write one agent's table; values are JSON states (see module docstring)."""

    def __init__(self, app: faust.App, name: str, partitions: int) -> None:
        self.app = app
        # Raw UTF-8 keys (not JSON-quoted ones), so the partitioner puts a key's changelog record
        # in the same partition number as its input records: they move together on a rebalance.
        self.table = VersionedTable(app, name=name, default=None, partitions=partitions, use_partitioner=True,
                                    key_type=bytes)
        app.tables.add(self.table)
        self._dirty: dict[bytes, int] = {}  # key -> partition, written since the last write_changelog

    def raw(self, key: str) -> dict[str, Any] | None:
        value: dict[str, Any] | None = self.table.data.get(key.encode())  # the store: no __missing__
        return value

    def get(self, key: str) -> dict[str, Any] | None:
        wrapped = self.raw(key)
        return None if wrapped is None else wrapped["state"]  # type: ignore[no-any-return]

    def states(self) -> list[tuple[str, dict[str, Any]]]:
        """Every (key, state) this worker holds now (its assigned partitions)."""
        return [(key.decode(), value["state"]) for key, value in list(self.table.items()) if value]

    def epoch(self, partition: int) -> int:
        """This worker's epoch for `partition` (see module docstring)."""
        restored = self.table.restored_epochs.get(partition, -1)
        return max(int(self.app.consumer_generation_id), restored + 1)

    def origin(self, message: RawMessage) -> Origin:
        """The origin stamped on what is decided from `message`: its partition and our epoch."""
        return Origin(f"{message.topic}/{message.partition}", self.epoch(message.partition))

    def put(self, key: str, state: dict[str, Any], partition: int) -> None:
        """Change the table in memory; `write_changelog` makes it durable."""
        previous = self.raw(key)
        raw_key = key.encode()
        self.table.data[raw_key] = {"epoch": self.epoch(partition), "seq": previous["seq"] + 1 if previous else 1,
                                    "state": state}
        self._dirty[raw_key] = partition

    async def write_changelog(self) -> list[Awaitable[object]]:
        """Produce every key put since the last call (its last value) to the changelog, as
        record batches per partition (aiokafka's batch API: a message per key, without a
        send call per key); the returned awaitables resolve when the broker acknowledged."""
        topic = self.table.changelog_topic.get_topic_name()
        dirty, self._dirty = self._dirty, {}
        data = self.table.data
        producer = cast(Any, self.app.producer)._ensure_producer()  # faust's aiokafka producer (not on ProducerT)
        by_partition: dict[int, list[bytes]] = {}
        for key, partition in dirty.items():
            by_partition.setdefault(partition, []).append(key)
        acks: list[Awaitable[object]] = []
        for partition, keys in by_partition.items():
            batch = producer.create_batch()
            for key in keys:
                value = orjson.dumps(data[key])
                if batch.append(key=key, value=value, timestamp=None) is None:  # full: send, start another
                    if batch.record_count():
                        acks.append(await producer.send_batch(batch, topic, partition=partition))
                        batch = producer.create_batch()
                    if batch.append(key=key, value=value, timestamp=None) is None:  # larger than a batch
                        acks.append(await producer.send(topic, value, key=key, partition=partition))
            if batch.record_count():
                acks.append(await producer.send_batch(batch, topic, partition=partition))
        return acks
