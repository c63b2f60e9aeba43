"""`koordstream perf run soak`: pods churned through the real system for a long time, to show
that what the agents keep and write stays flat as the cluster ages (DESIGN.md, rule 10).

The run: `nodes` nodes; a few long-running pods first (they stay all the way); then pods at a
fixed offered `rate`, each running a duration drawn uniformly from [`min_s`, `max_s`], then
completing (PodTerminated at its node, as the Kwok lifecycle's pod-complete stage does) and
being deleted (PodDeleted on `pods`, as a Job's pod is garbage-collected). The workers run
with `worker.state_retention_s` = `retention_s`. A warm-up of `max_s + retention_s + 10` s at
the same rate comes first, so that the measured part starts in the steady state (running
pods, and deleted pods not yet forgotten, at their plateau); then `pods` pods are measured.

At 10%, 50% and 100% of the measured pods published, each figure is taken over the window of
`window_pct` just before that point (not a running average), from the workers' metrics
(`streams.metrics`: the state worker's tables and changelog counters, the scheduler
replica's maps, each process's CPU and memory) and from the records read back:

- flat counts: `state_bytes_per_node` (the owners' node states as last written),
  `decider_entries` (pods in the deciders' ledgers), `replica_map_entries` (everything the
  scheduler replica's maps hold), `changelog_bytes_per_pod` (changelog bytes written in the
  window per pod published in it), `owner_cpu_ms_per_batch` (the state worker's CPU over its
  owner and decider batches in the window), `restore_records_state` (the changelog records a
  restarted state worker restores) and `restore_records_scheduler` (what a restarted
  scheduler reads before it places pods again: the owners' changelog, for its replica, and
  `pods` and `requeue`; `state-changes` only from where it ended);
- beside them: `queue_p99_ms` (publish to Binding, pods published in the window),
  `replica_rss_mb`, and `restart_state_s` / `restart_scheduler_s`: how long a fresh consumer
  takes to read those records, with the publishing paused meanwhile (no worker is restarted
  during the run: that would disturb the windows; what a restart reads is what it costs).

`growth` is each figure at 100% over its value at 10%. The consistency check
(`perf.checker`) covers every pod of the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import random
import socket
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson

from perf.checker import Placement, check
from perf.collector import Collector
from perf.demo import percentiles, start_up, system, wait_decided
from schemas import topics
from schemas.codec import decode_message, encode
from schemas.errors import SchemaError
from schemas.records import Binding, Node, Pod, PodDeleted, PodTerminated, ResourceList
from streams.catalogue import TABLE_NODE_STATE, TABLE_POD_LEDGER
from streams.connection import KafkaConnection, connect
from streams.producer import RecordProducer
from streams.reader import read_to_end
from streams.settings import Settings

GI = 2**30
NODE_ALLOCATABLE = {"cpu": 32_000, "memory": 128 * GI, "pods": 110}
MAX_CLAIMS_PER_RETENTION_S = 60  # outstanding claims per second of retention: 1,800 at the soak's 30 s
FIGURES = ("state_bytes_per_node", "decider_entries", "replica_map_entries", "changelog_bytes_per_pod",
           "owner_cpu_ms_per_batch", "restore_records_state", "restore_records_scheduler", "queue_p99_ms",
           "replica_rss_mb", "restart_state_s", "restart_scheduler_s")


@dataclass(frozen=True)
class SoakConfig:
    broker: str = "tansu"
    nodes: int = 1000
    pods: int = 500_000  # measured, after the warm-up
    rate: float = 1000.0  # pods per second, offered
    min_s: float = 10.0
    max_s: float = 60.0
    long_running: int = 20
    retention_s: float = 30.0
    window_pct: float = 10.0
    points: tuple[int, ...] = (10, 50, 100)
    seed: int = 1
    quick: bool = False

    @property
    def warmup_s(self) -> float:
        return self.max_s + self.retention_s + 10.0

    @classmethod
    def preset(cls, broker: str, quick: bool, seed: int = 1) -> SoakConfig:
        if quick:  # about 90 s, what the tests run; half of what a slow CI day sustained (185-207 pods/s)
            return cls(broker=broker, nodes=50, pods=6_000, rate=100.0, min_s=2.0, max_s=6.0, long_running=5,
                       retention_s=5.0, seed=seed, quick=True)
        return cls(broker=broker, seed=seed)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def scrape(port: int) -> dict[str, float]:
    """A worker's metrics: `name{labels}` -> value."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        await writer.drain()
        body = (await reader.read()).split(b"\r\n\r\n", 1)[-1].decode()
    finally:
        writer.close()
    out: dict[str, float] = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def metric(m: dict[str, float], name: str, **labels: str) -> float:
    key = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    return m.get(key, 0.0)


@dataclass
class Snapshot:
    at: float
    published: int  # measured pods published
    state: dict[str, float]
    scheduler: dict[str, float]


class Churn:
    """Publishes the pods at the rate and plays their lives: bound pods run their duration,
    then complete and are deleted."""

    def __init__(self, cfg: SoakConfig, producer: RecordProducer, collector: Collector, nodes: list[str]) -> None:
        self.cfg = cfg
        self.producer = producer
        self.collector = collector
        self.rng = random.Random(cfg.seed)
        self.warmup = int(cfg.rate * cfg.warmup_s)
        self.total = cfg.long_running + self.warmup + cfg.pods
        self.published: dict[str, float] = {}
        self.duration: dict[str, float] = {}
        self.requests: dict[str, dict[str, int]] = {}
        self.node: dict[str, str] = {}
        self.ends: list[tuple[float, str]] = []
        self.terminated: list[Placement] = []
        self.sent = 0
        self._read = 0
        self.measured_from = cfg.long_running + self.warmup
        self.running = asyncio.Event()  # cleared while a restart's reads are measured: no publishing
        self.running.set()
        self.paused_s = 0.0

    def pod(self, i: int) -> Pod:
        uid = f"soak-{i}"
        cpu = self.rng.choice((100, 200, 250, 500))
        memory = self.rng.choice((128, 256, 512, 1024)) * 2**20
        self.requests[uid] = {"cpu": cpu, "memory": memory, "pods": 1}
        if i >= self.cfg.long_running:
            self.duration[uid] = self.rng.uniform(self.cfg.min_s, self.cfg.max_s)
        return Pod(uid=uid, name=uid, namespace="soak", requests=ResourceList(cpu=cpu, memory=memory))

    @property
    def measured_published(self) -> int:
        """Measured pods published; -1 during the warm-up."""
        return self.sent - self.measured_from if self.sent >= self.measured_from else -1

    async def publish(self) -> None:
        t0 = time.time()
        for i in range(self.cfg.long_running):
            await self._send([self.pod(i)])
        base = self.sent
        pending: list[Any] = []
        while self.sent < self.total:
            if not self.running.is_set():
                paused = time.time()
                await self.running.wait()
                self.paused_s += time.time() - paused
            due = min(self.total, base + int((time.time() - t0 - self.paused_s) * self.cfg.rate))
            if due > self.sent:
                chunk = [self.pod(i) for i in range(self.sent, due)]
                pending += await self._send(chunk)
                if len(pending) > 64:
                    await self.producer.flush(pending)
                    pending = []
            await asyncio.sleep(0.01)
        await self.producer.flush(pending)

    async def _send(self, pods: list[Pod]) -> list[Any]:
        now = time.time()
        for p in pods:
            self.published[p.uid] = now
        self.sent += len(pods)
        return await self.producer.publish(topics.PODS, pods)

    async def lives(self) -> None:
        while True:
            records = self.collector.records
            new, self._read = records[self._read:], len(records)
            now = time.time()
            for _, _, r in new:
                if isinstance(r, Binding) and r.uid in self.duration and r.uid not in self.node:
                    self.node[r.uid] = r.node
                    heapq.heappush(self.ends, (now + self.duration[r.uid], r.uid))
                elif isinstance(r, Binding) and r.uid in self.published:
                    self.node.setdefault(r.uid, r.node)  # a long-running pod
            done: list[str] = []
            while self.ends and self.ends[0][0] <= now:
                done.append(heapq.heappop(self.ends)[1])
            if done:
                await self.producer.flush(await self.producer.publish(
                    topics.NODE_INBOX, [PodTerminated(uid=u, node=self.node[u], reason="Succeeded") for u in done]))
                await self.producer.flush(await self.producer.publish(
                    topics.PODS, [PodDeleted(uid=u, name=u, namespace="soak") for u in done]))
                self.terminated += [Placement(now, u, self.node[u]) for u in done]
            await asyncio.sleep(0.05)


async def run_soak(cfg: SoakConfig, settings: Settings) -> dict[str, Any]:
    settings = replace(settings, worker=replace(settings.worker, state_retention_s=cfg.retention_s))
    ports = [free_port(), free_port()]  # state worker, scheduler worker
    # A claim older than half the retention is refused and placed again: with the soak's short
    # retention the claims out at once must stay a few seconds' work, or an overload turns
    # every claim stale (2026-12-03: at 600 pods/s on Apache Kafka, with the default 10,000,
    # 33,310 of 210,020 pods bound).
    claims = max(500, int(cfg.retention_s * MAX_CLAIMS_PER_RETENTION_S))
    settings = replace(settings, scheduling=replace(settings.scheduling, max_outstanding_claims=claims))
    env = {"KOORDSTREAM_WORKER_STATE_RETENTION_S": str(cfg.retention_s),
           "KOORDSTREAM_SCHEDULING_MAX_OUTSTANDING_CLAIMS": str(claims)}
    async with system(settings, layout="split", broker_kind=cfg.broker, metrics_ports=ports, extra_env=env) as (
            settings, _workers):
        kafka, partitions = connect(settings.kafka), settings.kafka.partitions
        nodes = [Node(name=f"soak-{i}", allocatable=ResourceList(NODE_ALLOCATABLE)) for i in range(cfg.nodes)]
        collector = Collector(kafka, [topics.BINDINGS], partitions)
        await collector.start()
        try:
            async with RecordProducer(kafka, partitions) as producer:
                probe = Pod(uid="soak-probe", name="soak-probe", namespace="perf", requests=ResourceList(cpu=1))
                await start_up(producer, collector, nodes, probe, partitions, 180.0)
                churn = Churn(cfg, producer, collector, [n.name for n in nodes])
                publisher = asyncio.create_task(churn.publish())
                lives = asyncio.create_task(churn.lives())
                try:
                    snapshots = await sample(cfg, churn, ports, publisher, partitions)
                    restores = snapshots.pop("restores")
                    await wait_decided(collector, set(churn.published), 30.0)  # the last window's bindings
                    bound = {b.uid for _, b in collector.of(Binding)}
                    unbound = sorted(u for u in churn.published if u not in bound)
                    traced = await trace_pods(kafka, partitions, unbound[:3]) if unbound else []
                finally:
                    for task in (publisher, lives):
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
        finally:
            await collector.stop()
        return {**result(cfg, churn, collector, nodes, snapshots, restores),  # type: ignore[arg-type]
                "unbound": {"uids": unbound[:20], "trace": traced}}


async def sample(cfg: SoakConfig, churn: Churn, ports: list[int], publisher: asyncio.Task[None],
                 partitions: int) -> dict[str, Any]:
    """Snapshots at each window's start and end (by measured pods published); at each point also
    what a restart reads."""
    marks: list[tuple[str, float]] = []
    for p in cfg.points:
        marks += [(f"{p}-start", max(0.0, p - cfg.window_pct)), (f"{p}", float(p))]
    marks.sort(key=lambda m: m[1])
    out: dict[str, Any] = {}
    restores: dict[str, dict[str, float]] = {}
    kafka = churn.producer.kafka
    for name, pct in marks:
        target = int(cfg.pods * pct / 100)
        while churn.measured_published < target and not publisher.done():
            await asyncio.sleep(0.05)
        state, scheduler = await asyncio.gather(scrape(ports[0]), scrape(ports[1]))
        out[name] = Snapshot(time.time(), churn.measured_published, state, scheduler)
        if "-" not in name:
            # What a restart reads, read now with the publishing paused (reading competes for
            # the same two cores; the next window starts after it).
            churn.running.clear()
            state_n, state_s = await read_to_end(
                kafka, [f"koordstream-{t}-changelog" for t in (TABLE_NODE_STATE, TABLE_POD_LEDGER)],
                partitions)
            sched_n, sched_s = await read_to_end(
                kafka, [f"koordstream-{TABLE_NODE_STATE}-changelog", topics.PODS, topics.REQUEUE], partitions)
            churn.running.set()
            restores[name] = {"restore_records_state": state_n, "restart_state_s": round(state_s, 2),
                              "restore_records_scheduler": sched_n, "restart_scheduler_s": round(sched_s, 2)}
    out["restores"] = restores
    return out


def figures(cfg: SoakConfig, churn: Churn, collector: Collector, start: Snapshot, end: Snapshot,
            restore: dict[str, float], first_binding: dict[str, float]) -> dict[str, Any]:
    st, sc = end.state, end.scheduler
    nodes = metric(st, "koordstream_table_sized_keys", table=TABLE_NODE_STATE) or 1.0
    written = sum(metric(end.state, "koordstream_changelog_bytes_total", table=t)
                  - metric(start.state, "koordstream_changelog_bytes_total", table=t)
                  for t in (TABLE_NODE_STATE, TABLE_POD_LEDGER))
    pods = max(end.published - start.published, 1)
    batches = sum(metric(end.state, "koordstream_batches_total", agent=a) - metric(start.state, "koordstream_batches_total",
                                                                                   agent=a) for a in ("owners", "deciders"))
    cpu = metric(end.state, "koordstream_process_cpu_seconds_total") - metric(start.state,
                                                                              "koordstream_process_cpu_seconds_total")
    window = {uid for uid, ts in churn.published.items() if start.at <= ts < end.at}
    queue = [(first_binding[u] - churn.published[u]) * 1000 for u in window if u in first_binding]
    maps = sum(v for k, v in sc.items() if k.startswith("koordstream_replica_map_entries"))
    by_map = {k.split('"')[1]: v for k, v in sc.items() if k.startswith("koordstream_replica_map_entries{")}
    return {
        "state_bytes_per_node": round(metric(st, "koordstream_table_bytes", table=TABLE_NODE_STATE) / nodes, 1),
        "decider_entries": metric(st, "koordstream_table_entries", table=TABLE_POD_LEDGER),
        "replica_map_entries": maps,
        "changelog_bytes_per_pod": round(written / pods, 1),
        "owner_cpu_ms_per_batch": round(cpu * 1000 / max(batches, 1), 3),
        **restore,
        "queue_p99_ms": round(percentiles(queue).get("p99", 0.0), 1) if queue else None,  # None: none bound
        "pods_bound_of_window": len(queue),
        "bound_per_s": round(sum(1 for ts in first_binding.values() if start.at <= ts < end.at)
                             / max(end.at - start.at, 1e-9), 1),
        "replica_rss_mb": round(metric(sc, "koordstream_process_resident_bytes") / 2**20, 1),
        "replica_maps": by_map,
        "decider_keys": metric(st, "koordstream_table_keys", table=TABLE_POD_LEDGER),
        "owner_holds": metric(st, "koordstream_table_entries", table=TABLE_NODE_STATE),
        # Offset gaps the workers' consumers waited for (streams/gaps.py), since they started.
        "offset_gaps": {outcome: sum(metric(m, "koordstream_offset_gaps_total", outcome=outcome) for m in (st, sc))
                        for outcome in ("held", "filled", "accepted")},
    }


async def trace_pods(kafka: KafkaConnection | str, partitions: int, uids: list[str]) -> list[dict[str, Any]]:
    """Every record about `uids` on the protocol's topics, in each partition's order: what a
    pod left unbound went through (the soak reports it)."""
    wanted = set(uids)
    found: list[dict[str, Any]] = []

    def seen(m: Any) -> None:
        for r in decode_message(m.value) if m.value else ():
            if isinstance(r, SchemaError):
                continue
            about = {getattr(r, "uid", "")} | {h.split("/")[0] for h in getattr(r, "holds", {}) or {}}
            if about & wanted:
                plain = {k: v for k, v in orjson.loads(encode(r)).items() if k in TRACED}
                found.append({"topic": m.topic, "partition": m.partition, "offset": m.offset, "at": m.timestamp,
                              **plain})

    await read_to_end(kafka, [topics.PODS, topics.REQUEUE, topics.NODE_INBOX, topics.HOLDS, topics.FEEDBACK,
                                  topics.BINDINGS], partitions, seen)
    return found


TRACED = ("kind", "uid", "attempt", "node", "reason", "message", "final", "holds", "scheduled_at")


def result(cfg: SoakConfig, churn: Churn, collector: Collector, nodes: list[Node],
           snapshots: dict[str, Snapshot], restores: dict[str, dict[str, float]]) -> dict[str, Any]:
    first: dict[str, tuple[float, str]] = {}
    bindings = [(ts, b) for ts, b in collector.of(Binding) if b.uid in churn.published]
    for ts, b in bindings:
        if b.uid not in first or ts < first[b.uid][0]:
            first[b.uid] = (ts, b.node)
    checked = check(allocatable={n.name: dict(n.allocatable) for n in nodes}, requests=churn.requests,
                    bindings=[Placement(ts, b.uid, b.node) for ts, b in bindings], terminations=churn.terminated,
                    counted=set(churn.published))
    first_binding = {u: ts for u, (ts, _) in first.items()}
    samples = []
    for p in cfg.points:
        fig = figures(cfg, churn, collector, snapshots[f"{p}-start"], snapshots[f"{p}"], restores[f"{p}"],
                      first_binding)
        samples.append({"progress_pct": p, **fig})
    by_pct = {s["progress_pct"]: s for s in samples}
    lo, hi = by_pct[min(cfg.points)], by_pct[max(cfg.points)]
    growth = {k: round(hi[k] / lo[k], 3) if lo[k] and hi[k] is not None else None for k in FIGURES}
    long_running = [f"soak-{i}" for i in range(cfg.long_running)]
    return {
        "scenario": "soak" + (" (quick)" if cfg.quick else ""),
        "config": {**asdict(cfg), "warmup_s": cfg.warmup_s},
        "pods_total": len(churn.published),
        "pods_bound": len(first),
        "pods_double_bound": checked.pods_double_bound,
        "nodes_overcommitted": checked.nodes_overcommitted,
        "long_running_bound": sum(1 for u in long_running if u in first),
        "long_running_terminated": sum(1 for t in churn.terminated if t.uid in set(long_running)),
        "samples": samples,
        "growth": growth,
    }
