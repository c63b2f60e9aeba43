"""The limits a move or an eviction must pass before it runs, in one place (Koordinator's
MigrationController arbitration, with its names and defaults), and the eviction rate limit.

- `maxMigratingPerNode` (default 2), `maxMigratingPerNamespace`, `maxMigratingGlobally`:
  migrations in flight (counted at the source node, and its namespace).
- `maxMigratingPerWorkload` and `maxUnavailablePerWorkload` (an integer or a percentage of
  the workload's replicas, rounded down): by default 10% when replicas > 10 (at least 1), 2
  for 4-10 replicas, else 1; a workload of one replica is never moved, nor one whose limit
  would let every replica go at once. Pods of the workload that are not healthy now count as
  unavailable already (Koordinator's `mergeUnavailableAndMigratingPods`).
- `defaultJobTTL` (default 5m, Koordinator's): a migration job's ttl, and its reservation's;
  a job not finished by then is Aborted and its reservation deleted. It bounds how long a
  move whose replacement went into a sibling's reservation holds its own (migration.py).
- `evictionTTLMargin` (default 30s, shorter than `defaultJobTTL`): a ReservationFirst
  move is evicted only while at least this much of its ttl is left; its reservation goes at
  the ttl, and the replacement needs the time to be recreated and bound into it.
- PodDisruptionBudgets (`Budget`), computed as the disruption controller and the Eviction
  API do: the budget's pods are every live pod it covers (`covered`: pending ones, and pods on
  a deleted node, included), `expected` their count; `healthy` those Running (standing for
  Ready: the Pod record carries no Ready condition), not terminating, not evicted already and
  bound to a node that exists (the caller's predicate); `desiredHealthy` is `minAvailable`,
  or `expected - maxUnavailable` (percentages of `expected` rounded up, as Kubernetes rounds
  both), and `disruptionsAllowed = healthy - desiredHealthy`. Each disruption admitted (a
  migration in flight, an eviction of this batch) of a healthy pod takes one away. A healthy
  pod goes only with one allowed; an unhealthy one only while the budget is met
  (`healthy >= max(desiredHealthy, 1)`, the Eviction API's IfHealthyBudget). Otherwise the
  refusal is `PDB`, as the Eviction API answers 429. `budget_refusal` is that check alone:
  the path of evictions no other limit applies to (EvictDirectly).

`Arbitrator` is the ledger of what is in flight: `refusal` says why a move may not start now
("" when it may), `admit` counts it, `finish` releases it. Planners ask it for every move they
plan (so a plan never breaks a limit), and the actuator asks again before each eviction.
`TokenBucket` is the eviction rate limit (default 10/s, burst 1) on an injected clock.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.rebalance.args import JOB_TTL_S, duration_s, integer
from agents.rebalance.evictor import workload_of
from agents.rebalance.selectors import LabelSelector
from agents.scheduler.plugins.args import ArgsError, reject_unknown
from schemas.records import Pod

PER_NODE = "maxMigratingPerNode"
PER_NAMESPACE = "maxMigratingPerNamespace"
GLOBALLY = "maxMigratingGlobally"
PER_WORKLOAD = "maxMigratingPerWorkload"
UNAVAILABLE = "maxUnavailablePerWorkload"
TTL_MARGIN = "evictionTTLMargin"
JOB_TTL = "defaultJobTTL"
SINGLE_REPLICA = "single-replica workload"
NO_WORKLOAD = "no workload"
PDB = "PodDisruptionBudget"


_PERCENT = re.compile(r"[0-9]{1,3}%")


def percent(value: str, path: str) -> int:
    """An IntOrString percentage, as Kubernetes writes it ("10%": whole percents, 0..100)."""
    if not _PERCENT.fullmatch(value) or int(value[:-1]) > 100:
        raise ArgsError(path, value, "must be an integer or a whole percentage from \"0%\" to \"100%\"")
    return int(value[:-1])


def scaled(value: int | str, replicas: int, path: str = "") -> int:
    """An IntOrString limit for `replicas`: an integer as is, "N%" of them rounded down."""
    if isinstance(value, str):
        return replicas * percent(value, path) // 100
    return value


def default_max_unavailable(replicas: int) -> int:
    if replicas > 10:
        return max(1, replicas // 10)
    return 2 if replicas >= 4 else 1


def _int_or_percent(raw: Mapping[str, Any], name: str, path: str) -> int | str | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, str):
        percent(value, f"{path}{name}")
        return value
    return integer(raw, name, path, None, 1)


@dataclass(frozen=True)
class ArbitrationArgs:
    max_migrating_per_node: int | None = 2
    max_migrating_per_namespace: int | None = None
    max_migrating_globally: int | None = None
    max_migrating_per_workload: int | str | None = None
    max_unavailable_per_workload: int | str | None = None
    eviction_qps: float = 10.0
    eviction_burst: int = 1
    eviction_ttl_margin_s: float = 30.0
    job_ttl_s: float = JOB_TTL_S

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], path: str = "") -> ArbitrationArgs:
        reject_unknown(raw, {PER_NODE, PER_NAMESPACE, GLOBALLY, PER_WORKLOAD, UNAVAILABLE,
                             "evictionQPS", "evictionBurst", TTL_MARGIN, JOB_TTL}, path)
        kw: dict[str, Any] = {}
        for name, attr in ((PER_NODE, "max_migrating_per_node"), (PER_NAMESPACE, "max_migrating_per_namespace"),
                           (GLOBALLY, "max_migrating_globally")):
            if name in raw:
                kw[attr] = integer(raw, name, path, None, 1)
        kw["max_migrating_per_workload"] = _int_or_percent(raw, PER_WORKLOAD, path)
        kw["max_unavailable_per_workload"] = _int_or_percent(raw, UNAVAILABLE, path)
        if "evictionQPS" in raw:
            qps = raw["evictionQPS"]
            if isinstance(qps, bool) or not isinstance(qps, int | float) or not math.isfinite(qps) or qps <= 0:
                raise ArgsError(f"{path}evictionQPS", qps, "must be a positive finite number")
            kw["eviction_qps"] = float(qps)
        kw["eviction_burst"] = integer(raw, "evictionBurst", path, 1, 1)
        ttl = JOB_TTL_S
        if raw.get(JOB_TTL) is not None:
            ttl = duration_s(raw[JOB_TTL], f"{path}{JOB_TTL}")
            if ttl <= 0:
                raise ArgsError(f"{path}{JOB_TTL}", raw[JOB_TTL], "must be longer than 0: every job would time out")
            kw["job_ttl_s"] = ttl
        margin = cls.eviction_ttl_margin_s
        if raw.get(TTL_MARGIN) is not None:
            margin = kw["eviction_ttl_margin_s"] = duration_s(raw[TTL_MARGIN], f"{path}{TTL_MARGIN}")
        if margin >= ttl:
            name = TTL_MARGIN if raw.get(TTL_MARGIN) is not None else JOB_TTL
            raise ArgsError(f"{path}{name}", raw[name],
                            f"{TTL_MARGIN} ({margin:g}s) must be shorter than {JOB_TTL}, a migration job's ttl "
                            f"({ttl:g}s): no move would evict")
        return cls(**kw)

    def max_unavailable(self, replicas: int) -> int:
        if self.max_unavailable_per_workload is None:
            return default_max_unavailable(replicas)
        return scaled(self.max_unavailable_per_workload, replicas)


    def max_migrating(self, replicas: int) -> int:
        if self.max_migrating_per_workload is None:
            return self.max_unavailable(replicas)
        return scaled(self.max_migrating_per_workload, replicas)


@dataclass(frozen=True)
class Budget:
    """A `policy/v1` PodDisruptionBudget: pods of `namespace` matching `selector`; one of
    `min_available` and `max_unavailable` (an integer or "N%")."""

    namespace: str
    name: str
    selector: LabelSelector
    min_available: int | str | None = None
    max_unavailable: int | str | None = None

    def covers(self, pod: Pod) -> bool:
        return pod.namespace == self.namespace and self.selector.matches(pod.labels)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def desired(self, expected: int) -> int:
        """The PDB controller's `desiredHealthy` for `expected` pods."""
        if self.max_unavailable is not None:
            return max(0, expected - _rounded_up(self.max_unavailable, expected))
        if self.min_available is not None:
            return _rounded_up(self.min_available, expected)
        return expected  # an empty budget allows nothing, as Kubernetes reads it

    def allowed(self, expected: int, healthy: int) -> int:
        """Disruptions allowed now (the PDB controller's `disruptionsAllowed`)."""
        return max(0, healthy - self.desired(expected))


def _rounded_up(value: int | str, total: int) -> int:
    if isinstance(value, str):
        return math.ceil(total * percent(value, "") / 100)
    return value


def running(pod: Pod) -> bool:
    """Healthy as far as the pod alone says: Running and not terminating."""
    return pod.phase == "Running" and pod.deletion_timestamp is None


@dataclass
class Arbitrator:
    """What is in flight, and whether one more may start. `replicas` is each workload's
    desired count, `healthy` the pods counted healthy per workload and per budget."""

    args: ArbitrationArgs
    replicas: Mapping[str, int]
    budgets: tuple[Budget, ...] = ()
    healthy_by_budget: dict[str, int] = field(default_factory=dict)  # budget name -> healthy now
    expected_by_budget: dict[str, int] = field(default_factory=dict)
    healthy_uids: frozenset[str] = frozenset()  # the covered pods healthy now
    by_node: Counter[str] = field(default_factory=Counter)
    by_namespace: Counter[str] = field(default_factory=Counter)
    by_workload: Counter[str] = field(default_factory=Counter)
    by_budget: Counter[str] = field(default_factory=Counter)
    total: int = 0
    unavailable: dict[str, int] = field(default_factory=dict)  # workload -> pods not healthy now

    @classmethod
    def over(cls, args: ArbitrationArgs, pods: Iterable[Pod], budgets: Iterable[Budget] = (),
             healthy: Callable[[Pod], bool] = running, covered: Iterable[Pod] | None = None,
             budget_healthy: Callable[[Pod], bool] | None = None) -> Arbitrator:
        """An arbitrator over the pods (replicas: each workload's pods; those not `healthy`
        count as unavailable already, as Koordinator counts them; a pod in flight is counted
        by `admit`). The budgets count `covered` (default: `pods`: every live pod, bound or
        pending, each once) with `budget_healthy` (default: `healthy`)."""
        pods = list(pods)
        replicas: Counter[str] = Counter(w for w in map(workload_of, pods) if w)
        down: Counter[str] = Counter(w for p in pods if not healthy(p) and (w := workload_of(p)))
        budgets = tuple(budgets)
        counted = pods if covered is None else list(covered)
        ok = healthy if budget_healthy is None else budget_healthy
        up = frozenset(p.uid for p in counted if ok(p)) if budgets else frozenset()
        expected: dict[str, int] = {}
        healthy_now: dict[str, int] = {}
        for b in budgets:
            mine = [p for p in counted if b.covers(p)]
            expected[b.key] = len(mine)
            healthy_now[b.key] = sum(1 for p in mine if p.uid in up)
        return cls(args, dict(replicas), budgets, healthy_now, expected, up, unavailable=dict(down))

    def refusal(self, pod: Pod, node: str) -> str:
        """Why moving `pod` off `node` may not start now ("" if it may)."""
        a = self.args
        workload = workload_of(pod)
        if not workload:
            return NO_WORKLOAD
        replicas = self.replicas.get(workload, 1)
        if replicas <= 1:
            return SINGLE_REPLICA
        if a.max_migrating_per_node is not None and self.by_node[node] >= a.max_migrating_per_node:
            return PER_NODE
        if a.max_migrating_per_namespace is not None and self.by_namespace[pod.namespace] >= a.max_migrating_per_namespace:
            return PER_NAMESPACE
        if a.max_migrating_globally is not None and self.total >= a.max_migrating_globally:
            return GLOBALLY
        limit = a.max_unavailable(replicas)
        if limit >= replicas:
            return UNAVAILABLE  # a limit that lets every replica go at once protects nothing: refused
        if self.by_workload[workload] >= a.max_migrating(replicas):
            return PER_WORKLOAD
        if self.by_workload[workload] + self.unavailable.get(workload, 0) >= limit:
            return UNAVAILABLE
        return self.budget_refusal(pod)

    def budget_refusal(self, pod: Pod) -> str:
        """PDB when evicting `pod` now would break a budget covering it ("" if none would),
        with every disruption admitted so far counted."""
        for b in self.budgets:
            if not b.covers(pod):
                continue
            healthy = self.healthy_by_budget.get(b.key, 0) - self.by_budget[b.key]
            desired = b.desired(self.expected_by_budget.get(b.key, 0))
            if pod.uid in self.healthy_uids:
                if healthy - desired < 1:
                    return PDB
            elif healthy < max(desired, 1):  # an unhealthy pod: only while the budget is met
                return PDB
        return ""

    def admit(self, pod: Pod, node: str) -> None:
        self._count(pod, node, 1)

    def finish(self, pod: Pod, node: str) -> None:
        self._count(pod, node, -1)

    def _count(self, pod: Pod, node: str, step: int) -> None:
        self.by_node[node] += step
        self.by_namespace[pod.namespace] += step
        self.by_workload[workload_of(pod)] += step
        if pod.uid in self.healthy_uids:  # an unhealthy pod's disruption is counted already
            for b in self.budgets:
                if b.covers(pod):
                    self.by_budget[b.key] += step
        self.total += step


@dataclass
class TokenBucket:
    """`rate` tokens per second up to `burst`; `take` spends one if there is one."""

    rate: float
    burst: int
    clock: Callable[[], float]
    tokens: float = 0.0
    stamp: float | None = None  # None: not started (a full burst at the first take)

    def take(self) -> bool:
        """A backward step of the clock adds nothing (and takes nothing away)."""
        now = self.clock()
        if self.stamp is None:
            self.tokens = float(self.burst)
        else:
            self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.stamp) * self.rate)
        self.stamp = now if self.stamp is None else max(self.stamp, now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def wait_s(self) -> float:
        """Seconds until the next token."""
        return max(0.0, (1.0 - max(self.tokens, 0.0)) / self.rate)
