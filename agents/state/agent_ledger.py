"""faust agent of the deciders: `holds` in, Commit / Release / Requeue / Binding out.

Per micro-batch: decode, group by decision key, apply `Decider` to each key's ledger entry
(changelog-backed table keyed like the input), produce `first` (Commits, Releases, Requeues),
wait for the broker to acknowledge them, and only then produce the Bindings.
"""

from __future__ import annotations

from typing import Any

import faust

from agents.agent_batches import micro_batches
from agents.agent_tables import VersionedState
from agents.intake import EpochFence, intake
from agents.ports import AgentConfig, Outbox, deliver, stamp
from agents.state.ledger import Decider, Decision, LedgerState
from schemas.records import Held, PodDeleted, PodTerminated, Record, Rejected

HOLDS_KINDS = (Held, Rejected, PodDeleted, PodTerminated)


def key_of(record: Record) -> str:
    key: str = getattr(record, "decision_key", "") or getattr(record, "uid", "")
    return key


def register(app: faust.App, holds: faust.TopicT, outbox: Outbox, config: AgentConfig) -> None:
    table = VersionedState(app, config.table_name, config.partitions)
    decider = Decider()
    fence = EpochFence()

    @app.agent(holds, name="koordstream.deciders")
    async def deciders(stream: faust.StreamT[Any]) -> None:
        async for messages in micro_batches(stream, config):
            got = intake(messages, expect=HOLDS_KINDS, fence=fence)
            decision = Decision()
            for key, records in got.grouped(key_of).items():
                raw = table.get(key)
                state = LedgerState.from_json(raw) if raw else LedgerState(key)
                first, after = len(decision.first), len(decision.after_commit)
                decider.apply(state, records, decision)
                source = got.sources[id(records[0])]
                table.put(key, state.to_json(), source.partition)
                origin = table.origin(source)
                stamp(decision.first, first, origin)
                stamp(decision.after_commit, after, origin)
            # Commits are acknowledged by the broker before any Binding is sent.
            await deliver(outbox, decision.first + got.dead_letters + got.problem_letters(decision.problems))
            await deliver(outbox, decision.after_commit)
