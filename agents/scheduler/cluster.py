"""The cluster state a worker schedules against: one per worker, shared by every profile.

Structure of arrays over nodes (a fixed row per node name, a fixed column per resource name):
`allocatable`, `used` (committed + held, as the node's owner last published it) and `assumed`
(claims this worker sent and has not yet seen decided: assume / forget, like kube-scheduler's
cache); `requested` (used + assumed) and `free` (allocatable - requested) are kept current
row by row, so every profile sees a placement the moment it is assumed. GPUs, device by
device, live in `gpus` (`GpuTable`) with the same assume / forget by hold id. Beside the arrays: each node's record (labels, taints, devices), the pods bound on it
(priority and request, for preemption), and the nominator.

Fed by every partition of `state-changes` (no consumer group), applied in arrival order: a
replacement owner may restore a table that lags what its predecessor published and repeat
sequence numbers, and its reports are still the truth from then on.

Assumption states: assumed (`assume`) -> forgotten when the owner reports the hold id in any
state (held, committed, released, rejected), when the pod comes back on `requeue`, or on
`forget`. Both are idempotent, so Reserve / Unreserve can call them freely.

Derived views (`label_column`, `taint_groups`) are cached and rebuilt when a node record
changes; filters read them instead of looping over nodes.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Flag, auto

import numpy as np
import numpy.typing as npt

from agents.scheduler.nominator import Nominator
from agents.scheduler.reservation_table import ReservationTable
from agents.state import cpus, devices, gangs
from agents.state import usage as keys
from agents.state.resources import ResourceSpace, Vector
from schemas.records import (
    BoundPod,
    GangHold,
    GpuDevice,
    HoldId,
    HoldStatus,
    Node,
    NodeStateChange,
    Nomination,
    RdmaDevice,
    Taint,
    replace,
)

_FREEING = frozenset({HoldStatus.RELEASED, HoldStatus.REJECTED, HoldStatus.TERMINATED})


class ClusterEvent(Flag):
    """What changed, for the queue to decide which unschedulable pods to retry."""

    NONE = 0
    NODE_ADDED = auto()  # a new node, or one that became schedulable
    NODE_CHANGED = auto()  # labels, taints, allocatable or schedulability changed
    CAPACITY_FREED = auto()  # a hold released or rejected, a pod terminated, a nomination gone
    ANY = NODE_ADDED | NODE_CHANGED | CAPACITY_FREED


class GpuTable:
    """Every node's GPUs as arrays `[nodes x GPUs]` (columns in the order of the node's record;
    minor -1 where a node has fewer): capacity of core and memory-ratio, memory, what the
    owners report used, and what this worker assumes (claims out, per hold id)."""

    def __init__(self, rows: int, width: int = 8) -> None:
        self.minor = np.full((rows, width), -1, dtype=np.int64)
        self.core_cap = np.zeros((rows, width), dtype=np.int64)
        self.ratio_cap = np.zeros((rows, width), dtype=np.int64)
        self.memory = np.zeros((rows, width), dtype=np.int64)
        self.core_used = np.zeros((rows, width), dtype=np.int64)
        self.ratio_used = np.zeros((rows, width), dtype=np.int64)
        self.core_assumed = np.zeros((rows, width), dtype=np.int64)
        self.ratio_assumed = np.zeros((rows, width), dtype=np.int64)
        self._columns: dict[int, dict[int, int]] = {}  # row -> minor -> column
        self._assumed: dict[str, tuple[int, list[tuple[int, int, int]]]] = {}  # hold id -> (row, [(col, core, ratio)])

    _ARRAYS = ("minor", "core_cap", "ratio_cap", "memory", "core_used", "ratio_used", "core_assumed", "ratio_assumed")

    def grow_rows(self, rows: int) -> None:
        for name in self._ARRAYS:
            a = getattr(self, name)
            pad = np.full((rows - a.shape[0], a.shape[1]), -1 if name == "minor" else 0, dtype=np.int64)
            setattr(self, name, np.concatenate([a, pad]))

    def _grow_columns(self, width: int) -> None:
        for name in self._ARRAYS:
            a = getattr(self, name)
            pad = np.full((a.shape[0], width - a.shape[1]), -1 if name == "minor" else 0, dtype=np.int64)
            setattr(self, name, np.concatenate([a, pad], axis=1))

    def set_node(self, row: int, gpus: Sequence[GpuDevice]) -> None:
        if len(gpus) > self.minor.shape[1]:
            self._grow_columns(len(gpus))
        for name in ("core_cap", "ratio_cap", "memory"):
            getattr(self, name)[row] = 0
        self.minor[row] = -1
        self._columns[row] = {}
        for col, gpu in enumerate(gpus):
            self.minor[row, col] = gpu.minor
            self.core_cap[row, col], self.ratio_cap[row, col] = gpu.core, gpu.memory_ratio
            self.memory[row, col] = gpu.memory
            self._columns[row][gpu.minor] = col

    def report(self, row: int, usage: Mapping[str, int]) -> bool:
        """The owner's per-GPU usage; True when some GPU got room back."""
        core, ratio = np.zeros_like(self.core_used[row]), np.zeros_like(self.ratio_used[row])
        columns = self._columns.get(row, {})
        for key, amount in usage.items():
            kind, minor, what = keys.parse(key)
            col = columns.get(minor)
            if kind == "gpu" and col is not None:
                (core if what == "core" else ratio)[col] = amount
        freed = bool((core < self.core_used[row]).any() or (ratio < self.ratio_used[row]).any())
        self.core_used[row], self.ratio_used[row] = core, ratio
        return freed

    def add_used(self, row: int, allocations: Sequence[devices.GpuAllocation]) -> None:
        for a in allocations:
            col = self._columns.get(row, {})[a.minor]
            self.core_used[row, col] += a.core
            self.ratio_used[row, col] += a.ratio

    def assume(self, hold_id: str, row: int, allocations: Sequence[devices.GpuAllocation]) -> None:
        if hold_id in self._assumed or not allocations:
            return
        columns = self._columns.get(row, {})
        taken = [(columns[a.minor], a.core, a.ratio) for a in allocations]
        for col, core, ratio in taken:
            self.core_assumed[row, col] += core
            self.ratio_assumed[row, col] += ratio
        self._assumed[hold_id] = (row, taken)

    def forget(self, hold_id: str) -> None:
        assumed = self._assumed.pop(hold_id, None)
        if assumed is not None:
            row, taken = assumed
            for col, core, ratio in taken:
                self.core_assumed[row, col] -= core
                self.ratio_assumed[row, col] -= ratio

    def promised(self, nominated: Sequence[tuple[int, Nomination]]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Core and memory-ratio per GPU (rows x columns) that the given nominations name."""
        core, ratio = np.zeros_like(self.core_cap), np.zeros_like(self.ratio_cap)
        for row, nomination in nominated:
            columns = self._columns.get(row, {})
            for a in devices.decode(nomination.devices):
                col = columns.get(a.minor)
                if col is not None:
                    core[row, col] += a.core
                    ratio[row, col] += a.ratio
        return core, ratio

    def free_row(self, row: int) -> tuple[list[int], list[int], list[int], list[int]]:
        """One node's GPUs: minors, free core, free memory-ratio, memory (Python lists)."""
        present = self.minor[row] >= 0
        core = self.core_cap[row] - self.core_used[row] - self.core_assumed[row]
        ratio = self.ratio_cap[row] - self.ratio_used[row] - self.ratio_assumed[row]
        return (self.minor[row][present].tolist(), core[present].tolist(), ratio[present].tolist(),
                self.memory[row][present].tolist())

    def free_core(self) -> npt.NDArray[np.int64]:
        out: npt.NDArray[np.int64] = self.core_cap - self.core_used - self.core_assumed
        return out

    def free_ratio(self) -> npt.NDArray[np.int64]:
        out: npt.NDArray[np.int64] = self.ratio_cap - self.ratio_used - self.ratio_assumed
        return out


class NicTable:
    """Every node's RDMA NICs: virtual functions per NIC, used (as the owners report) and
    assumed here (per hold id). Few NICs per node: plain dicts."""

    def __init__(self) -> None:
        self.capacity: dict[int, dict[int, int]] = {}  # row -> minor -> VFs
        self.used: dict[int, dict[int, int]] = {}
        self.assumed: dict[int, dict[int, int]] = {}
        self._assumed: dict[str, tuple[int, list[devices.RdmaAllocation]]] = {}

    def set_node(self, row: int, nics: Sequence[RdmaDevice]) -> None:
        self.capacity[row] = {n.minor: n.vfs for n in nics}

    def report(self, row: int, usage: Mapping[str, int]) -> bool:
        used = keys.by_index(usage, "rdma")
        before = self.used.get(row, {})
        self.used[row] = used
        return any(used.get(minor, 0) < amount for minor, amount in before.items())

    def assume(self, hold_id: str, row: int, allocations: Sequence[devices.RdmaAllocation]) -> None:
        if hold_id in self._assumed or not allocations:
            return
        mine = self.assumed.setdefault(row, {})
        for a in allocations:
            mine[a.minor] = mine.get(a.minor, 0) + a.vfs
        self._assumed[hold_id] = (row, list(allocations))

    def forget(self, hold_id: str) -> None:
        assumed = self._assumed.pop(hold_id, None)
        if assumed is not None:
            row, allocations = assumed
            for a in allocations:
                self.assumed[row][a.minor] -= a.vfs

    def free_row(self, row: int) -> tuple[list[int], list[int]]:
        """One node's NICs in minor order and their free virtual functions."""
        capacity, used, assumed = self.capacity.get(row, {}), self.used.get(row, {}), self.assumed.get(row, {})
        minors = sorted(capacity)
        return minors, [capacity[m] - used.get(m, 0) - assumed.get(m, 0) for m in minors]


class CpuTable:
    """Every node's NUMA cells and the CPUs bound on it: the owners' report and this worker's
    assumptions (per hold id). Vectors of free CPUs per node (total and in its fullest-free
    cell) let filters prune before the exact choice (`agents.state.cpus.choose`)."""

    def __init__(self) -> None:
        self.cells: dict[int, list[cpus.Cell]] = {}
        self.policy: dict[int, str] = {}
        self.used: dict[int, set[int]] = {}  # row -> CPUs the owner reports bound
        self.memory: dict[int, dict[int, int]] = {}  # row -> cell -> memory the owner reports bound
        self._assumed: dict[str, tuple[int, set[int], dict[int, int]]] = {}
        self._assumed_rows: dict[int, set[int]] = {}
        self._assumed_memory: dict[int, dict[int, int]] = {}
        # Per row, a counter bumped whenever its CPUs or cells change; and the rows with cells.
        self.changes: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._rows: npt.NDArray[np.intp] | None = np.zeros(0, dtype=np.intp)  # None: made again when read
        # Filter answers by request: per row, the answer and the row's counter when computed,
        # so the exact choice runs again only on rows that changed since (one per placement).
        self.fit_cache: dict[Hashable, tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]] = {}

    def _changed(self, row: int) -> None:
        if row >= len(self.changes):
            self.changes = np.concatenate([self.changes, np.zeros(max(row + 1, 2 * len(self.changes)) - len(self.changes),
                                                                  dtype=np.int64)])
        self.changes[row] += 1

    def cached_fits(self, request: Hashable, size: int) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
        """The cached answers for `request` over `size` rows, and the counters they were computed at
        (-1: never); grown with the cluster, dropped all at once when many requests pile up."""
        if len(self.fit_cache) > 64:
            self.fit_cache.clear()
        fits, seen = self.fit_cache.get(request, (np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64)))
        if len(fits) < size:
            fits = np.concatenate([fits, np.zeros(size - len(fits), dtype=bool)])
            seen = np.concatenate([seen, np.full(size - len(seen), -1, dtype=np.int64)])
            self.fit_cache[request] = (fits, seen)
        return fits, seen

    def counters(self, size: int) -> npt.NDArray[np.int64]:
        if len(self.changes) < size:
            self._changed(size - 1)
        return self.changes[:size]

    @property
    def rows(self) -> npt.NDArray[np.intp]:
        """The rows whose node has NUMA cells, in order (made again only after a node gained or
        lost its cells: registering N nodes one by one must not cost N sorts of N rows)."""
        if self._rows is None:
            self._rows = np.array(sorted(r for r, c in self.cells.items() if c), dtype=np.intp)
        return self._rows

    def set_node(self, row: int, node: Node) -> None:
        cells = cpus.cells_of(node.numa)
        if bool(cells) != bool(self.cells.get(row)):
            self._rows = None
        self.cells[row] = cells
        self.policy[row] = node.labels.get(cpus.NUMA_POLICY_LABEL, "None")
        self._changed(row)

    def report(self, row: int, usage: Mapping[str, int]) -> bool:
        used = {cpu for cpu, bound in keys.by_index(usage, "cpu").items() if bound}
        memory = keys.by_index(usage, "numa")
        before, before_memory = self.used.get(row, set()), self.memory.get(row, {})
        if used != before or memory != before_memory:
            self._changed(row)
        self.used[row] = used
        self.memory[row] = memory
        return bool(before - used) or any(memory.get(c, 0) < m for c, m in before_memory.items())

    def bound(self, row: int) -> set[int]:
        return self.used.get(row, set()) | self._assumed_rows.get(row, set())

    def memory_bound(self, row: int) -> dict[int, int]:
        """Memory bound per cell of the node: reported plus assumed."""
        out = dict(self.memory.get(row, {}))
        for cell, amount in self._assumed_memory.get(row, {}).items():
            out[cell] = out.get(cell, 0) + amount
        return out

    def assume(self, hold_id: str, row: int, sets: Sequence[cpus.CpuSet]) -> None:
        taken = {c for s in sets for c in s.cpus}
        if hold_id in self._assumed or not taken:
            return
        memory = {s.cell: s.memory for s in sets if s.memory}
        self._assumed[hold_id] = (row, taken, memory)
        self._changed(row)
        self._assumed_rows.setdefault(row, set()).update(taken)
        mine = self._assumed_memory.setdefault(row, {})
        for cell, amount in memory.items():
            mine[cell] = mine.get(cell, 0) + amount

    def forget(self, hold_id: str) -> None:
        assumed = self._assumed.pop(hold_id, None)
        if assumed is not None:
            row, taken, memory = assumed
            self._changed(row)
            self._assumed_rows[row] -= taken
            for cell, amount in memory.items():
                self._assumed_memory[row][cell] -= amount


@dataclass(frozen=True, slots=True)
class LabelColumn:
    codes: npt.NDArray[np.intp]  # per row: the value's code, -1 where the node lacks the label
    vocabulary: dict[str, int]  # value -> code

    def matches(self, values: Iterable[str]) -> npt.NDArray[np.bool_]:
        wanted = [self.vocabulary[v] for v in values if v in self.vocabulary]
        return np.isin(self.codes, wanted) if wanted else np.zeros(self.codes.shape, dtype=bool)


@dataclass(frozen=True, slots=True)
class PodOnNode:
    row: int
    vector: Vector
    pod: BoundPod


@dataclass(frozen=True, slots=True)
class BoundArrays:
    """Every bound pod as columns, index `i` of each being `pods[i]`: a copy of `BoundColumns`
    as they were when asked for (the same object until they change)."""

    pods: list[PodOnNode]
    rows: npt.NDArray[np.intp]
    priorities: npt.NDArray[np.int64]
    vectors: npt.NDArray[np.int64]
    quotas: npt.NDArray[np.object_]
    sandboxes: npt.NDArray[np.bool_]  # the sandboxes among them (`BoundPod.sandbox`)
    pools: npt.NDArray[np.object_]  # each one's warm pool ("" for none)


class BoundColumns(Mapping[str, PodOnNode]):
    """Every bound pod by uid (where it runs), and their rows, priorities, requests, quotas, sandbox flags and warm pools as
    numpy columns, kept as pods are bound and leave: a pod has a slot, and a leaving pod's slot
    takes the last pod's, so the first `len(pods)` entries are always every bound pod. Reading
    them after a change costs a copy of each (`arrays`), where rebuilding them after each report
    was a pass in Python over every bound pod, each time preemption looked (about a third of a
    mixed workload's cycle). The order of the pods is not the order they came in: no reader
    depends on it."""

    def __init__(self, width: int, capacity: int = 1024) -> None:
        self.pods: list[PodOnNode] = []
        self.slot: dict[str, int] = {}  # uid -> its index
        self.rows = np.zeros(capacity, dtype=np.intp)
        self.priorities = np.zeros(capacity, dtype=np.int64)
        self.vectors = np.zeros((capacity, width), dtype=np.int64)
        self.quotas = np.full(capacity, None, dtype=object)
        self.sandboxes = np.zeros(capacity, dtype=bool)
        self.pools = np.full(capacity, None, dtype=object)
        self._arrays: BoundArrays | None = None  # the copy last given, until a change

    _COLUMNS = ("rows", "priorities", "vectors", "quotas", "sandboxes", "pools")

    def __getitem__(self, uid: str) -> PodOnNode:
        return self.pods[self.slot[uid]]

    def get(self, uid: str, default: PodOnNode | None = None) -> PodOnNode | None:  # type: ignore[override]
        i = self.slot.get(uid)  # (Mapping's `get` goes through a raised KeyError)
        return default if i is None else self.pods[i]

    def __contains__(self, uid: object) -> bool:
        return uid in self.slot

    def __iter__(self) -> Iterator[str]:
        return iter(self.slot)

    def __len__(self) -> int:
        return len(self.pods)

    def put(self, placed: PodOnNode) -> None:
        """Bind a pod, or replace what is known of one bound already (in its slot)."""
        self._arrays = None
        uid = placed.pod.uid
        i = self.slot.get(uid)
        if i is None:
            i = len(self.pods)
            if i == self.rows.shape[0]:
                for name in self._COLUMNS:
                    column = getattr(self, name)
                    setattr(self, name, np.concatenate([column, np.zeros_like(column)]))
            self.pods.append(placed)
            self.slot[uid] = i
        else:
            self.pods[i] = placed
        pod = placed.pod
        self.rows[i] = placed.row
        self.priorities[i] = pod.priority
        self.vectors[i] = placed.vector
        self.quotas[i] = pod.quota
        self.sandboxes[i] = pod.sandbox
        self.pools[i] = pod.warm_pool

    def remove(self, uid: str) -> None:
        i = self.slot.pop(uid, None)
        if i is None:
            return
        self._arrays = None
        last = len(self.pods) - 1
        if i != last:
            moved = self.pods[i] = self.pods[last]
            self.slot[moved.pod.uid] = i
            for name in self._COLUMNS:
                column = getattr(self, name)
                column[i] = column[last]
        self.pods.pop()
        self.quotas[last] = self.pools[last] = None  # no reference kept to what left

    def arrays(self) -> BoundArrays:
        if self._arrays is None:
            n = len(self.pods)
            self._arrays = BoundArrays(pods=list(self.pods), rows=self.rows[:n].copy(),
                                       priorities=self.priorities[:n].copy(), vectors=self.vectors[:n].copy(),
                                       quotas=self.quotas[:n].copy(), sandboxes=self.sandboxes[:n].copy(),
                                       pools=self.pools[:n].copy())
        return self._arrays


class ClusterState:
    def __init__(self, space: ResourceSpace, capacity: int = 1024) -> None:
        self.space = space
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        width = len(space)
        self.allocatable = np.zeros((capacity, width), dtype=np.int64)
        self.used = np.zeros((capacity, width), dtype=np.int64)
        self._requested = np.zeros((capacity, width), dtype=np.int64)
        self._free = np.zeros((capacity, width), dtype=np.int64)
        self.present = np.zeros(capacity, dtype=bool)  # known to its owner and not deleted
        self.unschedulable = np.zeros(capacity, dtype=bool)  # cordoned (spec.unschedulable)
        self.assumptions: dict[str, tuple[int, Vector]] = {}
        self.records: dict[int, Node] = {}
        self.bound = BoundColumns(width)  # uid -> where it runs, and the bound pods' columns
        self.nominator = Nominator(space, self.index)
        self._usage_seen: dict[int, dict[str, int]] = {}  # per row: the device use last reported
        self._allocatable_seen: dict[int, Mapping[str, int]] = {}  # per row: the allocatable last reported
        self.gpus = GpuTable(capacity)
        self.nics = NicTable()
        self.cpus = CpuTable()
        self.reservations = ReservationTable(space)
        self.gang_holds: dict[int, tuple[GangHold, ...]] = {}  # row -> gang claims held, not accepted
        # Elastic quotas: what bound pods and claims not yet committed use, per quota name.
        self.quota_used: dict[str, Vector] = {}
        self._quota_claims: dict[str, tuple[str, Vector]] = {}  # hold id -> (quota, request)
        self._labels: dict[str, LabelColumn] = {}
        self._taints: tuple[npt.NDArray[np.intp], list[tuple[Taint, ...]]] | None = None
        self.version = 0  # grows whenever a node record changes

    @property
    def size(self) -> int:
        return len(self.names)

    def _row(self, node: str) -> int:
        row = self.index.get(node)
        if row is None:
            row = len(self.names)
            if row == self.allocatable.shape[0]:
                self._grow()
            self.names.append(node)
            self.index[node] = row
            self._node_records_changed()
        return row

    def _grow(self) -> None:
        def doubled(a: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
            return np.concatenate([a, np.zeros_like(a)])

        self.allocatable = doubled(self.allocatable)  # type: ignore[assignment]
        self.used = doubled(self.used)  # type: ignore[assignment]
        self._requested = doubled(self._requested)  # type: ignore[assignment]
        self._free = doubled(self._free)  # type: ignore[assignment]
        self.present = doubled(self.present)  # type: ignore[assignment]
        self.gpus.grow_rows(self.allocatable.shape[0])
        self.unschedulable = doubled(self.unschedulable)  # type: ignore[assignment]

    def _node_records_changed(self) -> None:
        self._labels.clear()
        self._taints = None
        self.version += 1

    # -- feeding ------------------------------------------------------------------------------

    def apply(self, change: NodeStateChange) -> ClusterEvent:
        """Apply one owner report; returns the cluster events it amounts to."""
        row = self._row(change.node)
        event = ClusterEvent.NONE
        was = bool(self.present[row]) and not bool(self.unschedulable[row])
        if change.allocatable != self._allocatable_seen.get(row):  # most reports repeat it
            before = self.allocatable[row].copy()
            self.allocatable[row] = self.space.allocatable(change.allocatable)
            self._allocatable_seen[row] = dict(change.allocatable)  # a copy: the record's map is not ours
            if bool((self.allocatable[row] > before).any()):
                event |= ClusterEvent.NODE_CHANGED
        self._set_used(row, self.space.known(change.used))
        self.present[row] = not change.deleted
        self.unschedulable[row] = change.unschedulable
        now = bool(self.present[row]) and not change.unschedulable
        if now and not was:
            event |= ClusterEvent.NODE_ADDED
        if change.node_record is not None and self.records.get(row) != change.node_record:
            self.records[row] = change.node_record
            self.gpus.set_node(row, change.node_record.gpus)
            self.nics.set_node(row, change.node_record.rdma)
            self.cpus.set_node(row, change.node_record)
            self._node_records_changed()
            self._usage_seen.pop(row, None)
            event |= ClusterEvent.NODE_CHANGED
        # Most reports repeat the node's device use (most pods bind no device): the tables
        # would set what they hold, and nothing would be freed.
        if change.device_usage != self._usage_seen.get(row):
            if (self.gpus.report(row, change.device_usage) | self.nics.report(row, change.device_usage)
                    | self.cpus.report(row, change.device_usage)):
                event |= ClusterEvent.CAPACITY_FREED
            self._usage_seen[row] = change.device_usage
        if change.gang_holds:
            self.gang_holds[row] = change.gang_holds
        else:
            self.gang_holds.pop(row, None)
        if self.reservations.report(row, change.reservations):
            event |= ClusterEvent.CAPACITY_FREED
        before_noms = len(self.nominator)
        self.nominator.report(row, change.nominations)
        if len(self.nominator) < before_noms:
            event |= ClusterEvent.CAPACITY_FREED
        for pod in change.committed:  # requests as claimed: GPU totals included already
            newly = PodOnNode(row, self.space.pod_request(pod.requests), pod)
            known = self.bound.get(pod.uid)
            if known is not None:  # a report re-sent after a replay: counted once
                self._count_quota(known.pod.quota, -known.vector)
            self.bound.put(newly)
            self._count_quota(pod.quota, newly.vector)
        for hid, status in change.holds.items():
            self.forget(hid)
            if status != HoldStatus.HELD:
                self.forget_quota(hid)  # committed: the bound pod counts now; otherwise: gone
            if status in _FREEING:
                event |= ClusterEvent.CAPACITY_FREED
                if status == HoldStatus.TERMINATED:
                    uid = HoldId.parse(hid).uid
                    placed = self.bound.get(uid)
                    if placed is not None and placed.row == row:
                        self.bound.remove(uid)
                        self._count_quota(placed.pod.quota, -placed.vector)
        return event

    def add_node(self, node: Node) -> int:
        """Library use: a node as its owner would report it, with nothing on it."""
        row = self._row(node.name)
        self.allocatable[row] = self.space.allocatable(devices.node_gpu_totals(node.allocatable, node.gpus, node.rdma))
        self._allocatable_seen.pop(row, None)  # no report's any more
        self._set_used(row, self.used[row].copy())
        self.present[row] = True
        self.unschedulable[row] = node.unschedulable
        self.records[row] = node
        self.gpus.set_node(row, node.gpus)
        self.nics.set_node(row, node.rdma)
        self.cpus.set_node(row, node)
        self._node_records_changed()
        return row

    def add_bound(self, pod: BoundPod, node: str, gpus: Sequence[devices.GpuAllocation] = (),
                  nics: Sequence[devices.RdmaAllocation] = ()) -> None:
        """Library use: a pod already running on `node` (its request, GPU totals included, counts
        as used)."""
        row = self.index[node]
        vector = self.space.pod_request(pod.requests)
        if not pod.devices and (gpus or nics):  # what preemption needs to know which it frees
            pod = replace(pod, devices=tuple(a.encode() for a in gpus) + tuple(n.encode() for n in nics))
        self.gpus.add_used(row, gpus)
        self._usage_seen.pop(row, None)  # the device tables' row is no report's any more
        used = self.nics.used.setdefault(row, {})
        for n in nics:
            used[n.minor] = used.get(n.minor, 0) + n.vfs
        self._set_used(row, self.used[row] + vector)
        self.bound.put(PodOnNode(row, vector, pod))
        self._count_quota(pod.quota, vector)

    # -- assume / forget ----------------------------------------------------------------------

    def assume(self, hold_id: str, row: int, request: Vector) -> None:
        if hold_id in self.assumptions:
            return
        self.assumptions[hold_id] = (row, request)
        self._requested[row] += request
        self._free[row] -= request

    def assume_many(self, hold_ids: list[str], row: int, request: Vector) -> None:
        """`assume` for several claims of the same request on one node."""
        fresh = 0
        for hold_id in hold_ids:
            if hold_id not in self.assumptions:
                self.assumptions[hold_id] = (row, request)
                fresh += 1
        if fresh:
            self._requested[row] += fresh * request
            self._free[row] -= fresh * request

    def assume_reservation(self, hold_id: str, row: int, uid: str, consumed: Vector) -> None:
        """The claim `hold_id` takes `consumed` of reservation `uid`: that part was already
        counted on the node (as the reservation's remainder), so the node gets it back."""
        if self.reservations.assume(hold_id, row, uid, consumed):
            self._requested[row] -= consumed
            self._free[row] += consumed

    def forget(self, hold_id: str) -> None:
        self.gpus.forget(hold_id)
        self.nics.forget(hold_id)
        self.cpus.forget(hold_id)
        gave_back = self.reservations.forget(hold_id)
        if gave_back is not None:
            self._requested[gave_back[0]] += gave_back[1]
            self._free[gave_back[0]] -= gave_back[1]
        assumption = self.assumptions.pop(hold_id, None)
        if assumption is not None:
            row, request = assumption
            self._requested[row] -= request
            self._free[row] += request

    def yieldable(self, rank: gangs.Rank, key: str) -> npt.NDArray[np.int64] | None:
        """Per node, what gangs ranked below `rank` hold without being accepted (their owners
        would ask them to yield it to a claim of gang `key`); None when there is none."""
        out = None
        for row, holds in self.gang_holds.items():
            for h in holds:
                if h.decision_key != key and gangs.rank(h.priority, h.decision_key) > rank:
                    if out is None:
                        out = np.zeros((self.size, len(self.space)), dtype=np.int64)
                    out[row] += self.space.known(h.requests)
        return out

    def _count_quota(self, quota: str, vector: Vector) -> None:
        if quota:
            current = self.quota_used.get(quota)
            self.quota_used[quota] = vector.copy() if current is None else current + vector

    def assume_quota(self, hold_id: str, quota: str, request: Vector) -> None:
        """A claim counts against its quota from Reserve until the owner decides it."""
        if quota and hold_id not in self._quota_claims:
            self._quota_claims[hold_id] = (quota, request)
            self._count_quota(quota, request)

    def forget_quota(self, hold_id: str) -> None:
        claim = self._quota_claims.pop(hold_id, None)
        if claim is not None:
            self._count_quota(claim[0], -claim[1])

    def _set_used(self, row: int, used: Vector) -> None:
        """The owner's figure changed: what this worker assumes on top stays (requested - used
        was the assumed part), free follows."""
        self._requested[row] += used - self.used[row]
        self.used[row] = used
        self._free[row] = self.allocatable[row] - self._requested[row]

    @property
    def assumed(self) -> npt.NDArray[np.int64]:
        """Claimed here, not yet reported by the owners: requested - used."""
        out: npt.NDArray[np.int64] = self._requested[: self.size] - self.used[: self.size]
        return out

    # -- views for the plugins ----------------------------------------------------------------

    @property
    def free(self) -> npt.NDArray[np.int64]:
        """Free capacity per node, allocatable - used - assumed (a read-only view)."""
        return self._free[: self.size]

    @property
    def requested(self) -> npt.NDArray[np.int64]:
        """Requested per node, used + assumed (a read-only view)."""
        return self._requested[: self.size]

    @property
    def allocatable_view(self) -> npt.NDArray[np.int64]:
        return self.allocatable[: self.size]

    def free_row(self, row: int) -> list[int]:
        """One node's free capacity as Python ints (for the one-node paths of the plugins)."""
        out: list[int] = self._free[row].tolist()
        return out

    def requested_row(self, row: int) -> list[int]:
        out: list[int] = self._requested[row].tolist()
        return out

    def allocatable_row(self, row: int) -> list[int]:
        out: list[int] = self.allocatable[row].tolist()
        return out

    def schedulable_rows(self) -> npt.NDArray[np.bool_]:
        """Nodes that exist (cordoning is NodeUnschedulable's business)."""
        return self.present[: self.size]

    def label_column(self, key: str) -> LabelColumn:
        """Every node's value of label `key`, factorized: codes per row (-1: no such label)."""
        column = self._labels.get(key)
        if column is None:
            vocabulary: dict[str, int] = {}
            codes = np.full(self.size, -1, dtype=np.intp)
            for row, node in self.records.items():
                value = node.labels.get(key)
                if value is not None:
                    codes[row] = vocabulary.setdefault(value, len(vocabulary))
            column = self._labels[key] = LabelColumn(codes, vocabulary)
        return column

    def name_column(self) -> LabelColumn:
        """Node names as a label column (for `matchFields` on `metadata.name`)."""
        column = self._labels.get("\0metadata.name")
        if column is None:
            column = LabelColumn(np.arange(self.size, dtype=np.intp), dict(self.index))
            self._labels["\0metadata.name"] = column
        return column

    def taint_groups(self) -> tuple[npt.NDArray[np.intp], list[tuple[Taint, ...]]]:
        """Nodes grouped by their set of taints: (group per row, taints per group).

        Clusters have few distinct taint sets, so filters decide once per group."""
        if self._taints is None:
            groups: dict[tuple[Taint, ...], int] = {(): 0}
            ids = np.zeros(self.size, dtype=np.intp)
            for row, node in self.records.items():
                ids[row] = groups.setdefault(node.taints, len(groups))
            self._taints = (ids, list(groups))
        return self._taints

    def bound_arrays(self) -> BoundArrays:
        """Every bound pod as arrays (row, priority, request vector, ...): `BoundColumns`."""
        return self.bound.arrays()

    @classmethod
    def from_records(cls, space: ResourceSpace, nodes: Iterable[Node],
                     bound: Mapping[str, Iterable[BoundPod]] | None = None) -> ClusterState:
        """Library use: a state from Node records and the pods bound on each (by node name)."""
        state = cls(space)
        for node in nodes:
            state.add_node(node)
        for node_name, pods in (bound or {}).items():
            for pod in pods:
                state.add_bound(pod, node_name)
        return state
