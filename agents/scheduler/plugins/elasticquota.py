"""ElasticQuota (PreFilter, Reserve / Unreserve): Koordinator's elastic quotas.

Quotas come from the plugin's args (`pluginConfig`), each with `min` and `max` per resource,
an optional `parent` (a tree; top-level quotas share the cluster), and a `sharedWeight`
(default: its max). A pod counts against the quota its `quota.scheduling.koordinator.sh/name`
label names; pods without the label are not limited.

Runtime quota, per resource, top down: each child of a quota first gets what it requests up
to its min; what the parent has left is lent to the children that want more, in proportion
to their shared weights, each capped by its max and its request (unused min is thus borrowed
by the others). A quota's request is what its pods use (bound, held, claimed) plus what its
children request, and, for the quota of the pod being scheduled, that pod's request.
Admission: `used + request <= runtime quota` for the pod's quota and each of its ancestors,
checked in PreFilter (a pod over its quota fits no node; it waits for a cluster event).
Reserve counts the claim against the quota until its owner decides it (`ClusterState`).

This is a pre-filter: a replica sees only bound pods and its own claims, so the max is
guaranteed where the decision is final, by each quota tree's ledger at the deciders
(`agents.state.quotas`), built from these same args (`profiles.quota_tree`).

Pods with a quota are not batched into equivalence classes (each admission changes the
room of the next), and DefaultPreemption takes victims only from the preemptor's own quota.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from agents.scheduler.cluster import ClusterState
from agents.scheduler.framework import status
from agents.scheduler.framework.interface import UNSIGNABLE, CycleState, PodInfo
from agents.scheduler.framework.status import Status
from agents.scheduler.plugins.args import ArgsError, reject_unknown
from agents.state.quotas import QuotaSpec
from agents.state.resources import ResourceSpace, Vector
from schemas.errors import SchemaError
from schemas.quantity import to_canonical
from schemas.records import QUOTA_LABEL, hold_id

NAME = "ElasticQuota"


def _amounts(raw: Any, path: str) -> dict[str, int]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ArgsError(path, raw, "must be a mapping of resource to quantity")
    try:
        return {str(k): to_canonical(str(k), v, f"{path}.{k}") for k, v in raw.items()}
    except SchemaError as exc:
        raise ArgsError(exc.field, exc.value, exc.reason) from exc


@dataclass(frozen=True)
class ElasticQuotaArgs:
    quotas: tuple[QuotaSpec, ...] = ()

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> ElasticQuotaArgs:
        reject_unknown(raw, {"quotas"})
        items = raw.get("quotas") or []
        if not isinstance(items, list):
            raise ArgsError("quotas", items, "must be a list")
        quotas = []
        for i, q in enumerate(items):
            if not isinstance(q, Mapping) or not isinstance(q.get("name"), str) or not q["name"]:
                raise ArgsError(f"quotas[{i}].name", q.get("name") if isinstance(q, Mapping) else q, "is required")
            reject_unknown(q, {"name", "parent", "min", "max", "sharedWeight"}, prefix=f"quotas[{i}].")
            weight = q.get("sharedWeight")
            quotas.append(QuotaSpec(name=q["name"], parent=str(q.get("parent") or ""),
                                    min=_amounts(q.get("min"), f"quotas[{i}].min"),
                                    max=_amounts(q.get("max"), f"quotas[{i}].max"),
                                    shared_weight=_amounts(weight, f"quotas[{i}].sharedWeight") if weight else None))
        return cls(tuple(quotas))

    def validate(self) -> None:
        names = [q.name for q in self.quotas]
        for i, q in enumerate(self.quotas):
            if names.count(q.name) > 1:
                raise ArgsError(f"quotas[{i}].name", q.name, "is defined twice")
            if q.parent and q.parent not in names:
                raise ArgsError(f"quotas[{i}].parent", q.parent, "no such quota")
            for resource, amount in q.min.items():
                if resource in q.max and amount > q.max[resource]:
                    raise ArgsError(f"quotas[{i}].min.{resource}", amount, f"exceeds max ({q.max[resource]})")
        by_name = {q.name: q for q in self.quotas}
        for i, q in enumerate(self.quotas):  # no cycles
            seen, parent = {q.name}, q.parent
            while parent:
                if parent in seen:
                    raise ArgsError(f"quotas[{i}].parent", q.parent, "makes a cycle")
                seen.add(parent)
                parent = by_name[parent].parent


class ElasticQuota:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: ElasticQuotaArgs | None = None) -> None:
        self.args = args or ElasticQuotaArgs()
        self.quotas = {q.name: q for q in self.args.quotas}
        self.children: dict[str, list[str]] = {}
        for q in self.args.quotas:
            self.children.setdefault(q.parent, []).append(q.name)
        self._vectors: dict[tuple[int, str], tuple[Vector, Vector, Vector]] = {}

    def sign(self, pod: PodInfo) -> Hashable:
        return UNSIGNABLE if pod.pod.labels.get(QUOTA_LABEL) else ()

    def _limits(self, space: ResourceSpace, name: str) -> tuple[Vector, Vector, Vector]:
        """(min, max, shared weight) as vectors; a resource without a max is unlimited."""
        key = (id(space), name)
        if key not in self._vectors:
            q = self.quotas[name]
            unlimited = np.full(len(space), np.iinfo(np.int64).max // 4, dtype=np.int64)
            maximum = np.where([r in q.max for r in space.names], space.known(q.max), unlimited)
            weight = space.known(q.shared_weight) if q.shared_weight is not None else maximum
            self._vectors[key] = (space.known(q.min), maximum, weight)
        return self._vectors[key]

    def runtime(self, state: ClusterState, extra: Mapping[str, Vector]) -> tuple[dict[str, Vector], dict[str, Vector]]:
        """(runtime quota, use) per quota; `extra` adds requests (the pod being scheduled)."""
        space, zero = state.space, np.zeros(len(state.space), dtype=np.int64)
        use: dict[str, Vector] = {}

        def request(name: str) -> Vector:
            total = state.quota_used.get(name, zero) + extra.get(name, zero)
            for child in self.children.get(name, ()):
                total = total + request(child)
            use[name] = total
            return total

        for top in self.children.get("", ()):
            request(top)
        cluster = state.allocatable_view[state.schedulable_rows()].sum(axis=0)
        runtime: dict[str, Vector] = {}

        def share(total: Vector, kids: list[str]) -> None:
            if not kids:
                return
            limits = [self._limits(space, k) for k in kids]
            wants = [np.minimum(use[k], mx) for k, (_, mx, _) in zip(kids, limits, strict=True)]
            given = [np.minimum(w, mn) for w, (mn, _, _) in zip(wants, limits, strict=True)]
            left = np.maximum(total - sum(given), 0).astype(np.float64)
            for _ in range(len(kids)):  # lend what is left, by weight, until everyone is capped
                hungry = [i for i, k in enumerate(kids) if (given[i] < wants[i]).any()]
                if not hungry or not left.any():
                    break
                weights = np.array([limits[i][2] for i in hungry], dtype=np.float64)
                weight_sum = np.maximum(weights.sum(axis=0), 1.0)
                lent = np.zeros_like(left)
                for j, i in enumerate(hungry):
                    offer = np.floor(left * weights[j] / weight_sum).astype(np.int64)
                    take = np.minimum(offer, wants[i] - given[i])
                    given[i] = given[i] + take
                    lent += take
                left = np.maximum(left - lent, 0)
                if not lent.any():
                    break
            for k, g in zip(kids, given, strict=True):
                runtime[k] = g
                share(g, self.children.get(k, []))

        share(cluster, self.children.get("", []))
        return runtime, use

    def pre_filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Status:
        name = pod.pod.labels.get(QUOTA_LABEL, "")
        if not name:
            return status.SKIP
        if name not in self.quotas:
            return status.unresolvable(NAME, f"labels.{QUOTA_LABEL}={name!r}: no such quota "
                                             f"(quotas: {', '.join(self.quotas) or 'none'})")
        runtime, use = self.runtime(state, {name: pod.request})
        cols = pod.columns
        node = name
        while node:
            over = cols[use[node][cols] > runtime[node][cols]]
            if over.size:
                resource = state.space.names[int(over[0])]
                return status.unschedulable(NAME, f"quota {node!r} exceeded: {resource} "
                                                  f"{int(use[node][over[0]])} > {int(runtime[node][over[0]])}")
            node = self.quotas[node].parent
        cycle.write(NAME, name)
        return status.SUCCESS

    def reserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> Status:
        name = cycle.read(NAME)
        if name:
            state.assume_quota(hold_id(pod.uid, pod.attempt, state.names[row]), name, pod.request)
        return status.SUCCESS

    def unreserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> None:
        state.forget_quota(hold_id(pod.uid, pod.attempt, state.names[row]))
