"""faust agent of the deciders: `holds` in, Commit / Release / Requeue / Binding out.

Per micro-batch: decode, group by decision key, apply `Decider` to each key's ledger entry
(changelog-backed table keyed like the input), produce `first` (Commits, Releases, Requeues),
wait for the broker to acknowledge them, and only then produce the Bindings.

Gang timers: the decider asks for them (`Decision.timers`); `GangTimers` arms each on the
event loop (the wall clock lives here, at the edge) and, when one fires, appends
`GangTimeout(key, round)` to the gang's `holds` partition, where the decider reads it like
any other record. Timers live in memory: once the tables are recovered, the service arms one
for every gang the table shows waiting (a full waiting time from then: after a restart a gang
may wait longer than asked, never shorter).
"""

from __future__ import annotations

from typing import Any, cast

import faust

from agents.agent_batches import micro_batches
from agents.agent_tables import VersionedState
from agents.agent_timers import RecordTimers
from agents.intake import EpochFence, intake
from agents.ports import AgentConfig, Outbox, Output, deliver, stamp
from agents.state.ledger import Decider, Decision, LedgerState
from schemas import topics
from schemas.records import GangTimeout, Held, PodDeleted, PodTerminated, Record, Rejected, Yield

HOLDS_KINDS = (Held, Rejected, PodDeleted, PodTerminated, GangTimeout, Yield)


def key_of(record: Record) -> str:
    key: str = getattr(record, "decision_key", "") or getattr(record, "uid", "")
    return key


class GangTimers(RecordTimers):
    """Armed gang timers, by (decision key, round); firing sends GangTimeout to `holds`."""

    def arm_gang(self, key: str, round_: int, seconds: float) -> None:
        self.arm((key, round_), seconds, Output(topics.HOLDS, key, GangTimeout(decision_key=key, round=round_)))

    def arm_waiting(self, states: list[tuple[str, dict[str, Any]]]) -> None:
        for key, raw in states:
            if raw.get("waiting") and raw.get("timer_s"):
                self.arm_gang(key, int(raw.get("round", 0)), float(raw["timer_s"]))


def register(app: faust.App, holds: faust.TopicT, outbox: Outbox, config: AgentConfig) -> None:
    table = VersionedState(app, config.table_name, config.partitions)
    decider = Decider()
    fence = EpochFence()
    timers = GangTimers(outbox)

    @app.task  # type: ignore[untyped-decorator]
    async def rearm_gang_timers() -> None:
        await cast(Any, app.tables).recovery.completed.wait()  # TableManager's; not on the protocol
        timers.arm_waiting(table.states())

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
            # Commits (and the ledger entries that decided them) are acknowledged by the broker
            # before any Binding is sent.
            changelog = await table.write_changelog()
            await deliver(outbox, decision.first + got.dead_letters + got.problem_letters(decision.problems))
            for ack in changelog:
                await ack
            await deliver(outbox, decision.after_commit)
            for key, round_, seconds in decision.timers:
                timers.arm_gang(key, round_, seconds)
