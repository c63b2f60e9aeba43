"""Reservation (PreFilter, Score, Reserve / Unreserve): pods consume the reservations their
owners match, first.

PreFilter: per node, the reservation the pod would consume there (`ReservationTable.candidates`:
owners match, an allocate-once one not yet taken, a Restricted one whose remainder covers the
pod's request for every resource it holds); its remainder becomes room on that node
(`CycleState.reserved_room`, which NodeResourcesFit adds). SKIP when there is none, and for a
reservation itself (it is scheduled like a pod and consumes nothing).

Score: 100 on nodes with a candidate, 0 elsewhere; the default weight (1000) outweighs every
other default plugin together (at most 7 x 100), so a pod goes to a reservation when one fits.

Reserve: the claim consumes `min(request, remainder)` of the node's candidate
(`ClusterState.assume_reservation`; forgetting the claim gives it back) and names it in
`CycleState.reservation`, which DefaultBinder writes on the Claim; the node's owner checks it
again. Pods that match a reservation, and reservations, are never batched into equivalence
classes (each placement changes the next one's room).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import ClassVar

import numpy as np

from agents.scheduler.cluster import ClusterEvent, ClusterState
from agents.scheduler.framework import status
from agents.scheduler.framework.interface import (
    MAX_NODE_SCORE,
    UNSIGNABLE,
    CycleState,
    Mask,
    PodInfo,
    Rows,
    Scores,
)
from agents.scheduler.framework.status import Status
from agents.scheduler.plugins.args import NoArgs
from agents.scheduler.reservation_table import Candidate
from schemas.records import hold_id

NAME = "Reservation"
DEFAULT_WEIGHT = 1000
DERIVED = "reservation"  # PodInfo.derived key: the Reservation a reserve pod stands for


class Reservation:
    NAME: ClassVar[str] = NAME
    DYNAMIC: ClassVar[bool] = False
    NORMALIZES: ClassVar[bool] = False
    EVENTS: ClassVar[ClusterEvent] = ClusterEvent.CAPACITY_FREED | ClusterEvent.NODE_CHANGED

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def sign(self, pod: PodInfo) -> Hashable:
        return UNSIGNABLE if DERIVED in pod.derived else ()

    def pre_filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Status:
        if not state.reservations or DERIVED in pod.derived:
            return status.SKIP
        candidates = state.reservations.candidates(pod.pod, pod.request)
        if not candidates:
            return status.SKIP
        room = np.zeros((state.size, len(state.space)), dtype=np.int64)
        for row, candidate in candidates.items():
            room[row] = candidate.remaining
        cycle.reserved_room = room
        cycle.write(NAME, candidates)
        return status.SUCCESS

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Scores:
        candidates: dict[int, Candidate] | None = cycle.read(NAME)
        out = np.zeros(state.size, dtype=np.int64)
        if candidates:
            out[list(candidates)] = MAX_NODE_SCORE
        return out[rows]  # type: ignore[no-any-return]

    def normalize(self, cycle: CycleState, raw: Scores, feasible: Mask) -> Scores:
        return raw

    def reserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> Status:
        candidates: dict[int, Candidate] | None = cycle.read(NAME)
        candidate = candidates.get(row) if candidates else None
        cycle.reservation = ""
        if candidate is not None:
            consumed = np.minimum(pod.request, candidate.remaining)
            state.assume_reservation(hold_id(pod.uid, pod.attempt, state.names[row]), row, candidate.uid, consumed)
            cycle.reservation = candidate.uid
        return status.SUCCESS

    def unreserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> None:
        cycle.reservation = ""  # the consumption goes with the claim (`ClusterState.forget`)
