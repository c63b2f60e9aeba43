"""GPUs as devices (Koordinator's DeviceShare model), shared by the scheduler and the owners.

A node's GPUs come from its record (`Node.gpus`: minor, model, memory, and per-GPU capacity
of `koordinator.sh/gpu-core` and `koordinator.sh/gpu-memory-ratio`, 100 each by default). A pod
asks for GPUs in one of these ways (Koordinator's names):

- `nvidia.com/gpu: N`: N whole GPUs (each core 100 and memory-ratio 100).
- `koordinator.sh/gpu-core: C` and/or `koordinator.sh/gpu-memory-ratio: R`: up to 100, a
  share of one GPU; above 100, whole GPUs (C / 100 of them), so multiples of 100 only.
- `koordinator.sh/gpu.shared: S` with the above per GPU: a share of each of S GPUs.
- `koordinator.sh/gpu-memory: M` (bytes, per GPU): the memory-ratio this takes on a GPU of
  that node, rounded up, when larger than the ratio asked.

Totals keep working as vectors (`with_gpu_totals` adds the core and ratio totals to a pod's
request, `node_gpu_totals` to a node's allocatable), so NodeResourcesFit and the owners' totals
see GPUs too; the device-level check (which GPU, how much of it) is `choose`, used by the
scheduler's DeviceShare plugin and, on the claimed minors, by the owners.

RDMA: nodes list their NICs (`Node.rdma`: minor, virtual functions); `koordinator.sh/rdma: N`
asks for N virtual functions, taken from the NICs in minor order. RDMA comes with GPUs (the
NICs serve GPU traffic): a pod asking for RDMA without GPUs is refused.

An allocation travels in `Claim.devices` / `Held.devices` as `gpu/<minor>/<core>/<ratio>` or
`rdma/<minor>/<vfs>` and ends on the Binding as `scheduling.koordinator.sh/device-allocated`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agents.state import cpus
from agents.state import usage as keys
from schemas.errors import FieldError

NVIDIA_GPU = "nvidia.com/gpu"
GPU_CORE = "koordinator.sh/gpu-core"
GPU_RATIO = "koordinator.sh/gpu-memory-ratio"
GPU_MEMORY = "koordinator.sh/gpu-memory"
GPU_SHARED = "koordinator.sh/gpu.shared"
RDMA = "koordinator.sh/rdma"
DEVICE_RESOURCES = frozenset({NVIDIA_GPU, GPU_CORE, GPU_RATIO, GPU_MEMORY, GPU_SHARED, RDMA})  # all a device ask reads
DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
WHOLE = 100


class DeviceError(FieldError):
    """A device request that cannot be valid; names the field and the value."""


@dataclass(frozen=True, slots=True)
class GpuRequest:
    count: int  # GPUs
    core: int  # per GPU, 0..100
    ratio: int  # memory-ratio per GPU, 0..100
    memory: int = 0  # bytes per GPU (0: none asked)

    @property
    def shared(self) -> bool:
        return self.core < WHOLE or self.ratio < WHOLE


@dataclass(frozen=True, slots=True)
class GpuAllocation:
    minor: int
    core: int
    ratio: int

    def encode(self) -> str:
        return f"gpu/{self.minor}/{self.core}/{self.ratio}"


def gpu_request(requests: Mapping[str, int]) -> GpuRequest | None:
    """The pod's GPU request, None when it asks for none; raises DeviceError."""
    whole = requests.get(NVIDIA_GPU, 0)
    core, ratio = requests.get(GPU_CORE, 0), requests.get(GPU_RATIO, 0)
    memory, shared = requests.get(GPU_MEMORY, 0), requests.get(GPU_SHARED, 0)
    if not (whole or core or ratio or memory or shared):
        return None
    if whole:
        if core or ratio or memory or shared:
            raise DeviceError(f"requests.{NVIDIA_GPU}", whole, f"cannot be combined with {GPU_CORE}, {GPU_RATIO}, "
                                                             f"{GPU_MEMORY} or {GPU_SHARED}")
        return GpuRequest(whole, WHOLE, WHOLE)
    if shared:
        for name, value in ((GPU_CORE, core), (GPU_RATIO, ratio)):
            if value > WHOLE:
                raise DeviceError(f"requests.{name}", value, f"is per GPU with {GPU_SHARED}: at most 100")
        if not (core or ratio or memory):
            raise DeviceError(f"requests.{GPU_SHARED}", shared, f"needs {GPU_CORE}, {GPU_RATIO} or {GPU_MEMORY}")
        return GpuRequest(shared, core, ratio, memory)
    for name, value in ((GPU_CORE, core), (GPU_RATIO, ratio)):
        if value > WHOLE and value % WHOLE:
            raise DeviceError(f"requests.{name}", value, "a share above 100 must be whole GPUs (a multiple of 100)")
    if core > WHOLE or ratio > WHOLE:
        if core and ratio and core != ratio:
            raise DeviceError(f"requests.{GPU_RATIO}", ratio, f"must equal {GPU_CORE} ({core}) for whole GPUs")
        count = max(core, ratio) // WHOLE
        if memory:
            raise DeviceError(f"requests.{GPU_MEMORY}", memory, "cannot be asked with whole GPUs")
        return GpuRequest(count, WHOLE, WHOLE)
    if not core and not ratio and not memory:
        return None
    return GpuRequest(1, core, ratio, memory)


@dataclass(frozen=True, slots=True)
class RdmaAllocation:
    minor: int
    vfs: int

    def encode(self) -> str:
        return f"rdma/{self.minor}/{self.vfs}"


def rdma_request(requests: Mapping[str, int]) -> int:
    """Virtual functions the pod asks for (0: none); raises DeviceError."""
    vfs = requests.get(RDMA, 0)
    if vfs and gpu_request(requests) is None:
        raise DeviceError(f"requests.{RDMA}", vfs, "RDMA is allocated with GPUs, and the pod asks for none")
    return vfs


def choose_vfs(vfs: int, minors: Sequence[int], free: Sequence[int]) -> list[RdmaAllocation] | None:
    """Virtual functions from the NICs in minor order, or None when there are too few."""
    out, left = [], vfs
    for minor, room in zip(minors, free, strict=True):
        take = min(room, left)
        if take > 0:
            out.append(RdmaAllocation(minor, take))
            left -= take
        if not left:
            return out
    return None if left else out


def decode_rdma(devices: Sequence[str]) -> list[RdmaAllocation]:
    out = []
    for item in devices:
        parts = item.split("/")
        if len(parts) == 3 and parts[0] == "rdma":
            out.append(RdmaAllocation(int(parts[1]), int(parts[2])))
    return out


def with_gpu_totals(requests: Mapping[str, int]) -> dict[str, int]:
    """The request with the GPU core and memory-ratio totals it implies (for vector checks)."""
    req = gpu_request(requests)
    out = {k: v for k, v in requests.items() if k not in (GPU_MEMORY, GPU_SHARED)}  # device-level only
    if req is not None:
        out[GPU_CORE] = req.count * req.core
        out[GPU_RATIO] = req.count * req.ratio
    return out


def node_gpu_totals(allocatable: Mapping[str, int], gpus: Sequence[object],
                    nics: Sequence[object] = ()) -> dict[str, int]:
    """A node's allocatable with the totals of its GPUs (core, memory-ratio) and NICs (VFs)."""
    out = dict(allocatable)
    if nics:
        out.setdefault(RDMA, sum(int(getattr(n, "vfs", 0)) for n in nics))
    if gpus:
        out.setdefault(GPU_CORE, sum(int(getattr(g, "core", WHOLE)) for g in gpus))
        out.setdefault(GPU_RATIO, sum(int(getattr(g, "memory_ratio", WHOLE)) for g in gpus))
        out.setdefault(NVIDIA_GPU, len(gpus))
    return out


def ratio_needed(req: GpuRequest, gpu_memory: int) -> int:
    """The memory-ratio the request takes on a GPU with `gpu_memory` bytes (> 100: cannot)."""
    if not req.memory:
        return req.ratio
    if gpu_memory <= 0:
        return WHOLE + 1
    return max(req.ratio, -(-req.memory * WHOLE // gpu_memory))


def choose(req: GpuRequest, minors: Sequence[int], free_core: Sequence[int], free_ratio: Sequence[int],
           memory: Sequence[int]) -> list[GpuAllocation] | None:
    """Which GPUs of one node the request takes, or None when they do not fit.

    A share of one GPU goes to the GPU with the least free core that fits it (packing shares
    together keeps whole GPUs free); whole GPUs are the first free ones in minor order."""
    fitting = []
    for i, minor in enumerate(minors):
        ratio = ratio_needed(req, memory[i])
        if free_core[i] >= req.core and free_ratio[i] >= ratio:
            fitting.append((free_core[i], i, minor, ratio))
    if len(fitting) < req.count:
        return None
    if req.shared:
        fitting.sort()
    return [GpuAllocation(minor, req.core, ratio) for _, _, minor, ratio in fitting[: req.count]]


def decode(devices: Sequence[str]) -> list[GpuAllocation]:
    """The GPU allocations in `Claim.devices` (other kinds of devices are skipped)."""
    out = []
    for item in devices:
        parts = item.split("/")
        if len(parts) == 4 and parts[0] == "gpu":
            out.append(GpuAllocation(int(parts[1]), int(parts[2]), int(parts[3])))
    return out


def annotation(allocations: Sequence[GpuAllocation], nics: Sequence[RdmaAllocation] = ()) -> str:
    """`scheduling.koordinator.sh/device-allocated`, as Koordinator writes it."""
    out: dict[str, list[dict[str, object]]] = {}
    if allocations:
        out["gpu"] = [{"minor": a.minor, "resources": {GPU_CORE: str(a.core), GPU_RATIO: str(a.ratio)}}
                      for a in allocations]
    if nics:
        out["rdma"] = [{"minor": n.minor, "resources": {RDMA: str(n.vfs)}} for n in nics]
    return json.dumps(out, separators=(",", ":"))


def malformed(claimed: Sequence[str]) -> tuple[int, str] | None:
    """The first entry of a record's `devices` that its kind's parser refuses (its index and
    why), or None. Kinds this worker does not know are skipped, as everywhere."""
    for index, item in enumerate(claimed):
        try:
            decode([item]), decode_rdma([item]), cpus.decode([item])
        except ValueError as exc:
            return index, f"not a device this worker can parse ({exc})"
    return None


def add_usage(usage: dict[str, int], claimed: Iterable[str]) -> None:
    """Add what the encoded devices of one claim (or nomination) use, keyed as `device_usage`."""
    encoded = tuple(claimed)
    if not encoded:  # most pods claim no device
        return
    added, marked = usage_of(encoded)
    for key, amount in added:
        usage[key] = usage.get(key, 0) + amount
    for key in marked:
        usage[key] = 1


@functools.lru_cache(maxsize=65_536)
def usage_of(claimed: tuple[str, ...]) -> tuple[tuple[tuple[str, int], ...], tuple[str, ...]]:
    """One claim's devices as (key, amount) to add and keys to mark used (its CPUs); parsed
    once per distinct claim (an owner sums every hold's devices in each report)."""
    added: list[tuple[str, int]] = []
    marked: list[str] = []
    for a in decode(claimed):
        added += [(keys.gpu_core(a.minor), a.core), (keys.gpu_ratio(a.minor), a.ratio)]
    for n in decode_rdma(claimed):
        added.append((keys.rdma_vfs(n.minor), n.vfs))
    for cpuset in cpus.decode(claimed):
        marked += [keys.cpu_used(cpu) for cpu in cpuset.cpus]
        if cpuset.memory:
            added.append((keys.numa_memory(cpuset.cell), cpuset.memory))
    return tuple(added), tuple(marked)
