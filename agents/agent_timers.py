"""Timers whose firing is a record: the wall clock stays at the edge (DESIGN.md, safety rule 1).

An agent arms a timer on the event loop for something its core asked for (a gang's waiting
time, a reservation's expiry); when it fires, the record it stands for is appended to the
agent's own input partition, where the core reads it like any other record. Timers live in
memory: after a restart the agent re-arms them from its recovered table. Arming the same key
twice keeps the first timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

from agents.ports import Outbox, Output, deliver


class RecordTimers:
    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.armed: dict[Hashable, asyncio.TimerHandle] = {}

    def arm(self, key: Hashable, seconds: float, output: Output) -> None:
        """Send `output` after `seconds` (at once when not positive), unless `key` is armed."""
        if key in self.armed:
            return
        loop = asyncio.get_running_loop()
        self.armed[key] = loop.call_later(max(0.0, seconds), lambda: loop.create_task(self.fire(key, output)))

    async def fire(self, key: Hashable, output: Output) -> None:
        self.armed.pop(key, None)
        await deliver(self.outbox, [output])
