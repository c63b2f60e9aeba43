"""faust agents of the node owners: `nodes` forwarded into `node-inbox`, and the owners.

Thin by design: decode a micro-batch (bad input to the dead-letter topic, a zombie's records
dropped), group it by node, apply `NodeOwner` to each node's table entry (changelog-backed,
keyed by node name like its input, so a table partition moves with its inbox partition), and
produce the outputs stamped with their origin (inbox partition, this worker's epoch).
"""

from __future__ import annotations

from typing import Any

import faust

from agents.agent_batches import micro_batches
from agents.agent_tables import VersionedState
from agents.intake import EpochFence, intake
from agents.ports import AgentConfig, Outbox, Output, deliver, stamp
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
)

INBOX_KINDS = (Claim, Commit, Release, PodTerminated, Node, NodeDeleted, Nomination, NominationCleared)


def node_of(record: Record) -> str:
    if isinstance(record, (Node, NodeDeleted)):
        return record.name
    node: str = record.node  # type: ignore[attr-defined]
    return node


def register(app: faust.App, nodes: faust.TopicT, inbox: faust.TopicT, outbox: Outbox, config: AgentConfig) -> None:
    table = VersionedState(app, config.table_name, config.partitions)
    owner = NodeOwner()
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
            await deliver(outbox, result.outputs + got.dead_letters + got.problem_letters(result.problems))
