"""Child processes tied to their parent: they die when the parent dies (PR_SET_PDEATHSIG),
and are stopped with a deadline (SIGTERM, then SIGKILL); and how a process's cyclic garbage
collector is paced (`tune_gc`, `quiet_gc`, `GcPacer`)."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn_tied(cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """Start `cmd`; the kernel kills it with SIGKILL if this process dies first."""
    return subprocess.Popen(list(cmd), preexec_fn=_die_with_parent, **kwargs)  # noqa: PLW1509


def stop(proc: subprocess.Popen[bytes], deadline_s: float = 8.0) -> int:
    """SIGTERM, wait up to `deadline_s`, then SIGKILL. Returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def quiet_gc(threshold: int) -> None:
    """For a harness that holds every pod it publishes and every record it collects: with
    Python's default thresholds, its cyclic GC took a third of its CPU in a mixed-100k run
    (full collections walking the 100,000 arrivals again and again), CPU that the workers
    beside it need on a 2-core machine. The workers' young-generation threshold, and what the
    harness holds so far (the arrivals, the modules) moved out of the collector's sight."""
    tune_gc(threshold)
    gc.freeze()


def tune_gc(threshold: int) -> None:
    """Collect the young generation every `threshold` allocations (0: Python's default)."""
    if threshold > 0:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(threshold, older, oldest)



class GcPacer:
    """Keeps a worker's long-lived state out of its garbage collector's full passes.

    A worker's tables are millions of objects that live for minutes (the owners' holds, the
    deciders' pods), and Python's collector walks all of them in each full collection: a
    mixed-100k run's state worker stopped for 1.35 s once (1.5 million objects), and its
    middle-generation passes for about 0.3 s each, pauses that every pod in flight waits out.
    Every `freeze_s` a young pass collects the garbage cycles made since the last step (a
    freeze resets the young generation's count: without it, a worker that makes fewer than
    `worker.gc_threshold` objects a step would never collect them), and what survived is moved
    out of the collector's sight (`gc.freeze`, which costs no pass), so its passes see what was
    made since. Memory is still freed by reference counting as always; only a cycle that was
    alive at a freeze and dies later waits: every `full_s` everything comes back
    (`gc.unfreeze`) for one full collection, a pause as long as the full passes were, but that
    rarely. `freeze_s` 0: Python's own pacing."""

    def __init__(self, freeze_s: float, full_s: float, clock: Callable[[], float] = time.monotonic,
                 collector: Any = gc) -> None:
        self.freeze_s = freeze_s
        self.full_s = full_s
        self.clock = clock
        self.gc = collector
        self.last_full = clock()
        self.freezes = 0
        self.full_collections = 0

    def tick(self) -> None:
        """One step: a full collection when one is due, else a freeze."""
        now = self.clock()
        if self.full_s and now - self.last_full >= self.full_s:
            self.gc.unfreeze()
            self.gc.collect()
            self.last_full = now
            self.full_collections += 1
        else:
            self.gc.collect(1)  # what the last step made: its garbage cycles, before they freeze
        self.gc.freeze()
        self.freezes += 1

    async def run(self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        if self.freeze_s <= 0:
            return
        while True:
            await sleep(self.freeze_s)
            self.tick()
