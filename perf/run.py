"""`koordstream perf run SCENARIO`: a scenario through the real system, with the Kwok-compatible
lifecycle, measured the way kube-scheduler's scheduler_perf measures.

Flow: the system comes up (`perf.demo.system`: embedded broker, topics, workers); the
scenario's nodes are published and start-up waits for the whole pipeline (`start_up`) and, when
the scenario has Node stages, for every node to become Ready (nodes register with Ready False
and the not-ready taint; a stage that changes a node's conditions publishes the node again,
the taint following its Ready condition); then the
scenario's records (pods, and reservations ahead of their pods) are published at their time
offsets while a lifecycle task reads Bindings and EvictionCommands back: a bound pod enters the
lifecycle (`perf.kwok.Lifecycle`, the scenario's Stage files, its speed-up), a pod that reaches
Running is started, and one that finishes (Succeeded, Failed) or is deleted (evicted) is
terminated at its node (`PodTerminated` into `node-inbox`), which frees its capacity. The run
ends when every pod is decided (bound or finally refused) or nothing moves for the stall time.

Figures: throughput sampled per second (bindings per 1-second bucket from the first pod
published; the average is bound pods / wall time); queueing latency (publish -> Binding) and
start latency (publish -> Running) of pods outside gangs; gang members' latency from their
gang's last member's publish; time per plugin and extension point (the scheduler's
ProfilingSamples on `profiling`); the independent consistency check (`perf.checker`, terminations
included); CPU seconds of the worker processes (read from /proc) and of this harness process
apart; and the physical limit (`perf.noop`: the same pods through a one-hop no-op pipeline on
the same broker, once the run is over) with the run's ratio to it; with `floor`, also the
protocol's floor (`perf.floor`: the same pods through the commit protocol's records and waits,
no decision taken), its ratio to the no-op limit (the most any run can reach there) and the
run's ratio to it. The result is a JSON dict (`result`) and a Markdown report (`report`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from agents.state import devices
from perf import scenario as sc
from perf.checker import Placement, check
from perf.collector import Collector
from perf.demo import percentiles, start_up, system, wait_decided
from perf.figures import allocation, burst_throughput
from perf.floor import protocol_floor
from perf.kwok import Lifecycle, load_stages
from perf.noop import noop_limit
from perf.proc import children, cpu_s, peak_rss_mb, self_cpu_s
from perf.profile import Profiler
from schemas import topics
from schemas.records import (
    GANG_NAME_ANNOTATION,
    AttemptsSample,
    Binding,
    EvictionCommand,
    Node,
    NodeCondition,
    Pod,
    PodTerminated,
    ProfilingSample,
    Record,
    ResourceList,
    SchedulingFeedback,
    Taint,
)
from streams.connection import child_env, connect
from streams.process import quiet_gc
from streams.producer import RecordProducer
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
FINISHED = ("Succeeded", "Failed")
NOT_READY = Taint("node.kubernetes.io/not-ready", "", "NoSchedule")


@dataclass
class RunOptions:
    bootstrap: str = ""
    layout: str = "split"
    broker: str = "tansu"  # the broker a run starts when `bootstrap` is empty: tansu or kafka
    stall_timeout_s: float = 30.0
    startup_timeout_s: float = 180.0
    on_progress: Callable[[int, int], None] | None = None
    """Called as the run goes with (pods bound, pods of the scenario): the CLI's progress bar."""
    floor: bool = False  # also measure the protocol's floor (`perf.floor`) after the no-op limit
    profile: str = ""  # a directory: py-spy on every worker while the pods flow (`perf.profile`)
    replicas: tuple[int, int] = (1, 1)  # split layout: state workers, scheduler replicas


def worker_roles(layout: str, replicas: tuple[int, int]) -> list[str]:
    """The names of a run's worker processes, in `system`'s order: `state`, `state-2`, ...,
    `scheduler`, `scheduler-2`, ... (`worker` for the single layout)."""
    if layout != "split":
        return ["worker"]
    return [f"{role}{'' if i == 1 else f'-{i}'}" for role, n in zip(("state", "scheduler"), replicas, strict=True)
            for i in range(1, n + 1)]


def pod_object(pod: Pod, node: str) -> dict[str, Any]:
    """The bound pod as the lifecycle's Stage selectors see it (Kubernetes JSON)."""
    return {"metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid, "labels": dict(pod.labels),
                         "annotations": dict(pod.annotations),
                         "ownerReferences": [{"kind": o.kind, "name": o.name, "uid": o.uid} for o in pod.owner_references]},
            "spec": {"nodeName": node, "schedulerName": pod.scheduler_name},
            "status": {"phase": "Pending"}}


async def run_scenario(s: sc.Scenario, settings: Settings, opts: RunOptions | None = None) -> dict[str, Any]:
    opts = opts or RunOptions()
    stages = load_stages(ROOT / stage for stage in s.stages)  # refused before anything starts
    if s.profiles:
        settings = replace(settings, scheduling=replace(settings.scheduling, profiles=str(ROOT / s.profiles)))
    started = time.perf_counter()
    async with system(settings, opts.bootstrap, opts.layout, opts.broker, replicas=opts.replicas) as (settings, workers):
        return await _drive(s, settings, workers, Lifecycle(stages, speedup=s.speedup, seed=s.seed), started, opts)


def node_object(node: Node) -> dict[str, Any]:
    """A node as the lifecycle's Stage selectors see it (Kubernetes JSON)."""
    return {"metadata": {"name": node.name, "labels": dict(node.labels)},
            "status": {"conditions": [{"type": c.type, "status": c.status} for c in node.conditions]}}


def not_ready(node: Node) -> Node:
    """A node as it registers: Ready False, tainted not-ready until node-initialize runs."""
    return replace(node, conditions=(NodeCondition("Ready", "False"),), taints=(*node.taints, NOT_READY))


class _LifecycleLoop:
    """Feeds Bindings and EvictionCommands into the lifecycle and publishes terminations; with
    Node stages, publishes each node whose conditions a stage changed (the not-ready taint
    follows its Ready condition, as Kubernetes' node lifecycle controller keeps it)."""

    def __init__(self, collector: Collector, producer: RecordProducer, lifecycle: Lifecycle,
                 pods: dict[str, Pod], nodes: list[Node], t0: float,
                 on_progress: Callable[[int, int], None] | None = None) -> None:
        self.collector, self.producer, self.lifecycle = collector, producer, lifecycle
        self.pods, self.t0, self.on_progress = pods, t0, on_progress
        lifecycle.set_epoch(t0)  # the lifecycle's clock counts from t0: Now and timestamps read against it
        self.nodes = {n.name: n for n in nodes}  # as last published
        for n in nodes:
            lifecycle.upsert("Node", n.name, node_object(n), 0.0)
        self.node: dict[str, str] = {}
        self.running: dict[str, float] = {}  # uid -> wall time it reached Running
        self.terminated: list[Placement] = []
        self.cpu_s = 0.0
        self._read = 0

    async def run(self) -> None:
        while True:
            c0 = self_cpu_s()
            await self.step()
            self.cpu_s += self_cpu_s() - c0
            await asyncio.sleep(0.02)

    async def step(self) -> None:
        now = time.time() - self.t0
        records = self.collector.records
        new, self._read = records[self._read:], len(records)
        for _, _, r in new:
            if isinstance(r, Binding) and r.uid in self.pods and r.uid not in self.node:
                self.node[r.uid] = r.node
                self.lifecycle.upsert("Pod", r.uid, pod_object(self.pods[r.uid], r.node), now)
            elif isinstance(r, EvictionCommand):
                obj = self.lifecycle.objects.get(("Pod", r.uid))
                if obj is not None:
                    obj["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    self.lifecycle.upsert("Pod", r.uid, obj, now)
        ended: list[Record] = []
        changed: list[Record] = []
        for t in self.lifecycle.due(now):
            if t.kind == "Node":
                changed += self._node_changed(t.key)
                continue
            if t.phase == "Running":
                self.running.setdefault(t.key, self.t0 + t.at)
            if (t.deleted or t.phase in FINISHED) and t.key in self.node:
                ended.append(PodTerminated(uid=t.key, node=self.node[t.key], reason=t.stage))
                self.terminated.append(Placement(self.t0 + t.at, t.key, self.node[t.key]))
                self.lifecycle.forget("Pod", t.key)
        if ended:
            await self.producer.flush(await self.producer.publish(topics.NODE_INBOX, ended))
        if changed:
            await self.producer.flush(await self.producer.publish(topics.NODES, changed))
        if self.on_progress is not None:
            self.on_progress(len(self.node), len(self.pods))

    def _node_changed(self, name: str) -> list[Record]:
        obj, node = self.lifecycle.objects.get(("Node", name)), self.nodes.get(name)
        if obj is None or node is None:
            return []
        conditions = tuple(NodeCondition(str(c.get("type", "")), str(c.get("status", "")))
                           for c in obj.get("status", {}).get("conditions") or ())
        ready = NodeCondition("Ready", "True") in conditions
        taints = tuple(t for t in node.taints if t != NOT_READY) + (() if ready else (NOT_READY,))
        updated = replace(node, conditions=conditions, taints=taints)
        if updated == node:
            return []  # a heartbeat that changes nothing the scheduler reads is not published
        self.nodes[name] = updated
        return [updated]


async def _drive(s: sc.Scenario, settings: Settings, workers: list[Any], lifecycle: Lifecycle, started: float,
                 opts: RunOptions) -> dict[str, Any]:
    kafka, partitions = connect(settings.kafka), settings.kafka.partitions
    nodes = sc.nodes(s)
    arrivals = sc.arrivals(s)
    pods = {r.uid: r for _, r in arrivals if isinstance(r, Pod)}
    quiet_gc(settings.worker.gc_threshold)
    probe = Pod(uid="perf-probe", name="perf-probe", namespace="perf", requests=ResourceList(cpu=1))
    collector = Collector(kafka, [topics.BINDINGS, topics.FEEDBACK, topics.EVICTIONS, topics.PROFILING],
                          partitions)
    await collector.start()
    cpu_before = {p.pid: cpu_s(p.pid) for p in workers}
    harness_before = self_cpu_s()
    broker_before: dict[int, float] = {}
    published: dict[str, float] = {}
    # With Node stages, nodes register not ready and the lifecycle initializes them.
    roles = worker_roles(opts.layout, opts.replicas)
    profiler = (Profiler(opts.profile, s.name, {r: p.pid for r, p in zip(roles, workers, strict=False)})
                if opts.profile else contextlib.nullcontext())
    staged = nodes if lifecycle.stages.get("Node") else []
    nodes = [not_ready(n) if staged else n for n in nodes]
    try:
        async with RecordProducer(kafka, partitions) as producer:
            # Registered first: the lifecycle's Ready updates must come after on each node's partition.
            await producer.flush(await producer.publish(topics.NODES, nodes))
            loop = _LifecycleLoop(collector, producer, lifecycle, pods, nodes if staged else [], time.time(),
                                  opts.on_progress)
            life = asyncio.create_task(loop.run())
            try:
                await start_up(producer, collector, nodes, probe, partitions, opts.startup_timeout_s, published=True,
                               ready=(lambda n: NOT_READY not in n.taints) if staged else None)
                startup_s = time.perf_counter() - started
                cpu_before = {p.pid: cpu_s(p.pid) for p in workers}
                harness_before = self_cpu_s()
                # The broker, when the run started it (this process's other children).
                broker_before = {pid: cpu_s(pid) for pid in children(os.getpid()) if pid not in cpu_before}
                t0 = time.time()
                async with profiler:
                    await _publish(producer, arrivals, published, t0)
                    await wait_decided(collector, set(pods), opts.stall_timeout_s)
            finally:
                life.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await life
        cpu_workers = {p.pid: cpu_s(p.pid) - cpu_before.get(p.pid, 0.0) for p in workers}
        harness_cpu = self_cpu_s() - harness_before
        broker_cpu = sum(cpu_s(pid) - before for pid, before in broker_before.items())
        memory = {role: peak_rss_mb(p.pid) for role, p in zip(roles, workers, strict=False)}
    finally:
        await collector.stop()
    offsets = {r.uid: at for at, r in arrivals if isinstance(r, Pod)}  # the scenario's send times
    out = result(s, nodes, pods, offsets, published, collector, loop, startup_s, t0, cpu_workers, harness_cpu)
    out["worker_memory_peak_mb"] = memory
    out["worker_cpu_s"] = {role: round(cpu_workers[p.pid], 2) for role, p in zip(roles, workers, strict=False)}
    out["worker_cpu_us_per_pod"] = round(sum(cpu_workers.values()) / max(len(pods), 1) * 1e6, 1)
    if broker_before:
        out["broker_cpu_s"] = round(broker_cpu, 2)
    if isinstance(profiler, Profiler):
        out["profile"] = profiler.figures(out["worker_cpu_s"], len(pods))
    # The physical limit, on the same broker once the run is over (the agents idle).
    limit = await noop_limit(kafka, partitions, list(pods.values()), batch=settings.scheduling.batch_size)
    out["noop_limit_pods_per_s"] = limit
    # With bursts, the scheduler's pace is its burst throughput (between bursts it waits).
    pace = out.get("burst_throughput_pods_per_s") or out["throughput_pods_per_s"]
    out["ratio_to_limit"] = round(pace / limit, 3) if limit else 0.0
    if opts.floor:
        floor = await protocol_floor(kafka, partitions, list(pods.values()), len(nodes),
                                     batch=settings.scheduling.batch_size, env=child_env(settings.kafka))
        out["floor_pods_per_s"] = floor.pods_per_s
        out["floor_ratio_to_limit"] = round(floor.pods_per_s / limit, 3) if limit else 0.0
        out["ratio_to_floor"] = round(pace / floor.pods_per_s, 3) if floor.pods_per_s else 0.0
        # CPU per pod, the floor's two processes against the workers over the run.
        out["floor_cpu_us_per_pod"] = floor.cpu_us_per_pod
    return out


async def _publish(producer: RecordProducer, arrivals: list[tuple[float, Record]], published: dict[str, float],
                   t0: float) -> None:
    def stamp(r: Record, now: float) -> Record:
        if isinstance(r, Pod):
            published[r.uid] = now
        return r

    await publish_on_schedule(producer, topics.PODS, arrivals, t0, stamp)


async def publish_on_schedule(producer: RecordProducer, topic: str, arrivals: Sequence[tuple[float, Record]],
                              t0: float, stamp: Callable[[Record, float], Record] | None = None,
                              lags: list[float] | None = None) -> None:
    """Publish the records (sorted by offset) to `topic` at their offsets in seconds from `t0`,
    in ticks of at most 10 ms: an open loop, on schedule, never waiting for an answer. What
    is due goes in one publish; `stamp(record, now)` gives the record to send (setting the
    time it is published, `now`, where a record carries it), and `lags` gets how late each
    record went, in seconds (the generator's own fidelity)."""
    pending: list[Any] = []
    i = 0
    while i < len(arrivals):
        now = time.time() - t0
        j = i
        while j < len(arrivals) and arrivals[j][0] <= now:
            j += 1
        if j > i:
            at = time.time()
            chunk = [r if stamp is None else stamp(r, at) for _, r in arrivals[i:j]]
            if lags is not None:
                lags += [at - t0 - offset for offset, _ in arrivals[i:j]]
            pending += await producer.publish(topic, chunk)
            i = j
        if i < len(arrivals):
            await asyncio.sleep(min(0.01, max(0.0, arrivals[i][0] - (time.time() - t0))))
    await producer.flush(pending)


def result(s: sc.Scenario, nodes: list[Any], pods: dict[str, Pod], offsets: dict[str, float],
           published: dict[str, float], collector: Collector,
           loop: _LifecycleLoop, startup_s: float, t0: float, cpu_workers: dict[int, float],
           harness_cpu: float) -> dict[str, Any]:
    bindings = [(ts, b) for ts, b in collector.of(Binding) if b.uid in pods]
    feedback = [(ts, f) for ts, f in collector.of(SchedulingFeedback) if f.uid in pods]
    first: dict[str, tuple[float, str]] = {}
    for ts, b in bindings:
        if b.uid not in first or ts < first[b.uid][0]:
            first[b.uid] = (ts, b.node)
    refused = {f.uid for _, f in feedback}  # those still unbound at the end are unschedulable
    # GPUs as the scheduler counts them: N whole GPUs are core and memory-ratio N x 100.
    capacity = {n.name: devices.node_gpu_totals(n.allocatable, n.gpus, n.rdma) for n in nodes}
    requests = {uid: devices.with_gpu_totals(p.requests) for uid, p in pods.items()}
    checked = check(
        allocatable=capacity, requests=requests,
        bindings=[Placement(ts, b.uid, b.node) for ts, b in bindings],
        unschedulable=refused, counted=set(pods), terminations=loop.terminated,
    )
    decisions = [ts for ts, _ in first.values()] + [ts for ts, f in feedback if f.final]
    first_publish = min(published.values()) if published else t0
    wall = max(decisions) - first_publish if decisions else 0.0
    buckets = np.bincount(np.floor(np.array([ts - first_publish for ts, _ in first.values()])).astype(int).clip(0)) \
        if first else np.zeros(0, dtype=int)
    gang_of = {uid: p.annotations.get(GANG_NAME_ANNOTATION, "") for uid, p in pods.items()}
    gang_last: dict[str, float] = {}
    for uid, g in gang_of.items():
        if g and uid in published:
            gang_last[g] = max(gang_last.get(g, 0.0), published[uid])
    queue = [(ts - published[uid]) * 1000 for uid, (ts, _) in first.items() if not gang_of[uid] and uid in published]
    gang = [(ts - gang_last[gang_of[uid]]) * 1000 for uid, (ts, _) in first.items() if gang_of[uid]]
    start = [(loop.running[uid] - published[uid]) * 1000 for uid in loop.running
             if not gang_of.get(uid) and uid in published]
    scheduler_cpu = sum(cpu_workers.values())
    burst_tp = burst_throughput(offsets, published, {uid: ts for uid, (ts, _) in first.items()})
    figures = allocation(
        capacity, requests, first,
        [(t.time, t.uid) for t in loop.terminated], first_publish)
    return {
        "scenario": s.name,
        "startup_s": round(startup_s, 2),
        "wall_s": round(wall, 2),
        "pods_total": checked.pods_total,
        "pods_bound": checked.pods_bound,
        "pods_unschedulable": checked.pods_unschedulable,
        "pods_double_bound": checked.pods_double_bound,
        "nodes_overcommitted": checked.nodes_overcommitted,
        "overcommitted": dict(list(checked.overcommitted.items())[:10]),
        "pods_unbound_by_template": dict(Counter(pods[uid].labels.get("template", "") for uid in set(pods) - set(first))),
        "pods_terminated": len(loop.terminated),
        "throughput_pods_per_s": round(checked.pods_bound / wall, 1) if wall > 0 else 0.0,
        "throughput_samples_pods_per_s": percentiles([float(b) for b in buckets], (50, 90, 95, 99)),
        "throughput_series": [int(b) for b in buckets],  # bindings per second from the first publish
        **({"burst_throughput_pods_per_s": burst_tp} if burst_tp is not None else {}),
        "queue_latency_ms": percentiles(queue),
        "start_latency_ms": percentiles(start),
        "gang_latency_ms": percentiles(gang),
        "latency_cdf_ms": {"queue": latency_cdf(queue), "start": latency_cdf(start), "gang": latency_cdf(gang)},
        **scheduler_figures(collector, [f for _, f in feedback], first_publish),
        **figures,
        "harness_cpu_s": round(harness_cpu, 2),
        "scheduler_cpu_s": round(scheduler_cpu, 2),
        "lifecycle_cpu_s": round(loop.cpu_s, 2),
        "thresholds": {"throughput_drop_pct": s.throughput_drop_pct, "queue_p99_rise_pct": s.queue_p99_rise_pct},
    }


def scheduler_figures(collector: Collector, feedback: list[SchedulingFeedback], since: float) -> dict[str, Any]:
    """What the scheduler says of itself on `profiling` after `since`: `plugins` (milliseconds
    per plugin and extension point, its ProfilingSamples), `attempts` (by result, its
    AttemptsSamples), `fast_path_share` (of the scheduled attempts, the share placed as
    members of an equivalence class rather than by the full path); and `unschedulable_reasons`
    (the run's feedback, by reason)."""
    plugins: dict[str, dict[str, float]] = {}  # plugin -> extension point -> ms, over the run
    for ts, sample in collector.of(ProfilingSample):
        if ts >= since:
            point = plugins.setdefault(sample.plugin, {})
            point[sample.extension_point] = point.get(sample.extension_point, 0.0) + sample.duration_ns / 1e6
    attempts: Counter[str] = Counter()
    batched = 0
    for ts, a in collector.of(AttemptsSample):
        if ts >= since:
            attempts[a.result] += a.count
            batched += a.batched
    reasons: Counter[str] = Counter()  # unschedulable attempts of the run's pods, by reason
    for f in feedback:
        for reason in f.reasons or {f.message: 1}:
            reasons[reason] += 1
    return {"plugins": {p: {k: round(v, 1) for k, v in points.items()} for p, points in sorted(plugins.items())},
            "attempts": dict(sorted(attempts.items())),
            "fast_path_share": round(batched / attempts["scheduled"], 4) if attempts["scheduled"] else 0.0,
            "unschedulable_reasons": dict(reasons.most_common(20))}


def latency_cdf(values: list[float], points: int = 200) -> list[float]:
    """`points` evenly spaced quantiles of `values` (the plotted latency CDF), in ms."""
    if not values:
        return []
    qs = np.linspace(0, 100, min(points, len(values)))
    return [round(float(v), 1) for v in np.percentile(np.asarray(values), qs)]


def compare(baseline: dict[str, Any], new: dict[str, Any]) -> tuple[list[tuple[str, Any, Any, str]], bool]:
    """Side by side: (figure, baseline, new, verdict) rows, and whether the new run regressed
    (throughput down, or queueing p99 up, by more than the baseline's thresholds; for the warm
    pools' runs, `compare_claims`)."""
    if "claims_total" in baseline:
        return compare_claims(baseline, new)
    limits = baseline.get("thresholds") or {}
    drop, rise = float(limits.get("throughput_drop_pct", 10.0)), float(limits.get("queue_p99_rise_pct", 25.0))
    rows: list[tuple[str, Any, Any, str]] = []
    regressed = False
    old_tp, new_tp = float(baseline["throughput_pods_per_s"]), float(new["throughput_pods_per_s"])
    bad = new_tp < old_tp * (1 - drop / 100)
    rows.append(("throughput_pods_per_s", old_tp, new_tp, f"REGRESSED (> {drop:g}% down)" if bad else "ok"))
    regressed |= bad
    old_p99, new_p99 = float(baseline["queue_latency_ms"]["p99"]), float(new["queue_latency_ms"]["p99"])
    bad = new_p99 > old_p99 * (1 + rise / 100)
    rows.append(("queue_latency_ms.p99", old_p99, new_p99, f"REGRESSED (> {rise:g}% up)" if bad else "ok"))
    regressed |= bad
    for key in ("wall_s", "pods_bound", "pods_double_bound", "nodes_overcommitted", "scheduler_cpu_s", "harness_cpu_s"):
        if key in baseline or key in new:
            rows.append((key, baseline.get(key), new.get(key), ""))
    return rows, regressed


SANDBOX_SAFETY = ("sandboxes_double_adopted", "pods_double_bound", "nodes_overcommitted", "claims_unanswered")


def compare_claims(baseline: dict[str, Any], new: dict[str, Any]) -> tuple[list[tuple[str, Any, Any, str]], bool]:
    """`compare` for the warm pools' runs (sandbox-warm, sandbox-churn): the claims' p99 latency,
    the whole run's and each phase's, up by more than `claim_p99_rise_pct` (default 50: a claim's
    tail on a shared two-core machine varies that much between runs of the same code), or the
    warm-hit rate down by more than `warm_hit_drop` (default 0.05), regress; so does any
    safety count above 0 (a sandbox adopted twice, a pod bound twice, a node over-committed, a
    claim never answered)."""
    limits = baseline.get("thresholds") or {}
    rise, drop = float(limits.get("claim_p99_rise_pct", 50.0)), float(limits.get("warm_hit_drop", 0.05))
    rows: list[tuple[str, Any, Any, str]] = []
    regressed = False
    scopes = [("", baseline, new)] + [(f"phases.{name}.", phase, (new.get("phases") or {}).get(name) or {})
                                      for name, phase in (baseline.get("phases") or {}).items()]
    for prefix, old, now in scopes:
        if "claim_latency_ms" not in now:
            rows.append((f"{prefix}claim_latency_ms.p99", old["claim_latency_ms"]["p99"], None, "REGRESSED (missing)"))
            regressed = True
            continue
        old_p99, new_p99 = float(old["claim_latency_ms"]["p99"]), float(now["claim_latency_ms"]["p99"])
        bad = new_p99 > old_p99 * (1 + rise / 100)
        rows.append((f"{prefix}claim_latency_ms.p99", old_p99, new_p99, f"REGRESSED (> {rise:g}% up)" if bad else "ok"))
        old_hit, new_hit = float(old["warm_hit_rate"]), float(now.get("warm_hit_rate", 0.0))
        worse = new_hit < old_hit - drop
        rows.append((f"{prefix}warm_hit_rate", old_hit, new_hit, f"REGRESSED (> {drop:g} down)" if worse else "ok"))
        regressed |= bad or worse
    for key in SANDBOX_SAFETY:
        bad = int(new.get(key, 0)) > 0
        rows.append((key, baseline.get(key), new.get(key), "REGRESSED (must be 0)" if bad else "ok"))
        regressed |= bad
    for key in ("claims_total", "wall_s", "fast_path_share"):
        if key in baseline or key in new:
            rows.append((key, baseline.get(key), new.get(key), ""))
    return rows, regressed


SERIES = ("throughput_series", "latency_cdf_ms", "allocation_series_pct")  # plotted, not tabled


def report(r: dict[str, Any], plots: list[str] | None = None) -> str:
    """The Markdown report of one run; `plots` are image paths relative to the report."""
    lines = [f"# koordstream perf run: {r['scenario']}", "", "| figure | value |", "|---|---|"]
    for key, value in r.items():
        if key == "scenario" or key in SERIES:
            continue
        shown = ", ".join(f"{k} {v}" for k, v in value.items()) if isinstance(value, dict) else value
        lines.append(f"| {key} | {shown} |")
    lines += [""] + [f"![{Path(p).stem}]({p})" for p in plots or []]
    return "\n".join(lines) + "\n"
