"""The nominator: every pod promised capacity on a node, with its full claim.

One nominator per worker, shared by all profiles. Two sources feed it: the owners' reports
(each NodeStateChange lists every nomination on its node) and this worker's own nominations,
made by preemption and not yet reported back (`nominate`); a local entry shadows whatever the
owners last said about the same pod until the owner reports the pod on that node. A pod has at
most one nomination: nominating it elsewhere replaces the old one.

Filtering a pod subtracts the claims of the nominations that count against it (`promised`:
every *other* pod nominated with equal or higher priority, `agents.state.admission`, as the
owners do when they hold a claim; DESIGN.md, safety rule 8); a nomination that names concrete
devices (`devices_for`) keeps those devices from such pods too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agents.state import admission
from agents.state.resources import ResourceSpace
from schemas.records import Nomination


@dataclass(frozen=True, slots=True)
class NominatedArrays:
    rows: npt.NDArray[np.intp]
    priorities: npt.NDArray[np.int64]
    uids: npt.NDArray[np.object_]
    vectors: npt.NDArray[np.int64]
    uid_set: frozenset[str]
    with_devices: tuple[tuple[int, Nomination], ...]  # (row, nomination) of those naming devices


class Nominator:
    def __init__(self, space: ResourceSpace, row_of: dict[str, int]) -> None:
        self.space = space
        self._row_of = row_of  # the cluster state's node name -> row (shared, not copied)
        self._reported: dict[int, tuple[Nomination, ...]] = {}
        self._local: dict[str, Nomination] = {}
        self._arrays: NominatedArrays | None = None
        self._uids: frozenset[str] | None = None

    def report(self, row: int, nominations: tuple[Nomination, ...]) -> None:
        """The owner of `row` lists every nomination on its node."""
        if self._reported.get(row, ()) == nominations:
            return
        self._reported[row] = nominations
        for n in nominations:
            local = self._local.get(n.uid)
            if local is not None and local.node == n.node:
                del self._local[n.uid]  # the owner has it now
        self._arrays = self._uids = None

    def nominate(self, nomination: Nomination) -> Nomination | None:
        """Record a nomination made here; returns the one it replaces on another node, if any."""
        previous = self.of(nomination.uid)
        self._local[nomination.uid] = nomination
        self._arrays = self._uids = None
        return previous if previous is not None and previous.node != nomination.node else None

    def clear(self, uid: str) -> Nomination | None:
        """Forget the pod's nomination (bound or deleted); returns it so the owner can be told."""
        found = self.of(uid)
        if found is None:
            return None
        self._local.pop(uid, None)
        row = self._row_of.get(found.node)
        if row is not None and row in self._reported:
            self._reported[row] = tuple(n for n in self._reported[row] if n.uid != uid)
        self._arrays = self._uids = None
        return found

    def of(self, uid: str) -> Nomination | None:
        local = self._local.get(uid)
        if local is not None:
            return local
        for noms in self._reported.values():
            for n in noms:
                if n.uid == uid:
                    return n
        return None

    def nominated_uids(self) -> frozenset[str]:
        """Every pod with a nomination (cheap: asked for every pod scheduled)."""
        if self._uids is None:
            self._uids = self.arrays().uid_set
        return self._uids

    def __len__(self) -> int:
        return len(self.arrays().rows)

    def arrays(self) -> NominatedArrays:
        """Every effective nomination as arrays (row, priority, uid, claim vector)."""
        if self._arrays is None:
            entries = [n for noms in self._reported.values() for n in noms if n.uid not in self._local]
            entries += [n for n in self._local.values() if n.node in self._row_of]
            self._arrays = NominatedArrays(
                rows=np.array([self._row_of[n.node] for n in entries], dtype=np.intp),
                priorities=np.array([n.priority for n in entries], dtype=np.int64),
                uids=np.array([n.uid for n in entries], dtype=object),
                vectors=np.array([self.space.known(n.requests) for n in entries], dtype=np.int64).reshape(
                    len(entries), len(self.space)),
                uid_set=frozenset(n.uid for n in entries),
                with_devices=tuple((self._row_of[n.node], n) for n in entries if n.devices),
            )
        return self._arrays

    def devices_for(self, priority: int, uid: str) -> list[tuple[int, Nomination]]:
        """(row, nomination) of the nominations that count against pod `uid` at `priority`
        (`admission.counts_against`) and name concrete devices: those devices are theirs."""
        return [(row, n) for row, n in self.arrays().with_devices
                if admission.counts_against(n.priority, n.uid, priority, uid)]

    def promised(self, priority: int, uid: str, size: int) -> npt.NDArray[np.int64] | None:
        """Per row (of `size`), the claims of the nominations that count against pod `uid` at
        `priority` (`admission.counts_against`); None when none does. The scheduler's one
        account of nominations, as `NodeState.promised` is the owners'."""
        a = self.arrays()
        if not a.rows.size:
            return None
        counted = admission.counts_against(a.priorities, a.uids, priority, uid)
        if not counted.any():
            return None
        taken = np.zeros((size, len(self.space)), dtype=np.int64)
        np.add.at(taken, a.rows[counted], a.vectors[counted])
        return taken
