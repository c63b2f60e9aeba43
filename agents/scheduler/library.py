"""The scheduling core as a library: no Kafka, no owners, no clock of its own.

    sched, pending = Scheduler.from_manifests(open("cluster.yaml").read())
    for decision in sched.schedule(pending):
        print(decision.name, decision.node or decision.message)
    why = sched.explain(pending[0])      # per-node, per-plugin scores and rejections

`Scheduler` wraps exactly the core the faust agents run (`SchedulerCore` over a
`ClusterState`, profiles from YAML, runtime classes: the shipped ones unless given), and
stands in for the node owners: a pod it places is
treated as bound at once, so the next decisions see it. Bound pods (those with a `nodeName`)
count as used capacity from the start.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.sandbox.runtimes import RuntimeTable, is_sandbox
from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore, schedule_all
from agents.scheduler.framework import profiles as profile_config
from agents.scheduler.framework.profiles import SchedulerConfig
from agents.scheduler.framework.runtime import rejections_table, scores_table
from agents.state import devices
from agents.state.resources import DEFAULT_RESOURCES, ResourceSpace
from schemas.kube import load_manifests
from schemas.records import (
    QUOTA_LABEL,
    SANDBOX_POOL_LABEL,
    BoundPod,
    Claim,
    EvictionCommand,
    Node,
    Nomination,
    Pod,
    ResourceList,
    SchedulingFeedback,
)


@dataclass(frozen=True)
class Decision:
    """Where a pod goes, or why it goes nowhere (the last feedback it got)."""

    uid: str
    name: str
    node: str = ""
    message: str = ""
    reasons: dict[str, int] = field(default_factory=dict)
    final: bool = False  # cannot be placed as it is (bad input)
    nominated: str = ""  # preemption nominated it here
    victims: tuple[str, ...] = ()  # the pods preemption would evict for it
    feedback: SchedulingFeedback | None = None  # the last one, with a sandbox's hint (agents.sandbox.feedback)


@dataclass(frozen=True)
class Explanation:
    """One pod against every node: scores of the feasible ones, rejections of the others."""

    scores: dict[str, dict[str, int]]  # node -> plugin -> normalized score, plus "total"
    rejected: dict[str, list[str]]  # node -> filter plugins that rejected it
    message: str  # kube-scheduler style summary when nothing fits, else ""
    best: str  # the node the pod would go to, or ""


class Scheduler:
    def __init__(self, nodes: Iterable[Node], bound: Iterable[Pod] = (), *,
                 profiles: str | SchedulerConfig | None = None, resources: Sequence[str] = (),
                 batching: bool = True, runtimes: RuntimeTable | None = None) -> None:
        self.space = ResourceSpace(DEFAULT_RESOURCES + tuple(r for r in resources if r not in DEFAULT_RESOURCES))
        by_node: dict[str, list[BoundPod]] = {}
        for pod in bound:
            by_node.setdefault(pod.node_name, []).append(BoundPod(
                uid=pod.uid, namespace=pod.namespace, name=pod.name, priority=pod.priority,
                requests=ResourceList(devices.with_gpu_totals(pod.requests)), quota=pod.labels.get(QUOTA_LABEL, ""),
                sandbox=is_sandbox(pod), warm_pool=pod.labels.get(SANDBOX_POOL_LABEL, "")))
        self.state = ClusterState.from_records(self.space, nodes, by_node)
        config = profile_config.load(profiles) if isinstance(profiles, str) else profiles
        self.core = SchedulerCore(self.space, self.state, lambda: 0.0, config=config, batching=batching,
                                  runtimes=runtimes)

    @classmethod
    def from_manifests(cls, text: str, **kw: Any) -> tuple[Scheduler, list[Pod]]:
        """Nodes and pods from v1 manifests (YAML or JSON); returns the pods still pending."""
        records = load_manifests(text)
        nodes = [r for r in records if isinstance(r, Node)]
        pods = [r for r in records if isinstance(r, Pod)]
        return cls(nodes, [p for p in pods if p.node_name], **kw), [p for p in pods if not p.node_name]

    def schedule(self, pods: Sequence[Pod]) -> list[Decision]:
        """Place pods in queue order (priority, then the order given); one decision per pod."""
        decisions: dict[str, Decision] = {p.uid: Decision(p.uid, p.name) for p in pods}
        victims: dict[str, list[str]] = {}
        for out in schedule_all(self.core, pods):
            r = out.record
            if isinstance(r, Claim):
                # Stand in for the owner and the decider: the claim is held and committed.
                self.state.forget(r.hold_id)
                self.state.forget_quota(r.hold_id)
                self.state.add_bound(BoundPod(uid=r.uid, namespace=r.namespace, name=r.name, priority=r.priority,
                                              requests=r.requests, quota=r.quota, sandbox=r.sandbox,
                                              warm_pool=r.warm_pool), r.node,
                                     devices.decode(r.devices), devices.decode_rdma(r.devices))
                self.core.bound.add(r.uid)
                self.core.pods.pop(r.uid, None)
                decisions[r.uid] = Decision(r.uid, r.name, node=r.node)
            elif isinstance(r, SchedulingFeedback) and r.uid in decisions:
                decisions[r.uid] = Decision(r.uid, r.name, message=r.message, reasons=dict(r.reasons), final=r.final,
                                            feedback=r)
            elif isinstance(r, Nomination):
                decisions[r.uid] = Decision(**{**decisions[r.uid].__dict__, "nominated": r.node})
            elif isinstance(r, EvictionCommand):
                victims.setdefault(r.preemptor_uid, []).append(r.uid)
        for uid, names in victims.items():
            decisions[uid] = Decision(**{**decisions[uid].__dict__, "victims": tuple(names)})
        return [decisions[p.uid] for p in pods]

    def explain(self, pod: Pod) -> Explanation:
        ev = self.core.explain(pod)
        if ev.diagnosis is not None:
            return Explanation({}, rejections_table(ev, self.state), ev.diagnosis.message(), "")
        best = ev.best()
        return Explanation(scores_table(ev, self.state), rejections_table(ev, self.state), "",
                           self.state.names[best] if best >= 0 else "")
