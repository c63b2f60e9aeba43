"""The scheduler reads each input partition from its first record in every assignment
(`agents.adapters.starts.ReadFromStart`): a replacement worker on Apache Kafka once never
received the records of a newly assigned `pods` partition (faust lost them around the
rebalance), and a pod that waited for room was never placed."""

from __future__ import annotations

import asyncio
from typing import Any

from agents.adapters.starts import ReadFromStart
from schemas import topics
from schemas.records import Pod, ResourceList
from tests.unit.test_adapter_loop import run_of

PODS = topics.PODS


def pods(*names: str) -> list[Pod]:
    return [Pod(uid=n, name=n, requests=ResourceList(cpu=100)) for n in names]


class Rig:
    """A guard whose probe answers `first` per partition, whose seeks are recorded, and whose
    watch sleeps until the test lets it go (`tick`)."""

    def __init__(self, first: int | None = 0) -> None:
        self.first: dict[tuple[str, int], int | None] = {}
        self.default = first
        self.seeks: list[tuple[str, int, int]] = []
        self.probes = 0
        self.fail_probe = False
        self.ticks: asyncio.Queue[None] = asyncio.Queue()
        self.slept = asyncio.Event()
        self.reread: list[int] = []
        self.guard = ReadFromStart(self.probe, self.seek, reread=self.reread.append, watch_every_s=3.0,
                                   sleep=self.sleep)

    async def probe(self, topic: str, partition: int) -> int | None:
        self.probes += 1
        if self.fail_probe:
            raise TimeoutError("slow fetch")
        return self.first.get((topic, partition), self.default)

    async def seek(self, topic: str, partition: int, offset: int) -> None:
        self.seeks.append((topic, partition, offset))

    async def sleep(self, seconds: float) -> None:
        self.slept.set()
        await self.ticks.get()

    async def tick(self) -> None:
        """Let the watch look once, and wait until it sleeps again (or ends)."""
        self.slept.clear()
        await self.ticks.put(None)
        watch = self.guard._watch
        assert watch is not None
        await asyncio.wait([asyncio.ensure_future(self.slept.wait()), watch], return_when=asyncio.FIRST_COMPLETED)


def uids(messages: list[Any]) -> list[int]:
    return [m.offset for m in messages]


async def test_a_partition_read_from_its_first_record_is_taken_as_it_comes() -> None:
    r = Rig(first=0)
    r.guard.assigned({(PODS, 0)}, generation=2)
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("a", "b"))])) == [0, 1]
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("c"), first_offset=2)])) == [2]
    assert r.seeks == [] and r.probes == 1  # checked once per assignment


async def test_a_partition_that_begins_past_its_first_record_is_read_again_from_it() -> None:
    """What faust lost (offsets 0..4) comes again; what it fetched before the seek is dropped
    until the first record is back, and each run without it seeks again."""
    r = Rig(first=0)
    r.guard.assigned({(PODS, 0)}, generation=2)
    assert await r.guard.admit([run_of(PODS, 0, 2, pods("f", "g"), first_offset=5)]) == []
    assert r.seeks == [(PODS, 0, 0)]
    assert await r.guard.admit([run_of(PODS, 0, 2, pods("h"), first_offset=7)]) == []  # fetched before the seek
    assert r.seeks == [(PODS, 0, 0), (PODS, 0, 0)]
    assert r.reread == [0, 0]  # the scheduler's input fence of partition 0 starts afresh each time
    again = await r.guard.admit([run_of(PODS, 0, 2, pods("a", "b", "c", "d", "e", "f", "g", "h"))])
    assert uids(again) == list(range(8))
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("i"), first_offset=8)])) == [8]
    assert r.guard.restarted == 1 and r.guard.reseeks == 1


async def test_the_first_record_awaited_is_found_again_when_it_is_gone() -> None:
    """Retention removed the record awaited: the next seek goes to the first one left."""
    r = Rig(first=0)
    r.guard.assigned({(PODS, 1)}, generation=3)
    assert await r.guard.admit([run_of(PODS, 1, 3, pods("x"), first_offset=9)]) == []
    r.first[(PODS, 1)] = 4
    assert await r.guard.admit([run_of(PODS, 1, 3, pods("y"), first_offset=10)]) == []
    assert r.seeks == [(PODS, 1, 0), (PODS, 1, 4)]
    assert uids(await r.guard.admit([run_of(PODS, 1, 3, pods("e", "f"), first_offset=4)])) == [4, 5]


async def test_a_partition_nothing_came_from_is_read_again_when_it_has_records() -> None:
    """The failure seen on CI: nothing of the partition ever arrived, and nothing new came."""
    r = Rig(first=0)
    r.first[(PODS, 1)] = None  # empty: nothing to read again
    r.guard.assigned({(PODS, 0), (PODS, 1), (topics.REQUEUE, 0)}, generation=2)
    assert uids(await r.guard.admit([run_of(topics.REQUEUE, 0, 2, pods("q"))])) == [0]
    r.guard.rebalanced()
    await r.tick()
    assert r.seeks == [(PODS, 0, 0)]  # the requeue partition came, the empty one has nothing
    await r.tick()
    assert r.seeks == [(PODS, 0, 0), (PODS, 0, 0)]  # still nothing: sought again
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("a", "b"))])) == [0, 1]
    await r.tick()
    watch = r.guard._watch
    assert watch is not None and watch.done()  # every partition read from its start
    assert r.guard.restarted == 1


async def test_a_probe_that_fails_takes_the_run_and_checks_the_next() -> None:
    r = Rig(first=0)
    r.guard.assigned({(PODS, 0)}, generation=2)
    r.fail_probe = True
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("c"), first_offset=2)])) == [2]
    r.fail_probe = False
    assert await r.guard.admit([run_of(PODS, 0, 2, pods("d"), first_offset=3)]) == []
    assert r.seeks == [(PODS, 0, 0)]


async def test_every_assignment_is_checked_afresh_and_old_generations_pass() -> None:
    """A run fetched in an earlier generation is not this assignment's start (the scheduler's
    own revocation drops what it must); a new assignment checks every partition again."""
    r = Rig(first=0)
    r.guard.assigned({(PODS, 0)}, generation=2)
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("a"))])) == [0]
    r.guard.assigned({(PODS, 0)}, generation=3)
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("b"), first_offset=1)])) == [1]
    assert await r.guard.admit([run_of(PODS, 0, 3, pods("b"), first_offset=1)]) == []
    assert r.seeks == [(PODS, 0, 0)]
    r.guard.close()
