"""Consumers that do not read past a write the embedded broker has not made visible yet.

Tansu (0.6, in-memory) assigns offsets to concurrent produce requests for one partition and
stores them in whatever order they finish: a fetch can return a later request's records while
an earlier one's offsets are still empty, and a consumer moves its position past them for
good. Measured here (`tests/integration/test_gaps.py`): eight producers writing small batches
to one partition, a tailing aiokafka consumer missed 37 of 40,000 records that a full read
afterwards found. In koordstream a partition with several writers is the rule (`node-inbox`
takes the scheduler's claims, the deciders' commits and the node feed; `pods` the users and the
scheduler's forwards), and one claim read past is a pod that waits for ever: a CI soak left
four pods unbound that way (their claims in the log, never answered).

A broker without transactions and without compaction writes every partition's offsets
without gaps, so there a gap is a write still in flight. With the guard installed for a
broker (`install(bootstrap)`), every aiokafka consumer of the process (faust's too) whose
bootstrap names that broker reads a fetched partition's record batches only as long as each
begins within the offsets covered so far (records, transaction markers and aborted batches
all cover theirs): at a gap aiokafka's parser stops, the consumer's position stays at the
missing offset, and its next fetch, a few milliseconds later (`PAUSE_S`, so that it does not
ask again in a loop), asks for it again (gaps filled within 7-35 ms in the test). A gap that
stays `wait_s` is read past (a warning names the partition and the offsets): the guard cannot
hang a consumer. Each consumer waits for its own gaps (`Waits`, kept on its fetcher and
touched only from its thread). Apache Kafka has no such race (its high watermark follows the
writes in order) and leaves gaps of its own (compaction), so its consumers are never guarded,
even in a process that guards a Tansu (the tests run both); addresses are compared as
written, as every consumer of a worker takes `kafka.bootstrap`.

Who installs it: `EmbeddedBroker.start` for the process that starts Tansu (and `stop`
forgets it: its port may go to another broker), and `streams.app.guard_gaps` by
`kafka.contiguous_offsets` (`auto`: for a broker whose answer refuses InitProducerId, as
Tansu's does) in workers and harnesses. It hooks two aiokafka internals
(`Fetcher._proc_fetch_request`, `PartitionRecords`, aiokafka 0.14): the unit tests drive the
real record parser, the integration test the real broker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from aiokafka.conn import collect_hosts
from aiokafka.consumer import fetcher

log = logging.getLogger("koordstream.gaps")

DEFAULT_WAIT_S = 5.0
PAUSE_S = 0.005  # before a fetch of a consumer that waits at a gap (else it asks again at once, in a loop)


class GapGuard:
    """The process's guard: the guarded brokers, the wait, the clock and the counts."""

    def __init__(self, wait_s: float = DEFAULT_WAIT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.wait_s = wait_s
        self.clock = clock
        self.brokers: set[tuple[str, int]] = set()  # (host, port) of the guarded brokers, as written
        self.version = 0  # changes with `brokers`: consumers look again whether they are covered
        self.held = 0  # fetches stopped at a gap
        self.filled = 0  # gaps whose records came
        self.accepted = 0  # gaps read past after `wait_s`
        self.longest_s = 0.0  # the longest a filled gap was waited for

    def covers(self, client: Any) -> bool:
        """Whether an aiokafka client's bootstrap names a guarded broker (addresses compared as
        written: every consumer of a worker takes `kafka.bootstrap` as it is)."""
        return bool(hosts(client._bootstrap_servers) & self.brokers)


class Waits:
    """One consumer's gaps (its fetcher's): partition -> (first missing offset, first seen).
    Only that consumer's thread touches it; another consumer of the same partition waits for
    its own gaps."""

    def __init__(self, guard: GapGuard) -> None:
        self.guard = guard
        self.gaps: dict[Any, tuple[int, float]] = {}

    def may_pass(self, tp: Any, expected: int, base: int) -> bool:
        """A batch begins at `base` where `expected` was next: may the consumer go on past the
        missing offsets? Not until they stayed missing `wait_s`."""
        guard = self.guard
        now = guard.clock()
        seen = self.gaps.get(tp)
        if seen is None or seen[0] != expected:
            self.gaps[tp] = (expected, now)
            guard.held += 1
            return False
        if now - seen[1] < guard.wait_s:
            guard.held += 1
            return False
        del self.gaps[tp]
        guard.accepted += 1
        log.warning("%s: offsets %s to %s did not appear in %ss: read past them", tp, expected, base - 1,
                    guard.wait_s)
        return True

    def asks_again(self, request: Any) -> bool:
        """Whether a fetch request asks for a partition at the gap it waits at."""
        gaps = self.gaps
        for topic, partitions in request.topics:
            for partition, offset, *_ in partitions:
                seen = gaps.get((topic, partition))  # TopicPartition is a tuple of the same fields
                if seen is not None and seen[0] == offset:
                    return True
        return False

    def came(self, tp: Any, end: int) -> None:
        """The partition is read to `end` (exclusive) without a gap: a gap it waited for before
        that is filled."""
        seen = self.gaps.get(tp)
        if seen is not None and end > seen[0]:
            del self.gaps[tp]
            self.guard.filled += 1
            self.guard.longest_s = max(self.guard.longest_s, self.guard.clock() - seen[1])


class Batches:
    """A fetched partition's record batches as aiokafka's parser takes them (`has_next`,
    `next_batch`), ending before the first batch that begins past the offsets covered so far
    (records, control markers and aborted batches alike cover their offsets)."""

    __slots__ = ("records", "waits", "tp", "covered", "peeked")

    def __init__(self, records: Any, waits: Waits, tp: Any, fetch_offset: int) -> None:
        self.records = records
        self.waits = waits
        self.tp = tp
        self.covered = fetch_offset
        self.peeked: Any = None

    def has_next(self) -> bool:
        if self.peeked is None:
            if not self.records.has_next():
                return False
            self.peeked = self.records.next_batch()
        base = self.peeked.base_offset
        return base <= self.covered or self.waits.may_pass(self.tp, self.covered, base)

    def next_batch(self) -> Any:
        batch, self.peeked = self.peeked, None
        self.covered = max(self.covered, batch.next_offset)
        if self.waits.gaps:
            self.waits.came(self.tp, self.covered)
        return batch


_guard: GapGuard | None = None
_stock_records = fetcher.PartitionRecords
_stock_fetch = fetcher.Fetcher._proc_fetch_request
_fetching: ContextVar[Waits | None] = ContextVar("koordstream_gaps_fetching", default=None)  # this fetch's consumer


def hosts(bootstrap: Any) -> set[tuple[str, int]]:
    """(host, port) of each address in a bootstrap list (a comma-separated string or a list)."""
    return {(host, port) for host, port, _ in collect_hosts(bootstrap, randomize=False)}


class ContiguousPartitionRecords(_stock_records):  # type: ignore[misc, valid-type]
    """aiokafka's records of one fetched partition, ending before the first gap when they come
    to a guarded consumer (see the module): the parser stops there, and its next fetch offset,
    which becomes the consumer's position, stays at the gap."""

    def __init__(self, tp: Any, records: Any, aborted: Any, fetch_offset: int, *args: Any) -> None:
        super().__init__(tp, records, aborted, fetch_offset, *args)
        waits = _fetching.get()
        if waits is not None:  # the parser reads `self._records` from its first step on
            self._records = Batches(records, waits, tp, fetch_offset)


def _waits(fetch: Any, guard: GapGuard) -> Waits | None:
    """The consumer's gaps, or None when its broker is not guarded (looked at once per consumer
    and guard version)."""
    known = getattr(fetch, "_koordstream_gaps", None)
    if known is None or known[0] != guard.version:
        known = fetch._koordstream_gaps = (guard.version, Waits(guard) if guard.covers(fetch._client) else None)
    waits: Waits | None = known[1]
    return waits


async def _guarded_fetch(self: Any, assignment: Any, node_id: Any, request: Any) -> Any:
    """aiokafka's fetch from one broker node, with the records it makes guarded when the
    consumer's broker is; a consumer that waits at a gap pauses a little before it asks again."""
    guard = _guard
    waits = _waits(self, guard) if guard is not None else None
    if waits is not None and waits.gaps and waits.asks_again(request):
        await asyncio.sleep(PAUSE_S)
    token = _fetching.set(waits)
    try:
        return await _stock_fetch(self, assignment, node_id, request)
    finally:
        _fetching.reset(token)


def install(bootstrap: Any, wait_s: float = DEFAULT_WAIT_S) -> GapGuard:
    """Guard every aiokafka consumer of this process (faust's too) whose bootstrap names one of
    the addresses of `bootstrap` (other brokers' consumers read as before). Idempotent: the
    last `wait_s` holds, the brokers add up."""
    guard = _guard or GapGuard(wait_s)
    guard.wait_s = wait_s
    guard.brokers |= hosts(bootstrap)
    guard.version += 1
    use(guard)
    return guard


def forget(bootstrap: Any) -> None:
    """Guard the consumers of `bootstrap` no more (a stopped broker: its port may be reused)."""
    if _guard is not None:
        _guard.brokers -= hosts(bootstrap)
        _guard.version += 1


def use(guard: GapGuard | None) -> GapGuard | None:
    """Make `guard` the process's (None: aiokafka as it came); returns the one before."""
    global _guard
    before, _guard = _guard, guard
    fetcher.PartitionRecords = _stock_records if guard is None else ContiguousPartitionRecords
    fetcher.Fetcher._proc_fetch_request = _stock_fetch if guard is None else _guarded_fetch
    return before


def installed() -> GapGuard | None:
    return _guard
