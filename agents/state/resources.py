"""The resource space: a fixed column index per resource name, and vectors over it.

Node allocatable and usage are `int64` matrices `[nodes x resources]`; a pod request is a
vector. Every pod also requests one unit of `pods`, which is how Kubernetes caps pods per node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

DEFAULT_RESOURCES: tuple[str, ...] = (
    "cpu",
    "memory",
    "pods",
    "ephemeral-storage",
    "nvidia.com/gpu",
    "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory-ratio",
    "koordinator.sh/gpu-memory",
    "koordinator.sh/rdma",
)
DEFAULT_MAX_PODS = 110

Vector = npt.NDArray[np.int64]


class UnknownResource(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class ResourceSpace:
    """Resource name -> column. Fixed at start; pods asking for others cannot be placed."""

    def __init__(self, names: Sequence[str] = DEFAULT_RESOURCES) -> None:
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate resource names in {list(names)}")
        self.names = tuple(names)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.pods_column = self.index.get("pods")

    def __len__(self) -> int:
        return len(self.names)

    def vector(self, amounts: Mapping[str, int]) -> Vector:
        """Amounts to a vector; raises `UnknownResource` for a name outside the space."""
        vec = np.zeros(len(self.names), dtype=np.int64)
        for name, amount in amounts.items():
            column = self.index.get(name)
            if column is None:
                if amount:
                    raise UnknownResource(name)
                continue
            vec[column] = amount
        return vec

    def known(self, amounts: Mapping[str, int]) -> Vector:
        """Amounts to a vector, ignoring names outside the space."""
        vec = np.zeros(len(self.names), dtype=np.int64)
        for name, amount in amounts.items():
            column = self.index.get(name)
            if column is not None:
                vec[column] = amount
        return vec

    def allocatable(self, amounts: Mapping[str, int]) -> Vector:
        """A node's allocatable, known resources only; `pods` defaults to Kubernetes' 110."""
        vec = self.known(amounts)
        if self.pods_column is not None and "pods" not in amounts:
            vec[self.pods_column] = DEFAULT_MAX_PODS
        return vec

    def pod_request(self, requests: Mapping[str, int]) -> Vector:
        vec = self.vector(requests)
        if self.pods_column is not None:
            vec[self.pods_column] = max(int(vec[self.pods_column]), 1)
        return vec

    def to_map(self, vec: Vector) -> dict[str, int]:
        return {self.names[i]: int(v) for i, v in enumerate(vec) if v}
