"""`koordstream perf run chaos`: kill -9 workers (and the broker) under load, then check.

The run brings up a broker (Apache Kafka with its log in the run's folder, or the embedded
Tansu), the topics, and five worker processes: two with the `state` role (owners and deciders,
one consumer group), two with the `scheduler` role (sharing the elastic quota `chaos-quota` of
their ElasticQuota plugin) and one with the `rebalancer` role (ScaleDownBinPack,
EvictDirectly). It publishes a seeded workload sized so that every pod fits (plain pods, GPU
shares, whole GPUs with RDMA virtual functions, gangs with one member beyond min-available,
pods that consume a Reservation published ahead of them) at a steady rate, deletes a seeded
share of the pods a few seconds after their creation (before or after they were bound), and
publishes bursts of the quota's pods asking twice its max and ReplicaSet-like workloads under
PodDisruptionBudgets that each ask, at a seeded moment, to lose more pods than their budget
allows at once (`perf.chaos_cluster` plays the kubelet, the controller and the Eviction API
around them). Meanwhile it kills -9 a seeded random worker at seeded random moments and
restarts it at once; on Apache Kafka it also kills -9 the broker once and restarts it on the
same log. Any worker that exits by itself is restarted too (and counted).

At the end, once every pod is decided or nothing moves for the stall time, the independent
checker works from the records on the topics only (read `read_committed`) and the published
inputs: every pod bound exactly once or deleted, no pod with two distinct Bindings (another
node, or other devices), no node over-committed, no GPU or NIC over-committed (from the
Bindings' device results), no gang partially bound; and, from the owners' last reports on
`state-changes`, no hold left held and no nomination left; replaying the topics in log-time
order, no quota's committed usage over its max (`quotas_overcommitted`) and no budget below its
desired healthy pods (`pdb_violations`, sampled every 0.25 s). A run that fails writes every
record it read back to `records.jsonl` in its folder (the embedded broker keeps nothing).

Recovery of a kill: from the kill until every input partition that was deciding just before
it decides again (a state worker: the origins of the owners' reports and the deciders'
Bindings, `koordstream-origin` headers; a scheduler: Claims for pods of every `pods`
partition); the goal is 20 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from agents.intake import origin_from_headers
from agents.state import devices
from perf.chaos_cluster import BudgetWorkload, ChaosCluster
from perf.checker import (
    BudgetSpec,
    BudgetViolation,
    DevicePlacement,
    Placement,
    PodSeen,
    check,
    device_amounts,
    devices_overcommitted,
    partial_gangs,
    pdb_violations,
    quotas_overcommitted,
)
from schemas import topics
from schemas.codec import decode_message, to_plain
from schemas.errors import SchemaError
from schemas.records import (
    GANG_MIN_AVAILABLE_ANNOTATION,
    GANG_NAME_ANNOTATION,
    GANG_WAITING_TIME_ANNOTATION,
    QUOTA_LABEL,
    Binding,
    Claim,
    GpuDevice,
    HoldId,
    Node,
    NodeStateChange,
    Pod,
    PodDeleted,
    PodTerminated,
    RdmaDevice,
    Record,
    Reservation,
    ReservationOwner,
    ResourceList,
)
from streams.broker import EmbeddedBroker, wait_ready
from streams.catalogue import partition_for
from streams.connection import KafkaConnection, child_env, own_broker
from streams.process import spawn_tied, stop
from streams.producer import RecordProducer
from streams.settings import Settings
from streams.worker import prepare

GI = 1024**3
WORKERS = ("state-0", "state-1", "scheduler-0", "scheduler-1", "rebalancer-0")
RECOVERY_GOAL_S = 20.0
QUOTA = "chaos-quota"  # the elastic quota both scheduler replicas admit into
SAMPLE_S = 0.25  # budgets' healthy pods are sampled this often (log time)


@dataclass(frozen=True)
class ChaosConfig:
    broker: str = "kafka"  # kafka | tansu
    seed: int = 1
    pods: int = 10_000
    rate: float = 25.0  # pods offered per second
    kills: int = 12
    broker_restarts: int = 1  # Apache Kafka only: Tansu keeps nothing across its restart
    deleted_share: float = 0.05
    partitions: int = 4
    stall_s: float = 90.0
    settle_s: float = 45.0  # after the last decision: gang timeouts (30 s) and late reports
    run_dir: str = ""
    # The elastic quota: pods of one quota arrive in bursts of `quota_burst`, more than its max
    # admits at once; each runs `quota_run_s` after its Binding, then ends (perf.chaos_cluster).
    quota_pods: int = 240
    quota_burst: int = 8
    quota_max_cpu: int = 4000  # millicores: four of the quota's 1-CPU pods at a time
    quota_run_s: float = 3.0
    # The budgeted workloads: each `budget_replicas` pods under minAvailable `budget_min_available`,
    # asked at a seeded moment of the load to lose `budget_scale_down` (the rebalancer evicts).
    budget_workloads: int = 6
    budget_replicas: int = 6
    budget_min_available: int = 4
    budget_scale_down: int = 3
    ready_delay_s: float = 1.0  # Kwok's pod-ready stage: a bound pod is Running this long after

    @classmethod
    def preset(cls, broker: str, quick: bool, seed: int, run_dir: str = "") -> ChaosConfig:
        restarts = 1 if broker == "kafka" else 0
        if quick:
            return cls(broker=broker, seed=seed, pods=900, rate=20.0, kills=3, broker_restarts=restarts,
                       stall_s=60.0, run_dir=run_dir, quota_pods=40, budget_workloads=2)
        return cls(broker=broker, seed=seed, broker_restarts=restarts, run_dir=run_dir)


# --- the workload ------------------------------------------------------------------------------


@dataclass
class Workload:
    nodes: list[Node]
    timeline: list[tuple[float, str, Record]]  # (offset s, topic, record), in time order
    pods: dict[str, Pod]
    deleted: set[str]
    gangs: dict[str, tuple[int, list[str]]]  # gang -> (min-available, member uids)
    quotas: dict[str, dict[str, int]] = field(default_factory=dict)  # quota -> resource -> max
    quota_pods: set[str] = field(default_factory=set)
    budgeted: list[BudgetWorkload] = field(default_factory=list)

    def profiles_yaml(self) -> str:
        """The schedulers' profiles: the ElasticQuota plugin with the workload's quotas."""
        quotas = "".join(f"            - {{name: {name}, max: {{cpu: {limits['cpu']}m}}}}\n"
                         for name, limits in self.quotas.items())
        return ("profiles:\n  - schedulerName: default-scheduler\n    pluginConfig:\n"
                "      - name: ElasticQuota\n        args:\n          quotas:\n" + quotas)


REBALANCER_YAML = (
    "deschedulingInterval: 2s\n"
    "profiles:\n- name: default\n  plugins: {balance: {enabled: [ScaleDownBinPack]}}\n"
    "  pluginConfig:\n  - {name: ScaleDownBinPack, args: {strategy: EvictDirectly, maxPodsToEvict: 10}}\n")


def workload(cfg: ChaosConfig, run: str, now: float = 0.0) -> Workload:
    """The seeded workload, and a cluster twice its size in CPUs and GPUs, so that every pod fits.
    Creation times count from `now`."""
    rng = random.Random(cfg.seed)
    namespace = f"chaos-{run}"
    pods: dict[str, Pod] = {}
    timeline: list[tuple[float, str, Record]] = []
    gangs: dict[str, tuple[int, list[str]]] = {}
    deleted: set[str] = set()
    kinds = ["web", "batch", "infer", "rdma", "gang", "reserved"]
    weights = [50, 20, 12, 6, 2, 4]
    n = 0

    def add(at: float, uid: str, requests: ResourceList, annotations: dict[str, str] | None = None,
            labels: dict[str, str] | None = None) -> Pod:
        pod = Pod(uid=uid, name=uid, namespace=namespace, requests=requests, annotations=annotations or {},
                  labels=labels or {}, creation_timestamp=now + at)
        pods[uid] = pod
        timeline.append((at, topics.PODS, pod))
        return pod

    while len(pods) < cfg.pods:
        at = len(pods) / cfg.rate
        kind = rng.choices(kinds, weights)[0]
        uid = f"c{run}-{kind}-{n:06d}"
        n += 1
        if kind == "web":
            add(at, uid, ResourceList(cpu=500, memory=GI))
        elif kind == "batch":
            add(at, uid, ResourceList(cpu=1000, memory=2 * GI))
        elif kind == "infer":
            add(at, uid, ResourceList(cpu=2000, memory=8 * GI, **{devices.GPU_CORE: 50, devices.GPU_RATIO: 50}))
        elif kind == "rdma":
            add(at, uid, ResourceList(cpu=4000, memory=16 * GI, **{devices.NVIDIA_GPU: 1, devices.RDMA: 1}))
        elif kind == "reserved":
            requests = ResourceList(cpu=500, memory=GI)
            timeline.append((max(0.0, at - 1.0), topics.PODS, Reservation(
                uid=f"r-{uid}", name=f"r-{uid}", requests=requests, owners=(ReservationOwner(object_uid=uid),),
                ttl_s=600.0, creation_timestamp=now + at)))
            add(at, uid, requests)
        else:  # a gang of five, min-available four; one member may be deleted
            gang = uid
            rdma = rng.random() < 0.5
            members = []
            for m in range(5):
                requests = ResourceList(cpu=4000, memory=16 * GI, **{devices.NVIDIA_GPU: 1})
                if rdma:
                    requests[devices.RDMA] = 1
                members.append(add(at, f"{gang}-m{m}", requests, {
                    GANG_NAME_ANNOTATION: gang, GANG_MIN_AVAILABLE_ANNOTATION: "4",
                    GANG_WAITING_TIME_ANNOTATION: "30s"}).uid)
            gangs[gang] = (4, members)
            if rng.random() < cfg.deleted_share * 4:
                deleted.add(rng.choice(members))
    # The quota's pods, in bursts spread over the load (after the seeded stream, which they
    # leave as it was), and the budgeted workloads with their seeded scale-down moments.
    span = len(pods) / cfg.rate
    quota_pods: set[str] = set()
    bursts = math.ceil(cfg.quota_pods / cfg.quota_burst) if cfg.quota_pods else 0
    for k in range(bursts):
        for j in range(min(cfg.quota_burst, cfg.quota_pods - k * cfg.quota_burst)):
            quota_pods.add(add(span * (k + 0.5) / bursts, f"c{run}-quota-{k:03d}-{j}",
                               ResourceList(cpu=1000, memory=GI), labels={QUOTA_LABEL: QUOTA}).uid)
    later = random.Random(cfg.seed * 104729 + 3)
    budgeted = [BudgetWorkload(
        name=f"keep-{i}", namespace=f"{namespace}-pdb", template=Pod(
            uid="t", name="t", namespace=f"{namespace}-pdb", requests=ResourceList(cpu=500, memory=GI)),
        replicas=cfg.budget_replicas, min_available=cfg.budget_min_available, scale_down_by=cfg.budget_scale_down,
        scale_down_at=span * (i + later.uniform(0.2, 0.8)) / cfg.budget_workloads) for i in range(cfg.budget_workloads)]
    asked_cpu_budgets = sum(b.replicas * b.template.requests["cpu"] for b in budgeted)
    # The cluster: GPU nodes for twice the GPUs asked, CPU nodes for the CPUs they leave short.
    asked_gpus = sum(p.requests.get(devices.NVIDIA_GPU, 0) + p.requests.get(devices.GPU_CORE, 0) / 100
                     for p in pods.values())
    gpu_nodes = max(4, math.ceil(asked_gpus * 2 / 8))
    nodes = [Node(name=f"c{run}-gpu-{i:04d}", labels={"pool": "gpu"},
                  allocatable=ResourceList(cpu=96_000, memory=512 * GI, pods=110, **{devices.NVIDIA_GPU: 8}),
                  gpus=tuple(GpuDevice(minor=g, model="A100", memory=80 * GI) for g in range(8)),
                  rdma=(RdmaDevice("mlx5_0", 0, 8), RdmaDevice("mlx5_1", 1, 8)))
             for i in range(gpu_nodes)]
    asked_cpu = sum(p.requests["cpu"] for p in pods.values()) + asked_cpu_budgets
    cpu_nodes = max(2, math.ceil((asked_cpu * 2 - gpu_nodes * 96_000) / 64_000))
    nodes += [Node(name=f"c{run}-cpu-{i:04d}", labels={"pool": "cpu"},
                   allocatable=ResourceList(cpu=64_000, memory=256 * GI, pods=110))
              for i in range(cpu_nodes)]
    singles = [uid for uid, p in pods.items() if GANG_NAME_ANNOTATION not in p.annotations and uid not in quota_pods]
    deleted.update(rng.sample(singles, int(len(singles) * cfg.deleted_share)))
    offsets = {uid: at for at, _, r in timeline if isinstance(r, Pod) for uid in (r.uid,)}
    for uid in sorted(deleted):
        p = pods[uid]
        timeline.append((offsets[uid] + rng.uniform(0.0, 15.0), topics.PODS, PodDeleted(
            uid=uid, name=p.name, namespace=p.namespace, annotations=p.annotations)))
    timeline.sort(key=lambda item: item[0])
    return Workload(nodes, timeline, pods, deleted, gangs, {QUOTA: {"cpu": cfg.quota_max_cpu}} if quota_pods else {},
                    quota_pods, budgeted)


# --- the processes -----------------------------------------------------------------------------


class Fleet:
    """The worker processes by name (`state-0`, `scheduler-1`, ...), their logs in `logs`."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: dict[str, int] = {}
        self.unplanned_exits: list[tuple[float, str, int]] = []

    def start(self, name: str) -> None:
        role = name.split("-")[0]
        self.starts[name] = self.starts.get(name, 0) + 1
        log = open(self.logs / f"{name}.{self.starts[name]}.log", "wb")  # noqa: SIM115 - the child owns it
        self.procs[name] = spawn_tied([sys.executable, "-m", "cli.main", "worker", "--roles", role],
                                      env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def kill(self, name: str) -> float:
        proc = self.procs[name]
        killed_at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return killed_at

    def restart_exited(self) -> None:
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None:
                self.unplanned_exits.append((time.time(), name, proc.returncode))
                self.start(name)

    def stop_all(self, deadline_s: float) -> None:
        for proc in self.procs.values():
            stop(proc, deadline_s=deadline_s)


# --- reading the topics ------------------------------------------------------------------------


@dataclass
class Seen:
    """Every record read back: (broker time s, topic, partition, origin source, record)."""

    records: list[tuple[float, str, int, str, Record]] = field(default_factory=list)


async def read_topics(kafka: KafkaConnection | str, names: Iterable[str], partitions: int, seen: Seen) -> None:
    """Read `names` from the beginning, committed records only, until cancelled."""
    consumer = KafkaConnection.of(kafka).consumer(group_id=None, enable_auto_commit=False,
                                                  auto_offset_reset="earliest", fetch_max_wait_ms=50,
                                                  isolation_level="read_committed")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(t, p) for t in names for p in range(partitions)])
        await consumer.seek_to_beginning()
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=200, max_records=20000)
            except Exception:  # noqa: BLE001 - the broker is being restarted: read on
                await asyncio.sleep(0.5)
                continue
            for tp, messages in batches.items():
                for m in messages:
                    origin = origin_from_headers(m.headers)
                    source = origin.source if origin else ""
                    for r in decode_message(m.value):
                        if not isinstance(r, SchemaError):
                            seen.records.append((m.timestamp / 1000.0, tp.topic, tp.partition, source, r))
    finally:
        await consumer.stop()


# --- the run -----------------------------------------------------------------------------------


def _schedule(cfg: ChaosConfig, span_s: float) -> list[tuple[float, str]]:
    """Seeded (offset s, what) of every kill and broker restart: within the publishing span,
    at least 20 s of load after each, spaced so that each can recover before the next."""
    rng = random.Random(cfg.seed * 7919 + 1)
    events = cfg.kills + cfg.broker_restarts
    if not events:
        return []
    start, end = min(10.0, span_s * 0.1), max(span_s - 20.0, span_s * 0.5)
    slot = (end - start) / events
    whats = [rng.choice(WORKERS) for _ in range(cfg.kills)]
    for _ in range(cfg.broker_restarts):
        whats.insert(rng.randrange(len(whats) + 1), "broker")
    return [(start + slot * i + rng.uniform(0.0, slot * 0.5), what) for i, what in enumerate(whats)]


async def run_chaos(cfg: ChaosConfig, settings: Settings) -> dict[str, Any]:
    # The harness's clients retry through every kill and restart; aiokafka logs each failed try.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    run = uuid.uuid4().hex[:6]
    run_dir = Path(cfg.run_dir or f"out/chaos-{run}")
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    broker: Any
    if cfg.broker == "kafka":
        from streams.kafka_broker import KafkaBroker

        broker = KafkaBroker(log_dir=str(run_dir / "kafka"))
    elif cfg.broker == "tansu":
        broker = EmbeddedBroker()
        if cfg.broker_restarts:
            raise ValueError("broker_restarts: the embedded Tansu keeps nothing across a restart; use --broker kafka")
    else:
        raise ValueError(f"broker={cfg.broker!r}: choose kafka or tansu")
    broker.start()
    fleet: Fleet | None = None
    try:
        await wait_ready(broker.bootstrap, timeout_s=120.0)
        bootstrap = broker.bootstrap
        w = workload(cfg, run, time.time())
        profiles, rebalancer = run_dir / "profiles.yaml", run_dir / "rebalancer.yaml"
        profiles.write_text(w.profiles_yaml())
        rebalancer.write_text(REBALANCER_YAML)
        kafka = replace(own_broker(settings.kafka, bootstrap), partitions=cfg.partitions)
        env = {**os.environ, **child_env(kafka),
               "KOORDSTREAM_KAFKA_PARTITIONS": str(cfg.partitions),
               "KOORDSTREAM_SCHEDULING_PROFILES": str(profiles.resolve()),
               "KOORDSTREAM_REBALANCER_CONFIG": str(rebalancer.resolve()), "KOORDSTREAM_REBALANCER_TICK_S": "0.1"}
        settings = replace(settings, kafka=kafka)
        await prepare(settings)
        fleet = Fleet(env, run_dir / "logs")
        for name in WORKERS:
            fleet.start(name)
        return await _drive(cfg, w, broker, fleet, run_dir)
    finally:
        if fleet is not None:
            fleet.stop_all(settings.worker.shutdown_deadline_s + 1.0)
        broker.stop()


async def _publish_retrying(producer: RecordProducer, topic: str, records: list[Record]) -> None:
    """Publish and wait for the acknowledgement, again and again while the broker is away
    (a record sent twice is the same record: pods are idempotent by uid)."""
    while True:
        try:
            await producer.flush(await producer.publish(topic, records))
            return
        except Exception:  # noqa: BLE001 - the broker is being restarted
            await asyncio.sleep(0.5)


async def _drive(cfg: ChaosConfig, w: Workload, broker: Any, fleet: Fleet, run_dir: Path) -> dict[str, Any]:
    seen = Seen()
    reader = asyncio.create_task(read_topics(
        broker.bootstrap, [topics.BINDINGS, topics.FEEDBACK, topics.HOLDS, topics.NODE_INBOX, topics.STATE_CHANGES,
                           topics.PODS, topics.EVICTIONS], cfg.partitions, seen))
    kills: list[dict[str, Any]] = []
    broker_restarts: list[dict[str, Any]] = []
    try:
        async with RecordProducer(broker.bootstrap, cfg.partitions) as producer:
            async def publish(topic: str, records: list[Record]) -> None:
                await _publish_retrying(producer, topic, records)

            cluster = ChaosCluster(publish, {uid: w.pods[uid] for uid in w.quota_pods}, cfg.quota_run_s, w.budgeted,
                                   cfg.ready_delay_s)
            await _publish_retrying(producer, topics.NODES, list(w.nodes))
            await _wait_nodes_reported(seen, {n.name for n in w.nodes}, timeout_s=180.0, fleet=fleet)
            await cluster.start()
            span = w.timeline[-1][0]
            plan = _schedule(cfg, span)
            t0 = time.time()
            started = time.monotonic()
            i = 0
            while i < len(w.timeline) or plan:
                now = time.monotonic() - started
                if plan and plan[0][0] <= now:
                    _, what = plan.pop(0)
                    if what == "broker":
                        broker_restarts.append(await _restart_broker(broker, fleet))
                    else:
                        killed_at = fleet.kill(what)
                        fleet.start(what)
                        kills.append({"worker": what, "at": killed_at, "offset_s": round(killed_at - t0, 1)})
                j = i
                while j < len(w.timeline) and w.timeline[j][0] <= now:
                    j += 1
                if j > i:
                    await _publish_retrying(producer, topics.PODS, [r for _, _, r in w.timeline[i:j]])
                    i = j
                await cluster.step(seen.records, now)
                fleet.restart_exited()
                await asyncio.sleep(0.02)
            published_s = time.time() - t0
            await _wait_quiet(cfg, w, seen, fleet, lambda: cluster.step(seen.records, time.monotonic() - started))
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
    out = verdict(w, seen, cfg.partitions)
    out["evictions_carried_out"] = len(cluster.evicted)
    out["scale_downs_asked"] = len(cluster.scaled)
    if not succeeded(out):
        out["records_file"] = str(dump_records(seen, run_dir / "records.jsonl"))
    for k in kills:
        k["recovery_s"] = recovery_s(seen, k["at"], k["worker"].split("-")[0], cfg.partitions)
    for b in broker_restarts:
        b["recovery_s"] = recovery_s(seen, b["at"], "any", cfg.partitions)
    out.update({
        "broker": cfg.broker,
        "seed": cfg.seed,
        "kills": len(kills),
        "broker_restarts": len(broker_restarts),
        "recovery_s": [k["recovery_s"] for k in kills],
        "broker_recovery_s": [b["recovery_s"] for b in broker_restarts],
        "kill_log": [{k: v for k, v in kill.items() if k != "at"} for kill in kills],
        "unplanned_exits": [{"worker": name, "code": code, "offset_s": round(at - t0, 1)}
                            for at, name, code in fleet.unplanned_exits],
        "publish_s": round(published_s, 1),
        "wall_s": round(time.time() - t0, 1),
    })
    return out


async def _restart_broker(broker: Any, fleet: Fleet) -> dict[str, Any]:
    killed_at = time.time()
    broker.kill()
    await asyncio.sleep(2.0)
    broker.restart()
    await wait_ready(broker.bootstrap, timeout_s=120.0)
    fleet.restart_exited()
    return {"at": killed_at, "down_s": round(time.time() - killed_at, 1)}


async def _wait_nodes_reported(seen: Seen, names: set[str], timeout_s: float, fleet: Fleet) -> None:
    deadline = time.monotonic() + timeout_s
    reported: set[str] = set()
    read = 0
    while True:
        for _, _, _, _, r in seen.records[read:]:
            if isinstance(r, NodeStateChange) and r.node_record is not None:
                reported.add(r.node)
        read = len(seen.records)
        if names <= reported:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the owners reported {len(reported & names)} of {len(names)} nodes in {timeout_s}s")
        fleet.restart_exited()
        await asyncio.sleep(0.2)


async def _wait_quiet(cfg: ChaosConfig, w: Workload, seen: Seen, fleet: Fleet,
                      step: Callable[[], Awaitable[None]]) -> None:
    """Until every pod that must bind is bound (then `settle_s` more for the last reports), or
    nothing new was decided for `stall_s`; `step` plays the cluster meanwhile."""
    must = set(w.pods) - w.deleted
    bound: set[str] = set()
    read, last, count = 0, time.monotonic(), -1
    while True:
        for _, _, _, _, r in seen.records[read:]:
            if isinstance(r, Binding):
                bound.add(r.uid)
        read = len(seen.records)
        if must <= bound:
            settle = time.monotonic() + (cfg.settle_s if w.gangs else 5.0)
            while time.monotonic() < settle:
                await step()
                await asyncio.sleep(0.1)
            return
        if len(bound) != count:
            count, last = len(bound), time.monotonic()
        elif time.monotonic() - last > cfg.stall_s:
            return
        fleet.restart_exited()
        await step()
        await asyncio.sleep(0.1)


# --- the verdict -------------------------------------------------------------------------------


def verdict(w: Workload, seen: Seen, partitions: int) -> dict[str, Any]:
    """The independent check (see the module docstring), from the records read back."""
    pods = w.pods
    bindings = [(ts, r) for ts, topic, _, _, r in seen.records if topic == topics.BINDINGS and isinstance(r, Binding)]
    distinct: dict[str, set[tuple[str, str]]] = {}
    for _, b in bindings:
        distinct.setdefault(b.uid, set()).add((b.node, json.dumps(b.annotations, sort_keys=True)))
    terminations = [Placement(ts, r.uid, r.node) for ts, topic, _, _, r in seen.records
                    if topic == topics.NODE_INBOX and isinstance(r, PodTerminated)]
    requests = {uid: devices.with_gpu_totals(p.requests) for uid, p in pods.items()}
    for _, _, r in w.timeline:
        if isinstance(r, Reservation):
            requests[r.uid] = devices.with_gpu_totals(r.requests)
    budget_namespaces = {b.namespace for b in w.budgeted}
    budget_pods = {r.uid: r for _, topic, _, _, r in seen.records
                   if topic == topics.PODS and isinstance(r, Pod) and r.namespace in budget_namespaces}
    requests.update((uid, devices.with_gpu_totals(p.requests)) for uid, p in budget_pods.items())
    allocatable = {n.name: devices.node_gpu_totals(n.allocatable, n.gpus, n.rdma) for n in w.nodes}
    result = check(allocatable, requests, [Placement(ts, b.uid, b.node) for ts, b in bindings],
                   terminations, counted=set(pods))
    capacity = {n.name: {**{f"gpu/{g.minor}/core": g.core for g in n.gpus},
                         **{f"gpu/{g.minor}/ratio": g.memory_ratio for g in n.gpus},
                         **{f"rdma/{nic.minor}/vfs": nic.vfs for nic in n.rdma}} for n in w.nodes}
    device_placements = [DevicePlacement(ts, b.uid, b.node, device_amounts(
        b.annotations.get(devices.DEVICE_ALLOCATED, ""))) for ts, b in bindings]
    devices_over = devices_overcommitted(capacity, device_placements, terminations)
    bound = set(distinct)
    last_hold: dict[str, str] = {}
    last_nominations: dict[str, tuple[str, ...]] = {}
    for _, topic, _, _, r in seen.records:
        if topic == topics.STATE_CHANGES and isinstance(r, NodeStateChange):
            last_hold.update(r.holds)
            last_nominations[r.node] = tuple(n.uid for n in r.nominations)
    ours = set(pods) | {f"r-{uid}" for uid in pods} | set(budget_pods)
    holds_leaked = sorted(h for h, status in last_hold.items() if status == "held" and HoldId.parse(h).uid in ours)
    nominations_leaked = sorted(f"{node}/{uid}" for node, uids in last_nominations.items() for uid in uids
                                if uid in ours)
    unbound = sorted(set(pods) - w.deleted - bound)
    quotas_over = quota_verdict(w, seen)
    budgets_broken = pdb_verdict(w, seen)
    return {
        "pods_total": len(pods),
        "pods_bound": len(bound & set(pods)),
        "pods_deleted": len(w.deleted),
        "pods_deleted_before_binding": len(w.deleted - bound),
        "pods_unschedulable": len(unbound),
        "pods_double_bound": sum(1 for uid, b in distinct.items() if len(b) > 1 and uid in pods),
        "nodes_overcommitted": result.nodes_overcommitted,
        "devices_overcommitted": len(devices_over),
        "gangs": len(w.gangs),
        "gangs_partial": len(partial_gangs(w.gangs, bound)),
        "holds_leaked": len(holds_leaked),
        "nominations_leaked": len(nominations_leaked),
        "quota_pods": len(w.quota_pods),
        "quotas_overcommitted": len(quotas_over),
        "budgets": len(w.budgeted),
        "pdb_violations": sum(v.samples for v in budgets_broken),
        "pdb_lowest_healthy": {v.budget: v.lowest for v in budgets_broken},
        "examples": {
            "unbound": unbound[:10],
            "double_bound": sorted(uid for uid, b in distinct.items() if len(b) > 1)[:10],
            "overcommitted": dict(list(result.overcommitted.items())[:5]),
            "devices_overcommitted": dict(list(devices_over.items())[:5]),
            "holds_leaked": holds_leaked[:10],
            "nominations_leaked": nominations_leaked[:10],
            "quotas_overcommitted": quotas_over[:10],
            "pdb_violations": [f"{v.budget}: {v.samples} samples, first {v.first}" for v in budgets_broken[:10]],
            # What the topics show of the first unbound pods (a gang: its first member), so that
            # a failed run can be read without its broker (Tansu keeps nothing after the run).
            "unbound_history": {uid: history(seen, uid) for uid in unbound[:2]},
        },
    }


def quota_verdict(w: Workload, seen: Seen) -> list[str]:
    """`quotas_overcommitted`: every Binding that took a quota's committed usage over its max,
    replaying the Bindings and the pods' ends (PodTerminated on `node-inbox`, PodDeleted on
    `pods`) in log-time order (`perf.checker.quotas_overcommitted`)."""
    quota_of = {uid: w.pods[uid].labels[QUOTA_LABEL] for uid in w.quota_pods}
    bindings = [Placement(ts, r.uid, r.node) for ts, topic, _, _, r in seen.records
                if topic == topics.BINDINGS and isinstance(r, Binding) and r.uid in quota_of]
    ends = [(ts, r.uid) for ts, topic, _, _, r in seen.records
            if ((topic == topics.NODE_INBOX and isinstance(r, PodTerminated))
                or (topic == topics.PODS and isinstance(r, PodDeleted))) and r.uid in quota_of]
    return quotas_overcommitted(w.quotas, quota_of, {uid: w.pods[uid].requests for uid in quota_of}, bindings, ends)


def pdb_verdict(w: Workload, seen: Seen) -> list[BudgetViolation]:
    """`pdb_violations`: per budget, the samples (every `SAMPLE_S` of log time) in which its
    healthy pods (Running on a node, as published on `pods`) were fewer than its desired
    healthy count, once it had been satisfied; a pod ends at its PodTerminated or PodDeleted
    (`perf.checker.pdb_violations`). Only evictions take the budgeted pods away."""
    specs = [BudgetSpec(f"{b.namespace}/{b.name}", b.namespace, {"app": b.name}, min_available=b.min_available)
             for b in w.budgeted]
    if not specs:
        return []
    namespaces = {b.namespace for b in w.budgeted}
    events: list[PodSeen] = []
    for ts, topic, _, _, r in seen.records:
        if topic == topics.PODS and isinstance(r, Pod) and r.namespace in namespaces:
            events.append(PodSeen(ts, r.uid, r.namespace, r.labels, healthy=r.phase == "Running" and bool(r.node_name)))
        elif (topic == topics.PODS and isinstance(r, PodDeleted) and r.namespace in namespaces) or (
                topic == topics.NODE_INBOX and isinstance(r, PodTerminated)):
            events.append(PodSeen(ts, r.uid, gone=True))
    return pdb_violations(specs, events, sample_s=SAMPLE_S, until=max(ts for ts, *_ in seen.records))


def dump_records(seen: Seen, path: Path) -> Path:
    """Every record read back, one JSON object per line (time, topic, partition, origin source,
    kind, fields): a failed run's evidence, which the embedded broker does not keep."""
    with path.open("w") as out:
        for ts, topic, partition, source, r in seen.records:
            out.write(json.dumps({"ts": ts, "topic": topic, "partition": partition, "source": source,
                                  "type": type(r).__name__, **to_plain(r)}) + "\n")
    return path


def history(seen: Seen, uid: str, limit: int = 40) -> list[str]:
    """The last `limit` records about `uid` on the topics, in the order they were read:
    offset in seconds, topic, origin source, and the record's kind and telling fields."""
    out = []
    for ts, topic, _, source, r in seen.records:
        if getattr(r, "uid", None) != uid:
            continue
        fields = [f"{name}={getattr(r, name)}" for name in ("attempt", "node", "reason", "round")
                  if getattr(r, name, None) not in (None, "")]
        out.append(f"{ts:.2f} {topic} {source or '-'} {type(r).__name__} {' '.join(fields)}")
    return out[-limit:]


def recovery_s(seen: Seen, at: float, role: str, partitions: int, window_s: float = 10.0) -> float | None:
    """Seconds from `at` until every source that decided in the `window_s` before it decides
    again (see the module docstring); None when one never does."""
    events: list[tuple[float, str]] = []
    for ts, topic, _, source, r in seen.records:
        if role in ("state", "any") and source and topic in (topics.STATE_CHANGES, topics.BINDINGS):
            events.append((ts, source))
        if role in ("scheduler", "any") and topic == topics.NODE_INBOX and isinstance(r, Claim):
            events.append((ts, f"{topics.PODS}/{partition_for(r.uid, partitions)}"))
    active = {source for ts, source in events if at - window_s <= ts < at}
    if not active:
        return 0.0
    first_after: dict[str, float] = {}
    for ts, source in sorted(events):
        if ts > at and source in active and source not in first_after:
            first_after[source] = ts
    if len(first_after) < len(active):
        return None
    return round(max(first_after.values()) - at, 2)


def succeeded(out: dict[str, Any]) -> bool:
    return bool(
        out["pods_unschedulable"] == 0 and out["pods_double_bound"] == 0 and out["nodes_overcommitted"] == 0
        and out["devices_overcommitted"] == 0 and out["gangs_partial"] == 0 and out["holds_leaked"] == 0
        and out["nominations_leaked"] == 0 and out["quotas_overcommitted"] == 0 and out["pdb_violations"] == 0
    )
