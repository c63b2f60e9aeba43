"""TaintToleration (Filter, PreScore, Score), kube-scheduler's semantics.

Filter: a node passes when the pod tolerates each of its NoSchedule and NoExecute taints.
Score: the number of PreferNoSchedule taints the pod does not tolerate (counting only
tolerations with an empty or PreferNoSchedule effect), normalized in reverse: fewer is better.
Nodes are grouped by their taint set (`ClusterState.taint_groups`), so tolerations are checked
once per distinct set, not once per node.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import ClassVar

import numpy as np

from agents.scheduler.cluster import ClusterEvent, ClusterState
from agents.scheduler.framework import status
from agents.scheduler.framework.interface import CycleState, Mask, PodInfo, Rows, Scores
from agents.scheduler.framework.scoring import normalize_reverse
from agents.scheduler.framework.status import Status
from agents.scheduler.plugins.args import NoArgs
from schemas.records import Taint, Toleration

NAME = "TaintToleration"
REASON = "node(s) had untolerated taint"
_HARD = ("NoSchedule", "NoExecute")


def tolerates_one(toleration: Toleration, taint: Taint) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True  # an empty key with Exists tolerates everything
    return toleration.operator in ("Equal", "") and toleration.value == taint.value


def tolerates(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    return any(tolerates_one(t, taint) for t in tolerations)


class TaintToleration:
    NAME: ClassVar[str] = NAME
    DYNAMIC: ClassVar[bool] = False
    NORMALIZES: ClassVar[bool] = True
    EVENTS: ClassVar[ClusterEvent] = ClusterEvent.NODE_ADDED | ClusterEvent.NODE_CHANGED

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def sign(self, pod: PodInfo) -> Hashable:
        return pod.pod.tolerations

    def _per_group(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> tuple[np.ndarray, np.ndarray]:
        cached = cycle.read(NAME)
        if cached is None:
            ids, groups = state.taint_groups()
            tol = pod.pod.tolerations
            ok = np.array([all(tolerates(tol, t) for t in taints if t.effect in _HARD) for taints in groups])
            soft = [t for t in tol if t.effect in ("", "PreferNoSchedule")]
            prefer = np.array([sum(1 for t in taints if t.effect == "PreferNoSchedule" and not tolerates(soft, t))
                               for taints in groups], dtype=np.int64)
            cached = (ok[ids], prefer[ids])
            cycle.write(NAME, cached)
        return cached  # type: ignore[no-any-return]

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Mask:
        ok, _ = self._per_group(cycle, pod, state)
        return ok[rows]  # type: ignore[no-any-return]

    def explain(self, cycle: CycleState, pod: PodInfo, state: ClusterState, failed: Mask) -> dict[str, int]:
        return {REASON: int(failed.sum())}

    def pre_score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Mask) -> Status:
        _, prefer = self._per_group(cycle, pod, state)
        return status.SKIP if not prefer[feasible].any() else status.SUCCESS

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Scores:
        _, prefer = self._per_group(cycle, pod, state)
        return prefer[rows]  # type: ignore[no-any-return]

    def normalize(self, cycle: CycleState, raw: Scores, feasible: Mask) -> Scores:
        return normalize_reverse(raw, feasible)

