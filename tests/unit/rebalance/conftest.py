"""Builders for the rebalancer's tests: replicated pods on nodes, and the view, simulator and
arbitrator a planner needs."""

from __future__ import annotations

from collections.abc import Sequence

from agents.rebalance.arbitration import ArbitrationArgs, Arbitrator, Budget
from agents.rebalance.simulate import Simulator
from agents.rebalance.view import ClusterView
from schemas.records import Node, OwnerReference, Pod
from tests.builders import GI, make_node, make_pod

NOW = 10_000.0


def replica(uid: str, node: str, workload: str = "web", cpu: int = 1000, memory: int = GI, **kw: object) -> Pod:
    """A running pod of ReplicaSet `workload` on `node`, old enough to move."""
    owner = (OwnerReference(kind="ReplicaSet", name=workload, uid=f"rs-{workload}", controller=True),)
    kw.setdefault("owner_references", owner)
    kw.setdefault("creation_timestamp", 0.0)
    kw.setdefault("phase", "Running")
    return make_pod(uid, cpu=cpu, memory=memory, node_name=node, **kw)


def nodes(count: int, cpu: int = 8000, memory: int = 32 * GI) -> list[Node]:
    return [make_node(f"n{i}", cpu=cpu, memory=memory) for i in range(count)]


def planning(node_list: Sequence[Node], pods: Sequence[Pod], arbitration: ArbitrationArgs | None = None,
             budgets: Sequence[Budget] = ()) -> tuple[ClusterView, Simulator, Arbitrator]:
    view = ClusterView.build(node_list, pods)
    return view, Simulator(view), Arbitrator.over(arbitration or ArbitrationArgs(), pods, budgets)
