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
bootstrap names that broker stops a fetch's records at a gap: its position stays at the
missing offset and the next fetch asks for it again (gaps filled within 7-35 ms in the
test). A gap that stays `wait_s` is read past (a warning names the partition and the offsets):
the guard cannot hang a consumer. Apache Kafka leaves gaps of its own (transaction markers,
compaction) and has no such race (its high watermark follows the writes in order), so its
consumers are never guarded, even in a process that guards a Tansu (the tests run both).
Who installs it: `EmbeddedBroker.start` for the process that starts Tansu, and
`streams.app.guard_gaps` by `kafka.contiguous_offsets` (`auto`: for a broker that refuses
InitProducerId, as Tansu does) in workers and harnesses. It hooks two aiokafka internals
(`Fetcher._proc_fetch_request`, `PartitionRecords`, aiokafka 0.14): the unit tests drive the
real record parser, the integration test the real broker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from aiokafka.conn import collect_hosts
from aiokafka.consumer import fetcher

log = logging.getLogger("koordstream.gaps")

DEFAULT_WAIT_S = 5.0


class GapGuard:
    """The gaps being waited for: per partition, first missing offset -> when first seen
    (two consumers of one partition in a process wait for their own gaps)."""

    def __init__(self, wait_s: float = DEFAULT_WAIT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.wait_s = wait_s
        self.clock = clock
        self.waiting: dict[Any, dict[int, float]] = {}
        self.held = 0  # fetches stopped at a gap
        self.filled = 0  # gaps whose records came
        self.accepted = 0  # gaps read past after `wait_s`
        self.longest_s = 0.0  # the longest a filled gap was waited for
        self.brokers: set[tuple[str, int]] = set()  # (host, port) of the guarded brokers

    def covers(self, client: Any) -> bool:
        """Whether an aiokafka client's bootstrap names a guarded broker (a few microseconds,
        once per fetch request)."""
        return bool(hosts(client._bootstrap_servers) & self.brokers)

    def may_pass(self, tp: Any, expected: int, offset: int) -> bool:
        """A record at `offset` came where `expected` was next: may the consumer go on past the
        missing offsets? Not until they stayed missing `wait_s`."""
        now = self.clock()
        gaps = self.waiting.setdefault(tp, {})
        since = gaps.setdefault(expected, now)
        if now - since < self.wait_s:
            self.held += 1
            return False
        del gaps[expected]
        if not gaps:
            del self.waiting[tp]
        self.accepted += 1
        log.warning("%s: offsets %s to %s did not appear in %ss: read past them", tp, expected, offset - 1,
                    self.wait_s)
        return True

    def came(self, tp: Any, offset: int) -> None:
        """A record came at the offset expected next: the gaps at or before it are filled."""
        gaps = self.waiting.get(tp)
        if gaps is None:
            return
        now = self.clock()
        for expected in [e for e in gaps if e <= offset]:
            self.longest_s = max(self.longest_s, now - gaps.pop(expected))
            self.filled += 1
        if not gaps:
            del self.waiting[tp]


_guard: GapGuard | None = None
_stock_records = fetcher.PartitionRecords
_stock_fetch = fetcher.Fetcher._proc_fetch_request
_guarded: ContextVar[bool] = ContextVar("koordstream_gaps_guarded", default=False)  # this fetch's broker


def hosts(bootstrap: Any) -> set[tuple[str, int]]:
    """(host, port) of each address in a bootstrap list (a comma-separated string or a list)."""
    return {(host, port) for host, port, _ in collect_hosts(bootstrap, randomize=False)}


class ContiguousPartitionRecords(_stock_records):  # type: ignore[misc, valid-type]
    """aiokafka's records of one fetched partition, cut at the first gap when they come from a
    guarded broker (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard = _guard if _guarded.get() else None

    def _unpack_records(self) -> Iterator[Any]:
        guard = self._guard
        if guard is None:
            yield from super()._unpack_records()
            return
        expected: int = getattr(self, "next_fetch_offset")  # noqa: B009 - the fetch offset (aiokafka is untyped)
        waiting = guard.waiting
        for record in super()._unpack_records():
            offset = record.offset
            if offset > expected and not guard.may_pass(self._tp, expected, offset):
                self.next_fetch_offset = expected  # the position stays: fetched again from there
                return
            if waiting:
                guard.came(self._tp, offset)
            expected = offset + 1
            yield record


async def _guarded_fetch(self: Any, assignment: Any, node_id: Any, request: Any) -> Any:
    """aiokafka's fetch of one broker node, with the records it makes guarded when the
    consumer's bootstrap names a guarded broker."""
    guard = _guard
    token = _guarded.set(guard is not None and guard.covers(self._client))
    try:
        return await _stock_fetch(self, assignment, node_id, request)
    finally:
        _guarded.reset(token)


def install(bootstrap: Any, wait_s: float = DEFAULT_WAIT_S) -> GapGuard:
    """Guard every aiokafka consumer of this process (faust's too) whose bootstrap names one of
    the addresses of `bootstrap` (other brokers' consumers read as before). Idempotent: the
    last `wait_s` holds, the brokers add up."""
    global _guard
    if _guard is None:
        _guard = GapGuard(wait_s)
    _guard.wait_s = wait_s
    _guard.brokers |= hosts(bootstrap)
    fetcher.PartitionRecords = ContiguousPartitionRecords
    fetcher.Fetcher._proc_fetch_request = _guarded_fetch
    return _guard


def uninstall() -> None:
    global _guard
    fetcher.PartitionRecords = _stock_records
    fetcher.Fetcher._proc_fetch_request = _stock_fetch
    _guard = None


def installed() -> GapGuard | None:
    return _guard
