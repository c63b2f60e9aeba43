"""The cluster around the chaos run's workers (`perf.chaos`): what a kubelet, a ReplicaSet
controller and the Eviction API would do, driven by the records read back from the topics.

- Pods of the elastic quota run for `quota_run_s` after their Binding, then end: a
  PodTerminated at their node (`node-inbox`) and a PodDeleted (`pods`), so that the pods that
  wait for room in the quota are admitted in turn.
- Budgeted workloads (`BudgetWorkload`: ReplicaSet-like, `perf.controller.Workloads`, each
  under a PodDisruptionBudget on `disruption-budgets`): a bound pod becomes Running and Ready
  after Kwok's pod-ready stage (`infra/kwok/pod-ready.yaml`, `ready_delay_s`), and the harness
  then publishes it Running on its node, as a bridge watching the pods would. At its moment
  (once it is whole) a workload asks to lose `scale_down_by` pods (a ScaleDownEvent on
  `scale-down`), which the rebalancer answers with EvictDirectly evictions.
- Every EvictionCommand of a budgeted pod is carried out, whatever the budget says (the
  Eviction API would refuse one that breaks it; here it is obeyed, so that a rebalancer that
  breaks a budget shows as `pdb_violations` in the verdict rather than as a refusal): the pod
  terminates at its node and is deleted, and its controller creates a replacement unless the
  workload is shrinking (each eviction after a scale-down takes one of the replicas it asked
  to lose).

Publishing goes through `publish`, which retries while the broker is away.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from perf.controller import Workloads
from perf.kwok import Lifecycle, load_stages
from perf.run import pod_object
from schemas import topics
from schemas.records import (
    Binding,
    EvictionCommand,
    Pod,
    PodDeleted,
    PodDisruptionBudget,
    PodTerminated,
    Record,
    ScaleDownEvent,
)

POD_READY = Path(__file__).resolve().parents[1] / "infra" / "kwok" / "pod-ready.yaml"
READY_DELAY = "pod-ready.stage.kwok.x-k8s.io/delay"  # the stage's delay, per pod

Publish = Callable[[str, list[Record]], Awaitable[None]]


@dataclass(frozen=True)
class BudgetWorkload:
    """A ReplicaSet-like workload of `replicas` pods from `template` (labelled `app: name`),
    under a PodDisruptionBudget of `min_available`; at `scale_down_at` (s into the load) it
    asks to lose `scale_down_by` pods."""

    name: str
    namespace: str
    template: Pod
    replicas: int
    min_available: int
    scale_down_by: int
    scale_down_at: float

    @property
    def key(self) -> str:
        return f"{self.namespace}/ReplicaSet/{self.name}"

    def budget(self) -> PodDisruptionBudget:
        return PodDisruptionBudget(uid=f"{self.namespace}/{self.name}", name=self.name, namespace=self.namespace,
                                   selector={"matchLabels": {"app": self.name}}, min_available=str(self.min_available))


class ChaosCluster:
    def __init__(self, publish: Publish, quota_pods: dict[str, Pod], quota_run_s: float,
                 budgeted: Sequence[BudgetWorkload], ready_delay_s: float) -> None:
        self.publish = publish
        self.quota_pods = quota_pods
        self.quota_run_s = quota_run_s
        self.budgeted = {b.key: b for b in budgeted}
        self.ready_delay_s = ready_delay_s
        self.lifecycle = Lifecycle(load_stages([POD_READY]))
        self.workloads = Workloads()
        self.pods: dict[str, Pod] = {}  # every pod of the budgeted workloads, by uid
        self.node: dict[str, str] = {}
        self.shrinking: dict[str, int] = {}  # workload key -> replicas it still asked to lose
        self.scaled: set[str] = set()
        self.evicted: set[str] = set()
        self.quota_ends: dict[str, tuple[float, str]] = {}  # uid -> (monotonic end, node)
        self.quota_ended: set[str] = set()
        self._read = 0

    async def start(self) -> None:
        """The budgets, then the workloads' pods."""
        await self.publish(topics.DISRUPTION_BUDGETS, [b.budget() for b in self.budgeted.values()])
        created: list[Record] = []
        for b in self.budgeted.values():
            template = replace(b.template, labels={**b.template.labels, "app": b.name},
                               annotations={**b.template.annotations,
                                            READY_DELAY: f"{int(self.ready_delay_s * 1000)}ms"})
            pods = self.workloads.add(b.namespace, b.name, template, b.replicas, now=time.time())
            self.pods.update((p.uid, p) for p in pods)
            created += pods
        await self.publish(topics.PODS, created)

    def whole(self, key: str) -> bool:
        w = self.workloads.workloads[key]
        return len(w.members) == w.replicas and all(m.ready and m.node for m in w.members.values())

    async def step(self, records: Sequence[tuple[float, str, int, str, Record]], elapsed_s: float) -> None:
        """Act on the records read since the last step; `elapsed_s`: seconds into the load."""
        new, self._read = records[self._read:], len(records)
        now = time.monotonic()
        ended: list[Record] = []
        pods: list[Record] = []
        for _, topic, _, _, r in new:
            if topic == topics.BINDINGS and isinstance(r, Binding):
                if r.uid in self.quota_pods and r.uid not in self.quota_ends:
                    self.quota_ends[r.uid] = (now + self.quota_run_s, r.node)
                elif r.uid in self.pods and r.uid not in self.node and r.uid not in self.evicted:
                    self.node[r.uid] = r.node
                    self.workloads.bound(r.uid, r.node)
                    self.lifecycle.upsert("Pod", r.uid, pod_object(self.pods[r.uid], r.node), now)
            elif (topic == topics.EVICTIONS and isinstance(r, EvictionCommand) and r.uid in self.node
                  and r.uid not in self.evicted):
                self.evicted.add(r.uid)
                self.lifecycle.forget("Pod", r.uid)
                key = self.workloads.owner.get(r.uid, "")
                if self.shrinking.get(key, 0) > 0:
                    self.shrinking[key] -= 1
                    self.workloads.workloads[key].replicas -= 1
                replacements = self.workloads.gone(r.uid, now=time.time())
                self.pods.update((p.uid, p) for p in replacements)
                ended.append(PodTerminated(uid=r.uid, node=self.node[r.uid], reason="Evicted"))
                pods += [PodDeleted(uid=r.uid, name=r.name, namespace=r.namespace), *replacements]
        for uid, (at, node) in list(self.quota_ends.items()):
            if at <= now and uid not in self.quota_ended:
                self.quota_ended.add(uid)
                ended.append(PodTerminated(uid=uid, node=node, reason="Completed"))
                p = self.quota_pods[uid]
                pods.append(PodDeleted(uid=uid, name=p.name, namespace=p.namespace, labels=p.labels,
                                       annotations=p.annotations))
        for t in self.lifecycle.due(now):
            if t.phase == "Running" and t.key in self.pods and t.key not in self.evicted:
                self.workloads.ready(t.key, time.time())
                pods.append(replace(self.pods[t.key], node_name=self.node[t.key], phase="Running"))
                self.lifecycle.forget("Pod", t.key)
        scale_downs: list[Record] = []
        for key, b in self.budgeted.items():
            if key not in self.scaled and elapsed_s >= b.scale_down_at and self.whole(key):
                self.scaled.add(key)
                self.shrinking[key] = b.scale_down_by
                scale_downs.append(ScaleDownEvent(workload=b.name, namespace=b.namespace, replicas=b.scale_down_by))
        if ended:
            await self.publish(topics.NODE_INBOX, ended)
        if pods:
            await self.publish(topics.PODS, pods)
        if scale_downs:
            await self.publish(topics.SCALE_DOWN, scale_downs)
