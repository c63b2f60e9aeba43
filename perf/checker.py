"""The independent consistency checker (DESIGN.md, "Consistency").

It recomputes everything from the published inputs (nodes' allocatable, pods' effective
requests) and the records read back from the topics (Bindings, terminations), never from the
owners' tables: a run is consistent when no pod uid is bound to two different nodes and at no
time do a node's bound pods (from their Binding until their termination) request more than
its allocatable. Every pod also counts one unit of `pods` (110 per node unless stated).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

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
