"""Device-usage keys: how a node's per-device usage is named, in one place.

Owners account what the holds and committed pods of a node use device by device, and report it
on `NodeStateChange.device_usage`; scheduler replicas and preemption read it back. A key is
`<kind>/<index>/<what>`:

- `gpu/<minor>/core` and `gpu/<minor>/ratio`: GPU core and memory-ratio shares (percent);
- `rdma/<minor>/vfs`: virtual functions taken on a NIC;
- `cpu/<cpu>/used`: 1 when the logical CPU is bound to a pod (NodeNUMAResource);
- `numa/<cell>/memory`: memory bound on a NUMA cell, in bytes.
"""

from __future__ import annotations

from collections.abc import Mapping


def gpu_core(minor: int) -> str:
    return f"gpu/{minor}/core"


def gpu_ratio(minor: int) -> str:
    return f"gpu/{minor}/ratio"


def rdma_vfs(minor: int) -> str:
    return f"rdma/{minor}/vfs"


def cpu_used(cpu: int) -> str:
    return f"cpu/{cpu}/used"


def numa_memory(cell: int) -> str:
    return f"numa/{cell}/memory"


def parse(key: str) -> tuple[str, int, str]:
    """`(kind, index, what)` of a usage key."""
    kind, index, what = key.split("/")
    return kind, int(index), what


def by_index(usage: Mapping[str, int], kind: str) -> dict[int, int]:
    """The amounts of one kind of device, by its index (minor, cpu or cell)."""
    out: dict[int, int] = {}
    for key, amount in usage.items():
        if key.startswith(f"{kind}/"):
            out[parse(key)[1]] = amount
    return out
