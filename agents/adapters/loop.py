"""The one batch loop of the stateful agents (owners and deciders).

Per micro-batch, split into runs of one input partition fetched in one consumer-group
generation (`agents.adapters.batches.Fetched`):

1. a run is processed only while this worker owns its partition in the generation it was
   fetched in (`Ownership`); otherwise it is dropped: not decided, not written, not delivered,
   its offsets never committed; whoever owns the partition now reads it again. Messages that
   come again after being processed in this assignment are skipped (`_trim`);
2. decode (bad input to the dead-letter topic, a zombie's records dropped by the input
   partition's fence: an older epoch of an origin after a newer one in that partition's log;
   the fence starts afresh whenever the partition is read again from an earlier offset), group
   by the core's key, apply the core to each key's table entry, put the new state in the table
   (in memory) and stamp the key's outputs with their origin: the input partition and the
   epoch of the generation the run was fetched in (`VersionedState.epoch`);
3. ownership is checked once more, then the sink makes the runs durable: outputs (in the
   waves `first`, `after`, `last`), changelog writes and input offsets, as one transaction per
   run on Apache Kafka (`TransactionalSink`), or, without transactions, outputs and changelog
   delivered and acknowledged before faust may commit the offsets (`PlainSink`); if the sink
   raises, the runs' messages are withheld from faust's acknowledgements (the worker then
   stops, `agents.adapters.stateful`);
4. the timers the core asked for are armed, for the runs that were made durable.

A core is a `Core`: its record kinds, its grouping key, `apply` on one key's stored state, and
the timers a restored state needs. After every restore the loop re-arms the timers of the
partitions it owns and disarms the others (`agents.adapters.timers.rearm`). When a rebalance
starts, the revocation waits for the sink's transactions in flight (faust reads the committed
offsets afterwards).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents.adapters.batches import Fetched
from agents.adapters.ownership import Ownership
from agents.adapters.tables import VersionedState
from agents.adapters.timers import RecordTimers, TimerRequest, rearm
from agents.intake import EpochFence, intake
from agents.ports import Origin, Output, Problem, stamp
from schemas.records import Record

log = logging.getLogger("koordstream.loop")


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

    def key_of(self, record: Record) -> str:
        """The table key (node, decision key) a record belongs to; keyed like the input."""
        ...

    def apply(self, key: str, stored: dict[str, Any] | None, records: list[Record], outcome: Outcome) -> dict[str, Any]:
        """Apply `records` to the key's stored state; return the new state (JSON)."""
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


class StatefulLoop:
    def __init__(self, name: str, core: Core, table: VersionedState, ownership: Ownership, sink: Sink,
                 timers: RecordTimers, seek: Seek | None = None) -> None:
        self.name = name
        self.core = core
        self.table = table
        self.ownership = ownership
        self.sink = sink
        self.timers = timers
        self.seek = seek
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

    def attach(self) -> None:
        """Follow the table's rebalances (assignment, then restore)."""
        self.table.on_assigned(self.on_assigned)
        self.table.on_restored(self.on_restored)

    async def on_revoked(self, tps: Collection[Any]) -> None:
        gone = self.ownership.revoke(tps)
        for partition in gone:
            self.next_offsets.pop(partition, None)
            self.fences.pop(partition, None)
        if gone:
            log.info("%s: partitions %s revoked", self.name, sorted(gone))
            await self.sink.quiesce(gone)

    async def on_assigned(self, assigned: set[Any], revoked: set[Any], generation: int) -> None:
        partitions = self.ownership.assign(assigned, generation)
        self.resume_at.clear()  # faust seeks every partition to its committed offset
        self.next_offsets.clear()
        self.fences.clear()
        log.info("%s: generation %s, partitions %s", self.name, generation, sorted(partitions))
        await self.sink.assigned(partitions)

    async def on_restored(self, partitions: set[int]) -> None:
        core, table = self.core, self.table
        rearm(self.timers, partitions,
              lambda p: [t for key, state in table.states([p]) for t in core.timers(key, state)])
        core.prune(table.keys())

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
        for key, records in got.grouped(self.core.key_of).items():
            first, after, last = len(outcome.first), len(outcome.after), len(outcome.last)
            state = self.core.apply(key, self.table.get(key), records, outcome)
            self.table.put(key, state, run.partition, epoch)
            stamp(outcome.first, first, origin)
            stamp(outcome.after, after, origin)
            stamp(outcome.last, last, origin)
        outputs = outcome.first + got.dead_letters + got.problem_letters(outcome.problems)
        return Work(run, epoch, outputs, outcome.after, outcome.timers, outcome.last)

    async def process(self, runs: Sequence[Fetched]) -> Flushed:
        self.batches += 1
        work = []
        for run in runs:
            if not self._live(run):
                continue
            trimmed = self._trim(run)
            if trimmed is not None:
                work.append(self.decide(trimmed))
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
            await self.rewind(w.fetched)
        return flushed

    async def rewind(self, run: Fetched) -> None:
        """Read `run` again (its batch was not made durable and the partition is still ours)."""
        self.resume_at[run.partition] = run.first_offset
        self.next_offsets[run.partition] = run.first_offset
        self.fences.pop(run.partition, None)  # read again in log order from there
        log.warning("%s: %s/%s is read again from offset %s", self.name, run.topic, run.partition, run.first_offset)
        if self.seek is not None:
            await self.seek(run.topic, run.partition, run.first_offset)
