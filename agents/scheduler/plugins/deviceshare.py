"""DeviceShare (PreFilter, Filter, Reserve / Unreserve): GPUs by device, Koordinator's model.

PreFilter parses the pod's GPU and RDMA request (`agents.state.devices`); a request that
cannot be valid (a share of 150 of one GPU, whole-GPU core and ratio that disagree, RDMA
without GPUs) rejects the pod as unresolvable with the field and value; a pod asking for more
`koordinator.sh/gpu-memory` per GPU than any GPU of the cluster has is unschedulable with the
field and value (it waits for such a node); a pod without devices skips the plugin.
Filter: a node passes when enough of its GPUs each have the free core and memory-ratio the
request needs per GPU (`koordinator.sh/gpu-memory` is turned into that GPU's ratio), not
counting the GPUs that nominations of other pods with equal or higher priority name (a
preemptor is promised concrete GPUs).
Reserve picks the concrete GPUs (`devices.choose`: shares packed onto the fullest GPU that
fits, unless a score plugin left a preferred GPU for the node under `PREFERRED` (FGD) and the
share fits there; whole GPUs in minor order) and RDMA virtual functions (NICs in minor order), assumes them in the shared state under the claim's hold id
(so every profile sees them at once) and leaves them in the cycle for DefaultBinder, which
puts them on the Claim; the owner checks them again, device by device, when it holds the
claim. Unreserve gives them back (idempotent).

Totals (`koordinator.sh/gpu-core`, `-memory-ratio`, `nvidia.com/gpu`) are NodeResourcesFit's
business: the scheduler adds them to every GPU request, so nominations and preemption work on
them too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import numpy.typing as npt

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
from agents.state import devices
from schemas.records import Nomination, hold_id

NAME = "DeviceShare"
REASON = "Insufficient gpu devices"


PREFERRED = NAME + "/preferred"  # cycle key: {row: GPU minor} a score plugin prefers for a share
PROMISED = NAME + "/promised"  # cycle key: (core, ratio) per GPU that others' nominations name
PROMISED_VFS = NAME + "/promised-vfs"  # cycle key: {row: {NIC minor: VFs}} others' nominations name

DeviceAsk = tuple[devices.GpuRequest | None, int]  # GPUs, RDMA virtual functions


def promised_vfs(nominated: Sequence[tuple[int, Nomination]]) -> dict[int, dict[int, int]]:
    """Per row, the RDMA virtual functions per NIC that the given nominations name."""
    out: dict[int, dict[int, int]] = {}
    for row, nomination in nominated:
        for n in devices.decode_rdma(nomination.devices):
            per_nic = out.setdefault(row, {})
            per_nic[n.minor] = per_nic.get(n.minor, 0) + n.vfs
    return out


def ratio_needed(req: devices.GpuRequest, memory: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """`devices.ratio_needed` over GPUs (memory in bytes per GPU; > 100 where it cannot fit)."""
    if not req.memory:
        return np.full(memory.shape, req.ratio, dtype=np.int64)
    need = np.where(memory > 0, -(-req.memory * devices.WHOLE // np.maximum(memory, 1)), devices.WHOLE + 1)
    out: npt.NDArray[np.int64] = np.maximum(need, req.ratio)
    return out


class DeviceShare(ParsedPlugin):
    NAME: ClassVar[str] = NAME
    DYNAMIC: ClassVar[bool] = True
    EVENTS: ClassVar[ClusterEvent] = ClusterEvent.ANY

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def parse(self, pod: PodInfo) -> DeviceAsk | None:
        """What the pod asks of devices: GPUs and RDMA virtual functions (None: nothing). A
        reservation holds GPUs by totals only, so the pods it is for may take any GPU."""
        requests = pod.pod.requests
        if reservation.DERIVED in pod.derived or devices.DEVICE_RESOURCES.isdisjoint(requests):
            return None
        gpu, vfs = devices.gpu_request(requests), devices.rdma_request(requests)
        return (gpu, vfs) if gpu is not None or vfs else None

    def pre_filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Status:
        st = super().pre_filter(cycle, pod, state)
        gpu: devices.GpuRequest | None = cycle.read(NAME)[0] if st.ok else None
        if st.ok:  # GPUs and VFs promised to others of equal or higher priority are theirs
            nominated = state.nominator.devices_for(pod.priority, pod.uid)
            cycle.write(PROMISED, state.gpus.promised(nominated) if nominated and gpu is not None else None)
            cycle.write(PROMISED_VFS, promised_vfs(nominated))
        if gpu is not None and gpu.memory:
            present = state.gpus.minor[: state.size] >= 0
            largest = int(state.gpus.memory[: state.size][present].max()) if present.any() else 0
            if gpu.memory > largest:  # no node can take it: say which field, not only "Insufficient"
                return status.unschedulable(NAME, f"requests.{devices.GPU_MEMORY}={gpu.memory}: more memory per "
                                                  f"GPU than any GPU in the cluster has (largest: {largest} bytes)")
        return st

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Mask:
        req: devices.GpuRequest | None = cycle.read(NAME)[0]
        n = state.size
        if req is None:  # RDMA only comes with GPUs; its totals are NodeResourcesFit's
            every: Mask = np.ones(n, dtype=bool)[rows]
            return every
        table = state.gpus
        core, ratio = table.free_core()[:n][rows], table.free_ratio()[:n][rows]
        promised = cycle.read(PROMISED)
        if promised is not None:
            core, ratio = core - promised[0][:n][rows], ratio - promised[1][:n][rows]
        present = table.minor[:n][rows] >= 0
        fits = present & (core >= req.core) & (ratio >= ratio_needed(req, table.memory[:n][rows]))
        count = fits[:, 0].astype(np.int64) if fits.shape[1] else np.zeros(len(fits), dtype=np.int64)
        for col in range(1, fits.shape[1]):
            count += fits[:, col]
        enough: Mask = count >= req.count
        return enough

    def explain(self, cycle: CycleState, pod: PodInfo, state: ClusterState, failed: Mask) -> dict[str, int]:
        return {REASON: int(failed.sum())}

    def fit_steps(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int, limit: int) -> int:
        req: devices.GpuRequest | None = cycle.read(NAME)[0]
        if req is None:
            return limit
        minors, core, ratio, memory = self._free_row(cycle, state, row)
        placed = 0
        while placed < limit:
            chosen = devices.choose(req, minors, core, ratio, memory)
            if chosen is None:
                break
            for a in chosen:
                i = minors.index(a.minor)
                core[i] -= a.core
                ratio[i] -= a.ratio
            placed += 1
        return placed

    def reserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> Status:
        ask: DeviceAsk | None = cycle.read(NAME)
        cycle.allocate(NAME, ())
        if ask is None:
            return status.SUCCESS
        gpu, vfs = ask
        chosen = self._choose(cycle, pod, gpu, state, row) if gpu is not None else []
        nics = devices.choose_vfs(vfs, *self._free_vfs(cycle, state, row)) if vfs else []
        if chosen is None or nics is None:
            return status.unschedulable(NAME, REASON if chosen is None else "Insufficient rdma virtual functions")
        hid = hold_id(pod.uid, pod.attempt, state.names[row])
        state.gpus.assume(hid, row, chosen)
        state.nics.assume(hid, row, nics)
        cycle.allocate(NAME, tuple(a.encode() for a in chosen) + tuple(n.encode() for n in nics))
        return status.SUCCESS

    @staticmethod
    def _choose(cycle: CycleState, pod: PodInfo, req: devices.GpuRequest, state: ClusterState, row: int
                ) -> list[devices.GpuAllocation] | None:
        """The GPUs for the request: those its own nomination on the node promised, when they
        fit; else a share on the GPU a score plugin prefers when it fits there (FGD); else
        `devices.choose`."""
        minors, core, ratio, memory = DeviceShare._free_row(cycle, state, row)
        own = state.nominator.of(pod.uid) if pod.uid in state.nominator.nominated_uids() else None
        wanted: list[int] = []
        if own is not None and own.node == state.names[row]:
            wanted = [a.minor for a in devices.decode(own.devices)]
        elif req.count == 1 and req.shared and (cycle.read(PREFERRED) or {}).get(row) is not None:
            wanted = [cycle.read(PREFERRED)[row]]
        picked = [minors.index(m) for m in wanted if m in minors]
        if picked:
            on_them = devices.choose(req, [minors[i] for i in picked], [core[i] for i in picked],
                                     [ratio[i] for i in picked], [memory[i] for i in picked])
            if on_them is not None:
                return on_them
        return devices.choose(req, minors, core, ratio, memory)

    @staticmethod
    def _free_vfs(cycle: CycleState, state: ClusterState, row: int) -> tuple[list[int], list[int]]:
        """`NicTable.free_row` less the virtual functions promised to others."""
        minors, free = state.nics.free_row(row)
        promised = (cycle.read(PROMISED_VFS) or {}).get(row)
        if promised:
            free = [f - promised.get(m, 0) for m, f in zip(minors, free, strict=True)]
        return minors, free

    @staticmethod
    def _free_row(cycle: CycleState, state: ClusterState, row: int) -> tuple[list[int], list[int], list[int], list[int]]:
        """`GpuTable.free_row` less the GPUs promised to others (see `pre_filter`)."""
        minors, core, ratio, memory = state.gpus.free_row(row)
        promised = cycle.read(PROMISED)
        if promised is not None:
            present = state.gpus.minor[row] >= 0
            core = [c - p for c, p in zip(core, promised[0][row][present].tolist(), strict=True)]
            ratio = [r - p for r, p in zip(ratio, promised[1][row][present].tolist(), strict=True)]
        return minors, core, ratio, memory

    def unreserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> None:
        hid = hold_id(pod.uid, pod.attempt, state.names[row])
        state.gpus.forget(hid)
        state.nics.forget(hid)
