"""A faust table manager whose restore ends at the changelog's last record, read from the
partition itself rather than taken from ListOffsets.

faust's recovery restores a changelog partition up to its "highwater", the end offset that
ListOffsets answers less one, and waits until it has applied that record. Two brokers make
that number wrong:

- Apache Kafka with transactions: every changelog partition ends with a transaction marker (a
  control record that no consumer ever receives) and the restore reads `read_committed`, so
  the last record it can see is not at the end offset; faust would wait forever (it only works
  around it in its own exactly_once mode, after two idle 5-second timeouts).
- The embedded Tansu 0.6 answers ListOffsets(latest) with the base offset of the partition's
  last record *batch* plus one (measured: three batches of 3, 1 and 2 records end at offset 5,
  not 6), while its fetch responses carry the right high watermark. The agents write a
  micro-batch's changelog records as one batch per partition, so faust stopped the restore at
  the first record of the previous owner's last batch: the state of every other key that batch
  wrote was missing when the new owner started deciding (holds and decisions lost, devices
  given twice), and the records came in only later, if ever. A partition kept across a
  rebalance whose last restore had read past that number made faust raise ConsistencyError
  ("persisted offset higher than the last offset") and the worker crash.

Here the highwater of each changelog partition is the offset of its last data record, found
by reading the partition's tail with a short-lived consumer: first a fetch from just below the
end offset ListOffsets gave, whose response carries the true end (the high watermark, or the
last stable offset when reading committed records), then the records below that end (from 64
below it, further back while the tail holds markers and aborted records only); a partition
with no record counts as restored at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery

from agents.adapters.connection import KafkaConnection

log = logging.getLogger("koordstream.recovery")

TAIL_WINDOW = 64
TAIL_DEADLINE_S = 30.0


async def last_record_offsets(kafka: KafkaConnection | str, ends: Mapping[tuple[str, int], int],
                              read_committed: bool = True) -> dict[tuple[str, int], int]:
    """Per (topic, partition), the offset of the last (committed, with `read_committed`) data
    record, or the partition's beginning offset less one when it has none. `ends[...]` is the
    end offset ListOffsets answered, which may be too low (Tansu) but is never too high."""
    consumer = KafkaConnection.of(kafka).consumer(
        group_id=None, enable_auto_commit=False,
        isolation_level="read_committed" if read_committed else "read_uncommitted", fetch_max_wait_ms=50)
    await consumer.start()
    try:
        tps = {key: TopicPartition(*key) for key in ends}
        consumer.assign(list(tps.values()))
        begins = await consumer.beginning_offsets(list(tps.values()))
        out = {}
        for key, tp in tps.items():
            deadline = time.monotonic() + TAIL_DEADLINE_S
            end = await _true_end(consumer, tp, begins[tp], ends[key], read_committed, deadline)
            out[key] = await _last_record(consumer, tp, begins[tp], end, deadline)
        return out
    finally:
        await consumer.stop()


async def last_committed_offsets(kafka: KafkaConnection | str,
                                 ends: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """`last_record_offsets` of committed records (the transactional restore)."""
    return await last_record_offsets(kafka, ends, read_committed=True)


async def _true_end(consumer: AIOKafkaConsumer, tp: TopicPartition, begin: int, end: int, read_committed: bool,
                    deadline: float) -> int:
    """The end offset a fetch response gives (high watermark, or last stable offset when reading
    committed records), when larger than `end`."""
    consumer.seek(tp, max(begin, end - 1))
    while time.monotonic() < deadline:
        await consumer.getmany(tp, timeout_ms=200)
        fetched_end = consumer.last_stable_offset(tp) if read_committed else consumer.highwater(tp)
        if fetched_end is not None and fetched_end >= 0:
            if fetched_end > end:
                log.info("%s: the end offset is %s, not %s as ListOffsets answered", tp, fetched_end, end)
            return max(end, int(fetched_end))
    log.warning("%s: no fetch response within %ss; restoring up to offset %s", tp, TAIL_DEADLINE_S, end - 1)
    return end


async def _last_record(consumer: AIOKafkaConsumer, tp: TopicPartition, begin: int, end: int, deadline: float) -> int:
    stop_at, window = end, TAIL_WINDOW
    while stop_at > begin:
        start = max(begin, stop_at - window)
        consumer.seek(tp, start)
        last: int | None = None
        while await consumer.position(tp) < stop_at:
            if time.monotonic() > deadline:
                log.warning("%s: tail not read within %ss; restoring up to offset %s", tp, TAIL_DEADLINE_S, end - 1)
                return end - 1
            fetched = await consumer.getmany(tp, timeout_ms=200)
            for message in fetched.get(tp, []):
                if message.offset < stop_at:
                    last = int(message.offset)
        if last is not None:
            return last
        stop_at, window = start, window * 4
    return begin - 1


class TailRecovery(Recovery):  # type: ignore[misc]
    """faust's Recovery with the highwaters of `last_record_offsets`."""

    kafka: KafkaConnection | str = ""
    read_committed: bool = True

    async def _build_highwaters(self, consumer: Any, tps: set[Any], destination: Any, title: str) -> None:
        await super()._build_highwaters(consumer, tps, destination, title)
        if not tps:
            return
        ends = {(tp.topic, tp.partition): (destination[tp] if destination[tp] is not None else -1) + 1 for tp in tps}
        last = await last_record_offsets(self.kafka, ends, self.read_committed)
        for tp in tps:
            destination[tp] = last[(tp.topic, tp.partition)]
        log.info("%s changelog highwaters (last %srecords): %s", title, "committed " if self.read_committed else "",
                 {f"{tp.topic}/{tp.partition}": destination[tp] for tp in sorted(tps)})


CommittedRecovery = TailRecovery  # the name it had when only the transactional restore used it


class TailTableManager(TableManager):  # type: ignore[misc]
    """faust's TableManager with `TailRecovery` (set `kafka` and `read_committed` on a subclass)."""

    kafka: KafkaConnection | str = ""
    read_committed: bool = True

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            recovery = TailRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
            recovery.kafka = self.kafka
            recovery.read_committed = self.read_committed
            self._recovery = recovery
        return self._recovery


def table_manager(kafka: KafkaConnection | str, read_committed: bool) -> type[TailTableManager]:
    """The TableManager class for a faust app whose restores end at the changelog's last
    (committed, with `read_committed`) record."""
    return type("TailTableManager", (TailTableManager,), {"kafka": kafka, "read_committed": read_committed})


def committed_table_manager(kafka: KafkaConnection | str) -> type[TailTableManager]:
    """`table_manager` of committed records (the workers that run with transactions)."""
    return table_manager(kafka, read_committed=True)
