"""Workload scenarios in YAML: node pools, a pod mix, an arrival process, a lifecycle and the
regression thresholds of a perf run (`perf/README.md` tells how to add one).

A scenario file:

    name: mixed-100k
    seed: 1
    nodes:                                  # pools
      - {pool: cpu, count: 4000, allocatable: {cpu: "64", memory: 256Gi, pods: 110},
         labels: {pool: cpu}, taints: [{key: k, value: v, effect: NoSchedule}]}
      - {pool: gpu, count: 1000, allocatable: {cpu: "96", memory: 512Gi},
         gpus: {count: 8, model: A100, memory: 80Gi}, numa: {cells: 2, threadsPerCore: 2}}
    pods:
      total: 100000
      mix:                                  # templates, drawn by share
        - {name: web, share: 50, qos: LS, priorityClass: koord-prod, requests: {cpu: 500m, memory: 1Gi},
           duration: 30s}                   # a Job-owned pod completes after `duration`
        - {name: train, share: 5, qos: LS, requests: {cpu: "4", memory: 16Gi}, gpu: {whole: 2},
           gang: {size: 4, waitingTime: 30s}}
        - {name: infer, share: 10, qos: LS, requests: {cpu: "2", memory: 8Gi}, gpu: {share: 50},
           reserved: 0.2}                   # a fifth of them get a Reservation first
        - {name: sandbox, share: 0, qos: BE, requests: {cpu: 100m, memory: 128Mi}, identical: true,
           runtimeClassName: gvisor}          # carried on the pods (Kubernetes' RuntimeClass name)
      arrival: {rate: 2000, bursts: [{at: 10s, template: sandbox, count: 5000}]}
    lifecycle: {stages: [infra/kwok/pod-ready.yaml, infra/kwok/pod-complete.yaml], speedup: 1}
    thresholds: {throughputDropPct: 10, queueP99RisePct: 25}
    quick: {nodes: 0.02, pods: 2000}        # --quick: pools scaled, pods capped

Everything is checked before a run: unknown fields, bad quantities and impossible pools or
templates (a pool without CPU or memory, NUMA cells that do not divide its CPUs, a GPU share
outside 1..99, a template that fits no pool, a gang larger than the pods) are refused with the
file, the field and the value (`ScenarioError`). Generation is deterministic for a seed:
`nodes(s)` gives Node records, `arrivals(s)` the records to publish with their time offsets
(Pods, and each Reservation a second ahead of the pod it is for).
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agents.scheduler.fragmentation import MILLI
from agents.state import devices
from perf import trace
from schemas.errors import SchemaError
from schemas.quantity import parse_duration, to_canonical
from schemas.records import (
    DEFAULT_SCHEDULER,
    GANG_MIN_AVAILABLE_ANNOTATION,
    GANG_NAME_ANNOTATION,
    GANG_WAITING_TIME_ANNOTATION,
    QOS_CLASSES,
    QOS_LABEL,
    GpuDevice,
    Node,
    NumaCell,
    OwnerReference,
    Pod,
    Record,
    Reservation,
    ReservationOwner,
    ResourceList,
    Taint,
)

ROOT = Path(__file__).resolve().parents[1]
COMPLETE_DELAY_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"
GPU_MODEL_LABEL = "node.koordinator.sh/gpu-model"
RESERVATION_LEAD_S = 1.0  # a reserved pod's Reservation is published this long before it


class ScenarioError(ValueError):
    def __init__(self, source: str, field: str, value: Any, reason: str) -> None:
        shown = repr(value)
        super().__init__(f"{source}: {field}={shown[:200]}: {reason}")
        self.source, self.field, self.value = source, field, value


@dataclass(frozen=True)
class Pool:
    name: str
    count: int
    allocatable: ResourceList
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    gpus: int = 0
    gpu_model: str = ""
    gpu_memory: int = 0
    numa_cells: int = 0
    threads_per_core: int = 1


@dataclass(frozen=True)
class Template:
    name: str
    share: float
    requests: ResourceList
    qos: str = ""
    priority_class: str = ""
    duration_s: float = 0.0  # 0: runs until the end
    gpu_whole: int = 0
    gpu_share: int = 0
    gang_size: int = 0
    gang_waiting: str = ""
    reserved: float = 0.0
    identical: bool = False
    runtime_class: str = ""  # the pods' runtimeClassName (gVisor, Kata, ...): carried, not scheduled on


@dataclass(frozen=True)
class Burst:
    at_s: float
    template: str
    count: int


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str
    seed: int
    pools: tuple[Pool, ...]
    templates: tuple[Template, ...]
    total: int
    rate: float
    bursts: tuple[Burst, ...] = ()
    stages: tuple[str, ...] = ()
    speedup: float = 1.0
    throughput_drop_pct: float = 10.0
    queue_p99_rise_pct: float = 25.0
    quick_nodes: float = 0.02
    quick_pods: int = 2000
    profiles: str = ""  # scheduler profiles (KubeSchedulerConfiguration-like YAML) for the workers
    trace_load: float = 0.0  # above 0: nodes and pods come from a trace (`with_trace`)
    trace_scheduler: str = ""  # the trace pods' schedulerName (empty: the default)
    trace_nodes: tuple[Node, ...] = ()
    trace_pods: tuple[Pod, ...] = ()
    is_quick: bool = False

    @property
    def namespace(self) -> str:
        """The namespace of its pods: its name as a valid Kubernetes namespace (lower case,
        `-` for anything else, as the API server requires of the pods a Kwok run creates)."""
        text = re.sub(r"[^a-z0-9-]+", "-", self.name.lower())
        return re.sub(r"-+", "-", text).strip("-")[:63] or "perf"

    def scaled(self, pods: int) -> Scenario:
        """The scenario at `pods` pods (bursts included), its pools scaled by the same factor
        (at least one node each), so that nodes and pods keep their ratio; pods above its
        size are refused."""
        size = self.total + sum(b.count for b in self.bursts)
        if not 0 < pods <= size:
            raise ScenarioError(self.source, "pods", pods, f"scales the scenario down: from 1 to its {size} pods")
        f = pods / size
        bursts = tuple(dataclasses.replace(b, count=max(1, round(b.count * f))) for b in self.bursts)
        return dataclasses.replace(
            self, name=f"{self.name} ({pods} pods)",
            pools=tuple(dataclasses.replace(p, count=max(1, round(p.count * f))) for p in self.pools),
            total=max(0, pods - sum(b.count for b in bursts)), bursts=bursts,
        )

    def at_rate(self, rate: float) -> Scenario:
        """The scenario with its pods arriving at `rate` a second (its bursts unchanged)."""
        if rate <= 0:
            raise ScenarioError(self.source, "rate", rate, "must be above 0 pods a second")
        return dataclasses.replace(self, name=f"{self.name} at {rate:g} pods/s", rate=float(rate))

    def quick(self) -> Scenario:
        """The shrunk variant the tests run: pools scaled, pods and bursts capped."""
        scale = min(1.0, self.quick_pods / max(self.total + sum(b.count for b in self.bursts), 1))
        return dataclasses.replace(
            self, name=f"{self.name} (quick)", is_quick=True,
            pools=tuple(dataclasses.replace(p, count=max(1, round(p.count * self.quick_nodes))) for p in self.pools),
            total=min(self.total, self.quick_pods),
            bursts=tuple(dataclasses.replace(b, count=max(1, round(b.count * scale))) for b in self.bursts),
        )


# --- reading -----------------------------------------------------------------------------------

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_FIELDS = {
    "": {"name", "seed", "nodes", "pods", "lifecycle", "thresholds", "quick", "description", "trace", "profiles"},
    "trace": {"load", "schedulerName"},
    "pool": {"pool", "count", "allocatable", "labels", "taints", "gpus", "numa"},
    "gpus": {"count", "model", "memory"},
    "numa": {"cells", "threadsPerCore"},
    "pods": {"total", "mix", "arrival"},
    "template": {"name", "share", "qos", "priorityClass", "requests", "duration", "gpu", "gang", "reserved",
                 "identical", "runtimeClassName"},
    "gpu": {"whole", "share"},
    "gang": {"size", "waitingTime"},
    "arrival": {"rate", "bursts"},
    "burst": {"at", "template", "count"},
    "lifecycle": {"stages", "speedup"},
    "thresholds": {"throughputDropPct", "queueP99RisePct"},
    "quick": {"nodes", "pods"},
}


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, value: Any, reason: str) -> ScenarioError:
        return ScenarioError(self.source, field, value, reason)

    def mapping(self, raw: Any, where: str, kind: str) -> Mapping[str, Any]:
        if not isinstance(raw, Mapping):
            raise self.fail(where or "<document>", raw, "must be a mapping")
        for key in raw:
            if key not in _FIELDS[kind]:
                raise self.fail(f"{where}.{key}" if where else str(key), raw[key], "unknown field")
        return raw

    def number(self, raw: Any, where: str, *, low: float = 0, integer: bool = False, high: float | None = None) -> Any:
        ok = isinstance(raw, int) if integer else isinstance(raw, (int, float))
        if isinstance(raw, bool) or not ok or raw < low or (high is not None and raw > high):
            kind = "an integer" if integer else "a number"
            bounds = f" from {low} to {high}" if high is not None else f" of at least {low}"
            raise self.fail(where, raw, f"must be {kind}{bounds}")
        return raw

    def duration(self, raw: Any, where: str) -> float:
        try:
            return parse_duration(str(raw))
        except ValueError:
            raise self.fail(where, raw, "must be a duration such as 30s or 1m30s") from None

    def resources(self, raw: Any, where: str) -> ResourceList:
        if not isinstance(raw, Mapping):
            raise self.fail(where, raw, "must be a map of resource name to quantity")
        try:
            return ResourceList({str(k): to_canonical(str(k), v, f"{where}.{k}") for k, v in raw.items()})
        except SchemaError as exc:
            raise self.fail(exc.field, exc.value, exc.reason) from None


def load(path: str | Path) -> Scenario:
    """Read and check a scenario file (see the module docstring)."""
    source = str(path)
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(source, "<document>", "", f"cannot read: {exc}") from None
    return parse(raw, source)


def parse(raw: Any, source: str) -> Scenario:
    r = _Reader(source)
    doc = r.mapping(raw, "", "")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise r.fail("name", name, "is required")
    trace = r.mapping(doc.get("trace") or {}, "trace", "trace")
    trace_load = float(r.number(trace.get("load", 1.0), "trace.load", low=0.01)) if "trace" in doc else 0.0
    profiles = str(doc.get("profiles") or "")
    if profiles and not (ROOT / profiles).is_file():
        raise r.fail("profiles", profiles, f"no such file under {ROOT}")
    pools = tuple(_pool(r, p, f"nodes[{i}]") for i, p in enumerate(_list(r, doc.get("nodes"), "nodes")))
    if not pools and not trace_load:
        raise r.fail("nodes", doc.get("nodes"), "needs at least one pool (or a trace)")
    pods = r.mapping(doc.get("pods") or {}, "pods", "pods")
    templates = tuple(_template(r, t, f"pods.mix[{i}]") for i, t in enumerate(_list(r, pods.get("mix"), "pods.mix")))
    if not templates and not trace_load:
        raise r.fail("pods.mix", pods.get("mix"), "needs at least one template (or a trace)")
    total = r.number(pods.get("total", 0), "pods.total", integer=True)
    if total and not sum(t.share for t in templates):
        raise r.fail("pods.mix", [t.name for t in templates], "some template needs a share above 0")
    arrival = r.mapping(pods.get("arrival") or {}, "pods.arrival", "arrival")
    rate = r.number(arrival.get("rate", 1000), "pods.arrival.rate", low=1)
    names = {t.name for t in templates}
    bursts = []
    for i, b in enumerate(_list(r, arrival.get("bursts"), "pods.arrival.bursts")):
        b = r.mapping(b, f"pods.arrival.bursts[{i}]", "burst")
        if b.get("template") not in names:
            raise r.fail(f"pods.arrival.bursts[{i}].template", b.get("template"), f"no such template (templates: {sorted(names)})")
        bursts.append(Burst(r.duration(b.get("at", "0s"), f"pods.arrival.bursts[{i}].at"), str(b["template"]),
                            r.number(b.get("count"), f"pods.arrival.bursts[{i}].count", low=1, integer=True)))
    for t in templates:
        _check_fits(r, t, pools)
        if t.gang_size and total and t.gang_size > total:
            raise r.fail(f"pods.mix[{t.name}].gang.size", t.gang_size, f"more than the {total} pods of the run")
    lifecycle = r.mapping(doc.get("lifecycle") or {}, "lifecycle", "lifecycle")
    stages = tuple(str(s) for s in _list(r, lifecycle.get("stages"), "lifecycle.stages"))
    thresholds = r.mapping(doc.get("thresholds") or {}, "thresholds", "thresholds")
    quick = r.mapping(doc.get("quick") or {}, "quick", "quick")
    return Scenario(
        name=name, source=source, seed=r.number(doc.get("seed", 0), "seed", integer=True),
        pools=pools, templates=templates, total=total, rate=float(rate), bursts=tuple(bursts), stages=stages,
        speedup=float(r.number(lifecycle.get("speedup", 1), "lifecycle.speedup", low=0.001)),
        throughput_drop_pct=float(r.number(thresholds.get("throughputDropPct", 10), "thresholds.throughputDropPct")),
        queue_p99_rise_pct=float(r.number(thresholds.get("queueP99RisePct", 25), "thresholds.queueP99RisePct")),
        quick_nodes=float(r.number(quick.get("nodes", 0.02), "quick.nodes", low=0.0001, high=1)),
        quick_pods=r.number(quick.get("pods", 2000), "quick.pods", low=1, integer=True),
        profiles=profiles, trace_load=trace_load, trace_scheduler=str(trace.get("schedulerName", "")),
    )


def _list(r: _Reader, raw: Any, where: str) -> Sequence[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise r.fail(where, raw, "must be a list")
    return raw


def _pool(r: _Reader, raw: Any, where: str) -> Pool:
    p = r.mapping(raw, where, "pool")
    name = str(p.get("pool") or "")
    if not name:
        raise r.fail(f"{where}.pool", p.get("pool"), "a pool needs a name")
    count = r.number(p.get("count"), f"{where}.count", low=1, integer=True)
    allocatable = r.resources(p.get("allocatable"), f"{where}.allocatable")
    for needed in ("cpu", "memory"):
        if allocatable.get(needed, 0) <= 0:
            raise r.fail(f"{where}.allocatable.{needed}", allocatable.get(needed), "a pool needs some")
    allocatable.setdefault("pods", 110)
    gpus = r.mapping(p.get("gpus") or {}, f"{where}.gpus", "gpus")
    numa = r.mapping(p.get("numa") or {}, f"{where}.numa", "numa")
    cells = r.number(numa.get("cells", 0), f"{where}.numa.cells", integer=True)
    threads = r.number(numa.get("threadsPerCore", 1), f"{where}.numa.threadsPerCore", low=1, integer=True)
    cores = allocatable["cpu"] // 1000
    if cells and (allocatable["cpu"] % 1000 or cores % (cells * threads)):
        raise r.fail(f"{where}.numa.cells", cells, f"{cells} cells of {threads}-thread cores cannot split "
                                                   f"{allocatable['cpu']}m of CPU evenly")
    taints = []
    for j, t in enumerate(_list(r, p.get("taints"), f"{where}.taints")):
        if not isinstance(t, Mapping) or t.get("effect") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise r.fail(f"{where}.taints[{j}]", t, "needs key, value and effect NoSchedule, PreferNoSchedule or NoExecute")
        taints.append(Taint(str(t.get("key", "")), str(t.get("value", "")), str(t["effect"])))
    gpu_memory = r.resources({"memory": gpus["memory"]}, f"{where}.gpus")["memory"] if "memory" in gpus else 0
    return Pool(name=name, count=count, allocatable=allocatable,
                labels={str(k): str(v) for k, v in (p.get("labels") or {}).items()}, taints=tuple(taints),
                gpus=r.number(gpus.get("count", 0), f"{where}.gpus.count", integer=True),
                gpu_model=str(gpus.get("model", "")), gpu_memory=gpu_memory, numa_cells=cells, threads_per_core=threads)


def _template(r: _Reader, raw: Any, where: str) -> Template:
    t = r.mapping(raw, where, "template")
    name = str(t.get("name") or "")
    if not name:
        raise r.fail(f"{where}.name", t.get("name"), "a template needs a name")
    qos = str(t.get("qos", ""))
    if qos and qos not in QOS_CLASSES:
        raise r.fail(f"{where}.qos", qos, f"must be one of {list(QOS_CLASSES)}")
    runtime = str(t.get("runtimeClassName", ""))
    if runtime and not _DNS_SUBDOMAIN.fullmatch(runtime):
        raise r.fail(f"{where}.runtimeClassName", runtime, "a RuntimeClass name: lower-case letters, digits, '-' and '.'")
    gpu = r.mapping(t.get("gpu") or {}, f"{where}.gpu", "gpu")
    if "whole" in gpu and "share" in gpu:
        raise r.fail(f"{where}.gpu", dict(gpu), "either whole GPUs or a share of one, not both")
    gang = r.mapping(t.get("gang") or {}, f"{where}.gang", "gang")
    waiting = str(gang.get("waitingTime", ""))
    if waiting:
        r.duration(waiting, f"{where}.gang.waitingTime")
    return Template(
        name=name, share=float(r.number(t.get("share", 1), f"{where}.share")),
        requests=r.resources(t.get("requests") or {}, f"{where}.requests"), qos=qos,
        priority_class=str(t.get("priorityClass", "")),
        duration_s=r.duration(t["duration"], f"{where}.duration") if "duration" in t else 0.0,
        gpu_whole=r.number(gpu.get("whole", 0), f"{where}.gpu.whole", integer=True),
        gpu_share=r.number(gpu.get("share", 0), f"{where}.gpu.share", integer=True, high=99) if "share" in gpu else 0,
        gang_size=r.number(gang.get("size", 0), f"{where}.gang.size", integer=True), gang_waiting=waiting,
        reserved=float(r.number(t.get("reserved", 0), f"{where}.reserved", high=1)),
        identical=bool(t.get("identical", False)),
        runtime_class=runtime,
    )


def _check_fits(r: _Reader, t: Template, pools: Sequence[Pool]) -> None:
    """A template that no pool could ever host makes the scenario impossible."""
    for p in pools:
        gpus_ok = (t.gpu_whole <= p.gpus) if t.gpu_whole else (p.gpus > 0 if t.gpu_share else True)
        if gpus_ok and all(p.allocatable.get(k, 0) >= v for k, v in t.requests.items()):
            return
    raise r.fail(f"pods.mix[{t.name}]", dict(t.requests) | {"gpu": t.gpu_whole or t.gpu_share},
                 f"fits no node pool ({', '.join(p.name for p in pools)})")


# --- generating --------------------------------------------------------------------------------


def nodes(s: Scenario) -> list[Node]:
    if s.trace_nodes:
        return list(s.trace_nodes)
    out = []
    for p in s.pools:
        cpus = p.allocatable["cpu"] // 1000
        per_cell = cpus // p.numa_cells if p.numa_cells else 0
        cells = tuple(NumaCell(c, tuple(range(c * per_cell, (c + 1) * per_cell)),
                               cores=tuple(x // p.threads_per_core for x in range(c * per_cell, (c + 1) * per_cell)))
                      for c in range(p.numa_cells))
        gpus = tuple(GpuDevice(minor=g, model=p.gpu_model, memory=p.gpu_memory) for g in range(p.gpus))
        alloc = ResourceList(p.allocatable)
        if p.gpus:
            alloc[devices.NVIDIA_GPU] = p.gpus
        for i in range(p.count):
            out.append(Node(name=f"{p.name}-{i:05d}", labels={**p.labels, "pool": p.name}, taints=p.taints,
                            capacity=alloc, allocatable=alloc, gpus=gpus, numa=cells))
    return out


def _pod(s: Scenario, t: Template, uid: str, gang: str = "") -> Pod:
    requests = ResourceList(t.requests)
    if t.gpu_whole:
        requests[devices.NVIDIA_GPU] = t.gpu_whole
    elif t.gpu_share:
        requests.update({devices.GPU_CORE: t.gpu_share, devices.GPU_RATIO: t.gpu_share})
    annotations: dict[str, str] = {}
    if t.duration_s:
        annotations[COMPLETE_DELAY_ANNOTATION] = f"{t.duration_s}s"
    if gang:
        annotations.update({GANG_NAME_ANNOTATION: gang, GANG_MIN_AVAILABLE_ANNOTATION: str(t.gang_size)})
        if t.gang_waiting:
            annotations[GANG_WAITING_TIME_ANNOTATION] = t.gang_waiting
    owners = (OwnerReference(kind="Job", name=t.name, uid=f"job-{t.name}", controller=True),) if t.duration_s else ()
    return Pod(uid=uid, name=uid, namespace=s.namespace, labels={"template": t.name,
               **({QOS_LABEL: t.qos} if t.qos else {})}, annotations=annotations, owner_references=owners,
               priority_class_name=t.priority_class, requests=requests, runtime_class_name=t.runtime_class)


def arrivals(s: Scenario) -> list[tuple[float, Record]]:
    """Every record to publish, with its offset in seconds from the start, in time order:
    `total` pods drawn from the mix by share at `rate` (gangs as runs of their members), then
    each burst at its time; a reserved pod's Reservation `RESERVATION_LEAD_S` before it."""
    if s.trace_pods:
        return [(i / s.rate, pod) for i, pod in enumerate(s.trace_pods)]
    rng = random.Random(s.seed)
    weighted = [t for t in s.templates if t.share > 0]
    by_name = {t.name: t for t in s.templates}
    out: list[tuple[float, Record]] = []
    n = 0

    def emit(t: Template, at: float) -> int:
        nonlocal n
        members = max(t.gang_size, 1)
        gang = f"{t.name}-{n:07d}" if t.gang_size else ""
        for _ in range(members):
            uid = f"{t.name}-{n:07d}"
            pod = _pod(s, t, uid, gang)
            if t.reserved and rng.random() < t.reserved:  # a second ahead, as a reservation comes first
                out.append((max(0.0, at - RESERVATION_LEAD_S), Reservation(uid=f"r-{uid}", name=f"r-{uid}", requests=ResourceList(pod.requests),
                                            owners=(ReservationOwner(object_uid=uid),), ttl_s=600.0)))
            out.append((at, pod))
            n += 1
        return members

    placed = 0
    while placed < s.total and weighted:
        t = rng.choices(weighted, weights=[w.share for w in weighted])[0]
        placed += emit(t, placed / s.rate)
    for b in s.bursts:
        for _ in range(b.count):
            emit(by_name[b.template], b.at_s)
    out.sort(key=lambda item: item[0])
    return out


# --- traces ------------------------------------------------------------------------------------


def with_trace(s: Scenario, nodes_csv: str | Path, pods_csv: str | Path) -> Scenario:
    """A trace scenario with its nodes and pods, from the Alibaba GPU trace's files (the node
    list and a pod list, cluster-trace-gpu-v2023). The pods are the trace's workload as the FGD
    paper builds it (`perf.trace.workload`: ordered by name, shuffled with the seed, inflated
    until the GPU requests reach `trace.load` x the GPU capacity), arriving at the scenario's
    rate, never leaving. A share of one GPU asks koordinator.sh/gpu-core and gpu-memory-ratio
    (percent, rounded up), whole GPUs nvidia.com/gpu; a `gpu_spec` becomes a required node
    affinity on the nodes' GPU model label. The quick variant keeps every k-th node (k from
    `quick.nodes`) and caps the pods at `quick.pods`. Bad trace files raise a ValueError naming
    the file, line, column and value."""
    if not s.trace_load:
        raise ScenarioError(s.source, "trace", None, "this scenario does not replay a trace; leave out the CSV files")
    cluster = trace.load_nodes(nodes_csv)
    keep = list(range(len(cluster.model)))
    if s.is_quick:
        keep = keep[::max(1, round(1 / s.quick_nodes))]
    node_records = []
    for i in keep:
        count = int(cluster.gpu_count[i])
        model = cluster.model[i]
        alloc = ResourceList(cpu=int(cluster.cpu_cap[i]), memory=int(cluster.memory[i]) * 2**20, pods=110)
        if count:
            alloc[devices.NVIDIA_GPU] = count
        node_records.append(Node(name=cluster.names[i], labels={GPU_MODEL_LABEL: model} if count else {},
                                 capacity=alloc, allocatable=alloc,
                                 gpus=tuple(GpuDevice(minor=g, model=model) for g in range(count))))
    capacity = sum(int(cluster.gpu_count[i]) for i in keep) * MILLI
    pods = trace.workload(trace.load_pods(pods_csv, sorted(set(cluster.model))), capacity, s.trace_load, s.seed)
    if s.is_quick:
        pods = pods[:s.quick_pods]
    namespace = s.namespace
    return dataclasses.replace(s, trace_nodes=tuple(node_records),
                               trace_pods=tuple(_trace_pod(p, f"{namespace}-{n:06d}", namespace, s.trace_scheduler)
                                                for n, p in enumerate(pods)))


def _trace_pod(p: trace.TracePod, uid: str, namespace: str, scheduler: str) -> Pod:
    requests = ResourceList(cpu=p.cpu, memory=p.memory * 2**20)
    if p.gpus and p.milli < MILLI:
        percent = -(-p.milli // 10)
        requests.update({devices.GPU_CORE: percent, devices.GPU_RATIO: percent})
    elif p.gpus:
        requests[devices.NVIDIA_GPU] = p.gpus
    affinity: dict[str, Any] = {}
    if p.models:
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": GPU_MODEL_LABEL, "operator": "In", "values": sorted(p.models)}]}]}}}
    return Pod(uid=uid, name=uid, namespace=namespace, labels={"template": "trace"}, requests=requests,
               affinity=affinity, scheduler_name=scheduler or DEFAULT_SCHEDULER)
