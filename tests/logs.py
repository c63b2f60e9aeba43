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

    def take(self) -> Record | None:
        """The next input record, if any."""
        if self.pos >= len(self.log):
            return None
        self.pos += 1
        return self.log[self.pos - 1]

    def persist_state(self) -> None:
        """The table's changelog caught up; the input offset may still lag behind."""
        self.saved_state = copy.deepcopy(self.state)

    def commit(self) -> None:
        """Offset commit: only once every output is acknowledged (and the table flushed)."""
        if not self.outgoing:
            self.persist_state()
            self.saved_pos = self.pos

    def crash(self) -> None:
        self.state, self.pos = copy.deepcopy(self.saved_state), self.saved_pos
        self.outgoing.clear()  # whatever was not yet acknowledged is lost
