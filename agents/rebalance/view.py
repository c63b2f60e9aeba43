"""The cluster as the rebalancer plans over it: nodes and the pods bound to them, as numpy
arrays in the scheduler's resource space.

`requested` counts every bound pod (non-evictable ones included), as kube-scheduler's
BalancedAllocation counts a node. The view is plain data: planners copy what they change.
It is built from the records the schedulers already read (Node records and bound Pod
records, `node_name` set); pods on unknown nodes are left out and counted in `unplaced`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from agents.rebalance.evictor import workload_of
from agents.scheduler.plugins.noderesources.balanced_allocation import balance_std
from agents.state import devices
from agents.state.resources import DEFAULT_RESOURCES, ResourceSpace
from schemas.records import Node, Pod


@dataclass
class ClusterView:
    space: ResourceSpace
    nodes: list[Node]
    index: dict[str, int]
    allocatable: npt.NDArray[np.int64]  # [nodes x resources]
    pods: list[Pod]  # bound pods on known nodes
    rows: npt.NDArray[np.intp]  # [pods]: the node of each
    vectors: npt.NDArray[np.int64]  # [pods x resources]
    requested: npt.NDArray[np.int64]  # [nodes x resources]: every bound pod's request
    unplaced: int = 0
    workloads: dict[str, list[int]] = field(default_factory=dict)  # workload -> pod indices

    @classmethod
    def build(cls, nodes: Iterable[Node], pods: Iterable[Pod], *, resources: Sequence[str] = ()) -> ClusterView:
        extra = tuple(r for r in resources if r not in DEFAULT_RESOURCES)
        space = ResourceSpace(DEFAULT_RESOURCES + extra)
        node_list = list(nodes)
        index = {n.name: i for i, n in enumerate(node_list)}
        width = len(space)
        allocatable = np.zeros((len(node_list), width), dtype=np.int64)
        for i, n in enumerate(node_list):
            allocatable[i] = space.allocatable(devices.node_gpu_totals(n.allocatable, n.gpus, n.rdma))
        placed, rows, unplaced = [], [], 0
        for p in pods:
            row = index.get(p.node_name, -1)
            if row < 0:
                unplaced += 1
                continue
            placed.append(p)
            rows.append(row)
        vectors = np.zeros((len(placed), width), dtype=np.int64)
        for i, p in enumerate(placed):
            vectors[i] = space.pod_request(devices.with_gpu_totals(p.requests))
        row_arr = np.array(rows, dtype=np.intp)
        requested = np.zeros_like(allocatable)
        np.add.at(requested, row_arr, vectors)
        workloads: dict[str, list[int]] = {}
        for i, p in enumerate(placed):
            w = workload_of(p)
            if w:
                workloads.setdefault(w, []).append(i)
        return cls(space, node_list, index, allocatable, placed, row_arr, vectors, requested, unplaced, workloads)

    def columns(self, resources: Sequence[str]) -> npt.NDArray[np.intp]:
        """The resource space's columns of `resources` (those the space knows)."""
        return np.array([self.space.index[r] for r in resources if r in self.space.index], dtype=np.intp)

    def std(self, columns: npt.NDArray[np.intp], requested: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.float64]:
        """Each node's imbalance over `columns`: BalancedAllocation's std (resources a node does
        not have are skipped)."""
        req = self.requested if requested is None else requested
        return balance_std(req[:, columns], self.allocatable[:, columns])

    def pods_on(self, row: int) -> npt.NDArray[np.intp]:
        out: npt.NDArray[np.intp] = np.flatnonzero(self.rows == row)
        return out
