"""DefaultPreemption (PostFilter): make room for a pod by evicting pods of lower priority.

Called when a pod fits nowhere. Candidate nodes are those that pass every filter except
NodeResourcesFit and DeviceShare and where the pod would fit if every pod of lower priority left (vectorized
over all bound pods). On each candidate (at most max(`minCandidateNodesPercentage`% of the
nodes, `minCandidateNodesAbsolute`), in node order), victims are chosen as kube-scheduler
does: remove every lower-priority pod, then reprieve them one by one from the highest
priority down while the pod still fits. The node where the disruption is least wins: the
lowest highest-victim priority, then the lowest sum of victim priorities, then the fewest
victims, then the lowest node index.

A preemptor with an elastic quota takes victims only from its own quota. The result
nominates the pod on that node with its full claim (others' filters count it from
then on) and names the victims; the scheduler sends their EvictionCommands. While victims it
chose for a pod are still bound, that pod does not preempt again (it waits for them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from agents.scheduler.cluster import ClusterState, PodOnNode
from agents.scheduler.framework.interface import CycleState, Diagnosis, PodInfo, PostFilterResult
from agents.scheduler.plugins.args import ArgsError, reject_unknown
from agents.scheduler.plugins.noderesources.fit import NAME as FIT
from agents.state import admission, cpus, devices
from agents.state import usage as keys
from schemas.records import QUOTA_LABEL, Nomination, ResourceList

NAME = "DefaultPreemption"
RESOLVABLE = frozenset({FIT, "DeviceShare", "NodeNUMAResource"})  # filters whose rejections evicting pods can fix


@dataclass(frozen=True)
class PreemptionArgs:
    min_candidate_nodes_percentage: int = 10
    min_candidate_nodes_absolute: int = 100

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> PreemptionArgs:
        names = {"minCandidateNodesPercentage": "min_candidate_nodes_percentage",
                 "minCandidateNodesAbsolute": "min_candidate_nodes_absolute"}
        reject_unknown(raw, set(names))
        return cls(**{names[k]: v for k, v in raw.items()})

    def validate(self) -> None:
        pct, absolute = self.min_candidate_nodes_percentage, self.min_candidate_nodes_absolute
        if not isinstance(pct, int) or not 0 <= pct <= 100:
            raise ArgsError("minCandidateNodesPercentage", pct, "must be an integer from 0 to 100")
        if not isinstance(absolute, int) or absolute < 0:
            raise ArgsError("minCandidateNodesAbsolute", absolute, "must be a non-negative integer")
        if pct == 0 and absolute == 0:
            raise ArgsError("minCandidateNodesAbsolute", absolute, "cannot be 0 when minCandidateNodesPercentage is 0")


EXACT_SUM = 2**53  # float64 adds integers exactly while every sum stays below this


def _sums_by_row(rows: npt.NDArray[np.intp], vectors: npt.NDArray[np.int64], columns: npt.NDArray[np.intp],
                 n: int, width: int) -> npt.NDArray[np.int64]:
    """Per row, the sum of the `vectors` on it, in `columns` only (the pod's requested ones, all
    that the fit reads; the others stay 0). `np.bincount` per column, several times faster
    than `np.add.at` over every lower-priority pod; it adds in float64, so a column whose total
    could leave float64's exact integers is summed with `np.add.at`."""
    out = np.zeros((n, width), dtype=np.int64)
    for col in columns.tolist():
        values = vectors[:, col]
        if _exact(values):
            out[:, col] = np.bincount(rows, weights=values, minlength=n)
        else:
            np.add.at(out[:, col], rows, values)
    return out


def _exact(values: npt.NDArray[np.int64]) -> bool:
    """Whether float64 sums `values` exactly: none negative, and their total (which bounds
    every partial sum) below `EXACT_SUM`, summed without int64 overflow."""
    if not len(values):
        return True
    low, high = int(values.min()), int(values.max())
    return low >= 0 and high * len(values) < 2**63 and int(values.sum()) < EXACT_SUM


class DefaultPreemption:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: PreemptionArgs | None = None) -> None:
        self.args = args or PreemptionArgs()
        self._victims_of: dict[str, set[str]] = {}  # preemptor uid -> victims it is waiting for

    def post_filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState,
                    diagnosis: Diagnosis) -> PostFilterResult | None:
        waiting_for = self._victims_of.get(pod.uid)
        if waiting_for is not None:
            waiting_for &= state.bound.keys()
            if waiting_for:
                return None  # its victims are still leaving
            del self._victims_of[pod.uid]
        n = state.size
        potential = state.schedulable_rows().copy()
        for name, mask in diagnosis.masks.items():
            if name not in RESOLVABLE:
                potential &= mask
        bound = state.bound_arrays()
        lower = bound.priorities < pod.priority
        quota = pod.pod.labels.get(QUOTA_LABEL, "")
        if quota:  # preemption stays inside the preemptor's quota
            lower &= bound.quotas == quota
        if not potential.any() or not lower.any():
            return None
        removable = _sums_by_row(bound.rows[lower], bound.vectors[lower], pod.columns, n, len(state.space))
        promised, yieldable = cycle.read(FIT)  # as NodeResourcesFit counts them
        room = admission.room(state.free, promised, None, yieldable)
        candidates = np.flatnonzero(potential & admission.admits(room + removable, pod.request, pod.columns))
        if not candidates.size:
            return None
        limit = max(n * self.args.min_candidate_nodes_percentage // 100, self.args.min_candidate_nodes_absolute)
        candidates = candidates[:limit]
        on_node: dict[int, list[PodOnNode]] = {int(r): [] for r in candidates}
        for i in np.flatnonzero(lower & np.isin(bound.rows, candidates)).tolist():
            placed = bound.pods[i]
            on_node[placed.row].append(placed)
        best: tuple[tuple[int, int, int, int], int, list[PodOnNode]] | None = None
        for row, pods in on_node.items():
            victims = self._victims(room[row] + removable[row], pods, pod)
            if not victims:
                continue
            prios = [v.pod.priority for v in victims]
            rank = (max(prios), sum(prios), len(victims), row)
            if best is None or rank < best[0]:
                best = (rank, row, victims)
        if best is None:
            return None
        _, row, victims = best
        self._victims_of[pod.uid] = {v.pod.uid for v in victims}
        nomination = Nomination(uid=pod.uid, node=state.names[row], priority=pod.priority,
                                requests=ResourceList(state.space.to_map(pod.request)),
                                devices=self._promised(pod, state, row, victims))
        return PostFilterResult(nomination, tuple(victims))

    @staticmethod
    def _promised(pod: PodInfo, state: ClusterState, row: int, victims: list[PodOnNode]) -> tuple[str, ...]:
        """The concrete devices the preemptor gets once its victims are gone: GPUs, RDMA
        virtual functions and NUMA-bound CPUs, chosen among what is free plus the victims'
        devices, less what others of equal or higher priority were promised. A kind that does
        not fit device by device is left out (its totals still hold)."""
        freed: dict[str, int] = {}
        for victim in victims:
            devices.add_usage(freed, victim.pod.devices)
        promised: dict[str, int] = {}
        for _, nomination in state.nominator.devices_for(pod.priority, pod.uid):
            if nomination.node == state.names[row]:
                devices.add_usage(promised, nomination.devices)

        def free(key: str, now: int) -> int:
            return now + freed.get(key, 0) - promised.get(key, 0)

        out: list[str] = []
        requests = pod.pod.requests
        try:
            gpu = devices.gpu_request(requests)
        except ValueError:
            gpu = None
        if gpu is not None:
            minors, core, ratio, memory = state.gpus.free_row(row)
            chosen = devices.choose(gpu, minors, [free(keys.gpu_core(m), c) for m, c in zip(minors, core, strict=True)],
                                    [free(keys.gpu_ratio(m), r) for m, r in zip(minors, ratio, strict=True)], memory)
            out += [a.encode() for a in chosen or ()]
        vfs = devices.rdma_request(requests)
        if vfs:
            minors, room = state.nics.free_row(row)
            nics = devices.choose_vfs(vfs, minors, [free(keys.rdma_vfs(m), f) for m, f in zip(minors, room, strict=True)])
            out += [n.encode() for n in nics or ()]
        try:
            cpu = cpus.pod_cpu_request(pod.qos, pod.pod)
        except cpus.CpuError:
            cpu = None
        cells = state.cpus.cells.get(row)
        if cpu is not None and cells:
            bound = {c for c in state.cpus.bound(row) if not freed.get(keys.cpu_used(c))}
            bound |= set(keys.by_index(promised, "cpu"))
            memory_used = state.cpus.memory_bound(row)
            for usage, sign in ((freed, -1), (promised, 1)):
                for cell, amount in keys.by_index(usage, "numa").items():
                    memory_used[cell] = memory_used.get(cell, 0) + sign * amount
            sets = cpus.choose(cpu, cells, bound, state.cpus.policy.get(row, "None"), memory_used)
            out += [c.encode() for c in sets or ()]
        return tuple(out)

    @staticmethod
    def _victims(room: np.ndarray, pods: list[PodOnNode], pod: PodInfo) -> list[PodOnNode]:
        """Reprieve lower-priority pods, highest priority first, while the pod still fits."""
        victims = []
        for placed in sorted(pods, key=lambda p: (-p.pod.priority, p.pod.uid)):
            after = room - placed.vector
            if admission.admits(after[None, :], pod.request, pod.columns)[0]:
                room = after  # the pod fits without evicting this one: it stays
            else:
                victims.append(placed)
        return victims
