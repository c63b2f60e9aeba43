"""The offset-gap guard (`streams.gaps`): aiokafka's fetched records of a partition are cut at
the first gap, the consumer's position stays there, and a gap that stays `wait_s` is read past.
The records are real Kafka record batches (aiokafka's own builder and parser); the clock is
injected."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from aiokafka import TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.consumer import fetcher
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.default_records import DefaultRecordBatchBuilder, _DefaultRecordBatchBuilderPy
from aiokafka.record.memory_records import MemoryRecords

from streams import gaps
from streams.settings import SettingsError, load_settings

TP = TopicPartition("node-inbox", 3)


class ControlBatchBuilder(_DefaultRecordBatchBuilderPy):
    """A batch with the control flag (a transaction marker), which only brokers write."""

    def _get_attributes(self, include_compression_type: bool = True) -> int:
        return super()._get_attributes(include_compression_type) | self.CONTROL_MASK | self.TRANSACTIONAL_MASK


def batch(base: int, count: int, builder_type: type = DefaultRecordBatchBuilder) -> bytes:
    builder = builder_type(2, 0, 0, -1, -1, -1, 1 << 20)
    for delta in range(count):
        builder.append(delta, 0, f"k{base + delta}".encode(), f"v{base + delta}".encode(), [])
    raw = builder.build()
    struct.pack_into(">q", raw, 0, base)  # the base offset the broker gives (not under the CRC)
    return bytes(raw)


def fetched(fetch_offset: int, *batches: bytes) -> fetcher.PartitionRecords:
    records = MemoryRecords(b"".join(batches))
    return fetcher.PartitionRecords(TP, records, [], fetch_offset, None, None, True, 0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def guard() -> Iterator[gaps.GapGuard]:
    """The guard installed, and the records made as a fetch of one guarded consumer makes them."""
    before = gaps.use(None)  # the process's own (a broker the test session started) comes back after
    installed = gaps.install("127.0.0.1:9092", wait_s=5.0)
    installed.clock = Clock()
    token = gaps._fetching.set(gaps.Waits(installed))
    yield installed
    gaps._fetching.reset(token)
    gaps.use(before)


def waits() -> gaps.Waits:
    consumer = gaps._fetching.get()
    assert consumer is not None
    return consumer


def offsets(records: fetcher.PartitionRecords) -> list[int]:
    return [r.offset for r in records]


def test_without_the_guard_a_consumer_reads_past_a_gap() -> None:
    before = gaps.use(None)
    try:
        records = fetched(0, batch(0, 3), batch(5, 2))
        assert offsets(records) == [0, 1, 2, 5, 6]
        assert records.next_fetch_offset == 7
    finally:
        gaps.use(before)


def test_a_fetch_from_a_broker_not_guarded_reads_past_a_gap(guard: gaps.GapGuard) -> None:
    token = gaps._fetching.set(None)  # as `_guarded_fetch` sets it for another broker's consumer
    try:
        assert offsets(fetched(0, batch(0, 3), batch(5, 2))) == [0, 1, 2, 5, 6]
    finally:
        gaps._fetching.reset(token)
    assert guard.held == 0


async def test_only_the_consumers_of_the_guarded_brokers_are_guarded(guard: gaps.GapGuard) -> None:
    assert guard.covers(AIOKafkaClient(bootstrap_servers="127.0.0.1:9092"))
    assert guard.covers(AIOKafkaClient(bootstrap_servers=["127.0.0.1:9093", "127.0.0.1:9092"]))
    assert not guard.covers(AIOKafkaClient(bootstrap_servers="127.0.0.1:9093"))
    gaps.install("127.0.0.1:9093,127.0.0.1:9094", wait_s=2.0)  # a second broker; the last wait holds
    assert guard.covers(AIOKafkaClient(bootstrap_servers="127.0.0.1:9094"))
    assert guard.wait_s == 2.0
    gaps.forget("127.0.0.1:9094")  # stopped: its port may go to another broker
    assert not guard.covers(AIOKafkaClient(bootstrap_servers="127.0.0.1:9094"))


def test_the_guard_stops_at_the_gap_and_the_position_stays_there(guard: gaps.GapGuard) -> None:
    records = fetched(0, batch(0, 3), batch(5, 2))
    assert offsets(records) == [0, 1, 2]
    assert records.next_fetch_offset == 3  # the consumer's next fetch asks for offset 3 again
    assert guard.held == 1
    # Fetched again: the write in flight is visible now, everything comes in order.
    guard.clock.now += 0.02  # type: ignore[attr-defined]
    records = fetched(3, batch(3, 2), batch(5, 2))
    assert offsets(records) == [3, 4, 5, 6]
    assert (guard.filled, guard.accepted, waits().gaps) == (1, 0, {})
    assert guard.longest_s == pytest.approx(0.02)


def test_a_gap_at_the_fetch_offset_itself_is_waited_for(guard: gaps.GapGuard) -> None:
    records = fetched(3, batch(5, 2))
    assert offsets(records) == []
    assert records.next_fetch_offset == 3


def test_a_gap_that_stays_is_read_past_after_the_wait(guard: gaps.GapGuard, caplog: pytest.LogCaptureFixture) -> None:
    assert offsets(fetched(3, batch(5, 2))) == []
    guard.clock.now += 4.9  # type: ignore[attr-defined]
    assert offsets(fetched(3, batch(5, 2))) == []  # still within the wait
    guard.clock.now += 0.2  # type: ignore[attr-defined]
    records = fetched(3, batch(5, 2))
    assert offsets(records) == [5, 6]
    assert records.next_fetch_offset == 7
    assert (guard.accepted, waits().gaps) == (1, {})
    assert "offsets 3 to 4 did not appear in 5.0s" in caplog.text


def test_records_before_the_fetch_offset_are_skipped_as_before(guard: gaps.GapGuard) -> None:
    records = fetched(1, batch(0, 3), batch(3, 1))
    assert offsets(records) == [1, 2, 3]
    assert guard.held == 0


def test_two_readers_of_one_partition_wait_for_their_own_gaps(guard: gaps.GapGuard) -> None:
    first, second = waits(), gaps.Waits(guard)
    assert offsets(fetched(3, batch(5, 1))) == []  # the first reader waits at 3
    guard.clock.now += 3.0  # type: ignore[attr-defined]
    token = gaps._fetching.set(second)
    try:
        assert offsets(fetched(10, batch(12, 1))) == []  # the second at 10
        assert offsets(fetched(20, batch(20, 2))) == [20, 21]  # and reads on elsewhere
    finally:
        gaps._fetching.reset(token)
    guard.clock.now += 2.5  # type: ignore[attr-defined]
    assert offsets(fetched(3, batch(5, 1))) == [5]  # 5.5 s for the first reader's gap: read past
    assert first.gaps == {} and guard.accepted == 1


def test_a_transaction_marker_covers_its_offset(guard: gaps.GapGuard) -> None:
    records = fetched(0, batch(0, 2), batch(2, 1, ControlBatchBuilder), batch(3, 2))
    assert offsets(records) == [0, 1, 3, 4]
    assert records.next_fetch_offset == 5
    assert guard.held == 0


def test_a_gap_after_the_last_record_of_a_fetch_is_met_by_the_next(guard: gaps.GapGuard) -> None:
    records = fetched(0, batch(0, 2))
    assert offsets(records) == [0, 1]
    assert offsets(fetched(2, batch(4, 1))) == []  # offsets 2 and 3 not visible yet
    assert offsets(fetched(2, batch(2, 2), batch(4, 1))) == [2, 3, 4]
    assert guard.filled == 1


def test_a_consumer_reads_partly_and_goes_on_where_it_stopped(guard: gaps.GapGuard) -> None:
    records = fetched(0, batch(0, 4), batch(6, 1))
    taken = [next(records).offset, next(records).offset]  # as getall(max_records=2) takes them
    assert taken == [0, 1] and records.next_fetch_offset == 2
    assert offsets(records) == [2, 3]
    assert records.next_fetch_offset == 4


def test_the_settings_choose_and_bound_the_guard() -> None:
    assert load_settings(env={}).kafka.contiguous_offsets == "auto"
    assert load_settings(env={"KOORDSTREAM_KAFKA_GAP_WAIT_S": "2"}).kafka.gap_wait_s == 2.0
    with pytest.raises(SettingsError, match="kafka.contiguous_offsets: must be auto, on or off, got 'always'"):
        load_settings(env={"KOORDSTREAM_KAFKA_CONTIGUOUS_OFFSETS": "always"})
    with pytest.raises(SettingsError, match="kafka.gap_wait_s: must be from 0 to 600 seconds"):
        load_settings(env={"KOORDSTREAM_KAFKA_GAP_WAIT_S": "0"})


async def test_a_consumer_looks_again_whether_it_is_guarded_when_the_brokers_change(guard: gaps.GapGuard) -> None:
    consumer = SimpleNamespace(_client=AIOKafkaClient(bootstrap_servers="127.0.0.1:9095"))  # a fetcher's client
    assert gaps._waits(consumer, guard) is None
    gaps.install("127.0.0.1:9095")
    first = gaps._waits(consumer, guard)
    assert first is not None and gaps._waits(consumer, guard) is first  # its own gaps, kept
    gaps.forget("127.0.0.1:9095")
    assert gaps._waits(consumer, guard) is None


def test_a_consumer_pauses_only_before_asking_again_for_a_gap_it_waits_at(guard: gaps.GapGuard) -> None:
    assert offsets(fetched(3, batch(5, 1))) == []  # waits at node-inbox/3 offset 3

    def request(offset: int) -> FetchRequest:
        return FetchRequest(20, 1, 1 << 20, 0, [("pods", [(3, 3, 1 << 20)]), ("node-inbox", [(3, offset, 1 << 20)])])

    assert waits().asks_again(request(3))
    assert not waits().asks_again(request(6))  # sought elsewhere meanwhile
