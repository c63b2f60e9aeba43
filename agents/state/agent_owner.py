"""faust agents of the node owners: `nodes` forwarded into `node-inbox`, and the owners.

Thin by design: decode a micro-batch (bad input to the dead-letter topic, a zombie's records
dropped), group it by node, apply `NodeOwner` to each node's table entry (changelog-backed,
keyed by node name like its input, so a table partition moves with its inbox partition), and
produce the outputs stamped with their origin (inbox partition, this worker's epoch).

Reservation expiry: the owner asks for a timer when a reservation becomes available
(`OwnerResult.timers`); `ExpiryTimers` arms it on the event loop (the wall clock lives here,
at the edge) and, when it fires, appends `ReservationExpired` to the node's inbox partition,
where the owner reads it like any other record. Timers live in memory: once the tables are
recovered, one is armed for every available reservation the table holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

import faust

from agents.agent_batches import micro_batches
from agents.agent_tables import VersionedState
from agents.agent_timers import RecordTimers
from agents.intake import EpochFence, intake
from agents.ports import AgentConfig, Outbox, Output, deliver, stamp
from agents.state import reservations as rsv
from agents.state.owner import NodeOwner, NodeState, OwnerResult
from schemas import topics
from schemas.records import (
    Claim,
    Commit,
    Node,
    NodeDeleted,
    Nomination,
    NominationCleared,
    PodTerminated,
    Record,
    Release,
    ReservationExpired,
)

INBOX_KINDS = (Claim, Commit, Release, PodTerminated, Node, NodeDeleted, Nomination, NominationCleared,
               ReservationExpired)


def node_of(record: Record) -> str:
    if isinstance(record, (Node, NodeDeleted)):
        return record.name
    node: str = record.node  # type: ignore[attr-defined]
    return node


class ExpiryTimers(RecordTimers):
    """Armed reservation timers, by reservation uid; firing sends ReservationExpired to the inbox."""

    def __init__(self, outbox: Outbox, clock: Callable[[], float] = time.time) -> None:
        super().__init__(outbox)
        self.clock = clock

    def arm_expiry(self, node: str, uid: str, expires_at: float) -> None:
        self.arm(uid, expires_at - self.clock(), Output(topics.NODE_INBOX, node, ReservationExpired(uid=uid, node=node)))

    def arm_available(self, states: list[tuple[str, dict[str, Any]]]) -> None:
        for _, raw in states:
            state = NodeState.from_json(raw)
            for uid, entry in state.reservations.items():
                expires_at = state.reservation(uid).expires_at
                if entry["phase"] == rsv.AVAILABLE and expires_at is not None:
                    self.arm_expiry(state.name, uid, expires_at)


def register(app: faust.App, nodes: faust.TopicT, inbox: faust.TopicT, outbox: Outbox, config: AgentConfig) -> None:
    table = VersionedState(app, config.table_name, config.partitions)
    owner = NodeOwner()
    timers = ExpiryTimers(outbox)

    @app.task  # type: ignore[untyped-decorator]
    async def rearm_expiry_timers() -> None:
        await cast(Any, app.tables).recovery.completed.wait()  # TableManager's; not on the protocol
        timers.arm_available(table.states())
    # Decoded states, valid while the table still holds the very value we wrote (a restore
    # from the changelog after a rebalance puts other objects there, and we decode again).
    decoded: dict[str, tuple[object, NodeState]] = {}
    fence = EpochFence()

    @app.agent(nodes, name="koordstream.nodes")
    async def forward_nodes(stream: faust.StreamT[Any]) -> None:
        async for messages in micro_batches(stream, config):
            got = intake(messages, expect=(Node, NodeDeleted))
            forwarded = [Output(topics.NODE_INBOX, node_of(r), r) for r in got.records]
            await deliver(outbox, forwarded + got.dead_letters)

    @app.agent(inbox, name="koordstream.owners")
    async def owners(stream: faust.StreamT[Any]) -> None:
        async for messages in micro_batches(stream, config):
            got = intake(messages, expect=INBOX_KINDS, fence=fence)
            result = OwnerResult()
            for node, records in got.grouped(node_of).items():
                first_output = len(result.outputs)
                cached = decoded.get(node)
                if cached is not None and cached[0] is table.raw(node):
                    state = cached[1]
                else:
                    raw = table.get(node)
                    state = NodeState.from_json(raw) if raw else NodeState(node)
                owner.apply(state, records, result)
                source = got.sources[id(records[0])]
                table.put(node, state.to_json(), source.partition)
                decoded[node] = (table.raw(node), state)
                stamp(result.outputs, first_output, table.origin(source))
            changelog = await table.write_changelog()
            await deliver(outbox, result.outputs + got.dead_letters + got.problem_letters(result.problems))
            for ack in changelog:
                await ack
            for node, uid, expires_at in result.timers:
                timers.arm_expiry(node, uid, expires_at)
