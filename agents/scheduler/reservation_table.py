"""The schedulers' view of the available reservations: what the owners report per node, less
what this worker's claims (assumed, not yet reported) consume of them.

A node's `used` (from its owner) already counts each available reservation's remainder, so
pods that do not match a reservation cannot take it. For a pod that does, `candidates` picks
at most one reservation per node (the rules are in `agents.state.reservations`): the one whose
remainder covers the most of the pod's request, ties to the smaller remainder, then the uid.
Filtering adds that remainder to the node's room (Koordinator restores matched reservations
the same way before NodeResourcesFit runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agents.state import devices
from agents.state import reservations as rsv
from agents.state.resources import ResourceSpace, Vector
from schemas.records import Pod, Reservation, ReservationOwner, ReservationState


@dataclass(slots=True)
class Available:
    reservation: Reservation
    held: Vector  # what it holds in all (its claim's request)
    allocated: Vector  # what its consumers take, as the owner reports
    consumers: int


@dataclass(frozen=True, slots=True)
class Candidate:
    uid: str
    remaining: Vector


class ReservationTable:
    def __init__(self, space: ResourceSpace) -> None:
        self.space = space
        self.by_row: dict[int, list[Available]] = {}
        self._assumed: dict[str, tuple[int, str, Vector]] = {}  # hold id -> (row, uid, consumed)
        self._consumed: dict[str, tuple[Vector, int]] = {}  # uid -> (assumed consumption, claims)
        # The available reservations' owners: object uids (the common case: a reservation made
        # for one pod) apart, the others to try one by one. None: to build again.
        self._owners: tuple[frozenset[str], tuple[ReservationOwner, ...]] | None = None

    def __bool__(self) -> bool:
        return bool(self.by_row)

    def report(self, row: int, states: Sequence[ReservationState]) -> bool:
        """The owner's list for one node replaces the last; True when it changed."""
        before = self.by_row.get(row, [])
        now = [Available(s.reservation, self.space.pod_request(devices.with_gpu_totals(s.reservation.requests)),
                         self.space.known(s.allocated), s.consumers) for s in states]
        if not now and not before:
            return False
        self._owners = None
        if now:
            self.by_row[row] = now
        else:
            del self.by_row[row]
        return True

    def remaining(self, a: Available) -> Vector:
        consumed = self._consumed.get(a.reservation.uid)
        left = a.held - a.allocated - (consumed[0] if consumed is not None else 0)
        out: Vector = np.maximum(left, 0)
        return out

    def matches_any(self, pod: Pod) -> bool:
        """Whether any available reservation may take the pod (`rsv.matches` on each of them)."""
        if self._owners is None:
            uids: set[str] = set()
            others: list[ReservationOwner] = []
            for entries in self.by_row.values():
                for a in entries:
                    for owner in a.reservation.owners:
                        if owner.object_uid:
                            uids.add(owner.object_uid)
                        else:
                            others.append(owner)
            self._owners = (frozenset(uids), tuple(others))
        uids_, others_ = self._owners
        return pod.uid in uids_ or any(rsv.owner_matches(owner, pod) for owner in others_)

    def candidates(self, pod: Pod, request: Vector) -> dict[int, Candidate]:
        """Per node, the reservation the pod would consume there (rows without one are absent).
        A pod that no available reservation may take (most pods) is told so from the owners'
        index (`matches_any`), without a look at each node's reservations."""
        out: dict[int, Candidate] = {}
        if not self.matches_any(pod):
            return out
        requested = request > 0
        pods = self.space.pods_column
        for row, entries in self.by_row.items():
            best: tuple[int, int, str] | None = None
            chosen: Candidate | None = None
            for a in entries:
                r = a.reservation
                if not rsv.matches(r, pod):
                    continue
                claims = a.consumers + (self._consumed.get(r.uid, (None, 0))[1])
                if r.allocate_once and claims:
                    continue
                left = self.remaining(a)
                covered = np.minimum(request, left)
                if r.allocate_policy == rsv.RESTRICTED:
                    short = requested & (a.held > 0) & (request > left)
                    if pods is not None:
                        short[pods] = False
                    if short.any():
                        continue
                key = (-int(covered.sum()), int(left.sum()), r.uid)
                if best is None or key < best:
                    best, chosen = key, Candidate(r.uid, left)
            if chosen is not None:
                out[row] = chosen
        return out

    def assume(self, hold_id: str, row: int, uid: str, consumed: Vector) -> bool:
        """Record an assumed consumption; False when `hold_id` has one already."""
        if hold_id in self._assumed:
            return False
        self._assumed[hold_id] = (row, uid, consumed)
        total, count = self._consumed.get(uid, (np.zeros(len(self.space), dtype=np.int64), 0))
        self._consumed[uid] = (total + consumed, count + 1)
        return True

    def forget(self, hold_id: str) -> tuple[int, Vector] | None:
        """Undo an assumed consumption; returns (row, what it had taken) to give back to the node."""
        assumed = self._assumed.pop(hold_id, None)
        if assumed is None:
            return None
        row, uid, consumed = assumed
        total, count = self._consumed[uid]
        if count == 1:
            del self._consumed[uid]
        else:
            self._consumed[uid] = (total - consumed, count - 1)
        return row, consumed
