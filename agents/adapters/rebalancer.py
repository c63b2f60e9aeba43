"""aiokafka side of the rebalancer (`agents.rebalance.service`): who leads, what it reads, what
it writes.

Every worker with the `rebalancer` role reads `nodes`, `pods`, `bindings`, `evictions`,
`reservations`, `feedback`, `migrations` and `disruption-budgets` whole and then as they grow (no group, committed records only),
so that its view is current whenever it takes over.

Leadership is a partition owner: the workers join the group `<app_id>-rebalancer` on
`scale-down` with an assignor that gives every partition to one member (the first by member
id). The member that holds them leads; when a rebalance takes them away it stops at once
(`follow`). A new leader first reads its topics up to where they ended when it was assigned
(the `migrations` read back whole, with every version a past leader wrote), then `lead`s: the
jobs in flight resume, and the events they missed are applied.

The leader reads `scale-down` as a group member: each ScaleDownEvent is answered once its
outputs are acknowledged, then its offset is committed, so a new leader answers what the last
one did not (an answer given twice writes the same ranks, or finds the victims' jobs begun:
the pods are in flight). A bad event goes to the dead-letter topic. Every `tick_s` the leader
runs `tick` and `actuate`, and every `deschedulingInterval` a `cycle`.

Between losing its session and hearing of the rebalance, a deposed leader may still write; the
next leader's records are newer versions of the same jobs (the compacted `migrations` keeps the
last), and the arbitration counts what is in flight. Without a broker-side fence (no
transactional producer here) this window is the weakness said in docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from agents.adapters.connection import KafkaConnection
from agents.intake import RawMessage, intake
from agents.ports import Outbox, Output, deliver
from agents.rebalance.service import RebalancerService
from schemas import topics
from schemas.records import DeadLetter, MigrationJob, ScaleDownEvent

log = logging.getLogger("koordstream.rebalancer")

READ = (topics.NODES, topics.PODS, topics.BINDINGS, topics.EVICTIONS, topics.RESERVATIONS, topics.FEEDBACK,
        topics.MIGRATIONS, topics.DISRUPTION_BUDGETS)


class OneLeader(AbstractPartitionAssignor):  # type: ignore[misc]
    """Every partition of the subscribed topics to one member: the first by member id."""

    name = "koordstream-one-leader"
    version = 0

    @classmethod
    def assign(cls, cluster: Any, member_metadata: dict[str, ConsumerProtocolMemberMetadata]
               ) -> dict[str, ConsumerProtocolMemberAssignment]:
        members = sorted(member_metadata)
        wanted = sorted({t for m in member_metadata.values() for t in m.subscription})
        everything = [(t, sorted(cluster.partitions_for_topic(t) or ())) for t in wanted]
        return {m: ConsumerProtocolMemberAssignment(cls.version, everything if i == 0 else [], b"")
                for i, m in enumerate(members)}

    @classmethod
    def metadata(cls, topics_: set[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(cls.version, list(topics_), b"")

    @classmethod
    def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
        pass


class _Leadership(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.held = False
        self.changed = False

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        if revoked:
            self.held, self.changed = False, True

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        self.held, self.changed = bool(assigned), True


async def run(service: RebalancerService, outbox: Outbox, *, kafka: KafkaConnection | str, partitions: int, app_id: str,
              tick_s: float = 0.2, session_timeout_s: float = 6.0, fetch_max_wait_ms: int = 20,
              clock: Callable[[], float] = time.time) -> None:
    """Run until cancelled."""
    conn = KafkaConnection.of(kafka)
    tail = conn.consumer(group_id=None, enable_auto_commit=False, isolation_level="read_committed",
                         fetch_max_wait_ms=fetch_max_wait_ms)
    group = conn.consumer(group_id=f"{app_id}-rebalancer", enable_auto_commit=False,
                          auto_offset_reset="earliest", isolation_level="read_committed",
                          partition_assignment_strategy=(OneLeader,), fetch_max_wait_ms=fetch_max_wait_ms,
                          session_timeout_ms=int(session_timeout_s * 1000), heartbeat_interval_ms=1000,
                          rebalance_timeout_ms=10_000)
    leadership = _Leadership()
    await tail.start()
    await group.start()
    try:
        tps = [TopicPartition(t, p) for t in READ for p in range(partitions)]
        tail.assign(tps)
        await tail.seek_to_beginning()
        group.subscribe([topics.SCALE_DOWN], listener=leadership)
        catch_up: dict[TopicPartition, int] | None = None
        next_cycle = clock() + service.rebalancer.config.interval_s
        while True:
            batches = await tail.getmany(timeout_ms=int(tick_s * 1000), max_records=5000)
            messages = [RawMessage(m.value, m.topic, m.partition, m.offset) for ms in batches.values() for m in ms]
            out: list[Output] = []
            if leadership.changed:  # before the records: a deposed leader steps nothing more
                leadership.changed = False
                if leadership.held:
                    catch_up = await tail.end_offsets(tps)
                    log.info("rebalancer: assigned the lead; reading up to the ends first")
                elif service.leading:
                    service.follow()
                    catch_up = None
                    log.info("rebalancer: lost the lead")
            if messages:
                got = intake(messages)  # undecodable ones: dead-lettered by the agents that own their topics
                out += service.on_records(got.records)
                if service.leading:  # one worker says it; followers drop theirs
                    out += [d for d in got.dead_letters if isinstance(d.record, DeadLetter)
                            and d.record.topic == topics.DISRUPTION_BUDGETS]  # no other agent reads these
                    out += got.problem_letters(service.problems)
                service.problems.clear()
            service.prune(clock())
            if catch_up is not None and leadership.held and await _read_up_to(tail, catch_up):
                catch_up = None
                out += service.lead(clock())
                log.info("rebalancer: leading (%d jobs in flight)", len(service.active))
            sent = await group.getmany(timeout_ms=0)
            if sent and not service.leading:  # held but still catching up: read them again once leading
                for tp, ms in sent.items():
                    group.seek(tp, ms[0].offset)
                sent = {}
            if service.leading:
                now = clock()
                scale_downs = [RawMessage(m.value, m.topic, m.partition, m.offset) for ms in sent.values() for m in ms]
                if scale_downs:
                    got = intake(scale_downs, expect=(ScaleDownEvent,))
                    out += got.dead_letters
                    for event in got.records:
                        assert isinstance(event, ScaleDownEvent)
                        answer, problems = service.scale_down(event, now)
                        out += answer + got.problem_letters(problems)
                if now >= next_cycle:
                    next_cycle = now + service.rebalancer.config.interval_s
                    planned = service.cycle(now)
                    out += planned
                    log.info("rebalancer: cycle over %d nodes and %d bound pods: %d jobs started; objective %s",
                             len(service.nodes), len(service.bound), sum(isinstance(o.record, MigrationJob)
                                                                         for o in planned),
                             {p: (a.as_dict(), b.as_dict()) for p, (a, b) in service.objective.items()})
                out += service.tick(now) + service.actuate(now)
            jobs = [o for o in out if o.topic == topics.MIGRATIONS]
            for wave in (jobs, [o for o in out if o.topic != topics.MIGRATIONS]):
                if wave:  # the jobs' records first: a job is never behind what it did
                    await deliver(outbox, wave)
            if sent and service.leading:
                with contextlib.suppress(Exception):  # a lost lead: the next leader answers again
                    await group.commit({tp: ms[-1].offset + 1 for tp, ms in sent.items()})
    finally:
        for consumer in (group, tail):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), 5.0)


async def _read_up_to(consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> bool:
    """Whether every partition is read up to `ends` (and to its last fetched end: Tansu answers
    ListOffsets short of the end)."""
    for tp, end in ends.items():
        fetched = consumer.last_stable_offset(tp)
        if fetched is None or fetched < 0:
            fetched = consumer.highwater(tp)
        if await consumer.position(tp) < max(end, fetched or 0):
            return False
    return True
