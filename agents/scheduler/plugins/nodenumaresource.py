"""NodeNUMAResource (PreFilter, Filter, Reserve / Unreserve): CPUs bound on NUMA nodes.

PreFilter decides whether the pod is bound to CPUs (Koordinator QoS LSE or LSR, whole CPUs
asked by its containers, a runtime class's overhead aside; `agents.state.cpus.pod_cpu_request`) and with which bind policy; a malformed
`scheduling.koordinator.sh/resource-spec` rejects it as unresolvable; other pods skip the
plugin. Filter: the node has a NUMA topology and the exact choice (`cpus.choose`, honouring
the node's NUMA topology policy and the bind policy) finds CPUs for the pod there, and room
for its memory in the same cells where the node states each cell's memory; nodes are
first pruned by their count of free CPUs, so the exact choice runs only where it could work,
and each node's answer for a request is kept until the node's CPUs change
(`CpuTable.fit_cache`), so a pod costs one exact choice per node that changed since.
CPUs (and cell memory) that nominations of other pods with equal or higher priority name are
not free for the pod (a preemptor is promised concrete CPUs). Reserve takes the chosen CPUs
(assumed under the claim's hold id, seen by every profile at once) and leaves them for the Claim; the owner checks them CPU by CPU; the decider writes
`scheduling.koordinator.sh/resource-status` on the Binding. Unreserve gives them back.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from agents.scheduler.cluster import ClusterEvent, ClusterState
from agents.scheduler.framework import status
from agents.scheduler.framework.interface import (
    CycleState,
    Mask,
    PodInfo,
    Rows,
)
from agents.scheduler.framework.status import Status
from agents.scheduler.plugins import reservation
from agents.scheduler.plugins.args import NoArgs
from agents.scheduler.plugins.parsed import ParsedPlugin
from agents.state import cpus
from schemas.records import hold_id

NAME = "NodeNUMAResource"
PROMISED = NAME + "/promised"  # cycle key: {row: (CPUs, memory per cell)} others' nominations name
REASON = "Insufficient NUMA-bound cpus"


class NodeNUMAResource(ParsedPlugin):
    NAME: ClassVar[str] = NAME
    DYNAMIC: ClassVar[bool] = True
    EVENTS: ClassVar[ClusterEvent] = ClusterEvent.ANY

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def parse(self, pod: PodInfo) -> cpus.CpuRequest | None:
        if reservation.DERIVED in pod.derived:  # a reservation holds CPUs by totals only
            return None
        return cpus.pod_cpu_request(pod.qos, pod.pod)

    def pre_filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Status:
        st = super().pre_filter(cycle, pod, state)
        if st.ok:  # CPUs (and cell memory) promised to others of equal or higher priority are theirs
            promised: dict[int, tuple[set[int], dict[int, int]]] = {}
            for row, nomination in state.nominator.devices_for(pod.priority, pod.uid):
                for cpuset in cpus.decode(nomination.devices):
                    taken, memory = promised.setdefault(row, (set(), {}))
                    taken.update(cpuset.cpus)
                    memory[cpuset.cell] = memory.get(cpuset.cell, 0) + cpuset.memory
            cycle.write(PROMISED, promised)
        return st

    @staticmethod
    def _taken(cycle: CycleState, state: ClusterState, row: int) -> tuple[set[int], dict[int, int]]:
        """CPUs and memory per cell that are bound, assumed, or promised to others on the node."""
        bound, memory = state.cpus.bound(row), state.cpus.memory_bound(row)
        promised = (cycle.read(PROMISED) or {}).get(row)
        if promised:
            bound = bound | promised[0]
            for cell, amount in promised[1].items():
                memory[cell] = memory.get(cell, 0) + amount
        return bound, memory

    def _choose(self, cycle: CycleState, req: cpus.CpuRequest, state: ClusterState, row: int
                ) -> list[cpus.CpuSet] | None:
        cells = state.cpus.cells.get(row)
        if not cells:
            return None
        bound, memory = self._taken(cycle, state, row)
        return cpus.choose(req, cells, bound, state.cpus.policy.get(row, "None"), memory)

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Mask:
        req: cpus.CpuRequest = cycle.read(NAME)
        out = np.zeros(state.size, dtype=bool)
        table = state.cpus
        promised = cycle.read(PROMISED) or {}
        fits, seen = table.cached_fits(req, state.size)
        counters = table.counters(state.size)
        numa_rows = table.rows[table.rows < state.size]  # only nodes with a NUMA topology bind CPUs
        stale = numa_rows[seen[numa_rows] != counters[numa_rows]]
        for row in stale.tolist():
            if row in promised:
                continue  # answered below, without the cache
            fits[row] = self._fits(cycle, req, state, row)
            seen[row] = counters[row]
        out[numa_rows] = fits[numa_rows]
        for row in promised:  # others' promises are per pod: never cached
            if row < state.size and table.cells.get(row):
                out[row] = self._fits(cycle, req, state, row)
        picked: Mask = out[rows]
        return picked

    def _fits(self, cycle: CycleState, req: cpus.CpuRequest, state: ClusterState, row: int) -> bool:
        cells = state.cpus.cells[row]
        return (sum(len(c.cpus) for c in cells) - len(state.cpus.bound(row)) >= req.cpus
                and self._choose(cycle, req, state, row) is not None)

    def explain(self, cycle: CycleState, pod: PodInfo, state: ClusterState, failed: Mask) -> dict[str, int]:
        return {REASON: int(failed.sum())}

    def fit_steps(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int, limit: int) -> int:
        req: cpus.CpuRequest = cycle.read(NAME)
        cells = state.cpus.cells.get(row)
        if not cells:
            return 0
        used, memory = self._taken(cycle, state, row)
        used, policy = set(used), state.cpus.policy.get(row, "None")
        placed = 0
        while placed < limit:
            chosen = cpus.choose(req, cells, used, policy, memory)
            if chosen is None:
                break
            used.update(c for s in chosen for c in s.cpus)
            for s in chosen:
                memory[s.cell] = memory.get(s.cell, 0) + s.memory
            placed += 1
        return placed

    def reserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> Status:
        req: cpus.CpuRequest = cycle.read(NAME)
        cycle.allocate(NAME, ())
        chosen = self._choose(cycle, req, state, row)
        if chosen is None:
            return status.unschedulable(NAME, REASON)
        state.cpus.assume(hold_id(pod.uid, pod.attempt, state.names[row]), row, chosen)
        cycle.allocate(NAME, tuple(s.encode() for s in chosen))
        return status.SUCCESS

    def unreserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> None:
        state.cpus.forget(hold_id(pod.uid, pod.attempt, state.names[row]))
