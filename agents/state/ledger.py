"""Deciders: the pod ledger, partitioned by decision key, the only writer of Bindings.

A decision key is a pod's gang (namespace/name) when it has one, else its uid, so one decider
sees every member of a gang. Per hold id the decider records its decision and, on a replay,
re-sends exactly the recorded outputs:

- the first Held of a pending pod is accepted (a gang: once `gang_min` members are held, all
  of them at once): Commit to the node's inbox, and, only after the broker acknowledged the
  Commit, the Binding (`Decision.after_commit`);
- every other Held (pod already bound, deleted, or a second claim) gets a Release;
- a Rejected of the pod's current attempt requeues the pod with the next attempt;
- a deleted pod releases what it holds; a deleted bound pod is terminated at its node.

Decisions are final: an accepted hold is never released, a bound pod never requeued.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agents.ports import Output, Problem
from agents.state import devices
from schemas import topics
from schemas.records import (
    Binding,
    Commit,
    Held,
    NominationCleared,
    PodDeleted,
    PodTerminated,
    Record,
    Rejected,
    Release,
    Requeue,
)

PENDING, BOUND, DELETED, TERMINATED = "pending", "bound", "deleted", "terminated"
ACCEPTED, RELEASED, WAITING, REQUEUED, IGNORED = "accepted", "released", "waiting", "requeued", "ignored"


@dataclass
class PodEntry:
    status: str = PENDING
    node: str = ""
    attempt: int = 0  # the attempt bound, or the latest one requeued
    namespace: str = ""
    name: str = ""


@dataclass
class LedgerState:
    """One decision key's ledger; the value of the deciders' table."""

    key: str
    pods: dict[str, PodEntry] = field(default_factory=dict)
    decisions: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, dict[str, Any]] = field(default_factory=dict)  # gang holds not yet decided

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "pods": {uid: dict(p.__dict__) for uid, p in self.pods.items()},
            "decisions": self.decisions,
            "waiting": self.waiting,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> LedgerState:
        return cls(
            key=raw["key"],
            pods={uid: PodEntry(**p) for uid, p in raw["pods"].items()},
            decisions=dict(raw["decisions"]),
            waiting=dict(raw["waiting"]),
        )


@dataclass
class Decision:
    """Outputs of one batch. `first` must be acknowledged before `after_commit` is sent."""

    first: list[Output] = field(default_factory=list)
    after_commit: list[Output] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


class Decider:
    def apply(self, state: LedgerState, records: Iterable[Record], out: Decision) -> LedgerState:
        for record in records:
            if isinstance(record, Held):
                self._held(state, record, out)
            elif isinstance(record, Rejected):
                self._rejected(state, record, out)
            elif isinstance(record, PodDeleted):
                self._deleted(state, record, out)
            elif isinstance(record, PodTerminated):
                entry = state.pods.setdefault(record.uid, PodEntry())
                if entry.status == BOUND:
                    entry.status = TERMINATED
            else:
                out.problems.append(Problem("kind", record.KIND, f"{record.KIND} does not belong on holds", record))
        return state

    # -- Held ---------------------------------------------------------------------------------

    def _held(self, state: LedgerState, held: Held, out: Decision) -> None:
        hid = held.hold_id
        recorded = state.decisions.get(hid)
        if recorded is not None:
            self._resend(state, held, recorded, out)
            return
        entry = state.pods.setdefault(held.uid, PodEntry(namespace=held.namespace, name=held.name))
        if entry.status != PENDING or any(w["uid"] == held.uid for w in state.waiting.values()):
            state.decisions[hid] = RELEASED
            out.first.append(self._release(held, f"pod is {entry.status}"))
            return
        if held.gang_min <= 1:
            self._accept(state, held, out)
            return
        state.decisions[hid] = WAITING
        state.waiting[hid] = {
            "uid": held.uid, "attempt": held.attempt, "node": held.node, "namespace": held.namespace,
            "name": held.name, "nominated_node": held.nominated_node, "gang_min": held.gang_min,
            "devices": list(held.devices),
        }
        if len(state.waiting) >= held.gang_min:
            for wid, w in sorted(state.waiting.items()):
                member = Held(
                    uid=w["uid"], attempt=w["attempt"], node=w["node"], decision_key=state.key,
                    namespace=w["namespace"], name=w["name"], gang_min=w["gang_min"],
                    nominated_node=w["nominated_node"], devices=tuple(w.get("devices", ())),
                )
                del state.waiting[wid]
                self._accept(state, member, out)

    def _accept(self, state: LedgerState, held: Held, out: Decision) -> None:
        entry = state.pods.setdefault(held.uid, PodEntry())
        entry.status, entry.node, entry.attempt = BOUND, held.node, held.attempt
        entry.namespace, entry.name = held.namespace, held.name
        state.decisions[held.hold_id] = ACCEPTED
        self._emit_accept(state.key, held, out)

    def _emit_accept(self, key: str, held: Held, out: Decision) -> None:
        out.first.append(Output(topics.NODE_INBOX, held.node, Commit(
            uid=held.uid, attempt=held.attempt, node=held.node, decision_key=key,
        )))
        if held.nominated_node:
            out.first.append(Output(topics.NODE_INBOX, held.nominated_node,
                                    NominationCleared(uid=held.uid, node=held.nominated_node)))
        allocated = devices.decode(held.devices)
        out.after_commit.append(Output(topics.BINDINGS, held.uid, Binding(
            uid=held.uid, namespace=held.namespace, name=held.name, node=held.node,
            attempt=held.attempt, decision_key=key,
            annotations={devices.DEVICE_ALLOCATED: devices.annotation(allocated)} if allocated else {},
        )))

    @staticmethod
    def _release(held: Held, reason: str) -> Output:
        return Output(topics.NODE_INBOX, held.node, Release(
            uid=held.uid, attempt=held.attempt, node=held.node, decision_key=held.decision_key, reason=reason,
        ))

    def _resend(self, state: LedgerState, held: Held, recorded: str, out: Decision) -> None:
        if recorded == ACCEPTED:
            self._emit_accept(state.key, held, out)
        elif recorded == RELEASED:
            out.first.append(self._release(held, "replayed"))

    # -- Rejected -----------------------------------------------------------------------------

    def _rejected(self, state: LedgerState, rejected: Rejected, out: Decision) -> None:
        """Requeue a pending pod with its next attempt, recorded as `requeued:<attempt>`.

        A rejection of an attempt older than the pod's latest (a scheduler that restarted and
        lost count) announces the latest attempt again, so that scheduler catches up instead
        of waiting forever for an answer.
        """
        hid = rejected.hold_id
        recorded = state.decisions.get(hid)
        if recorded is None:
            entry = state.pods.setdefault(rejected.uid, PodEntry())
            if entry.status == PENDING:
                entry.attempt = max(entry.attempt, rejected.attempt + 1)
                recorded = f"{REQUEUED}:{entry.attempt}"
            else:
                recorded = IGNORED
            state.decisions[hid] = recorded
        if recorded.startswith(REQUEUED):
            out.first.append(Output(topics.REQUEUE, rejected.uid, Requeue(
                uid=rejected.uid, attempt=int(recorded.rsplit(":", 1)[1]), decision_key=state.key,
                reason=f"{rejected.node}: {rejected.reason}",
            )))

    # -- deletions ----------------------------------------------------------------------------

    def _deleted(self, state: LedgerState, deleted: PodDeleted, out: Decision) -> None:
        entry = state.pods.setdefault(deleted.uid, PodEntry(namespace=deleted.namespace, name=deleted.name))
        if entry.status == PENDING:
            entry.status = DELETED
        elif entry.status == BOUND:
            entry.status = TERMINATED
        if entry.status == DELETED:
            for wid, w in list(state.waiting.items()):
                if w["uid"] == deleted.uid:
                    del state.waiting[wid]
                    state.decisions[wid] = RELEASED
                    out.first.append(Output(topics.NODE_INBOX, w["node"], Release(
                        uid=deleted.uid, attempt=w["attempt"], node=w["node"],
                        decision_key=state.key, reason="pod deleted",
                    )))
        elif entry.status == TERMINATED and entry.node:
            # Re-sent on a redelivered deletion too: owners ignore a second termination.
            out.first.append(Output(topics.NODE_INBOX, entry.node, PodTerminated(
                uid=deleted.uid, node=entry.node, decision_key=state.key, reason="pod deleted",
            )))
