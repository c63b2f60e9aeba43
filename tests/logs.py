"""An agent over a log that stands in for a Kafka partition, for the protocol's safety models
(`tests/unit/test_protocol_safety.py`, `tests/unit/test_protocol_model.py`): it takes one
record at a time, may persist its table ahead of its committed offset, commits its offset only
once its outputs are acknowledged, and on a crash goes back to the last persisted table and the
committed offset, losing whatever was not acknowledged."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from agents.ports import Output
from agents.state.retention import judged_at
from schemas.records import Record


@dataclass
class Actor:
    log: list[Record] = field(default_factory=list)
    pos: int = 0
    state: object = None
    saved_state: object = None
    saved_pos: int = 0
    outgoing: list[Output] = field(default_factory=list)  # produced, not yet on the broker
    times: list[float] = field(default_factory=list)  # log times of the records read so far
    clock: float = 0.0  # the newest log time decided (the loop's partition clock, in the table)
    saved_clock: float = 0.0
    stamps: dict[int, float] = field(default_factory=dict)  # log index -> the log time its producer stamped
    covered: int = 0  # records the state has decided (the loop's `decided` offset, with the clock)
    saved_covered: int = 0
    in_flight: set[str] = field(default_factory=set)  # what the batch in flight sent (`batch`)

    def batch(self) -> set[str]:
        """The batch a record taken now belongs to, for `Decider.apply` (the gang rounds it
        sent): the one whose outputs are not all acknowledged yet, else a new one. The loop
        decides a batch only once the last one's outputs are acknowledged; here a record at a
        time, so the records decided while outputs wait are one batch."""
        if not self.outgoing:
            self.in_flight = set()
        return self.in_flight

    def append(self, record: Record, stamped: float | None = None) -> None:
        """A record produced to the log; `stamped`: its log time, as a producer's clock set it
        (by default the time it is first read)."""
        if stamped is not None:
            self.stamps[len(self.log)] = stamped
        self.log.append(record)

    def take_timed(self, now: float) -> tuple[Record, float] | None:
        """The next input record with its log time: the time it was first read (`now` then),
        the same whenever it is read again."""
        record = self.take()
        if record is None:
            return None
        while len(self.times) < self.pos:
            self.times.append(self.stamps.get(len(self.times), now))
        return record, self.times[self.pos - 1]

    def judge(self, t: float, edge: float) -> float:
        """The record just taken, with log time `t`, as the loop judges it in a run of its own
        (`agents.state.retention.judged_at`, `edge`: the reader's wall clock plus the skew it
        admits); the clock moves to it."""
        replayed = self.pos - 1 < self.covered
        self.clock = judged_at(t, self.clock, edge, replayed)
        self.covered = max(self.covered, self.pos)
        return self.clock

    def take(self) -> Record | None:
        """The next input record, if any."""
        if self.pos >= len(self.log):
            return None
        self.pos += 1
        return self.log[self.pos - 1]

    def persist_state(self) -> None:
        """The table's changelog caught up; the input offset may still lag behind."""
        self.saved_state = copy.deepcopy(self.state)
        self.saved_clock, self.saved_covered = self.clock, self.covered

    def commit(self) -> None:
        """Offset commit: only once every output is acknowledged (and the table flushed)."""
        if not self.outgoing:
            self.persist_state()
            self.saved_pos = self.pos

    def abort(self) -> None:
        """A transaction aborted (or a producer replaced) with the partition still ours: read
        again from the committed offset, with the table as it is in memory (ahead of the
        changelog); what was not yet acknowledged is lost."""
        self.pos = self.saved_pos
        self.outgoing.clear()

    def crash(self) -> None:
        self.state, self.pos = copy.deepcopy(self.saved_state), self.saved_pos
        self.clock, self.covered = self.saved_clock, self.saved_covered
        self.outgoing.clear()  # whatever was not yet acknowledged is lost
