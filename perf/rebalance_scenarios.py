"""`koordstream perf run rebalance-imbalance | scale-down-binpack`: issue 13's benchmarks through
the real system (broker, state, scheduler and rebalancer workers, the harness of
`perf.rebalance_run` playing the Eviction API and the ReplicaSet controller). Each compares the
planners (or rankers) from the same start: one fresh system per planner, built the same way.

- `rebalance-imbalance`: `nodes` nodes (32 cpu, 128Gi, 110 pods), `workloads` workloads of
  `nodes * per_node / workloads` replicas, half CPU-heavy (1.5 cpu, 2Gi), half memory-heavy
  (250m, 6Gi), placed on the wrong nodes on purpose: the first half of the nodes open while
  the CPU-heavy ones are placed, the second half while the memory-heavy ones are. Then every
  node opens to moves and the rebalancer runs (`mode` koordinator or global, the same args:
  `minImprovementThreshold` 0.01, every `interval_s`, evictions at `eviction_qps`; the pods
  placed first count as running for a while, and `minPodAge` is longer than the run, so a
  replacement is never moved again: without it a pod's replacement, being a new pod, could
  move back at once; a bound pod is Ready `ready_delay_s` later, by Kwok's pod-ready stage), until it moved nothing for `quiet_s` or `limit_s` passed. Reported per
  planner: the objective before and after (sum and max of node std, stranded capacity),
  evictions, migrations Succeeded / Aborted, the availability gap (replica-seconds below
  desired minus maxUnavailablePerWorkload, sampled from the outside), and the trajectory
  (`samples`: seconds, evictions so far, std sum).
- `scale-down-binpack`: `nodes` nodes, a fifth of them (`pool: db`) first taking a database
  workload, then a `replicas`-replica web workload placed by the default profile (spread); a
  ScaleDownEvent asks the web workload to lose half. The rebalancer ranks with `ranker`
  (kubernetes, koordinator, koordstream; CalculateOnly) and the controller deletes in
  Kubernetes' order, which honours the published costs. Reported per ranker: nodes left empty,
  stranded capacity, pods deleted (`evictions`: the victims, deleted by the controller).

Both report `pods_double_bound` and `nodes_overcommitted` over every run, from the
independent check (`perf.checker`), and `goals`: issue 13's goals, met or not.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agents.rebalance import binpack
from agents.rebalance import config as rebalance_config
from perf.checker import Placement, check
from perf.collector import Collector
from perf.demo import start_up, system
from perf.rebalance_run import GI, MOVABLE, NAMESPACE, Harness
from schemas import topics
from schemas.records import (
    Binding,
    EvictionCommand,
    Node,
    Pod,
    ResourceList,
)
from streams.connection import connect
from streams.producer import RecordProducer
from streams.settings import Settings

NODE = ResourceList(cpu=32_000, memory=128 * GI, pods=110)
CPU_HEAVY = Pod(uid="t", name="t", namespace=NAMESPACE, requests=ResourceList(cpu=1500, memory=2 * GI))
MEMORY_HEAVY = Pod(uid="t", name="t", namespace=NAMESPACE, requests=ResourceList(cpu=250, memory=6 * GI))
PLANNERS = ("koordinator", "global")
SAMPLE_EVERY_S = 2.0


@dataclass(frozen=True)
class ImbalanceRun:
    broker: str = "tansu"
    nodes: int = 500
    per_node: int = 20
    workloads: int = 20
    interval_s: float = 5.0
    eviction_qps: float = 100.0
    eviction_burst: int = 10
    min_improvement: float = 0.01
    min_pod_age_s: float = 600.0  # longer than a run: a replacement is never moved again (the pods placed first are older)
    limit_s: float = 600.0
    quiet_s: float = 15.0
    place_timeout_s: float = 300.0
    ready_delay_s: float = 1.0  # Kwok's pod-ready stage: Running and Ready this long after binding
    # MigrationController's defaultJobTTL: a move whose replacement went into another move's
    # reservation waits for its own until the ttl, so a run finishes only after it (< limit_s).
    job_ttl_s: float = 300.0
    quick: bool = False

    @classmethod
    def preset(cls, broker: str, quick: bool) -> ImbalanceRun:
        if quick:
            # As many pods per node as the full run: with 10, a node starts only just above
            # imbalanceThreshold and leaves the sources after a move or two, whatever the planner.
            return cls(broker=broker, nodes=10, per_node=20, workloads=4, interval_s=2.0, quiet_s=8.0, limit_s=120.0,
                       place_timeout_s=120.0, job_ttl_s=60.0, quick=True)
        return cls(broker=broker)

    def rebalancer_yaml(self, mode: str) -> str:
        return (f"deschedulingInterval: {self.interval_s}s\n"
                "profiles:\n- name: default\n  plugins: {balance: {enabled: [FragmentationAware]}}\n"
                "  pluginConfig:\n"
                f"  - {{name: FragmentationAware, args: {{mode: {mode}, minImprovementThreshold: {self.min_improvement},"
                f" minPodAge: {self.min_pod_age_s}s, nodeSelector: {{matchLabels: {{{MOVABLE}: 'yes'}}}}}}}}\n"
                f"  - {{name: MigrationController, args: {{evictionQPS: {self.eviction_qps},"
                f" evictionBurst: {self.eviction_burst}, defaultJobTTL: {self.job_ttl_s:g}s}}}}\n")


@dataclass(frozen=True)
class ScaleDownRun:
    broker: str = "tansu"
    nodes: int = 200
    replicas: int = 1000
    db_pods: int = 80
    place_timeout_s: float = 300.0
    quick: bool = False

    @classmethod
    def preset(cls, broker: str, quick: bool) -> ScaleDownRun:
        if quick:
            return cls(broker=broker, nodes=20, replicas=100, db_pods=8, place_timeout_s=120.0, quick=True)
        return cls(broker=broker)

    @staticmethod
    def rebalancer_yaml(ranker: str) -> str:
        return ("profiles:\n- name: default\n  plugins: {balance: {enabled: [ScaleDownBinPack]}}\n"
                f"  pluginConfig:\n  - {{name: ScaleDownBinPack, args: {{ranker: {ranker}}}}}\n")


def _node(i: int, *, cordoned: bool = False, movable: bool = False, labels: dict[str, str] | None = None) -> Node:
    return Node(name=f"node-{i:04d}", allocatable=NODE, capacity=NODE, unschedulable=cordoned,
                labels={**(labels or {}), **({MOVABLE: "yes"} if movable else {})})


async def _in_system(cfg_broker: str, yaml_text: str, settings: Settings, drive: Any) -> dict[str, Any]:
    """Run `drive(harness, collector)` in a fresh system with one rebalancer worker."""
    rebalance_config.load(yaml_text)  # refused here, naming the field, rather than in the worker
    with tempfile.TemporaryDirectory(prefix="koordstream-rebalance-") as tmp:
        path = Path(tmp) / "rebalancer.yaml"
        path.write_text(yaml_text)
        env = {"KOORDSTREAM_REBALANCER_CONFIG": str(path), "KOORDSTREAM_REBALANCER_TICK_S": "0.1"}
        async with system(settings, broker_kind=cfg_broker, rebalancers=1, extra_env=env) as (running, _):
            k = running.kafka
            collector = Collector(connect(k), [topics.BINDINGS, topics.EVICTIONS, topics.MIGRATIONS, topics.PODS],
                                  k.partitions)
            await collector.start()
            try:
                async with RecordProducer(connect(k), k.partitions) as producer:
                    result: dict[str, Any] = await drive(producer, collector)
                    return result
            finally:
                await collector.stop()


def _checked(h: Harness) -> dict[str, int]:
    c = h.collector
    checked = check(allocatable={n.name: dict(n.allocatable) for n in h.nodes.values()},
                    requests={uid: dict(p.requests) for uid, p in h.pods.items()},
                    bindings=[Placement(ts, b.uid, b.node) for ts, b in c.of(Binding) if b.uid in h.pods],
                    terminations=h.terminated)
    return {"pods_double_bound": checked.pods_double_bound, "nodes_overcommitted": checked.nodes_overcommitted}


async def _place(h: Harness, name: str, template: Pod, replicas: int, timeout_s: float, age_s: float = 0.0) -> None:
    wanted = set(await h.add(name, template, replicas, age_s))
    if not await h.until(lambda: wanted <= h.node.keys(), timeout_s):
        raise TimeoutError(f"{len(wanted - h.node.keys())} pods of {name} were not bound in {timeout_s:.0f} s")


# -- rebalance-imbalance ---------------------------------------------------------------------


async def run_imbalance(cfg: ImbalanceRun, settings: Settings) -> dict[str, Any]:
    planners: dict[str, Any] = {}
    consistency = {"pods_double_bound": 0, "nodes_overcommitted": 0}
    for mode in PLANNERS:
        result = await _in_system(cfg.broker, cfg.rebalancer_yaml(mode), settings,
                                  lambda p, c, m=mode: _imbalance_once(cfg, m, p, c))
        for k in consistency:
            consistency[k] += result.pop(k)
        planners[mode] = result
    k, g = planners["koordinator"], planners["global"]
    matched = next((s["evictions"] for s in g["samples"] if s["std_sum"] <= k["std_sum_after"]), None)
    g["evictions_to_match_koordinator"] = matched
    cut = 1 - g["std_sum_after"] / g["std_sum_before"] if g["std_sum_before"] else 0.0
    return {"scenario": "rebalance-imbalance" + (" (quick)" if cfg.quick else ""), "config": asdict(cfg),
            **consistency, "planners": planners,
            "goals": {"global_cuts_std_sum_in_half": cut >= 0.5,
                      "global_reaches_koordinator_cut": g["std_sum_after"] <= k["std_sum_after"],
                      "with_no_more_evictions": matched is not None and matched <= k["evictions"],
                      "availability_gap_0": all(p["availability_gap"] == 0 for p in planners.values())}}


async def _imbalance_once(cfg: ImbalanceRun, mode: str, producer: RecordProducer,
                          collector: Collector) -> dict[str, Any]:
    half = cfg.nodes // 2
    nodes = [_node(i, cordoned=i >= half) for i in range(cfg.nodes)]
    probe = Pod(uid="perf-probe", name="perf-probe", namespace="perf", requests=ResourceList(cpu=1))
    await start_up(producer, collector, nodes, probe, collector.partitions, 120.0)
    h = Harness(producer, collector, nodes, cfg.ready_delay_s)
    replicas = cfg.nodes * cfg.per_node // cfg.workloads
    kinds = cfg.workloads // 2
    for w in range(kinds):
        await _place(h, f"cpu-{w:02d}", CPU_HEAVY, replicas, cfg.place_timeout_s, 2 * cfg.min_pod_age_s)
    await h.change_nodes([_node(i, cordoned=i < half) for i in range(cfg.nodes)], cfg.place_timeout_s)
    for w in range(kinds):
        await _place(h, f"mem-{w:02d}", MEMORY_HEAVY, replicas, cfg.place_timeout_s, 2 * cfg.min_pod_age_s)
    opened = [_node(i, movable=True) for i in range(cfg.nodes)]
    h.nodes = {n.name: n for n in opened}
    await h.publish(topics.NODES, opened)
    before = h.objective()
    started = time.monotonic()
    samples = [{"s": 0.0, "evictions": 0, "std_sum": before["std_sum"]}]
    settled = h.settled(cfg.quiet_s)
    last = started
    while not settled() and time.monotonic() - started < cfg.limit_s:
        await h.step()
        if time.monotonic() - last >= SAMPLE_EVERY_S:
            last = time.monotonic()
            samples.append({"s": round(last - started, 1), "evictions": len(collector.of(EvictionCommand)),
                            "std_sum": h.objective()["std_sum"]})
        await asyncio.sleep(0.05)
    after = h.objective()
    jobs = h.jobs().values()
    evictions = len(collector.of(EvictionCommand))
    samples.append({"s": round(time.monotonic() - started, 1), "evictions": evictions, "std_sum": after["std_sum"]})
    return {"std_sum_before": before["std_sum"], "std_sum_after": after["std_sum"], "std_max_after": after["std_max"],
            "stranded_pct_before": before["stranded_pct"], "stranded_pct_after": after["stranded_pct"],
            "evictions": evictions, "migrations_succeeded": sum(1 for j in jobs if j.phase == "Succeeded"),
            "migrations_aborted": sum(1 for j in jobs if j.phase == "Aborted"),
            "availability_gap": round(h.gap, 3), "evictions_refused": dict(h.refused),
            "seconds": round(time.monotonic() - started, 1), "finished": settled(), "pods_bound": len(h.node),
            "samples": samples, **_checked(h)}


# -- scale-down-binpack ----------------------------------------------------------------------


async def run_scale_down(cfg: ScaleDownRun, settings: Settings) -> dict[str, Any]:
    rankers: dict[str, Any] = {}
    consistency = {"pods_double_bound": 0, "nodes_overcommitted": 0}
    for ranker in binpack.RANKERS:
        result = await _in_system(cfg.broker, cfg.rebalancer_yaml(ranker), settings,
                                  lambda p, c: _scale_down_once(cfg, p, c))
        for k in consistency:
            consistency[k] += result.pop(k)
        rankers[ranker] = result
    ours, k8s, koord = (rankers[r]["empty_nodes"] for r in ("koordstream", "kubernetes", "koordinator"))
    return {"scenario": "scale-down-binpack" + (" (quick)" if cfg.quick else ""), "config": asdict(cfg),
            **consistency, "rankers": rankers,
            "goals": {"twice_the_default_rankings_empty_nodes": ours >= 2 * k8s and ours > 0,
                      "more_than_koordinators": ours > koord}}


async def _scale_down_once(cfg: ScaleDownRun, producer: RecordProducer, collector: Collector) -> dict[str, Any]:
    db_nodes = max(1, cfg.nodes // 5)
    nodes = [_node(i, labels={"pool": "db"} if i < db_nodes else {}) for i in range(cfg.nodes)]
    probe = Pod(uid="perf-probe", name="perf-probe", namespace="perf", requests=ResourceList(cpu=1))
    await start_up(producer, collector, nodes, probe, collector.partitions, 120.0)
    h = Harness(producer, collector, nodes)
    db = Pod(uid="t", name="t", namespace=NAMESPACE, requests=ResourceList(cpu=4000, memory=16 * GI),
             node_selector={"pool": "db"})
    web = Pod(uid="t", name="t", namespace=NAMESPACE, requests=ResourceList(cpu=500, memory=GI))
    await _place(h, "db", db, cfg.db_pods, cfg.place_timeout_s)
    await _place(h, "web", web, cfg.replicas, cfg.place_timeout_s)
    empty_before = h.empty_nodes()
    started = time.monotonic()
    removed, in_time = await h.scale_down("web", cfg.replicas - cfg.replicas // 2, 120.0)
    h.node = {u: n for u, n in h.node.items() if u not in set(removed)}
    return {"empty_nodes": h.empty_nodes(), "empty_nodes_before": empty_before,
            "stranded_pct": h.objective()["stranded_pct"], "evictions": len(removed), "ranked": in_time,
            "ranked_s": round(time.monotonic() - started, 2), **_checked(h)}
