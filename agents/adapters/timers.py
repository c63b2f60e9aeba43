"""Timers whose firing is a record: the wall clock stays at the edge (DESIGN.md, safety rule 1).

An agent arms a timer on the event loop for something its core asked for (a gang's waiting
time, a reservation's expiry); when it fires, the record it stands for is appended to the
agent's own input partition, where the core reads it like any other record. Timers live in
memory, each belonging to the input partition of its key, so they follow the partitions:
after every restore (every rebalance, not only the first) the agent disarms the timers of
partitions it no longer owns and re-arms one for every key of the partitions it owns, from
the restored table (`rearm`). Arming a key that is armed keeps the first timer, so partitions
kept across a rebalance keep their timers. A timer that fires for a partition this worker no
longer owns sends nothing; one whose record could not be delivered (a failed send, the
producer stopping) fires again a second later while its partition is owned here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Hashable, Iterable
from dataclasses import dataclass
from typing import Protocol

from agents.ports import Outbox, Output, deliver

log = logging.getLogger("koordstream.timers")

RETRY_S = 1.0  # a timer whose record could not be delivered fires again after this long


@dataclass(frozen=True, slots=True)
class TimerRequest:
    """What a core asks for: `output` after `delay_s`, once per `key`."""

    key: Hashable
    delay_s: float
    output: Output


class Handle(Protocol):
    def cancel(self) -> None: ...


Schedule = Callable[[float, Callable[[], object]], Handle]  # like loop.call_later


class RecordTimers:
    def __init__(self, outbox: Outbox, owned: Callable[[int], bool] = lambda partition: True,
                 schedule: Schedule | None = None) -> None:
        self.outbox = outbox
        self.owned = owned
        self._schedule = schedule
        self.armed: dict[Hashable, tuple[int, Handle]] = {}  # key -> (partition, handle)
        self.pending: set[asyncio.Task[None]] = set()
        self.fired = 0
        self.skipped = 0  # fired for a partition no longer owned
        self.failed = 0  # deliveries that failed (each tried again after RETRY_S)

    def arm(self, request: TimerRequest, partition: int) -> None:
        """Send the request's output after its delay (at once when not positive), unless its
        key is armed already."""
        if request.key in self.armed:
            return
        schedule = self._schedule or asyncio.get_running_loop().call_later
        handle = schedule(max(0.0, request.delay_s), lambda: self._fire(request, partition))
        self.armed[request.key] = (partition, handle)

    def arm_all(self, requests: Iterable[TimerRequest], partition: int) -> None:
        for request in requests:
            self.arm(request, partition)

    def retain(self, partitions: Collection[int]) -> int:
        """Disarm every timer of a partition not in `partitions`; returns how many."""
        gone = [key for key, (partition, _) in self.armed.items() if partition not in partitions]
        for key in gone:
            self.armed.pop(key)[1].cancel()
        return len(gone)

    def _fire(self, request: TimerRequest, partition: int) -> None:
        task = asyncio.get_running_loop().create_task(self.fire(request, partition))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def fire(self, request: TimerRequest, partition: int) -> None:
        self.armed.pop(request.key, None)
        if not self.owned(partition):
            self.skipped += 1
            return
        self.fired += 1
        try:
            await deliver(self.outbox, [request.output])
        except Exception as exc:  # the producer stopping (shutdown) or a failed send
            if not self.owned(partition):
                return  # the next owner arms it again from its restored table
            self.failed += 1
            log.warning("timer %r: its record was not delivered (%r); tried again in %.1f s",
                        request.key, exc, RETRY_S)
            self.arm(TimerRequest(request.key, RETRY_S, request.output), partition)


def rearm(timers: RecordTimers, partitions: Collection[int],
          requests_of: Callable[[int], Iterable[TimerRequest]]) -> None:
    """After a restore: keep only the timers of `partitions`, and arm what each of them asks
    for (`requests_of(partition)`, computed from the restored table)."""
    dropped = timers.retain(partitions)
    before = len(timers.armed)
    for partition in partitions:
        timers.arm_all(requests_of(partition), partition)
    if dropped or len(timers.armed) != before:
        log.info("timers: %d disarmed (partitions gone), %d armed for partitions %s", dropped,
                 len(timers.armed) - before, sorted(partitions))
