"""The harness's garbage collection (`streams.process.quiet_gc`): the workers' young-generation
threshold, and what it holds so far out of the collector's sight."""

from __future__ import annotations

import gc

from streams.process import quiet_gc


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
