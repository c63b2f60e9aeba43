"""In-process benchmarks of the scheduling core (no broker): `koordstream bench basic`.

Modeled on kube-scheduler's scheduler_perf workload SchedulingBasic/5000Nodes_10000Pods:
`nodes` nodes, `init_pods` pods placed first (not measured), then `pods` measured pods. Unlike
SchedulingBasic, every measured pod is different by default (cpu drawn from 100m-8, memory from
128Mi-16Gi, with a fixed seed), so that every pod takes the full path and every node is
evaluated; `identical=True` uses one template for all pods (as SchedulingBasic does), which
goes through the equivalence-class path, and also measures the same pods with batching off.

The measured phase is the core the faust agents run: pods enter the queue (`add`) and are
placed in micro-batches (`schedule`), producing Claims; each claim stays assumed in the
cluster state (as it would until its owner reports), so later pods see it. The init pods are
committed as an owner would, before the measured phase.
"""

from __future__ import annotations

import gc
import random
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.scheduler.framework.profiles import default_config
from agents.scheduler.framework.profiles import load as load_profiles
from agents.state.resources import ResourceSpace
from schemas.records import BoundPod, Claim, Node, Pod, ResourceList
from streams.process import tune_gc
from streams.settings import WorkerSettings

GI, MI = 2**30, 2**20
NODE_CPU, NODE_MEMORY, NODE_PODS = 64_000, 256 * GI, 110
TEMPLATE = ResourceList({"cpu": 100, "memory": 500 * MI})  # scheduler_perf's default pod


@dataclass(frozen=True)
class BasicWorkload:
    nodes: int = 5000
    init_pods: int = 1000
    pods: int = 10_000
    identical: bool = False
    seed: int = 42
    batch: int = 1000
    gc_threshold: int = WorkerSettings().gc_threshold  # as the worker runs (0: Python's default)
    profiles: str = ""  # scheduler profiles YAML text ("": the default profile)


def make_nodes(count: int) -> list[Node]:
    alloc = ResourceList({"cpu": NODE_CPU, "memory": NODE_MEMORY, "pods": NODE_PODS})
    return [Node(name=f"node-{i:05d}", capacity=alloc, allocatable=alloc,
                 labels={"kubernetes.io/hostname": f"node-{i:05d}", "zone": f"zone-{i % 3}"}) for i in range(count)]


def make_pods(count: int, prefix: str, rng: random.Random | None) -> list[Pod]:
    """Pods with requests drawn from the mix (or the one template when rng is None)."""
    out = []
    for i in range(count):
        if rng is None:
            requests = TEMPLATE
        else:
            requests = ResourceList({"cpu": rng.randint(100, 8000), "memory": rng.randint(128 * MI, 16 * GI)})
        out.append(Pod(uid=f"{prefix}-{i:06d}", name=f"{prefix}-{i:06d}", namespace="bench", requests=requests))
    return out


def _commit(core: SchedulerCore, outputs: list[Any]) -> int:
    """Stand in for the owners: every claim is held and committed."""
    placed = 0
    for out in outputs:
        r = out.record
        if isinstance(r, Claim):
            core.state.forget(r.hold_id)
            core.state.add_bound(BoundPod(uid=r.uid, namespace=r.namespace, name=r.name, requests=r.requests), r.node)
            core.bound.add(r.uid)
            core.pods.pop(r.uid, None)
            placed += 1
    return placed


def _core(nodes: list[Node], batching: bool, profiles: str = "") -> SchedulerCore:
    space = ResourceSpace()
    state = ClusterState.from_records(space, nodes)
    # Every node scored unless the profiles say otherwise: the benchmark compares batched and
    # one-by-one placement, which agree at 100% (a search share rotates per pod).
    config = load_profiles(profiles) if profiles else default_config(percentage_of_nodes_to_score=100)
    return SchedulerCore(space, state, lambda: 0.0, batching=batching, config=config)


def _measure(core: SchedulerCore, pods: list[Pod], batch: int,
             timer: Callable[[], int] = time.perf_counter_ns) -> tuple[float, list[int], int]:
    """Wall seconds, per-pod attempt latencies (ns) and pods placed."""
    for fw in core.frameworks.values():
        fw.attempts_ns = []
        fw.timings.clear()
    start = timer()
    for pod in pods:
        core.add(pod)
    produced: list[list[Any]] = []
    while core.pending:
        outputs = core.schedule(batch)
        if not outputs:
            break
        produced.append(outputs)
    wall = (timer() - start) / 1e9
    placed = sum(1 for outputs in produced for o in outputs if isinstance(o.record, Claim))
    latencies = [ns for fw in core.frameworks.values() for ns in (fw.attempts_ns or [])]
    return wall, latencies, placed


def run_basic(w: BasicWorkload) -> dict[str, Any]:
    tune_gc(w.gc_threshold)
    rng = random.Random(w.seed)
    nodes = make_nodes(w.nodes)
    core = _core(nodes, batching=True, profiles=w.profiles)
    init = make_pods(w.init_pods, "init", None if w.identical else rng)
    _commit(core, [o for pod in init for o in core.add(pod)])
    while core.pending:
        if not _commit(core, core.schedule(w.batch)):
            break
    measured = make_pods(w.pods, "pod", None if w.identical else rng)
    wall, latencies, placed = _measure(core, measured, w.batch)
    timings = core.timings()
    per_plugin: dict[str, int] = {}
    for (plugin, _point), ns in timings.items():
        per_plugin[plugin] = per_plugin.get(plugin, 0) + ns
    wall_ns = wall * 1e9
    share = {name: round(ns / wall_ns, 4) for name, ns in sorted(per_plugin.items(), key=lambda kv: -kv[1])}
    share["(framework, queue, records)"] = round(max(0.0, 1 - sum(share.values())), 4)
    lat_ms = np.asarray(latencies, dtype=np.float64) / 1e6
    result: dict[str, Any] = {
        "workload": "SchedulingBasic-like" + (" (identical pods)" if w.identical else " (every pod different)"),
        "nodes": w.nodes,
        "init_pods": w.init_pods,
        "pods": w.pods,
        "pods_placed": placed,
        "batch": w.batch,
        "wall_s": round(wall, 4),
        "throughput_pods_per_s": round(w.pods / wall, 1),
        "attempt_latency_ms": {q: round(float(np.percentile(lat_ms, p)), 4) if lat_ms.size else None
                               for q, p in (("p50", 50), ("p90", 90), ("p99", 99))},
        "nodes_evaluated_per_pod": float(w.nodes),
        "plugin_share": share,
        "peak_memory_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "gc_threshold": gc.get_threshold()[0],
        "profile": "default" if not w.profiles else "from --profiles",
    }
    if w.identical:
        one = _core(nodes, batching=False, profiles=w.profiles)
        _commit(one, [o for pod in init for o in one.add(pod)])
        while one.pending:
            if not _commit(one, one.schedule(w.batch)):
                break
        one_wall, _, one_placed = _measure(one, make_pods(w.pods, "pod", None), w.batch)
        result["one_by_one_pods_per_s"] = round(w.pods / one_wall, 1)
        result["one_by_one_pods_placed"] = one_placed
        result["speedup"] = round(one_wall / wall, 2)
    return result


def run_basic_repeated(w: BasicWorkload, runs: int) -> dict[str, Any]:
    """Run `runs` times; report the median run (by throughput) and every run's figures."""
    results = [run_basic(w) for _ in range(max(1, runs))]
    ordered = sorted(results, key=lambda r: r["throughput_pods_per_s"])
    median = dict(ordered[len(ordered) // 2])
    median["runs"] = len(results)
    median["throughput_runs_pods_per_s"] = [r["throughput_pods_per_s"] for r in results]
    if w.identical:
        median["one_by_one_runs_pods_per_s"] = [r["one_by_one_pods_per_s"] for r in results]
        median["speedup_runs"] = [r["speedup"] for r in results]
    return median
