"""The independent consistency checker (DESIGN.md, "Consistency").

It recomputes everything from the published inputs (nodes' allocatable, pods' effective
requests) and the records read back from the topics (Bindings, terminations), never from the
owners' tables: a run is consistent when no pod uid is bound to two different nodes and at no
time do a node's bound pods (from their Binding until their termination) request more than
its allocatable. Every pod also counts one unit of `pods` (110 per node unless stated).
Devices are checked the same way, GPU by GPU and NIC by NIC, from the Bindings' device
results (`devices_overcommitted`), and gangs for partial binding (`partial_gangs`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agents.state.devices import GPU_CORE, GPU_RATIO, RDMA

DEFAULT_MAX_PODS = 110


@dataclass(frozen=True)
class Placement:
    time: float
    uid: str
    node: str


@dataclass
class CheckResult:
    pods_total: int
    pods_bound: int
    pods_unschedulable: int
    pods_double_bound: int
    nodes_overcommitted: int
    overcommitted: dict[str, str] = field(default_factory=dict)  # node -> first violation

    @property
    def consistent(self) -> bool:
        return self.pods_double_bound == 0 and self.nodes_overcommitted == 0


@dataclass(frozen=True)
class DevicePlacement:
    """What one Binding took of a node's devices: per device (`gpu/<minor>/core`,
    `gpu/<minor>/ratio`, `rdma/<minor>/vfs`), the amount, from its device-allocated annotation."""

    time: float
    uid: str
    node: str
    amounts: tuple[tuple[str, int], ...]


P = TypeVar("P", Placement, DevicePlacement)


def device_amounts(annotation: str) -> tuple[tuple[str, int], ...]:
    """Per device, what a `scheduling.koordinator.sh/device-allocated` annotation takes."""
    if not annotation:
        return ()
    raw = json.loads(annotation)
    out: list[tuple[str, int]] = []
    for gpu in raw.get("gpu", ()):
        resources = gpu.get("resources", {})
        out.append((f"gpu/{gpu['minor']}/core", int(resources.get(GPU_CORE, 0))))
        out.append((f"gpu/{gpu['minor']}/ratio", int(resources.get(GPU_RATIO, 0))))
    for nic in raw.get("rdma", ()):
        out.append((f"rdma/{nic['minor']}/vfs", int(nic.get("resources", {}).get(RDMA, 0))))
    return tuple(out)


def devices_overcommitted(capacity: Mapping[str, Mapping[str, int]], placements: Iterable[DevicePlacement],
                          terminations: Iterable[Placement] = ()) -> dict[str, str]:
    """Devices that, at some moment, held more than their capacity (`capacity`: node -> device
    -> amount, keyed like `DevicePlacement.amounts`), GPU by GPU and NIC by NIC; returns
    "node/device" -> the first violation. A pod counts from its Binding until its termination
    (`timeline`)."""
    used: dict[tuple[str, str], int] = {}
    out: dict[str, str] = {}
    for bound, p in timeline(placements, terminations):
        for device, amount in p.amounts:
            total = used[(p.node, device)] = used.get((p.node, device), 0) + (amount if bound else -amount)
            limit = capacity.get(p.node, {}).get(device, 0)
            if bound and total > limit and f"{p.node}/{device}" not in out:
                out[f"{p.node}/{device}"] = f"{total} > {limit} after {p.uid}"
    return out


def timeline(bindings: Iterable[P], terminations: Iterable[Placement]) -> Iterator[tuple[bool, P]]:
    """(True, binding) when a pod starts to count on its node, (False, that binding) when it
    stops, in time order. The same binding read twice is one. At equal times frees come
    before binds (a pod terminated at the moment another is bound made room for it); a
    termination read before its pod's binding on that node (the decider sends both in one
    batch when the pod was deleted while its hold waited: the owner commits, then terminates,
    so the pod was never counted past that moment) ends the pod right after that binding."""
    events: list[tuple[float, int, Any]] = []
    seen: set[tuple[str, str]] = set()
    for b in bindings:
        if (b.uid, b.node) not in seen:
            seen.add((b.uid, b.node))
            events.append((b.time, 1, b))
    events += [(t.time, 0, t) for t in terminations]
    events.sort(key=lambda e: (e[0], e[1]))
    live: dict[tuple[str, str], P] = {}
    ended: set[tuple[str, str]] = set()  # terminations read before their binding
    for _, is_bind, p in events:
        key = (p.uid, p.node)
        if is_bind:
            yield True, p
            if key in ended:
                ended.discard(key)
                yield False, p
            else:
                live[key] = p
        elif key in live:
            yield False, live.pop(key)
        else:
            ended.add(key)


def partial_gangs(members: Mapping[str, tuple[int, Iterable[str]]], bound: Iterable[str]) -> list[str]:
    """Gangs (name -> (min-available, member uids)) with some members bound, but fewer than
    min-available of them."""
    bound_set = set(bound)
    return sorted(name for name, (minimum, uids) in members.items()
                  if 0 < len(bound_set.intersection(uids)) < minimum)


def check(
    allocatable: Mapping[str, Mapping[str, int]],
    requests: Mapping[str, Mapping[str, int]],
    bindings: Iterable[Placement],
    terminations: Iterable[Placement] = (),
    unschedulable: Iterable[str] = (),
    counted: Iterable[str] | None = None,
) -> CheckResult:
    """`counted` limits the pod counts (total, bound, unschedulable) to those uids; the
    consistency checks always cover every binding."""
    bound_to: dict[str, set[str]] = {}
    bindings = list(bindings)
    for b in bindings:
        bound_to.setdefault(b.uid, set()).add(b.node)
    used: dict[str, dict[str, int]] = {}
    overcommitted: dict[str, str] = {}
    for is_bind, p in timeline(bindings, terminations):
        request = dict(requests.get(p.uid, {}))
        request["pods"] = max(request.get("pods", 0), 1)
        node_used = used.setdefault(p.node, {})
        sign = 1 if is_bind else -1
        for name, amount in request.items():
            node_used[name] = node_used.get(name, 0) + sign * amount
        if is_bind:
            limit = dict(allocatable.get(p.node, {}))
            limit.setdefault("pods", DEFAULT_MAX_PODS)
            for name, amount in node_used.items():
                if amount > limit.get(name, 0) and p.node not in overcommitted:
                    overcommitted[p.node] = f"{name}: {amount} > {limit.get(name, 0)} after {p.uid}"
    bound = {uid for uid, nodes in bound_to.items() if nodes}
    pods = set(requests) if counted is None else set(counted)
    return CheckResult(
        pods_total=len(pods),
        pods_bound=len(bound & pods),
        pods_unschedulable=len((set(unschedulable) & pods) - bound),
        pods_double_bound=sum(1 for nodes in bound_to.values() if len(nodes) > 1),
        nodes_overcommitted=len(overcommitted),
        overcommitted=overcommitted,
    )


def quotas_overcommitted(
    limits: Mapping[str, Mapping[str, int]],
    quota_of: Mapping[str, str],
    requests: Mapping[str, Mapping[str, int]],
    bindings: Iterable[Placement],
    ends: Iterable[tuple[float, str]],
) -> list[str]:
    """Elastic quotas whose committed usage went over their max: one line per Binding that took
    its quota (`quota_of`: pod uid -> quota name) over a limit of `limits` (quota -> resource
    -> max), replaying the committed Bindings and the pods' ends (`ends`: (time, uid) of each
    termination and deletion) in time order. A pod counts against its quota from its first
    Binding until its first end; a Binding read again, or read after its pod ended (a pod
    deleted while its hold waited: the decider binds and terminates it in one batch, it never
    ran), counts nothing. At equal times ends come first (a pod gone at the moment another is
    bound made room for it)."""
    events: list[tuple[float, int, str]] = [(b.time, 1, b.uid) for b in bindings if b.uid in quota_of]
    events += [(t, 0, uid) for t, uid in ends if uid in quota_of]
    events.sort(key=lambda e: (e[0], e[1]))
    counted: set[str] = set()
    ended: set[str] = set()
    used: dict[str, dict[str, int]] = {}
    out: list[str] = []
    for ts, is_bind, uid in events:
        quota = quota_of[uid]
        usage = used.setdefault(quota, {})
        if is_bind:
            if uid in counted or uid in ended:
                continue
            counted.add(uid)
            sign = 1
        else:
            if uid in ended:
                continue
            ended.add(uid)
            if uid not in counted:
                continue
            sign = -1
        for name, amount in requests.get(uid, {}).items():
            usage[name] = usage.get(name, 0) + sign * amount
        if is_bind:
            over = [f"{name} {usage.get(name, 0)} > {limit}" for name, limit in sorted(limits.get(quota, {}).items())
                    if usage.get(name, 0) > limit]
            if over:
                out.append(f"{quota}: {', '.join(over)} after {uid} at {ts:.3f}")
    return out


@dataclass(frozen=True)
class BudgetSpec:
    """A PodDisruptionBudget as the checker reads it: pods of `namespace` whose labels include
    `match_labels`; one of `min_available` and `max_unavailable` (an integer, or "N%")."""

    key: str
    namespace: str
    match_labels: Mapping[str, str]
    min_available: int | str | None = None
    max_unavailable: int | str | None = None

    def covers(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return namespace == self.namespace and all(labels.get(k) == v for k, v in self.match_labels.items())

    def desired_healthy(self, expected: int) -> int:
        """The PDB controller's desiredHealthy for `expected` pods (percentages round up)."""
        def amount(value: int | str) -> int:
            return math.ceil(expected * int(value[:-1]) / 100) if isinstance(value, str) else value

        if self.max_unavailable is not None:
            return max(0, expected - amount(self.max_unavailable))
        if self.min_available is not None:
            return amount(self.min_available)
        return expected


@dataclass(frozen=True)
class PodSeen:
    """One pod event as the outside sees it on the topics: a pod's version (`pods`: its
    namespace and labels, healthy when Running on a node) or its end (`gone`: a termination at
    its node or a deletion)."""

    time: float
    uid: str
    namespace: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    healthy: bool = False
    gone: bool = False


@dataclass(frozen=True)
class BudgetViolation:
    budget: str
    samples: int  # samples with fewer healthy pods than desired
    lowest: int  # the fewest healthy pods seen while below
    first: str  # the first sample below, described


def pdb_violations(budgets: Iterable[BudgetSpec], events: Iterable[PodSeen], sample_s: float = 0.25,
                   until: float | None = None) -> list[BudgetViolation]:
    """PodDisruptionBudgets whose healthy pods fell below their desired healthy count, from the
    outside: the pod events replayed in time order, sampled every `sample_s` from the first
    event to `until` (default: the last). Per budget, expected = its covered pods that exist
    (created, not gone), healthy = those Running on a node; desired = `desired_healthy`. A
    budget is judged once it has been satisfied (healthy >= desired, some pod expected): before
    that its pods are still starting. A pod gone stays gone (a late version of it is not a pod
    again), and a healthy pod stays healthy until it goes. A dip shorter than a sample counts
    as one sample."""
    specs = {b.key: b for b in budgets}
    ordered = sorted(events, key=lambda e: e.time)
    if not ordered:
        return []
    t0 = ordered[0].time
    end = ordered[-1].time if until is None else max(until, ordered[-1].time)
    covered: dict[str, tuple[str, ...]] = {}  # pod uid -> the budgets covering it
    pods: dict[str, set[str]] = {key: set() for key in specs}  # budget -> its pods that exist
    healthy: dict[str, set[str]] = {key: set() for key in specs}
    gone: set[str] = set()
    satisfied: set[str] = set()
    below_since: dict[str, float] = {}
    samples: dict[str, int] = {}
    lowest: dict[str, int] = {}
    first: dict[str, str] = {}

    def grid(t: float) -> int:  # samples before t
        return math.ceil((t - t0) / sample_s - 1e-9)

    def close(key: str, t: float) -> None:
        since = below_since.pop(key)
        samples[key] = samples.get(key, 0) + max(1, grid(t) - grid(since))

    i = 0
    while i < len(ordered):
        ts = ordered[i].time
        touched: set[str] = set()
        while i < len(ordered) and ordered[i].time == ts:
            e = ordered[i]
            i += 1
            if e.uid in gone:
                continue
            keys = covered.get(e.uid)
            if keys is None:
                if e.gone:
                    continue
                keys = covered[e.uid] = tuple(k for k, b in specs.items() if b.covers(e.namespace, e.labels))
            touched.update(keys)
            for key in keys:
                if e.gone:
                    pods[key].discard(e.uid)
                    healthy[key].discard(e.uid)
                else:
                    pods[key].add(e.uid)
                    if e.healthy:
                        healthy[key].add(e.uid)
            if e.gone:
                gone.add(e.uid)
        for key in touched:
            expected, up = len(pods[key]), len(healthy[key])
            desired = specs[key].desired_healthy(expected)
            if key not in satisfied:
                if expected and up >= desired:
                    satisfied.add(key)
                continue
            if up < desired:
                lowest[key] = min(lowest.get(key, up), up)
                first.setdefault(key, f"healthy {up} < desired {desired} of {expected} at {ts:.3f}")
                below_since.setdefault(key, ts)
            elif key in below_since:
                close(key, ts)
    for key in list(below_since):
        close(key, end)
    return [BudgetViolation(key, samples[key], lowest[key], first[key]) for key in sorted(samples)]
