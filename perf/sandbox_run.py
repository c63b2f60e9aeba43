"""`koordstream perf run sandbox-warm | sandbox-churn`: issue 30's warm pools through the real
system (a broker, the state worker that runs the pools, owners and deciders, the scheduler
worker that places the pools' pods), measured from the outside.

Both runs publish nodes, wait for the pipeline (`perf.demo.start_up`), publish pools
(`SandboxWarmPool`, its template carried) and wait until each reports its depth
(`SandboxPoolStatus.ready`), then publish claims open-loop (`perf.run.publish_on_schedule`: on
schedule, never waiting for an answer; each claim's `created` is set just before it is
produced) and read the answers back with explicit-partition readers, no consumer group
(`perf.collector`): `sandbox-status` (claims' and pools' statuses), `bindings`, the
PodTerminated records on `node-inbox`, and `profiling`.

- **sandbox-warm** (`WarmRun`): phases, each on a pool of its own, reported separately: claims
  at 45 a second on a warm pool (agent-sandbox's published run: p50 92 ms, p99 376 ms), at
  1,000 a second, and a burst of 3,600 claims at once on a 3,700-deep pool (agent-sandbox's CI
  gate: p99 <= 500 ms). After a phase its claims and its pool are deleted, so the next one
  starts on free nodes.
- **sandbox-churn** (`ChurnRun`): an agent platform's day in ten minutes: claims arrive as a
  Poisson process whose rate follows a day (low at both ends, highest at noon) with bursts on
  top, on three pools of different sizes and runtimes; each sandbox lives 5-120 s, then its
  claim is deleted (`SandboxClaimDeleted`), and the pools refill.

Latency (`claim_latency_ms`) is a claim's publication (`created`) to the broker timestamp of
the SandboxClaimStatus that answers it with phase Ready (the answering worker's create time,
as a perf run's queueing latency is); `claim_latency_seen_ms` runs to when this harness's
reader got that status (a client's view: its fetch wait, and on Apache Kafka the commit of the
transaction the status was written in, included). The checks come from the records on the topics, not from the
pools' own counters: `sandboxes_double_adopted` (a sandbox pod named Ready by two different
claims), and `pods_double_bound` / `nodes_overcommitted` (`perf.checker`, from the Bindings,
the terminations the deciders sent and the requests of the templates the run published).
`fast_path_share` is the share of the pools' pods the scheduler placed as members of an
equivalence class (its AttemptsSamples over the window).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from agents.sandbox.runtimes import KATA_NODE_LABEL
from agents.sandbox.templates import pool_of
from perf.checker import Placement, check, timeline
from perf.collector import Collector
from perf.demo import percentiles, start_up, system
from perf.figures import allocation
from perf.proc import children, cpu_s, machine_busy_s, self_cpu_s
from perf.run import latency_cdf, publish_on_schedule
from perf.run import report as scenario_report
from schemas import topics
from schemas.records import (
    QOS_LABEL,
    AttemptsSample,
    Binding,
    Node,
    Pod,
    PodTerminated,
    Record,
    ResourceList,
    SandboxClaim,
    SandboxClaimDeleted,
    SandboxClaimStatus,
    SandboxPoolStatus,
    SandboxTemplate,
    SandboxWarmPool,
    SandboxWarmPoolDeleted,
)
from streams.connection import connect
from streams.process import quiet_gc
from streams.producer import RecordProducer
from streams.settings import Settings

NAMESPACE = "sandbox-perf"
GI = 2**30
MI = 2**20
NODE = ResourceList(cpu=32_000, memory=128 * GI, pods=110)
READY, REFUSED = "Ready", "Refused"
WARM, STARTING, COLD = "warm", "starting", "cold"
CHECKS = ("sandboxes_double_adopted", "pods_double_bound", "nodes_overcommitted", "overcommitted", "allocation_pct")
# agent-sandbox's own figures, for the report: its published run at 45 claims/s, its CI gate on bursts.
REFERENCE = {"agent_sandbox_45_per_s_ms": {"p50": 92, "p99": 376}, "agent_sandbox_burst_p99_gate_ms": 500,
             "goal_1000_per_s_p99_ms": 50}


# --- what a run publishes ------------------------------------------------------------------------


@dataclass(frozen=True)
class Sandbox:
    """A pool's template and refill: what its sandboxes request and run as."""

    name: str
    cpu: int = 100  # millicores
    memory: int = 256 * MI
    runtime: str = "gvisor"
    qos: str = "LS"
    replicas: int = 100
    refill_per_s: float = 500.0
    refill_batch: int = 200

    def template(self) -> SandboxTemplate:
        pod = Pod(uid="", name="", namespace=NAMESPACE, requests=ResourceList(cpu=self.cpu, memory=self.memory),
                  runtime_class_name=self.runtime, labels={QOS_LABEL: self.qos})
        return SandboxTemplate(namespace=NAMESPACE, name=f"{self.name}-template", pod=pod, env_policy="Allowed")

    def pool(self) -> SandboxWarmPool:
        return SandboxWarmPool(namespace=NAMESPACE, name=self.name, template=self.template(), replicas=self.replicas,
                               refill_per_s=self.refill_per_s, refill_batch=self.refill_batch, overflow="Allow")


def claim(pool: str, uid: str) -> SandboxClaim:
    return SandboxClaim(uid=uid, namespace=NAMESPACE, name=uid, warm_pool=pool)


def deleted(c: SandboxClaim) -> SandboxClaimDeleted:
    return SandboxClaimDeleted(uid=c.uid, namespace=c.namespace, name=c.name, warm_pool=c.warm_pool)


def nodes(count: int) -> list[Node]:
    """Nodes that run every shipped runtime (kata-deploy labels the nodes it installed Kata on)."""
    return [Node(name=f"sbx-node-{i:04d}", allocatable=NODE, capacity=NODE, labels={KATA_NODE_LABEL: "true"})
            for i in range(count)]


@dataclass(frozen=True)
class Phase:
    """Claims on a pool of their own: `claims` at `rate` a second (0: all at once, a burst)."""

    claims: int
    rate: float
    sandbox: Sandbox

    @property
    def name(self) -> str:
        return self.sandbox.name


@dataclass(frozen=True)
class WarmRun:
    broker: str = "tansu"
    nodes: int = 250  # 27,500 pods: the 1,000/s phase holds 10,000 claimed sandboxes and a pool of 10,000
    phases: tuple[Phase, ...] = (
        Phase(2700, 45.0, Sandbox("warm-45-per-s", replicas=50, refill_per_s=100.0, refill_batch=20)),
        Phase(10_000, 1000.0, Sandbox("warm-1000-per-s", replicas=10_000, refill_per_s=1000.0, refill_batch=500)),
        Phase(3600, 0.0, Sandbox("burst-3600", replicas=3700)),
    )
    fill_timeout_s: float = 300.0
    stall_s: float = 30.0  # a phase ends when every claim is answered, or nothing was answered this long
    bucket_s: float = 0.1  # the pool depth series: the last status of each bucket
    quick: bool = False

    @classmethod
    def preset(cls, broker: str, quick: bool) -> WarmRun:
        if not quick:
            return cls(broker=broker)
        return cls(broker=broker, nodes=30, quick=True, fill_timeout_s=120.0, stall_s=20.0, phases=(
            Phase(135, 45.0, Sandbox("warm-45-per-s", replicas=20, refill_per_s=100.0, refill_batch=20)),
            Phase(1000, 1000.0, Sandbox("warm-1000-per-s", replicas=1000, refill_per_s=1000.0, refill_batch=500)),
            Phase(360, 0.0, Sandbox("burst-360", replicas=370)),
        ))


CHURN_POOLS = (
    Sandbox("python", cpu=250, memory=512 * MI, runtime="gvisor", qos="LS", replicas=150, refill_per_s=50.0,
            refill_batch=50),
    Sandbox("browser", cpu=1000, memory=2 * GI, runtime="kata-qemu", qos="LS", replicas=60, refill_per_s=20.0,
            refill_batch=20),
    Sandbox("notebook", cpu=2000, memory=4 * GI, runtime="kata-clh", qos="BE", replicas=20, refill_per_s=5.0,
            refill_batch=5),
)


@dataclass(frozen=True)
class ChurnRun:
    broker: str = "tansu"
    nodes: int = 200
    duration_s: float = 600.0  # the day
    mean_rate: float = 30.0  # claims a second over the day; the rate is (1 - swing cos(2 pi t / day)) x mean
    swing: float = 0.6
    life_s: tuple[float, float] = (5.0, 120.0)  # a sandbox lives this long (uniform), then its claim is deleted
    pools: tuple[Sandbox, ...] = CHURN_POOLS
    shares: tuple[float, ...] = (0.6, 0.3, 0.1)  # a claim's pool, drawn by these
    bursts: tuple[tuple[float, str, int], ...] = ((0.25, "python", 400), (0.5, "browser", 200),
                                                  (0.75, "python", 600))  # (share of the day, pool, claims)
    seed: int = 1
    fill_timeout_s: float = 180.0
    stall_s: float = 30.0
    bucket_s: float = 1.0
    quick: bool = False

    @classmethod
    def preset(cls, broker: str, quick: bool) -> ChurnRun:
        if not quick:
            return cls(broker=broker)
        pools = tuple(replace(p, replicas=max(5, p.replicas // 5)) for p in CHURN_POOLS)
        return cls(broker=broker, nodes=20, duration_s=30.0, mean_rate=20.0, life_s=(1.0, 8.0), pools=pools,
                   bursts=((0.3, "python", 60), (0.6, "browser", 30)), fill_timeout_s=120.0, stall_s=20.0,
                   bucket_s=0.5, quick=True)

    def arrivals(self) -> list[tuple[float, Record]]:
        """Claims (a thinned Poisson process over the day, and the bursts) and, where a
        sandbox's life ends within the day, its claim's deletion; in time order."""
        rng = random.Random(self.seed)
        peak = self.mean_rate * (1 + self.swing)
        names = [p.name for p in self.pools]
        claims: list[tuple[float, str]] = []
        t = 0.0
        while True:
            t += rng.expovariate(peak)
            if t >= self.duration_s:
                break
            if rng.random() * peak <= self.mean_rate * (1 - self.swing * math.cos(2 * math.pi * t / self.duration_s)):
                claims.append((t, rng.choices(names, self.shares)[0]))
        claims += [(share * self.duration_s, pool) for share, pool, count in self.bursts for _ in range(count)]
        claims.sort(key=lambda c: c[0])
        events: list[tuple[float, int, Record]] = []
        for i, (at, pool) in enumerate(claims):
            c = claim(pool, f"churn-{i}")
            events.append((at, 0, c))
            end = at + rng.uniform(*self.life_s)
            if end < self.duration_s:
                events.append((end, 1, deleted(c)))
        events.sort(key=lambda e: (e[0], e[1]))
        return [(at, r) for at, _, r in events]


# --- what the run reads back -------------------------------------------------------------------


class Answers:
    """The records read back, folded as they arrive: each claim's first answer and first
    Ready, each pool's statuses."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.read = 0
        self.first: dict[str, tuple[float, SandboxClaimStatus]] = {}  # claim uid -> its first answer
        self.ready: dict[str, tuple[float, SandboxClaimStatus]] = {}  # claim uid -> its first Ready
        self.ready_seen: dict[str, float] = {}  # claim uid -> when this reader got its first Ready
        self.refused: dict[str, tuple[float, SandboxClaimStatus]] = {}
        self.ready_by_pod: dict[str, set[str]] = {}  # sandbox pod uid -> the claims it was Ready for
        self.pools: dict[str, list[tuple[float, SandboxPoolStatus]]] = {}  # pool name -> its statuses

    def update(self) -> None:
        records, received = self.collector.records, self.collector.received
        for i, (ts, _, r) in enumerate(itertools.islice(records, self.read, None), self.read):
            if isinstance(r, SandboxClaimStatus) and r.namespace == NAMESPACE:
                if r.phase in (READY, REFUSED, "Pending"):
                    self.first.setdefault(r.uid, (ts, r))
                if r.phase == READY and r.uid not in self.ready:
                    self.ready[r.uid] = (ts, r)
                    self.ready_seen[r.uid] = received[i]
                    self.ready_by_pod.setdefault(r.pod_uid, set()).add(r.uid)
                elif r.phase == REFUSED:
                    self.refused.setdefault(r.uid, (ts, r))
            elif isinstance(r, SandboxPoolStatus) and r.namespace == NAMESPACE:
                self.pools.setdefault(r.name, []).append((ts, r))
        self.read = len(records)

    def pool(self, name: str) -> SandboxPoolStatus | None:
        statuses = self.pools.get(name)
        return statuses[-1][1] if statuses else None

    def answered(self, uid: str) -> bool:
        return uid in self.ready or uid in self.refused

    async def until(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.update()
            if done():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
            await asyncio.sleep(0.05)

    async def until_answered(self, uids: set[str], stall_s: float) -> None:
        """Until every claim of `uids` is answered (Ready or Refused), or none was for `stall_s`."""
        last, seen = time.monotonic(), -1
        while True:
            self.update()
            answered = sum(1 for u in uids if self.answered(u))
            if answered == len(uids):
                return
            if answered != seen:
                seen, last = answered, time.monotonic()
            elif time.monotonic() - last > stall_s:
                return
            await asyncio.sleep(0.05)


def claim_figures(uids: list[str], published: dict[str, float], answers: Answers) -> dict[str, Any]:
    """The claims' counts by how they were answered, and their latency to Ready (all, and by path)."""
    paths = Counter(answers.first[u][1].path for u in uids if u in answers.first and u not in answers.refused)
    latency = {u: (answers.ready[u][0] - published[u]) * 1000.0 for u in uids if u in answers.ready and u in published}
    seen = [(answers.ready_seen[u] - published[u]) * 1000.0 for u in latency]
    by_path: dict[str, list[float]] = {}
    for u, ms in latency.items():
        by_path.setdefault(answers.first[u][1].path, []).append(ms)
    total = len(uids)
    return {
        "claims_total": total,
        "claims_ready": len(latency),
        "claims_adopted": paths[WARM] + paths[STARTING],
        "claims_warm": paths[WARM],
        "claims_starting": paths[STARTING],
        "claims_cold": paths[COLD],
        "claims_refused": sum(1 for u in uids if u in answers.refused),
        "claims_unanswered": sum(1 for u in uids if not answers.answered(u)),
        "warm_hit_rate": round(paths[WARM] / total, 4) if total else 0.0,
        "claim_latency_ms": latency_figures(list(latency.values())),
        "claim_latency_seen_ms": latency_figures(seen),
        "claim_latency_by_path_ms": {path: latency_figures(values) for path, values in sorted(by_path.items())},
    }


def latency_figures(values: list[float]) -> dict[str, float]:
    return {**percentiles(values), "max": round(max(values), 2) if values else 0.0}


def depth_series(statuses: list[tuple[float, SandboxPoolStatus]], t0: float, t1: float,
                 bucket_s: float) -> dict[str, list[float]]:
    """The pool's depth between t0 and t1 (seconds from t0): the last status of each bucket."""
    buckets: dict[int, SandboxPoolStatus] = {}
    before: SandboxPoolStatus | None = None
    for ts, s in statuses:
        if ts < t0:
            before = s
        elif ts <= t1:
            buckets[int((ts - t0) / bucket_s)] = s
    out: dict[str, list[float]] = {"t": [], "ready": [], "starting": [], "claimed": []}
    last = before
    for b in range(int((t1 - t0) / bucket_s) + 1):
        last = buckets.get(b, last)
        if last is not None:
            out["t"].append(round(b * bucket_s, 3))
            out["ready"].append(last.ready)
            out["starting"].append(last.starting)
            out["claimed"].append(last.claimed)
    return out


def fast_path_share(collector: Collector, t0: float, t1: float) -> float | None:
    """Of the pods the scheduler placed between t0 and t1 (its samples, about a second apart,
    so the window is widened by one), the share placed as members of an equivalence class."""
    scheduled = batched = 0
    for ts, a in collector.of(AttemptsSample):
        if t0 <= ts <= t1 + 1.0 and a.result == "scheduled":
            scheduled += a.count
            batched += a.batched
    return round(batched / scheduled, 4) if scheduled else None


class Harness:
    """The run's connection to the system: the producer, the readers, the nodes and pools published."""

    def __init__(self, producer: RecordProducer, collector: Collector, terminations: Collector,
                 workers: list[Any], node_list: list[Node]) -> None:
        self.producer, self.collector, self.terminations = producer, collector, terminations
        self.answers = Answers(collector)
        self.workers = workers
        self.nodes = node_list
        self.requests: dict[str, ResourceList] = {}  # pool name -> what its sandboxes request
        self.published: dict[str, float] = {}  # claim uid -> when it was published (its `created`)
        self.lags: list[float] = []  # how late each record went, against the schedule (s)

    async def publish(self, records: list[Record]) -> None:
        await self.producer.flush(await self.producer.publish(topics.SANDBOX, records))

    async def fill(self, pools: list[Sandbox], timeout_s: float) -> float:
        """Publish the pools and wait until each reports its depth; returns how long that took."""
        started = time.monotonic()
        for p in pools:
            self.requests[p.name] = p.template().pod.requests
        await self.publish([p.pool() for p in pools])

        def full() -> bool:
            return all((s := self.answers.pool(p.name)) is not None and s.ready >= p.replicas for p in pools)

        await self.answers.until(full, timeout_s, f"pools {', '.join(p.name for p in pools)} to fill")
        return round(time.monotonic() - started, 2)

    async def claims(self, arrivals: list[tuple[float, Record]]) -> float:
        """Publish on schedule (open loop); returns t0, the schedule's start (unix s)."""
        def stamp(r: Record, now: float) -> Record:
            if isinstance(r, SandboxClaim):
                self.published[r.uid] = now
                return replace(r, created=now)
            return r

        t0 = time.time()
        await publish_on_schedule(self.producer, topics.SANDBOX, arrivals, t0, stamp, self.lags)
        return t0

    def cpu(self) -> dict[str, float]:
        return {role: cpu_s(p.pid) for role, p in zip(("state", "scheduler"), self.workers, strict=False)}

    def checks(self, t0: float, until: float | None = None) -> dict[str, Any]:
        return topic_checks(self.answers, self.collector, self.terminations, self.nodes, self.requests, t0, until)


def topic_checks(answers: Answers, collector: Collector, terminations: Collector, node_list: list[Node],
                 pool_requests: dict[str, ResourceList], t0: float, until: float | None = None) -> dict[str, Any]:
    """The consistency checks from the topics (sandboxes named Ready by two claims, pods bound
    twice, nodes over-committed), the nodes the sandboxes of the pools named in `pool_requests`
    used (the most at once, and at `until`), and allocation over time from t0 (`perf.figures`)."""
    answers.update()
    requests: dict[str, dict[str, int]] = {}
    bindings = []
    for ts, b in collector.of(Binding):
        pool = pool_of(b.uid)
        name = pool.split("/", 1)[1] if pool is not None else ""
        if name in pool_requests:
            requests[b.uid] = dict(pool_requests[name])
            bindings.append(Placement(ts, b.uid, b.node))
    ended: dict[str, Placement] = {}  # the first of each pod's (through a bridge, its owner and the bridge send one)
    for ts, t in terminations.of(PodTerminated):
        if t.uid in requests:
            ended.setdefault(t.uid, Placement(ts, t.uid, t.node))
    ends = list(ended.values())
    capacity = {n.name: dict(n.allocatable) for n in node_list}
    checked = check(allocatable=capacity, requests=requests, bindings=bindings, terminations=ends)
    first: dict[str, tuple[float, str]] = {}
    for placed in sorted(bindings, key=lambda p: p.time):
        first.setdefault(placed.uid, (placed.time, placed.node))
    figures = allocation(capacity, requests, first, [(e.time, e.uid) for e in ends], t0)
    return {"sandboxes_double_adopted": sum(1 for claims in answers.ready_by_pod.values() if len(claims) > 1),
            "pods_double_bound": checked.pods_double_bound, "nodes_overcommitted": checked.nodes_overcommitted,
            "overcommitted": dict(list(checked.overcommitted.items())[:10]),
            "nodes_used": nodes_used(bindings, ends, until),
            "allocation_pct": figures["allocation_pct"], "allocation_series_pct": figures["allocation_series_pct"]}


def nodes_used(bindings: list[Placement], ends: list[Placement], until: float | None) -> dict[str, int]:
    """Distinct nodes with a live sandbox pod (bound, not terminated): the most at any time,
    and at `until` (the end when None)."""
    live: Counter[str] = Counter()
    most = 0
    at_until: int | None = None
    for bound, p in timeline(bindings, ends):
        if until is not None and at_until is None and p.time > until:
            at_until = len(live)
        live[p.node] += 1 if bound else -1
        if live[p.node] <= 0:
            del live[p.node]
        most = max(most, len(live))
    return {"max": most, "end": len(live) if at_until is None else at_until}


@contextlib.asynccontextmanager
async def _harness(broker: str, settings: Settings, node_list: list[Node]) -> Any:
    async with system(settings, settings.kafka.bootstrap, broker_kind=broker) as (running, workers):
        k = running.kafka
        kafka = connect(k)
        quiet_gc(running.worker.gc_threshold)
        collector = Collector(kafka, [topics.SANDBOX_STATUS, topics.BINDINGS, topics.PROFILING], k.partitions)
        terminations = Collector(kafka, [topics.NODE_INBOX], k.partitions, kinds=(PodTerminated,))
        await collector.start()
        await terminations.start()
        try:
            async with RecordProducer(kafka, k.partitions, linger_ms=0) as producer:  # a claim's clock runs from `created`
                probe = Pod(uid="perf-probe", name="perf-probe", namespace="perf", requests=ResourceList(cpu=1))
                await start_up(producer, collector, node_list, probe, k.partitions, 180.0)
                yield Harness(producer, collector, terminations, workers, node_list)
        finally:
            await terminations.stop()
            await collector.stop()


class Usage:
    """CPU of the run's processes (this harness, and its children: the broker and the
    workers, by role) and of the whole machine over a window: what each took, and how much
    other work took beside the run."""

    def __init__(self) -> None:
        self.at = time.monotonic()
        self.ours, self.machine = self._ours(), machine_busy_s()

    @staticmethod
    def _ours() -> dict[str, float]:
        out = {"harness": self_cpu_s()}
        for pid in children(os.getpid()):
            role = _role(pid)
            out[role] = out.get(role, 0.0) + cpu_s(pid) + sum(cpu_s(c) for c in children(pid))
        return out

    def since(self) -> dict[str, Any]:
        wall = max(time.monotonic() - self.at, 1e-9)
        now, machine = self._ours(), machine_busy_s() - self.machine
        used = {role: max(0.0, now[role] - self.ours.get(role, 0.0)) for role in now}
        ours = sum(used.values())
        cores = os.cpu_count() or 1
        return {"cores": cores, "busy_pct": round(min(100.0, machine / (cores * wall) * 100.0), 1),
                "run_cores": round(ours / wall, 2), "others_cores": round(max(0.0, machine - ours) / wall, 2),
                "cores_by_process": {role: round(v / wall, 2) for role, v in sorted(used.items())}}


def _role(pid: int) -> str:
    """What a child of the harness is: the broker, or a worker by its roles."""
    try:
        argv = (Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"))
    except OSError:
        return "other"
    if b"--roles" in argv:
        return argv[argv.index(b"--roles") + 1].decode()
    program = Path(argv[0].decode(errors="replace")).name
    if program in ("kube-apiserver", "etcd", "kwok"):
        return program
    text = b" ".join(argv)
    return "broker" if b"tansu" in text or b"kafka" in text else "other"


# --- sandbox-warm ------------------------------------------------------------------------------


async def run_warm(cfg: WarmRun, settings: Settings) -> dict[str, Any]:
    started = time.perf_counter()
    node_list = nodes(cfg.nodes)
    async with _harness(cfg.broker, settings, node_list) as h:
        startup_s = round(time.perf_counter() - started, 2)
        usage = Usage()
        first = time.time()
        phases = {}
        for phase in cfg.phases:
            phases[phase.name] = await _warm_phase(h, cfg, phase)
        checks = h.checks(first)
        machine = usage.since()
        wall = round(time.time() - first, 2)
    everything = [u for u in h.published]
    totals = claim_figures(everything, h.published, h.answers)
    phase_cdfs = {name: p.pop("_latencies") for name, p in phases.items()}
    result = {
        "scenario": "sandbox-warm" + (" (quick)" if cfg.quick else ""),
        "broker": cfg.broker, "startup_s": startup_s, "wall_s": wall,
        **totals,
        **{k: checks[k] for k in CHECKS},
        "fast_path_share": fast_path_share(h.collector, first, time.time()),
        "phases": phases,
        "goals": warm_goals(cfg, phases),
        "reference": REFERENCE,
        "publish_lag_ms": latency_figures([lag * 1000.0 for lag in h.lags]),
        "machine": machine,
        "config": asdict(cfg),
        "pool_depth_series": {name: p.pop("pool_depth_series") for name, p in phases.items()},
        "latency_cdf_ms": {name: latency_cdf(values) for name, values in phase_cdfs.items()},
        "allocation_series_pct": checks["allocation_series_pct"],
    }
    return result


async def _warm_phase(h: Harness, cfg: WarmRun, phase: Phase) -> dict[str, Any]:
    fill_s = await h.fill([phase.sandbox], cfg.fill_timeout_s)
    uids = [f"{phase.name}-{i}" for i in range(phase.claims)]
    arrivals: list[tuple[float, Record]] = [(i / phase.rate if phase.rate else 0.0, claim(phase.name, u))
                                            for i, u in enumerate(uids)]
    lags = len(h.lags)
    cpu, usage = h.cpu(), Usage()
    t0 = await h.claims(arrivals)
    published_s = time.time() - t0
    await h.answers.until_answered(set(uids), cfg.stall_s)
    machine = usage.since()
    answered = [h.answers.first[u][0] for u in uids if u in h.answers.first]
    t1 = max(answered, default=time.time())
    cpu_after = h.cpu()
    figures = claim_figures(uids, h.published, h.answers)
    statuses = h.answers.pools.get(phase.name, [])
    depth = depth_series(statuses, t0, t1, cfg.bucket_s)
    out = {
        "offered_rate_per_s": phase.rate or None, "claims": phase.claims, "pool_replicas": phase.sandbox.replicas,
        "refill_per_s": phase.sandbox.refill_per_s, "refill_batch": phase.sandbox.refill_batch,
        "fill_s": fill_s, "publish_s": round(published_s, 3),
        "publish_lag_ms": latency_figures([lag * 1000.0 for lag in h.lags[lags:]]),
        **figures,
        "pool_depth_min": min(depth["ready"], default=0),
        "fast_path_share": fast_path_share(h.collector, t0, t1),
        "worker_cpu_s": {role: round(cpu_after[role] - cpu[role], 2) for role in cpu},
        "machine": machine,
        "window_s": round(t1 - t0, 3),
        "pool_depth_series": depth,
        "_latencies": [(h.answers.ready[u][0] - h.published[u]) * 1000.0 for u in uids if u in h.answers.ready],
    }
    # The claims and the pool go: the next phase starts on free nodes.
    await h.publish([deleted(claim(phase.name, u)) for u in uids] + [SandboxWarmPoolDeleted(NAMESPACE, phase.name)])

    def empty() -> bool:
        s = h.answers.pool(phase.name)
        return s is not None and s.replicas == s.ready == s.starting == s.claimed == 0

    await h.answers.until(empty, cfg.fill_timeout_s, f"pool {phase.name} to empty")
    return out


def warm_goals(cfg: WarmRun, phases: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """Issue 30's goals, where the run has the phase (the quick run's are smaller)."""
    goals = {}
    for phase in cfg.phases:
        p = phases[phase.name]
        complete = p["claims_ready"] == p["claims_total"]
        if phase.rate >= 1000:
            goals["p99_le_50ms_at_1000_per_s"] = complete and p["claim_latency_ms"]["p99"] <= 50.0
        elif phase.rate == 0:
            goals["burst_p99_le_500ms"] = complete and p["claim_latency_ms"]["p99"] <= 500.0
        else:
            goals["every_claim_warm_at_45_per_s"] = p["claims_warm"] == p["claims_total"]
    return goals


# --- sandbox-churn -----------------------------------------------------------------------------


async def run_churn(cfg: ChurnRun, settings: Settings) -> dict[str, Any]:
    started = time.perf_counter()
    node_list = nodes(cfg.nodes)
    arrivals = cfg.arrivals()
    async with _harness(cfg.broker, settings, node_list) as h:
        startup_s = round(time.perf_counter() - started, 2)
        fill_s = await h.fill(list(cfg.pools), cfg.fill_timeout_s)
        usage = Usage()
        cpu = h.cpu()
        t0 = await h.claims(arrivals)
        day_end = t0 + cfg.duration_s
        uids = [r.uid for _, r in arrivals if isinstance(r, SandboxClaim)]
        await h.answers.until_answered(set(uids), cfg.stall_s)
        cpu_after = h.cpu()
        checks = h.checks(t0, until=day_end)
        machine = usage.since()
    end = time.time()
    by_pool: dict[str, list[str]] = {}
    for _, r in arrivals:
        if isinstance(r, SandboxClaim):
            by_pool.setdefault(r.warm_pool, []).append(r.uid)
    pools = {name: claim_figures(pool_uids, h.published, h.answers) for name, pool_uids in by_pool.items()}
    for name, figures in pools.items():
        statuses = h.answers.pools.get(name, [])
        figures["pool_depth_min"] = min((s.ready for ts, s in statuses if t0 <= ts <= day_end), default=0)
    latencies = {name: [(h.answers.ready[u][0] - h.published[u]) * 1000.0 for u in pool_uids if u in h.answers.ready]
                 for name, pool_uids in by_pool.items()}
    result = {
        "scenario": "sandbox-churn" + (" (quick)" if cfg.quick else ""),
        "broker": cfg.broker, "startup_s": startup_s, "fill_s": fill_s, "wall_s": round(end - t0, 2),
        **claim_figures(uids, h.published, h.answers),
        "claims_deleted": sum(1 for _, r in arrivals if isinstance(r, SandboxClaimDeleted)),
        **{k: checks[k] for k in CHECKS},
        "nodes_used": checks["nodes_used"],
        "fast_path_share": fast_path_share(h.collector, t0, end),
        "pools": pools,
        "publish_lag_ms": latency_figures([lag * 1000.0 for lag in h.lags]),
        "worker_cpu_s": {role: round(cpu_after[role] - cpu[role], 2) for role in cpu},
        "machine": machine,
        "config": asdict(cfg),
        "pool_depth_series": {name: depth_series(h.answers.pools.get(name, []), t0, day_end, cfg.bucket_s)
                              for name in by_pool},
        "latency_cdf_ms": {name: latency_cdf(values) for name, values in latencies.items()},
        "allocation_series_pct": checks["allocation_series_pct"],
    }
    return result


def succeeded(result: dict[str, Any]) -> bool:
    """The invariants (never the timings): no sandbox adopted twice, no pod bound twice, no node
    over-committed, every claim answered."""
    return all(result[k] == 0 for k in ("sandboxes_double_adopted", "pods_double_bound", "nodes_overcommitted",
                                        "claims_unanswered"))


PHASE_ROWS = ("claims_total", "claims_warm", "claims_starting", "claims_cold", "claims_refused", "claims_unanswered",
              "warm_hit_rate", "claim_latency_ms", "claim_latency_seen_ms", "claim_latency_decided_ms", "pool_depth_min",
              "fast_path_share", "publish_lag_ms", "create_round_trip_ms", "create_lag_s", "fill_s")


def report(result: dict[str, Any], plots: list[str] | None = None) -> str:
    """The Markdown report: the run's figures, then one column per phase (or pool)."""
    groups = result.get("phases") or result.get("pools") or {}
    top = {k: v for k, v in result.items()
           if k not in ("phases", "pools", "config", "pool_depth_series", "latency_cdf_ms", "allocation_series_pct")}
    text = scenario_report(top).rstrip("\n")
    if groups:
        names = list(groups)
        lines = ["", f"| {'phase' if 'phases' in result else 'pool'} | " + " | ".join(names) + " |",
                 "|---|" + "---|" * len(names)]
        for row in (r for r in PHASE_ROWS if any(r in g for g in groups.values())):
            cells = []
            for name in names:
                value = groups[name].get(row, "")
                cells.append(", ".join(f"{k} {v}" for k, v in value.items()) if isinstance(value, dict) else str(value))
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
        text += "\n" + "\n".join(lines)
    text += "\n\n" + "\n".join(f"![{p.rsplit('.', 1)[0]}]({p})" for p in plots or []) + "\n"
    return text
