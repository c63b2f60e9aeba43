"""NodeNUMAResource (PreFilter, Filter, Reserve / Unreserve): CPUs bound on NUMA nodes.

PreFilter decides whether the pod is bound to CPUs (Koordinator QoS LSE or LSR, whole CPUs;
`agents.state.cpus.cpu_request`) and with which bind policy; a malformed
`scheduling.koordinator.sh/resource-spec` rejects it as unresolvable; other pods skip the
plugin. Filter: the node has a NUMA topology and the exact choice (`cpus.choose`, honouring
the node's NUMA topology policy and the bind policy) finds CPUs for the pod there, and room
for its memory in the same cells where the node states each cell's memory; nodes are
first pruned by their count of free CPUs, so the exact choice runs only where it could work.
Reserve takes the chosen CPUs (assumed under the claim's hold id, seen by every profile at
once) and leaves them for the Claim; the owner checks them CPU by CPU; the decider writes
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
from agents.scheduler.plugins.args import NoArgs
from agents.scheduler.plugins.parsed import ParsedPlugin
from agents.state import cpus
from schemas.records import hold_id

NAME = "NodeNUMAResource"
REASON = "Insufficient NUMA-bound cpus"


class NodeNUMAResource(ParsedPlugin):
    NAME: ClassVar[str] = NAME
    DYNAMIC: ClassVar[bool] = True
    EVENTS: ClassVar[ClusterEvent] = ClusterEvent.ANY

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def parse(self, pod: PodInfo) -> cpus.CpuRequest | None:
        requests = pod.pod.requests
        return cpus.cpu_request(pod.qos, requests.get("cpu", 0), pod.pod.annotations, requests.get("memory", 0))

    def _fits(self, req: cpus.CpuRequest, state: ClusterState, row: int) -> bool:
        cells = state.cpus.cells.get(row)
        if not cells:
            return False
        return cpus.choose(req, cells, state.cpus.bound(row), state.cpus.policy.get(row, "None"),
                           state.cpus.memory_bound(row)) is not None

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Mask:
        req: cpus.CpuRequest = cycle.read(NAME)
        out = np.zeros(state.size, dtype=bool)
        table = state.cpus
        for row, cells in table.cells.items():  # only nodes with a NUMA topology can bind CPUs
            if row < state.size and sum(len(c.cpus) for c in cells) - len(table.bound(row)) >= req.cpus:
                out[row] = self._fits(req, state, row)
        picked: Mask = out[rows]
        return picked

    def explain(self, cycle: CycleState, pod: PodInfo, state: ClusterState, failed: Mask) -> dict[str, int]:
        return {REASON: int(failed.sum())}

    def fit_steps(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int, limit: int) -> int:
        req: cpus.CpuRequest = cycle.read(NAME)
        cells = state.cpus.cells.get(row)
        if not cells:
            return 0
        used, policy = set(state.cpus.bound(row)), state.cpus.policy.get(row, "None")
        memory = state.cpus.memory_bound(row)
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
        cells = state.cpus.cells.get(row) or []
        chosen = cpus.choose(req, cells, state.cpus.bound(row), state.cpus.policy.get(row, "None"),
                             state.cpus.memory_bound(row))
        if chosen is None:
            return status.unschedulable(NAME, REASON)
        state.cpus.assume(hold_id(pod.uid, pod.attempt, state.names[row]), row, chosen)
        cycle.allocate(NAME, tuple(s.encode() for s in chosen))
        return status.SUCCESS

    def unreserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> None:
        state.cpus.forget(hold_id(pod.uid, pod.attempt, state.names[row]))
