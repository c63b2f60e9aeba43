"""What the resource plugins share: the `resources` arg (name and weight) and which of them
count for a pod on each node.

As in kube-scheduler, cpu and memory always count (where the node has them); any other
configured resource counts only when the pod requests it and the node has it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from agents.scheduler.cluster import ClusterState
from agents.scheduler.framework.interface import PodInfo
from agents.scheduler.plugins.args import ArgsError
from agents.state.resources import DEFAULT_RESOURCES, Vector

ALWAYS_COUNTED = frozenset({"cpu", "memory"})


@dataclass(frozen=True)
class ResourceSpec:
    name: str
    weight: int = 1


DEFAULT_SPECS: tuple[ResourceSpec, ...] = (ResourceSpec("cpu", 1), ResourceSpec("memory", 1))


def specs_from(raw: Any, field: str) -> tuple[ResourceSpec, ...]:
    if raw is None:
        return DEFAULT_SPECS
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise ArgsError(field, raw, "must be a list of {name, weight}")
    specs = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise ArgsError(f"{field}[{i}]", item, "must be an object with a name")
        specs.append(ResourceSpec(item["name"], item.get("weight", 1)))
    return tuple(specs)


def validate_specs(specs: tuple[ResourceSpec, ...], field: str, known: Sequence[str] = DEFAULT_RESOURCES) -> None:
    if not specs:
        raise ArgsError(field, [], "needs at least one resource")
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if not isinstance(spec.weight, int) or isinstance(spec.weight, bool) or not 1 <= spec.weight <= 100:
            raise ArgsError(f"{field}[{i}].weight", spec.weight, "must be an integer from 1 to 100")
        if spec.name in seen:
            raise ArgsError(f"{field}[{i}].name", spec.name, "is listed twice")
        seen.add(spec.name)


@dataclass(frozen=True, slots=True)
class Counted:
    """The columns a score looks at, their weights, and per column whether the pod's request
    makes it count (cpu and memory always do)."""

    columns: npt.NDArray[np.intp]
    weights: npt.NDArray[np.int64]
    pairs: tuple[tuple[int, int], ...]  # (column, weight) as Python ints, for one-node paths

    @classmethod
    def of(cls, specs: tuple[ResourceSpec, ...], index: Mapping[str, int], request: Vector) -> Counted:
        pairs = []
        for spec in specs:
            col = index.get(spec.name)
            if col is not None and (spec.name in ALWAYS_COUNTED or request[col] > 0):
                pairs.append((col, spec.weight))
        return cls(np.asarray([c for c, _ in pairs], dtype=np.intp), np.asarray([w for _, w in pairs], dtype=np.int64),
                   tuple(pairs))


def request_list(pod: PodInfo) -> tuple[list[int], list[int]]:
    """The pod's request and requested columns as Python ints (cached on the pod)."""
    cached = pod.derived.get("request")
    if cached is None:
        cached = pod.derived["request"] = (pod.request.tolist(), pod.columns.tolist())
    return cached  # type: ignore[no-any-return]


def after_steps(state: ClusterState, rows: npt.NDArray[np.intp], columns: npt.NDArray[np.intp],
                request: Vector, steps: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The nodes `rows` as they would be after 1, 2, ... `steps` more pods of `request` each,
    in `columns`: what they request, one row per node and step, node by node (`steps` rows for
    the first node, then the next), and their allocatable repeated alongside; for a vectorized
    score to read as it reads one placement (`score_steps_rows`)."""
    requested = state.requested[rows][:, columns]
    k = np.arange(1, steps + 1, dtype=np.int64)
    after = (requested[:, None, :] + k[None, :, None] * request[columns][None, None, :]).reshape(-1, len(columns))
    return after, np.repeat(state.allocatable_view[rows][:, columns], steps, axis=0)


def column_sum(matrix: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Per row, the sum over the (few) columns; see `fits` for why not `.sum(axis=1)`."""
    out: npt.NDArray[np.int64] = matrix[:, 0].copy()
    for col in range(1, matrix.shape[1]):
        out += matrix[:, col]
    return out
