"""The framework runtime: one `Framework` per profile runs its plugins over the shared state.

`Framework.schedule(pods)` takes pods in queue order and returns one `Placement` per pod.
Consecutive pods with equal signatures form an equivalence class (DESIGN.md, "Equivalence
classes"): the class is filtered and scored once over every node, then its pods are placed
one after another in order of (score, node index) (`Ranking`); after each placement only the node just
used is filtered and scored again, and only by the plugins that depend on allocation
(`DYNAMIC`). Ties break by the lowest node index, as `argmax` does on the full path, so batched
placement equals one-by-one placement (a property test checks it). Nodes that share the best
score (a tier: many equal nodes, as a fresh cluster has) are looked at together, in numpy, when
every dynamic plugin can (`TierFilterPlugin`, `TierScorePlugin`): each takes pods while its
score stays at the best, since the next node of that score is its rival. When a node leaves the
feasible set and a static plugin normalizes over the feasible set, the static scores are
normalized again and the heap rebuilt, so that equality holds there too.

The full path (`evaluate`) is what a single pod goes through and what `explain` shows:
PreFilter, every Filter over all nodes (one boolean mask per plugin), PreScore, Score and
normalize over all nodes, the weighted sum, argmax. A pod that fits nowhere gets a `Diagnosis`
(reasons with node counts, as kube-scheduler words them) and goes to PostFilter (preemption).

Placing a pod: assume its claim in the shared state (every profile sees it at once), Reserve,
Permit (WAIT keeps it reserved until `allow`, `reject` or its deadline), Bind (the first Bind
plugin that answers produces the records). A failing step unreserves in reverse order and
forgets the assumption.

Time spent per plugin and extension point is added up in `timings` (nanoseconds, from the
injected `timer`) and the calls in `calls`, for the benchmark's plugin shares, the profiling
samples and the Prometheus metrics.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from agents.ports import Output
from agents.scheduler.cluster import ClusterState
from agents.scheduler.framework import status
from agents.scheduler.framework.interface import (
    ALL,
    UNSIGNABLE,
    BindPlugin,
    CycleState,
    Diagnosis,
    DynamicFilterPlugin,
    DynamicScorePlugin,
    FilterPlugin,
    Mask,
    PermitPlugin,
    PodInfo,
    PostFilterPlugin,
    PostFilterResult,
    PreFilterPlugin,
    PreScorePlugin,
    ReservePlugin,
    Rows,
    RunBindPlugin,
    ScorePlugin,
    Scores,
    SignPlugin,
    TierFilterPlugin,
    TierScorePlugin,
)
from agents.scheduler.framework.status import Code, Status
from schemas.records import hold_id

T = TypeVar("T")
MIN_FEASIBLE_NODES_TO_FIND = 100  # kube-scheduler's floor when percentageOfNodesToScore < 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5  # and the adaptive share's
ADAPTIVE = 0  # percentageOfNodesToScore: kube-scheduler's adaptive share (its default)
_NO_SCORE = np.iinfo(np.int64).min


def nodes_to_find(nodes: int, percentage: int) -> int:
    """How many feasible nodes one pod's search keeps (kube-scheduler's numFeasibleNodesToFind):
    every node below 100; else `percentage` of them, or when it is 0 (adaptive) 50% less one
    point per 125 nodes, at least 5%; at least 100 nodes."""
    if nodes < MIN_FEASIBLE_NODES_TO_FIND or percentage >= 100:
        return nodes
    if percentage == ADAPTIVE:
        percentage = max(50 - nodes // 125, MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    return max(nodes * percentage // 100, MIN_FEASIBLE_NODES_TO_FIND)


@dataclass(frozen=True)
class ProfilePlugins:
    """A profile's plugins per extension point, in order (built by `profiles`)."""

    name: str
    pre_filter: tuple[PreFilterPlugin, ...] = ()
    filter: tuple[FilterPlugin, ...] = ()
    post_filter: tuple[PostFilterPlugin, ...] = ()
    pre_score: tuple[PreScorePlugin, ...] = ()
    score: tuple[tuple[ScorePlugin, int], ...] = ()
    reserve: tuple[ReservePlugin, ...] = ()
    permit: tuple[PermitPlugin, ...] = ()
    bind: tuple[BindPlugin, ...] = ()
    percentage_of_nodes_to_score: int = 100  # 0: adaptive (`nodes_to_find`)

    def all(self) -> list[object]:
        seen: dict[int, object] = {}
        for group in (self.pre_filter, self.filter, self.post_filter, self.pre_score,
                      tuple(p for p, _ in self.score), self.reserve, self.permit, self.bind):
            for p in group:
                seen.setdefault(id(p), p)
        return list(seen.values())


@dataclass(slots=True)
class Placement:
    """The outcome of one pod's cycle."""

    pod: PodInfo
    status: Status
    row: int = -1
    node: str = ""
    outputs: list[Output] = field(default_factory=list)
    diagnosis: Diagnosis | None = None
    preemption: PostFilterResult | None = None
    batched: bool = False  # placed as a member of an equivalence class, not by the full path

    @property
    def placed(self) -> bool:
        return self.status.ok and self.row >= 0


@dataclass
class Evaluation:
    """The full path's view of one pod: every plugin's verdict and score per node."""

    cycle: CycleState
    feasible: Mask
    searched: bool = False  # the feasible nodes were cut to a share (percentageOfNodesToScore)
    masks: dict[str, Mask] = field(default_factory=dict)
    scores: dict[str, Scores] = field(default_factory=dict)  # normalized, before weights
    total: Scores | None = None
    diagnosis: Diagnosis | None = None

    def best(self) -> int:
        if self.total is None or not self.feasible.any():
            return -1
        return int(np.argmax(self.total))


@dataclass
class Waiting:
    pod: PodInfo
    row: int
    cycle: CycleState
    deadline: float


def gathered(signatures: Sequence[Hashable | None]) -> list[int]:
    """Positions in the order that brings equal signatures together where the first of them
    stands (stable otherwise; None is unique)."""
    first: dict[Hashable, int] = {}
    keys = [i if sig is None else first.setdefault(sig, i) for i, sig in enumerate(signatures)]
    return sorted(range(len(keys)), key=keys.__getitem__)


class Ranking:
    """Feasible nodes by score (highest first), ties by node index: the order `argmax` picks.

    The nodes as first scored are sorted (vectorized) in two steps: the best `HEAD` at once
    (a partition, then a sort of those: most pods take one node), the rest only if a class
    of pods gets that far. Nodes scored again after a placement go into a small heap; `pop`
    takes the better of the two heads."""

    HEAD = 64

    def __init__(self, total: Scores, feasible: Mask) -> None:
        rows = np.flatnonzero(feasible)
        keys = -total[rows]
        self._rest: tuple[npt.NDArray[np.intp], npt.NDArray[np.int64]] | None = None
        if len(rows) > self.HEAD:
            kth = np.partition(keys, self.HEAD - 1)[self.HEAD - 1]
            take = keys < kth
            ties = np.flatnonzero(keys == kth)  # in node order: the lowest indices go first
            take[ties[:self.HEAD - int(take.sum())]] = True
            self._rest = (rows[~take], keys[~take])
            rows, keys = rows[take], keys[take]
        order = np.lexsort((rows, keys))
        self._keys: list[int] = keys[order].tolist()
        self._rows: list[int] = rows[order].tolist()
        self._next = 0
        self._heap: list[tuple[int, int]] = []

    def _more(self) -> bool:
        """Sort in the rest once the head is used up; False when there is no rest."""
        if self._rest is None:
            return False
        rows, keys = self._rest
        self._rest = None
        order = np.lexsort((rows, keys))  # every one of them ranks after the head
        self._keys += keys[order].tolist()
        self._rows += rows[order].tolist()
        return True

    def __bool__(self) -> bool:
        return self._next < len(self._rows) or bool(self._heap) or self._more()

    def pop(self) -> int:
        i = self._next
        if i >= len(self._rows):
            self._more()
        if self._heap and (i >= len(self._rows) or self._heap[0] < (self._keys[i], self._rows[i])):
            return heapq.heappop(self._heap)[1]
        self._next = i + 1
        return self._rows[i]

    def push(self, score: int, row: int) -> None:
        heapq.heappush(self._heap, (-score, row))

    def tier(self, limit: int) -> tuple[int, list[int]]:
        """The best score, and up to `limit` nodes of the sorted order that have it, in node
        order, the next ones `pop` would give, each with another node of that score ranking
        right after it: ([] when none). Such a node keeps taking pods of a class while its
        score stays at least the best, whatever the others take."""
        i = self._next
        if i >= len(self._rows) and not self._more():
            return 0, []
        key = self._keys[i]
        bound = None  # a node in the heap with this score: the tier ends before it
        if self._heap:
            if self._heap[0] < (key, self._rows[i]):
                return 0, []
            if self._heap[0][0] == key:
                bound = self._heap[0][1]
        j = i
        while j - i <= limit:
            if j == len(self._rows) and not self._more():
                break
            if self._keys[j] != key or (bound is not None and self._rows[j] > bound):
                break
            j += 1
        # Each of rows i..j-1 but the last has the next after it; the last has the heap's node.
        end = j if bound is not None else j - 1
        return -key, self._rows[i:min(end, i + limit)]

    def skip(self, count: int) -> None:
        """Take the next `count` nodes of the sorted order (those `tier` gave)."""
        self._next += count

    def peek(self) -> tuple[int, int] | None:
        """The key (-score, row) of the node `pop` would return next, or None."""
        i = self._next
        if i >= len(self._rows):
            self._more()
        head = (self._keys[i], self._rows[i]) if i < len(self._rows) else None
        if self._heap and (head is None or self._heap[0] < head):
            return self._heap[0]
        return head


class Framework:
    def __init__(self, plugins: ProfilePlugins, state: ClusterState, *,
                 timer: Callable[[], int], clock: Callable[[], float] | None = None) -> None:
        self.profile = plugins
        self.name = plugins.name
        self.state = state
        self.timer = timer
        self.clock = clock or (lambda: 0.0)
        self.timings: dict[tuple[str, str], int] = defaultdict(int)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self.waiting: dict[str, Waiting] = {}
        self._signers = [p for p in plugins.all() if isinstance(p, SignPlugin)]
        only = plugins.bind[0] if len(plugins.bind) == 1 else None  # binds a run of pods at once
        self._run_binder: RunBindPlugin | None = only if isinstance(only, RunBindPlugin) else None
        # The plugins with numpy forms for tiers, by name (a protocol check costs about 20 us).
        self._tier_filters = {p.NAME for p in plugins.filter if isinstance(p, TierFilterPlugin)}
        self._tier_scorers = {p.NAME for p, _ in plugins.score if isinstance(p, TierScorePlugin)}
        unsigned = [p for p in plugins.all() if not isinstance(p, SignPlugin) and not getattr(p, "SIGNATURE_FREE", False)
                    and isinstance(p, (FilterPlugin, ScorePlugin, PreFilterPlugin))]
        self.batching = (not unsigned
                         and not any(p.DYNAMIC and (p.NORMALIZES or not isinstance(p, DynamicScorePlugin))
                                     for p, _ in plugins.score)
                         and not any(p.DYNAMIC and not isinstance(p, DynamicFilterPlugin) for p in plugins.filter))
        self._next_start = 0  # where the next partial search starts (percentageOfNodesToScore)
        # When a list, the time from the start of each pod's attempt (or of the previous
        # placement, inside a class) to its placement, in ns: the benchmark's latencies.
        self.attempts_ns: list[int] | None = None
        self._attempt_start = 0

    def _timed(self, plugin: Any, point: str, method: Callable[..., T], *args: Any) -> T:
        t0 = self.timer()
        try:
            return method(*args)
        finally:
            self._spent((plugin.NAME, point), t0)

    def _spent(self, key: tuple[str, str], t0: int, calls: int = 1) -> None:
        self.timings[key] += self.timer() - t0
        self.calls[key] += calls

    # -- signatures ---------------------------------------------------------------------------

    def signature(self, pod: PodInfo) -> Hashable | None:
        """Equal signatures mean equal filter and score results; None: no batching."""
        record = pod.pod
        if not self.batching or record.uid in self.state.nominator.nominated_uids():
            return None
        if self.state.reservations and self.state.reservations.matches_any(record):
            return None  # each placement changes what the reservation leaves for the next
        # A gang member's room includes what lower-ranked gangs would yield to its gang
        # (NodeResourcesFit): members of different gangs are different classes.
        gang = pod.decision_key if pod.decision_key != record.uid else ""
        parts: list[Hashable] = [pod.request_key or pod.request.tobytes(), pod.priority, gang]
        for plugin in self._signers:
            part = plugin.sign(pod)
            if part is UNSIGNABLE:
                return None
            parts.append(part)
        return tuple(parts)

    # -- the full path ------------------------------------------------------------------------

    def evaluate(self, pod: PodInfo, *, partial: bool = True) -> Evaluation:
        """Filter and score the pod over every node (the library's `explain` shows this)."""
        state = self.state
        cycle = CycleState()
        for plugin in self.profile.pre_filter:
            st: Status = self._timed(plugin, "PreFilter", plugin.pre_filter, cycle, pod, state)
            if st.code == Code.SKIP:
                cycle.skip_filter.add(plugin.NAME)
            elif not st.ok:
                diagnosis = Diagnosis(nodes=int(state.schedulable_rows().sum()), status=st)
                return Evaluation(cycle, np.zeros(state.size, dtype=bool), diagnosis=diagnosis)
        feasible = state.schedulable_rows().copy()
        ev = Evaluation(cycle, feasible)
        for flt in self.profile.filter:
            if flt.NAME in cycle.skip_filter:
                continue
            mask: Mask = self._timed(flt, "Filter", flt.filter, cycle, pod, state, ALL)
            ev.masks[flt.NAME] = mask
            feasible &= mask
        if partial and self.profile.percentage_of_nodes_to_score < 100:
            room = cycle.reserved_room
            ev.searched = self._limit(feasible, pod, None if room is None else np.asarray(room.any(axis=1)))
        if not feasible.any():
            ev.diagnosis = self._diagnose(pod, ev)
            return ev
        self._score(pod, ev)
        return ev

    def _limit(self, feasible: Mask, pod: PodInfo, reserved: Mask | None = None) -> bool:
        """Keep the first k feasible nodes from a rotating start (kube-scheduler's search), the
        node the pod is nominated to (kube-scheduler evaluates it first), and the nodes holding
        a reservation the pod may consume (`reserved`: a pod goes to its reservation first,
        so a search that cut its node would place it elsewhere and leave the reservation
        unused); True if any was cut."""
        state = self.state
        n = len(feasible)
        k = nodes_to_find(int(state.schedulable_rows().sum()), self.profile.percentage_of_nodes_to_score)
        order = np.roll(np.arange(n), -self._next_start)
        hits = order[feasible[order]]
        if len(hits) <= k:
            self._next_start = 0
            return False
        nomination = state.nominator.of(pod.uid)
        row = state.index.get(nomination.node, -1) if nomination is not None else -1
        nominated = row >= 0 and bool(feasible[row])
        kept = feasible & reserved if reserved is not None else None
        feasible[hits[k:]] = False
        if nominated:
            feasible[row] = True
        if kept is not None:
            feasible |= kept
        self._next_start = int(hits[k - 1] + 1) % n
        return True

    def _diagnose(self, pod: PodInfo, ev: Evaluation) -> Diagnosis:
        """Count each node against the first filter that rejected it, as kube-scheduler does."""
        state = self.state
        remaining = state.schedulable_rows().copy()
        reasons: dict[str, int] = {}
        rejected: dict[str, Mask] = {}
        for plugin in self.profile.filter:
            mask = ev.masks.get(plugin.NAME)
            if mask is None:
                continue
            failed = remaining & ~mask
            if failed.any():
                rejected[plugin.NAME] = failed
                for reason, count in plugin.explain(ev.cycle, pod, state, failed).items():
                    reasons[reason] = reasons.get(reason, 0) + count
            remaining &= mask
        return Diagnosis(nodes=int(state.schedulable_rows().sum()), rejected_by=rejected, reasons=reasons,
                         masks=dict(ev.masks))

    def _pre_score(self, pod: PodInfo, cycle: CycleState, feasible: Mask) -> None:
        for plugin in self.profile.pre_score:
            st: Status = self._timed(plugin, "PreScore", plugin.pre_score, cycle, pod, self.state, feasible)
            if st.code == Code.SKIP:
                cycle.skip_score.add(plugin.NAME)

    def _score(self, pod: PodInfo, ev: Evaluation) -> None:
        """Score the feasible nodes: every node at once (numpy over whole columns), or only the
        share a search kept."""
        self._pre_score(pod, ev.cycle, ev.feasible)
        total = np.zeros(self.state.size, dtype=np.int64)
        rows: Rows = np.flatnonzero(ev.feasible) if ev.searched else ALL
        for plugin, weight in self.profile.score:
            if plugin.NAME in ev.cycle.skip_score:
                continue
            raw = self._timed(plugin, "Score", plugin.score, ev.cycle, pod, self.state, rows)
            if rows is not ALL:
                full = np.zeros(self.state.size, dtype=np.int64)
                full[rows] = raw
                raw = full
            if plugin.NORMALIZES:
                raw = self._timed(plugin, "NormalizeScore", plugin.normalize, ev.cycle, raw, ev.feasible)
            ev.scores[plugin.NAME] = raw
            total += weight * raw
        total[~ev.feasible] = _NO_SCORE
        ev.total = total

    # -- scheduling ---------------------------------------------------------------------------

    def schedule(self, pods: Sequence[PodInfo], *, batching: bool = True, gather: bool = False) -> list[Placement]:
        """Place pods in order; consecutive pods with equal signatures go as one class.

        With `gather`, pods with equal signatures are first brought together, at the place
        of the first of them (`gathered`): a reordering among pods of one priority (the
        signature includes it) within this batch, so that one evaluation serves them all."""
        sigs = [self.signature(p) if batching else None for p in pods]
        if gather and batching:
            order = gathered(sigs)
            pods, sigs = [pods[k] for k in order], [sigs[k] for k in order]
        out: list[Placement] = []
        i = 0
        while i < len(pods):
            if self.attempts_ns is not None:
                self._attempt_start = self.timer()
            sig = sigs[i]
            j = i + 1
            if sig is not None:
                while j < len(pods) and sigs[j] == sig:
                    j += 1
            if j - i > 1:
                out += self._schedule_class(pods[i:j])
            else:
                out.append(self.schedule_one(pods[i]))
                self._attempt_done()
            i = j
        return out

    def schedule_one(self, pod: PodInfo) -> Placement:
        ev = self.evaluate(pod)
        row = ev.best()
        if row < 0:
            return self._unschedulable(pod, ev)
        return self._place(ev.cycle, pod, row)

    def _unschedulable(self, pod: PodInfo, ev: Evaluation) -> Placement:
        diagnosis = ev.diagnosis or Diagnosis(nodes=int(self.state.schedulable_rows().sum()))
        code = diagnosis.status.code if diagnosis.status is not None else Code.UNSCHEDULABLE
        placement = Placement(pod, Status(code, (diagnosis.message(),), diagnosis.status.plugin if diagnosis.status else ""),
                              diagnosis=diagnosis)
        if code == Code.UNSCHEDULABLE:
            for plugin in self.profile.post_filter:
                result = self._timed(plugin, "PostFilter", plugin.post_filter, ev.cycle, pod, self.state, diagnosis)
                if result is not None:
                    placement.preemption = result
                    break
        return placement

    def _schedule_class(self, pods: Sequence[PodInfo]) -> list[Placement]:
        state = self.state
        first = pods[0]
        ev = self.evaluate(first, partial=False)  # a class is scored over every feasible node, once
        if not ev.feasible.any():
            return [self._unschedulable(first, ev)] + [self.schedule_one(p) for p in pods[1:]]
        cycle, feasible = ev.cycle, ev.feasible
        scored = [(p, w) for p, w in self.profile.score if p.NAME not in cycle.skip_score]
        dynamic_scores: list[tuple[Any, int]] = [(p, w) for p, w in scored if p.DYNAMIC]
        static = [(p, w) for p, w in scored if not p.DYNAMIC]
        renormalize = [(p, w) for p, w in static if p.NORMALIZES]
        raw_static = {p.NAME: self._timed(p, "Score", p.score, cycle, first, state, ALL)
                      for p, _ in renormalize}
        static_total = np.zeros(state.size, dtype=np.int64)
        for p, w in static:
            static_total += w * ev.scores[p.NAME]
        dynamic_total = np.zeros(state.size, dtype=np.int64)
        for p, w in dynamic_scores:
            dynamic_total += w * ev.scores[p.NAME]
        dynamic_filters: list[Any] = [p for p in self.profile.filter if p.DYNAMIC and p.NAME not in cycle.skip_filter]
        ranking = Ranking(static_total + dynamic_total, feasible)
        tentative_free = not self._reserving(cycle) and not self.profile.permit
        tiered = (tentative_free and all(p.NAME in self._tier_filters for p in dynamic_filters)
                  and all(p.NAME in self._tier_scorers for p, _ in dynamic_scores))

        def settle(row: int, base: int, won: int, fitting: int, after: int) -> None:
            """The node's run is over: it ranks again by its score for the next pod (`after`),
            or, full, leaves the feasible set."""
            nonlocal ranking
            if won < fitting:
                dynamic_total[row] = after
                ranking.push(base + after, row)
                return
            feasible[row] = False  # full for this class
            if renormalize and self._renormalize(cycle, static, raw_static, ev, feasible, static_total):
                ranking = Ranking(static_total + dynamic_total, feasible)

        out: list[Placement] = []
        k, chunk, tier_steps, tier_rows = 0, 2, 4, 64
        while k < len(pods):
            if not ranking:
                return out + [self.schedule_one(p) for p in pods[k:]]
            if tiered:
                runs = self._tier_runs(cycle, first, ranking, static_total, dynamic_filters, dynamic_scores,
                                       min(tier_steps, len(pods) - k), len(pods) - k, tier_rows)
                if runs:  # look at as many nodes next time as the pods left would need at this pace
                    tier_rows = (len(pods) - k) * len(runs) // max(1, sum(run[2] for run in runs)) + 2
                for row, base, won, fitting, after in runs or ():
                    out += self._place_run(cycle, pods[k:k + won], row)
                    k += won
                    if k == len(pods):
                        return out
                    version = ranking
                    settle(row, base, won, fitting, after)
                    if ranking is not version:
                        break  # ranked anew: the rest of the tier is in it
                if runs:
                    continue
                if runs is not None:  # its first node may take more: look further next time
                    tier_steps = min(2 * tier_steps, 1024)
            row = ranking.pop()
            # The node won the next pod. Its scores for the pods after it (with 1, 2, ...
            # more of the class on it) come in one go; it keeps taking pods while it still
            # outbids the best other node, as one-by-one placement would do.
            certain = 1  # the first pod is the node's: it is the ranking's head
            while k < len(pods):
                steps = min(chunk, len(pods) - k)
                fitting = self._fit_steps(cycle, first, row, steps, dynamic_filters)
                scores = self._score_steps(cycle, first, row, fitting, dynamic_scores)
                rival = ranking.peek()
                base = int(static_total[row])
                won = min(certain, fitting)
                while won < fitting and (rival is None or (-(base + scores[won]), row) < rival):
                    won += 1
                if tentative_free:
                    out += self._place_run(cycle, pods[k:k + won], row)  # nothing can refuse them
                    k += won
                else:
                    for _ in range(won):
                        placement = self._place(cycle, pods[k], row)
                        placement.batched = True
                        out.append(placement)
                        self._attempt_done()
                        k += 1
                        if not placement.placed and placement.status.code != Code.WAIT:
                            return out + [self.schedule_one(p) for p in pods[k:]]
                certain = 0
                # Look as far ahead next time as this node went (doubling while it keeps winning).
                chunk = min(2 * steps if won == steps else won + 1, 1024)
                if won == steps:
                    continue  # it won every step looked at: look further
                settle(row, base, won, fitting, scores[won] if won < fitting else 0)
                break
        return out

    def _tier_runs(self, cycle: CycleState, pod: PodInfo, ranking: Ranking, static_total: Scores,
                   filters: list[Any], scorers: list[tuple[Any, int]], steps: int, pods_left: int,
                   nodes: int) -> list[tuple[int, int, int, int, int]] | None:
        """The runs of the nodes that share the best score (`Ranking.tier`), looked at together
        over `steps` more pods each, in numpy: each takes pods while its score stays at least
        the best (the next node of that score is its rival), as one-by-one placement gives
        them. Returns (row, static score, pods won, pods fitting, score for the next pod) in
        node order for the nodes decided, which leave the ranking: up to the first that won
        every step looked at (it may take more), or the one where the pods run out, with its
        share; up to `nodes` of them. [] when none is decided; None when no node shares the
        best score."""
        best, rows = ranking.tier(min(nodes, pods_left))
        if not rows:
            return None
        index = np.asarray(rows, dtype=np.intp)
        fitting = np.full(len(rows), steps, dtype=np.int64)
        for plugin in filters:
            t0 = self.timer()
            np.minimum(fitting, plugin.fit_steps_rows(cycle, pod, self.state, index, steps), out=fitting)
            self._spent((plugin.NAME, "Filter"), t0)
        scores = np.zeros((len(rows), steps), dtype=np.int64)
        for plugin, weight in scorers:
            t0 = self.timer()
            scores += weight * plugin.score_steps_rows(cycle, pod, self.state, index, steps)
            self._spent((plugin.NAME, "Score"), t0)
        base = static_total[index]
        takes = (np.arange(steps) < fitting[:, None]) & (base[:, None] + scores >= best)
        takes[:, 0] = fitting > 0  # the first pod is the node's: it heads the ranking
        won = np.where(takes.all(axis=1), steps, takes.argmin(axis=1))
        decided = len(rows)
        open_ended = np.flatnonzero(won == steps)
        if open_ended.size:
            decided = int(open_ended[0])
        ran_out = np.flatnonzero(np.cumsum(won) >= pods_left)
        if ran_out.size and ran_out[0] <= decided:
            decided = int(ran_out[0]) + 1
            won[decided - 1] = pods_left - int(won[:decided - 1].sum())
        if not decided:
            return []
        ranking.skip(decided)
        after = scores[np.arange(decided), np.minimum(won[:decided], steps - 1)]
        return list(zip(rows[:decided], base[:decided].tolist(), won[:decided].tolist(),
                        fitting[:decided].tolist(), after.tolist(), strict=True))

    def _attempt_done(self) -> None:
        if self.attempts_ns is not None:
            now = self.timer()
            self.attempts_ns.append(now - self._attempt_start)
            self._attempt_start = now

    def _fit_steps(self, cycle: CycleState, pod: PodInfo, row: int, steps: int, filters: list[Any]) -> int:
        fitting = steps
        for plugin in filters:
            t0 = self.timer()
            fitting = min(fitting, plugin.fit_steps(cycle, pod, self.state, row, fitting))
            self._spent((plugin.NAME, "Filter"), t0)
        return fitting

    def _score_steps(self, cycle: CycleState, pod: PodInfo, row: int, steps: int,
                     scorers: list[tuple[Any, int]]) -> list[int]:
        total = [0] * steps
        for plugin, weight in scorers:
            t0 = self.timer()
            for i, score in enumerate(plugin.score_steps(cycle, pod, self.state, row, steps)):
                total[i] += weight * score
            self._spent((plugin.NAME, "Score"), t0)
        return total

    def _renormalize(self, cycle: CycleState, static: list[tuple[ScorePlugin, int]], raw_static: dict[str, Scores],
                     ev: Evaluation, feasible: Mask, static_total: Scores) -> bool:
        """A node left the feasible set: normalize the static scores again (in place); True
        when that changed any feasible node's score."""
        before = static_total.copy()
        static_total[:] = 0
        for p, w in static:
            raw = raw_static.get(p.NAME)
            static_total += w * (p.normalize(cycle, raw, feasible) if raw is not None else ev.scores[p.NAME])
        return not np.array_equal(static_total[feasible], before[feasible])

    # -- reserve, permit, bind ----------------------------------------------------------------

    def _place(self, cycle: CycleState, pod: PodInfo, row: int) -> Placement:
        state = self.state
        node = state.names[row]
        hid = hold_id(pod.uid, pod.attempt, node)
        state.assume(hid, row, pod.request)
        reserving = self._reserving(cycle)
        for i, plugin in enumerate(reserving):
            st: Status = self._timed(plugin, "Reserve", plugin.reserve, cycle, pod, state, row)
            if not st.ok:
                self._unreserve(cycle, pod, row, upto=i + 1)
                return Placement(pod, st, row, node)
        for permit in self.profile.permit:
            st = self._timed(permit, "Permit", permit.permit, cycle, pod, state, row)
            if st.code == Code.WAIT:
                self.waiting[pod.uid] = Waiting(pod, row, cycle, self.clock() + st.timeout_s)
                return Placement(pod, st, row, node)
            if not st.ok:
                self._unreserve(cycle, pod, row)
                return Placement(pod, st, row, node)
        return Placement(pod, status.SUCCESS, row, node, self._bind(cycle, pod, row))

    def _place_run(self, cycle: CycleState, pods: Sequence[PodInfo], row: int) -> list[Placement]:
        """Place pods of one class on one node at once, when no Reserve or Permit plugin could
        refuse one: the claims are assumed together, then each pod is bound."""
        if not pods:
            return []
        node = self.state.names[row]
        self.state.assume_many([hold_id(p.uid, p.attempt, node) for p in pods], row, pods[0].request)
        binder = self._run_binder
        if binder is not None:
            t0 = self.timer()
            bound = binder.bind_run(cycle, pods, self.state, row)
            self._spent((binder.NAME, "Bind"), t0, len(pods))
        else:
            bound = [self._bind(cycle, pod, row) for pod in pods]
        out = [Placement(pod, status.SUCCESS, row, node, outputs, batched=True)
               for pod, outputs in zip(pods, bound, strict=True)]
        if self.attempts_ns is not None:  # decided together: each gets an equal share of the run
            now = self.timer()
            self.attempts_ns += [(now - self._attempt_start) // len(pods)] * len(pods)
            self._attempt_start = now
        return out

    def _bind(self, cycle: CycleState, pod: PodInfo, row: int) -> list[Output]:
        for plugin in self.profile.bind:
            t0 = self.timer()
            outputs = plugin.bind(cycle, pod, self.state, row)
            self._spent((plugin.NAME, "Bind"), t0)
            if outputs is not None:
                return outputs
        return []

    def _reserving(self, cycle: CycleState) -> tuple[ReservePlugin, ...]:
        """Reserve plugins, less those whose PreFilter said SKIP for this cycle (nothing to reserve)."""
        if not cycle.skip_filter:
            return self.profile.reserve
        return tuple(p for p in self.profile.reserve if p.NAME not in cycle.skip_filter)

    def _unreserve(self, cycle: CycleState, pod: PodInfo, row: int, upto: int | None = None) -> None:
        plugins = self._reserving(cycle)[:upto]
        for plugin in reversed(plugins):
            self._timed(plugin, "Unreserve", plugin.unreserve, cycle, pod, self.state, row)
        self.state.forget(hold_id(pod.uid, pod.attempt, self.state.names[row]))

    def unreserve(self, pod: PodInfo, row: int) -> None:
        """The pod's claim was rejected or released after binding: give back what it reserved."""
        self._unreserve(CycleState(), pod, row)

    def allow(self, uid: str) -> Placement | None:
        """Let a waiting pod bind."""
        w = self.waiting.pop(uid, None)
        if w is None:
            return None
        return Placement(w.pod, status.SUCCESS, w.row, self.state.names[w.row], self._bind(w.cycle, w.pod, w.row))

    def reject(self, uid: str, reason: str = "rejected while waiting") -> Placement | None:
        w = self.waiting.pop(uid, None)
        if w is None:
            return None
        self._unreserve(w.cycle, w.pod, w.row)
        return Placement(w.pod, status.unschedulable("Permit", reason), w.row, self.state.names[w.row])

    def expire_waiting(self) -> list[Placement]:
        now = self.clock()
        return [p for uid, w in list(self.waiting.items()) if w.deadline <= now
                for p in (self.reject(uid, "timed out waiting in Permit"),) if p is not None]



def scores_table(ev: Evaluation, state: ClusterState) -> dict[str, dict[str, int]]:
    """Per node (feasible only), per plugin: the normalized score, and the weighted total."""
    out: dict[str, dict[str, int]] = {}
    assert ev.total is not None
    for row in np.flatnonzero(ev.feasible).tolist():
        entry = {name: int(scores[row]) for name, scores in ev.scores.items()}
        entry["total"] = int(ev.total[row])
        out[state.names[row]] = entry
    return out


def rejections_table(ev: Evaluation, state: ClusterState) -> dict[str, list[str]]:
    """Per node: the filter plugins that rejected it."""
    out: dict[str, list[str]] = {}
    for name, mask in ev.masks.items():
        for row in np.flatnonzero(state.schedulable_rows() & ~mask).tolist():
            out.setdefault(state.names[row], []).append(name)
    return out

