"""The demo run: embedded broker, agents, 1,000 nodes and 10,000 pods, an independent check.

Flow: start the broker (unless a bootstrap is given), create the topics, start the workers
(by default one process for the scheduler and one for the state agents, so both cores work),
publish the nodes, wait until the owners reported every one on `state-changes` and a probe
pod is bound (that ends the start-up phase: broker, topics, every group joined), then publish
pods at a steady rate
while a collector reads Bindings and SchedulingFeedback back from the topics. The summary
comes from `perf.checker`, which recomputes every count from the published inputs and the
records on the topics. Queueing latency is each pod's publish time to its Binding's broker
timestamp; wall time runs from the first pod published to the last decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from perf.checker import Placement, check
from perf.collector import Collector
from perf.workload import make_nodes, make_pods
from schemas import topics
from schemas.records import Binding, Node, NodeStateChange, Pod, SchedulingFeedback
from streams.app import guard_gaps
from streams.broker import EmbeddedBroker, wait_ready
from streams.connection import KafkaConnection, child_env, connect, own_broker
from streams.process import quiet_gc, spawn_tied, stop
from streams.producer import RecordProducer
from streams.settings import Settings
from streams.worker import prepare


@dataclass
class DemoConfig:
    nodes: int = 1000
    pods: int = 10000
    rate: float = 2000.0
    bootstrap: str = ""
    layout: str = "split"  # split: a scheduler process and a state process; single: one process
    seed: int = 0
    stall_timeout_s: float = 30.0
    startup_timeout_s: float = 120.0


def percentiles(values: list[float], qs: tuple[int, ...] = (50, 90, 99)) -> dict[str, float]:
    if not values:
        return {f"p{q}": 0.0 for q in qs}
    arr = np.asarray(values, dtype=np.float64)
    return {f"p{q}": round(float(np.percentile(arr, q)), 2) for q in qs}


async def wait_decided(collector: Collector, uids: set[str], stall_s: float) -> None:
    """Until every pod in `uids` is bound or finally refused, or nothing moved for `stall_s`."""
    last, seen = time.monotonic(), -1
    done: set[str] = set()
    read = 0
    while True:
        records = collector.records
        for _, _, r in itertools.islice(records, read, None):  # only what arrived since the last look
            if (isinstance(r, Binding) or (isinstance(r, SchedulingFeedback) and r.final)) and r.uid in uids:
                done.add(r.uid)
        read = len(records)
        decided = len(done)
        if decided == len(uids):
            return
        if decided != seen:
            seen, last = decided, time.monotonic()
        elif time.monotonic() - last > stall_s:
            return
        collector.changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(collector.changed.wait(), 0.5)


@contextlib.asynccontextmanager
async def system(settings: Settings, bootstrap: str = "", layout: str = "split", broker_kind: str = "tansu",
                 metrics_ports: Sequence[int] = (), extra_env: Mapping[str, str] | None = None,
                 rebalancers: int = 0, replicas: tuple[int, int] = (1, 1)) -> AsyncIterator[tuple[Settings, list[Any]]]:
    """The real system for a run: a broker (unless `bootstrap` names one: the embedded Tansu,
    or with `broker_kind="kafka"` Apache Kafka from `make kafka`), the topics, and the workers
    (`split`: state processes and scheduler processes, in that order, as many of each as
    `replicas` says; `single`: one; then `rebalancers` processes with only the rebalancer
    role). With `metrics_ports`, worker i serves its metrics on port i; `extra_env` goes to
    every worker.
    A broker given is reached as `settings.kafka` says (its security settings go to the
    workers too); a broker started here is PLAINTEXT. Yields the settings pointing at the broker
    and the worker processes; stops everything after."""
    broker: Any = None
    kafka = replace(settings.kafka, bootstrap=bootstrap)
    if not bootstrap:
        if broker_kind == "kafka":
            from streams.kafka_broker import KafkaBroker

            broker = KafkaBroker()
        elif broker_kind == "tansu":
            broker = EmbeddedBroker()
        else:
            raise ValueError(f"broker={broker_kind!r}: choose tansu or kafka")
        broker.start()
        kafka = own_broker(settings.kafka, broker.bootstrap)
    env = {**os.environ, **child_env(kafka),
           "KOORDSTREAM_KAFKA_PARTITIONS": str(settings.kafka.partitions),
           **({"KOORDSTREAM_SCHEDULING_PROFILES": settings.scheduling.profiles} if settings.scheduling.profiles else {}),
           **(extra_env or {})}
    workers: list[Any] = []
    try:
        settings = replace(settings, kafka=kafka)
        await wait_ready(connect(kafka), timeout_s=120.0)
        await prepare(settings)
        if broker is None:  # a broker started here guards its own (EmbeddedBroker.start); one given: ask it
            await guard_gaps(settings)  # the harness's collectors read the same partitions as the workers
        worker = [sys.executable, "-m", "cli.main", "worker"]
        states, schedulers = replicas
        commands = ([worker + ["--roles", "state"]] * states + [worker + ["--roles", "scheduler"]] * schedulers
                    if layout == "split" else [worker])
        commands += [worker + ["--roles", "rebalancer"]] * rebalancers
        workers = [spawn_tied(cmd, env={**env, **({"KOORDSTREAM_WORKER_METRICS_PORT": str(metrics_ports[i])}
                                                   if i < len(metrics_ports) else {})})
                   for i, cmd in enumerate(commands)]
        yield settings, workers
    finally:
        for proc in workers:
            stop(proc, deadline_s=settings.worker.shutdown_deadline_s + 1.0)
        if broker is not None:
            broker.stop()
            getattr(broker, "close", lambda: None)()  # Apache Kafka: its temporary log folder


async def run_demo(cfg: DemoConfig, settings: Settings) -> dict[str, Any]:
    started = time.perf_counter()
    async with system(settings, cfg.bootstrap, cfg.layout) as (settings, _):
        return await _drive(cfg, settings, connect(settings.kafka), started)


async def start_up(producer: RecordProducer, collector: Collector, nodes: list[Node], probe: Pod, partitions: int,
                   timeout_s: float, *, published: bool = False, ready: Callable[[Node], bool] | None = None) -> None:
    """Publish the nodes (unless `published`), wait until the owners reported every one (with
    `ready`: until the last Node record they reported of each satisfies it), then until the
    whole pipeline placed one probe pod (every group joined). `collector` must read `bindings`."""
    if not published:
        await producer.flush(await producer.publish(topics.NODES, nodes))
    names = {n.name for n in nodes}
    deadline = time.monotonic() + timeout_s
    # State changes only matter for start-up; reading them during the run would take CPU from
    # the agents on a two-core machine.
    reports = Collector(producer.kafka, [topics.STATE_CHANGES], partitions)
    await reports.start()
    latest: dict[str, Node] = {}  # node -> the last Node record the owners reported
    read = 0
    try:
        while True:
            records = reports.records
            for _, _, r in itertools.islice(records, read, None):
                if isinstance(r, NodeStateChange) and r.node_record is not None:
                    latest[r.node] = r.node_record
            read = len(records)
            waiting = names - {name for name, node in latest.items() if ready is None or ready(node)}
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the agents did not report {len(waiting)} nodes{' ready' if ready else ''} in "
                                   f"time (e.g. {sorted(waiting)[0]}): is the worker running?")
            await asyncio.sleep(0.05)
    finally:
        await reports.stop()
    await producer.flush(await producer.publish(topics.PODS, [probe]))
    while not any(r.uid == probe.uid for _, r in collector.of(Binding)):
        if time.monotonic() > deadline:
            raise TimeoutError("the probe pod was not bound in time: is the scheduler running?")
        await asyncio.sleep(0.02)


async def _drive(cfg: DemoConfig, settings: Settings, kafka: KafkaConnection, started: float) -> dict[str, Any]:
    run = uuid.uuid4().hex[:6]
    partitions = settings.kafka.partitions
    nodes = make_nodes(cfg.nodes, prefix=f"n{run}")
    pods = make_pods(cfg.pods, prefix=f"p{run}", seed=cfg.seed, now=time.time())
    [probe] = make_pods(1, prefix=f"probe{run}", seed=cfg.seed)
    quiet_gc(settings.worker.gc_threshold)
    collector = Collector(kafka, [topics.BINDINGS, topics.FEEDBACK], partitions)
    await collector.start()
    try:
        async with RecordProducer(kafka, partitions) as producer:
            await start_up(producer, collector, nodes, probe, partitions, cfg.startup_timeout_s)
            startup_s = time.perf_counter() - started

            published: dict[str, float] = {}
            first_publish = time.time()
            tick = 0.01
            per_tick = max(1, int(round(cfg.rate * tick)))
            t_next = time.monotonic()
            pending: list[Any] = []
            for start in range(0, len(pods), per_tick):
                chunk = pods[start:start + per_tick]
                now = time.time()
                for p in chunk:
                    published[p.uid] = now
                pending += await producer.publish(topics.PODS, chunk)
                t_next += tick
                delay = t_next - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            await producer.flush(pending)
            publish_s = time.time() - first_publish

        uids = set(published)
        await wait_decided(collector, uids, cfg.stall_timeout_s)
    finally:
        await collector.stop()

    bindings = [(ts, r) for ts, r in collector.of(Binding) if r.uid in uids]
    feedback = [(ts, r) for ts, r in collector.of(SchedulingFeedback) if r.uid in uids]
    first_binding: dict[str, float] = {}
    for ts, b in bindings:
        first_binding[b.uid] = min(ts, first_binding.get(b.uid, ts))
    probe_bindings = [(ts, b) for ts, b in collector.of(Binding) if b.uid == probe.uid]
    result = check(
        allocatable={n.name: n.allocatable for n in nodes},
        requests={p.uid: p.requests for p in [*pods, probe]},
        bindings=[Placement(ts, b.uid, b.node) for ts, b in bindings + probe_bindings],
        unschedulable={f.uid for _, f in feedback},
        counted=uids,
    )
    decision_times = [ts for ts, _ in bindings] + [ts for ts, f in feedback if f.final]
    wall = (max(decision_times) - first_publish) if decision_times else 0.0
    latencies = [(first_binding[u] - published[u]) * 1000.0 for u in first_binding]
    return {
        "nodes": cfg.nodes,
        "rate_pods_per_s": cfg.rate,
        "pods_total": result.pods_total,
        "pods_bound": result.pods_bound,
        "pods_unschedulable": result.pods_unschedulable,
        "pods_double_bound": result.pods_double_bound,
        "nodes_overcommitted": result.nodes_overcommitted,
        "throughput_pods_per_s": round(result.pods_bound / wall, 1) if wall > 0 else 0.0,
        "queue_latency_ms": percentiles(latencies),
        "startup_s": round(startup_s, 2),
        "wall_s": round(wall, 2),
        "publish_s": round(publish_s, 2),
        "overcommitted": result.overcommitted,
    }


def succeeded(summary: dict[str, Any]) -> bool:
    return bool(
        summary["pods_bound"] == summary["pods_total"]
        and summary["pods_double_bound"] == 0
        and summary["nodes_overcommitted"] == 0
    )
