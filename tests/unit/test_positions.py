"""Where a stateful agent's partition begins after an assignment: the probe of the committed
offset (`agents.adapters.positions.CommittedStart`) and faust's offset bookkeeping after the
loop reads a partition again (`agents.adapters.stateful.forget_gaps`). Found by an adversarial
review of the start check; each test failed before its fix."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import faust
import pytest
from faust.types import TP
from faust.types.tuples import ConsumerMessage

from agents.adapters.batches import split
from agents.adapters.positions import CommittedStart
from agents.adapters.stateful import forget_gaps
from schemas import topics
from schemas.codec import encode
from tests.unit.test_adapter_loop import assign, held, probed, rig, run_of


class Consumer:
    """aiokafka's consumer as the probe sees it: committed offset 60, records up to 100; the
    fetch returns nothing the first `slow` times (under load) and position tells how far it got."""

    def __init__(self, slow: int, end: int = 101) -> None:
        self.slow, self.end, self.at = slow, end, 0

    async def committed(self, tp: Any) -> int:
        return 60

    def assign(self, tps: Any) -> None:
        return None

    def seek(self, tp: Any, offset: int) -> None:
        self.at = offset

    async def getmany(self, tp: Any, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        if self.slow:
            self.slow -= 1
            return {}
        if self.at >= self.end:
            return {}
        return {tp: [type("Message", (), {"offset": self.at})()]}

    async def position(self, tp: Any) -> int:
        return self.at

    def last_stable_offset(self, tp: Any) -> int:
        return self.end

    def highwater(self, tp: Any) -> int:
        return self.end


async def test_a_fetch_that_found_nothing_short_of_the_end_is_no_answer() -> None:
    """A slow fetch used to answer "nothing after the committed offset", and the run from 100
    was decided while 60..99 never were. Now the run is read again and the start asked again."""
    probe = CommittedStart("x:1", "g", True, wait_ms=10)
    probe.consumer = probe.offsets = Consumer(slow=1)
    r = rig(plain=True)
    seeks = probed(r, None)
    r.loop.probe = probe
    await assign(r, {0}, generation=4)
    assert (await r.loop.process([run_of(topics.HOLDS, 0, 4, [held("u100", "u100", gang_min=1)],
                                         first_offset=100)])).durable == []
    assert (await r.loop.process([run_of(topics.HOLDS, 0, 4, [held("u100", "u100", gang_min=1)],
                                         first_offset=100)])).durable == []
    assert [offset for _, _, offset in seeks] == [100, 60]  # read again, then from the first record


@pytest.mark.parametrize("read_committed", [True, False])
async def test_a_fetch_that_reached_the_end_answers_nothing_is_there(read_committed: bool) -> None:
    """With transactions the partition ends at its last stable offset; without, at the high
    watermark (a broker without transactions reports no last stable offset)."""
    probe = CommittedStart("x:1", "g", read_committed, wait_ms=10)
    probe.consumer = probe.offsets = Consumer(slow=0, end=60)  # markers only after the committed offset
    if not read_committed:
        probe.consumer.last_stable_offset = lambda tp: None
    assert await probe(topics.HOLDS, 0) is None


async def test_without_a_group_the_first_record_of_the_partition_is_the_answer() -> None:
    """The scheduler's probe (no group: it commits nothing) starts at the partition's beginning,
    whatever a group may have committed."""
    consumer = Consumer(slow=0)
    begun: list[Any] = []

    async def seek_to_beginning(tp: Any) -> None:
        begun.append(tp)
        consumer.at = 7  # the first record left by retention

    consumer.seek_to_beginning = seek_to_beginning  # type: ignore[method-assign]
    probe = CommittedStart("x:1", None, False, wait_ms=10)
    probe.consumer = probe.offsets = consumer
    assert await probe(topics.PODS, 2) == 7
    assert len(begun) == 1


@dataclass
class Event:
    message: Any

    @property
    def value(self) -> bytes:
        return bytes(self.message.value)


async def drain(consumer: Any, messages: list[Any]) -> list[Any]:
    """faust's own fetch loop (`_drain_messages`) over one fetched batch."""
    delivered: list[Any] = []
    fetcher = faust.Service()

    async def getmany(timeout: float) -> AsyncIterator[tuple[Any, Any]]:
        for m in messages:
            yield m.tp, m
        fetcher._stopped.set()

    async def callback(m: Any) -> None:
        delivered.append(m)

    consumer.getmany, consumer.callback = getmany, callback
    await consumer._drain_messages(fetcher)
    return delivered


def messages(tp: TP, offsets: range | list[int], generation: int) -> list[Any]:
    return [ConsumerMessage(tp.topic, tp.partition, o, 0.0, 0, [], b"k", encode(held(f"u{o}", f"u{o}", gang_min=1)),
                            None, tp=tp, generation_id=generation) for o in offsets]


async def test_without_transactions_faust_never_commits_past_what_a_read_again_has_not_decided() -> None:
    """faust noted a gap 61..100 when it delivered a record fetched before its seek (offset 100,
    read offset 60); the loop read the partition again from 60 and decided 60..65. Filling that
    gap, faust's commits went 62, ..., 66, 101: past 66..99, not decided yet. The seek of the
    read again forgets the gaps from its offset on."""
    r = rig(plain=True)
    app = faust.App("gaps", store="memory://", broker="kafka://127.0.0.1:1")
    c: Any = app.consumer
    app.topics.acks_enabled_for = lambda topic: True  # type: ignore[method-assign]  # acks on (no transactions)
    tp = TP(topics.HOLDS, 0)
    seeks = probed(r, 60)

    async def seek(topic: str, partition: int, offset: int) -> None:  # what stateful.register_stateful's does
        seeks.append((topic, partition, offset))
        c._read_offset[tp] = offset
        forget_gaps(c, tp, offset)

    r.loop.seek = seek
    await assign(r, {0}, generation=4)
    c._read_offset[tp] = c._committed_offset[tp] = 60  # faust's seek to the committed offset

    async def process(delivered: list[Any]) -> None:
        events = [Event(m) for m in delivered]
        await r.loop.process(split(events))
        for e in events:  # faust acknowledges a take() batch after the loop body
            c.ack(e.message)

    await process(await drain(c, messages(tp, [100], 4)))
    assert seeks == [(topics.HOLDS, 0, 60)]
    await process(await drain(c, messages(tp, range(60, 66), 4)))
    commits = []
    for _ in range(10):  # faust's commit timer
        offset = c._new_offset(tp)
        if offset is not None and c._should_commit(tp, offset):
            c._committed_offset[tp] = offset
            commits.append(offset)
    assert max(commits) == 66, commits
    await asyncio.sleep(0)
