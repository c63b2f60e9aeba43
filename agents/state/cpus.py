"""CPU binding on NUMA nodes (Koordinator's NodeNUMAResource model), shared by the scheduler
and the owners.

A node's topology comes from its record (`Node.numa`: cells with their CPU ids and, in
`NumaCell.cores`, the physical core of each CPU; without it every CPU is its own core) and its
NUMA topology policy from the label `node.koordinator.sh/numa-topology-policy`:

- `SingleNUMANode`: a pod's CPUs all come from one cell, or it does not fit;
- `Restricted`: from as few cells as the request needs, or it does not fit;
- `BestEffort` and `None` (the default): one cell when one has room, else as few as can.

A pod is bound to CPUs when its Koordinator QoS is LSE or LSR and its containers ask for
whole CPUs (`pod_cpu_request`: a runtime class's overhead is not theirs and stays unbound).
Its memory is then bound to the same cells: when the node states each cell's memory
(`NumaCell.memory`), the cells chosen must also hold the pod's memory request (one cell under
`SingleNUMANode`; otherwise the chosen cells in order, each giving what it has left); a node
that does not state it is not checked for memory per cell.
Its CPU bind policy comes from the annotation `scheduling.koordinator.sh/resource-spec`
(`{"preferredCPUBindPolicy": ...}`): `FullPCPUs` (the default) takes whole physical cores;
`SpreadByPCPUs` takes one thread of each core before a second one. Within the cells chosen,
the fullest cell that fits goes first (packing leaves whole cells for others).

An allocation travels as `cpuset/<cell>/<cpu>,<cpu>,...[/<memory bytes>]` in `Claim.devices`
and ends on the Binding as `scheduling.koordinator.sh/resource-status`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from schemas.errors import FieldError
from schemas.records import Pod

NUMA_POLICY_LABEL = "node.koordinator.sh/numa-topology-policy"
RESOURCE_SPEC = "scheduling.koordinator.sh/resource-spec"
RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
NUMA_POLICIES = ("None", "BestEffort", "Restricted", "SingleNUMANode")
FULL_PCPUS, SPREAD_BY_PCPUS = "FullPCPUs", "SpreadByPCPUs"
BIND_POLICIES = (FULL_PCPUS, SPREAD_BY_PCPUS, "Default")
BOUND_QOS = ("LSE", "LSR")


class CpuError(FieldError):
    """A CPU binding request that cannot be valid."""


@dataclass(frozen=True, slots=True)
class CpuRequest:
    cpus: int
    policy: str = FULL_PCPUS
    memory: int = 0  # bytes, bound to the same cells when the node states cell memory


@dataclass(frozen=True, slots=True)
class Cell:
    id: int
    cpus: tuple[int, ...]
    cores: tuple[int, ...]  # physical core of each CPU, in the same order
    memory: int = 0  # bytes (0: not stated, not checked)


@dataclass(frozen=True, slots=True)
class CpuSet:
    cell: int
    cpus: tuple[int, ...]
    memory: int = 0  # bytes of the pod's memory bound to this cell

    def encode(self) -> str:
        tail = f"/{self.memory}" if self.memory else ""
        return f"cpuset/{self.cell}/{','.join(map(str, self.cpus))}{tail}"


def cpu_request(qos: str, cpu_millis: int, annotations: Mapping[str, str], memory: int = 0) -> CpuRequest | None:
    """The pod's CPU binding request, or None when it is not bound; raises CpuError."""
    raw = annotations.get(RESOURCE_SPEC)
    policy = FULL_PCPUS
    if raw:
        try:
            spec = json.loads(raw)
        except ValueError:
            raise CpuError(f"metadata.annotations.{RESOURCE_SPEC}", raw, "is not JSON") from None
        asked = spec.get("preferredCPUBindPolicy", "Default") if isinstance(spec, dict) else None
        if asked not in BIND_POLICIES:
            raise CpuError(f"metadata.annotations.{RESOURCE_SPEC}.preferredCPUBindPolicy", asked,
                           f"must be one of {', '.join(BIND_POLICIES)}")
        policy = SPREAD_BY_PCPUS if asked == SPREAD_BY_PCPUS else FULL_PCPUS
    if qos not in BOUND_QOS or cpu_millis <= 0 or cpu_millis % 1000:
        return None
    return CpuRequest(cpu_millis // 1000, policy, memory)


def pod_cpu_request(qos: str, pod: Pod) -> CpuRequest | None:
    """The pod's CPU binding request (`cpu_request`) by what its containers ask: its effective
    request less its overhead. A runtime class's overhead (a Kata VM's 250m) runs on the
    node's shared CPUs, as the kubelet's CPU manager gives exclusive CPUs by container
    requests, never by the pod's overhead; so an LSR sandbox asking whole CPUs is bound to
    them. (Koordinator counts the overhead in and refuses such a pod: "the requested CPUs
    must be integer".)"""
    if qos not in BOUND_QOS and RESOURCE_SPEC not in pod.annotations:
        return None  # not bound, and no spec to check
    requests, overhead = pod.requests, pod.overhead
    return cpu_request(qos, requests.get("cpu", 0) - overhead.get("cpu", 0), pod.annotations,
                       requests.get("memory", 0) - overhead.get("memory", 0))


def cells_of(numa: Sequence[object]) -> list[Cell]:
    out = []
    for cell in numa:
        cpus = tuple(getattr(cell, "cpus", ()))
        cores = tuple(getattr(cell, "cores", ())) or cpus
        out.append(Cell(int(getattr(cell, "id", 0)), cpus, cores, int(getattr(cell, "memory", 0) or 0)))
    return out


def _take(req: CpuRequest, cell: Cell, used: set[int], want: int) -> list[int] | None:
    """`want` CPUs of one cell by the bind policy, or None."""
    by_core: dict[int, list[int]] = {}
    for cpu, core in zip(cell.cpus, cell.cores, strict=True):
        by_core.setdefault(core, []).append(cpu)
    if req.policy == FULL_PCPUS:
        picked: list[int] = []
        for core in sorted(by_core):
            threads = by_core[core]
            if all(t not in used for t in threads) and len(picked) + len(threads) <= want:
                picked += threads
            if len(picked) == want:
                return picked
        return None
    free_by_core = [[t for t in by_core[c] if t not in used] for c in sorted(by_core)]
    picked = []
    for depth in range(max((len(t) for t in free_by_core), default=0)):
        for threads in free_by_core:
            if depth < len(threads):
                picked.append(threads[depth])
                if len(picked) == want:
                    return picked
    return None


def choose(req: CpuRequest, cells: Sequence[Cell], used: set[int], numa_policy: str,
           memory_used: Mapping[int, int] | None = None) -> list[CpuSet] | None:
    """The CPUs (and, where cells state memory, the memory per cell) the request takes on one
    node, or None when it does not fit there. `memory_used`: bytes bound per cell."""
    free = {c.id: sum(1 for cpu in c.cpus if cpu not in used) for c in cells}
    checked = req.memory > 0 and all(c.memory > 0 for c in cells)
    mem_free = {c.id: c.memory - (memory_used or {}).get(c.id, 0) for c in cells} if checked else {}
    one = sorted((free[c.id], c.id, c) for c in cells
                 if free[c.id] >= req.cpus and (not checked or mem_free[c.id] >= req.memory))
    for _, _, cell in one:  # one cell when one has room: the fullest that fits
        picked = _take(req, cell, used, req.cpus)
        if picked is not None:
            return [CpuSet(cell.id, tuple(picked), req.memory if checked else 0)]
    if numa_policy == "SingleNUMANode":
        return None
    ordered = sorted(cells, key=lambda c: (-free[c.id], c.id))
    needed, total, memory = 0, 0, 0
    for c in ordered:  # the fewest cells that could hold it
        needed, total, memory = needed + 1, total + free[c.id], memory + mem_free.get(c.id, 0)
        if total >= req.cpus and (not checked or memory >= req.memory):
            break
    if total < req.cpus or (checked and memory < req.memory):
        return None
    out: list[CpuSet] = []
    left, mem_left = req.cpus, req.memory if checked else 0
    for c in ordered[:needed] if numa_policy == "Restricted" else ordered:
        if not left and not mem_left:
            break
        picked = _take(req, c, used, min(left, free[c.id])) if left else []
        mem = min(mem_left, max(mem_free.get(c.id, 0), 0))
        if picked or mem:
            out.append(CpuSet(c.id, tuple(picked or ()), mem))
            left -= len(picked or ())
            mem_left -= mem
    return out if not left and not mem_left else None


def decode(devices: Sequence[str]) -> list[CpuSet]:
    out = []
    for item in devices:
        parts = item.split("/")
        if len(parts) in (3, 4) and parts[0] == "cpuset":
            out.append(CpuSet(int(parts[1]), tuple(int(c) for c in parts[2].split(",") if c),
                              int(parts[3]) if len(parts) == 4 else 0))
    return out


def _ranges(cpus: Sequence[int]) -> str:
    out, ordered = [], sorted(cpus)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def annotation(sets: Sequence[CpuSet]) -> str:
    """`scheduling.koordinator.sh/resource-status`, as Koordinator writes it."""
    def resources(s: CpuSet) -> dict[str, str]:
        out = {"cpu": str(len(s.cpus))}
        if s.memory:
            out["memory"] = str(s.memory)
        return out

    return json.dumps({"cpuset": _ranges([c for s in sets for c in s.cpus]),
                       "numaNodeResources": [{"node": s.cell, "resources": resources(s)} for s in sets]},
                      separators=(",", ":"))
