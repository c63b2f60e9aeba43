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
        self.guard = ReadFromStart(self.probe, self.seek, reread=lambda partition, topic: self.reread.append(partition), watch_every_s=3.0,
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


async def test_every_assignment_is_checked_afresh_and_runs_of_partitions_not_owned_pass() -> None:
    """A run of a partition not owned goes to the service (its own revocation drops what it
    must); a new assignment checks every partition again."""
    r = Rig(first=0)
    r.guard.assigned({(PODS, 0)}, generation=2)
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("a"))])) == [0]
    r.guard.assigned({(PODS, 0)}, generation=3)
    r.guard.assigned({(PODS, 1)}, generation=3)  # pods/1 only: a run of pods/0 is not ours
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("b"), first_offset=1)])) == [1]
    r.guard.assigned({(PODS, 0)}, generation=3)
    assert await r.guard.admit([run_of(PODS, 0, 3, pods("b"), first_offset=1)]) == []
    assert r.seeks == [(PODS, 0, 0)]
    r.guard.close()


# -- found by an adversarial review ----------------------------------------------------------


async def test_a_revoked_partition_is_neither_probed_nor_sought() -> None:
    r = Rig(first=0)
    r.guard.assigned({(PODS, 0), (PODS, 1)}, generation=2)
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("a"))])) == [0]
    r.guard.rebalanced()
    r.guard.revoked({(PODS, 1)})
    await r.tick()
    assert r.seeks == [] and r.reread == []


async def test_a_seek_refused_stays_inside_the_guard_and_is_made_again() -> None:
    """aiokafka refuses to seek a partition it no longer has (a rebalance under way): the
    error must not leave `admit` (faust would restart the agent and lose the batch's other
    runs), and the record is still awaited."""
    r = Rig(first=0)
    refused = [True]

    async def seek(topic: str, partition: int, offset: int) -> None:
        r.seeks.append((topic, partition, offset))
        if refused[0]:
            raise RuntimeError("No current assignment for partition")

    r.guard.seek = seek
    r.guard.assigned({(PODS, 0), (PODS, 1)}, generation=2)
    taken = await r.guard.admit([run_of(PODS, 1, 2, pods("x"), first_offset=5), run_of(PODS, 0, 2, pods("a", "b"))])
    assert uids(taken) == [0, 1]  # pods/0 taken though pods/1's seek failed
    refused[0] = False
    assert await r.guard.admit([run_of(PODS, 1, 2, pods("y"), first_offset=6)]) == []
    assert r.seeks == [(PODS, 1, 0), (PODS, 1, 0)]


async def test_a_first_run_checked_while_the_watch_sought_back_awaits_the_record_too() -> None:
    """The watch probed a quiet partition and sought it back while the first run's own probe
    waited: the run is taken from the awaited record, and nothing is left awaited for ever."""
    r = Rig(first=0)
    r.guard.assigned({(PODS, 0)}, generation=2)
    gate = asyncio.Event()
    inner = r.probe

    async def slow_probe(topic: str, partition: int) -> int | None:
        if not gate.is_set():
            gate.set()
            await r.guard._read_from((topic, partition), 0)  # the watch, while this probe waits
        return await inner(topic, partition)

    r.guard.probe = slow_probe
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("a", "b"))])) == [0, 1]
    assert r.guard.resume_at == {} and (PODS, 0) in r.guard.started
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("c"), first_offset=2)])) == [2]


async def test_a_run_of_an_earlier_generation_of_a_partition_owned_again_is_dropped() -> None:
    """Taken, a requeue it carries (a newer epoch) would fence the older ones that this
    generation reads again from the first record."""
    r = Rig(first=0)
    r.guard.assigned({(topics.REQUEUE, 1)}, generation=3)
    assert await r.guard.admit([run_of(topics.REQUEUE, 1, 2, pods("b"), first_offset=1)]) == []
    assert uids(await r.guard.admit([run_of(topics.REQUEUE, 1, 3, pods("a", "b"))])) == [0, 1]


async def test_a_record_fetched_before_the_seek_back_and_again_after_it_is_taken_once() -> None:
    """Seen on CI: the watch sought a quiet partition back to its first record just as that
    record arrived; the run fetched before the seek brought it, the seek brought it again, and
    a bad record was dead-lettered twice. Taken once; what comes after is taken as it comes."""
    r = Rig(first=0)
    r.guard.assigned({(PODS, 0)}, generation=2)
    r.guard.rebalanced()
    await r.tick()
    assert r.seeks == [(PODS, 0, 0)]
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("bad", "ok"))])) == [0, 1]  # fetched before the seek
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("bad", "ok", "next"))])) == [2]  # after it
    assert uids(await r.guard.admit([run_of(PODS, 0, 2, pods("later"), first_offset=3)])) == [3]
    r.guard.assigned({(PODS, 0)}, generation=3)  # a new generation reads it all again
    assert uids(await r.guard.admit([run_of(PODS, 0, 3, pods("bad", "ok"))])) == [0, 1]
    r.guard.close()
