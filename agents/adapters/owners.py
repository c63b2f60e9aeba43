"""The node owners as faust agents: `nodes` forwarded into `node-inbox`, and the owners.

The owners run `NodeOwner` in the shared loop (`agents.adapters.loop`), keyed by node name
like their inbox, so a table partition moves with its inbox partition. `OwnerCore` adapts the
core: it keeps decoded states in memory and reuses them while the table still holds the very
value it returned (a restore puts other objects there, and the state is decoded again).

Reservation expiry: the owner asks for a timer when a reservation becomes available
(`OwnerResult.timers`, an absolute expiry time); the timer fires on the event loop (the wall
clock lives here, at the edge) and appends `ReservationExpired` to the node's inbox
partition, where the owner reads it like any other record. After every restore, one is armed
for every available reservation of the partitions owned.

Nomination lapse (`scheduling.nomination_ttl_s`): the owner records each nomination with the
batch's log time and asks for a lapse timer (`OwnerResult.lapses`); when it fires,
`NominationLapsed` (naming that time) is appended to the inbox, and the owner drops the
nomination unless it was made again since. After every restore one is armed for every
nomination of the partitions owned.

`current_reports` turns the owners' changelog, read whole, into one NodeStateChange per node
as it is now: a scheduler replica starts from those instead of the history of `state-changes`
(`streams.app.feed_state_changes`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import faust

from agents.adapters.loop import Outcome, StatefulLoop
from agents.adapters.stateful import Transactions, register_forwarder, register_stateful
from agents.adapters.tables import (
    CLOCK_PREFIX,
    ChangelogImage,
    ChangelogRecord,
    cached_state,
    read_state,
)
from agents.adapters.timers import TimerRequest
from agents.intake import RawMessage, intake
from agents.ports import AgentConfig, Outbox, Output, deliver
from agents.state import reservations as rsv
from agents.state.owner import NodeOwner, NodeState, OwnerResult
from agents.state.retention import DEFAULT_RETENTION_S
from schemas import topics
from schemas.records import (
    Claim,
    Commit,
    Node,
    NodeDeleted,
    NodeStateChange,
    Nomination,
    NominationCleared,
    NominationLapsed,
    PodTerminated,
    Record,
    Release,
    ReservationExpired,
)

INBOX_KINDS = (Claim, Commit, Release, PodTerminated, Node, NodeDeleted, Nomination, NominationCleared,
               NominationLapsed, ReservationExpired)
DEFAULT_NOMINATION_TTL_S = 300.0


def node_of(record: Record) -> str:
    if isinstance(record, (Node, NodeDeleted)):
        return record.name
    node: str = record.node  # type: ignore[attr-defined]
    return node


def current_reports(records: Sequence[ChangelogRecord]) -> tuple[list[NodeStateChange], dict[int, int]]:
    """One report per node of the owners' changelog records (log order), as the owners' restore
    would assemble the node, and per partition the newest epoch of its writes; raises
    `UnreadableState` for a value this version cannot read."""
    image = ChangelogImage("node-state", OwnerCore.split)
    image.apply(records)
    reports = [NodeOwner.current(read_state("node-state", key.decode(), wrapped["state"], NodeState.from_json))
               for key, wrapped in image.data.items() if not key.startswith(CLOCK_PREFIX)]
    return reports, dict(image.restored_epochs)


class OwnerCore:
    kinds: tuple[type[Record], ...] = INBOX_KINDS
    # A node's holds and tombstones are its changelog's bulk, and a batch changes few of them;
    # its Node record (three quarters of the rest, the NUMA topology) changes with the Node.
    split: tuple[str, ...] = ("holds", "tombstones", "record")

    def __init__(self, clock: Callable[[], float] = time.time, retention_s: float = DEFAULT_RETENTION_S,
                 nomination_ttl_s: float = DEFAULT_NOMINATION_TTL_S) -> None:
        self.owner = NodeOwner(retention_s)
        self.clock = clock
        self.nomination_ttl_s = nomination_ttl_s
        self.decoded: dict[str, tuple[dict[str, Any], NodeState]] = {}  # node -> (state JSON put, decoded)

    def key_of(self, record: Record) -> str:
        return node_of(record)

    def expiry(self, node: str, uid: str, expires_at: float) -> TimerRequest:
        return TimerRequest(uid, expires_at - self.clock(),
                            Output(topics.NODE_INBOX, node, ReservationExpired(uid=uid, node=node)))

    def lapse(self, node: str, uid: str, since: float) -> TimerRequest:
        """A nomination's lapse, `nomination_ttl_s` after the log time it was recorded (from now
        for one recorded before nominations had times)."""
        return TimerRequest(("lapse", node, uid, since), (since or self.clock()) + self.nomination_ttl_s - self.clock(),
                            Output(topics.NODE_INBOX, node, NominationLapsed(uid=uid, node=node, since=since)))

    def apply(self, key: str, stored: dict[str, Any] | None, records: list[Record], times: list[float],
              now: float, outcome: Outcome) -> dict[str, Any] | None:
        state = cached_state(self.decoded, "node-state", key, stored, NodeState.from_json, NodeState)
        result = OwnerResult()
        self.owner.apply(state, records, result, times, now)
        outcome.first += result.outputs
        outcome.problems += result.problems
        outcome.timers += [self.expiry(node, uid, at) for node, uid, at in result.timers]
        outcome.timers += [self.lapse(node, uid, since) for node, uid, since in result.lapses]
        new = state.to_json()
        self.decoded[key] = (new, state)
        return new

    def timers(self, key: str, raw: dict[str, Any]) -> list[TimerRequest]:
        """One expiry timer per available reservation of a restored node, one lapse timer per
        nomination."""
        if "reservations" in raw and not raw["reservations"] and "nominations" in raw and not raw["nominations"]:
            return []  # most nodes: nothing to decode
        state = read_state("node-state", key, raw, NodeState.from_json)
        out = [self.lapse(node, uid, since) for node, uid, since in NodeOwner.lapses(state)]
        for uid, entry in state.reservations.items():
            expires_at = state.expires_at(uid)
            if entry["phase"] == rsv.AVAILABLE and expires_at is not None:
                out.append(self.expiry(state.name, uid, expires_at))
        return out

    def expires(self, key: str, state: dict[str, Any]) -> float:
        """Owners forget in the batches of the node itself (a node with no traffic keeps what
        it had)."""
        return 0.0

    def prune(self, keys: Collection[str]) -> None:
        for key in [k for k in self.decoded if k not in keys]:
            del self.decoded[key]


def register(app: faust.App, nodes: faust.TopicT, inbox: faust.TopicT, outbox: Outbox, config: AgentConfig,
             transactions: Transactions | None = None) -> StatefulLoop:
    """The node forwarder (stateless) and the owners (the shared loop over `inbox`)."""

    async def forward_nodes(messages: list[RawMessage]) -> None:
        got = intake(messages, expect=(Node, NodeDeleted))
        forwarded = [Output(topics.NODE_INBOX, node_of(r), r) for r in got.records]
        await deliver(outbox, forwarded + got.dead_letters)

    transactions = transactions or Transactions()
    register_forwarder(app, nodes, "koordstream.nodes", config, transactions, forward_nodes)
    return register_stateful(app, "owners", inbox, OwnerCore(retention_s=config.retention_s,
                                                             nomination_ttl_s=config.nomination_ttl_s),
                             outbox, config, transactions)
