"""The one batch loop of the stateful agents (owners and deciders).

Per micro-batch, split into runs of one input partition fetched in one consumer-group
generation (`agents.adapters.batches.Fetched`):

1. a run is processed only while this worker owns its partition in the generation it was
   fetched in (`Ownership`); otherwise it is dropped: not decided, not written, not delivered,
   its offsets never committed; whoever owns the partition now reads it again. The first
   run of a partition in an assignment must not begin past the first record after the
   group's committed offset (`_starts_right`; else the partition is read again from there).
   Messages that come again after being processed in this assignment are skipped (`_trim`);
2. decode (bad input to the dead-letter topic, a zombie's records dropped by the input
   partition's fence: an older epoch of an origin after a newer one in that partition's log;
   the fence starts afresh whenever the partition is read again from an earlier offset), group
   by the core's key, apply the core to each key's table entry, put the new state in the table
   (in memory; a key the core returns nothing for is deleted, and its changelog gets a
   tombstone) and stamp the key's outputs with their origin: the input partition and the
   epoch of the generation the run was fetched in (`VersionedState.epoch`). Each record goes
   in with its log time as `agents.state.retention.judged_at` bounds it (never before the
   partition's clock, never more than `max_skew_s` ahead of this worker's clock read at intake,
   and a record decided already at the clock), and the run with the newest of them (`now`):
   then the keys of the partition that `Core.expires` said have something to forget by `now`
   are applied with no records (docs/architecture.md, "How time enters", "How long state is
   kept");
3. ownership is checked once more, then the sink makes the runs durable: outputs (in the
   waves `first`, `after`, `last`), changelog writes and input offsets, as one transaction per
   run on Apache Kafka (`TransactionalSink`), or, without transactions, outputs and changelog
   delivered and acknowledged before faust may commit the offsets (`PlainSink`); if the sink
   raises (or a core raised in step 2), the runs' messages are withheld from faust's
   acknowledgements (the worker then stops, `agents.adapters.stateful`);
4. the timers the core asked for are armed, for the runs that were made durable.

A core is a `Core`: its record kinds, its grouping key, `apply` on one key's stored state, and
the timers a restored state needs. After every restore the loop re-arms the timers of the
partitions it owns and disarms the others (`agents.adapters.timers.rearm`). When a rebalance
starts, the revocation waits for the sink's transactions in flight (faust reads the committed
offsets afterwards).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents.adapters.batches import Fetched
from agents.adapters.ownership import Ownership
from agents.adapters.tables import VersionedState
from agents.adapters.timers import RecordTimers, TimerRequest, rearm
from agents.intake import EpochFence, RawMessage, intake
from agents.ports import Origin, Output, Problem, stamp
from agents.state.retention import DEFAULT_MAX_SKEW_S, judged_at
from schemas.records import Record

log = logging.getLogger("koordstream.loop")

WATCH_EVERY_S = 3.0  # after a restore: how often a partition with nothing read yet is looked at
SWEEP_LIMIT = 2000  # keys with something to forget that one run applies at most (the rest wait for the next)


@dataclass
class Outcome:
    """What a core decided for a run, in three waves. Without transactions `first` is
    acknowledged by the broker before `after` is sent (deciders: Commits before Bindings), and
    `after` before `last` (deciders: the PodTerminated of a pod whose Binding is in `after`:
    a termination follows its Binding); in a transaction all become visible together, in that
    order."""

    first: list[Output] = field(default_factory=list)
    after: list[Output] = field(default_factory=list)
    last: list[Output] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    timers: list[TimerRequest] = field(default_factory=list)


class Core(Protocol):
    """A decision core as the loop drives it (see `agents.adapters.owners`, `.deciders`)."""

    kinds: tuple[type[Record], ...]
    split: tuple[str, ...]  # fields of its states that are maps written entry by entry (`tables`)

    def key_of(self, record: Record) -> str:
        """The table key (node, decision key) a record belongs to; keyed like the input."""
        ...

    def apply(self, key: str, stored: dict[str, Any] | None, records: list[Record], times: list[float],
              now: float, outcome: Outcome) -> dict[str, Any] | None:
        """Apply `records` (each with its time in the log, `times`) to the key's stored state,
        at `now` (the newest log time of the run: what finished a retention before it may be
        forgotten); return the new state (JSON), or None when nothing of the key is left."""
        ...

    def expires(self, key: str, state: dict[str, Any]) -> float:
        """The log time after which the key has something to forget (0: nothing): the loop
        then applies it with no records in the next run of its partition that is read later."""
        ...

    def timers(self, key: str, state: dict[str, Any]) -> list[TimerRequest]:
        """The timers a restored state needs (waiting gangs, available reservations)."""
        ...

    def prune(self, keys: Collection[str]) -> None:
        """Forget whatever the core keeps for keys other than `keys` (after a restore)."""
        ...


@dataclass
class Work:
    """One run, decided: what its sink makes durable."""

    fetched: Fetched
    epoch: int
    first: list[Output]
    after: list[Output]
    timers: list[TimerRequest]
    last: list[Output] = field(default_factory=list)

    @property
    def partition(self) -> int:
        return self.fetched.partition


@dataclass
class Flushed:
    """What a sink did with the runs it was given."""

    durable: list[Work] = field(default_factory=list)
    lost: list[Work] = field(default_factory=list)  # the partition went to another worker
    failed: list[Work] = field(default_factory=list)  # not durable, partition still ours: read again


class Sink(Protocol):
    async def assigned(self, partitions: set[int]) -> None:
        """The partitions owned after a rebalance (before their restore starts)."""
        ...

    async def flush(self, work: Sequence[Work]) -> Flushed: ...

    async def quiesce(self, partitions: set[int]) -> None:
        """A rebalance starts: let what is being made durable for `partitions` finish."""
        ...

    async def close(self) -> None: ...


Seek = Callable[[str, int, int], Awaitable[None]]  # (topic, partition, offset): read again from there
# (topic, partition) -> the offset of the first record at or after the group's committed offset
# of that partition (None: no record there yet). See `StatefulLoop._starts_right`.
Probe = Callable[[str, int], Awaitable[int | None]]


class StatefulLoop:
    def __init__(self, name: str, core: Core, table: VersionedState, ownership: Ownership, sink: Sink,
                 timers: RecordTimers, seek: Seek | None = None, probe: Probe | None = None,
                 max_skew_s: float = DEFAULT_MAX_SKEW_S) -> None:
        self.name = name
        self.core = core
        self.table = table
        self.ownership = ownership
        self.sink = sink
        self.timers = timers
        self.seek = seek
        self.probe = probe
        self.started: dict[int, int] = {}  # partition -> the generation whose start was checked
        self.unchecked: set[int] = set()  # partitions read again because their check failed
        self.restarted = 0  # assignments that began past the committed offset, read again from there
        self.reseeks = 0  # seeks made again while a rewind waited for its record
        self.watch_every_s = WATCH_EVERY_S
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self._watches: set[asyncio.Future[None]] = set()
        # One fence per input partition, started afresh whenever the partition is read again from
        # an earlier offset (an assignment seeks it to its committed offset; a rewind). A fence
        # orders records by their position in one partition's log: outputs of one origin reach
        # every partition of the input topic (owners' Helds go to any `holds` partition,
        # deciders' Commits to any `node-inbox` one), and across partitions, or across a seek
        # back, an older epoch read after a newer one is no zombie's.
        self.fences: dict[int, EpochFence] = {}
        self.resume_at: dict[int, int] = {}  # partition -> the offset a rewind reads from again
        self.next_offsets: dict[int, int] = {}  # partition -> the offset after the last one processed
        self.batches = 0
        self.repeated = 0  # messages fetched again after being processed in this assignment
        self.expiring: dict[int, list[tuple[float, str]]] = {}  # partition -> heap of (log time, key)
        self.swept = 0  # keys applied with no records because they had something to forget
        self.max_skew_s = max_skew_s  # how far ahead of `wall` a record's log time is believed
        self.wall: Callable[[], float] = time.time  # read at intake, once per run (`decide`)
        self.future = 0  # records stamped further ahead than that, judged at the bound

    def attach(self) -> None:
        """Follow the table's rebalances (assignment, then restore)."""
        self.table.on_assigned(self.on_assigned)
        self.table.on_restored(self.on_restored)

    async def on_revoked(self, tps: Collection[Any]) -> None:
        gone = self.ownership.revoke(tps)
        for partition in gone:
            self.next_offsets.pop(partition, None)
            self.fences.pop(partition, None)
            self.expiring.pop(partition, None)
        if gone:
            log.info("%s: partitions %s revoked", self.name, sorted(gone))
            await self.sink.quiesce(gone)

    async def on_assigned(self, assigned: set[Any], revoked: set[Any], generation: int) -> None:
        partitions = self.ownership.assign(assigned, generation)
        self.resume_at.clear()  # faust seeks every partition to its committed offset
        self.next_offsets.clear()
        self.started.clear()
        self.unchecked.clear()
        self.fences.clear()
        log.info("%s: generation %s, partitions %s", self.name, generation, sorted(partitions))
        await self.sink.assigned(partitions)

    async def on_restored(self, partitions: set[int]) -> None:
        core, table = self.core, self.table
        rearm(self.timers, partitions,
              lambda p: [t for key, state in table.states([p]) for t in core.timers(key, state)])
        core.prune(table.keys())
        self.expiring = {}
        for partition in partitions:
            for key, state in table.states([partition]):
                self._expiring(partition, key, state)
        if self.probe is not None and partitions:
            task = asyncio.ensure_future(self.watch_starts({p: self.ownership.owned.get(p, -1) for p in partitions}))
            self._watches.add(task)
            task.add_done_callback(self._watches.discard)

    async def watch_starts(self, assignment: dict[int, int]) -> None:
        """After a restore, until each partition of `assignment` (partition -> generation) has
        had a run checked (`_starts_right`), look every `watch_every_s` whether it has records
        after the group's committed offset; if so, read it again from the first of them. faust
        can drop every record of a newly assigned partition up to its log end (its fetch loop
        moves its read offset past its own seek with a batch fetched before the seek), and then
        no run comes that `_starts_right` could check: the partition would wait for new records
        while those already there were never decided (seen as a new state worker that never
        answered the claims published before it joined). Each partition is looked at once (again
        if the look failed)."""
        pending = dict(assignment)
        while pending:
            await self.sleep(self.watch_every_s)
            for partition, generation in list(pending.items()):
                if not self._unread(partition, generation):
                    del pending[partition]  # gone, or its first run came and was checked
                    continue
                try:
                    first = await self.probe(self.ownership.topic, partition) if self.probe else None
                except Exception as exc:  # noqa: BLE001 - looked at again next time
                    log.warning("%s: %s/%s: cannot look for undecided records (%r)", self.name,
                                self.ownership.topic, partition, exc)
                    continue
                # Nothing after the committed offset: nothing to lose (what comes later is fetched
                # after faust's seek). Otherwise read again from the first record, unless its
                # run came meanwhile.
                del pending[partition]
                if first is None or not self._unread(partition, generation):
                    continue
                self.restarted += 1
                log.warning("%s: %s/%s: nothing read %ss after the restore, though records wait from offset %s: "
                            "read again from there", self.name, self.ownership.topic, partition,
                            self.watch_every_s, first)
                await self._read_from(self.ownership.topic, partition, first)

    def _unread(self, partition: int, generation: int) -> bool:
        """Still owned in `generation`, no run checked yet, and no read-again under way."""
        return (self.ownership.owns(partition, generation) and self.started.get(partition) != generation
                and partition not in self.resume_at)

    async def run(self, batches: AsyncIterator[list[Fetched]]) -> None:
        async for runs in batches:
            await self.process(runs)

    def _live(self, run: Fetched) -> bool:
        if self.ownership.owns(run.partition, run.generation):
            return True
        self.ownership.dropped += len(run.messages)
        run.withhold_acks()
        log.info("%s: dropped %d messages of %s/%s from offset %s: fetched in generation %s, owned now: %s",
                 self.name, len(run.messages), run.topic, run.partition, run.first_offset, run.generation,
                 self.ownership.owned.get(run.partition))
        return False

    def _trim(self, run: Fetched) -> Fetched | None:
        """The part of `run` not processed yet in this assignment, in offset order.

        faust resumes a newly assigned partition before its seek to the committed offset has
        finished, so what it fetched first can come again after the seek (and both copies can
        meet in one run): messages below the offset after the last one processed are skipped.
        After a rewind, what was fetched before it is skipped until the rewound offset is back.
        """
        messages, events = run.messages, run.events
        rewound = self.resume_at.get(run.partition)
        if rewound is not None:
            back = [i for i, m in enumerate(messages) if m.offset == rewound]
            if not back:
                return None
            del self.resume_at[run.partition]
            for event in events[:back[0]]:  # fetched before the seek: never acknowledged
                event.message.acked = True
            messages, events = messages[back[0]:], events[back[0]:]
        last = self.next_offsets.get(run.partition, 0) - 1
        keep = []
        for i, message in enumerate(messages):
            if message.offset > last:
                keep.append(i)
                last = message.offset
        if len(keep) < len(messages):
            self.repeated += len(messages) - len(keep)
            log.info("%s: skipped %d messages of %s/%s fetched again after they were processed", self.name,
                     len(messages) - len(keep), run.topic, run.partition)
        if not keep:
            return None
        if len(keep) == len(run.messages):
            return run
        return Fetched(run.topic, run.partition, run.generation, [messages[i] for i in keep],
                       [events[i] for i in keep])

    def decide(self, run: Fetched) -> Work:
        fence = self.fences.setdefault(run.partition, EpochFence())
        got = intake(run.messages, expect=self.core.kinds, fence=fence)
        epoch = self.table.epoch(run.partition, run.generation)
        origin = Origin(f"{run.topic}/{run.partition}", epoch)
        outcome = Outcome()
        # Log times never go back within a partition's decisions: a record read again after a
        # crash is judged as late as the latest decided before it, and one decided already at
        # that clock (the clock is in the table); a record stamped ahead of this worker's clock
        # by more than the admitted skew is judged at that bound (`retention.judged_at`; the
        # wall clock is read here, at intake, once per run, never inside a decision).
        floor, decided = self.table.clock(run.partition), self.table.decided(run.partition)
        edge = self.wall() + self.max_skew_s

        def judged(m: RawMessage | None) -> float:
            return floor if m is None else judged_at(m.timestamp, floor, edge, m.offset < decided)

        now = max([floor, *(judged(m) for m in run.messages)])
        self._count_future(run, decided, edge)
        groups = got.grouped(self.core.key_of)
        for key, records in groups.items():
            times = [judged(got.sources.get(id(r))) for r in records]
            self._apply(run.partition, epoch, key, records, times, now, outcome, origin)
        heap = self.expiring.get(run.partition, [])
        swept = 0
        while heap and heap[0][0] < now and swept < SWEEP_LIMIT:
            key = heapq.heappop(heap)[1]
            state = self.table.get(key) if key not in groups else None
            if state is not None and 0 < self.core.expires(key, state) < now:  # still due (not a stale entry)
                self._apply(run.partition, epoch, key, [], [], now, outcome, origin)
                swept += 1
        self.swept += swept
        self.table.advance(run.partition, now, epoch, run.next_offset)
        outputs = outcome.first + got.dead_letters + got.problem_letters(outcome.problems)
        return Work(run, epoch, outputs, outcome.after, outcome.timers, outcome.last)

    def _count_future(self, run: Fetched, decided: int, edge: float) -> None:
        ahead = [m.timestamp for m in run.messages if m.timestamp > edge and m.offset >= decided]
        if ahead:
            self.future += len(ahead)
            log.warning("%s: %s/%s: %d records stamped more than %ss ahead of this worker's clock (the furthest "
                        "by %.1fs), from offset %s: judged at that bound (a producer's clock runs ahead?)",
                        self.name, run.topic, run.partition, len(ahead), self.max_skew_s,
                        max(ahead) - edge + self.max_skew_s, run.first_offset)

    def _apply(self, partition: int, epoch: int, key: str, records: list[Record], times: list[float], now: float,
               outcome: Outcome, origin: Origin) -> None:
        first, after, last = len(outcome.first), len(outcome.after), len(outcome.last)
        state = self.core.apply(key, self.table.get(key), records, times, now, outcome)
        if state is not None:
            self.table.put(key, state, partition, epoch)
            self._expiring(partition, key, state)
        elif self.table.raw(key) is not None:
            self.table.delete(key, partition)
        stamp(outcome.first, first, origin)
        stamp(outcome.after, after, origin)
        stamp(outcome.last, last, origin)

    def _expiring(self, partition: int, key: str, state: dict[str, Any]) -> None:
        at = self.core.expires(key, state)
        if at:
            heapq.heappush(self.expiring.setdefault(partition, []), (at, key))

    async def process(self, runs: Sequence[Fetched]) -> Flushed:
        self.batches += 1
        work = []
        try:
            for run in runs:
                if not self._live(run):
                    continue
                if self.started.get(run.partition) != run.generation and not await self._starts_right(run):
                    continue
                trimmed = self._trim(run)
                if trimmed is not None:
                    work.append(self.decide(trimmed))
                elif run.partition in self.resume_at:
                    await self._still_waiting(run)
        except BaseException:
            # A core failed (a bug, or a stored state it cannot read): nothing of this batch may
            # be acknowledged, and its table changes in memory are not durable. The worker stops
            # (`agents.adapters.stateful`); the next owner reads the batch again.
            for run in runs:
                run.withhold_acks()
                self.table.discard(run.partition)
            raise
        live = []
        for w in work:  # the last look before anything leaves: revoked meanwhile -> dropped
            if self._live(w.fetched):
                live.append(w)
            else:
                self.table.discard(w.partition)
        if not live:
            return Flushed()
        try:
            flushed = await self.sink.flush(live)
        except BaseException:
            # Not made durable, or not known to be: faust acknowledges a batch's messages when
            # the loop body ends, even by an exception (and commits them, on stop too), so these
            # would be skipped for good. Withheld, they are read again from the committed offset.
            for w in live:
                w.fetched.withhold_acks()
            raise
        for w in flushed.durable:
            self.next_offsets[w.partition] = max(self.next_offsets.get(w.partition, 0), w.fetched.next_offset)
            if w.timers:
                self.timers.arm_all(w.timers, w.partition)
                log.info("%s: %d timers asked for by %s/%s", self.name, len(w.timers), w.fetched.topic, w.partition)
        for w in flushed.failed:
            if self.ownership.owns(w.partition, w.fetched.generation):  # else the next owner reads it
                await self.rewind(w.fetched)
        return flushed

    async def _starts_right(self, run: Fetched) -> bool:
        """The first run of a partition in an assignment must not begin past the first record
        after the group's committed offset, or the records between would never be decided:
        whoever owned the partition before did not decide them, and this worker would commit
        offsets past them. A chaos run on Apache Kafka saw it: a running worker that took over
        the partitions of a killed one began one of them at its end (the claims of the seconds
        between the kill and the rebalance never answered, their holds leaked). So the start is
        checked once per assignment against `probe` (the committed offset, and the first record
        at or after it: records of a transactional topic sit between commit and abort markers,
        so that record may lie past the committed offset), and read again from there if need be.
        A run that starts earlier is fine: what it repeats, the cores answer from their records.
        """
        partition = run.partition
        if self.probe is None or (partition in self.resume_at and partition not in self.unchecked):
            self.started[partition] = run.generation  # a rewind of ours: it starts where we know
            return True
        try:
            first = await self.probe(run.topic, partition)
        except Exception as exc:  # noqa: BLE001 - unknown: read the run again and check then
            if not self.ownership.owns(partition, run.generation):
                run.withhold_acks()  # a rebalance meanwhile: the new assignment checks for itself
                return False
            log.warning("%s: %s/%s: cannot check where generation %s begins (%r): read again", self.name,
                        run.topic, partition, run.generation, exc)
            run.withhold_acks()
            self.unchecked.add(partition)
            await self._read_from(run.topic, run.partition, run.first_offset)
            return False
        if not self.ownership.owns(partition, run.generation):
            run.withhold_acks()  # revoked or reassigned while the probe ran: nothing of it leaks
            return False
        self.unchecked.discard(partition)
        self.started[partition] = run.generation
        if first is None or run.first_offset <= first:
            return True
        self.restarted += 1
        log.warning("%s: %s/%s: generation %s began at offset %s, past the first record after the committed "
                    "offset (%s): read again from there", self.name, run.topic, partition, run.generation,
                    run.first_offset, first)
        run.withhold_acks()
        await self._read_from(run.topic, run.partition, first)
        return False

    async def _read_from(self, topic: str, partition: int, offset: int) -> None:
        """Skip what was fetched until the record at `offset` comes again, and seek there."""
        self.resume_at[partition] = offset
        self.next_offsets[partition] = offset
        self.fences.pop(partition, None)  # read again in log order from there
        if self.seek is not None:
            await self.seek(topic, partition, offset)

    async def _still_waiting(self, run: Fetched) -> None:
        """A run without the record a rewind waits for: fetched before the seek, or after it
        while faust dropped the records below its read offset (faust's fetch loop goes on with
        the rest of a batch fetched before a seek and moves its read offset past the seek's).
        Not acknowledged, and the seek is made again, so the record comes (it is the first
        record at or after that offset, so the next fetch from there begins with it)."""
        run.withhold_acks()
        self.reseeks += 1
        if self.seek is not None:
            await self.seek(run.topic, run.partition, self.resume_at[run.partition])

    async def rewind(self, run: Fetched) -> None:
        """Read `run` again (its batch was not made durable and the partition is still ours)."""
        log.warning("%s: %s/%s is read again from offset %s", self.name, run.topic, run.partition, run.first_offset)
        await self._read_from(run.topic, run.partition, run.first_offset)
