"""The contracts: what a plugin is, per extension point, and what it gets to see.

A scheduling cycle for one pod (or one equivalence class of pods, see `runtime`):

    QueueSort -> PreFilter -> Filter -> [PostFilter if nothing fits]
              -> PreScore -> Score (+ normalize) -> Reserve -> Permit -> Bind

Plugins work on whole node axes at once: a Filter returns a boolean mask over the rows it is
given, a Score an int64 array in [0, 100] over them. `rows` is `ALL` (every node:
`slice(None)`, so plugins index views, never copies), a boolean mask or an index array.
Plugins read the shared `ClusterState`; they never write it: the runtime assumes and forgets
claims.

`CycleState` is per-cycle scratch keyed by plugin name: PreFilter / PreScore compute once what
Filter / Score read for every node. A plugin that depends on allocation (what a placement
changes) says so with `DYNAMIC = True` and also answers for one node and the next few pods of
a class in plain Python (`fit_steps`, `score_steps`: numpy's per-call cost dwarfs the
arithmetic on one row); the class path asks only those, only about the node that changed.

A plugin contributes to a pod's equivalence signature with `sign(pod)`; a plugin that cannot
sign a pod returns `UNSIGNABLE`, which sends the pod down the full path. A plugin whose
results depend only on the pod's request vector and priority (always part of the signature)
says `SIGNATURE_FREE = True` instead of signing.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from agents.ports import Output
from agents.scheduler.cluster import ClusterEvent, ClusterState, PodOnNode
from agents.scheduler.framework.status import Status
from agents.state.resources import Vector
from schemas.records import Nomination, Pod

ALL: slice = slice(None)
Rows = slice | npt.NDArray[np.intp]
Mask = npt.NDArray[np.bool_]
Scores = npt.NDArray[np.int64]
MAX_NODE_SCORE = 100
UNSIGNABLE = object()  # a `sign` result: this pod must take the full path


@dataclass(slots=True)
class PodInfo:
    """A pod as the framework handles it: the record plus what the queue and runtime derive."""

    pod: Pod
    request: Vector  # the effective request over the resource space, `pods` included
    columns: npt.NDArray[np.intp]  # the columns the pod requests (non-zero)
    decision_key: str
    attempt: int = 0
    profile: str = ""
    arrival: int = 0  # the queue's arrival order
    group_arrival: int = 0  # arrival of the first pod with the same decision key (its gang)
    derived: dict[str, Any] = field(default_factory=dict)  # per-pod parses, by plugin name
    request_key: bytes = b""  # the request vector's bytes (part of every signature)
    priority: int = 0  # the priority scheduling uses (Koordinator's default when the pod states none)
    qos: str = ""  # Koordinator QoS class (the label, else what the Kubernetes QoS implies)

    @property
    def uid(self) -> str:
        return self.pod.uid



class CycleState:
    """Scratch for one cycle, keyed by plugin name (no globals between plugins)."""

    __slots__ = ("_allocated", "_data", "reservation", "reserved_room", "skip_filter", "skip_score")

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}
        self._allocated: dict[str, tuple[str, ...]] = {}
        self.skip_filter: set[str] = set()
        self.skip_score: set[str] = set()
        # Set by the Reservation plugin: per node, the room a reservation the pod may consume
        # adds (read by NodeResourcesFit), and the uid of the one the placed pod consumes.
        self.reserved_room: npt.NDArray[np.int64] | None = None
        self.reservation = ""

    def write(self, key: str, value: Any) -> None:
        self._data[key] = value

    def read(self, key: str) -> Any:
        return self._data.get(key)

    def allocate(self, plugin: str, devices: tuple[str, ...]) -> None:
        """A Reserve plugin's devices for the pod being placed (replacing its previous ones)."""
        self._allocated[plugin] = devices

    def allocated(self) -> tuple[str, ...]:
        """Every device the pod's Reserve plugins chose, for the Claim."""
        if not self._allocated:
            return ()
        return tuple(d for devices in self._allocated.values() for d in devices)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Why a pod fit nowhere: per filter plugin, the rows it rejected and its reasons."""

    nodes: int
    rejected_by: dict[str, Mask] = field(default_factory=dict)  # first filter to reject a node
    masks: dict[str, Mask] = field(default_factory=dict)  # every filter's verdict per node
    reasons: dict[str, int] = field(default_factory=dict)  # reason -> number of nodes
    unresolvable: frozenset[str] = frozenset()  # plugins whose rejections preemption cannot fix
    status: Status | None = None  # set when a PreFilter rejected the pod outright

    def message(self) -> str:
        if self.status is not None:
            return self.status.message()
        detail = ", ".join(f"{count} {reason}" for reason, count in sorted(self.reasons.items()))
        return f"0/{self.nodes} nodes are available" + (f": {detail}" if detail else "")


@dataclass(frozen=True, slots=True)
class PostFilterResult:
    """Preemption's answer: nominate the pod on `node` once `victims` are gone."""

    nomination: Nomination
    victims: tuple[PodOnNode, ...]


class Plugin(Protocol):
    NAME: ClassVar[str]


@runtime_checkable
class QueueSortPlugin(Plugin, Protocol):
    def sort_key(self, pod: PodInfo) -> tuple[Any, ...]:
        """Smaller keys are popped first. Every profile of a worker uses the same one."""


@runtime_checkable
class PreFilterPlugin(Plugin, Protocol):
    def pre_filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Status:
        """Check the pod and precompute for Filter. SKIP skips this plugin's Filter; a
        rejection fails the pod on every node."""


@runtime_checkable
class FilterPlugin(Plugin, Protocol):
    DYNAMIC: ClassVar[bool]

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Mask:
        """True where the pod may run. Must not write the state."""

    def explain(self, cycle: CycleState, pod: PodInfo, state: ClusterState, failed: Mask) -> dict[str, int]:
        """Reasons for the rows in `failed` (which this plugin rejected), with node counts."""


@runtime_checkable
class DynamicFilterPlugin(FilterPlugin, Protocol):
    def fit_steps(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int, limit: int) -> int:
        """How many more pods like `pod` (up to `limit`) the node takes, one after another, by
        this filter; in plain Python. Must agree with `filter` (the batching property test
        checks it)."""


@runtime_checkable
class TierFilterPlugin(DynamicFilterPlugin, Protocol):
    def fit_steps_rows(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: npt.NDArray[np.intp],
                       limit: int) -> npt.NDArray[np.int64]:
        """`fit_steps` for many nodes at once (numpy), each as if only it took the pods: a pod
        placed on one node must not change what another takes."""


@runtime_checkable
class PostFilterPlugin(Plugin, Protocol):
    def post_filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState,
                    diagnosis: Diagnosis) -> PostFilterResult | None:
        """Called when no node fits; may nominate the pod somewhere (preemption)."""


@runtime_checkable
class PreScorePlugin(Plugin, Protocol):
    def pre_score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Mask) -> Status:
        """Precompute for Score; SKIP skips this plugin's Score for the cycle."""


@runtime_checkable
class ScorePlugin(Plugin, Protocol):
    DYNAMIC: ClassVar[bool]
    NORMALIZES: ClassVar[bool]

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Scores:
        """Raw scores over `rows` (int64). Scores of plugins that do not normalize are in
        [0, MAX_NODE_SCORE] already."""

    def normalize(self, cycle: CycleState, raw: Scores, feasible: Mask) -> Scores:
        """Map raw scores (over all rows) to [0, MAX_NODE_SCORE], judging by feasible rows only.
        Called only when NORMALIZES is true."""


@runtime_checkable
class DynamicScorePlugin(ScorePlugin, Protocol):
    def score_steps(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int, steps: int) -> list[int]:
        """The node's score for the next pod like `pod`, then for the one after (if the first
        went there too), ... `steps` of them, in plain Python. Must agree with `score`."""


@runtime_checkable
class TierScorePlugin(DynamicScorePlugin, Protocol):
    def score_steps_rows(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: npt.NDArray[np.intp],
                         steps: int) -> Scores:
        """`score_steps` for many nodes at once (numpy): rows x steps, each node as if only it
        took the pods. Must agree with `score`."""


@runtime_checkable
class ReservePlugin(Plugin, Protocol):
    def reserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> Status:
        """Claim what the pod takes on `row` beyond its resource vector (the runtime assumes that).
        Not called when the plugin's PreFilter returned SKIP for the cycle."""

    def unreserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> None:
        """Undo `reserve`. Must be idempotent: it may run for a pod that was never reserved."""


@runtime_checkable
class PermitPlugin(Plugin, Protocol):
    def permit(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> Status:
        """SUCCESS lets the pod bind; WAIT holds it (reserved) until allowed, rejected or timed
        out; a rejection unreserves it."""


@runtime_checkable
class BindPlugin(Plugin, Protocol):
    def bind(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> list[Output] | None:
        """The records that bind the pod (a Claim into the commit protocol), or None to pass
        to the next Bind plugin."""


@runtime_checkable
class RunBindPlugin(BindPlugin, Protocol):
    def bind_run(self, cycle: CycleState, pods: Sequence[PodInfo], state: ClusterState, row: int) -> list[list[Output]]:
        """`bind` for pods of one class placed on `row` together (a profile's only Bind
        plugin): each pod's records, in order."""


@runtime_checkable
class SignPlugin(Plugin, Protocol):
    def sign(self, pod: PodInfo) -> Hashable:
        """This plugin's part of the pod's equivalence signature, or UNSIGNABLE."""


@runtime_checkable
class EventsPlugin(Plugin, Protocol):
    EVENTS: ClassVar[ClusterEvent]  # the cluster events after which a pod it rejected may fit
