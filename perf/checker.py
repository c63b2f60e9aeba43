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
