"""The cluster around the rebalancer, in the perf harness: ReplicaSet-like workloads and the
Eviction API, pure (time arrives as arguments; the harness turns what they return into
records).

`Workloads` keeps each workload at its desired replicas, as a ReplicaSet controller does:
- it creates pods from the workload's template (owner reference: the workload, controller),
  and a replacement whenever one of its pods goes (evicted, deleted, failed);
- on a scale-down it deletes pods in Kubernetes' own order (`binpack.kubernetes_order`,
  which honours `controller.kubernetes.io/pod-deletion-cost`, set with `set_costs` as the
  rebalancer's CalculateOnly strategy publishes them);
- it follows each pod's binding and readiness (`bound`, `ready`: the Kwok-compatible stages
  say when a pod becomes Ready) and measures availability from the outside: ready replicas
  against desired, per workload (`availability`).

`evict` is the Eviction API: refused (429) when a PodDisruptionBudget covering the pod would
be left with fewer healthy pods than it allows (healthy: bound and ready), else the pod goes
and its replacement is created.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from agents.rebalance.arbitration import Budget
from agents.rebalance.binpack import DELETION_COST, Replica, deletion_cost, kubernetes_order
from schemas.records import OwnerReference, Pod

TOO_MANY_REQUESTS = "429: the eviction would violate a PodDisruptionBudget"
NOT_FOUND = "404: no such pod"


@dataclass
class Member:
    pod: Pod
    node: str = ""
    ready: bool = False
    ready_since: float = 0.0


@dataclass
class Workload:
    namespace: str
    name: str
    template: Pod  # requests, labels, scheduler, selectors; uid and name are made per pod
    replicas: int
    members: dict[str, Member] = field(default_factory=dict)
    created: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/ReplicaSet/{self.name}"


@dataclass(frozen=True)
class Eviction:
    uid: str
    allowed: bool
    reason: str = ""
    replacements: tuple[Pod, ...] = ()


class Workloads:
    def __init__(self, budgets: Iterable[Budget] = ()) -> None:
        self.workloads: dict[str, Workload] = {}
        self.owner: dict[str, str] = {}  # pod uid -> workload key
        self.budgets = tuple(budgets)

    def add(self, namespace: str, name: str, template: Pod, replicas: int, *, now: float) -> list[Pod]:
        w = Workload(namespace, name, template, replicas)
        self.workloads[w.key] = w
        return self._fill(w, now)

    def _fill(self, w: Workload, now: float) -> list[Pod]:
        out = []
        while len(w.members) < w.replicas:
            uid = f"{w.name}-{w.created:06d}"
            w.created += 1
            owner = (OwnerReference(kind="ReplicaSet", name=w.name, uid=f"rs-{w.namespace}-{w.name}", controller=True),)
            pod = replace(w.template, uid=uid, name=uid, namespace=w.namespace, owner_references=owner,
                          creation_timestamp=now, node_name="", phase="Pending",
                          annotations={k: v for k, v in w.template.annotations.items() if k != DELETION_COST})
            w.members[uid] = Member(pod)
            self.owner[uid] = w.key
            out.append(pod)
        return out

    def bound(self, uid: str, node: str) -> None:
        m = self._member(uid)
        if m is not None:
            m.node = node

    def ready(self, uid: str, now: float) -> None:
        m = self._member(uid)
        if m is not None and not m.ready:
            m.ready, m.ready_since = True, now

    def _member(self, uid: str) -> Member | None:
        key = self.owner.get(uid)
        return self.workloads[key].members.get(uid) if key else None

    def gone(self, uid: str, *, now: float) -> list[Pod]:
        """A pod of a workload went (deleted, evicted, failed): its replacement."""
        key = self.owner.pop(uid, None)
        if key is None:
            return []
        w = self.workloads[key]
        w.members.pop(uid, None)
        return self._fill(w, now)

    def set_costs(self, costs: dict[str, int]) -> None:
        """pod-deletion-cost annotations, as published for the pods (by uid)."""
        for uid, cost in costs.items():
            m = self._member(uid)
            if m is not None:
                m.pod = replace(m.pod, annotations={**m.pod.annotations, DELETION_COST: str(cost)})

    def scale(self, key: str, replicas: int, *, now: float) -> tuple[list[str], list[Pod]]:
        """Set a workload's desired replicas: the pods deleted (Kubernetes' order) and created."""
        w = self.workloads[key]
        w.replicas = replicas
        deleted: list[str] = []
        if len(w.members) > replicas:
            members = list(w.members.values())
            ranked = [Replica(m.pod.uid, m.node, "Running" if m.node else "Pending", m.ready,
                              deletion_cost(m.pod), m.ready_since, m.pod.creation_timestamp) for m in members]
            for i in kubernetes_order(ranked)[: len(members) - replicas]:
                uid = members[i].pod.uid
                deleted.append(uid)
                del w.members[uid]
                self.owner.pop(uid, None)
        return deleted, self._fill(w, now)

    def healthy(self, budget: Budget) -> tuple[int, int]:
        """(expected, healthy) pods of a budget: matching pods, and those bound and ready."""
        expected = healthy = 0
        for w in self.workloads.values():
            for m in w.members.values():
                if budget.covers(m.pod):
                    expected += 1
                    healthy += m.ready and bool(m.node)
        return expected, healthy

    def evict(self, uid: str, *, now: float) -> Eviction:
        m = self._member(uid)
        if m is None:
            return Eviction(uid, False, NOT_FOUND)
        for b in self.budgets:
            if b.covers(m.pod) and b.allowed(*self.healthy(b)) < 1:
                return Eviction(uid, False, TOO_MANY_REQUESTS)
        return Eviction(uid, True, replacements=tuple(self.gone(uid, now=now)))

    def availability(self) -> dict[str, tuple[int, int]]:
        """Per workload: (ready replicas, desired)."""
        return {k: (sum(1 for m in w.members.values() if m.ready and m.node), w.replicas)
                for k, w in self.workloads.items()}

