"""The cluster as the rebalancer plans over it: nodes and the pods bound to them, as numpy
arrays in the scheduler's resource space.

`requested` counts every bound pod that has not finished (non-evictable ones included), as
kube-scheduler's BalancedAllocation counts a node; Succeeded and Failed pods are left out. The view is plain data: planners copy what they change.
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

TERMINAL = frozenset({"Succeeded", "Failed"})  # finished pods hold nothing (kube-scheduler counts none)


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
    _by_row: list[npt.NDArray[np.intp]] | None = None
    _daemons: npt.NDArray[np.bool_] | None = None

    @classmethod
    def build(cls, nodes: Iterable[Node], pods: Iterable[Pod], *, resources: Sequence[str] = ()) -> ClusterView:
        """Raises ValueError naming the record and field for what cannot be planned over: two
        nodes or two pods with one name or uid, a negative request."""
        node_list = list(nodes)
        pod_list = [p for p in pods if p.phase not in TERMINAL]
        names: dict[str, None] = dict.fromkeys(r for r in resources if r not in DEFAULT_RESOURCES)
        for n in node_list:
            names.update(dict.fromkeys(devices.node_gpu_totals(n.allocatable, n.gpus, n.rdma)))
        seen: set[str] = set()
        for p in pod_list:
            if p.uid in seen:
                raise ValueError(f"pods: uid {p.uid!r} appears twice")
            seen.add(p.uid)
            for name, amount in p.requests.items():
                if amount < 0:
                    raise ValueError(f"pod {p.namespace}/{p.name}: requests.{name}={amount}: a request cannot be negative")
            names.update(dict.fromkeys(devices.with_gpu_totals(p.requests)))
        space = ResourceSpace(DEFAULT_RESOURCES + tuple(r for r in names if r not in DEFAULT_RESOURCES))
        index: dict[str, int] = {}
        for i, n in enumerate(node_list):
            if n.name in index:
                raise ValueError(f"nodes: name {n.name!r} appears twice")
            index[n.name] = i
        width = len(space)
        allocatable = np.zeros((len(node_list), width), dtype=np.int64)
        for i, n in enumerate(node_list):
            allocatable[i] = space.allocatable(devices.node_gpu_totals(n.allocatable, n.gpus, n.rdma))
        placed, rows, unplaced = [], [], 0
        for p in pod_list:
            row = index.get(p.node_name, -1)
            if row < 0:
                unplaced += 1
                continue
            placed.append(p)
            rows.append(row)
        vectors = np.zeros((len(placed), width), dtype=np.int64)
        for i, p in enumerate(placed):
            vectors[i] = request_vector(space, p)
        row_arr = np.array(rows, dtype=np.intp)
        requested = np.zeros_like(allocatable)
        np.add.at(requested, row_arr, vectors)
        workloads: dict[str, list[int]] = {}
        for i, p in enumerate(placed):
            w = workload_of(p)
            if w:
                workloads.setdefault(w, []).append(i)
        return cls(space, node_list, index, allocatable, placed, row_arr, vectors, requested, unplaced, workloads)

    def request_of(self, pod: Pod) -> npt.NDArray[np.int64]:
        """`pod`'s request in the view's resource space, placed here or not."""
        return request_vector(self.space, pod)

    def columns(self, resources: Sequence[str]) -> npt.NDArray[np.intp]:
        """The resource space's columns of `resources` (those the space knows)."""
        return np.array([self.space.index[r] for r in resources if r in self.space.index], dtype=np.intp)

    def std(self, columns: npt.NDArray[np.intp], requested: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.float64]:
        """Each node's imbalance over `columns`: BalancedAllocation's std (resources a node does
        not have are skipped)."""
        req = self.requested if requested is None else requested
        return balance_std(req[:, columns], self.allocatable[:, columns])

    def pods_on(self, row: int) -> npt.NDArray[np.intp]:
        """The indices of the pods on node `row`, in pod order (grouped once per view)."""
        if self._by_row is None:
            order = np.argsort(self.rows, kind="stable")
            bounds = np.searchsorted(self.rows[order], np.arange(len(self.nodes) + 1))
            self._by_row = [order[bounds[r]:bounds[r + 1]] for r in range(len(self.nodes))]
        return self._by_row[row]

    @property
    def daemons(self) -> npt.NDArray[np.bool_]:
        """[pods]: a DaemonSet owns the pod (it stays wherever a node drains)."""
        if self._daemons is None:
            self._daemons = np.array([any(r.kind == "DaemonSet" for r in p.owner_references) for p in self.pods],
                                     dtype=bool)
        return self._daemons


def request_vector(space: ResourceSpace, pod: Pod) -> npt.NDArray[np.int64]:
    return space.pod_request(devices.with_gpu_totals(pod.requests))
