"""Deciders: the pod ledger, partitioned by decision key, the only writer of Bindings.

A decision key is a pod's gang (namespace/name) when it has one, else its uid, so one decider
sees every member of a gang. The decisions:

- the first Held of a pending pod is accepted (a gang: once `gang_min` members are held, all
  of them at once): Commit to the node's inbox, and, only after the broker acknowledged the
  Commit, the Binding (`Decision.after_commit`). Accepting a pod also clears every nomination
  made for it: the one its Held names and the ones owners made when they rejected it softly;
- once a gang has been accepted, a member that arrives later (beyond min-available) is
  accepted at once, like a single pod (as Koordinator lets members of a satisfied gang
  through). The gang stays satisfied while any of its members is bound; once every bound
  member is terminated or deleted the gang starts over and waits for min-available again (a
  new job reusing the gang's name is a new gang);
- every other Held (pod already bound, deleted, an older attempt, or a second claim) gets a
  Release; a Held of an older attempt of a pending pod also announces the latest attempt again
  (a Requeue, as a stale Rejected does): its scheduler lost count (a restart) and would wait
  for ever;
- a Rejected of a pending pod requeues it with the next attempt (an older attempt announces
  the latest one again); a soft rejection (wound-wait) also notes the node where the owner
  nominated the pod (`PodEntry.nominated`); a soft rejection of a pod that is bound or gone
  (or not known here: forgotten) clears that nomination at once;
- a deleted pod releases what it holds and clears its nominations; a deleted bound pod is
  terminated at its node. A termination (PodTerminated) makes a pod final.

Replay re-sends, never re-decides (DESIGN.md, rule 1). Every input's outcome is recorded with
all the outputs it caused, and a redelivered input re-sends them in full, rebuilt from the
record, never from the redelivered message (a redelivered Held that carries other devices or
names gets byte-identical outputs). What is recorded, by input:

- Held / Rejected, by hold id: `decisions[hold id]` (accepted, released, waiting,
  `requeued:<attempt>`, ignored) and, for the Release or Requeue it got, `reasons[hold id]`;
  uid, attempt and node come from the hold id itself, the decision key is the ledger's;
- an acceptance, as a group: `accepted[hold id]` holds what rebuilds that member's Commit,
  NominationCleareds and Binding besides its hold id (namespace, name, claimed devices, the
  nodes whose nominations it clears: the Held's nominated node and `PodEntry.nominated`, as
  they were at the decision) and its group; `groups[group id]` lists the hold ids of a gang's
  round (`round:<n>`) accepted together (a pod accepted alone is its own group, unlisted). A
  redelivered Held of any member re-sends the whole group (once per batch): after a crash
  only the member that completed the gang may come back, and its fellow members must be
  committed and bound too;
- the outputs of the rarer inputs, as plain records in `sent[input id]`: a deletion
  (`deleted:<uid>`: its Releases, NominationCleareds or PodTerminated), a termination of a
  pod still pending (`terminated:<uid>`), a soft rejection of a pod bound or gone (hold id:
  its NominationCleared);
- a Held of an older attempt of a pending pod: its Requeue in `sent[hold id]`;
- a gang given up, per round: `gave_up[round]`, its members' Release and Requeue (past every
  attempt the member's scheduler may hold: its own and any requeued since) with the
  trigger (`timeout:<round>`, the rejected hold id, `yield:<node>:<holds>`) and the reason, so
  that the same trigger redelivered re-sends them and no other input does (a round given up
  by a Strict rejection is not re-sent by its timer firing later). Only the rounds given up
  by the latest batch that gave one up are kept, and the records of the older attempts of a
  pending gang's pods are dropped then: a gang that loses round after round keeps a ledger of
  one round (`Decider._forget_older_attempts` says why that is safe).

A redelivered Held whose hold was released by another input (a give-up, a deletion) gets its
Release again (owners ignore a Release of a hold not held). A PodTerminated of a bound pod
changes only its status, so a redelivered one finds nothing to do, as the first time.

States written before these records existed still read (new fields default to empty); where
an old record lacks what rebuilds the outputs (an acceptance or requeue decided by the
earlier code) the decider falls back to the message, as that code did.

Gangs wait for their members with a timer: when a gang's first member is held, the decider
asks its agent for a timer (`Decision.timers`: key, round, seconds); the agent arms it and,
when it fires, appends `GangTimeout(key, round)` to the gang's own `holds` partition. If the
gang is still waiting in that round, every held member is released and requeued together.
In Strict mode (the default) a rejection of a member's current attempt takes the gang's held
members down with it, so the gang retries as a whole instead of keeping capacity held for a
gang that cannot complete; except a rejection for what only the gang's own held members take
there (`Rejected.fellow`: two members placed on the same capacity at once, by two schedulers),
which requeues that member alone: its scheduler then sees its fellows' holds, where a give-up
would requeue them all together to collide again. The round's timer is then shortened to
`FELLOW_GRACE_S`: a member with nowhere else to go (its scheduler finds no room, and does
not claim again) ends the round in seconds rather than keep its fellows' holds, one of which
could move, until the gang's full waiting time.

Wound-wait (DESIGN.md, rule 6): a `Yield` from an owner (a higher-ranked gang needs what this
gang holds there) gives the gang up like a timeout if it is still waiting; a soft rejection
(the owner asked others to yield for this member) requeues the member without Strict mode.

Elastic quotas (`agents.state.quotas`): a group about to be accepted (a pod, a gang's round, a
late member) whose pods count against a quota the decider's `QuotaTree` knows is not committed
yet: it waits in `asking` (its holds still held, its Helds recorded `asking`) while each quota
tree's ledger is asked (`QuotaAsk` on `holds`, key `quota:<root>`), and is accepted as above
once every tree granted it (`QuotaGranted`). A `QuotaDenied` releases its holds and requeues
its pods (recorded in `denied` for the latest batch that was denied, so that the denial
redelivered re-sends the same outputs); a pod deleted while its group asks takes the group
down (its fellows requeued). A grant for a group no longer asking is given back
(`QuotaReturn`), and so is a committed pod's grant when its owner tells the decider the pod
was terminated (recorded with that termination's outputs). A Held redelivered while asking
re-sends the asks; a grant redelivered for a committed group re-sends the group's outputs.

Decisions are final: an accepted hold is never released, a bound pod never requeued.

Retention (`agents.state.retention`, DESIGN.md rule 10): a deleted pod is forgotten a
retention after its deletion (log time), with every record of its holds; a Held or Rejected
whose claim is older than half the retention at its log time is refused (a Release, and a
Requeue with the next attempt), and leaves nothing behind when its pod is not known. A key
with nothing left is deleted from the table (`Decider.empty`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import repeat
from typing import Any

from agents.ports import Output, Problem
from agents.state import cpus, devices
from agents.state.quotas import QuotaTree
from agents.state.retention import DEFAULT_RETENTION_S, expired, stale
from schemas import topics
from schemas.codec import decode_object, to_plain
from schemas.records import (
    GANG_DEFAULT_WAITING_S,
    Binding,
    Commit,
    GangTimeout,
    Held,
    HoldId,
    NominationCleared,
    PodDeleted,
    PodTerminated,
    QuotaAsk,
    QuotaDenied,
    QuotaGranted,
    QuotaItem,
    QuotaReturn,
    Record,
    Rejected,
    Release,
    Requeue,
    ResourceList,
    Yield,
)


class PodStatus(StrEnum):
    """A pod in a decision key's ledger (`PodEntry.status`)."""

    PENDING = "pending"  # not bound yet: its holds are decided as they come
    BOUND = "bound"  # a Binding went out; final
    DELETED = "deleted"  # deleted before it was bound
    TERMINATED = "terminated"  # bound, then gone


class Outcome(StrEnum):
    """What a hold's Held or Rejected got (`LedgerState.decisions`; a requeue is recorded as
    `requeued:<attempt>`)."""

    ACCEPTED = "accepted"
    RELEASED = "released"
    WAITING = "waiting"  # a gang member held, its gang not complete yet
    ASKING = "asking"  # accepted here, waiting for its elastic quota's ledger to grant it
    REQUEUED = "requeued"
    IGNORED = "ignored"


PENDING, BOUND, DELETED, TERMINATED = PodStatus.PENDING, PodStatus.BOUND, PodStatus.DELETED, PodStatus.TERMINATED
ACCEPTED, RELEASED, WAITING, REQUEUED, IGNORED = (Outcome.ACCEPTED, Outcome.RELEASED, Outcome.WAITING,
                                                  Outcome.REQUEUED, Outcome.IGNORED)
ASKING = Outcome.ASKING

REASON_TIMEOUT = "gang waiting time exceeded"
REASON_STALE = "the claim is older than half the state retention (placed again)"
FELLOW_GRACE_S = 15.0  # after a fellow refusal: how long the round may still wait


@dataclass
class PodEntry:
    status: str = PENDING
    node: str = ""
    attempt: int = 0  # the attempt bound, or the latest one requeued
    namespace: str = ""
    name: str = ""
    nominated: list[str] = field(default_factory=list)  # nodes whose owners nominated it (soft rejections)
    gone: float = 0.0  # the log time of its deletion: forgotten a retention later

    def plain(self) -> dict[str, Any]:
        raw = dict(self.__dict__)
        if self.nominated:
            raw["nominated"] = list(self.nominated)
        else:
            del raw["nominated"]  # most pods have none: keep the table's bytes as they were
        if not self.gone:
            del raw["gone"]
        return raw


@dataclass
class LedgerState:
    """One decision key's ledger; the value of the deciders' table."""

    key: str
    pods: dict[str, PodEntry] = field(default_factory=dict)
    decisions: dict[str, str] = field(default_factory=dict)  # hold id -> outcome of its Held / Rejected
    waiting: dict[str, dict[str, Any]] = field(default_factory=dict)  # gang holds not yet decided
    round: int = 0  # the gang's current wait; a timer belongs to one round
    timer_s: float = 0.0  # the armed timer's length (0: none armed for this round)
    gave_up: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # round -> members released
    accepted: dict[str, dict[str, Any]] = field(default_factory=dict)  # hold id -> what rebuilds its outputs
    groups: dict[str, list[str]] = field(default_factory=dict)  # group id -> hold ids accepted together (2+)
    reasons: dict[str, str] = field(default_factory=dict)  # hold id -> reason of the Release / Requeue it got
    sent: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # input id -> other outputs it caused
    # Groups waiting for their quota ledgers: group id -> {"members": hold id -> `_waiting`,
    # "roots": ledger key -> {"uids": [...], "granted": bool}}.
    asking: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Groups their quota ledger denied, of the latest batch that denied one: group id ->
    # {"uids": [...], "outputs": [plain outputs]}, re-sent when the denial is redelivered.
    denied: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "pods": {uid: p.plain() for uid, p in self.pods.items()},
            "decisions": self.decisions,
            "waiting": self.waiting,
            "round": self.round,
            "timer_s": self.timer_s,
            "gave_up": self.gave_up,
            "accepted": self.accepted,
            # Left out when empty, as most keys (single pods) have none of these.
            **{name: value for name, value in (("groups", self.groups), ("reasons", self.reasons),
                                               ("sent", self.sent), ("asking", self.asking),
                                               ("denied", self.denied)) if value},
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
            accepted=dict(raw.get("accepted", {})),
            groups=dict(raw.get("groups", {})),
            reasons=dict(raw.get("reasons", {})),
            sent=dict(raw.get("sent", {})),
            asking=dict(raw.get("asking", {})),
            denied=dict(raw.get("denied", {})),
        )


@dataclass
class Decision:
    """Outputs of one batch. `first` must be acknowledged before `after_commit` is sent."""

    first: list[Output] = field(default_factory=list)
    after_commit: list[Output] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    timers: list[tuple[str, int, float]] = field(default_factory=list)  # (key, round, seconds) to arm


def _plain(output: Output) -> dict[str, Any]:
    return {"topic": output.topic, "key": output.key, "record": to_plain(output.record)}


def _output(raw: dict[str, Any]) -> Output:
    return Output(raw["topic"], raw["key"], decode_object(raw["record"]))


class Decider:
    def __init__(self, retention_s: float = DEFAULT_RETENTION_S, quotas: QuotaTree | None = None) -> None:
        self.retention_s = retention_s
        self.quotas = quotas or QuotaTree()  # the elastic quotas whose ledgers are asked before a commit
        self._rounds: set[str] = set()  # the batch's rounds (`apply`)

    def apply(self, state: LedgerState, records: Iterable[Record], out: Decision,
              times: Iterable[float] | None = None, now: float = 0.0, batch: set[str] | None = None) -> LedgerState:
        """`times`: each record's log time; `now`: the newest log time of the batch (by
        default unknown: nothing is stale or forgotten). Pods deleted more than the retention
        before it are forgotten, with every record of their holds.

        `batch`: the gang rounds whose give-up the batch this call belongs to has sent, first
        or again (by default the call is a batch of its own). A caller that applies one batch
        in several calls (the protocol model, a record at a time) passes the same set to each:
        a round given up in an earlier batch is forgotten when a later one gives up another
        (`_give_up`), which is safe only once the earlier batch's outputs are acknowledged."""
        resent: set[str] = set()  # groups re-sent in this batch: once is enough
        self._rounds = batch if batch is not None else set()
        for record, t in zip(records, times if times is not None else repeat(0.0), strict=False):
            now = max(now, t)
            if isinstance(record, Held):
                self._held(state, record, out, resent, t)
            elif isinstance(record, Rejected):
                self._rejected(state, record, out, t)
            elif isinstance(record, PodDeleted):
                self._deleted(state, record, out, t)
            elif isinstance(record, PodTerminated):
                self._terminated(state, record, out)
            elif isinstance(record, GangTimeout):
                self._timeout(state, record.round, out)
            elif isinstance(record, Yield):
                self._yield(state, record, out)
            elif isinstance(record, QuotaGranted):
                self._granted(state, record, out, resent)
            elif isinstance(record, QuotaDenied):
                self._denied(state, record, out)
            else:
                out.problems.append(Problem("kind", record.KIND, f"{record.KIND} does not belong on holds", record))
        if now:
            for uid, p in state.pods.items():  # deleted in a state written before `gone` existed: from now
                if not p.gone and p.status != PENDING and f"deleted:{uid}" in state.sent:
                    p.gone = now
        gone = {uid for uid, p in state.pods.items() if expired(p.gone, now, self.retention_s)}
        if gone:
            del_pods(state, gone)
        return state

    @staticmethod
    def empty(state: LedgerState) -> bool:
        """Nothing left to keep: no pod, no gang round begun (a gang's round counter stays, so
        that a timer of an old round never ends a new one)."""
        return (not state.pods and not state.waiting and not state.round and not state.timer_s
                and not state.asking and not state.denied)

    # -- recorded outputs ---------------------------------------------------------------------

    @staticmethod
    def _send(state: LedgerState, input_id: str, outputs: list[Output], out: Decision, keep_empty: bool = False) -> None:
        """Record what an input caused (besides acceptances and give-ups) and send it."""
        if outputs or keep_empty:
            state.sent[input_id] = [_plain(o) for o in outputs]
        out.first.extend(outputs)

    @staticmethod
    def _resend(state: LedgerState, input_id: str, out: Decision) -> None:
        out.first.extend(_output(raw) for raw in state.sent.get(input_id, ()))

    @staticmethod
    def _release(key: str, uid: str, attempt: int, node: str, reason: str) -> Output:
        return Output(topics.NODE_INBOX, node, Release(
            uid=uid, attempt=attempt, node=node, decision_key=key, reason=reason,
        ))

    @staticmethod
    def _requeue(key: str, uid: str, attempt: int, reason: str) -> Output:
        return Output(topics.REQUEUE, uid, Requeue(uid=uid, attempt=attempt, decision_key=key, reason=reason))

    # -- Held ---------------------------------------------------------------------------------

    def _held(self, state: LedgerState, held: Held, out: Decision, resent: set[str], t: float) -> None:
        hid = held.hold_id
        recorded = state.decisions.get(hid)
        if recorded is not None:
            self._resend_held(state, held, recorded, out, resent)
            return
        too_old = stale(held.scheduled_at, t, self.retention_s)
        entry = state.pods.get(held.uid)
        if entry is None and too_old:  # perhaps a pod forgotten: answered, nothing recorded
            out.first.append(self._release(state.key, held.uid, held.attempt, held.node, REASON_STALE))
            out.first.append(self._requeue(state.key, held.uid, held.attempt + 1, REASON_STALE))
            return
        if entry is None:
            entry = state.pods[held.uid] = PodEntry(namespace=held.namespace, name=held.name)
        refusal = self._refusal(state, entry, held) or (REASON_STALE if too_old else "")
        if refusal:
            state.decisions[hid], state.reasons[hid] = RELEASED, refusal
            out.first.append(self._release(state.key, held.uid, held.attempt, held.node, refusal))
            if entry.status == PENDING and (held.attempt < entry.attempt or too_old):
                # A scheduler that lost count (a restart) claimed an older attempt: announce the
                # latest again, as for a stale rejection, or it waits for an answer for ever.
                # A claim too old to act on: its pod is placed again with the next attempt.
                if too_old:
                    entry.attempt = max(entry.attempt, held.attempt + 1)
                self._send(state, hid, [self._requeue(state.key, held.uid, entry.attempt, refusal)], out)
            return
        if held.gang_min <= 1 or self._satisfied(state):
            self._admit(state, hid, {hid: self._waiting(held)}, out, resent)
            return
        state.decisions[hid] = WAITING
        state.waiting[hid] = self._waiting(held)
        if not state.timer_s:
            state.timer_s = held.gang_waiting_s or GANG_DEFAULT_WAITING_S
            out.timers.append((state.key, state.round, state.timer_s))
        if len(state.waiting) >= held.gang_min:
            group = f"round:{state.round}"
            state.round, state.timer_s = state.round + 1, 0.0  # complete: this round's timer is moot
            members = dict(sorted(state.waiting.items()))
            state.waiting.clear()
            self._admit(state, group, members, out, resent)

    @staticmethod
    def _refusal(state: LedgerState, entry: PodEntry, held: Held) -> str:
        """Why a new Held of this pod gets a Release ("" if it may be accepted or wait)."""
        if entry.status != PENDING:
            return f"pod is {entry.status}"
        if held.attempt < entry.attempt:  # requeued since
            return "an older attempt"
        if any(w["uid"] == held.uid for w in state.waiting.values()):
            return "another claim of the pod is waiting"
        if any(w["uid"] == held.uid for g in state.asking.values() for w in g["members"].values()):
            return "another claim of the pod waits for its quota"
        return ""

    @staticmethod
    def _satisfied(state: LedgerState) -> bool:
        """The gang was accepted and some member is still bound: later members bind at once."""
        return any(p.status == BOUND for p in state.pods.values())

    @staticmethod
    def _waiting(held: Held) -> dict[str, Any]:
        """What the decider keeps of a Held until its hold is decided (`LedgerState.waiting`):
        the one place a Held's fields are copied here (`_member` and the Binding take them
        from this)."""
        return {"uid": held.uid, "attempt": held.attempt, "node": held.node, "namespace": held.namespace,
                "name": held.name, "nominated_node": held.nominated_node, "gang_min": held.gang_min,
                "devices": list(held.devices), "strict": held.gang_strict,
                **({"quota": held.quota, "requests": dict(held.requests)} if held.quota else {})}

    @staticmethod
    def _member(waiting: dict[str, Any], entry: PodEntry | None) -> dict[str, Any]:
        """What rebuilds an accepted hold's outputs besides its hold id (uid, attempt, node),
        taken from its `_waiting` entry when it is decided; empty lists are left out (most
        pods have none)."""
        member: dict[str, Any] = {"namespace": waiting["namespace"], "name": waiting["name"]}
        clears: list[str] = []
        for n in [waiting.get("nominated_node", ""), *(entry.nominated if entry else ())]:
            if n and n not in clears:
                clears.append(n)
        if clears:
            member["clears"] = clears
        if waiting.get("devices"):
            member["devices"] = list(waiting["devices"])
        return member

    def _accept(self, state: LedgerState, group: str, members: dict[str, dict[str, Any]], out: Decision) -> None:
        """Accept `members` (hold id -> `_member`) together as `group` and send their outputs."""
        if group not in members:  # a gang's round; a pod accepted alone is its own group
            state.groups[group] = list(members)
        for hid, m in members.items():
            uid, attempt, node = HoldId.parse(hid)
            entry = state.pods.setdefault(uid, PodEntry())
            entry.status, entry.node, entry.attempt = BOUND, node, attempt
            entry.namespace, entry.name = m["namespace"], m["name"]
            if group != hid:
                m["group"] = group
            state.accepted[hid] = m
            state.decisions[hid] = ACCEPTED
        self._emit_group(state, group, out)

    # -- elastic quotas: asked of their ledgers before a commit (agents.state.quotas) ------------

    def _admit(self, state: LedgerState, group: str, members: dict[str, dict[str, Any]], out: Decision,
               resent: set[str]) -> None:
        """Accept `members` (hold id -> `_waiting`) together as `group`, or, when some count
        against an elastic quota known here, first ask each quota tree's ledger for them: the
        group is committed once every tree granted it (`_granted`), released and requeued
        when one denies it (`_denied`)."""
        roots: dict[str, dict[str, Any]] = {}
        for w in members.values():
            key = self.quotas.key(w.get("quota", ""))
            if key:
                roots.setdefault(key, {"uids": [], "granted": False})["uids"].append(w["uid"])
        if not roots:
            self._accept(state, group, {hid: self._member(w, state.pods.get(w["uid"])) for hid, w in members.items()},
                         out)
            resent.add(group)
            return
        asking = state.asking[group] = {"members": members, "roots": dict(sorted(roots.items()))}
        for hid in members:
            state.decisions[hid] = ASKING
        resent.add(f"ask:{group}")
        self._send_asks(state, group, asking, out)

    @staticmethod
    def _send_asks(state: LedgerState, group: str, asking: dict[str, Any], out: Decision) -> None:
        """The group's asks to the ledgers that have not granted it yet, built from the record."""
        for key, root in asking["roots"].items():
            if root["granted"]:
                continue
            items = tuple(QuotaItem(uid=w["uid"], quota=w["quota"], requests=ResourceList(w["requests"]))
                          for _, w in sorted(asking["members"].items()) if w["uid"] in root["uids"])
            out.first.append(Output(topics.HOLDS, key, QuotaAsk(decision_key=key, asker=state.key, group=group,
                                                                items=items)))

    @staticmethod
    def _return(quota_key: str, key: str, group: str, uids: Iterable[str]) -> Output:
        return Output(topics.HOLDS, quota_key, QuotaReturn(decision_key=quota_key, asker=key, group=group,
                                                           uids=tuple(uids)))

    def _granted(self, state: LedgerState, granted: QuotaGranted, out: Decision, resent: set[str]) -> None:
        """A quota tree's ledger counts the group: once every tree did, commit it. A grant for a
        group not asking any more (given up, deleted, denied by another tree, or a late copy
        of an ask answered again) is given back, except for the pods the group holds bound (a
        redelivered grant of a committed group re-sends the group's outputs, as its Held
        would)."""
        asking = state.asking.get(granted.group)
        if asking is not None and granted.quota_key in asking["roots"]:
            asking["roots"][granted.quota_key]["granted"] = True
            if not all(r["granted"] for r in asking["roots"].values()):
                return
            del state.asking[granted.group]
            members = {}
            for hid, w in sorted(asking["members"].items()):
                m = self._member(w, state.pods.get(w["uid"]))
                quota = next((k for k, r in asking["roots"].items() if w["uid"] in r["uids"]), "")
                if quota:
                    m["quota"] = quota  # what its end gives back (`_returns`)
                members[hid] = m
            self._accept(state, granted.group, members, out)
            resent.add(granted.group)
            if state.waiting and self._satisfied(state):
                # Members that came while the gang waited for its quota bind like late members.
                late = dict(sorted(state.waiting.items()))
                state.waiting.clear()
                state.round, state.timer_s = state.round + 1, 0.0
                for hid, w in late.items():
                    self._admit(state, hid, {hid: w}, out, resent)
            return
        accepted = [hid for hid, m in state.accepted.items() if m.get("group", hid) == granted.group]
        if accepted and granted.group not in resent:
            resent.add(granted.group)
            self._emit_group(state, granted.group, out)
        bound = set()
        for hid in accepted:
            uid = HoldId.parse(hid).uid
            entry = state.pods.get(uid)
            if entry is not None and entry.status == BOUND:
                bound.add(uid)
        back = [u for u in granted.uids if u not in bound]
        if back:
            out.first.append(self._return(granted.quota_key, state.key, granted.group, back))

    def _denied(self, state: LedgerState, denied: QuotaDenied, out: Decision) -> None:
        """A quota tree's ledger refuses the group: every member's hold is released and its pod
        requeued (what other trees granted it is given back). Recorded for the batch, so that
        the denial redelivered re-sends the same outputs."""
        recorded = state.denied.get(denied.group)
        if recorded is not None:
            out.first.extend(_output(raw) for raw in recorded["outputs"])
            return
        asking = state.asking.get(denied.group)
        if asking is None or denied.quota_key not in asking["roots"]:
            return  # given up or deleted since (its outputs went then), or a late copy
        del state.asking[denied.group]
        outputs = self._drop_asking(state, denied.group, asking, denied.reason)
        for old in [g for g in state.denied if f"denied:{g}" not in self._rounds]:
            del state.denied[old]
        state.denied[denied.group] = {"uids": sorted({w["uid"] for w in asking["members"].values()}),
                                      "outputs": [_plain(o) for o in outputs]}
        self._rounds.add(f"denied:{denied.group}")
        out.first.extend(outputs)

    def _drop_asking(self, state: LedgerState, group: str, asking: dict[str, Any], reason: str,
                     gone: str = "") -> list[Output]:
        """A group that asked for its quota is not committed: every member's hold released,
        its pod requeued past the attempt (but `gone`, a pod deleted or terminated), what a
        ledger granted given back."""
        outputs: list[Output] = []
        for hid, w in sorted(asking["members"].items()):
            uid = w["uid"]
            entry = state.pods.setdefault(uid, PodEntry())
            state.decisions[hid], state.reasons[hid] = RELEASED, reason
            outputs.append(self._release(state.key, uid, w["attempt"], w["node"], reason))
            if uid != gone and entry.status == PENDING:
                entry.attempt = max(entry.attempt, w["attempt"]) + 1
                outputs.append(self._requeue(state.key, uid, entry.attempt, reason))
        for key, root in asking["roots"].items():
            if root["granted"]:
                outputs.append(self._return(key, state.key, group, root["uids"]))
        return outputs

    def _returns(self, state: LedgerState, uid: str) -> list[Output]:
        """What a committed pod that ended gives back to its quota's ledger."""
        return [self._return(m["quota"], state.key, m.get("group", hid), [uid])
                for hid, m in state.accepted.items() if m.get("quota") and _uid_of(hid) == uid]

    def _emit_group(self, state: LedgerState, group: str, out: Decision) -> None:
        for hid in state.groups.get(group, (group,)):  # a pod accepted alone is its own group
            self._emit_member(state.key, hid, state.accepted[hid], out)

    @staticmethod
    def _emit_member(key: str, hid: str, m: dict[str, Any], out: Decision) -> None:
        uid, attempt, node = HoldId.parse(hid)
        out.first.append(Output(topics.NODE_INBOX, node, Commit(uid=uid, attempt=attempt, node=node, decision_key=key)))
        for n in m.get("clears", ()):
            out.first.append(Output(topics.NODE_INBOX, n, NominationCleared(uid=uid, node=n)))
        claimed = tuple(m.get("devices", ()))
        allocated, nics = devices.decode(claimed), devices.decode_rdma(claimed)
        annotations = {devices.DEVICE_ALLOCATED: devices.annotation(allocated, nics)} if allocated or nics else {}
        cpusets = cpus.decode(claimed)
        if cpusets:
            annotations[cpus.RESOURCE_STATUS] = cpus.annotation(cpusets)
        out.after_commit.append(Output(topics.BINDINGS, uid, Binding(
            uid=uid, namespace=m["namespace"], name=m["name"], node=node,
            attempt=attempt, decision_key=key, annotations=annotations,
        )))

    def _resend_held(self, state: LedgerState, held: Held, recorded: str, out: Decision, resent: set[str]) -> None:
        hid = held.hold_id
        if recorded == ACCEPTED:
            member = state.accepted.get(hid)
            if member is None:  # decided by earlier code, which kept no record: rebuilt as it did
                self._emit_member(state.key, hid, self._member(self._waiting(held), None), out)
            elif member.get("group", hid) not in resent:
                resent.add(member.get("group", hid))
                self._emit_group(state, member.get("group", hid), out)
        elif recorded == RELEASED:
            # No reason recorded: released by another input (a give-up, a deletion), which
            # re-sends it too, or decided by earlier code.
            uid, attempt, node = HoldId.parse(hid)
            out.first.append(self._release(state.key, uid, attempt, node, state.reasons.get(hid, "replayed")))
            self._resend(state, hid, out)  # the latest attempt announced to a stale claim
        elif recorded.startswith(REQUEUED) or recorded == IGNORED:
            # The same hold id was answered Rejected before: its owner, having forgotten that,
            # held a replay of the claim. Released (it never waits for ever).
            uid, attempt, node = HoldId.parse(hid)
            out.first.append(self._release(state.key, uid, attempt, node, "the claim was rejected before"))
        elif recorded == ASKING:  # its group's asks, once per batch
            for group, asking in state.asking.items():
                if hid in asking["members"] and f"ask:{group}" not in resent:
                    resent.add(f"ask:{group}")
                    self._send_asks(state, group, asking, out)
        # WAITING: the Held caused nothing yet.

    # -- Rejected -----------------------------------------------------------------------------

    def _rejected(self, state: LedgerState, rejected: Rejected, out: Decision, t: float) -> None:
        """Requeue a pending pod with its next attempt, recorded as `requeued:<attempt>`.

        A rejection of an attempt older than the pod's latest (a scheduler that restarted and
        lost count) announces the latest attempt again, so that scheduler catches up instead
        of waiting forever for an answer; it does not take the gang's current round down.
        """
        hid = rejected.hold_id
        strict_reason = f"gang member {rejected.uid} was rejected (Strict mode)"
        recorded = state.decisions.get(hid)
        if recorded is not None:  # a replay: re-send what it sent, and the give-up it caused
            if recorded.startswith(REQUEUED):
                uid, _, node = HoldId.parse(hid)
                legacy = f"{node}: {rejected.reason}"  # recorded by earlier code, which kept no reason
                out.first.append(self._requeue(state.key, uid, int(recorded.rsplit(":", 1)[1]),
                                               state.reasons.get(hid, legacy)))
            self._resend(state, hid, out)
            self._resend_give_ups(state, hid, strict_reason, out)
            return
        entry = state.pods.get(rejected.uid)
        if entry is None and stale(rejected.scheduled_at, t, self.retention_s):
            # The answer to a claim too old to act on, of a pod not known here (perhaps
            # forgotten): its scheduler, if it still has the pod, places it again; a scheduler
            # ignores a Requeue of a pod it does not have. Nothing recorded. A soft rejection
            # nominated the pod at its owner: cleared now, or a pod deleted and forgotten here
            # would keep it for ever (nominations have no lapse timer).
            out.first.append(self._requeue(state.key, rejected.uid, rejected.attempt + 1, REASON_STALE))
            if rejected.soft:
                out.first.append(Output(topics.NODE_INBOX, rejected.node,
                                        NominationCleared(uid=rejected.uid, node=rejected.node)))
            return
        if entry is None:
            entry = state.pods[rejected.uid] = PodEntry()
        current = False
        if entry.status == PENDING:
            current = rejected.attempt >= entry.attempt
            entry.attempt = max(entry.attempt, rejected.attempt + 1)
            reason = f"{rejected.node}: {rejected.reason}"
            state.decisions[hid], state.reasons[hid] = f"{REQUEUED}:{entry.attempt}", reason
            out.first.append(self._requeue(state.key, rejected.uid, entry.attempt, reason))
            if rejected.soft and rejected.node not in entry.nominated:
                entry.nominated.append(rejected.node)  # cleared when the pod binds or is deleted
        else:
            state.decisions[hid] = IGNORED
            if rejected.soft:  # the owner nominated a pod that is bound or gone: clear it now
                self._send(state, hid, [Output(topics.NODE_INBOX, rejected.node,
                                               NominationCleared(uid=rejected.uid, node=rejected.node))], out)
        if current and not rejected.soft and any(w.get("strict", True) for w in state.waiting.values()):
            if rejected.fellow:  # requeued alone; the round waits FELLOW_GRACE_S at most now
                if state.timer_s > FELLOW_GRACE_S:
                    state.timer_s = FELLOW_GRACE_S  # what a restore re-arms
                    out.timers.append((state.key, state.round, FELLOW_GRACE_S))
                return
            self._give_up(state, strict_reason, out, trigger=hid)

    # -- gangs that cannot complete -----------------------------------------------------------

    def _timeout(self, state: LedgerState, round_: int, out: Decision) -> None:
        trigger = f"timeout:{round_}"
        recorded = state.gave_up.get(str(round_))
        if recorded is not None:
            # A replayed timeout re-sends what it did ("": written before triggers named
            # timeouts); a round given up otherwise (Strict, Yield) is not the timer's.
            if recorded and recorded[0].get("trigger", "") in ("", trigger):
                self._rounds.add(str(round_))
                self._send_give_up(state, recorded, REASON_TIMEOUT, out)
        elif round_ == state.round and state.timer_s and state.waiting:
            self._give_up(state, REASON_TIMEOUT, out, trigger=trigger)
        # An older round whose give-up was forgotten (`_give_up`) sent it in a batch whose
        # outputs were acknowledged before a later batch was decided: nothing to re-send.

    def _yield(self, state: LedgerState, y: Yield, out: Decision) -> None:
        """Wound-wait: a higher-ranked gang needs what this gang holds on `y.node`. Still
        waiting: release and requeue every held member. Already accepted or given up: nothing
        (a replayed Yield re-sends what it did)."""
        trigger = f"yield:{y.node}:{','.join(y.holds)}"
        reason = f"yielded to gang {y.winner} (wound-wait)"
        if self._resend_give_ups(state, trigger, reason, out):
            return
        if any(hid in state.waiting for hid in y.holds):
            self._give_up(state, reason, out, trigger=trigger)

    def _give_up(self, state: LedgerState, reason: str, out: Decision, trigger: str) -> None:
        """Release every held member of the waiting gang and requeue them together."""
        members = []
        for wid, w in sorted(state.waiting.items()):
            entry = state.pods.setdefault(w["uid"], PodEntry())
            # Past every attempt the pod's scheduler may hold: the member's own, and the
            # latest requeued since (a second claim of the pod, rejected or released while this
            # one waited, already announced that one, and its scheduler waits on it).
            entry.attempt = max(entry.attempt, w["attempt"]) + 1
            state.decisions[wid] = RELEASED
            members.append({"uid": w["uid"], "attempt": w["attempt"], "node": w["node"], "next": entry.attempt,
                            "trigger": trigger, "reason": reason})
        state.waiting.clear()
        for old in [r for r in state.gave_up if r not in self._rounds]:
            del state.gave_up[old]
        state.gave_up[str(state.round)] = members
        self._rounds.add(str(state.round))
        state.round, state.timer_s = state.round + 1, 0.0
        self._forget_older_attempts(state)
        self._send_give_up(state, members, reason, out)

    @staticmethod
    def _forget_older_attempts(state: LedgerState) -> None:
        """What a pending gang's lost rounds leave behind is forgotten at each give-up (issue
        28: 300 time-outs grew a ledger from 516 B to 82 kB, written whole on every batch).

        - Rounds: only those whose give-up this batch sent are kept (`_give_up`). The loop
          has a batch's outputs acknowledged before it decides the next, or it stops, or it
          reads the batch again (and a replay re-sends in log order, before anything new can
          give a round up): a round given up earlier went out. Its trigger redelivered then
          finds nothing to re-send (a timer, a Yield) or is answered as an older attempt.
        - Decisions, reasons and recorded outputs of the holds of attempts older than their
          pending pod's latest, but not a kept round's trigger, a waiting hold or an
          acceptance: a Held or Rejected of such an attempt is refused by rule (`_refusal`: a
          Release, and the latest attempt announced again; `_rejected`: a Requeue of the
          latest, with the message's reason), an equivalent of what it got, built from the
          ledger and its hold id. A redelivered input of a forgotten round so gets a correct
          answer, not byte for byte the first one (which went out)."""
        triggers = {members[0].get("trigger") for members in state.gave_up.values() if members}
        for hid, outcome in list(state.decisions.items()):
            if outcome in (ACCEPTED, WAITING, ASKING) or hid in state.waiting or hid in triggers:
                continue
            try:
                uid, attempt, _ = HoldId.parse(hid)
            except ValueError:
                continue
            entry = state.pods.get(uid)
            if entry is not None and entry.status == PENDING and attempt < entry.attempt:
                del state.decisions[hid]
                state.reasons.pop(hid, None)
                state.sent.pop(hid, None)

    def _resend_give_ups(self, state: LedgerState, trigger: str, reason: str, out: Decision) -> bool:
        """Re-send the give-ups `trigger` caused; whether there was one."""
        found = False
        for round_, members in state.gave_up.items():
            if members and members[0].get("trigger") == trigger:
                self._rounds.add(round_)
                self._send_give_up(state, members, reason, out)
                found = True
        return found

    @staticmethod
    def _send_give_up(state: LedgerState, members: list[dict[str, Any]], reason: str, out: Decision) -> None:
        """`reason` stands in only for records written before the reason was recorded."""
        for m in members:
            why = m.get("reason", reason)
            out.first.append(Decider._release(state.key, m["uid"], m["attempt"], m["node"], why))
            out.first.append(Decider._requeue(state.key, m["uid"], m["next"], why))

    # -- deletions and terminations -----------------------------------------------------------

    def _deleted(self, state: LedgerState, deleted: PodDeleted, out: Decision, t: float) -> None:
        input_id = f"deleted:{deleted.uid}"
        if input_id in state.sent:
            self._resend(state, input_id, out)
            return
        entry = state.pods.get(deleted.uid)
        if entry is None:
            entry = state.pods[deleted.uid] = PodEntry(namespace=deleted.namespace, name=deleted.name)
        entry.gone = t
        outputs: list[Output] = []
        if entry.status == PENDING:
            entry.status = DELETED
            outputs = self._gone(state, deleted.uid, entry, "pod deleted")
        elif entry.status in (BOUND, TERMINATED):  # owners ignore a second termination
            entry.status = TERMINATED
            if entry.node:
                outputs.append(Output(topics.NODE_INBOX, entry.node, PodTerminated(
                    uid=deleted.uid, node=entry.node, decision_key=state.key, reason="pod deleted",
                )))
        self._send(state, input_id, outputs, out, keep_empty=True)

    def _terminated(self, state: LedgerState, terminated: PodTerminated, out: Decision) -> None:
        """A bound pod is gone. Only a committed pod is terminated, so a pod the ledger holds
        pending (or does not know) is made final too: nothing later binds it again."""
        input_id = f"terminated:{terminated.uid}"
        if input_id in state.sent:
            self._resend(state, input_id, out)
            return
        entry = state.pods.get(terminated.uid)
        if entry is None:
            state.pods[terminated.uid] = PodEntry(status=TERMINATED, node=terminated.node)
        elif entry.status in (BOUND, TERMINATED):
            # Its node freed it: what it counted against an elastic quota goes back (the owner
            # tells the decider of a pod with a quota that ends, whoever ended it).
            entry.status = TERMINATED
            returns = self._returns(state, terminated.uid)
            if returns:
                self._send(state, input_id, returns, out)
        elif entry.status == PENDING:
            entry.status, entry.node = TERMINATED, entry.node or terminated.node
            self._send(state, input_id, self._gone(state, terminated.uid, entry, "pod terminated"), out)

    def _gone(self, state: LedgerState, uid: str, entry: PodEntry, reason: str) -> list[Output]:
        """A pending pod is gone: release its waiting holds and clear the nominations made for it."""
        outputs: list[Output] = []
        clears = list(entry.nominated)
        for group, asking in list(state.asking.items()):
            mine = [w for w in asking["members"].values() if w["uid"] == uid]
            if mine:  # its group waited for its quota: not committed now, its fellows retry
                del state.asking[group]
                outputs += self._drop_asking(state, group, asking, f"{reason} ({uid}) while its group waited for "
                                                                   "its quota", gone=uid)
                clears += [w["nominated_node"] for w in mine
                           if w.get("nominated_node") and w["nominated_node"] not in clears]
        for wid, w in list(state.waiting.items()):
            if w["uid"] == uid:
                del state.waiting[wid]
                state.decisions[wid] = RELEASED
                outputs.append(self._release(state.key, uid, w["attempt"], w["node"], reason))
                if w.get("nominated_node") and w["nominated_node"] not in clears:
                    clears.append(w["nominated_node"])
        if outputs and not state.waiting:
            # Its last waiting member gone, the round ends: its timer is moot, and the next
            # member to wait arms a timer for a new round.
            state.round, state.timer_s = state.round + 1, 0.0
        outputs += [Output(topics.NODE_INBOX, n, NominationCleared(uid=uid, node=n)) for n in clears]
        return outputs


def _uid_of(hid: str) -> str | None:
    try:
        return HoldId.parse(hid).uid
    except ValueError:  # an input id ("deleted:<uid>", a give-up trigger)
        return None


def del_pods(state: LedgerState, uids: set[str]) -> None:
    """Remove every record of these pods (gone for longer than the retention): their entries,
    their holds' decisions, reasons, acceptances and recorded outputs, their part of gang
    rounds accepted or given up."""
    for uid in uids:
        del state.pods[uid]
        state.sent.pop(f"deleted:{uid}", None)
        state.sent.pop(f"terminated:{uid}", None)
    for table in (state.decisions, state.reasons, state.accepted, state.sent):
        for hid in [h for h in table if _uid_of(h) in uids]:
            del table[hid]
    for table in (state.asking, state.denied):
        for group in [g for g, v in table.items()
                      if uids & set(v.get("uids", ())) or any(w["uid"] in uids for w in v.get("members", {}).values())]:
            del table[group]
    for group, hids in list(state.groups.items()):
        kept = [h for h in hids if _uid_of(h) not in uids]
        if kept:
            state.groups[group] = kept
        else:
            del state.groups[group]
    for round_, members in list(state.gave_up.items()):
        kept_members = [m for m in members if m["uid"] not in uids]
        if kept_members:
            state.gave_up[round_] = kept_members
        else:
            del state.gave_up[round_]
