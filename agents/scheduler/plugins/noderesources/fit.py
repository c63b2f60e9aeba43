"""NodeResourcesFit (PreFilter, Filter, Score): does the pod's request fit, and how full is
the node afterwards.

Filter: the owners' admission rule (`agents.state.admission`), on every node at once: for
every resource the pod requests (`pods` included: one per pod), free capacity (allocatable -
committed - held - assumed) less the claims of other pods nominated there with equal or higher
priority (`Nominator.promised`), plus the remainder of a reservation the pod may consume there
(`CycleState.reserved_room`, from the Reservation plugin), plus, for a gang member, what
lower-ranked gangs hold there without being accepted (their owner will ask them to yield it:
wound-wait), covers the request. Reasons: "Insufficient <resource>", or "Too many pods".

Score, by `scoringStrategy.type` over `scoringStrategy.resources` (default cpu and memory,
weight 1), with kube-scheduler's integer arithmetic per resource, then the weighted mean
(integer division):
- LeastAllocated: (allocatable - requested) x 100 / allocatable, 0 when over.
- MostAllocated: requested x 100 / allocatable, requested capped at allocatable.
"requested" includes the incoming pod. Resources a node lacks (allocatable 0) are left out of
its mean. Unlike kube-scheduler, pods without cpu / memory requests are not counted as 100m /
200Mi when scoring: the owners publish real requests only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from agents.scheduler.cluster import ClusterEvent, ClusterState
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
from agents.scheduler.plugins.args import ArgsError, reject_unknown
from agents.scheduler.plugins.noderesources.resources import (
    DEFAULT_SPECS,
    Counted,
    ResourceSpec,
    after_steps,
    column_sum,
    request_list,
    specs_from,
    validate_specs,
)
from agents.state import admission, gangs

NAME = "NodeResourcesFit"
LEAST_ALLOCATED, MOST_ALLOCATED = "LeastAllocated", "MostAllocated"
STRATEGIES = (LEAST_ALLOCATED, MOST_ALLOCATED)


@dataclass(frozen=True)
class FitArgs:
    strategy: str = LEAST_ALLOCATED
    resources: tuple[ResourceSpec, ...] = DEFAULT_SPECS

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> FitArgs:
        reject_unknown(raw, {"scoringStrategy"})
        strategy = raw.get("scoringStrategy") or {}
        if not isinstance(strategy, Mapping):
            raise ArgsError("scoringStrategy", strategy, "must be an object with type and resources")
        return cls(strategy=strategy.get("type", LEAST_ALLOCATED),
                   resources=specs_from(strategy.get("resources"), "scoringStrategy.resources"))

    def validate(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ArgsError("scoringStrategy.type", self.strategy, f"must be one of {list(STRATEGIES)}")
        validate_specs(self.resources, "scoringStrategy.resources")


def least_allocated(requested: npt.NDArray[np.int64], allocatable: npt.NDArray[np.int64],
                    weights: npt.NDArray[np.int64]) -> Scores:
    """Per node (rows) over resources (columns): weighted mean of (alloc - req) x 100 / alloc,
    0 for a resource whose request exceeds what the node has."""
    left = np.maximum(allocatable - requested, 0) * MAX_NODE_SCORE
    return _weighted_mean(left, allocatable, weights)


def most_allocated(requested: npt.NDArray[np.int64], allocatable: npt.NDArray[np.int64],
                   weights: npt.NDArray[np.int64]) -> Scores:
    """Per node over resources: weighted mean of min(req, alloc) x 100 / alloc."""
    used = np.minimum(requested, allocatable) * MAX_NODE_SCORE
    return _weighted_mean(used, allocatable, weights)


def _weighted_mean(numerator: npt.NDArray[np.int64], allocatable: npt.NDArray[np.int64],
                   weights: npt.NDArray[np.int64]) -> Scores:
    """sum(weight x (numerator // alloc)) // sum(weight), over the resources the node has."""
    has = allocatable > 0
    if has.all():  # the common case: no masking needed
        per = numerator // allocatable
        if weights.size and (weights == weights[0]).all():
            out: Scores = column_sum(per) // per.shape[1]
            return out
        return column_sum(per * weights) // weights.sum()  # type: ignore[no-any-return]
    per = np.where(has, numerator // np.where(has, allocatable, 1), 0)
    total = (per * weights).sum(axis=1)
    weight_sum = (has * weights).sum(axis=1)
    masked: Scores = np.where(weight_sum > 0, total // np.maximum(weight_sum, 1), 0)
    return masked


class Fit:
    NAME: ClassVar[str] = NAME
    DYNAMIC: ClassVar[bool] = True
    SIGNATURE_FREE: ClassVar[bool] = True  # reads only the request and priority, in every signature
    NORMALIZES: ClassVar[bool] = False
    EVENTS: ClassVar[ClusterEvent] = ClusterEvent.ANY

    def __init__(self, args: FitArgs | None = None) -> None:
        self.args = args or FitArgs()
        self._scorer = least_allocated if self.args.strategy == LEAST_ALLOCATED else most_allocated

    def pre_filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Status:
        """Precompute what others' nominations take from each node, and what lower-ranked
        gangs would yield to a gang member (wound-wait); each None when nothing."""
        promised = state.nominator.promised(pod.priority, pod.uid, state.size)
        yieldable = None
        if state.gang_holds and pod.decision_key != pod.uid:
            yieldable = state.yieldable(gangs.rank(pod.priority, pod.decision_key), pod.decision_key)
        cycle.write(NAME, (promised, yieldable))
        return status.SUCCESS

    def _room(self, cycle: CycleState, state: ClusterState, rows: Rows | Mask | int) -> npt.NDArray[np.int64]:
        """`admission.room` on the rows: free, less others' nominations, plus the remainder of
        a reservation the pod may consume (`CycleState.reserved_room`) and what lower-ranked
        gangs would yield."""
        promised, yieldable = cycle.read(NAME)
        reserved = cycle.reserved_room
        return admission.room(state.free[rows], promised[rows] if promised is not None else None,
                              reserved[rows] if reserved is not None else None,
                              yieldable[rows] if yieldable is not None else None)

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Mask:
        return admission.admits(self._room(cycle, state, rows), pod.request, pod.columns)

    def fit_steps(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int, limit: int) -> int:
        request, columns = request_list(pod)
        promised, yieldable = cycle.read(NAME)
        if promised is None and yieldable is None and cycle.reserved_room is None:
            room = state.free_row(row)  # the common case, without numpy
        else:
            room = self._room(cycle, state, row).tolist()
        return admission.copies(room, request, columns, limit)

    def fit_steps_rows(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: npt.NDArray[np.intp],
                       limit: int) -> npt.NDArray[np.int64]:
        return admission.copies_rows(self._room(cycle, state, rows), pod.request, pod.columns, limit)

    def explain(self, cycle: CycleState, pod: PodInfo, state: ClusterState, failed: Mask) -> dict[str, int]:
        room = self._room(cycle, state, failed)
        reasons: dict[str, int] = {}
        for col in pod.columns:
            short = int((room[:, col] < pod.request[col]).sum())
            if short:
                name = state.space.names[col]
                reasons["Too many pods" if name == "pods" else f"Insufficient {name}"] = short
        return reasons

    def _counted(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Counted:
        counted = cycle.read(NAME + "/score")
        if counted is None:
            counted = Counted.of(self.args.resources, state.space.index, pod.request)
            cycle.write(NAME + "/score", counted)
        return counted  # type: ignore[no-any-return]

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Scores:
        c = self._counted(cycle, pod, state)
        requested = state.requested[rows][:, c.columns] + pod.request[c.columns]
        return self._scorer(requested, state.allocatable_view[rows][:, c.columns], c.weights)

    def score_steps(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int, steps: int) -> list[int]:
        per_class = cycle.read(NAME + "/steps")
        if per_class is None:  # what does not depend on the node, once per cycle
            c = self._counted(cycle, pod, state)
            request, _ = request_list(pod)
            terms = [(col, request[col], weight) for col, weight in c.pairs]
            per_class = (terms, self.args.strategy == LEAST_ALLOCATED)
            cycle.write(NAME + "/steps", per_class)
        terms, least = per_class
        requested, allocatable = state.requested_row(row), state.allocatable_row(row)
        present = [(requested[col], req, allocatable[col], w) for col, req, w in terms if allocatable[col] > 0]
        weight_sum = sum(w for *_, w in present)
        if not weight_sum:
            return [0] * steps
        out = []
        for k in range(1, steps + 1):
            total = 0
            for used, req, alloc, weight in present:
                r = used + k * req
                per = max(alloc - r, 0) * MAX_NODE_SCORE // alloc if least else min(r, alloc) * MAX_NODE_SCORE // alloc
                total += per * weight
            out.append(total // weight_sum)
        return out

    def score_steps_rows(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: npt.NDArray[np.intp],
                         steps: int) -> Scores:
        c = self._counted(cycle, pod, state)
        after, allocatable = after_steps(state, rows, c.columns, pod.request, steps)
        return self._scorer(after, allocatable, c.weights).reshape(len(rows), steps)

    def normalize(self, cycle: CycleState, raw: Scores, feasible: Mask) -> Scores:
        return raw
