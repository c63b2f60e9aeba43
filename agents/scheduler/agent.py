"""faust side of the scheduler: the pods/requeue agent and the scheduling loop.

The agent only decodes and enqueues (pods, deletions, requeues); the loop places ready pods
in micro-batches whenever the queue has work, and wakes on new pods, on cluster events from
the replica feed, and when a backoff expires. `SchedulerService.on_state_changes` is called
by the replica feed in `streams` (it reads every `state-changes` partition, no group).

Profiling: about once a second while it schedules, the loop publishes on `profiling` one
ProfilingSample per (profile, plugin, extension point) with the time spent there since the
last ones (the frameworks' own timings; nothing is sampled when nothing ran), and one
AttemptsSample per (profile, result) with the scheduling attempts made since.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

import faust

from agents.agent_batches import micro_batches
from agents.intake import EpochFence, RawMessage, intake
from agents.ports import AgentConfig, Clock, Outbox, Output, deliver
from agents.scheduler.core import SchedulerCore
from schemas import topics
from schemas.records import (
    AttemptsSample,
    NodeStateChange,
    Pod,
    PodDeleted,
    ProfilingSample,
    Requeue,
    Reservation,
)

PROFILING_EVERY_S = 1.0


class SchedulerService:
    def __init__(self, core: SchedulerCore, outbox: Outbox, clock: Clock, batch_size: int) -> None:
        self.core = core
        self.outbox = outbox
        self.clock = clock
        self.batch_size = batch_size
        self._profiled: dict[tuple[str, str, str], int] = {}  # (profile, plugin, point) -> ns sent
        self._attempts_sent: dict[tuple[str, str], int] = {}  # (profile, result) -> attempts sent
        self._profiled_at = 0.0
        self.wake = asyncio.Event()
        self.replica_ready = asyncio.Event()  # set once the replica caught up with history
        self.fence = EpochFence()  # drops state changes a zombie owner published

    def mark_replica_ready(self) -> None:
        """The feed has read `state-changes` up to where it stood at start-up."""
        self.replica_ready.set()
        self.wake.set()

    async def on_state_changes(self, messages: Iterable[RawMessage]) -> None:
        got = intake(messages, expect=(NodeStateChange,), fence=self.fence)
        self.core.apply_state_changes(r for r in got.records if isinstance(r, NodeStateChange))
        if got.dead_letters:
            await deliver(self.outbox, got.dead_letters)
        self.wake.set()

    async def on_inputs(self, messages: Iterable[RawMessage]) -> None:
        got = intake(messages, expect=(Pod, PodDeleted, Requeue, Reservation))
        outputs: list[Output] = list(got.dead_letters)
        for record in got.records:
            if isinstance(record, Pod):
                outputs += self.core.add(record)
            elif isinstance(record, Reservation):
                outputs += self.core.add_reservation(record)
            elif isinstance(record, PodDeleted):
                outputs += self.core.delete(record)
            elif isinstance(record, Requeue):
                self.core.requeue(record)
        if outputs:
            await deliver(self.outbox, outputs)
        self.wake.set()

    def profiling_samples(self) -> list[Output]:
        """What each plugin spent per extension point, and the attempts made, since the last samples."""
        out = []
        for name, fw in self.core.frameworks.items():
            for (plugin, point), ns in fw.timings.items():
                key = (name, plugin, point)
                delta = ns - self._profiled.get(key, 0)
                if delta > 0:
                    self._profiled[key] = ns
                    out.append(Output(topics.PROFILING, plugin, ProfilingSample(
                        profile=name, plugin=plugin, extension_point=point, duration_ns=delta)))
        for (profile, result), count in self.core.attempts.items():
            delta = count - self._attempts_sent.get((profile, result), 0)
            if delta > 0:
                self._attempts_sent[profile, result] = count
                out.append(Output(topics.PROFILING, profile, AttemptsSample(profile=profile, result=result, count=delta)))
        return out

    async def run(self) -> None:
        """The scheduling loop; runs until cancelled.

        It starts placing pods only once the replica has caught up with the state-changes
        history, so a restarted worker does not place pods on a cluster it has not read yet.
        """
        await self.replica_ready.wait()
        while True:
            self.wake.clear()
            outputs = self.core.schedule(self.batch_size)
            if outputs and self.clock() - self._profiled_at >= PROFILING_EVERY_S:
                self._profiled_at = self.clock()
                outputs += self.profiling_samples()
            if outputs:
                await self.outbox.send(outputs)
                await asyncio.sleep(0)
                continue
            samples = self.profiling_samples()  # idle: what the last busy stretch spent
            if samples:
                self._profiled_at = self.clock()
                await self.outbox.send(samples)
            wakeup = self.core.next_wakeup()
            timeout = None if wakeup is None else max(0.0, wakeup - self.clock())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)


def register(app: faust.App, inputs: faust.TopicT, service: SchedulerService, config: AgentConfig) -> None:
    @app.agent(inputs, name="koordstream.scheduler")
    async def scheduler(stream: faust.StreamT[Any]) -> None:
        async for messages in micro_batches(stream, config):
            await service.on_inputs(messages)

    @app.task  # type: ignore[untyped-decorator]
    async def scheduling_loop() -> None:
        await service.run()
