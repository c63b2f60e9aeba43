"""Garbage collection: the harness's (`streams.process.quiet_gc`: the workers' young-generation
threshold, and what it holds so far out of the collector's sight) and the workers' pacing
(`GcPacer`: what survived frozen at each step, everything collected once per full period)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from streams.process import GcPacer, quiet_gc


def test_quiet_gc_raises_the_young_threshold_and_freezes_what_is_held() -> None:
    before = gc.get_threshold()
    held = [{"pod": i} for i in range(1000)]
    try:
        quiet_gc(50_000)
        assert gc.get_threshold() == (50_000, *before[1:])
        assert gc.get_freeze_count() >= len(held)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


class Collector:
    """What `GcPacer` asks of the `gc` module, recorded (a real freeze would hide this test
    process's objects from its collector)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")

    def collect(self, generation: int = 2) -> int:
        self.calls.append("collect" if generation == 2 else f"collect{generation}")
        return 0


def test_the_pacer_freezes_at_each_step_and_collects_everything_once_per_full_period() -> None:
    now = [0.0]
    collector = Collector()
    pacer = GcPacer(freeze_s=1.0, full_s=10.0, clock=lambda: now[0], collector=collector)
    for _ in range(25):
        now[0] += 1.0
        pacer.tick()
    assert pacer.freezes == 25 and pacer.full_collections == 2
    assert collector.calls.count("freeze") == 25
    assert collector.calls.count("collect1") == 23  # a young pass before every other freeze
    # every full collection comes after everything was given back, and is followed by a freeze
    full = [i for i, c in enumerate(collector.calls) if c == "collect"]
    assert [collector.calls[i - 1] for i in full] == ["unfreeze", "unfreeze"]
    assert [collector.calls[i + 1] for i in full] == ["freeze", "freeze"]


def test_a_pacer_that_is_off_returns_at_once_and_one_that_is_on_steps_after_each_sleep() -> None:
    collector = Collector()
    asyncio.run(GcPacer(freeze_s=0.0, full_s=10.0, collector=collector).run())
    assert collector.calls == []

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) > 3:
            raise asyncio.CancelledError

    pacer = GcPacer(freeze_s=0.5, full_s=0.0, collector=collector)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(pacer.run(sleep))
    assert slept == [0.5] * 4 and collector.calls == ["collect1", "freeze"] * 3  # full_s 0: never a full one


def test_a_real_freeze_hides_what_survived_and_a_full_step_gives_it_back() -> None:
    held = [{"pod": i} for i in range(1000)]
    pacer = GcPacer(freeze_s=1.0, full_s=5.0, clock=lambda: 0.0)
    try:
        pacer.tick()
        assert gc.get_freeze_count() >= len(held)
        pacer.last_full = -10.0  # a full collection due
        pacer.tick()
        assert pacer.full_collections == 1 and gc.get_freeze_count() >= len(held)  # frozen again after it
    finally:
        gc.unfreeze()


def test_garbage_cycles_made_between_steps_are_collected_though_fewer_than_the_threshold() -> None:
    """A freeze resets the young generation's count: a worker making fewer objects a step than
    `worker.gc_threshold` would otherwise never collect its cycles until the full period."""
    before = gc.get_threshold()
    pacer = GcPacer(freeze_s=1.0, full_s=3600.0, clock=lambda: 0.0)
    try:
        gc.set_threshold(50_000, *before[1:])
        pacer.tick()
        collected: list[int] = []

        def count(phase: str, info: dict[str, int]) -> None:
            if phase == "stop":
                collected.append(info["collected"])

        gc.callbacks.append(count)
        try:
            for _ in range(3):
                for _ in range(100):  # cycles, far fewer objects than the threshold
                    a: list[Any] = []
                    a.append(a)
                del a
                pacer.tick()
        finally:
            gc.callbacks.remove(count)
        assert sum(collected) >= 300
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
