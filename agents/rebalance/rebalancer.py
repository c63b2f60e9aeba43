"""One rebalancing cycle over a cluster, every configured profile in turn: what the rebalancer
agent will run each `deschedulingInterval`, and what `koordstream rebalance plan` prints as a
dry run (nothing is evicted here: the result is plans).

    rebalancer = Rebalancer(config.load(text))
    for plan in rebalancer.cycle(nodes, pods, now=time.time()):
        print("\\n".join(fragmentation.plan_text(plan.moves)))

Profiles run in order over one view; a pod one profile plans to move is not planned again by
the next, whose arbitration counts it as in flight. Migrations already running (`in_flight`:
the pod and its source node) count against every limit from the start.

`scale_down` answers a ScaleDownEvent: the ranking (pod-deletion-cost) of the workload's pods
and the victims, by each profile that enables ScaleDownBinPack. The event names the workload
by its controller's name, or `Kind/name`, in its namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from agents.rebalance.arbitration import Arbitrator, Budget, running
from agents.rebalance.binpack import ScaleDownPlan, plan_scale_down
from agents.rebalance.config import RebalancerConfig
from agents.rebalance.fragmentation import MovePlan, plan_moves, plan_text
from agents.rebalance.selectors import LabelSelector
from agents.rebalance.simulate import Simulator
from agents.rebalance.view import ClusterView
from agents.scheduler.framework.profiles import SchedulerConfig
from schemas.kube import load_manifests
from schemas.records import Node, Pod, PodDisruptionBudget, ScaleDownEvent


@dataclass(frozen=True)
class CyclePlan:
    profile: str
    moves: MovePlan


class Rebalancer:
    def __init__(self, config: RebalancerConfig | None = None, scheduler: SchedulerConfig | None = None) -> None:
        self.config = config or RebalancerConfig()
        self.scheduler = scheduler

    def _resources(self) -> tuple[str, ...]:
        names: dict[str, None] = {}
        for p in self.config.profiles:
            for args in (p.fragmentation, p.binpack):
                if args is not None:
                    names.update(dict.fromkeys(args.resources))
        return tuple(names)

    def view(self, nodes: Iterable[Node], pods: Iterable[Pod]) -> ClusterView:
        return ClusterView.build(nodes, pods, resources=self._resources())

    def cycle(self, nodes: Iterable[Node], pods: Iterable[Pod], *, now: float,
              moved_at: Mapping[str, float] | None = None,
              in_flight: Sequence[tuple[Pod, str, str]] = (), budgets: Sequence[Budget] = (),
              covered: Sequence[Pod] | None = None, healthy: Callable[[Pod], bool] | None = None) -> list[CyclePlan]:
        """`in_flight`: migrations running, as (pod, source node, destination node or "");
        `budgets`: the PodDisruptionBudgets no plan may break, counted over `covered` (every
        live pod, pending ones included; default: `pods`) with `healthy` (default: Running,
        not terminating, on one of `nodes`)."""
        pods = list(pods)
        view = self.view(nodes, pods)
        counts = partial(_healthy_on, view.index) if healthy is None else healthy
        simulator = Simulator(view, self.scheduler)  # one for every profile: arrivals add up
        running = list(in_flight)
        for pod, _, destination in running:
            if destination in view.index:
                simulator.place(pod, view.index[destination])
        out = []
        for profile in self.config.profiles:
            if profile.fragmentation is None:
                continue
            arbitrator = Arbitrator.over(profile.arbitration, view.pods, budgets,
                                         covered=pods if covered is None else covered, budget_healthy=counts)
            for pod, source, _ in running:
                arbitrator.admit(pod, source)
            plan = plan_moves(view, profile.fragmentation, simulator, arbitrator, now=now, evictor=profile.evictor,
                              moved_at=moved_at, in_flight=running)
            by_uid = {p.uid: p for p in view.pods}
            running += [(by_uid[m.uid], m.source, m.destination) for m in plan.moves]
            out.append(CyclePlan(profile.name, plan))
        return out

    def scale_down(self, nodes: Iterable[Node], pods: Iterable[Pod], event: ScaleDownEvent, *,
                   now: float) -> list[tuple[str, ScaleDownPlan]]:
        view = self.view(nodes, pods)
        workload = resolve_workload(view, event.namespace, event.workload)
        return [(p.name, plan_scale_down(view, workload, event.replicas, p.binpack, now=now, evictor=p.evictor))
                for p in self.config.profiles if p.binpack is not None]


def _healthy_on(live: Mapping[str, int], pod: Pod) -> bool:
    return running(pod) and pod.node_name in live


def resolve_workload(view: ClusterView, namespace: str, name: str) -> str:
    """The view's workload key ("namespace/Kind/name") for `name` or `Kind/name` in
    `namespace`; raises ValueError naming the field when none or several match."""
    wanted = f"{namespace}/{name}" if "/" in name else None
    found = [w for w in view.workloads if w == wanted or (wanted is None and w.startswith(f"{namespace}/")
                                                            and w.rsplit("/", 1)[1] == name)]
    if len(found) != 1:
        what = "no running pods" if not found else f"several workloads ({', '.join(sorted(found))})"
        raise ValueError(f"workload={namespace}/{name}: {what}; name it as Kind/name")
    return found[0]


def from_manifests(text: str) -> tuple[list[Node], list[Pod], list[Budget]]:
    """Nodes, the pods bound to them (`nodeName` set) and the PodDisruptionBudgets, from
    Kubernetes manifests; a budget's bad selector raises ArgsError naming it."""
    records = load_manifests(text)
    return ([r for r in records if isinstance(r, Node)], [r for r in records if isinstance(r, Pod) and r.node_name],
            [budget_of(r) for r in records if isinstance(r, PodDisruptionBudget)])


def budget_of(pdb: PodDisruptionBudget) -> Budget:
    """The arbitration's Budget for a PodDisruptionBudget record (ArgsError names a bad field)."""
    def amount(text: str) -> int | str | None:
        return None if text == "" else text if text.endswith("%") else int(text)

    selector = LabelSelector.from_mapping(pdb.selector, f"PodDisruptionBudget {pdb.uid}: spec.selector")
    return Budget(pdb.namespace, pdb.name, selector, amount(pdb.min_available), amount(pdb.max_unavailable))


def dry_run(nodes: Sequence[Node], pods: Sequence[Pod], *, config: RebalancerConfig | None = None,
            scheduler: SchedulerConfig | None = None, scale_downs: Sequence[ScaleDownEvent] = (),
            budgets: Sequence[Budget] = (), now: float) -> tuple[list[str], dict[str, object]]:
    """`koordstream rebalance plan`: one cycle and the given scale-downs over the nodes and
    their bound pods, as lines to print and as JSON."""
    rebalancer = Rebalancer(config, scheduler)
    lines: list[str] = []
    out: dict[str, object] = {"nodes": len(nodes), "pods": len(pods), "profiles": {}}
    profiles: dict[str, dict[str, Any]] = {}
    for cycle in rebalancer.cycle(nodes, pods, now=now, budgets=budgets):
        lines.append(f"profile {cycle.profile}:")
        lines += plan_text(cycle.moves)
        p = cycle.moves
        profiles.setdefault(cycle.profile, {})["moves"] = {
            "mode": p.mode, "before": p.before.as_dict(), "after": p.after.as_dict(),
            "moves": [m.as_dict() for m in p.moves], "skipped": p.skipped}
    for event in scale_downs:
        for name, plan in rebalancer.scale_down(nodes, pods, event, now=now):
            lines.append(f"profile {name}: ScaleDownBinPack ({plan.ranker}) {plan.workload} -{event.replicas}: "
                         f"victims {', '.join(plan.victims) or '(none)'}; empty nodes {plan.empty_nodes_before} -> "
                         f"{plan.empty_nodes_after}")
            lines += [f"  {uid}: pod-deletion-cost {plan.costs[uid]}" for uid in plan.order]
            lines += [f"  {uid}: protected ({why})" for uid, why in sorted(plan.protected.items())]
            profiles.setdefault(name, {}).setdefault("scale_downs", []).append({
                "workload": plan.workload, "ranker": plan.ranker, "victims": list(plan.victims), "costs": plan.costs,
                "empty_nodes_before": plan.empty_nodes_before, "empty_nodes_after": plan.empty_nodes_after,
                "stranded_pct_after": round(plan.stranded_pct_after, 4), "protected": plan.protected})
    out["profiles"] = profiles
    return lines, out
