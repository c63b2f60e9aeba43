"""NodeResourcesBalancedAllocation (PreScore, Score), kube-scheduler's exact semantics.

For each counted resource (cpu and memory always, where the node has them; other configured
resources when the pod requests them and the node has them): fraction = requested /
allocatable, the incoming pod included, capped at 1. The score is (1 - std) x 100, truncated,
where std is the population standard deviation of the fractions (for exactly two it is
|f1 - f2| / 2, as kube-scheduler computes it). Pods that request nothing skip this plugin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from agents.scheduler.cluster import ClusterState
from agents.scheduler.framework import status
from agents.scheduler.framework.interface import (
    MAX_NODE_SCORE,
    CycleState,
    Mask,
    PodInfo,
    Rows,
    Scores,
)
from agents.scheduler.framework.status import Status
from agents.scheduler.plugins.args import reject_unknown
from agents.scheduler.plugins.noderesources.resources import (
    DEFAULT_SPECS,
    Counted,
    ResourceSpec,
    after_steps,
    request_list,
    specs_from,
    validate_specs,
)

NAME = "NodeResourcesBalancedAllocation"


@dataclass(frozen=True)
class BalancedAllocationArgs:
    resources: tuple[ResourceSpec, ...] = DEFAULT_SPECS

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> BalancedAllocationArgs:
        reject_unknown(raw, {"resources"})
        return cls(resources=specs_from(raw.get("resources"), "resources"))

    def validate(self) -> None:
        validate_specs(self.resources, "resources")


def balance_std(requested: npt.NDArray[np.int64], allocatable: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Per node (rows): the population std of min(requested / allocatable, 1) over the columns
    the node has (allocatable > 0); 0 where fewer than two count. The rebalancer's imbalance
    is this same number."""
    has = allocatable > 0
    if has.all():
        fractions = requested / allocatable
        np.minimum(fractions, 1.0, out=fractions)
        if fractions.shape[1] == 2:  # kube-scheduler's two-resource formula, as it writes it
            out: npt.NDArray[np.float64] = np.abs((fractions[:, 0] - fractions[:, 1]) / 2)
            return out
        if fractions.shape[1] < 2:
            return np.zeros(len(fractions))
        out = fractions.std(axis=1)
        return out
    fractions = np.where(has, np.minimum(requested / np.where(has, allocatable, 1), 1.0), 0.0)
    count = has.sum(axis=1)
    mean = fractions.sum(axis=1) / np.maximum(count, 1)
    deviation = np.where(has, fractions - mean[:, None], 0.0)
    std = np.sqrt((deviation * deviation).sum(axis=1) / np.maximum(count, 1))
    pairs = count == 2
    if pairs.any():
        # Two fractions: kube-scheduler takes |f1 - f2| / 2, which can differ from the square
        # root in the last bit; take it the same way so that truncation agrees.
        first = np.argmax(has, axis=1)
        last = has.shape[1] - 1 - np.argmax(has[:, ::-1], axis=1)
        idx = np.arange(len(fractions))
        std = np.where(pairs, np.abs((fractions[idx, first] - fractions[idx, last]) / 2), std)
    out = np.where(count >= 2, std, 0.0)
    return out


def balanced_score(requested: npt.NDArray[np.int64], allocatable: npt.NDArray[np.int64]) -> Scores:
    """Per node (rows): int((1 - std of min(req / alloc, 1) over columns with alloc > 0) x 100)."""
    out: Scores = ((1.0 - balance_std(requested, allocatable)) * MAX_NODE_SCORE).astype(np.int64)
    return out


class BalancedAllocation:
    NAME: ClassVar[str] = NAME
    DYNAMIC: ClassVar[bool] = True
    SIGNATURE_FREE: ClassVar[bool] = True  # reads only the request and priority, in every signature
    NORMALIZES: ClassVar[bool] = False

    def __init__(self, args: BalancedAllocationArgs | None = None) -> None:
        self.args = args or BalancedAllocationArgs()

    def pre_score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Mask) -> Status:
        counted = Counted.of(self.args.resources, state.space.index, pod.request)
        if not pod.request[counted.columns].any():
            return status.SKIP  # best-effort pods would all pile onto one node otherwise
        cycle.write(NAME, counted)
        return status.SUCCESS

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Scores:
        c: Counted = cycle.read(NAME)
        requested = state.requested[rows][:, c.columns] + pod.request[c.columns]
        return balanced_score(requested, state.allocatable_view[rows][:, c.columns])

    def score_steps(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int, steps: int) -> list[int]:
        terms = cycle.read(NAME + "/steps")
        if terms is None:  # what does not depend on the node, once per cycle
            c: Counted = cycle.read(NAME)
            request, _ = request_list(pod)
            terms = [(col, request[col]) for col, _ in c.pairs]
            cycle.write(NAME + "/steps", terms)
        requested, allocatable = state.requested_row(row), state.allocatable_row(row)
        counted = [(requested[col], req, allocatable[col]) for col, req in terms if allocatable[col] > 0]
        if len(counted) == 2:  # the usual cpu and memory, without the general machinery
            (u0, r0, a0), (u1, r1, a1) = counted
            return [int((1.0 - abs((min((u0 + k * r0) / a0, 1.0) - min((u1 + k * r1) / a1, 1.0)) / 2))
                        * MAX_NODE_SCORE) for k in range(1, steps + 1)]
        out = []
        for k in range(1, steps + 1):
            fractions = [min((used + k * req) / alloc, 1.0) for used, req, alloc in counted]
            if len(fractions) == 2:
                std = abs((fractions[0] - fractions[1]) / 2)
            elif len(fractions) > 2:
                mean = sum(fractions) / len(fractions)
                std = math.sqrt(sum((f - mean) * (f - mean) for f in fractions) / len(fractions))
            else:
                std = 0.0
            out.append(int((1.0 - std) * MAX_NODE_SCORE))
        return out

    def score_steps_rows(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: npt.NDArray[np.intp],
                         steps: int) -> Scores:
        c: Counted = cycle.read(NAME)
        after, allocatable = after_steps(state, rows, c.columns, pod.request, steps)
        return balanced_score(after, allocatable).reshape(len(rows), steps)

    def normalize(self, cycle: CycleState, raw: Scores, feasible: Mask) -> Scores:
        return raw

