"""A faust table manager whose restore ends where the committed records end.

With transactions every changelog partition ends with a transaction marker (a control
record that no consumer ever receives), and the restore reads `read_committed`, so the last
record it can see is not at the partition's end offset. faust's recovery waits until it has
applied the record just below the end offset (its "highwater"), so it would wait forever (faust
only works around it in its own exactly_once mode, after two idle 5-second timeouts). Here the
highwater of each changelog partition is the offset of its last committed data record, found by
reading the partition's tail with a short-lived read_committed consumer (from 64 records below
the end, further back while the tail holds markers and aborted records only); a partition with
no committed record counts as restored at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery

log = logging.getLogger("koordstream.recovery")

TAIL_WINDOW = 64
TAIL_DEADLINE_S = 30.0


async def last_committed_offsets(bootstrap: str, ends: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """Per (topic, partition), the offset of the last committed data record below its end
    offset `ends[...]`, or the partition's beginning offset less one when it has none."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                isolation_level="read_committed", fetch_max_wait_ms=50)
    await consumer.start()
    try:
        tps = {key: TopicPartition(*key) for key in ends}
        consumer.assign(list(tps.values()))
        begins = await consumer.beginning_offsets(list(tps.values()))
        return {key: await _last_record(consumer, tp, begins[tp], ends[key]) for key, tp in tps.items()}
    finally:
        await consumer.stop()


async def _last_record(consumer: AIOKafkaConsumer, tp: TopicPartition, begin: int, end: int) -> int:
    stop_at, window = end, TAIL_WINDOW
    deadline = time.monotonic() + TAIL_DEADLINE_S
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


class CommittedRecovery(Recovery):  # type: ignore[misc]
    bootstrap: str = ""

    async def _build_highwaters(self, consumer: Any, tps: set[Any], destination: Any, title: str) -> None:
        await super()._build_highwaters(consumer, tps, destination, title)
        if not tps:
            return
        ends = {(tp.topic, tp.partition): (destination[tp] if destination[tp] is not None else -1) + 1 for tp in tps}
        last = await last_committed_offsets(self.bootstrap, ends)
        for tp in tps:
            destination[tp] = last[(tp.topic, tp.partition)]
        log.info("%s changelog highwaters (last committed records): %s", title,
                 {f"{tp.topic}/{tp.partition}": destination[tp] for tp in sorted(tps)})


class CommittedTableManager(TableManager):  # type: ignore[misc]
    """faust's TableManager with `CommittedRecovery` (set `bootstrap` on a subclass)."""

    bootstrap: str = ""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            recovery = CommittedRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
            recovery.bootstrap = self.bootstrap
            self._recovery = recovery
        return self._recovery


def committed_table_manager(bootstrap: str) -> type[CommittedTableManager]:
    """The TableManager class for a faust app whose restores read committed records only."""
    return type("CommittedTableManager", (CommittedTableManager,), {"bootstrap": bootstrap})
