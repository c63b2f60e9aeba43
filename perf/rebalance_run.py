"""`koordstream perf run rebalance-moves`: the rebalancer through the real system: a lopsided
cluster evened out by ReservationFirst moves, after a scale-down ranked by the rebalancer and
carried out by the workload's controller.

The system (`perf.demo.system`) runs a state worker, a scheduler worker and `rebalancers`
workers with only the `rebalancer` role (one leads; with `kill_leader`, the leader is killed
with SIGKILL once the first moves began, and the run measures how long until another leads),
against the embedded Tansu or Apache Kafka. The harness (`Harness`, also used by
`perf.rebalance_scenarios`) plays the cluster around them: ReplicaSet-like workloads and the
Eviction API with PodDisruptionBudgets (`perf.controller.Workloads`), and Kwok's pod-ready
stage (`infra/kwok/pod-ready.yaml`, its delay `ready_delay_s` per pod): a bound pod becomes
Running and Ready when the stage runs, and the harness then publishes the Pod with its node
and phase, as a bridge watching the pods would.

1. Lopsided on purpose: half the nodes cordoned, the CPU-heavy workload placed on the others;
   then the other half cordoned, the memory-heavy workload placed. Each node now has its CPU
   or its memory mostly allocated and the other mostly stranded.
2. A ScaleDownEvent asks the CPU-heavy workload to lose `scale_down_by` pods. The rebalancer
   (CalculateOnly) publishes pod-deletion-cost annotations; the controller then deletes in
   Kubernetes' order, which honours them. Reported: nodes left empty, and how many Kubernetes'
   order without the costs would have left from the same state.
3. With `budget`, a PodDisruptionBudget (at most one pod down) covers the memory-heavy
   workload, on `disruption-budgets` for the rebalancer and in the harness's Eviction API.
   Every node opens, and is labelled for the FragmentationAware `nodeSelector` (before that the
   planner had no source node). The rebalancer plans (`deschedulingInterval` short), reserves,
   and sends EvictionCommands. The harness executes each through the Eviction API: the pod
   terminates at its node (`PodTerminated` into `node-inbox`) and is deleted (`PodDeleted` on
   `pods`), and its controller creates the replacement, which the scheduler binds into the
   reservation. Availability is sampled from the outside: per workload, ready replicas against
   desired minus its `maxUnavailablePerWorkload` (the gap, in replica-seconds, must stay 0).
   The moves are over when no job runs and nothing new arrived for `quiet_s` (or after
   `moves_timeout_s`). The jobs' ttl is MigrationController's `defaultJobTTL` (`job_ttl_s`,
   60 s here, shorter than Koordinator's 5 min default): a move whose replacement was bound
   into another move's reservation of the same workload keeps waiting for its own until the
   ttl (it cannot tell that pod was its replacement; migration.py), so the moves settle only
   after it, and `moves_timeout_s` must be longer than `job_ttl_s + quiet_s`.

The result: the scale-down's empty nodes, the objective (sum and max of node std, stranded
capacity) before and after the moves, the migration jobs by phase and reason, evictions (and
how the jobs that evicted ended), the availability gap, and the consistency check (`perf.checker`) over every binding and
termination.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agents.rebalance import config as rebalance_config
from agents.rebalance.arbitration import ArbitrationArgs
from agents.rebalance.binpack import DELETION_COST, Replica, kubernetes_order
from agents.rebalance.objective import measure, typical_requests
from agents.rebalance.rebalancer import budget_of
from agents.rebalance.view import ClusterView
from perf.checker import Placement, check
from perf.collector import Collector
from perf.controller import Workloads
from perf.demo import start_up, system
from perf.kwok import Lifecycle, load_stages
from perf.run import pod_object
from perf.soak import free_port, metric, scrape
from schemas import topics
from schemas.records import (
    Binding,
    EvictionCommand,
    MigrationJob,
    Node,
    Pod,
    PodDeleted,
    PodDisruptionBudget,
    PodTerminated,
    ResourceList,
    ScaleDownEvent,
)
from streams.connection import connect
from streams.producer import RecordProducer
from streams.settings import Settings

GI = 2**30
NODE = ResourceList(cpu=8000, memory=32 * GI, pods=110)
NAMESPACE = "rebalance"


@dataclass(frozen=True)
class MoveRunConfig:
    broker: str = "tansu"
    nodes_per_side: int = 3
    pods_per_node: int = 3  # CPU-heavy pods: 2 CPU, 1 GiB; memory-heavy: 0.25 CPU, 8 GiB
    interval_s: float = 2.0
    moves_timeout_s: float = 120.0  # longer than job_ttl_s + quiet_s (see below)
    quiet_s: float = 8.0  # no job running and none started for this long: the moves are over
    scale_down_by: int = 3  # a node's worth: the rebalancer's ranks can empty one node
    timeout_s: float = 60.0
    rebalancers: int = 1  # workers with only the rebalancer role; one leads
    kill_leader: bool = False  # kill -9 the leading one once the first moves began (needs 2 or more)
    budget: bool = True  # a PodDisruptionBudget on the memory-heavy workload: one pod of it down at a time
    ready_delay_s: float = 1.0  # Kwok's pod-ready stage: a bound pod is Running and Ready this long after
    # MigrationController's defaultJobTTL and evictionTTLMargin. A move whose replacement went
    # into a sibling's reservation waits for its own until its ttl (migration.py), so the
    # moves settle only after the longest ttl: `moves_timeout_s` must be longer than it.
    # Shorter than Koordinator's 5 min: here a move takes seconds.
    job_ttl_s: float = 60.0
    eviction_ttl_margin_s: float = 15.0

    def rebalancer_yaml(self) -> str:
        return (f"deschedulingInterval: {self.interval_s}s\n"
                "profiles:\n- name: default\n  plugins: {balance: {enabled: [FragmentationAware, ScaleDownBinPack]}}\n"
                "  pluginConfig:\n  - {name: FragmentationAware, args: {minPodAge: 0s, moveInterval: 0s,\n"
                f"      nodeSelector: {{matchLabels: {{{MOVABLE}: 'yes'}}}}}}}}\n"
                f"  - {{name: MigrationController, args: {{defaultJobTTL: {self.job_ttl_s:g}s,"
                f" evictionTTLMargin: {self.eviction_ttl_margin_s:g}s}}}}\n")


CPU_HEAVY = Pod(uid="t", name="t", namespace=NAMESPACE, requests=ResourceList(cpu=2000, memory=GI))
MEMORY_HEAVY = Pod(uid="t", name="t", namespace=NAMESPACE, requests=ResourceList(cpu=250, memory=8 * GI))
SAMPLE_S = 0.25  # availability is sampled this often
POD_READY = Path(__file__).resolve().parents[1] / "infra" / "kwok" / "pod-ready.yaml"
READY_DELAY = "pod-ready.stage.kwok.x-k8s.io/delay"  # the stage's delay, per pod
MOVABLE = "koordstream.io/rebalance"  # the FragmentationAware nodeSelector: nodes it may move pods off


def _node(i: int, cordoned: bool, open_to_moves: bool = False) -> Node:
    return Node(name=f"node-{i}", allocatable=NODE, capacity=NODE, unschedulable=cordoned,
                labels={MOVABLE: "yes"} if open_to_moves else {})


class Harness:
    """Bindings, evictions and jobs read back; the controller's answers published."""

    def __init__(self, producer: RecordProducer, collector: Collector, nodes: list[Node],
                 ready_delay_s: float = 0.0) -> None:
        self.producer, self.collector = producer, collector
        self.ready_delay_s = ready_delay_s
        self.lifecycle = Lifecycle(load_stages([POD_READY]))
        self.nodes = {n.name: n for n in nodes}
        self.workloads = Workloads()
        self.pods: dict[str, Pod] = {}
        self.node: dict[str, str] = {}
        self.terminated: list[Placement] = []
        self.refused: Counter[str] = Counter()
        self.gap = 0.0  # replica-seconds below desired minus maxUnavailablePerWorkload
        self.lowest: dict[str, int] = {}  # workload -> fewest ready replicas seen (after it was whole)
        self.whole: set[str] = set()
        self._read = 0
        self._probes = 0
        self._sampled = time.monotonic()
        self._jobs: dict[str, MigrationJob] = {}
        self._typical: Any = None  # the request distribution of the first measure, kept for the next

    async def publish(self, topic: str, records: list[Any]) -> None:
        if records:
            await self.producer.flush(await self.producer.publish(topic, records))

    async def change_nodes(self, nodes: list[Node], timeout_s: float) -> None:
        """Publish changed nodes (a cordon moved) and wait until the scheduler places by them:
        the owners reported each one's new record, then a probe pod went through the whole
        pipeline. The scheduler hears of a node from the owners (`state-changes`) and of a pod
        from `pods` directly, so pods published right after the nodes could be placed by the old
        cordons (a CI run placed memory-heavy pods beside the CPU-heavy ones: nothing was
        lopsided and nothing moved)."""
        wanted = {n.name: n.unschedulable for n in nodes}
        self._probes += 1
        probe = Pod(uid=f"perf-probe-{self._probes}", name=f"perf-probe-{self._probes}", namespace="perf",
                    requests=ResourceList(cpu=1))
        await start_up(self.producer, self.collector, nodes, probe, self.collector.partitions, timeout_s,
                       ready=lambda n: n.unschedulable == wanted[n.name])

    async def add(self, name: str, template: Pod, replicas: int, age_s: float = 0.0) -> list[str]:
        """A workload's pods published; `age_s`: created that long ago (as if running since)."""
        template = replace(template, labels={**template.labels, "app": name},
                           annotations={**template.annotations, READY_DELAY: f"{int(self.ready_delay_s * 1000)}ms"})
        pods = self.workloads.add(NAMESPACE, name, template, replicas, now=time.time() - age_s)
        self.pods.update((p.uid, p) for p in pods)
        await self.publish(topics.PODS, pods)
        return [p.uid for p in pods]

    async def step(self) -> None:
        records = self.collector.records
        new, self._read = records[self._read:], len(records)
        created: list[Pod] = []
        running: list[Pod] = []
        ended: list[PodTerminated] = []
        deleted: list[PodDeleted] = []
        for _, _, r in new:
            if isinstance(r, Binding) and r.uid in self.pods and r.uid not in self.node:
                self.node[r.uid] = r.node
                self.workloads.bound(r.uid, r.node)
                self.lifecycle.upsert("Pod", r.uid, pod_object(self.pods[r.uid], r.node), time.monotonic())
            elif isinstance(r, EvictionCommand) and r.uid in self.node:
                answer = self.workloads.evict(r.uid, now=time.time())
                if not answer.allowed:
                    self.refused[answer.reason] += 1
                    continue
                self.lifecycle.forget("Pod", r.uid)
                ended.append(PodTerminated(uid=r.uid, node=self.node[r.uid], reason="Evicted"))
                deleted.append(PodDeleted(uid=r.uid, name=r.name, namespace=r.namespace))
                self.terminated.append(Placement(time.time(), r.uid, self.node[r.uid]))
                created += answer.replacements
            elif isinstance(r, MigrationJob):
                mine = self._jobs.get(r.uid)
                if mine is None or r.version >= mine.version:
                    self._jobs[r.uid] = r
            elif isinstance(r, Pod) and r.uid in self.pods and DELETION_COST in r.annotations:
                self.workloads.set_costs({r.uid: int(r.annotations[DELETION_COST])})
        for t in self.lifecycle.due(time.monotonic()):
            if t.phase == "Running" and t.key in self.pods:  # Ready: the pod-ready stage ran
                self.workloads.ready(t.key, time.time())
                running.append(replace(self.pods[t.key], node_name=self.node[t.key], phase="Running"))
                self.lifecycle.forget("Pod", t.key)
        self.pods.update((p.uid, p) for p in created)
        await self.publish(topics.NODE_INBOX, ended)
        await self.publish(topics.PODS, [*running, *deleted, *created])
        self._sample()

    def _sample(self) -> None:
        now = time.monotonic()
        if now - self._sampled < SAMPLE_S:
            return
        dt, self._sampled = now - self._sampled, now
        for key, (ready, desired) in self.workloads.availability().items():
            if ready >= desired:
                self.whole.add(key)
            if key in self.whole:
                self.lowest[key] = min(self.lowest.get(key, ready), ready)
                self.gap += max(0, desired - ArbitrationArgs().max_unavailable(desired) - ready) * dt

    async def until(self, done: Any, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                return False
            await self.step()
            await asyncio.sleep(0.05)
        return True

    async def scale_down(self, workload: str, remove: int, timeout_s: float) -> tuple[list[str], bool]:
        """Ask `workload` to lose `remove` pods (a ScaleDownEvent); once the rebalancer
        published every one of its pods' deletion costs (or `timeout_s` passed), the controller
        deletes in Kubernetes' order, which honours them: the pods go (PodTerminated at their
        node, PodDeleted). The pods removed, and whether the workload was ready and the ranks
        came in time.

        The workload is asked once each of its pods is bound and Ready: Kubernetes deletes a
        pod not Ready before any Ready one whatever its deletion cost, so a pod whose pod-ready
        stage had not run yet would go first and the ranks would not decide (a CI run scaled
        down while the last-bound pod was still starting, and no node emptied)."""
        key = f"{NAMESPACE}/ReplicaSet/{workload}"
        w = self.workloads.workloads[key]
        settled = await self.until(lambda: all(m.ready and m.node for m in w.members.values()), timeout_s)
        asked, uids = len(self.collector.records), set(w.members)
        await self.publish(topics.SCALE_DOWN, [ScaleDownEvent(workload=workload, namespace=NAMESPACE, replicas=remove)])

        def ranked() -> bool:
            return uids <= {r.uid for _, _, r in self.collector.records[asked:]
                            if isinstance(r, Pod) and DELETION_COST in r.annotations}

        in_time = await self.until(ranked, timeout_s) and settled
        await self.step()
        removed, _ = self.workloads.scale(key, w.replicas - remove, now=time.time())
        await self.publish(topics.NODE_INBOX, [PodTerminated(uid=u, node=self.node[u], reason="ScaledDown")
                                               for u in removed])
        await self.publish(topics.PODS, [PodDeleted(uid=u, name=u, namespace=NAMESPACE) for u in removed])
        self.terminated += [Placement(time.time(), u, self.node[u]) for u in removed]
        return removed, in_time

    def settled(self, quiet_s: float) -> Callable[[], bool]:
        """A test for `until`: some job began, none runs, and nothing arrived for `quiet_s`."""
        seen = [time.monotonic(), 0]

        def done() -> bool:
            if len(self.collector.records) != seen[1]:
                seen[:] = [time.monotonic(), len(self.collector.records)]
                return False
            jobs = self.jobs()
            running = [j for j in jobs.values() if j.phase not in ("Succeeded", "Failed", "Aborted")]
            return bool(jobs) and not running and time.monotonic() - seen[0] > quiet_s

        return done

    def bound_now(self) -> list[Pod]:
        """The workloads' pods, placed where their bindings put them."""
        return [replace(m.pod, node_name=m.node) for w in self.workloads.workloads.values()
                for m in w.members.values() if m.node]

    def objective(self) -> dict[str, float]:
        view = ClusterView.build(self.nodes.values(), self.bound_now())
        columns = view.columns(("cpu", "memory"))
        if self._typical is None:
            self._typical = typical_requests(view.vectors, columns)
        return measure(view, columns, typical=self._typical).as_dict()

    def empty_nodes(self) -> int:
        busy = {p.node_name for p in self.bound_now()}
        return sum(1 for n in self.nodes if n not in busy)

    def jobs(self) -> dict[str, MigrationJob]:
        """Each migration job as last read (its highest version)."""
        return self._jobs


async def run_moves(cfg: MoveRunConfig, settings: Settings, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    rebalance_config.load(cfg.rebalancer_yaml())  # refused here, naming the field, rather than in the worker
    if cfg.moves_timeout_s <= cfg.job_ttl_s + cfg.quiet_s:
        raise ValueError(f"moves_timeout_s={cfg.moves_timeout_s:g} must be longer than defaultJobTTL "
                         f"({cfg.job_ttl_s:g}s) plus quiet_s: a move may wait for its ttl")
    with tempfile.TemporaryDirectory(prefix="koordstream-rebalance-") as tmp:
        path = Path(tmp) / "rebalancer.yaml"
        path.write_text(cfg.rebalancer_yaml())
        env = {"KOORDSTREAM_REBALANCER_CONFIG": str(path), "KOORDSTREAM_REBALANCER_TICK_S": "0.1", **(extra_env or {})}
        ports = [free_port() for _ in range(cfg.rebalancers)]
        async with system(settings, broker_kind=cfg.broker, rebalancers=cfg.rebalancers, extra_env=env,
                          metrics_ports=[0, 0, *ports]) as (running, workers):
            return await _drive(cfg, running, dict(zip(ports, workers[2:], strict=True)))


async def _disruption_budget(h: Harness, workload: str, max_unavailable: int) -> None:
    """A PodDisruptionBudget over a workload's pods, published for the rebalancer and kept by
    the harness's Eviction API (which would answer 429 to an eviction breaking it)."""
    pdb = PodDisruptionBudget(uid=f"{NAMESPACE}/{workload}", name=workload, namespace=NAMESPACE,
                              selector={"matchLabels": {"app": workload}}, max_unavailable=str(max_unavailable))
    h.workloads.budgets = (*h.workloads.budgets, budget_of(pdb))
    await h.publish(topics.DISRUPTION_BUDGETS, [pdb])


async def _leader(rebalancers: dict[int, Any]) -> tuple[int, Any] | None:
    """The rebalancer worker that leads now (its metrics port and process), if one does."""
    for port, proc in rebalancers.items():
        with contextlib.suppress(OSError):
            if proc.poll() is None and metric(await scrape(port), "koordstream_rebalancer_leading") == 1.0:
                return port, proc
    return None


async def _drive(cfg: MoveRunConfig, settings: Settings, rebalancers: dict[int, Any]) -> dict[str, Any]:
    kafka, partitions = connect(settings.kafka), settings.kafka.partitions
    half = cfg.nodes_per_side
    collector = Collector(kafka, [topics.BINDINGS, topics.EVICTIONS, topics.MIGRATIONS, topics.PODS], partitions)
    await collector.start()
    try:
        async with RecordProducer(kafka, partitions) as producer:
            nodes = [_node(i, cordoned=i >= half) for i in range(2 * half)]
            probe = Pod(uid="rebalance-probe", name="rebalance-probe", namespace="perf", requests=ResourceList(cpu=1))
            await start_up(producer, collector, nodes, probe, partitions, 120.0)
            h = Harness(producer, collector, nodes, cfg.ready_delay_s)
            wanted = set(await h.add("cpu", CPU_HEAVY, half * cfg.pods_per_node))
            if not await h.until(lambda: wanted <= set(h.node), cfg.timeout_s):
                raise TimeoutError("the CPU-heavy pods were not all bound")
            await h.change_nodes([_node(i, cordoned=i < half) for i in range(2 * half)], cfg.timeout_s)
            wanted |= set(await h.add("mem", MEMORY_HEAVY, half * cfg.pods_per_node))
            if not await h.until(lambda: wanted <= set(h.node), cfg.timeout_s):
                raise TimeoutError("the memory-heavy pods were not all bound")
            scale_down = await _scale_down(h, cfg)
            if cfg.budget:
                await _disruption_budget(h, "mem", max_unavailable=1)
            h.nodes = {n.name: n for n in (_node(i, cordoned=False, open_to_moves=True) for i in range(2 * half))}
            await h.publish(topics.NODES, list(h.nodes.values()))
            before = h.objective()
            started = time.monotonic()
            failover: dict[str, Any] = {}
            if cfg.kill_leader:
                failover = await _kill_the_leader(h, rebalancers, cfg)
            settled_in_time = await h.until(h.settled(cfg.quiet_s), cfg.moves_timeout_s)
            moves_s = time.monotonic() - started
            after = h.objective()
            jobs = {uid: j for uid, j in h.jobs().items() if j.mode == "ReservationFirst"}
    finally:
        await collector.stop()
    requests = {uid: dict(p.requests) for uid, p in h.pods.items()}
    checked = check(allocatable={n: dict(NODE) for n in h.nodes}, requests=requests,
                    bindings=[Placement(ts, b.uid, b.node) for ts, b in collector.of(Binding) if b.uid in h.pods],
                    terminations=h.terminated)
    phases = Counter(f"{j.phase}: {j.reason}" if j.reason else j.phase for j in jobs.values())
    evicted_by = Counter(e.reason.rsplit("(migration ", 1)[-1].rstrip(")") for _, e in collector.of(EvictionCommand))
    evicted_ends = Counter(f"{j.phase}: {j.reason}" for uid, j in jobs.items() if uid in evicted_by)
    return {
        "scenario": "rebalance (through the broker)", "broker": cfg.broker,
        "pods_double_bound": checked.pods_double_bound, "nodes_overcommitted": checked.nodes_overcommitted,
        "overcommitted": checked.overcommitted,
        "before": before, "after": after, "moves_s": round(moves_s, 1), "settled": settled_in_time,
        "migrations": dict(phases), "migrations_succeeded": sum(1 for j in jobs.values() if j.phase == "Succeeded"),
        "migrations_aborted": sum(1 for j in jobs.values() if j.phase == "Aborted"),
        "evictions": len(collector.of(EvictionCommand)), "evictions_refused": dict(h.refused),
        "jobs_evicted": len(evicted_by), "evicted_jobs_ended": dict(evicted_ends),
        "availability_gap": round(h.gap, 3), "lowest_ready": dict(h.lowest),
        "availability": {k: list(v) for k, v in h.workloads.availability().items()},
        "scale_down": scale_down, "failover": failover,
        "jobs_unfinished": sum(1 for j in jobs.values() if j.phase not in ("Succeeded", "Failed", "Aborted")),
    }


async def _kill_the_leader(h: Harness, rebalancers: dict[int, Any], cfg: MoveRunConfig) -> dict[str, Any]:
    """Once a move has begun, kill -9 the leading rebalancer; wait until another one leads."""
    if not await h.until(lambda: bool(h.jobs()), cfg.timeout_s):
        raise TimeoutError("no migration began before the leader was to be killed")
    found = await _leader(rebalancers)
    if found is None:
        raise TimeoutError("migrations began but no rebalancer says it leads")
    port, proc = found
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at, jobs_then = time.monotonic(), len(h.jobs())
    successor = None
    while successor is None and time.monotonic() - killed_at < cfg.timeout_s:
        await h.step()
        successor = await _leader({p: pr for p, pr in rebalancers.items() if p != port})
        await asyncio.sleep(0.2)
    if successor is None:
        raise TimeoutError("no rebalancer took over the lead after the leader was killed")
    return {"jobs_when_killed": jobs_then, "takeover_s": round(time.monotonic() - killed_at, 1)}


async def _scale_down(h: Harness, cfg: MoveRunConfig) -> dict[str, Any]:
    """Ask the CPU-heavy workload to lose `scale_down_by` pods; once the rebalancer published
    its pods' deletion costs, the controller deletes in Kubernetes' order. Also counts the nodes
    Kubernetes' order without the costs would have left empty, from the same state."""
    members = list(h.workloads.workloads[f"{NAMESPACE}/ReplicaSet/cpu"].members.values())
    plain = kubernetes_order([Replica(m.pod.uid, m.node, "Running", m.ready, 0, m.ready_since,
                                      m.pod.creation_timestamp) for m in members])
    default_gone = {members[i].pod.uid for i in plain[:cfg.scale_down_by]}
    default_empty = len(set(h.nodes) - {p.node_name for p in h.bound_now() if p.uid not in default_gone})
    empty_before = h.empty_nodes()
    removed, in_time = await h.scale_down("cpu", cfg.scale_down_by, cfg.timeout_s)
    return {"ranked": in_time, "removed": len(removed), "empty_nodes_before": empty_before,
            "empty_nodes_after": h.empty_nodes(), "empty_nodes_kubernetes": default_empty}


def succeeded(r: dict[str, Any]) -> bool:
    """Consistent, no availability gap, every workload whole at the end."""
    return (not r["pods_double_bound"] and not r["nodes_overcommitted"] and r["availability_gap"] == 0
            and all(ready == desired for ready, desired in r["availability"].values()))
