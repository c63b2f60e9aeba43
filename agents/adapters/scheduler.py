"""faust side of the scheduler: the pods/requeue agent, the scheduling loop task, and the
rebalance signals that tell the service which input partitions it owns.

The agent only decodes and enqueues (`SchedulerService.on_inputs`), once each partition is
known to be read from its first record in this assignment (`agents.adapters.starts`). A newly
assigned `pods` partition is held (`SchedulerService.hold`) until it is read up to where it
ended when assigned (`catch_up`, the end from a fetch of the probe's consumer); the loop
(`SchedulerService.run`) places ready pods in micro-batches. The replica feed that calls
`SchedulerService.on_state_changes` lives in `streams.app`. (Moved here from
`agents/scheduler/agent.py`, which keeps the service.)

With `AgentConfig.commit_inputs` (`scheduling.commit_input_offsets`, on by default), every
second the input offsets the service no longer needs (`SchedulerService.commit_points`) are
committed to the worker's consumer group (faust's consumer, explicit offsets: the channel
has faust's acks off), so that whoever reads a partition next starts there; the start check
(`agents.adapters.starts`) then probes the first record at or after the committed offset.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, cast

import faust
from faust.types import TP

from agents.adapters.batches import fetched_batches
from agents.adapters.positions import CommittedStart
from agents.adapters.starts import ReadFromStart
from agents.adapters.stateful import seeker
from agents.ports import AgentConfig
from agents.scheduler.agent import SchedulerService
from schemas import topics

log = logging.getLogger("koordstream.scheduler")
COMMIT_EVERY_S = 1.0


def register(app: faust.App, inputs: faust.TopicT, service: SchedulerService, config: AgentConfig,
             probe: CommittedStart) -> None:
    """`probe` finds a partition's first record (no group: `agents.adapters.starts`)."""
    if service.partitions is None:
        service.partitions = config.partitions
    names = set(inputs.topics)
    starts = ReadFromStart(probe, seeker(app), reread=service.reread)

    def ours(tps: Iterable[TP]) -> set[int]:
        return {tp.partition for tp in tps if tp.topic in names}

    # faust sends these after a rebalance's revocation (aiokafka's eager protocol: everything
    # assigned so far) and with the whole new assignment.
    async def partitions_revoked(sender: Any, *args: Any, **kwargs: Any) -> None:
        service.on_partitions_revoked(ours(args[0]))  # args: (revoked TPs,)
        starts.revoked((tp.topic, tp.partition) for tp in args[0] if tp.topic in names)

    async def partitions_assigned(sender: Any, *args: Any, **kwargs: Any) -> None:
        committed.clear()  # another replica may have committed since
        service.on_partitions_assigned(ours(args[0]))  # args: (assigned TPs,)
        generation = app.consumer_generation_id
        starts.assigned({(tp.topic, tp.partition) for tp in args[0] if tp.topic in names}, generation)
        pods = sorted(tp.partition for tp in args[0] if tp.topic in names and tp.topic == topics.PODS)
        service.hold(pods)
        for partition in pods:
            task = asyncio.ensure_future(catch_up(partition, generation))
            catching_up.add(task)
            task.add_done_callback(catching_up.discard)

    catching_up: set[asyncio.Future[None]] = set()

    async def catch_up(partition: int, generation: int) -> None:
        """Tell the service where `pods` partition ends now: its pods are placed once read
        that far (`SchedulerService.hold`)."""
        while generation == app.consumer_generation_id and partition in service.owned:
            try:
                end = await probe.end(topics.PODS, partition)
                start = await probe.committed(topics.PODS, partition) if config.commit_inputs else 0
                if generation == app.consumer_generation_id:  # else the new assignment asks for itself
                    service.catch_up(partition, end, start)
                return
            except Exception as exc:  # noqa: BLE001 - asked again; the pods wait meanwhile
                log.warning("pods/%s: cannot find where it ends (%r); asking again", partition, exc)
                await asyncio.sleep(1.0)

    # After every rebalance faust resumes the input partitions, seeks them to their committed
    # offsets, then resumes flow control, which clears every stream queue: messages fetched
    # between the resume and the seek were cleared while the read offsets had moved past them,
    # so they were lost for good (pods never scheduled after a rebalance). With flow control
    # suspended they wait at the door and go in after the clearing (the state agents' tables
    # do the same, `agents.adapters.tables`); what then arrives twice is idempotent here (a
    # pod by uid, a requeue by attempt).
    async def rebalance_complete(sender: Any, *args: Any, **kwargs: Any) -> None:
        app.flow_control.suspend()
        starts.rebalanced()

    async def shutdown(sender: Any, **kwargs: Any) -> None:
        starts.close()
        for task in catching_up:
            task.cancel()
        await probe.close()

    # mode's SignalHandlerT admits no function under mypy (its NamedArg "signal"), hence the ignores.
    app.on_partitions_revoked.connect(partitions_revoked)  # type: ignore[arg-type]
    app.on_partitions_assigned.connect(partitions_assigned)  # type: ignore[arg-type]
    app.on_rebalance_complete.connect(rebalance_complete)  # type: ignore[arg-type]
    app.on_before_shutdown.connect(shutdown)  # type: ignore[arg-type]

    @app.agent(inputs, name="koordstream.scheduler")
    async def scheduler(stream: faust.StreamT[Any]) -> None:
        async for runs in fetched_batches(stream, config):
            messages = await starts.admit(runs)
            if messages:
                await service.on_inputs(messages)

    @app.task  # type: ignore[untyped-decorator]
    async def scheduling_loop() -> None:
        await service.run()

    committed: dict[TP, int] = {}

    async def commit_inputs() -> None:
        offsets = {TP(topic, partition): offset for (topic, partition), offset in service.commit_points().items()
                   if committed.get(TP(topic, partition)) != offset}
        if offsets and await cast(Any, app.consumer)._commit(offsets):  # only partitions still assigned
            committed.update(offsets)

    if config.commit_inputs:  # `scheduling.commit_input_offsets`
        service.commit_inputs = True
        app.timer(interval=COMMIT_EVERY_S)(commit_inputs)
