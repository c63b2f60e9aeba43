"""Child processes tied to their parent: they die when the parent dies (PR_SET_PDEATHSIG),
and are stopped with a deadline (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import ctypes
import gc
import signal
import subprocess
import sys
from collections.abc import Sequence
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

