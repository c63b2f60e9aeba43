"""The scheduler reads each of its input partitions from the first record it still needs, in
every assignment.

The scheduler may commit, per partition of `pods` / `requeue`, the offset before which it
needs no record (`SchedulerService.commit_points`, `scheduling.commit_input_offsets`):
whenever a partition is assigned, the replica that gets it reads it from its first record,
at or after that offset if any (its "first record" below) and rebuilds that partition's queue (DESIGN.md, "Queue"). faust can lose what it fetches of a newly assigned partition around the
rebalance: records reach a stream queue that the end of the rebalance clears, or are left
behind when the flow stops, while the fetch position has moved past them; with no committed
offset, faust's seek to the committed offsets leaves the position where it is. A replacement
worker then never saw a pod that was waiting (seen on CI: the pod fits once a node is added,
and nothing places it).

`ReadFromStart` checks each partition once per assignment, as the stateful agents do against
their committed offsets (`agents.adapters.loop.StatefulLoop._starts_right`):

- the first run of a partition fetched in the current generation must not begin past the
  partition's first record (`probe`: the first record from the beginning, None when empty);
- a partition with nothing read `watch_every_s` after the rebalance ends is probed, and if it
  has records, read again from its first one.

A partition that missed its start is sought back to its first record, and what arrives before
that record comes again is dropped (fetched before the seek); when a run comes without it, or
nothing comes for `watch_every_s`, the first record is probed again and sought again (faust's
fetch loop can move its read offset past a seek with a batch fetched before it).

Within a generation no offset is taken twice: a run fetched before a seek may bring the
awaited record too, and then the seek brings it again (seen on CI: the watch sought back a
partition whose first record was arriving just then, and a bad record was dead-lettered
twice). Only what a generation took is skipped: what faust lost never reached the scheduler
and is read again. Across generations records are read again (the scheduler's adds are
idempotent by uid, its requeues by attempt; a bad record is dead-lettered again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from agents.adapters.batches import Fetched
from agents.adapters.loop import WATCH_EVERY_S, Probe, Seek
from agents.intake import RawMessage

log = logging.getLogger("koordstream.scheduler")

Key = tuple[str, int]  # (topic, partition)


class ReadFromStart:
    def __init__(self, probe: Probe, seek: Seek, reread: Callable[[int, str], None] = lambda partition, topic: None,
                 watch_every_s: float = WATCH_EVERY_S,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """`reread(partition, topic)` is told before a partition is read again from its first
        record (the scheduler's input fence for it starts afresh, and a `pods` partition waits
        until read as far as before: `SchedulerService.reread`)."""
        self.probe = probe
        self.seek = seek
        self.reread = reread
        self.watch_every_s = watch_every_s
        self.sleep = sleep
        self.generation = -1
        self.owned: set[Key] = set()
        self.started: set[Key] = set()  # read from the first record in this assignment
        self.resume_at: dict[Key, int] = {}  # sought back: the first record, awaited
        self.taken_to: dict[Key, int] = {}  # the offset after the last one this generation took
        self.restarted = 0  # partitions of an assignment read again from their first record
        self.reseeks = 0  # seeks made again while the first record was awaited
        self._arrived: set[Key] = set()  # runs came since the watch last looked
        self._watch: asyncio.Task[None] | None = None

    def assigned(self, keys: Iterable[Key], generation: int) -> None:
        """The whole assignment after a rebalance: every partition is checked afresh."""
        self.close()
        self.generation = generation
        self.owned = set(keys)
        self.started.clear()
        self.resume_at.clear()
        self.taken_to.clear()
        self._arrived.clear()

    def rebalanced(self) -> None:
        """The rebalance ends (faust resumes the partitions): the watch starts, so a partition
        is looked at only after faust had its chance to read it."""
        self.close()
        if self.owned - self.started:
            self._watch = asyncio.ensure_future(self.watch(self.generation))

    def revoked(self, keys: Iterable[Key]) -> None:
        """Partitions gone in a rebalance (before its assignment): nothing of theirs is sought
        or probed from now on."""
        for key in keys:
            self.owned.discard(key)
            self.started.discard(key)
            self.resume_at.pop(key, None)
            self.taken_to.pop(key, None)
        if not self.owned:
            self.close()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    async def admit(self, runs: Iterable[Fetched]) -> list[RawMessage]:
        """The messages of `runs` the scheduler may take, in order."""
        out: list[RawMessage] = []
        for run in runs:
            key = (run.topic, run.partition)
            self._arrived.add(key)
            if key not in self.owned:
                out += run.messages  # not this assignment's: the service drops what is revoked
            elif run.generation != self.generation:
                if not 0 <= run.generation < self.generation:
                    out += run.messages  # no generation known, or fetched just ahead of its signal
                # else fetched in an earlier generation: this one reads it again from the first
                # record (taken now, an older requeue read after a newer one would be fenced)
            elif key in self.resume_at:
                out += self._once(key, await self._resumed(key, run))
            elif key in self.started:
                out += self._once(key, run.messages)
            else:
                out += self._once(key, await self._starts_right(key, run))
        return out

    def _once(self, key: Key, messages: list[RawMessage]) -> list[RawMessage]:
        """`messages` less those this generation took already (offsets grow along a run)."""
        after = self.taken_to.get(key, -1)
        if messages and messages[0].offset < after:
            messages = [m for m in messages if m.offset >= after]
        if messages:
            self.taken_to[key] = messages[-1].offset + 1
        return messages

    async def _probe(self, key: Key, doing: str) -> tuple[bool, int | None]:
        """The partition's first record, and whether the answer still counts: not when the probe
        failed (looked at again later) or a rebalance came meanwhile (the new assignment checks
        for itself)."""
        generation = self.generation
        try:
            first = await self.probe(*key)
        except Exception as exc:  # noqa: BLE001 - see above
            log.warning("%s/%s: cannot %s (%r)", *key, doing, exc)
            return False, None
        return generation == self.generation and key in self.owned, first

    async def _starts_right(self, key: Key, run: Fetched) -> list[RawMessage]:
        """The first run of the generation: taken if it begins at the first record (taken too
        when that cannot be told now: the next run is checked instead)."""
        generation = self.generation
        counts, first = await self._probe(key, f"check where generation {generation} begins")
        if not counts:
            return run.messages
        if key in self.resume_at:  # the watch sought it back meanwhile
            return await self._resumed(key, run)
        if key in self.started or first is None or run.first_offset <= first:
            self.started.add(key)
            return run.messages
        log.warning("%s/%s: generation %s began at offset %s, past the first record (%s): read again from there",
                    *key, generation, run.first_offset, first)
        self.restarted += 1
        await self._read_from(key, first)
        return []

    async def _resumed(self, key: Key, run: Fetched) -> list[RawMessage]:
        at = self.resume_at[key]
        index = next((i for i, m in enumerate(run.messages) if m.offset == at), None)
        if index is None:
            await self._seek_again(key)
            return []
        del self.resume_at[key]
        self.started.add(key)
        return run.messages[index:]

    async def _read_from(self, key: Key, offset: int) -> None:
        """Seek back to `offset` and await it. A seek that fails (the partition left the
        consumer's assignment in a rebalance) is made again by the watch or the next run."""
        self.resume_at[key] = offset
        self.reread(key[1], key[0])
        try:
            await self.seek(*key, offset)
        except Exception as exc:  # noqa: BLE001 - never out of the agent: its batch would be lost
            log.warning("%s/%s: cannot seek to offset %s (%r)", *key, offset, exc)

    async def _seek_again(self, key: Key) -> None:
        """The awaited record did not come: probe the first record again (retention may have
        removed the one awaited) and seek there."""
        generation = self.generation
        try:
            first = await self.probe(*key)
        except Exception as exc:  # noqa: BLE001 - sought again from the offset awaited
            log.warning("%s/%s: cannot find the first record again (%r)", *key, exc)
            first = self.resume_at.get(key)
        if generation != self.generation or key not in self.resume_at:
            return
        self.reseeks += 1
        if first is None:  # emptied meanwhile: nothing to read again
            del self.resume_at[key]
            self.started.add(key)
            return
        await self._read_from(key, first)

    async def watch(self, generation: int) -> None:
        """Until every partition of the assignment is read from its first record: every
        `watch_every_s`, a partition that nothing came from is probed, and read again from its
        first record if it has one; one that awaits its first record is sought again."""
        while generation == self.generation and (self.owned - self.started):
            await self.sleep(self.watch_every_s)
            if generation != self.generation:
                return
            quiet = (self.owned - self.started) - self._arrived
            self._arrived.clear()
            for key in sorted(quiet):
                if key in self.resume_at:
                    await self._seek_again(key)
                    continue
                counts, first = await self._probe(key, "look for unread records")
                if not counts or generation != self.generation or key in self.started or key in self.resume_at:
                    continue
                if first is None:
                    self.started.add(key)  # empty: what comes later is fetched as it comes
                    continue
                log.warning("%s/%s: nothing read %ss after the rebalance, though records wait from "
                            "offset %s: read again from there", *key, self.watch_every_s, first)
                self.restarted += 1
                await self._read_from(key, first)
