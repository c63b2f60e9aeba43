"""FragmentationAware (Koordinator's plugin, its names and defaults): move running pods so that
each node's allocation is even across resources, and capacity is not stranded.

A node's imbalance is BalancedAllocation's std of requested / allocatable over `resources`
(default cpu and memory), all of its pods counted. Nodes above `imbalanceThreshold` (0.15)
are sources. Two planners, chosen by `mode`:

- `koordinator`, the baseline, as Koordinator documents its plugin: for each source node
  (most imbalanced first), the one evictable pod whose removal lowers the node's std most,
  if by at least `minImprovementThreshold` (0.02); one pod per node per cycle. With `nodeFit`
  the pod must fit on some other node; its replacement goes where the scheduler puts it.
- `global` (the default): moves across the cluster, one at a time, each the best available:
  for every candidate pod and every node the real scheduling core finds feasible for it
  (`Simulator`), the move's gain is the drop in the summed std of its source and destination;
  a move is taken only when its source's std does not rise, its destination's std (so its
  BalancedAllocation score) does not rise, and the gain is at least `minImprovementThreshold`.
  So every move lowers the cluster's summed std and never raises its max. The destination is
  the plan's, and the move's reservation is pinned to it. Capacity freed by a planned eviction
  is not counted until the next cycle, so each destination has room in any order of running.
  A cycle plans from the objective the migrations in flight will leave (their pods off their
  sources, their replacements on their destinations), so what a run reaches does not depend
  on when its cycles fall against its moves.

Both planners skip what the evictor protects, namespaces and pods the args exclude, pods
younger than `minPodAge` or moved within `moveInterval` (no flapping), and moves the
arbitration refuses (`Arbitrator`); each skipped pod is counted by reason in the plan.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from agents.rebalance import arbitration
from agents.rebalance.arbitration import Arbitrator
from agents.rebalance.args import (
    DEFAULT_OBJECTIVE,
    duration_s,
    flag,
    fraction,
    integer,
    resources_from,
)
from agents.rebalance.evictor import EvictorArgs, workload_of
from agents.rebalance.objective import Objective, measure, typical_requests
from agents.rebalance.selectors import LabelSelector, Namespaces, PodSelectors
from agents.rebalance.simulate import NO_PROFILE, Simulator, unsimulated
from agents.rebalance.view import ClusterView
from agents.scheduler.plugins.args import ArgsError, reject_unknown
from agents.scheduler.plugins.noderesources.balanced_allocation import balance_std
from schemas.records import Pod

NAME = "FragmentationAware"
MODES = ("global", "koordinator")
GLOBAL, KOORDINATOR = MODES

NAMESPACE = "namespace not evictable"
SELECTOR = "not matched by podSelectors"
YOUNG = "younger than minPodAge"
RECENT = "moved within moveInterval"
SMALL_GAIN = "improvement below minImprovementThreshold"
NO_FIT = "no other node fits (nodeFit)"
IN_FLIGHT = "a migration of it is in flight or planned"
NODE_WIDE = frozenset({arbitration.PER_NODE})  # refusals that hold for every pod of the source
EPSILON = 1e-12  # what float rounding may add to a std that does not change


@dataclass(frozen=True)
class FragmentationArgs:
    mode: str = GLOBAL
    resources: tuple[str, ...] = DEFAULT_OBJECTIVE
    imbalance_threshold: float = 0.15
    min_improvement_threshold: float = 0.02
    node_fit: bool = True
    node_selector: LabelSelector | None = None
    evictable_namespaces: Namespaces = field(default_factory=Namespaces)
    pod_selectors: PodSelectors = field(default_factory=PodSelectors)
    paused: bool = False
    dry_run: bool = False
    min_pod_age_s: float = 300.0
    move_interval_s: float = 1800.0
    max_moves_per_cycle: int = 0  # 0: only the arbitration limits bound a cycle

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], path: str = "") -> FragmentationArgs:
        reject_unknown(raw, {"mode", "resources", "imbalanceThreshold", "minImprovementThreshold", "nodeFit",
                             "nodeSelector", "evictableNamespaces", "podSelectors", "paused", "dryRun",
                             "minPodAge", "moveInterval", "maxMovesPerCycle"}, path)
        mode = raw.get("mode", GLOBAL)
        if mode not in MODES:
            raise ArgsError(f"{path}mode", mode, f"must be one of {', '.join(MODES)}")
        moves = integer(raw, "maxMovesPerCycle", path, 0, 0) or 0
        selector = raw.get("nodeSelector")
        return cls(
            mode=mode,
            resources=resources_from(raw.get("resources"), f"{path}resources"),
            imbalance_threshold=fraction(raw, "imbalanceThreshold", 0.15, path),
            min_improvement_threshold=fraction(raw, "minImprovementThreshold", 0.02, path),
            node_fit=flag(raw, "nodeFit", True, path),
            node_selector=None if selector is None else LabelSelector.from_mapping(selector, f"{path}nodeSelector"),
            evictable_namespaces=Namespaces.from_mapping(raw.get("evictableNamespaces"), f"{path}evictableNamespaces"),
            pod_selectors=PodSelectors.from_list(raw.get("podSelectors"), f"{path}podSelectors"),
            paused=flag(raw, "paused", False, path),
            dry_run=flag(raw, "dryRun", False, path),
            min_pod_age_s=duration_s(raw.get("minPodAge", 300.0), f"{path}minPodAge"),
            move_interval_s=duration_s(raw.get("moveInterval", 1800.0), f"{path}moveInterval"),
            max_moves_per_cycle=moves,
        )


@dataclass(frozen=True)
class Move:
    """Move one pod off `source`: its replacement is planned on `destination` ("" when no
    node fits and `nodeFit` is off). `gain` is the drop in the cluster's summed std."""

    uid: str
    namespace: str
    name: str
    workload: str
    source: str
    destination: str
    gain: float
    source_std: tuple[float, float]  # before, after
    destination_std: tuple[float, float]

    def as_dict(self) -> dict[str, Any]:
        return {"uid": self.uid, "pod": f"{self.namespace}/{self.name}", "workload": self.workload,
                "from": self.source, "to": self.destination, "gain": round(self.gain, 6),
                "source_std": [round(x, 6) for x in self.source_std],
                "destination_std": [round(x, 6) for x in self.destination_std]}


@dataclass(frozen=True)
class MovePlan:
    mode: str
    moves: tuple[Move, ...]
    before: Objective
    after: Objective  # as planned: every move done, its replacement where planned
    skipped: dict[str, int]  # pods left where they are, by reason
    evaluations: int = 0  # scheduling-core evaluations the plan took


@dataclass
class _Work:
    view: ClusterView
    args: FragmentationArgs
    columns: npt.NDArray[np.intp]
    requested: npt.NDArray[np.int64]  # the objective's view: planned evictions gone, arrivals in
    std: npt.NDArray[np.float64]
    skipped: Counter[str] = field(default_factory=Counter)

    def std_rows(self, rows: npt.NDArray[np.intp] | list[int], requested: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        c = self.columns
        return balance_std(requested[:, c], self.view.allocatable[rows][:, c])

    def move(self, i: int, source: int, destination: int) -> None:
        v = self.view.vectors[i]
        self.requested[source] -= v
        rows = [source]
        if destination >= 0:
            self.requested[destination] += v
            rows.append(destination)
        self.std[rows] = self.std_rows(rows, self.requested[rows])

    def expect(self, in_flight: Sequence[tuple[Pod, str, str]]) -> None:
        """Plan from the objective the migrations in flight will leave, not from the moment's:
        each one's pod gone from its source (if the view still has it there) and its
        replacement on its destination. Otherwise a cycle that runs while the last cycle's moves
        are under way plans them again from their other end (draining a source they are already
        draining, filling a destination they already fill), and what the run reaches depends
        on when its cycles fall. A replacement bound while its job still runs is counted twice
        on its destination until the job ends: that node looks fuller, never emptier."""
        if not in_flight:
            return
        view = self.view
        where = {p.uid: i for i, p in enumerate(view.pods)}
        vectors, sources, destinations = [], [], []
        for pod, source, destination in in_flight:
            i = where.get(pod.uid, -1)
            vectors.append(view.vectors[i] if i >= 0 else view.request_of(pod))
            sources.append(int(view.rows[i]) if i >= 0 and view.nodes[view.rows[i]].name == source else -1)
            destinations.append(view.index.get(destination, -1))
        v = np.array(vectors, dtype=np.int64)
        src, dst = np.array(sources, dtype=np.intp), np.array(destinations, dtype=np.intp)
        leaving, arriving = src >= 0, dst >= 0
        np.subtract.at(self.requested, src[leaving], v[leaving])
        np.add.at(self.requested, dst[arriving], v[arriving])
        rows = np.unique(np.concatenate([src[leaving], dst[arriving]]))
        self.std[rows] = self.std_rows(rows, self.requested[rows])


def _sources(work: _Work) -> list[int]:
    """Source nodes: above the threshold and matched by `nodeSelector`, most imbalanced first."""
    args, view = work.args, work.view
    rows = [int(r) for r in np.flatnonzero(work.std > args.imbalance_threshold)
            if args.node_selector is None or args.node_selector.matches(view.nodes[r].labels)]
    return sorted(rows, key=lambda r: (-work.std[r], r))


def _refusal(pod: Pod, args: FragmentationArgs, evictor: EvictorArgs, now: float, moved_at: Mapping[str, float],
             busy: Collection[str]) -> str:
    if pod.uid in busy:
        return IN_FLIGHT
    why = evictor.refusal(pod, now) or unsimulated(pod)
    if why:
        return why
    if not args.evictable_namespaces.allows(pod.namespace):
        return NAMESPACE
    if not args.pod_selectors.admits(pod.labels):
        return SELECTOR
    if now - pod.creation_timestamp < args.min_pod_age_s:
        return YOUNG
    last = moved_at.get(pod.uid)
    if last is not None and now - last < args.move_interval_s:
        return RECENT
    return ""


def plan_moves(view: ClusterView, args: FragmentationArgs, simulator: Simulator, arbitrator: Arbitrator, *,
               now: float, evictor: EvictorArgs | None = None, moved_at: Mapping[str, float] | None = None,
               in_flight: Sequence[tuple[Pod, str, str]] = ()) -> MovePlan:
    """One cycle's moves by `args.mode`. `arbitrator` counts what is in flight; every planned
    move is admitted into it. `in_flight`: migrations running, as (pod, source, destination);
    their pods are not planned again, their arrivals are the simulator's to know
    (`Simulator.place`), and the global planner plans from the objective they will leave (see
    `_Work.expect`)."""
    columns = view.columns(args.resources)
    typical = typical_requests(view.vectors, columns)
    before = measure(view, columns, typical=typical)
    work = _Work(view, args, columns, view.requested.copy(), view.std(columns))
    if args.paused:
        return MovePlan(args.mode, (), before, before, {"paused": 1})
    if args.mode == GLOBAL:
        work.expect(in_flight)
    planner = _plan_global if args.mode == GLOBAL else _plan_koordinator
    busy = {pod.uid for pod, _, _ in in_flight}
    moves = planner(work, simulator, arbitrator, now, evictor or EvictorArgs(), moved_at or {}, busy)
    after = measure(view, columns, work.requested, typical)
    return MovePlan(args.mode, tuple(moves), before, after, dict(work.skipped), simulator.evaluations)


def _best_row(total: npt.NDArray[np.int64] | None, feasible: npt.NDArray[np.bool_]) -> int:
    """The scheduler's choice among `feasible`: the highest total score, the lowest row on ties."""
    rows = np.flatnonzero(feasible)
    if not len(rows):
        return -1
    if total is None:
        return int(rows[0])
    return int(rows[np.argmax(total[rows])])


def _plan_koordinator(work: _Work, sim: Simulator, arb: Arbitrator, now: float, evictor: EvictorArgs,
                      moved_at: Mapping[str, float], busy: Collection[str]) -> list[Move]:
    view, args = work.view, work.args
    moves: list[Move] = []
    for row in _sources(work):
        if args.max_moves_per_cycle and len(moves) >= args.max_moves_per_cycle:
            break
        candidates = []
        for i in view.pods_on(row):
            why = _refusal(view.pods[i], args, evictor, now, moved_at, busy) or (
                "" if sim.schedules(view.pods[i]) else NO_PROFILE)
            if why:
                work.skipped[why] += 1
            else:
                candidates.append(int(i))
        if not candidates:
            continue
        after = work.std_rows([row] * len(candidates), work.requested[row] - view.vectors[candidates])
        gains = work.std[row] - after
        best = int(np.argmax(gains))  # the first of equal gains: pod order
        i, gain = candidates[best], float(gains[best])
        pod = view.pods[i]
        if gain < args.min_improvement_threshold:
            work.skipped[SMALL_GAIN] += 1
            continue
        why = arb.refusal(pod, view.nodes[row].name)
        if why:
            work.skipped[why] += 1
            continue
        ev = sim.evaluate(pod)
        feasible = ev.feasible.copy()
        feasible[row] = False
        destination = _best_row(ev.total, feasible)
        if destination < 0 and args.node_fit:
            work.skipped[NO_FIT] += 1
            continue
        moves.append(_commit(work, sim, arb, i, row, destination))
    return moves


def _commit(work: _Work, sim: Simulator, arb: Arbitrator, i: int, source: int, destination: int) -> Move:
    view = work.view
    pod = view.pods[i]
    rows = [source] + ([destination] if destination >= 0 else [])
    before = work.std[rows].copy()
    work.move(i, source, destination)
    after = work.std[rows]
    if destination >= 0:
        sim.place(pod, destination, feasibility_only=work.args.mode == GLOBAL)
    arb.admit(pod, view.nodes[source].name)
    dest_std = (float(before[1]), float(after[1])) if destination >= 0 else (0.0, 0.0)
    return Move(pod.uid, pod.namespace, pod.name, workload_of(pod), view.nodes[source].name,
                view.nodes[destination].name if destination >= 0 else "",
                float(before.sum() - after.sum()), (float(before[0]), float(after[0])), dest_std)


def _plan_global(work: _Work, sim: Simulator, arb: Arbitrator, now: float, evictor: EvictorArgs,
                 moved_at: Mapping[str, float], busy: Collection[str]) -> list[Move]:
    view, args = work.view, work.args
    # Candidates by equivalence class, then by source node: within a class every pod has the
    # same request, so a move's gain depends only on its source and destination.
    groups: dict[Hashable, dict[int, list[int]]] = {}
    for row in _sources(work):
        for i in view.pods_on(row):
            pod = view.pods[i]
            why = _refusal(pod, args, evictor, now, moved_at, busy)
            key = None if why else sim.key(pod)
            if why or key is None:
                work.skipped[why or NO_PROFILE] += 1
            else:
                groups.setdefault(key, {}).setdefault(row, []).append(int(i))
    moves: list[Move] = []
    c, allocatable = work.columns, view.allocatable[:, work.columns]
    while groups and not (args.max_moves_per_cycle and len(moves) >= args.max_moves_per_cycle):
        best: tuple[float, int, int, Hashable] | None = None  # (-gain, source, destination, class)
        for key, by_source in groups.items():
            first = next(iter(by_source.values()))[0]
            v = view.vectors[first]
            ev = sim.evaluate(view.pods[first], key)
            if not ev.feasible.any():
                continue
            dest_after = balance_std(work.requested[:, c] + v[c], allocatable)
            dest_delta = np.where(ev.feasible & (dest_after <= work.std + EPSILON), dest_after - work.std, np.inf)
            order = np.argsort(dest_delta, kind="stable")[:2]
            sources = np.fromiter(by_source, dtype=np.intp, count=len(by_source))
            src_delta = work.std_rows(sources, work.requested[sources] - v) - work.std[sources]
            second = order[1] if len(order) > 1 else order[0]
            dest = np.where(order[0] != sources, order[0], second)
            gain = -(src_delta + dest_delta[dest])
            gain[(src_delta > EPSILON) | (dest == sources) | ~np.isfinite(gain)] = -np.inf
            k = int(np.argmax(gain))
            if gain[k] >= args.min_improvement_threshold and (best is None or -gain[k] < best[0]):
                best = (-float(gain[k]), int(sources[k]), int(dest[k]), key)
        if best is None:
            break
        _, s, d, key = best
        members = groups[key][s]
        chosen = -1
        while members and chosen < 0:
            i = members.pop(0)
            why = arb.refusal(view.pods[i], view.nodes[s].name)
            if why in NODE_WIDE:  # no pod leaves this node any more this cycle, whatever its class
                members.append(i)
                for other in list(groups):
                    work.skipped[why] += len(groups[other].pop(s, ()))
                    if not groups[other]:
                        del groups[other]
                break
            if why:
                work.skipped[why] += 1
            else:
                chosen = i
        if key in groups and s in groups[key] and not groups[key][s]:
            del groups[key][s]
            if not groups[key]:
                del groups[key]
        if chosen >= 0:
            moves.append(_commit(work, sim, arb, chosen, s, d))
    for by_source in groups.values():
        work.skipped[SMALL_GAIN] += sum(len(m) for m in by_source.values())
    return moves


def plan_text(plan: MovePlan) -> Sequence[str]:
    """The plan as lines for an operator (what `koordstream rebalance plan` prints)."""
    lines = [f"FragmentationAware ({plan.mode}): {len(plan.moves)} moves; std sum {plan.before.std_sum:.4f} -> "
             f"{plan.after.std_sum:.4f}, max {plan.before.std_max:.4f} -> {plan.after.std_max:.4f}, stranded "
             f"{plan.before.stranded_pct:.2f}% -> {plan.after.stranded_pct:.2f}%"]
    for m in plan.moves:
        lines.append(f"  move {m.namespace}/{m.name} {m.source} -> {m.destination or '(wherever it fits)'}: gain "
                     f"{m.gain:.4f} (source std {m.source_std[0]:.3f} -> {m.source_std[1]:.3f})")
    for why, n in sorted(plan.skipped.items()):
        lines.append(f"  left {n} pods: {why}")
    return lines
