"""Actionable feedback for sandboxes that cannot be placed: what an agent that heals itself
needs beside kube-scheduler's message (`0/N nodes are available: ...`).

For a sandbox (`runtimes.is_sandbox`) that fails, the scheduler core asks the `Advisor` for a
`Hint`: a `reason` code, the `next_step`, `retry_after_s` and `alternatives`, each true for
this cluster right now because the core checked it, with the same profile's filters over the
same cluster state, before it is offered (`Probe.place`: the changed pod must place
somewhere):

- QoSClass: another Koordinator QoS class its runtime allows (an LSR pod whose NUMA-bound
  CPUs are gone may run as LS);
- RuntimeClass: another runtime of the table (re-admitted through it: its overhead, selector
  and tolerations instead of the pod's own runtime's; `RuntimeTable.rerun`), three at most;
- SmallerRequest: the largest share of the pod's cpu and memory that places it: per node the
  share its free capacity leaves (numpy, over the nodes that pass every filter that does not
  depend on allocation), the largest tried through the core first, else, with the core as
  judge of what totals miss (NUMA cells, whole cores), one CPU less at a time for a pod whose
  CPUs are bound, a short bisection down to a tenth for others; cpu rounded down to 10m (whole
  CPUs for a pod whose CPUs are bound), memory to MiB, limits scaled alike; the runtime's
  overhead is fixed and never shrinks;
- ScaleWarmPool: only for a pod of a warm pool (`SANDBOX_POOL_LABEL`): the pool holds this many
  pods placed and the core placed no more: scale it to that, or the pods it adds wait;
- Wait: when enough capacity is expected to free (`retry_after_s`). Each replica learns how long
  sandboxes live from what it sees (`Lifetimes`: a bound sandbox's commit to its termination,
  on the injected clock); for each sandbox running on a node the pod could use, its expected
  time left is the median of the observed lifetimes longer than its age, less its age (none
  when it outlived them all); freeing them in that order, the first moment a node has room
  for the pod by totals is the estimate. Fewer than `MIN_OBSERVED` lifetimes: no estimate.

The order of the alternatives is the order above (the least change first); the next step is
the first one's (`NEXT_STEP`), else Wait with an estimate, else FixPod for a pod refused or
rejected by a PreFilter (only a change of the pod helps) and AddCapacity for the others.
Refused pods (their runtime class refused them, `runtimes.AdmissionError`) and pods a
PreFilter rejects get the QoS and runtime alternatives only. The core asks for a hint
(`SchedulerCore._hint`, `SchedulerCore.advise`); the advisor asks the core back (`Probe`).

Cost: hints are computed only for sandboxes that failed, and once per equivalence class per
batch: the core keys each by the pod's scheduling signature (or its whole shape) with what
the alternatives depend on, and the cache is emptied when a batch starts and when the cluster
changes (`Advisor.new_batch`); `Advisor.computed` counts what was really computed.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from agents.ports import Clock
from agents.sandbox.runtimes import (
    RUNTIME_CLASS_NOT_FOUND,
    AdmissionError,
    RuntimeTable,
    with_overhead,
)
from agents.scheduler import koordinator
from agents.state.cpus import BOUND_QOS
from schemas.errors import FieldError
from schemas.quantity import format_canonical, to_canonical
from schemas.records import (
    QOS_LABEL,
    SANDBOX_POOL_LABEL,
    Alternative,
    ContainerResources,
    Pod,
    ResourceList,
)

# Alternative kinds, and the next step each one is.
QOS_CLASS, RUNTIME_CLASS, SMALLER_REQUEST, SCALE_WARM_POOL, WAIT = (
    "QoSClass", "RuntimeClass", "SmallerRequest", "ScaleWarmPool", "Wait")
NEXT_STEP = {QOS_CLASS: "ChangeQoSClass", RUNTIME_CLASS: "ChangeRuntimeClass", SMALLER_REQUEST: "ShrinkRequest",
             SCALE_WARM_POOL: "ScaleWarmPool", WAIT: "Wait"}
FIX_POD, ADD_CAPACITY = "FixPod", "AddCapacity"  # next steps when nothing else would do
# Reasons of pods that were not refused (the refused carry their AdmissionError's code).
INSUFFICIENT, NO_MATCHING_NODE, UNRESOLVABLE, INVALID = (
    "InsufficientResources", "NoMatchingNode", "Unresolvable", "InvalidPod")

QOS_PATH = f"metadata.labels.{QOS_LABEL}"
RUNTIME_PATH = "spec.runtimeClassName"
SANDBOX_QOS = ("LSR", "LS", "BE")  # tried for a sandbox without a runtime class
SCALED = ("cpu", "memory")  # what a smaller request shrinks
MIN_FRACTION = 0.1  # a smaller request below a tenth of the pod's is not offered
SEARCH_STEPS = 5  # shares the core judges when the largest by totals does not place
MIN_OBSERVED = 5  # lifetimes needed before a wait is estimated
RUNTIMES_OFFERED = 3  # runtime classes offered at most (the first that place, by name)
_GRAIN = {"cpu": 10, "memory": 2**20}
_RESOURCE_PATH = re.compile(r"^spec\.(containers|initContainers)\[(\d+)\]\.resources\.(requests|limits)\.(.+)$")

Vector = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Hint:
    """What a failed sandbox's SchedulingFeedback carries beside the message."""

    reason: str
    next_step: str
    retry_after_s: float | None = None
    alternatives: tuple[Alternative, ...] = ()


@dataclass(frozen=True)
class Capacity:
    """The cluster as one failed pod sees it: the nodes that pass every filter of its profile
    that does not depend on allocation, their free capacity, the pod's request and overhead
    (vectors over `columns`), and the sandboxes running there (`running_rows` index `nodes`)."""

    nodes: list[str]
    free: npt.NDArray[np.int64]  # [nodes x resources]
    request: Vector
    overhead: Vector
    columns: Mapping[str, int]
    running_rows: npt.NDArray[np.intp] = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    running_vectors: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    running_uids: tuple[str, ...] = ()


class Probe(Protocol):
    """What the advisor asks the scheduling core (`SchedulerCore` answers)."""

    def place(self, pod: Pod) -> str:
        """The node the pod's profile would place it on now ("" for none, or for a pod the core
        cannot take at all). Changes nothing."""

    def capacity(self, pod: Pod) -> Capacity | None:
        """The pod's `Capacity`, None when a PreFilter rejects it outright."""

    def pool_size(self, pool: str) -> int:
        """How many pods of warm pool `pool` are bound."""


class Lifetimes:
    """How long sandboxes live, as one replica sees them: from the report of a sandbox's commit
    to the report of its termination, on the core's injected clock (deterministic given it).
    A sandbox first seen in the nodes' current state at start-up (`known=False`) counts from
    then: its age is a lower bound (estimates err late) and its end is no observation. Keeps
    the last `keep` lifetimes, and a start per bound sandbox (forgotten at its end)."""

    def __init__(self, keep: int = 512) -> None:
        self._started: dict[str, tuple[float, bool]] = {}
        self._observed: deque[float] = deque(maxlen=keep)

    @property
    def running(self) -> int:
        """Bound sandboxes whose start is kept."""
        return len(self._started)

    def start(self, uid: str, now: float, *, known: bool = True) -> None:
        self._started.setdefault(uid, (now, known))

    def end(self, uid: str, now: float) -> None:
        started = self._started.pop(uid, None)
        if started is not None and started[1]:
            self._observed.append(max(0.0, now - started[0]))

    @property
    def observed(self) -> npt.NDArray[np.float64]:
        return np.sort(np.fromiter(self._observed, dtype=np.float64, count=len(self._observed)))

    def ages(self, uids: tuple[str, ...], now: float) -> npt.NDArray[np.float64]:
        """Each sandbox's age (0 for one not seen starting)."""
        return np.array([now - self._started.get(uid, (now, False))[0] for uid in uids], dtype=np.float64)

    def remaining(self, ages: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Expected time left for sandboxes of these ages: the (lower) median of the observed
        lifetimes longer than the age, less the age; NaN where none is longer, or too few
        were observed."""
        lives = self.observed
        out = np.full(len(ages), np.nan)
        if len(lives) < MIN_OBSERVED or not len(ages):
            return out
        first = np.searchsorted(lives, ages, side="right")
        longer = len(lives) - first
        known = longer > 0
        median = lives[np.minimum(first + (longer - 1) // 2, len(lives) - 1)]
        out[known] = (median - ages)[known]
        return out


def wait_estimate(capacity: Capacity, remaining: npt.NDArray[np.float64]) -> tuple[float, str] | None:
    """(seconds, node): the earliest moment a node has room for the pod by totals once the
    sandboxes running there end as `remaining` expects (NaN: never counted); None if never."""
    known = ~np.isnan(remaining)
    if not known.any():
        return None
    rows, vectors, left = capacity.running_rows[known], capacity.running_vectors[known], remaining[known]
    order = np.lexsort((left, rows))  # by node, each node's sandboxes by time left
    rows, vectors, left = rows[order], vectors[order], left[order]
    new_node = np.r_[True, rows[1:] != rows[:-1]]
    totals = np.cumsum(vectors, axis=0)
    before = np.vstack([np.zeros((1, vectors.shape[1]), dtype=np.int64), totals[:-1]])
    freed = totals - before[np.flatnonzero(new_node)][np.cumsum(new_node) - 1]  # freed on its node so far
    fits = (capacity.free[rows] + freed >= capacity.request).all(axis=1)
    if not fits.any():
        return None
    at = np.flatnonzero(fits)[np.argmin(left[fits])]
    return float(left[at]), capacity.nodes[int(rows[at])]


def largest_fractions(capacity: Capacity, scaled: tuple[str, ...] = SCALED) -> npt.NDArray[np.float64]:
    """Per node, the largest share (below 1) of the pod's `scaled` requests, beyond its
    overhead, that its free capacity leaves room for while every other request fits whole;
    -inf where even a sliver does not fit."""
    columns = [capacity.columns[name] for name in scaled if name in capacity.columns]
    need = capacity.request - capacity.overhead
    fixed = capacity.request.copy()
    fixed[columns] = capacity.overhead[columns]
    room = capacity.free - fixed  # what each node leaves for the scaled part
    others_fit = (room >= 0).all(axis=1)
    shares: npt.NDArray[np.float64] = np.full(len(capacity.nodes), np.inf)
    for column in columns:
        if need[column] > 0:
            shares = np.minimum(shares, room[:, column] / need[column])
    shares = np.minimum(shares, np.nextafter(1.0, 0.0))
    shares[~others_fit | ~np.isfinite(shares)] = -np.inf
    return shares


def bound_cpus(pod: Pod) -> bool:
    """The pod's QoS class (Koordinator's default if it states none) is one whose whole CPUs
    NodeNUMAResource binds (LSE, LSR)."""
    try:
        return koordinator.qos_class(pod) in BOUND_QOS
    except ValueError:
        return False


def scale(pod: Pod, share: float) -> dict[str, str]:
    """The changes that shrink the pod's cpu and memory (requests and limits; its runtime's
    overhead aside) to `share`, rounded down (to whole CPUs when its CPUs are bound); {} when
    nothing would be left of one of them."""
    grain = {**_GRAIN, "cpu": 1000} if bound_cpus(pod) else _GRAIN
    changes: dict[str, str] = {}

    def shrink(path: str, amounts: Mapping[str, int]) -> bool:
        for name in SCALED:
            amount = amounts.get(name, 0)
            if amount:
                smaller = int(amount * share + 1e-6) // grain[name] * grain[name]  # (k/n * n is k)
                if smaller <= 0:
                    return False
                changes[f"{path}.{name}"] = f"{smaller // 2**20}Mi" if name == "memory" else format_canonical(name, smaller)
        return True

    if not pod.containers and not pod.init_containers:
        bare = with_overhead(pod, {}) if pod.overhead else pod
        return changes if shrink("requests", bare.requests) else {}
    for kind, containers in (("containers", pod.containers), ("initContainers", pod.init_containers)):
        for i, c in enumerate(containers):
            for part in ("requests", "limits"):
                if not shrink(f"spec.{kind}[{i}].resources.{part}", getattr(c, part)):
                    return {}
    return changes


def apply(pod: Pod, changes: Mapping[str, str], runtimes: RuntimeTable) -> Pod:
    """The pod (as it was sent) with an alternative's `changes` made, admitted through its
    runtime class again (a new runtime class through `RuntimeTable.rerun`): the pod the
    alternative offers. Raises AdmissionError or ValueError."""
    containers = [list(pod.containers), list(pod.init_containers)]
    requests = None
    for path, value in changes.items():
        match = _RESOURCE_PATH.match(path)
        if match:
            kind, index, part, name = match.groups()
            group = containers[kind == "initContainers"]
            c = group[int(index)]
            amounts = ResourceList({**getattr(c, part), name: to_canonical(name, value, path)})
            group[int(index)] = (dataclasses.replace(c, requests=amounts) if part == "requests"
                                 else dataclasses.replace(c, limits=amounts))
        elif path.startswith("requests."):
            if requests is None:
                requests = ResourceList((with_overhead(pod, {}) if pod.overhead else pod).requests)
            name = path.removeprefix("requests.")
            requests[name] = to_canonical(name, value, path)
        elif path not in (QOS_PATH, RUNTIME_PATH):
            raise ValueError(f"{path}: not a change an alternative makes")
    changed = dataclasses.replace(pod, containers=tuple(containers[0]), init_containers=tuple(containers[1]))
    if changed.containers or changed.init_containers:
        changed = with_overhead(changed, changed.overhead)
    elif requests is not None:
        changed = dataclasses.replace(changed, overhead=ResourceList(), requests=requests)
    runtime, qos = changes.get(RUNTIME_PATH, pod.runtime_class_name), changes.get(QOS_PATH, "")
    if runtime != pod.runtime_class_name:
        return runtimes.rerun(changed, runtime, qos)
    if qos:
        changed = dataclasses.replace(changed, labels={**changed.labels, QOS_LABEL: qos}, qos_class=qos)
    return runtimes.admit(changed)


class Advisor:
    """Hints for failed sandboxes (see the module docstring), cached per key until the next
    batch or cluster change."""

    def __init__(self, probe: Probe, runtimes: RuntimeTable, lifetimes: Lifetimes, clock: Clock) -> None:
        self.probe = probe
        self.runtimes = runtimes
        self.lifetimes = lifetimes
        self.clock = clock
        self.computed = 0
        self._cache: dict[Hashable, Hint] = {}

    def new_batch(self) -> None:
        """A batch starts or the cluster changed: hints are computed afresh."""
        self._cache.clear()

    def hint(self, key: Hashable, pod: Pod, sent: Pod, *, refusal: FieldError | None = None,
             reasons: Mapping[str, int] | None = None, unresolvable: bool = False) -> Hint:
        """The hint for a failed sandbox: `pod` as the core had it (admitted), `sent` as it
        came; `refusal` when it was refused, `reasons` (kube-scheduler's, with node counts)
        when no node fit, `unresolvable` when a PreFilter rejected it. Equal keys share one."""
        known = self._cache.get(key)
        if known is not None:
            return known
        self.computed += 1
        insufficient = any(r.startswith("Insufficient") for r in reasons or ())
        if refusal is not None:
            reason = refusal.code if isinstance(refusal, AdmissionError) else INVALID
        else:
            reason = UNRESOLVABLE if unresolvable else INSUFFICIENT if insufficient else NO_MATCHING_NODE
        alternatives = self._qos(pod, sent, refusal) + self._runtimes(sent)
        retry_after: float | None = None
        if refusal is None and not unresolvable:
            capacity = self.probe.capacity(pod) if insufficient else None
            if capacity is not None:
                alternatives += self._smaller(sent, capacity)
            pool = sent.labels.get(SANDBOX_POOL_LABEL)
            if pool:
                placed = self.probe.pool_size(pool)
                alternatives.append(Alternative(SCALE_WARM_POOL, (
                    f"warm pool {pool} has {placed} pods placed and no more fit now: scale it to {placed}, "
                    "or the pods it adds wait"), {"pool": pool, "replicas": str(placed)}))
            if capacity is not None and len(capacity.running_uids):
                left = self.lifetimes.remaining(self.lifetimes.ages(capacity.running_uids, self.clock()))
                estimate = wait_estimate(capacity, left)
                if estimate is not None:
                    retry_after = float(max(1, math.ceil(estimate[0])))
                    alternatives.append(Alternative(WAIT, (
                        f"wait about {retry_after:g}s: by then sandboxes running on {estimate[1]} are expected to "
                        "have ended, leaving room for it")))
        next_step = NEXT_STEP[alternatives[0].kind] if alternatives else FIX_POD if refusal is not None or \
            unresolvable else ADD_CAPACITY
        hint = self._cache[key] = Hint(reason, next_step, retry_after, tuple(alternatives))
        return hint

    def _offer(self, sent: Pod, kind: str, changes: dict[str, str], what: str) -> Alternative | None:
        try:
            node = self.probe.place(apply(sent, changes, self.runtimes))
        except ValueError:  # AdmissionError included: the change does not make a pod that can run
            return None
        return Alternative(kind, f"{what}: it would be placed on {node} now", changes) if node else None

    def _qos(self, pod: Pod, sent: Pod, refusal: FieldError | None) -> list[Alternative]:
        """Other QoS classes its runtime allows (every sandbox class when it names none)."""
        if isinstance(refusal, AdmissionError) and refusal.code == RUNTIME_CLASS_NOT_FOUND:
            return []
        rc = self.runtimes.get(sent.runtime_class_name)
        current = pod.labels.get(QOS_LABEL) or pod.qos_class
        out = []
        for qos in (rc.qos_classes if rc is not None and rc.qos_classes else SANDBOX_QOS):
            offer = None if qos == current else self._offer(sent, QOS_CLASS, {QOS_PATH: qos}, f"run it as QoS {qos}")
            if offer is not None:
                out.append(offer)
        return out

    def _runtimes(self, sent: Pod) -> list[Alternative]:
        """Other runtime classes that would place it (the first `RUNTIMES_OFFERED` by name): as
        the QoS class it asked for, else as that runtime's default."""
        out = []
        asked = sent.labels.get(QOS_LABEL) or sent.qos_class
        for name in self.runtimes.names:
            if name == sent.runtime_class_name:
                continue
            rc = self.runtimes.classes[name]
            changes = {RUNTIME_PATH: name}
            if asked and rc.qos_classes and asked not in rc.qos_classes:
                changes[QOS_PATH] = rc.default_qos_class
            offer = self._offer(sent, RUNTIME_CLASS, changes, f"run it in RuntimeClass {name}" + (
                f" as QoS {changes[QOS_PATH]}" if QOS_PATH in changes else ""))
            if offer is not None:
                out.append(offer)
                if len(out) == RUNTIMES_OFFERED:
                    break
        return out

    def _smaller(self, sent: Pod, capacity: Capacity) -> list[Alternative]:
        """The largest share of its cpu and memory that places it: the largest the nodes' free
        capacity leaves (numpy, by totals) if the core places that; else, with the core as the
        judge of what totals miss (NUMA cells, whole cores, devices), one whole CPU less at a
        time for a pod whose CPUs are bound, and a bisection down to a tenth for others."""
        shares = largest_fractions(capacity)
        top = float(shares.max()) if len(shares) else -np.inf
        if top < MIN_FRACTION:
            return []
        judged: dict[tuple[tuple[str, str], ...], Alternative | None] = {}

        def judge(share: float) -> Alternative | None:
            changes = scale(sent, share)
            key = tuple(sorted(changes.items()))
            if key not in judged:
                judged[key] = self._offer(sent, SMALLER_REQUEST, changes, f"ask for {share:.0%} of its cpu and "
                                          "memory") if changes else None
            return judged[key]

        best = judge(top)
        asked = (with_overhead(sent, {}) if sent.overhead else sent).requests.get("cpu", 0)
        if best is None and bound_cpus(sent) and asked % 1000 == 0:
            whole = asked // 1000
            for count in range(min(int(top * whole), whole - 1), 0, -1)[:SEARCH_STEPS]:
                best = judge(count / whole)
                if best is not None:
                    break
        elif best is None:
            low, high = MIN_FRACTION, top
            for _ in range(SEARCH_STEPS):
                middle = (low + high) / 2
                offer = judge(middle)
                low, high, best = (middle, high, offer) if offer is not None else (low, middle, best)
        return [best] if best is not None else []


def shape(pod: Pod) -> Hashable:
    """What of a pod the alternatives depend on beyond its scheduling signature: its runtime,
    QoS class, warm pool, overhead and containers' requests and limits."""
    def amounts(cs: tuple[ContainerResources, ...]) -> tuple[Hashable, ...]:
        return tuple((tuple(c.requests.items()), tuple(c.limits.items())) for c in cs)

    return (pod.runtime_class_name, pod.labels.get(QOS_LABEL) or pod.qos_class, pod.labels.get(SANDBOX_POOL_LABEL),
            tuple(pod.overhead.items()), amounts(pod.containers), amounts(pod.init_containers))
