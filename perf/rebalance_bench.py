"""In-process benchmarks of the rebalancer's planners (no broker, no agents): `koordstream
bench rebalance`. Each compares the planners from the same start, as issue 13's perf
scenarios will through the real system; here moves and evictions happen at once and exactly as
planned (an ideal actuator), so the figures are the planners' own quality and cost.

- imbalance: `nodes` nodes (32 cpu, 128Gi, 110 pods) and workloads of `replicas` replicas
  each, half CPU-heavy (1.5 cpu, 2Gi), half memory-heavy (250m, 6Gi), placed on the wrong nodes
  on purpose: CPU-heavy pods on the first half of the nodes, memory-heavy on the second, 20
  per node. Each planner runs cycle after cycle (the clock advancing `interval_s`) until it
  plans nothing or `max_cycles` pass. A moved pod keeps its uid and lands where planned (in
  koordinator mode: where the scheduler's core would put it then). Both use the same args
  (`minImprovementThreshold` 0.01: a single pod of a 20-pod node changes its std by about
  0.016, below Koordinator's default 0.02, at which its mode moves nothing here).
- scale-down: `nodes` nodes; a minority of them (a fifth, labelled `pool: db`) first take a
  database workload; then a `replicas`-replica web workload is placed by the default profile
  (spread) through the scheduler's core; the web workload shrinks to half. Each ranker
  (Kubernetes' ReplicaSet order, Koordinator's, ours) picks the victims from the same start.

JSON: `imbalance.planners.<mode>` with `std_sum_before/after`, `std_max_after`,
`stranded_pct_before/after`, `evictions`, `cycles`, `plan_s`, the trajectory (`by_cycle`:
cycle, evictions so far, std sum), and `evictions_to_match_koordinator` for global;
`scale_down.rankers.<name>` with `empty_nodes`, `stranded_pct`, `evictions`; `goals` says which
of issue 13's goals each run met.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from agents.rebalance import binpack
from agents.rebalance.arbitration import ArbitrationArgs, Arbitrator
from agents.rebalance.binpack import BinPackArgs, plan_scale_down
from agents.rebalance.fragmentation import FragmentationArgs, plan_moves
from agents.rebalance.objective import measure, typical_requests
from agents.rebalance.simulate import Simulator
from agents.rebalance.view import ClusterView
from agents.scheduler.library import Scheduler
from schemas.records import Node, OwnerReference, Pod, ResourceList

GI = 2**30
NODE = ResourceList({"cpu": 32_000, "memory": 128 * GI, "pods": 110})


@dataclass(frozen=True)
class ImbalanceWorkload:
    nodes: int = 500
    per_node: int = 20
    workloads: int = 20
    interval_s: float = 60.0
    max_cycles: int = 200
    min_improvement: float = 0.01


@dataclass(frozen=True)
class ScaleDownWorkload:
    nodes: int = 200
    replicas: int = 1000
    db_pods: int = 80


def _owner(name: str) -> tuple[OwnerReference, ...]:
    return (OwnerReference(kind="ReplicaSet", name=name, uid=f"rs-{name}", controller=True),)


def lopsided(w: ImbalanceWorkload) -> tuple[list[Node], list[Pod]]:
    nodes = [Node(name=f"node-{i:04d}", allocatable=NODE, capacity=NODE) for i in range(w.nodes)]
    pods = []
    half = w.nodes // 2
    for i in range(w.nodes * w.per_node):
        row = i // w.per_node
        cpu_heavy = row < half
        workload = (i % (w.workloads // 2)) + (0 if cpu_heavy else w.workloads // 2)
        requests = ResourceList({"cpu": 1500, "memory": 2 * GI} if cpu_heavy else {"cpu": 250, "memory": 6 * GI})
        pods.append(Pod(uid=f"p{i:06d}", name=f"p{i:06d}", namespace="bench", requests=requests,
                        owner_references=_owner(f"w{workload:02d}"), node_name=nodes[row].name, phase="Running"))
    return nodes, pods


def run_imbalance(w: ImbalanceWorkload) -> dict[str, Any]:
    nodes, start = lopsided(w)
    out: dict[str, Any] = {"workload": w.__dict__, "pods": len(start), "planners": {}}
    for mode in ("koordinator", "global"):
        args = FragmentationArgs(mode=mode, min_improvement_threshold=w.min_improvement, min_pod_age_s=0.0)
        pods = {p.uid: p for p in start}
        moved: dict[str, float] = {}
        now, evictions, spent = 1e9, 0, 0.0
        first_view = ClusterView.build(nodes, start)
        columns = first_view.columns(args.resources)
        typical = typical_requests(first_view.vectors, columns)
        before = measure(first_view, columns, typical=typical)
        trajectory = [{"cycle": 0, "evictions": 0, "std_sum": round(before.std_sum, 4)}]
        cycles = 0
        for cycles in range(1, w.max_cycles + 1):
            view = ClusterView.build(nodes, pods.values())
            t0 = time.perf_counter()
            plan = plan_moves(view, args, Simulator(view), Arbitrator.over(ArbitrationArgs(), view.pods), now=now,
                              moved_at=moved)
            spent += time.perf_counter() - t0
            if not plan.moves:
                cycles -= 1
                break
            for m in plan.moves:
                pods[m.uid] = replace(pods[m.uid], node_name=m.destination)
                moved[m.uid] = now
            evictions += len(plan.moves)
            trajectory.append({"cycle": cycles, "evictions": evictions, "std_sum": round(plan.after.std_sum, 4)})
            now += w.interval_s
        after = measure(ClusterView.build(nodes, pods.values()), columns, typical=typical)
        out["planners"][mode] = {
            "std_sum_before": round(before.std_sum, 4), "std_sum_after": round(after.std_sum, 4),
            "std_max_after": round(after.std_max, 4), "stranded_pct_before": round(before.stranded_pct, 3),
            "stranded_pct_after": round(after.stranded_pct, 3), "evictions": evictions, "cycles": cycles,
            "plan_s": round(spent, 3), "by_cycle": trajectory}
    k, g = out["planners"]["koordinator"], out["planners"]["global"]
    matched = next((t["evictions"] for t in g["by_cycle"] if t["std_sum"] <= k["std_sum_after"]), None)
    g["evictions_to_match_koordinator"] = matched
    cut = 1 - g["std_sum_after"] / g["std_sum_before"] if g["std_sum_before"] else 0.0
    out["goals"] = {
        "global_cuts_std_sum_in_half": cut >= 0.5,
        "global_reaches_koordinator_cut": g["std_sum_after"] <= k["std_sum_after"],
        "with_no_more_evictions": matched is not None and matched <= k["evictions"],
    }
    return out


def spread(w: ScaleDownWorkload) -> tuple[list[Node], list[Pod]]:
    """The db pods on the `pool: db` nodes, then the web replicas placed by the default profile."""
    db_nodes = max(1, w.nodes // 5)
    nodes = [Node(name=f"node-{i:04d}", allocatable=NODE, capacity=NODE, labels={"pool": "db"} if i < db_nodes else {})
             for i in range(w.nodes)]
    sched = Scheduler(nodes)
    placed: list[Pod] = []
    batches: Sequence[tuple[str, int, ResourceList, dict[str, str]]] = (
        ("db", w.db_pods, ResourceList({"cpu": 4000, "memory": 16 * GI}), {"pool": "db"}),
        ("web", w.replicas, ResourceList({"cpu": 500, "memory": GI}), {}),
    )
    for name, count, requests, selector in batches:
        pods = [Pod(uid=f"{name}-{i:05d}", name=f"{name}-{i:05d}", namespace="bench", requests=requests,
                    owner_references=_owner(name), node_selector=selector, creation_timestamp=float(i),
                    phase="Running") for i in range(count)]
        decisions = {d.uid: d.node for d in sched.schedule(pods)}
        placed += [replace(p, node_name=decisions[p.uid]) for p in pods if decisions.get(p.uid)]
    return nodes, placed


def run_scale_down(w: ScaleDownWorkload) -> dict[str, Any]:
    nodes, pods = spread(w)
    view = ClusterView.build(nodes, pods)
    remove = w.replicas - w.replicas // 2
    rankers: dict[str, Any] = {}
    for ranker in binpack.RANKERS:
        t0 = time.perf_counter()
        plan = plan_scale_down(view, "bench/ReplicaSet/web", remove, BinPackArgs(), now=1e9, ranker=ranker)
        rankers[ranker] = {"empty_nodes": plan.empty_nodes_after, "stranded_pct": round(plan.stranded_pct_after, 3),
                           "evictions": len(plan.victims), "plan_s": round(time.perf_counter() - t0, 4)}
    ours, k8s, koord = (rankers[r]["empty_nodes"] for r in ("koordstream", "kubernetes", "koordinator"))
    return {"workload": w.__dict__, "pods": len(pods), "empty_nodes_before": int(binpack.empty_nodes(view).sum()),
            "rankers": rankers,
            "goals": {"twice_the_default_rankings_empty_nodes": ours >= 2 * k8s and ours > 0,
                      "more_than_koordinators": ours > koord}}


def run(imbalance: ImbalanceWorkload, scale_down: ScaleDownWorkload) -> dict[str, Any]:
    return {"imbalance": run_imbalance(imbalance), "scale_down": run_scale_down(scale_down)}
