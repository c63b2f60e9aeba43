"""Quota ledgers: the one writer of each elastic quota tree's admissions (issue 28, item 2).

A scheduler replica checks a pod's elastic quota against what it sees (bound pods and its own
claims): two replicas, a restarted one, or a gang held through its waiting time can each
admit pods the others do not see, and together take a quota past its max. So the check that
counts is made where the decision is final, by a single writer per quota tree:

- every elastic quota tree (a top-level quota and its descendants, from the profiles'
  ElasticQuota args: `QuotaTree`) has a ledger, keyed `quota:<root quota>` on `holds`, kept
  by the deciders (its table is the deciders' table, keyed like its input: DESIGN.md rule 3);
- a decider about to commit pods (a single pod, a gang's round, a late member of an
  accepted gang) whose quota the tree knows sends the ledger a `QuotaAsk` (the group, and per
  pod its uid, quota and request) and commits only on `QuotaGranted`; on `QuotaDenied` it
  releases and requeues the group (`agents.state.ledger`);
- the ledger grants a group when, for every quota of its pods and each of their ancestors,
  used + asked <= max in every resource the max names (a resource without a max is not
  limited), else denies it. All the group's pods, or none. `used` is what the grants held
  sum to (a quota's own pods and its descendants'). The grant is recorded by pod uid with the
  group it was made for: an ask redelivered, or asked again for another group of the same pod
  (a retry), is granted again without counting twice, and the grant follows the latest group;
- a `QuotaReturn` (uids, group) frees the grants that still belong to that group: the
  decider sends it when a committed pod ends (its owner's termination reaches it: a deleted,
  finished, evicted pod, or one on a deleted node) and when a granted group is not committed
  after all (given up, deleted, denied by another tree). A Return of a group the grant has
  since moved from frees nothing, so an old Return cannot free a newer grant.

Replay (DESIGN.md rule 1): a grant is recorded before its answer goes out, and an ask already
granted re-sends the same grant. A denial is not recorded: a redelivered ask is judged again,
and if it is granted now its decider, no longer asking, returns it at once. Deterministic:
the ledger reads only its input partition's log. What it keeps is one entry per pod it
admitted and that has not ended (DESIGN.md rule 10): its key leaves the table when empty.

The guarantee and what it rests on are written down in docs/architecture.md ("Elastic quotas
across replicas"). The scheduler's own check (`ElasticQuota.pre_filter`) stays, as a
pre-filter: it keeps pods that cannot fit from being claimed, and it applies the runtime
quota (min, borrowing), which depends on the cluster and is the scheduler's business; the
ledger guarantees the max.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.ports import Output, Problem
from schemas import topics
from schemas.records import (
    QuotaAsk,
    QuotaDenied,
    QuotaGranted,
    QuotaReturn,
    Record,
)

KEY_PREFIX = "quota:"


def is_quota_key(key: str) -> bool:
    return key.startswith(KEY_PREFIX)


@dataclass(frozen=True)
class QuotaSpec:
    """One elastic quota (Koordinator's ElasticQuota): amounts in canonical units."""

    name: str
    parent: str = ""
    min: Mapping[str, int] = field(default_factory=dict)
    max: Mapping[str, int] = field(default_factory=dict)
    shared_weight: Mapping[str, int] | None = None  # default: max


class QuotaTree:
    """The quotas the deciders know, by name: which tree (ledger key) a quota belongs to, and
    the chain of quotas a pod of it counts against."""

    def __init__(self, specs: Iterable[QuotaSpec] = ()) -> None:
        self.specs: dict[str, QuotaSpec] = {}
        for spec in specs:
            known = self.specs.get(spec.name)
            if known is not None and known != spec:
                raise ValueError(f"ElasticQuota: quota {spec.name!r} is defined twice, differently "
                                 f"({known} and {spec}); every profile must agree")
            self.specs[spec.name] = spec

    def __bool__(self) -> bool:
        return bool(self.specs)

    def chain(self, name: str) -> list[str]:
        """The quota and its ancestors, nearest first ([] for a quota not known here)."""
        out: list[str] = []
        while name and name in self.specs and name not in out:
            out.append(name)
            name = self.specs[name].parent
        return out

    def key(self, name: str) -> str:
        """The ledger key of the quota's tree ("" for a quota not known here: not limited)."""
        chain = self.chain(name)
        return f"{KEY_PREFIX}{chain[-1]}" if chain else ""


@dataclass
class QuotaLedgerState:
    """One quota tree's ledger; a value of the deciders' table under `quota:<root>`."""

    key: str
    # uid -> {"quota", "requests", "asker", "group"}: what the pod was admitted with, and for
    # which group of which decider (the latest that asked).
    grants: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "grants": self.grants}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> QuotaLedgerState:
        return cls(key=raw["key"], grants={uid: dict(g) for uid, g in raw["grants"].items()})


class QuotaLedger:
    def __init__(self, tree: QuotaTree) -> None:
        self.tree = tree

    def used(self, state: QuotaLedgerState) -> dict[str, dict[str, int]]:
        """Per quota of the tree: what the grants count against it (its pods and its
        descendants')."""
        out: dict[str, dict[str, int]] = {}
        for grant in state.grants.values():
            for name in self.tree.chain(grant["quota"]):
                total = out.setdefault(name, {})
                for resource, amount in grant["requests"].items():
                    total[resource] = total.get(resource, 0) + int(amount)
        return out

    def apply(self, state: QuotaLedgerState, records: Iterable[Record], outputs: list[Output],
              problems: list[Problem]) -> QuotaLedgerState:
        for record in records:
            if isinstance(record, QuotaAsk):
                outputs.append(self._ask(state, record))
            elif isinstance(record, QuotaReturn):
                for uid in record.uids:
                    grant = state.grants.get(uid)
                    if grant is not None and grant["asker"] == record.asker and grant["group"] == record.group:
                        del state.grants[uid]
            else:
                problems.append(Problem("kind", record.KIND, f"{record.KIND} does not belong to a quota ledger "
                                                             f"({state.key})", record))
        return state

    @staticmethod
    def empty(state: QuotaLedgerState) -> bool:
        return not state.grants

    def _ask(self, state: QuotaLedgerState, ask: QuotaAsk) -> Output:
        new = [item for item in ask.items if item.uid not in state.grants]
        refusal = self._refusal(state, new) if new else ""
        if refusal:
            return Output(topics.HOLDS, ask.asker, QuotaDenied(decision_key=ask.asker, group=ask.group,
                                                              quota_key=state.key, reason=refusal))
        for item in ask.items:
            grant = state.grants.get(item.uid)
            if grant is None:
                state.grants[item.uid] = {"quota": item.quota, "requests": dict(item.requests),
                                          "asker": ask.asker, "group": ask.group}
            else:  # granted before (a redelivery, or a retry of the pod): counted once, now this group's
                grant["asker"], grant["group"] = ask.asker, ask.group
        return Output(topics.HOLDS, ask.asker, QuotaGranted(
            decision_key=ask.asker, group=ask.group, quota_key=state.key, uids=tuple(i.uid for i in ask.items)))

    def _refusal(self, state: QuotaLedgerState, items: list[Any]) -> str:
        """Why the items cannot all be admitted ("" if they can): the first quota of the tree
        they would take past its max."""
        used = self.used(state)
        asked: dict[str, dict[str, int]] = {}
        for item in items:
            chain = self.tree.chain(item.quota)
            if not chain or f"{KEY_PREFIX}{chain[-1]}" != state.key:
                return f"quota {item.quota!r} is not in the tree of {state.key} (the deciders' profiles)"
            for name in chain:
                total = asked.setdefault(name, {})
                for resource, amount in item.requests.items():
                    total[resource] = total.get(resource, 0) + amount
        for name, amounts in asked.items():
            maximum = self.tree.specs[name].max
            for resource, amount in amounts.items():
                if amount > 0 and resource in maximum:
                    have = used.get(name, {}).get(resource, 0)
                    if have + amount > maximum[resource]:
                        return (f"quota {name!r} exceeded at its ledger: {resource} {have} used + {amount} "
                                f"asked > max {maximum[resource]}")
        return ""
