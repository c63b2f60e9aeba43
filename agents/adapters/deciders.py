"""The deciders as a faust agent: `holds` in, Commit / Release / Requeue / Binding out.

`Decider` runs in the shared loop (`agents.adapters.loop`), keyed by decision key like its
input. Its `first` outputs (Commits, Releases, Requeues) and `after_commit` outputs
(Bindings) map to the loop's `first` and `after`: without transactions the Commits (and the
ledger entries that decided them) are acknowledged by the broker before any Binding is sent;
in a transaction they become visible together.

Order per pod: Commit, then Binding, then PodTerminated. The core's `first` holds Commits
and terminations alike, so a batch that accepts a pod and then reads its deletion (a replay
after a takeover brings both) would send the PodTerminated before the Binding; the
PodTerminated of a pod bound in the same batch goes in the loop's `last` wave instead. And a
Held redelivered after its pod was terminated (an owner that took over re-sends its Helds)
makes the core re-send the pod's acceptance: its Binding went out before the termination, so
the copy is dropped here rather than reach consumers after the termination, where it would
count as bound again (the chaos checker saw a GPU given twice).

The deletions and terminations of a warm pool's pods are sent on to the pool (`sandbox`,
`gone_sandboxes`), so a pool learns of a sandbox removed by anyone else.

Keys `quota:<root quota>` are elastic quota trees' ledgers (`agents.state.quotas`), in the
same table: a decider asks one before it commits a pod of that quota, and commits on its grant.

Gang timers: the decider asks for them (`Decision.timers`: key, round, seconds); the timer
fires on the event loop (the wall clock lives here, at the edge) and appends
`GangTimeout(key, round)` to the gang's `holds` partition, where the decider reads it like
any other record. After every restore, one is armed for every gang waiting in the partitions
owned (a full waiting time from then: after a move a gang may wait longer than asked, never
shorter).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import faust

from agents.adapters.loop import Outcome, StatefulLoop
from agents.adapters.stateful import Transactions, register_stateful
from agents.adapters.tables import read_state
from agents.adapters.timers import TimerRequest
from agents.ports import AgentConfig, Outbox, Output
from agents.sandbox.templates import is_pod_uid, pool_of
from agents.state.ledger import TERMINATED, Decider, Decision, LedgerState
from agents.state.quotas import QuotaLedger, QuotaLedgerState, QuotaTree, is_quota_key
from agents.state.retention import DEFAULT_RETENTION_S
from schemas import topics
from schemas.records import (
    Binding,
    GangTimeout,
    Held,
    PodDeleted,
    PodTerminated,
    QuotaAsk,
    QuotaDenied,
    QuotaGranted,
    QuotaReturn,
    Record,
    Rejected,
    Yield,
)

HOLDS_KINDS = (Held, Rejected, PodDeleted, PodTerminated, GangTimeout, Yield, QuotaAsk, QuotaGranted, QuotaDenied,
               QuotaReturn)


def key_of(record: Record) -> str:
    key: str = getattr(record, "decision_key", "") or getattr(record, "uid", "")
    return key


def gang_timer(key: str, round_: int, seconds: float) -> TimerRequest:
    """One per (key, round, length): a round's timer shortened (a fellow refusal) is a timer
    of its own, and the first one that fires ends the round."""
    return TimerRequest((key, round_, seconds), seconds,
                        Output(topics.HOLDS, key, GangTimeout(decision_key=key, round=round_)))


def gone_sandboxes(records: list[Record]) -> list[Output]:
    """The deletions and terminations of sandbox pods (a pool's), sent on to their pool's
    `sandbox` partition: whoever removed the pod (its node deleted, a user, an eviction), the
    pool stops counting it. In the batch's own step, so a replay re-sends them; the pool
    ignores what it no longer holds."""
    return [Output(topics.SANDBOX, pool.split("/", 1)[1], r) for r in records
            if isinstance(r, (PodDeleted, PodTerminated)) and (pool := pool_of(r.uid)) is not None and is_pod_uid(r.uid)]


class DeciderCore:
    kinds: tuple[type[Record], ...] = HOLDS_KINDS
    split: tuple[str, ...] = ()  # a decision key's state is small: written whole

    def __init__(self, retention_s: float = DEFAULT_RETENTION_S, quotas: QuotaTree | None = None) -> None:
        self.decider = Decider(retention_s, quotas)
        self.quota_ledger = QuotaLedger(self.decider.quotas)

    def key_of(self, record: Record) -> str:
        return key_of(record)

    def apply(self, key: str, stored: dict[str, Any] | None, records: list[Record], times: list[float],
              now: float, outcome: Outcome) -> dict[str, Any] | None:
        if is_quota_key(key):  # an elastic quota tree's ledger (`agents.state.quotas`)
            ledger = read_state("pod-ledger", key, stored, QuotaLedgerState.from_json) if stored \
                else QuotaLedgerState(key)
            self.quota_ledger.apply(ledger, records, outcome.first, outcome.problems)
            return None if QuotaLedger.empty(ledger) else ledger.to_json()
        state = read_state("pod-ledger", key, stored, LedgerState.from_json) if stored else LedgerState(key)
        terminated = {uid for uid, entry in state.pods.items() if entry.status == TERMINATED}
        decision = Decision()
        self.decider.apply(state, records, decision, times, now)
        bindings = [o for o in decision.after_commit
                    if not (isinstance(o.record, Binding) and o.record.uid in terminated)]
        bound = {o.record.uid for o in bindings if isinstance(o.record, Binding)}
        for output in decision.first:
            if isinstance(output.record, PodTerminated) and output.record.uid in bound:
                outcome.last.append(output)
            else:
                outcome.first.append(output)
        outcome.after += bindings
        outcome.first += gone_sandboxes(records)
        outcome.problems += decision.problems
        outcome.timers += [gang_timer(k, r, s) for k, r, s in decision.timers]
        return None if Decider.empty(state) else state.to_json()

    def timers(self, key: str, raw: dict[str, Any]) -> list[TimerRequest]:
        """A full waiting time for a restored gang that is still waiting."""
        if raw.get("waiting") and raw.get("timer_s"):
            return [gang_timer(key, int(raw.get("round", 0)), float(raw["timer_s"]))]
        return []

    def expires(self, key: str, raw: dict[str, Any]) -> float:
        """When the key's first deleted pod may be forgotten (log time; 0: none)."""
        gone = [p["gone"] for p in raw.get("pods", {}).values() if p.get("gone")]
        return min(gone) + self.decider.retention_s if gone else 0.0

    def prune(self, keys: Collection[str]) -> None:
        return None


def register(app: faust.App, holds: faust.TopicT, outbox: Outbox, config: AgentConfig,
             transactions: Transactions | None = None) -> StatefulLoop:
    return register_stateful(app, "deciders", holds, DeciderCore(config.retention_s, QuotaTree(config.quotas)), outbox,
                             config, transactions or Transactions())
