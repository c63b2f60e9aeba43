"""The scheduling queue, like kube-scheduler's: active, backoff and unschedulable pods.

- active: ordered by the QueueSort plugin (PrioritySort: priority, then arrival): a run of the
  pods that came in order (most do: new pods of one priority), popped from its front at no
  cost, and a heap for the others; `pop` takes the smaller of the two heads.
- backoff: pods that failed an attempt wait `initial x 2^(attempts-1)` seconds (capped), by
  the injected clock, then go back to active.
- unschedulable: pods that fit nowhere, each with the cluster events that could change that
  (the union of the `EVENTS` of the plugins that rejected it). `on_event` moves the pods a
  fired event concerns back (to backoff if their backoff has not expired, else active); any
  pod parked longer than `flush_s` is retried anyway, as kube-scheduler flushes after 5 min.

Entries are keyed by pod uid; stale heap entries (a pod moved or removed) are skipped on pop.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agents.ports import Clock
from agents.scheduler.cluster import ClusterEvent
from agents.scheduler.framework.interface import PodInfo

ACTIVE, BACKOFF, UNSCHEDULABLE = "active", "backoff", "unschedulable"


@dataclass
class Entry:
    info: PodInfo
    where: str
    failures: int = 0
    ready_at: float = 0.0
    events: ClusterEvent = ClusterEvent.NONE
    parked_at: float = 0.0
    ticket: int = 0  # bumps on every move, so older heap entries are recognised as stale


class SchedulingQueue:
    def __init__(self, sort_key: Callable[[PodInfo], tuple[Any, ...]], clock: Clock, *,
                 backoff_initial_s: float = 1.0, backoff_max_s: float = 10.0, flush_s: float = 300.0) -> None:
        self.sort_key = sort_key
        self.clock = clock
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.flush_s = flush_s
        self.entries: dict[str, Entry] = {}
        self._active: list[tuple[tuple[Any, ...], int, str]] = []  # a heap
        self._active_run: deque[tuple[tuple[Any, ...], int, str]] = deque()  # in order already
        self._backoff: list[tuple[float, int, str]] = []
        self._tickets = 0
        self._oldest_parked = float("inf")  # a lower bound: flushing rescans only when due

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, uid: str) -> bool:
        return uid in self.entries

    def _ticket(self, entry: Entry) -> int:
        self._tickets += 1
        entry.ticket = self._tickets
        return entry.ticket

    def add(self, info: PodInfo, *, failures: int = 0) -> None:
        """A new pod (or one back from a claim that failed) goes to active or, after
        failures, to backoff."""
        entry = Entry(info, ACTIVE, failures)
        self.entries[info.uid] = entry
        if failures:
            self._to_backoff(entry)
        else:
            self._to_active(entry)

    def update(self, info: PodInfo) -> bool:
        """A queued pod changed (e.g. its spec): keep its place; an unschedulable one retries."""
        entry = self.entries.get(info.uid)
        if entry is None:
            return False
        entry.info = info
        if entry.where == UNSCHEDULABLE:
            self._to_active(entry)
        return True

    def remove(self, uid: str) -> PodInfo | None:
        entry = self.entries.pop(uid, None)
        return entry.info if entry is not None else None

    def _to_active(self, entry: Entry) -> None:
        entry.where = ACTIVE
        item = (self.sort_key(entry.info), self._ticket(entry), entry.info.uid)
        run = self._active_run
        if not run or item > run[-1]:
            run.append(item)
        else:
            heapq.heappush(self._active, item)

    def _to_backoff(self, entry: Entry) -> None:
        entry.where = BACKOFF
        delay = min(self.backoff_max_s, self.backoff_initial_s * 2 ** min(max(entry.failures - 1, 0), 30))
        entry.ready_at = self.clock() + delay
        heapq.heappush(self._backoff, (entry.ready_at, self._ticket(entry), entry.info.uid))

    def park(self, info: PodInfo, events: ClusterEvent, failures: int) -> None:
        """The pod fits nowhere; it waits for one of `events`."""
        entry = Entry(info, UNSCHEDULABLE, failures)
        self.entries[info.uid] = entry
        entry.events = events
        entry.parked_at = self.clock()
        self._oldest_parked = min(self._oldest_parked, entry.parked_at)
        self._ticket(entry)

    def on_event(self, event: ClusterEvent) -> int:
        """Move the unschedulable pods `event` concerns; returns how many moved."""
        if not event:
            return 0
        moved = 0
        now = self.clock()
        for entry in self.entries.values():
            if entry.where == UNSCHEDULABLE and entry.events & event:
                self._wake(entry, now)
                moved += 1
        return moved

    def _wake(self, entry: Entry, now: float) -> None:
        delay = min(self.backoff_max_s, self.backoff_initial_s * 2 ** min(max(entry.failures - 1, 0), 30))
        if entry.parked_at + delay > now:
            entry.where = BACKOFF
            entry.ready_at = entry.parked_at + delay
            heapq.heappush(self._backoff, (entry.ready_at, self._ticket(entry), entry.info.uid))
        else:
            self._to_active(entry)

    def _current(self, uid: str, ticket: int, where: str) -> Entry | None:
        entry = self.entries.get(uid)
        return entry if entry is not None and entry.ticket == ticket and entry.where == where else None

    def pop(self, limit: int) -> list[PodInfo]:
        """Up to `limit` pods from active, in order, after promoting expired backoffs and
        flushing pods parked too long. Popped pods leave the queue."""
        now = self.clock()
        while self._backoff and self._backoff[0][0] <= now:
            _, ticket, uid = heapq.heappop(self._backoff)
            entry = self._current(uid, ticket, BACKOFF)
            if entry is not None:
                self._to_active(entry)
        if now - self._oldest_parked >= self.flush_s:
            self._oldest_parked = float("inf")
            for entry in self.entries.values():
                if entry.where == UNSCHEDULABLE:
                    if now - entry.parked_at >= self.flush_s:
                        self._to_active(entry)
                    else:
                        self._oldest_parked = min(self._oldest_parked, entry.parked_at)
        out: list[PodInfo] = []
        run, heap = self._active_run, self._active
        while (run or heap) and len(out) < limit:
            _, ticket, uid = run.popleft() if run and (not heap or run[0] < heap[0]) else heapq.heappop(heap)
            entry = self._current(uid, ticket, ACTIVE)
            if entry is not None:
                out.append(entry.info)
                del self.entries[uid]
        return out

    def counts(self) -> dict[str, int]:
        out = {ACTIVE: 0, BACKOFF: 0, UNSCHEDULABLE: 0}
        for e in self.entries.values():
            out[e.where] += 1
        return out

    def next_wakeup(self) -> float | None:
        """When a backoff expires or a parked pod is due for its flush."""
        times = [self._backoff[0][0]] if self._backoff else []
        if self._oldest_parked != float("inf"):
            times.append(self._oldest_parked + self.flush_s)
        return min(times) if times else None
