"""An agent over a log that stands in for a Kafka partition, for the protocol's safety models
(`tests/unit/test_protocol_safety.py`, `tests/unit/test_protocol_model.py`): it takes one
record at a time, may persist its table ahead of its committed offset, commits its offset only
once its outputs are acknowledged, and on a crash goes back to the last persisted table and the
committed offset, losing whatever was not acknowledged."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from agents.ports import Output
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

    def take_timed(self, now: float) -> tuple[Record, float] | None:
        """The next input record with its log time: the time it was first read (`now` then),
        the same whenever it is read again."""
        record = self.take()
        if record is None:
            return None
        while len(self.times) < self.pos:
            self.times.append(now)
        return record, self.times[self.pos - 1]

    def take(self) -> Record | None:
        """The next input record, if any."""
        if self.pos >= len(self.log):
            return None
        self.pos += 1
        return self.log[self.pos - 1]

    def persist_state(self) -> None:
        """The table's changelog caught up; the input offset may still lag behind."""
        self.saved_state = copy.deepcopy(self.state)
        self.saved_clock = self.clock

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
        self.clock = self.saved_clock
        self.outgoing.clear()  # whatever was not yet acknowledged is lost
