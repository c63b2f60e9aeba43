"""Workload generators: node fleets and pod streams of mixed sizes, seeded."""

from __future__ import annotations

import random

from schemas.records import Node, Pod, ResourceList

GI = 2**30
MI = 2**20
CPU_CHOICES = (100, 250, 500, 1000, 2000)  # millicores
MEMORY_CHOICES = (128 * MI, 512 * MI, GI, 2 * GI, 4 * GI)


def make_nodes(count: int, prefix: str = "node", cpu: int = 16000, memory: int = 64 * GI, pods: int = 110) -> list[Node]:
    alloc = ResourceList({"cpu": cpu, "memory": memory, "pods": pods})
    return [Node(name=f"{prefix}-{i:05d}", capacity=alloc, allocatable=alloc) for i in range(count)]


def make_pods(count: int, prefix: str = "pod", seed: int = 0, now: float = 0.0) -> list[Pod]:
    rng = random.Random(seed)
    return [
        Pod(
            uid=f"{prefix}-{i:06d}",
            name=f"{prefix}-{i:06d}",
            namespace="demo",
            creation_timestamp=now,
            requests=ResourceList({"cpu": rng.choice(CPU_CHOICES), "memory": rng.choice(MEMORY_CHOICES)}),
        )
        for i in range(count)
    ]
