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

Gangs wait for their members with a timer: when a gang's first member is held, the decider
asks its agent for a timer (`Decision.timers`: key, round, seconds); the agent arms it and,
when it fires, appends `GangTimeout(key, round)` to the gang's own `holds` partition. If the
gang is still waiting in that round, every held member is released and requeued together
(the outcome is recorded per round, so a replayed timeout re-sends it). In Strict mode (the
default) a member whose claim is rejected takes the gang's held members down with it, so the
gang retries as a whole instead of keeping capacity held for a gang that cannot complete.

Wound-wait (DESIGN.md, rule 6): a `Yield` from an owner (a higher-ranked gang needs what this
gang holds there) gives the gang up like a timeout if it is still waiting; a soft rejection
(the owner asked others to yield for this member) requeues the member without Strict mode.

Decisions are final: an accepted hold is never released, a bound pod never requeued.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agents.ports import Output, Problem
from agents.state import cpus, devices
from schemas import topics
from schemas.records import (
    GANG_DEFAULT_WAITING_S,
    Binding,
    Commit,
    GangTimeout,
    Held,
    NominationCleared,
    PodDeleted,
    PodTerminated,
    Record,
    Rejected,
    Release,
    Requeue,
    Yield,
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
    round: int = 0  # the gang's current wait; a timer belongs to one round
    timer_s: float = 0.0  # the armed timer's length (0: none armed for this round)
    gave_up: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # round -> members released

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "pods": {uid: dict(p.__dict__) for uid, p in self.pods.items()},
            "decisions": self.decisions,
            "waiting": self.waiting,
            "round": self.round,
            "timer_s": self.timer_s,
            "gave_up": self.gave_up,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> LedgerState:
        return cls(
            key=raw["key"],
            pods={uid: PodEntry(**p) for uid, p in raw["pods"].items()},
            decisions=dict(raw["decisions"]),
            waiting=dict(raw["waiting"]),
            round=int(raw.get("round", 0)),
            timer_s=float(raw.get("timer_s", 0.0)),
            gave_up=dict(raw.get("gave_up", {})),
        )


@dataclass
class Decision:
    """Outputs of one batch. `first` must be acknowledged before `after_commit` is sent."""

    first: list[Output] = field(default_factory=list)
    after_commit: list[Output] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    timers: list[tuple[str, int, float]] = field(default_factory=list)  # (key, round, seconds) to arm


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
            elif isinstance(record, GangTimeout):
                self._timeout(state, record.round, out)
            elif isinstance(record, Yield):
                self._yield(state, record, out)
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
        stale = entry.status == PENDING and held.attempt < entry.attempt  # requeued since
        if entry.status != PENDING or stale or any(w["uid"] == held.uid for w in state.waiting.values()):
            state.decisions[hid] = RELEASED
            out.first.append(self._release(held, "an older attempt" if stale else f"pod is {entry.status}"))
            return
        if held.gang_min <= 1:
            self._accept(state, held, out)
            return
        state.decisions[hid] = WAITING
        state.waiting[hid] = {
            "uid": held.uid, "attempt": held.attempt, "node": held.node, "namespace": held.namespace,
            "name": held.name, "nominated_node": held.nominated_node, "gang_min": held.gang_min,
            "devices": list(held.devices), "strict": held.gang_strict,
        }
        if not state.timer_s:
            state.timer_s = held.gang_waiting_s or GANG_DEFAULT_WAITING_S
            out.timers.append((state.key, state.round, state.timer_s))
        if len(state.waiting) >= held.gang_min:
            state.round, state.timer_s = state.round + 1, 0.0  # complete: this round's timer is moot
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
        allocated, nics = devices.decode(held.devices), devices.decode_rdma(held.devices)
        annotations = {devices.DEVICE_ALLOCATED: devices.annotation(allocated, nics)} if allocated or nics else {}
        cpusets = cpus.decode(held.devices)
        if cpusets:
            annotations[cpus.RESOURCE_STATUS] = cpus.annotation(cpusets)
        out.after_commit.append(Output(topics.BINDINGS, held.uid, Binding(
            uid=held.uid, namespace=held.namespace, name=held.name, node=held.node,
            attempt=held.attempt, decision_key=key, annotations=annotations,
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
        fresh = recorded is None
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
            reason = f"gang member {rejected.uid} was rejected (Strict mode)"
            if rejected.soft:
                return  # a lower-ranked gang yields: this member retries, the others stay held
            if fresh and any(w.get("strict", True) for w in state.waiting.values()):
                self._give_up(state, reason, out, trigger=hid)
            elif not fresh:  # a replay: re-send the give-up it caused, if any
                for members in state.gave_up.values():
                    if members and members[0].get("trigger") == hid:
                        self._resend_give_up(state, members, reason, out)

    # -- gangs that cannot complete -----------------------------------------------------------

    def _timeout(self, state: LedgerState, round_: int, out: Decision) -> None:
        recorded = state.gave_up.get(str(round_))
        if recorded is not None:  # a replayed timeout: re-send what it did
            self._resend_give_up(state, recorded, "gang waiting time exceeded", out)
        elif round_ == state.round and state.timer_s and state.waiting:
            self._give_up(state, "gang waiting time exceeded", out)

    def _yield(self, state: LedgerState, y: Yield, out: Decision) -> None:
        """Wound-wait: a higher-ranked gang needs what this gang holds on `y.node`. Still
        waiting: release and requeue every held member. Already accepted or given up: nothing
        (a replayed Yield re-sends what it did)."""
        trigger = f"yield:{y.node}:{','.join(y.holds)}"
        reason = f"yielded to gang {y.winner} (wound-wait)"
        if any(hid in state.waiting for hid in y.holds):
            self._give_up(state, reason, out, trigger=trigger)
            return
        for members in state.gave_up.values():
            if members and members[0].get("trigger") == trigger:
                self._resend_give_up(state, members, reason, out)

    def _give_up(self, state: LedgerState, reason: str, out: Decision, trigger: str = "") -> None:
        """Release every held member of the waiting gang and requeue them together."""
        members = []
        for wid, w in sorted(state.waiting.items()):
            entry = state.pods.setdefault(w["uid"], PodEntry())
            entry.attempt = max(entry.attempt, w["attempt"] + 1)
            state.decisions[wid] = RELEASED
            members.append({"uid": w["uid"], "attempt": w["attempt"], "node": w["node"], "next": entry.attempt,
                            "trigger": trigger})
        state.waiting.clear()
        state.gave_up[str(state.round)] = members
        state.round, state.timer_s = state.round + 1, 0.0
        self._resend_give_up(state, members, reason, out)

    def _resend_give_up(self, state: LedgerState, members: list[dict[str, Any]], reason: str, out: Decision) -> None:
        for m in members:
            out.first.append(Output(topics.NODE_INBOX, m["node"], Release(
                uid=m["uid"], attempt=m["attempt"], node=m["node"], decision_key=state.key, reason=reason,
            )))
            out.first.append(Output(topics.REQUEUE, m["uid"], Requeue(
                uid=m["uid"], attempt=m["next"], decision_key=state.key, reason=reason,
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
