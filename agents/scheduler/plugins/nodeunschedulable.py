"""NodeUnschedulable (Filter): cordoned nodes take only pods that tolerate the
`node.kubernetes.io/unschedulable:NoSchedule` taint, as kube-scheduler's plugin does."""

from __future__ import annotations

from collections.abc import Hashable
from typing import ClassVar

import numpy as np

from agents.scheduler.cluster import ClusterEvent, ClusterState
from agents.scheduler.framework.interface import CycleState, Mask, PodInfo, Rows
from agents.scheduler.plugins.args import NoArgs
from agents.scheduler.plugins.tainttoleration import tolerates
from schemas.records import Taint

NAME = "NodeUnschedulable"
REASON = "node(s) were unschedulable"
UNSCHEDULABLE_TAINT = Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule")


class NodeUnschedulable:
    NAME: ClassVar[str] = NAME
    DYNAMIC: ClassVar[bool] = False
    EVENTS: ClassVar[ClusterEvent] = ClusterEvent.NODE_ADDED | ClusterEvent.NODE_CHANGED

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def sign(self, pod: PodInfo) -> Hashable:
        return bool(pod.pod.tolerations) and tolerates(pod.pod.tolerations, UNSCHEDULABLE_TAINT)

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Mask:
        cordoned = state.unschedulable[: state.size][rows]
        if tolerates(pod.pod.tolerations, UNSCHEDULABLE_TAINT):
            return np.ones(cordoned.shape, dtype=bool)
        return ~cordoned

    def explain(self, cycle: CycleState, pod: PodInfo, state: ClusterState, failed: Mask) -> dict[str, int]:
        return {REASON: int(failed.sum())}
