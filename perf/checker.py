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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

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
    "node/device" -> the first violation. A pod counts from its Binding until its termination."""
    events: list[tuple[float, int, Any]] = [(p.time, 1, p) for p in placements]
    events += [(t.time, 0, t) for t in terminations]
    events.sort(key=lambda e: (e[0], e[1]))
    live: dict[tuple[str, str], DevicePlacement] = {}
    used: dict[tuple[str, str], int] = {}
    out: dict[str, str] = {}
    for _, is_bind, p in events:
        if is_bind:
            if (p.uid, p.node) in live:
                continue  # the same binding read twice
            live[(p.uid, p.node)] = p
            for device, amount in p.amounts:
                total = used[(p.node, device)] = used.get((p.node, device), 0) + amount
                limit = capacity.get(p.node, {}).get(device, 0)
                if total > limit and f"{p.node}/{device}" not in out:
                    out[f"{p.node}/{device}"] = f"{total} > {limit} after {p.uid}"
        else:
            bound = live.pop((p.uid, p.node), None)
            for device, amount in bound.amounts if bound else ():
                used[(p.node, device)] -= amount
    return out


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
    events: list[tuple[float, int, Placement]] = []
    for b in bindings:
        if b.node in bound_to.setdefault(b.uid, set()):
            continue  # the same binding read twice is one binding
        bound_to[b.uid].add(b.node)
        events.append((b.time, 1, b))
    for t in terminations:
        events.append((t.time, 0, t))  # at equal times, frees before binds
    events.sort(key=lambda e: (e[0], e[1]))
    used: dict[str, dict[str, int]] = {}
    live: set[tuple[str, str]] = set()
    overcommitted: dict[str, str] = {}
    for _, is_bind, p in events:
        request = dict(requests.get(p.uid, {}))
        request["pods"] = max(request.get("pods", 0), 1)
        node_used = used.setdefault(p.node, {})
        if is_bind:
            live.add((p.uid, p.node))
            for name, amount in request.items():
                node_used[name] = node_used.get(name, 0) + amount
            limit = dict(allocatable.get(p.node, {}))
            limit.setdefault("pods", DEFAULT_MAX_PODS)
            for name, amount in node_used.items():
                if amount > limit.get(name, 0) and p.node not in overcommitted:
                    overcommitted[p.node] = f"{name}: {amount} > {limit.get(name, 0)} after {p.uid}"
        elif (p.uid, p.node) in live:
            live.discard((p.uid, p.node))
            for name, amount in request.items():
                node_used[name] -= amount
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
