"""`koordstream perf run SCENARIO --kwok`: a scenario's nodes and pods through the real
kube-apiserver and real Kwok, with the koordstream bridge in between, measured as users of
Koordinator's scalability harness measure a scheduler.

Flow:
1. The scenario and its Stage files are read and checked before anything starts: each file must
   be a Kwok `Stage` (`kwok.x-k8s.io/v1alpha1`) that the in-process lifecycle reads too
   (`perf.kwok.load_stages`: selectors, delays and templates with Kwok's functions).
2. The control plane starts (`streams.kube_cluster.ControlPlane`: etcd, kube-apiserver with
   AlwaysAllow, Kwok with its stock stages node/fast and pod/fast; the scenario's Stage files
   are applied as Stage resources, each replacing the stock stage of its name). Then the system
   (`perf.demo.system`: a broker of `--broker`'s kind, the topics, the state and scheduler
   workers) and a bridge process (`koordstream worker --roles bridge` with the control plane's
   admin kubeconfig and its client limits raised out of the way: the API server, not the
   bridge's token bucket, is what a run measures).
3. Set-up through the API: the PriorityClasses the scenarios name (koord-prod 9000, koord-mid
   7000, koord-batch 5000, koord-free 3000), the RuntimeClasses its pods name (handler of the
   same name: the API server's admission refuses a pod naming none), the namespaces, the scenario's nodes
   (`schemas.kube.node_manifest`, annotated for Kwok). Start-up waits until the owners reported
   every node Ready (Kwok's node-initialize, seen by the bridge) and a probe pod created through
   the API is bound (the bridge leads, every consumer group joined).
4. The run: the harness's own watch on pods starts (each pod's first event, the event that
   shows its node, Running, Succeeded / Failed or deleted: local receive times); the scenario's
   pods (`pod_manifest`, schedulerName `koordstream` for pods of the default scheduler) and
   reservations (`reservation_manifest`, owners by pod name: the API server gives pods their own
   uids) are created at their time offsets by `concurrency` requests in flight (the harness's
   client has no rate limit). The run ends when every pod is bound or finally unschedulable
   (final feedback on `feedback`), or nothing moved for the stall time.
5. The readings: the API server's `/metrics` (`apiserver_request_total`,
   `apiserver_request_duration_seconds`) before and after, the CPU seconds of every process
   (kube-apiserver, etcd, Kwok, the workers, the bridge, the broker, this harness) and of the
   whole machine from /proc, etcd's database size; Bindings, final feedback, ProfilingSamples
   and AttemptsSamples from the topics, PodTerminated from `node-inbox`; the pods as the API
   server lists them at the end.

Figures (`perf.kube_figures` for the pure parts): throughput (pods bound, as the API server
lists them, over the time from the first pod created to the last decision; per-second samples
from the watch), queueing latency two ways (the API server's timestamps: `creationTimestamp` to
the `PodScheduled=True` condition's `lastTransitionTime`, whole seconds; the watch: first event
to the event with `spec.nodeName`, ms), start latency (to Running: Kwok's pod-ready stage), the
creation round trip, per-plugin time, the API server's requests a second by verb and resource
and their mean latency, CPU per component and which one limited the run; and the consistency
check: `perf.checker` over the Bindings on the topic (no pod bound to two nodes, no node or
GPU over its allocatable at any time, a pod counting from its Binding to its PodTerminated)
and, from the API server's final list, every pod bound where its Binding says, bound at most
once, and no node's unfinished pods over its allocatable.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from agents.state import devices
from perf import kube_figures as kf
from perf import scenario as sc
from perf.checker import DevicePlacement, Placement, check, device_amounts, devices_overcommitted
from perf.collector import Collector
from perf.demo import percentiles, system
from perf.figures import allocation, burst_throughput
from perf.kwok import StageError, load_stages
from perf.proc import children, cpu_s, machine_busy_s, peak_rss_mb, self_cpu_s
from perf.run import latency_cdf, scheduler_figures
from schemas import topics
from schemas.kube import node_manifest, pod_manifest, reservation_manifest
from schemas.records import (
    DEFAULT_SCHEDULER,
    GANG_NAME_ANNOTATION,
    Binding,
    Node,
    NodeCondition,
    NodeStateChange,
    Pod,
    PodTerminated,
    Record,
    Reservation,
    ReservationOwner,
    ResourceList,
    SchedulingFeedback,
)
from streams.bridge.service import profile_names
from streams.connection import child_env, connect
from streams.kube_cluster import KWOK_NODE_ANNOTATION, ControlPlane
from streams.kubeapi import KubeApi, KubeError, Limits
from streams.process import quiet_gc, spawn_tied, stop
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
SCHEDULER = "koordstream"  # the schedulerName of pods the scenario leaves to the default scheduler
PRIORITY_CLASSES = {"koord-prod": 9000, "koord-mid": 7000, "koord-batch": 5000, "koord-free": 3000}
PROBE_NAMESPACE = "koordstream-perf"
RESERVATIONS = "/apis/scheduling.koordinator.sh/v1alpha1/reservations"
FINISHED = ("Succeeded", "Failed")
READY = NodeCondition("Ready", "True")
# Kwok plays every kubelet from a few workers (4 per kind by default): at a few hundred pods a
# second each transition waits its turn behind the others, so a run's pods would start late
# because of Kwok, not because of the API server or koordstream.
KWOK_OPTIONS = {"podPlayStageParallelism": 32, "nodePlayStageParallelism": 16}


@dataclass
class KwokOptions:
    broker: str = "tansu"  # the broker the run starts when `bootstrap` is empty: tansu or kafka
    bootstrap: str = ""
    layout: str = "split"
    concurrency: int = 64
    """Creations in flight at once (the harness's client has no rate limit)."""
    bridge_qps: float = 20000.0
    bridge_burst: int = 40000
    bridge_concurrency: int = 128
    stall_timeout_s: float = 60.0
    startup_timeout_s: float = 300.0
    run_dir: str = ""
    """Where the control plane's data and every log go (kept); empty: a temporary folder, removed."""
    on_progress: Callable[[int, int], None] | None = None
    """Called as the run goes with (pods bound, pods of the scenario): the CLI's progress bar."""


# --- what is created ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Creation:
    """One object to create at `at` seconds from the start: its API path and encoded body."""

    at: float
    key: str  # namespace/name (a reservation: its name)
    kind: str  # Pod or Reservation
    path: str
    body: bytes


def stage_documents(s: sc.Scenario) -> list[dict[str, Any]]:
    """The scenario's Stage files as Stage resources, refused (StageError) unless each is a
    Kwok Stage the in-process lifecycle reads as well."""
    load_stages(ROOT / stage for stage in s.stages)
    out = []
    for stage in s.stages:
        for doc in yaml.safe_load_all((ROOT / stage).read_text()):
            if not doc:
                continue
            if doc.get("apiVersion") != "kwok.x-k8s.io/v1alpha1" or doc.get("kind") != "Stage":
                raise StageError(stage, "apiVersion/kind", f"{doc.get('apiVersion')}/{doc.get('kind')}",
                                 "must be kwok.x-k8s.io/v1alpha1 Stage")
            out.append(doc)
    return out


def scheduler_names(s: sc.Scenario, settings: Settings) -> frozenset[str]:
    """The profiles the workers run (the scenario's, else the built-in ones)."""
    return profile_names(s.profiles and str(ROOT / s.profiles) or settings.scheduling.profiles)


def kube_scheduler_name(pod_scheduler: str, profiles: frozenset[str]) -> str:
    """A pod of the default scheduler is created for koordstream (the bridge leaves
    `default-scheduler` to kube-scheduler); any other name must be one of the profiles."""
    name = SCHEDULER if pod_scheduler == DEFAULT_SCHEDULER else pod_scheduler
    if name not in profiles:
        raise ValueError(f"pods of schedulerName {name!r}: no such profile among {sorted(profiles)}")
    return name


def probe_scheduler(profiles: frozenset[str]) -> str:
    """The schedulerName of the start-up probe: `koordstream`, else the first profile the
    bridge hands pods to (any but `default-scheduler`)."""
    if SCHEDULER in profiles:
        return SCHEDULER
    names = sorted(profiles - {DEFAULT_SCHEDULER})
    if not names:
        raise ValueError(f"no profile but {DEFAULT_SCHEDULER!r}: the bridge would hand koordstream no pod")
    return names[0]


def creations(arrivals: list[tuple[float, Record]], profiles: frozenset[str]) -> list[Creation]:
    """The scenario's records as API objects, in time order: pods (`pod_manifest`) and
    reservations (`reservation_manifest`, their owners by the pod's name and namespace)."""
    pods = {r.uid: r for _, r in arrivals if isinstance(r, Pod)}
    out = []
    for at, r in arrivals:
        if isinstance(r, Pod):
            manifest = pod_manifest(replace(r, scheduler_name=kube_scheduler_name(r.scheduler_name, profiles)))
            out.append(Creation(at, f"{r.namespace}/{r.name}", "Pod", f"/api/v1/namespaces/{r.namespace}/pods",
                                orjson.dumps(manifest)))
        elif isinstance(r, Reservation):
            owners = tuple(ReservationOwner(object_name=pods[o.object_uid].name,
                                            object_namespace=pods[o.object_uid].namespace)
                           if o.object_uid in pods else o for o in r.owners)
            namespace = next((o.object_namespace for o in owners if o.object_namespace), "default")
            manifest = reservation_manifest(replace(r, owners=owners, scheduler_name=kube_scheduler_name(
                r.scheduler_name, profiles)), namespace=namespace)
            out.append(Creation(at, r.name, "Reservation", RESERVATIONS, orjson.dumps(manifest)))
    return out


# --- the harness's watch -----------------------------------------------------------------------


@dataclass
class PodWatch:
    """Lists and then watches every pod, keeping per pod (`namespace/name`) the local time of
    its first event, of the event that showed its node, of Running, and of Succeeded / Failed
    or its deletion; its uid and node. Resumes from the last resourceVersion; a 410 lists again
    (`relists`: what happened in between is seen late)."""

    api: KubeApi
    targets: frozenset[str] = frozenset()  # the pods whose binding `bound_targets` counts
    bound_targets: int = 0
    first_seen: dict[str, float] = field(default_factory=dict)
    bound_at: dict[str, float] = field(default_factory=dict)
    running_at: dict[str, float] = field(default_factory=dict)
    finished_at: dict[str, float] = field(default_factory=dict)
    node: dict[str, str] = field(default_factory=dict)
    uid: dict[str, str] = field(default_factory=dict)
    events: int = 0
    relists: int = -1
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def see(self, kind: str, obj: dict[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        self.events += 1
        self.changed.set()
        if kind == "DELETED":
            self.finished_at.setdefault(key, now)
            return
        self.first_seen.setdefault(key, now)
        self.uid[key] = str(meta.get("uid", ""))
        node = (obj.get("spec") or {}).get("nodeName")
        if node and key not in self.bound_at:
            self.bound_at[key], self.node[key] = now, str(node)
            self.bound_targets += key in self.targets
        phase = (obj.get("status") or {}).get("phase")
        if phase == "Running":
            self.running_at.setdefault(key, now)
        elif phase in FINISHED:
            self.finished_at.setdefault(key, now)

    async def run(self) -> None:
        version = ""
        while True:
            try:
                if not version:
                    self.relists += 1
                    items, version = await list_all(self.api, "/api/v1/pods")
                    now = time.time()
                    for obj in items:
                        self.see("ADDED", obj, now)
                    self.synced.set()
                async for event in self.api.watch("/api/v1/pods", {"resourceVersion": version,
                                                                   "timeoutSeconds": 3600}):
                    now = time.time()
                    obj = event.get("object") or {}
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") != "BOOKMARK":
                        self.see(str(event.get("type")), obj, now)
            except KubeError as exc:
                if exc.status == 410:
                    version = ""
                    continue
                await asyncio.sleep(0.5)


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """What a run reads of a listed pod (a list of 100,000 whole pods is gigabytes in Python):
    its name, namespace, uid and creation time, node, phase and PodScheduled condition."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    return {"metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "creationTimestamp")},
            "spec": {"nodeName": spec.get("nodeName")},
            "status": {"phase": status.get("phase"),
                       "conditions": [c for c in status.get("conditions") or () if c.get("type") == "PodScheduled"]}}


async def list_all(api: KubeApi, path: str, page: int = 500,
                   keep: Callable[[dict[str, Any]], dict[str, Any]] = slim_pod) -> tuple[list[dict[str, Any]], str]:
    """Every object of a list path (paginated, each as `keep` makes it) and the list's
    resourceVersion."""
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        answer = await api.request("GET", path, params={"limit": page, **({"continue": token} if token else {})},
                                   timeout_s=300)
        items += [keep(item) for item in answer.get("items") or ()]
        meta = answer.get("metadata") or {}
        token = meta.get("continue") or ""
        if not token:
            return items, str(meta.get("resourceVersion", ""))


# --- creating ----------------------------------------------------------------------------------


@dataclass
class Created:
    """What the creators did: per key, (request sent, answer received, the uid given)."""

    done: dict[str, tuple[float, float, str]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    retries: int = 0
    lag_s: float = 0.0  # how far behind its time offset the latest creation was sent


def _transient(exc: KubeError) -> bool:
    return exc.status in (0, 429) or exc.status >= 500


async def create_one(api: KubeApi, item: Creation, log: Created) -> None:
    delay = 0.2
    sent = time.time()
    while True:
        try:
            answer = await api.request("POST", item.path, body=item.body, timeout_s=60)
            log.done[item.key] = (sent, time.time(), str((answer.get("metadata") or {}).get("uid", "")))
            return
        except KubeError as exc:
            if exc.status == 409:  # a retry of a POST that had landed: it exists
                name = item.key.rsplit("/", 1)[-1]
                got = await api.request("GET", f"{item.path}/{name}")
                log.done[item.key] = (sent, time.time(), str((got.get("metadata") or {}).get("uid", "")))
                return
            if not _transient(exc):
                log.failed[item.key] = str(exc)
                return
            log.retries += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def create_all(api: KubeApi, items: list[Creation], t0: float, concurrency: int, log: Created) -> None:
    """Create `items` at their offsets from `t0`, `concurrency` requests in flight; when the
    API server is slower than the offsets, the rest wait their turn (`log.lag_s`)."""
    queue: asyncio.Queue[Creation | None] = asyncio.Queue(maxsize=concurrency)

    async def feed() -> None:
        for item in items:
            delay = t0 + item.at - time.time()
            if delay > 0.002:
                await asyncio.sleep(delay)
            await queue.put(item)
            log.lag_s = max(log.lag_s, time.time() - t0 - item.at)
        for _ in range(concurrency):
            await queue.put(None)

    async def work() -> None:
        while (item := await queue.get()) is not None:
            await create_one(api, item, log)

    await asyncio.gather(feed(), *(work() for _ in range(concurrency)))


# --- the run -----------------------------------------------------------------------------------


def _priority_class(name: str, value: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value, "globalDefault": False, "description": "koordstream perf run (Koordinator's bands)"}


async def _create_ignoring_conflict(api: KubeApi, path: str, body: dict[str, Any]) -> None:
    try:
        await api.request("POST", path, body=body)
    except KubeError as exc:
        if exc.status != 409:
            raise


async def _wait_nodes_ready(reports: Collector, names: set[str], deadline: float, process_check: Callable[[], None]
                            ) -> None:
    """Until the owners reported every node with Ready True (as the bridge published it once
    Kwok's node-initialize stage ran)."""
    latest: dict[str, Node] = {}
    read = 0
    while True:
        records = reports.records
        for _, _, r in records[read:]:
            if isinstance(r, NodeStateChange) and r.node_record is not None:
                latest[r.node] = r.node_record
        read = len(records)
        waiting = names - {n for n, node in latest.items() if READY in node.conditions}
        if not waiting:
            return
        process_check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the owners did not report {len(waiting)} nodes Ready in time "
                               f"(e.g. {sorted(waiting)[0]}): is Kwok running, is the bridge?")
        await asyncio.sleep(0.2)


async def _scrape(api: KubeApi, etcd_port: int) -> tuple[str, str]:
    apiserver = await api.text("/metrics", timeout_s=60)
    async with aiohttp.ClientSession() as session, \
            session.get(f"http://127.0.0.1:{etcd_port}/metrics", timeout=aiohttp.ClientTimeout(total=30)) as resp:
        etcd = await resp.text()
    return apiserver, etcd


def _one(text: str, name: str) -> float:
    return sum(kf.counters(text, name).values())


class _Processes:
    """The processes whose CPU and memory a run reads: the control plane's, the workers', the
    bridge's, the broker (the other children of this process) and this process."""

    def __init__(self, cp: ControlPlane, workers: list[subprocess.Popen[bytes]], bridge: subprocess.Popen[bytes]
                 ) -> None:
        roles = ["state", "scheduler"] if len(workers) == 2 else ["worker"] * len(workers)
        self.pids = {name: p.pid for name, p in cp.procs.items()}
        self.pids.update({role: p.pid for role, p in zip(roles, workers, strict=False)})
        self.pids["bridge"] = bridge.pid
        known = set(self.pids.values())
        self.broker = [pid for pid in children(os.getpid()) if pid not in known]

    def cpu(self) -> dict[str, float]:
        out = {name: cpu_s(pid) for name, pid in self.pids.items()}
        if self.broker:
            out["broker"] = sum(cpu_s(pid) for pid in self.broker)
        out["harness"] = self_cpu_s()
        return out

    def memory_mb(self) -> dict[str, float]:
        out = {name: peak_rss_mb(pid) for name, pid in self.pids.items()}
        if self.broker:
            out["broker"] = sum(peak_rss_mb(pid) for pid in self.broker)
        out["harness"] = peak_rss_mb(os.getpid())
        return out


async def run_kwok(s: sc.Scenario, settings: Settings, opts: KwokOptions | None = None) -> dict[str, Any]:
    """See the module docstring."""
    opts = opts or KwokOptions()
    extra_stages = stage_documents(s)  # refused before anything starts
    if s.profiles:
        settings = replace(settings, scheduling=replace(settings.scheduling, profiles=str(ROOT / s.profiles)))
    profiles = scheduler_names(s, settings)
    probe_scheduler(profiles)  # a profile set the bridge hands nothing to is refused before anything starts
    nodes = sc.nodes(s)
    arrivals = sc.arrivals(s)
    plan = creations(arrivals, profiles)
    started = time.perf_counter()
    async with bridged(settings, opts, extra_stages) as (cp, settings, workers, bridge, log):
        result = await _drive(s, settings, cp, workers, bridge, log, nodes, arrivals, plan, started, opts)
    result["stages"] = sorted({str((d.get("metadata") or {}).get("name")) for d in extra_stages})
    return result


@contextlib.asynccontextmanager
async def bridged(settings: Settings, opts: KwokOptions, extra_stages: list[dict[str, Any]] | None = None
                  ) -> AsyncIterator[tuple[ControlPlane, Settings, list[Any], subprocess.Popen[bytes], Path]]:
    """The control plane (with `extra_stages`), the system (`perf.demo.system`) and a bridge
    process between them: (control plane, the system's settings, its workers, the bridge, the
    bridge's log)."""
    folder = Path(opts.run_dir) if opts.run_dir else None
    async with ControlPlane(folder, extra_stages=extra_stages or [], kwok_options=KWOK_OPTIONS) as cp, \
            system(settings, opts.bootstrap, opts.layout, opts.broker) as (settings, workers):
        env = {**os.environ, **child_env(settings.kafka),
               "KOORDSTREAM_KAFKA_PARTITIONS": str(settings.kafka.partitions),
               "KOORDSTREAM_BRIDGE_KUBECONFIG": str(cp.kubeconfig),
               "KOORDSTREAM_BRIDGE_QPS": str(opts.bridge_qps), "KOORDSTREAM_BRIDGE_BURST": str(opts.bridge_burst),
               "KOORDSTREAM_BRIDGE_CONCURRENCY": str(opts.bridge_concurrency),
               **({"KOORDSTREAM_SCHEDULING_PROFILES": settings.scheduling.profiles}
                  if settings.scheduling.profiles else {})}
        log = cp.folder / "logs" / "bridge.log"
        with open(log, "ab") as out:
            bridge = spawn_tied([sys.executable, "-m", "cli.main", "worker", "--roles", "bridge"], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            yield cp, settings, workers, bridge, log
        finally:
            stop(bridge, deadline_s=settings.worker.shutdown_deadline_s + 1.0)


def checked_alive(bridge: subprocess.Popen[bytes], bridge_log: Path, workers: list[Any]) -> Callable[[], None]:
    """A check that raises when the bridge or a worker has exited."""
    def alive() -> None:
        if bridge.poll() is not None:
            raise RuntimeError(f"the bridge exited with {bridge.returncode}:\n"
                               f"{bridge_log.read_text(errors='replace')[-3000:]}")
        for w in workers:
            if w.poll() is not None:
                raise RuntimeError(f"a worker exited with {w.returncode}")
    return alive


async def _drive(s: sc.Scenario, settings: Settings, cp: ControlPlane, workers: list[Any],
                 bridge: subprocess.Popen[bytes], bridge_log: Path, nodes: list[Node],
                 arrivals: list[tuple[float, Record]], plan: list[Creation], started: float,
                 opts: KwokOptions) -> dict[str, Any]:
    kafka, partitions = connect(settings.kafka), settings.kafka.partitions
    pods = {f"{r.namespace}/{r.name}": r for _, r in arrivals if isinstance(r, Pod)}
    keys = set(pods)
    quiet_gc(settings.worker.gc_threshold)

    alive = checked_alive(bridge, bridge_log, workers)
    collector = Collector(kafka, [topics.BINDINGS, topics.FEEDBACK, topics.PROFILING], partitions)
    terminations = Collector(kafka, [topics.NODE_INBOX], partitions, kinds=(PodTerminated,))
    reports = Collector(kafka, [topics.STATE_CHANGES], partitions)
    for c in (collector, terminations, reports):
        await c.start()
    api = cp.api(Limits(qps=0, burst=1, concurrency=max(opts.concurrency, 8) + 8))
    watch = PodWatch(api, targets=frozenset(keys))
    watcher: asyncio.Task[None] | None = None
    try:
        # -- set-up --------------------------------------------------------------------------
        deadline = time.monotonic() + opts.startup_timeout_s
        for name, value in PRIORITY_CLASSES.items():
            await _create_ignoring_conflict(api, "/apis/scheduling.k8s.io/v1/priorityclasses",
                                            _priority_class(name, value))
        for runtime in sorted({p.runtime_class_name for p in pods.values()} - {""}):  # else admission refuses the pods
            await _create_ignoring_conflict(api, "/apis/node.k8s.io/v1/runtimeclasses", {
                "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": runtime}, "handler": runtime})
        for namespace in sorted({p.namespace for p in pods.values()} | {PROBE_NAMESPACE}):
            await _create_ignoring_conflict(api, "/api/v1/namespaces", {
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        node_bodies = [orjson.dumps(node_manifest(n, annotations={KWOK_NODE_ANNOTATION: "fake"})) for n in nodes]
        await create_all(api, [Creation(0.0, n.name, "Node", "/api/v1/nodes", body)
                               for n, body in zip(nodes, node_bodies, strict=True)], time.time(), opts.concurrency,
                         nodes_created := Created())
        if nodes_created.failed:
            raise RuntimeError(f"{len(nodes_created.failed)} nodes not created, e.g. "
                               f"{next(iter(nodes_created.failed.values()))}")
        await _wait_nodes_ready(reports, {n.name for n in nodes}, deadline, alive)
        await reports.stop()
        watcher = asyncio.create_task(watch.run())
        await asyncio.wait_for(watch.synced.wait(), 120)
        probe = Pod(uid="perf-probe", name="perf-probe", namespace=PROBE_NAMESPACE, scheduler_name=probe_scheduler(
            scheduler_names(s, settings)), requests=ResourceList(cpu=100))
        await api.request("POST", f"/api/v1/namespaces/{PROBE_NAMESPACE}/pods", body=pod_manifest(probe))
        probe_key = f"{PROBE_NAMESPACE}/{probe.name}"
        while probe_key not in watch.bound_at:
            alive()
            if time.monotonic() > deadline:
                raise TimeoutError("the probe pod was not bound in time: is the scheduler running, the bridge?")
            await asyncio.sleep(0.05)
        startup_s = time.perf_counter() - started

        # -- the run -------------------------------------------------------------------------
        processes = _Processes(cp, workers, bridge)
        metrics_before = await _scrape(api, cp.etcd_port)
        cpu_before, machine_before = processes.cpu(), machine_busy_s()
        t0 = time.time()
        created = Created()
        creator = asyncio.create_task(create_all(api, plan, t0, opts.concurrency, created))
        try:
            await _wait_decided(watch, collector, keys, creator, opts, alive)
        finally:
            creator.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await creator
        window_s = time.time() - t0
        cpu_after, machine_after = processes.cpu(), machine_busy_s()
        metrics_after = await _scrape(api, cp.etcd_port)
        memory = processes.memory_mb()
        final, _ = await list_all(api, "/api/v1/pods")
        await _bindings_read(collector, {str(p["metadata"]["uid"]) for p in final if (p.get("spec") or {}).get("nodeName")})
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await api.close()
        for c in (collector, terminations, reports):
            await c.stop()
    cpu = {name: round(cpu_after[name] - cpu_before.get(name, 0.0), 2) for name in cpu_after}
    out = result(s, nodes, arrivals, created, watch, collector, terminations, final, t0, probe_key,
                 probe.requests)
    out["startup_s"] = round(startup_s, 2)
    apiserver = kf.counters(metrics_before[0], "apiserver_request_total"), \
        kf.counters(metrics_after[0], "apiserver_request_total")
    rates = kf.request_rates(*apiserver, window_s)
    out["apiserver_requests_per_s"] = rates
    out["apiserver_writes_per_s"] = round(sum(v for k, v in rates.items()
                                              if k.split(" ")[0] in ("POST", "PUT", "PATCH", "DELETE", "APPLY")), 1)
    out["apiserver_request_mean_ms"] = dict(list(kf.request_means_ms(
        (kf.counters(metrics_before[0], "apiserver_request_duration_seconds_sum"),
         kf.counters(metrics_after[0], "apiserver_request_duration_seconds_sum")),
        (kf.counters(metrics_before[0], "apiserver_request_duration_seconds_count"),
         kf.counters(metrics_after[0], "apiserver_request_duration_seconds_count"))).items())[:12])
    out["etcd"] = {"db_mb": round(_one(metrics_after[1], "etcd_mvcc_db_total_size_in_bytes") / 2**20, 1),
                   "keys": int(_one(metrics_after[1], "etcd_debugging_mvcc_keys_total"))}
    out["cpu_s"] = cpu
    out["limit"] = kf.limiting_component(cpu, window_s, os.cpu_count() or 1, machine_after - machine_before)
    out["memory_peak_mb"] = memory
    out["harness_cpu_s"] = cpu.get("harness", 0.0)
    out["scheduler_cpu_s"] = round(sum(v for k, v in cpu.items() if k in ("state", "scheduler", "worker")), 2)
    out["settings"] = {"broker": opts.bootstrap or opts.broker, "concurrency": opts.concurrency,
                       "bridge_qps": opts.bridge_qps, "bridge_burst": opts.bridge_burst,
                       "bridge_concurrency": opts.bridge_concurrency, "cores": os.cpu_count()}
    return out


async def _wait_decided(watch: PodWatch, collector: Collector, keys: set[str], creator: asyncio.Task[None],
                        opts: KwokOptions, alive: Callable[[], None]) -> None:
    """Until every pod of `keys` is bound (the watch saw its node) or finally unschedulable
    (final feedback), or neither a creation nor a decision happened for the stall time."""
    final: set[str] = set()
    read = 0
    decided = 0

    def progress() -> int:
        nonlocal read, decided
        records = collector.records
        for _, _, r in records[read:]:
            if isinstance(r, SchedulingFeedback) and r.final:
                final.add(f"{r.namespace}/{r.name}")
        read = len(records)
        decided = watch.bound_targets + sum(1 for k in final if k in keys and k not in watch.bound_at)
        if opts.on_progress is not None:
            opts.on_progress(watch.bound_targets, len(keys))
        return decided + len(watch.first_seen)

    await until_decided(lambda: decided == len(keys), progress, creator, opts.stall_timeout_s, alive, watch.changed)


async def until_decided(done: Callable[[], bool], progress: Callable[[], int], creator: asyncio.Task[None],
                        stall_s: float, alive: Callable[[], None], changed: asyncio.Event) -> None:
    """Wait, woken by `changed` (or every 0.2 s), until the creations are done and `done()`
    holds (read after each `progress()`), or `progress()` has not moved for `stall_s`; a failed
    creator or a dead process (`alive`) raises."""
    last, seen = time.monotonic(), -1
    while True:
        moved = progress()
        if creator.done() and done():
            return
        if moved != seen:
            seen, last = moved, time.monotonic()
        elif time.monotonic() - last > stall_s:
            return
        if creator.done() and creator.exception() is not None:
            creator.result()
        alive()
        changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(changed.wait(), 0.2)


async def _bindings_read(collector: Collector, uids: set[str], timeout_s: float = 30.0) -> None:
    """Until the collector read a Binding of every pod the API server lists bound (they were on
    the topic before the bridge bound them; the collector may still be reading), or timeout."""
    deadline = time.monotonic() + timeout_s
    while not uids <= {b.uid for _, b in collector.of(Binding)} and time.monotonic() < deadline:
        await asyncio.sleep(0.5)


def result(s: sc.Scenario, nodes: list[Node], arrivals: list[tuple[float, Record]], created: Created,
           watch: PodWatch, collector: Collector, terminations: Collector, final: list[dict[str, Any]], t0: float,
           probe_key: str, probe_requests: ResourceList) -> dict[str, Any]:
    """The figures and the verdict of a run (see the module docstring) from what was read."""
    pods = {f"{r.namespace}/{r.name}": r for _, r in arrivals if isinstance(r, Pod)}
    keys = set(pods)
    listed = {f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}": p
              for p in final}
    uid_of = {k: str((p.get("metadata") or {}).get("uid", "")) for k, p in listed.items()}
    key_of = {uid: k for k, uid in uid_of.items()}
    node_of = {k: str((p.get("spec") or {}).get("nodeName") or "") for k, p in listed.items()}
    phase_of = {k: str((p.get("status") or {}).get("phase") or "") for k, p in listed.items()}
    # The topics: Bindings (pods only; a reservation's places no pod), final feedback, terminations.
    counted = keys | {probe_key}
    bindings = [(ts, b) for ts, b in collector.of(Binding) if key_of.get(b.uid) in counted]
    feedback = [f for _, f in collector.of(SchedulingFeedback) if f"{f.namespace}/{f.name}" in keys]
    final_feedback = {f"{f.namespace}/{f.name}": ts for ts, f in collector.of(SchedulingFeedback) if f.final}
    ended = [Placement(ts, t.uid, t.node) for ts, t in terminations.of(PodTerminated)]
    capacity = {n.name: devices.node_gpu_totals(n.allocatable, n.gpus, n.rdma) for n in nodes}
    requests = {k: devices.with_gpu_totals(p.requests) for k, p in pods.items()}
    requests[probe_key] = dict(probe_requests)
    by_uid = {uid_of[k]: r for k, r in requests.items() if uid_of.get(k)}
    checked = check(allocatable=capacity, requests=by_uid,
                    bindings=[Placement(ts, b.uid, b.node) for ts, b in bindings],
                    terminations=ended, unschedulable={uid_of[k] for k in final_feedback if k in uid_of},
                    counted={uid_of[k] for k in keys if k in uid_of})
    gpu_capacity = {n.name: {**{f"gpu/{g.minor}/core": g.core for g in n.gpus},
                             **{f"gpu/{g.minor}/ratio": g.memory_ratio for g in n.gpus},
                             **{f"rdma/{nic.minor}/vfs": nic.vfs for nic in n.rdma}} for n in nodes}
    devices_over = devices_overcommitted(gpu_capacity, [DevicePlacement(ts, b.uid, b.node, device_amounts(
        b.annotations.get(devices.DEVICE_ALLOCATED, ""))) for ts, b in bindings], ended)
    # The API server's word: each pod bound where its Binding says, and nothing over a node.
    bound_to: dict[str, set[str]] = {}
    for _, b in bindings:
        bound_to.setdefault(key_of[b.uid], set()).add(b.node)
    disagreeing = {k: f"API server: {node_of.get(k) or 'unbound'}, Bindings: {sorted(bound_to.get(k, ()))}"
                   for k in counted if (node_of.get(k) or bound_to.get(k)) and {node_of.get(k)} != bound_to.get(k)}
    on_node = {k: node_of[k] for k in counted if node_of.get(k)}
    finished = [k for k in on_node if phase_of.get(k) in FINISHED]
    final_over = kf.final_overcommit(capacity, requests, on_node, finished)
    bound = {k for k in keys if node_of.get(k)}
    # Timing: from the first pod created to the last decision.
    starts = [sent for k, (sent, _, _) in created.done.items() if k in keys]
    first = min(starts) if starts else t0
    decisions = [watch.bound_at[k] for k in bound if k in watch.bound_at] + \
        [ts for k, ts in final_feedback.items() if k in keys]
    wall = max(decisions) - first if decisions else 0.0
    series = kf.per_second([watch.bound_at[k] for k in bound if k in watch.bound_at], first)
    gang_of = {k: p.annotations.get(GANG_NAME_ANNOTATION, "") for k, p in pods.items()}
    gang_last: dict[str, float] = {}
    for k, g in gang_of.items():
        if g and k in watch.first_seen:
            gang_last[g] = max(gang_last.get(g, 0.0), watch.first_seen[k])
    singles = [k for k in keys if not gang_of[k]]
    queue = kf.watch_latencies_ms(watch.first_seen, watch.bound_at, singles)
    apiserver = kf.apiserver_latencies_ms(listed[k] for k in singles if k in listed)
    gang = [(watch.bound_at[k] - gang_last[gang_of[k]]) * 1000 for k in keys
            if gang_of[k] and k in watch.bound_at and gang_of[k] in gang_last]
    start = kf.watch_latencies_ms(watch.first_seen, watch.running_at, singles)
    create = [(answered - sent) * 1000 for k, (sent, answered, _) in created.done.items() if k in keys]
    # Where the queueing time went: the API server and the bridge up to the Binding on the topic
    # (its broker timestamp), then the Binding carried out and seen by the watch.
    first_binding: dict[str, float] = {}
    for ts, b in bindings:
        k = key_of[b.uid]
        first_binding[k] = min(ts, first_binding.get(k, ts))
    to_binding = [(first_binding[k] - watch.first_seen[k]) * 1000 for k in singles
                  if k in first_binding and k in watch.first_seen]
    binding_to_bound = [(watch.bound_at[k] - first_binding[k]) * 1000 for k in singles
                        if k in first_binding and k in watch.bound_at]
    figures = allocation(capacity, requests, {k: (watch.bound_at[k], node_of[k]) for k in bound if k in watch.bound_at},
                         [(t, k) for k, t in watch.finished_at.items() if k in bound], first)
    span = (max(answered for _, answered, _ in created.done.values()) - first) if created.done else 0.0
    offsets = {f"{r.namespace}/{r.name}": at for at, r in arrivals if isinstance(r, Pod)}
    burst_tp = burst_throughput(offsets, {k: sent for k, (sent, _, _) in created.done.items()},
                                {k: watch.bound_at[k] for k in bound if k in watch.bound_at})
    phases = {phase: sum(1 for k in keys if phase_of.get(k) == phase) for phase in ("Pending", "Running", *FINISHED)}
    return {
        "scenario": s.name,
        "mode": "kwok",
        "wall_s": round(wall, 2),
        "pods_total": len(keys),
        "pods_created": sum(1 for k in keys if k in created.done),
        "pods_bound": len(bound),
        "pods_unschedulable": len({k for k in final_feedback if k in keys} - bound),
        "pods_double_bound": checked.pods_double_bound,
        "nodes_overcommitted": checked.nodes_overcommitted,
        "devices_overcommitted": len(devices_over),
        "nodes_overcommitted_apiserver": len(final_over),
        "bindings_disagreeing": len(disagreeing),
        "overcommitted": dict(list({**checked.overcommitted, **final_over, **devices_over}.items())[:10]),
        "disagreeing": dict(sorted(disagreeing.items())[:10]),
        "pods_by_phase": phases,
        "pods_terminated": sum(1 for p in ended if key_of.get(p.uid) in keys),
        "pods_create_failed": len(created.failed),
        "create_failures": dict(list(created.failed.items())[:5]),
        "reservations_created": sum(1 for k in created.done if "/" not in k),
        "pods_unbound_by_template": dict(sorted(Counter(pods[k].labels.get("template", "") for k in keys - bound).items())),
        "throughput_pods_per_s": round(len(bound) / wall, 1) if wall > 0 else 0.0,
        "throughput_samples_pods_per_s": percentiles([float(b) for b in series], (50, 90, 95, 99)),
        "throughput_series": series,
        **({"burst_throughput_pods_per_s": burst_tp} if burst_tp is not None else {}),
        "create_rate_objects_per_s": round(len(created.done) / span, 1) if span > 0 else 0.0,
        "create_lag_s": round(created.lag_s, 2),
        "create_retries": created.retries,
        "create_latency_ms": percentiles(create),
        "queue_latency_ms": percentiles(queue),
        "queue_latency_apiserver_ms": percentiles(apiserver),
        "queue_latency_split_ms": {"to_binding": percentiles(to_binding), "binding_to_bound": percentiles(binding_to_bound)},
        "apiserver_timestamp_resolution_s": 1,
        "start_latency_ms": percentiles(start),
        "gang_latency_ms": percentiles(gang),
        "latency_cdf_ms": {"queue": latency_cdf(queue), "queue (API server)": latency_cdf(apiserver),
                           "start": latency_cdf(start), "gang": latency_cdf(gang)},
        **scheduler_figures(collector, feedback, first),
        **figures,
        "watch": {"events": watch.events, "relists": watch.relists},
        "thresholds": {"throughput_drop_pct": s.throughput_drop_pct, "queue_p99_rise_pct": s.queue_p99_rise_pct},
    }


def succeeded(r: dict[str, Any]) -> bool:
    """Consistent: nobody bound twice, nothing over a node (on the topics and in the API
    server), the API server agreeing with the Bindings."""
    return all(r[k] == 0 for k in ("pods_double_bound", "nodes_overcommitted", "devices_overcommitted",
                                   "nodes_overcommitted_apiserver", "bindings_disagreeing"))

