"""ScaleDownBinPack (Koordinator's plugin, its names): when a workload loses replicas, choose
which of its pods go so that the rest concentrate on fewer nodes and whole nodes drain.

A ranking orders every pod of the workload, first to go first; it is published as
`controller.kubernetes.io/pod-deletion-cost` (the rank: lower goes first; protected pods get
the highest cost), which a ReplicaSet controller honours (`CalculateOnly`), or its first
`maxPodsToEvict` pods are evicted directly (`EvictDirectly`). Three rankers, from the same
view:

- `kubernetes`: what a ReplicaSet controller does with no deletion costs (its
  ActivePodsWithRanks order): unassigned, then not running, then pods doubled up with more of
  their workload on their node, then the newest. It spreads the survivors; the baseline.
- `koordinator`: Koordinator's ranker: nodes by weighted non-target over target usage,
  ascending (nodes where the workload dominates drain first); within a node larger pods
  first, then the newest.
- `koordstream` (the default): counts what each node would need to empty. A node whose only
  pods (DaemonSet pods aside) are this workload's drains when all of them go; such nodes are
  taken whole, cheapest first, while the replicas to remove last; the rest go from the
  drainable node closest to empty, then in Koordinator's order. Taking the cheapest nodes
  whole maximises the number of nodes a given count of victims can empty.

`empty_nodes` and the stranded capacity of the result are measured the same way for all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from agents.rebalance.args import DEFAULT_OBJECTIVE, absent, flag, integer, resources_from
from agents.rebalance.evictor import EvictorArgs
from agents.rebalance.objective import stranded_pct, typical_requests
from agents.rebalance.selectors import LabelSelector, Namespaces, PodSelectors
from agents.rebalance.view import ClusterView
from agents.scheduler.plugins.args import ArgsError, reject_unknown
from schemas.records import Pod

NAME = "ScaleDownBinPack"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
PROTECTED_COST = 2**31 - 1
STRATEGIES = ("CalculateOnly", "EvictDirectly")
RANKERS = ("koordstream", "koordinator", "kubernetes")


@dataclass(frozen=True)
class BinPackArgs:
    strategy: str = "CalculateOnly"
    max_pods_to_evict: int = 0
    resources: tuple[str, ...] = DEFAULT_OBJECTIVE
    resource_weights: dict[str, float] = field(default_factory=dict)  # missing: 1.0
    node_selector: LabelSelector | None = None
    pod_selectors: PodSelectors = field(default_factory=PodSelectors)
    evictable_namespaces: Namespaces = field(default_factory=Namespaces)
    paused: bool = False
    ranker: str = "koordstream"

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], path: str = "") -> BinPackArgs:
        reject_unknown(raw, {"strategy", "maxPodsToEvict", "resources", "resourceWeights", "nodeSelector",
                             "podSelectors", "evictableNamespaces", "paused", "ranker"}, path)
        strategy = raw.get("strategy", "CalculateOnly")
        if strategy not in STRATEGIES:
            raise ArgsError(f"{path}strategy", strategy, f"must be one of {', '.join(STRATEGIES)}")
        limit = integer(raw, "maxPodsToEvict", path, 0, 1) or 0
        if strategy == "EvictDirectly" and limit < 1:
            raise ArgsError(f"{path}maxPodsToEvict", raw.get("maxPodsToEvict"), "EvictDirectly needs maxPodsToEvict > 0")
        weights = absent(raw.get("resourceWeights"), {})
        if not isinstance(weights, Mapping):
            raise ArgsError(f"{path}resourceWeights", weights, "must map resource names to positive numbers")
        resources = resources_from(raw.get("resources"), f"{path}resources")
        for name, w in weights.items():
            if name not in resources:
                raise ArgsError(f"{path}resourceWeights.{name}", w, f"not one of resources ({', '.join(resources)})")
            if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0:
                raise ArgsError(f"{path}resourceWeights.{name}", w, "must be a positive finite number")
        ranker = raw.get("ranker", "koordstream")
        if ranker not in RANKERS:
            raise ArgsError(f"{path}ranker", ranker, f"must be one of {', '.join(RANKERS)}")
        selector = raw.get("nodeSelector")
        return cls(
            strategy=strategy, max_pods_to_evict=limit,
            resources=resources,
            resource_weights={str(k): float(v) for k, v in weights.items()},
            node_selector=None if selector is None else LabelSelector.from_mapping(selector, f"{path}nodeSelector"),
            pod_selectors=PodSelectors.from_list(raw.get("podSelectors"), f"{path}podSelectors"),
            evictable_namespaces=Namespaces.from_mapping(raw.get("evictableNamespaces"), f"{path}evictableNamespaces"),
            paused=flag(raw, "paused", False, path), ranker=ranker)


@dataclass(frozen=True)
class ScaleDownPlan:
    workload: str
    ranker: str
    order: tuple[str, ...]  # the workload's pod uids, first to go first
    costs: dict[str, int]  # uid -> pod-deletion-cost
    victims: tuple[str, ...]  # the first `remove` of `order` (EvictDirectly: at most maxPodsToEvict)
    empty_nodes_before: int
    empty_nodes_after: int
    stranded_pct_after: float
    protected: dict[str, str] = field(default_factory=dict)  # uid -> why it never goes


def empty_nodes(view: ClusterView, gone: set[int] | None = None) -> npt.NDArray[np.bool_]:
    """Nodes with no pods left but DaemonSet pods (after the pods `gone` left)."""
    staying = ~view.daemons
    if gone:
        staying[list(gone)] = False
    busy = np.zeros(len(view.nodes), dtype=bool)
    busy[view.rows[staying]] = True
    out: npt.NDArray[np.bool_] = ~busy
    return out


def plan_scale_down(view: ClusterView, workload: str, remove: int, args: BinPackArgs, *, now: float,
                    evictor: EvictorArgs | None = None, ranker: str | None = None) -> ScaleDownPlan:
    """Rank `workload`'s pods and pick `remove` victims (the ranker: `args.ranker` unless given)."""
    if remove < 1:
        raise ValueError(f"replicas={remove}: a scale-down removes at least one pod")
    ranker = ranker or args.ranker
    evictor = evictor or EvictorArgs()
    members = view.workloads.get(workload, [])
    protected: dict[str, str] = {}
    movable: list[int] = []
    for i in members:
        p = view.pods[i]
        why = evictor.refusal(p, now)
        if not why and not args.evictable_namespaces.allows(p.namespace):
            why = "namespace not evictable"
        if not why and not args.pod_selectors.admits(p.labels):
            why = "not matched by podSelectors"
        if not why and args.node_selector is not None and not args.node_selector.matches(view.nodes[view.rows[i]].labels):
            why = "node not matched by nodeSelector"
        if why:
            protected[p.uid] = why
        else:
            movable.append(i)
    if ranker == "kubernetes":
        ordered = _kubernetes(view, movable)
    elif ranker == "koordinator":
        ordered = _koordinator(view, movable, members, args)
    else:
        ordered = _koordstream(view, movable, members, args, remove)
    count = min(remove, len(ordered))
    if args.strategy == "EvictDirectly":
        count = min(count, args.max_pods_to_evict)
    victims = ordered[:count]
    costs = {view.pods[i].uid: rank for rank, i in enumerate(ordered)}
    costs.update(dict.fromkeys(protected, PROTECTED_COST))
    gone = set(victims)
    columns = view.columns(args.resources)
    requested = view.requested.copy()
    for i in victims:
        requested[view.rows[i]] -= view.vectors[i]
    kinds, freq = typical_requests(view.vectors, columns)
    free = (view.allocatable - requested)[:, columns]
    return ScaleDownPlan(workload, ranker, tuple(view.pods[i].uid for i in ordered), costs,
                         tuple(view.pods[i].uid for i in victims), int(empty_nodes(view).sum()),
                         int(empty_nodes(view, gone).sum()),
                         stranded_pct(free, view.allocatable[:, columns], kinds, freq), protected)


@dataclass(frozen=True)
class Replica:
    """What Kubernetes' ReplicaSet controller ranks a pod by when it picks pods to delete."""

    uid: str
    node: str = ""
    phase: str = "Running"
    ready: bool = True
    cost: int = 0  # pod-deletion-cost
    ready_since: float = 0.0
    creation: float = 0.0


def kubernetes_order(replicas: Sequence[Replica]) -> list[int]:
    """Indices of `replicas`, first to delete first, as the ReplicaSet controller sorts them
    (ActivePodsWithRanks): unassigned, then pending before unknown before running, not ready
    before ready, lower pod-deletion-cost, more of the workload's pods on the same node
    (doubled up), ready more recently, newer. Restart counts are not known here."""
    on_node: dict[str, int] = {}
    for r in replicas:
        if r.node:
            on_node[r.node] = on_node.get(r.node, 0) + 1
    phase_rank = {"Pending": 0, "Unknown": 1, "Running": 2}

    def key(i: int) -> tuple[Any, ...]:
        r = replicas[i]
        return (bool(r.node), phase_rank.get(r.phase, 0), r.ready, r.cost, -on_node.get(r.node, 0),
                -r.ready_since, -r.creation, r.uid)

    return sorted(range(len(replicas)), key=key)


def deletion_cost(p: Pod) -> int:
    try:
        return int(p.annotations.get(DELETION_COST, "0"))
    except ValueError:
        return 0


def _kubernetes(view: ClusterView, movable: Sequence[int]) -> list[int]:
    """Kubernetes' own order, from the view (a running pod counts as ready)."""
    replicas = [Replica(view.pods[i].uid, view.pods[i].node_name, view.pods[i].phase, view.pods[i].phase == "Running",
                        deletion_cost(view.pods[i]), creation=view.pods[i].creation_timestamp) for i in movable]
    return [movable[k] for k in kubernetes_order(replicas)]


def _weights(view: ClusterView, args: BinPackArgs) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    columns = view.columns(args.resources)
    names = [r for r in args.resources if r in view.space.index]
    return columns, np.array([args.resource_weights.get(r, 1.0) for r in names])


def _node_usage(view: ClusterView, members: Sequence[int], args: BinPackArgs
                ) -> tuple[dict[int, list[int]], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per node: the workload's pods there, and the weighted target and non-target usage
    (each resource as a share of the node's allocatable)."""
    columns, weights = _weights(view, args)
    alloc = np.where(view.allocatable[:, columns] > 0, view.allocatable[:, columns], 1).astype(np.float64)
    target = np.zeros((len(view.nodes), len(columns)), dtype=np.int64)
    by_node: dict[int, list[int]] = {}
    for i in members:
        row = int(view.rows[i])
        target[row] += view.vectors[i][columns]
        by_node.setdefault(row, []).append(i)
    others = view.requested[:, columns] - target
    return by_node, (target / alloc) @ weights, (others / alloc) @ weights


def _within_node(view: ClusterView, pods: list[int], columns: npt.NDArray[np.intp]) -> list[int]:
    """Larger pods first, then the newest."""
    return sorted(pods, key=lambda i: (-int(view.vectors[i][columns].sum()), -view.pods[i].creation_timestamp,
                                       view.pods[i].uid))


def _koordinator(view: ClusterView, movable: Sequence[int], members: Sequence[int], args: BinPackArgs) -> list[int]:
    by_node, target, others = _node_usage(view, members, args)
    keep = set(movable)
    columns, _ = _weights(view, args)
    score = {row: others[row] / max(target[row], 1e-12) for row in by_node}
    out: list[int] = []
    for row in sorted(by_node, key=lambda r: (score[r], r)):
        out.extend(_within_node(view, [i for i in by_node[row] if i in keep], columns))
    return out


def _koordstream(view: ClusterView, movable: Sequence[int], members: Sequence[int], args: BinPackArgs,
                 remove: int) -> list[int]:
    by_node, target, others = _node_usage(view, members, args)
    keep = set(movable)
    columns, _ = _weights(view, args)
    others_stay = ~view.daemons
    others_stay[list(members)] = False
    blocked = np.zeros(len(view.nodes), dtype=bool)  # another pod (not DaemonSet) stays there
    blocked[view.rows[others_stay]] = True
    for row, pods in by_node.items():
        if any(i not in keep for i in pods):
            blocked[row] = True  # a protected replica stays
    drainable = sorted((r for r in by_node if not blocked[r]), key=lambda r: (len(by_node[r]), -others[r], r))
    out: list[int] = []
    budget = remove
    taken: set[int] = set()
    for row in drainable:  # whole nodes, cheapest first
        if len(by_node[row]) <= budget:
            out.extend(_within_node(view, by_node[row], columns))
            budget -= len(by_node[row])
            taken.add(row)
    rest = [r for r in drainable if r not in taken]  # closest to empty first: next time they drain
    score = {row: others[row] / max(target[row], 1e-12) for row in by_node}
    rest += sorted((r for r in by_node if blocked[r]), key=lambda r: (score[r], r))
    for row in rest:
        out.extend(_within_node(view, [i for i in by_node[row] if i in keep], columns))
    return out
