"""A scheduler's read replica of the whole cluster, in numpy structure-of-arrays form.

Fed by every partition of `state-changes` (no consumer group): per node, allocatable and used
(committed + held) as the owner last published them, applied in arrival order. On top, the
replica's own assumptions: claims sent but not yet seen in a state change (assume / forget,
like kube-scheduler's cache).
An assumption is forgotten when the owner reports its hold id in any state (held, committed,
released, rejected) or when the pod comes back on `requeue`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agents.state.resources import ResourceSpace, Vector
from schemas.records import Node, NodeStateChange, Nomination

_FREEING = frozenset({"released", "rejected", "terminated"})


@dataclass(frozen=True)
class Nominated:
    rows: npt.NDArray[np.intp]
    priorities: npt.NDArray[np.int64]
    uids: npt.NDArray[np.object_]
    vectors: npt.NDArray[np.int64]

    def free_for(self, free: npt.NDArray[np.int64], priority: int, uid: str) -> npt.NDArray[np.int64]:
        """`free` less the claims of other pods nominated with equal or higher priority (the
        owners apply the same rule when they hold a claim; DESIGN.md, safety rule 8)."""
        if not self.rows.size:
            return free
        counted = (self.priorities >= priority) & (self.uids != uid)
        if not counted.any():
            return free
        adjusted = free.copy()
        np.subtract.at(adjusted, self.rows[counted], self.vectors[counted])
        return adjusted


class ClusterReplica:
    def __init__(self, space: ResourceSpace, capacity: int = 1024) -> None:
        self.space = space
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        width = len(space)
        self.allocatable = np.zeros((capacity, width), dtype=np.int64)
        self.used = np.zeros((capacity, width), dtype=np.int64)
        self.assumed = np.zeros((capacity, width), dtype=np.int64)
        self.schedulable = np.zeros(capacity, dtype=bool)
        self.assumptions: dict[str, tuple[int, Vector]] = {}
        # Per row: the Node record (labels, taints, devices) and the nominations on it, as the
        # owners last reported them; the framework's filters and nominator read them.
        self.records: dict[int, Node] = {}
        self.nominations: dict[int, tuple[Nomination, ...]] = {}
        self._nominated: Nominated | None = None  # arrays of every nomination, rebuilt on change

    @property
    def size(self) -> int:
        return len(self.names)

    def _row(self, node: str) -> int:
        row = self.index.get(node)
        if row is None:
            row = len(self.names)
            if row == self.allocatable.shape[0]:
                self._grow()
            self.names.append(node)
            self.index[node] = row
        return row

    def _grow(self) -> None:
        def doubled(a: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
            return np.concatenate([a, np.zeros_like(a)])

        self.allocatable = doubled(self.allocatable)  # type: ignore[assignment]
        self.used = doubled(self.used)  # type: ignore[assignment]
        self.assumed = doubled(self.assumed)  # type: ignore[assignment]
        self.schedulable = doubled(self.schedulable)  # type: ignore[assignment]

    def apply(self, change: NodeStateChange) -> bool:
        """Apply one owner report; True when it may let a waiting pod fit (a cluster event)."""
        # Reports of one node arrive in the order its owner wrote them (one partition). A
        # replacement owner may restore a table that lags what its predecessor published and
        # repeat sequence numbers; its reports are still the truth from then on, so the
        # replica applies reports in arrival order rather than by `seq`.
        row = self._row(change.node)
        before = self.allocatable[row].copy()
        was_schedulable = bool(self.schedulable[row])
        self.allocatable[row] = self.space.allocatable(change.allocatable)
        self.used[row] = self.space.known(change.used)
        self.schedulable[row] = not change.deleted and not change.unschedulable
        if change.node_record is not None:
            self.records[row] = change.node_record
        if self.nominations.get(row, ()) != change.nominations:
            self.nominations[row] = change.nominations
            self._nominated = None
        freed = False
        for hid, status in change.holds.items():
            self.forget(hid)
            freed |= status in _FREEING
        grew = bool((self.allocatable[row] > before).any()) or (bool(self.schedulable[row]) and not was_schedulable)
        return freed or grew

    def assume(self, hold_id: str, row: int, request: Vector) -> None:
        self.assumptions[hold_id] = (row, request)
        self.assumed[row] += request

    def forget(self, hold_id: str) -> None:
        assumption = self.assumptions.pop(hold_id, None)
        if assumption is not None:
            row, request = assumption
            self.assumed[row] -= request

    def nominated(self) -> Nominated:
        """Every nomination as arrays (row, priority, uid, claim vector), for the filters."""
        if self._nominated is None:
            entries = [(row, n) for row, noms in self.nominations.items() for n in noms]
            self._nominated = Nominated(
                rows=np.array([row for row, _ in entries], dtype=np.intp),
                priorities=np.array([n.priority for _, n in entries], dtype=np.int64),
                uids=np.array([n.uid for _, n in entries], dtype=object),
                vectors=np.array([self.space.known(n.requests) for _, n in entries], dtype=np.int64).reshape(
                    len(entries), len(self.space)),
            )
        return self._nominated

    def free(self) -> npt.NDArray[np.int64]:
        """Free capacity per node: allocatable - used - assumed."""
        n = self.size
        free: npt.NDArray[np.int64] = self.allocatable[:n] - self.used[:n] - self.assumed[:n]
        return free
