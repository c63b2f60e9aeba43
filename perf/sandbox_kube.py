"""`koordstream perf run sandbox-warm --kwok`: the warm pools' claims through the real
kube-apiserver and real Kwok, with the koordstream bridge in between, measured as a user of
agent-sandbox measures its controller: from a SandboxClaim's creation to its Ready condition.

The phases are sandbox-warm's (`perf.sandbox_run.WarmRun`: claims at 45 a second, at 1,000 a
second, and a burst on a deep pool; the quick preset's smaller sizes with `--quick`). The
control plane, the system and the bridge start as for every `--kwok` run
(`perf.kube_run.bridged`). Set-up through the API: the namespace, a RuntimeClass per runtime
the templates name, the nodes (annotated for Kwok), then per phase a SandboxTemplate (the
phase's requests, runtime and QoS label, koordstream's `schedulerName`) and a SandboxWarmPool
with the phase's refill annotations. A phase starts once the pool's status shows
`readyReplicas` at its replicas (the bridge writes it; Kwok runs the pods); its claims are
created open-loop at their offsets by `concurrency` requests in flight, and a watch on the
namespace's claims records when each is seen Ready. After a phase its claims and pool are
deleted, and the next waits until the pool's pods are gone.

Figures per phase: `claim_latency_ms` from the POST of a claim to the watch event showing it
Ready (the whole path: API server, the bridge's watch, the broker, the pool, the broker, the
bridge's status write, the watch); `claim_latency_decided_ms` from the POST to the broker
timestamp of the pool's answer (where koordstream decided; the rest is the way back through the
bridge and the API server); the paths (warm, starting, cold) and the warm-hit rate from the
pool's answers on `sandbox-status`; the creation round trip; CPU per process (the API server,
etcd, Kwok, the workers, the bridge, the broker, this harness). The checks come from the
topics, as in-process (`perf.sandbox_run.topic_checks`), plus `sandboxes_double_named`: two
claims the API server shows Ready with the same sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict
from typing import Any

import orjson

from perf.collector import Collector
from perf.kube_run import (
    Created,
    Creation,
    KwokOptions,
    _create_ignoring_conflict,
    _wait_nodes_ready,
    bridged,
    checked_alive,
    create_all,
    until_decided,
)
from perf.run import latency_cdf
from perf.sandbox_run import (
    CHECKS,
    NAMESPACE,
    REFERENCE,
    Answers,
    Phase,
    Usage,
    WarmRun,
    claim_figures,
    latency_figures,
    nodes,
    topic_checks,
    warm_goals,
)
from schemas import topics
from schemas.agent_sandbox import (
    OVERFLOW_ANNOTATION,
    REFILL_BATCH_ANNOTATION,
    REFILL_RATE_ANNOTATION,
)
from schemas.kube import node_manifest
from schemas.quantity import format_canonical
from schemas.records import SANDBOX_POOL_LABEL, PodTerminated
from streams.bridge.sandboxes import API_VERSION, claims_path, pools_path
from streams.connection import connect
from streams.kube_cluster import KWOK_NODE_ANNOTATION
from streams.kubeapi import KubeApi, KubeError, Limits
from streams.process import quiet_gc
from streams.settings import Settings

SCHEDULER = "koordstream"
IMAGE = "registry.k8s.io/pause:3.10"


def template_manifest(phase: Phase) -> dict[str, Any]:
    """The phase's SandboxTemplate: its sandbox's requests, runtime and QoS label."""
    pod = phase.sandbox.template().pod
    requests = {name: format_canonical(name, value) for name, value in pod.requests.items() if value}
    return {"apiVersion": API_VERSION, "kind": "SandboxTemplate",
            "metadata": {"name": f"{phase.name}-template", "namespace": NAMESPACE},
            "spec": {"envVarsInjectionPolicy": "Allowed", "podTemplate": {
                "metadata": {"labels": dict(pod.labels)},
                "spec": {"schedulerName": SCHEDULER, "runtimeClassName": pod.runtime_class_name or None,
                         "containers": [{"name": "sandbox", "image": IMAGE, "resources": {"requests": requests}}]}}}}


def pool_manifest(phase: Phase) -> dict[str, Any]:
    s = phase.sandbox
    return {"apiVersion": API_VERSION, "kind": "SandboxWarmPool",
            "metadata": {"name": phase.name, "namespace": NAMESPACE, "annotations": {
                REFILL_RATE_ANNOTATION: str(s.refill_per_s), REFILL_BATCH_ANNOTATION: str(s.refill_batch),
                OVERFLOW_ANNOTATION: "Allow"}},
            "spec": {"replicas": s.replicas, "sandboxTemplateRef": {"name": f"{phase.name}-template"}}}


def claim_manifest(phase: Phase, name: str) -> bytes:
    return orjson.dumps({"apiVersion": API_VERSION, "kind": "SandboxClaim",
                         "metadata": {"name": name, "namespace": NAMESPACE},
                         "spec": {"warmPoolRef": {"name": phase.name}}})


class ClaimWatch:
    """Watches the namespace's claims from a resourceVersion: when each (by name) was first
    seen Ready, and the sandbox it was Ready with."""

    def __init__(self, api: KubeApi, version: str) -> None:
        self.api, self.version = api, version
        self.ready_at: dict[str, float] = {}
        self.sandbox: dict[str, str] = {}
        self.changed = asyncio.Event()

    async def run(self) -> None:
        while True:
            try:
                async for event in self.api.watch(claims_path(NAMESPACE), {"resourceVersion": self.version,
                                                                          "timeoutSeconds": 3600}):
                    now = time.time()
                    obj = event.get("object") or {}
                    meta = obj.get("metadata") or {}
                    self.version = str(meta.get("resourceVersion") or self.version)
                    status = obj.get("status") or {}
                    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                                for c in status.get("conditions") or ())
                    name = str(meta.get("name", ""))
                    if ready and name not in self.ready_at:
                        self.ready_at[name] = now
                        self.sandbox[name] = str((status.get("sandbox") or {}).get("name", ""))
                        self.changed.set()
            except KubeError as exc:
                if exc.status == 410:  # too old: what happened meanwhile is read from a list
                    listing = await self.api.request("GET", claims_path(NAMESPACE))
                    self.version = str((listing.get("metadata") or {}).get("resourceVersion", ""))
                    continue
                await asyncio.sleep(0.5)


async def run_warm_kwok(cfg: WarmRun, settings: Settings, opts: KwokOptions | None = None) -> dict[str, Any]:
    """See the module docstring."""
    opts = opts or KwokOptions()
    node_list = nodes(cfg.nodes)
    started = time.perf_counter()
    async with bridged(settings, opts) as (cp, settings, workers, bridge, log):
        alive = checked_alive(bridge, log, workers)
        k = settings.kafka
        kafka = connect(k)
        quiet_gc(settings.worker.gc_threshold)
        collector = Collector(kafka, [topics.SANDBOX_STATUS, topics.BINDINGS, topics.PROFILING], k.partitions)
        terminations = Collector(kafka, [topics.NODE_INBOX], k.partitions, kinds=(PodTerminated,))
        reports = Collector(kafka, [topics.STATE_CHANGES], k.partitions)
        for c in (collector, terminations, reports):
            await c.start()
        api = cp.api(Limits(qps=0, burst=1, concurrency=max(opts.concurrency, 8) + 8))
        answers = Answers(collector)
        try:
            await _create_ignoring_conflict(api, "/api/v1/namespaces", {
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
            for runtime in sorted({p.sandbox.runtime for p in cfg.phases} - {""}):
                await _create_ignoring_conflict(api, "/apis/node.k8s.io/v1/runtimeclasses", {
                    "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": runtime},
                    "handler": runtime})
            made = Created()
            await create_all(api, [Creation(0.0, n.name, "Node", "/api/v1/nodes", orjson.dumps(
                node_manifest(n, annotations={KWOK_NODE_ANNOTATION: "fake"}))) for n in node_list], time.time(),
                opts.concurrency, made)
            if made.failed:
                raise RuntimeError(f"{len(made.failed)} nodes not created, e.g. {next(iter(made.failed.values()))}")
            await _wait_nodes_ready(reports, {n.name for n in node_list}, time.monotonic() + opts.startup_timeout_s,
                                    alive)
            await reports.stop()
            startup_s = round(time.perf_counter() - started, 2)
            usage, first = Usage(), time.time()
            phases: dict[str, dict[str, Any]] = {}
            requests = {}
            for phase in cfg.phases:
                requests[phase.name] = phase.sandbox.template().pod.requests
                phases[phase.name] = await _phase(api, answers, cfg, phase, opts, alive)
            checks = topic_checks(answers, collector, terminations, node_list, requests, first)
            machine = usage.since()
            wall = round(time.time() - first, 2)
        finally:
            await api.close()
            for c in (collector, terminations, reports):
                await c.stop()
    named = sum(p.pop("_double_named") for p in phases.values())
    cdfs = {name: p.pop("_latencies") for name, p in phases.items()}
    totals = {key: sum(p[key] for p in phases.values())
              for key in ("claims_total", "claims_ready", "claims_warm", "claims_refused", "claims_unanswered")}
    totals["warm_hit_rate"] = round(totals["claims_warm"] / totals["claims_total"], 4) if totals["claims_total"] else 0.0
    return {
        "scenario": "sandbox-warm --kwok" + (" (quick)" if cfg.quick else ""),
        "broker": opts.bootstrap or opts.broker, "startup_s": startup_s, "wall_s": wall, **totals,
        "claim_latency_ms": latency_figures([v for values in cdfs.values() for v in values]),
        **{key: checks[key] for key in CHECKS}, "sandboxes_double_named": named,
        "phases": phases, "goals": warm_goals(cfg, phases), "reference": REFERENCE, "machine": machine,
        "latency_cdf_ms": {name: latency_cdf(values) for name, values in cdfs.items()},
        "allocation_series_pct": checks["allocation_series_pct"],
        "config": {**asdict(cfg), "concurrency": opts.concurrency, "bridge_qps": opts.bridge_qps,
                   "bridge_concurrency": opts.bridge_concurrency},
    }


async def _phase(api: KubeApi, answers: Answers, cfg: WarmRun, phase: Phase, opts: KwokOptions,
                 alive: Any) -> dict[str, Any]:
    base = f"/apis/{API_VERSION}/namespaces/{NAMESPACE}"
    await api.request("POST", f"{base}/sandboxtemplates", body=template_manifest(phase))
    await api.request("POST", f"{base}/sandboxwarmpools", body=pool_manifest(phase))
    filling = time.monotonic()

    async def full() -> bool:
        status = (await api.request("GET", pools_path(NAMESPACE, phase.name))).get("status") or {}
        return int(status.get("readyReplicas") or 0) >= phase.sandbox.replicas

    await _until(full, cfg.fill_timeout_s, f"pool {phase.name} to fill", alive)
    fill_s = round(time.monotonic() - filling, 2)
    listing = await api.request("GET", claims_path(NAMESPACE))
    watch = ClaimWatch(api, str((listing.get("metadata") or {}).get("resourceVersion", "")))
    watcher = asyncio.create_task(watch.run())
    names = [f"{phase.name}-{i}" for i in range(phase.claims)]
    plan = [Creation(i / phase.rate if phase.rate else 0.0, f"{NAMESPACE}/{n}", "SandboxClaim",
                     claims_path(NAMESPACE), claim_manifest(phase, n)) for i, n in enumerate(names)]
    usage, created = Usage(), Created()
    t0 = time.time()
    creator = asyncio.create_task(create_all(api, plan, t0, opts.concurrency, created))
    try:
        await until_decided(lambda: len(watch.ready_at) >= len(names),
                            lambda: len(watch.ready_at) + len(created.done), creator, cfg.stall_s, alive, watch.changed)
    finally:
        creator.cancel()
        watcher.cancel()
        for task in (creator, watcher):
            with contextlib.suppress(asyncio.CancelledError):
                await task
    machine = usage.since()
    uid_of = {n: created.done[f"{NAMESPACE}/{n}"][2] for n in names if f"{NAMESPACE}/{n}" in created.done}
    sent = {uid_of[n]: created.done[f"{NAMESPACE}/{n}"][0] for n in uid_of}
    await answers.until(lambda: all(answers.answered(u) for u in sent), 30.0, f"the answers of {phase.name}")
    decided = claim_figures(list(sent), sent, answers)  # its latency: to the pool's answer on the topic
    latencies = [(watch.ready_at[n] - sent[uid_of[n]]) * 1000.0 for n in uid_of if n in watch.ready_at]
    sandboxes = [watch.sandbox[n] for n in watch.ready_at]
    out = {
        "offered_rate_per_s": phase.rate or None, "claims": phase.claims, "pool_replicas": phase.sandbox.replicas,
        "refill_per_s": phase.sandbox.refill_per_s, "refill_batch": phase.sandbox.refill_batch, "fill_s": fill_s,
        "claims_total": len(names), "claims_created": len(created.done), "claims_not_created": len(created.failed),
        "claims_ready": len(latencies),
        **{k: decided[k] for k in ("claims_warm", "claims_starting", "claims_cold", "claims_refused", "warm_hit_rate")},
        "claims_unanswered": len(names) - len(latencies) - decided["claims_refused"],
        "claim_latency_ms": latency_figures(latencies),
        "claim_latency_decided_ms": decided["claim_latency_ms"],
        "create_round_trip_ms": latency_figures([(b - a) * 1000.0 for a, b, _ in created.done.values()]),
        "create_lag_s": round(created.lag_s, 3), "create_retries": created.retries,
        "machine": machine, "_latencies": latencies, "_double_named": len(sandboxes) - len(set(sandboxes)),
    }
    # The claims and the pool go: the next phase starts on free nodes.
    await _delete_all(api, claims_path(NAMESPACE), cfg.fill_timeout_s, alive)
    await api.request("DELETE", pools_path(NAMESPACE, phase.name), timeout_s=120)

    async def gone() -> bool:
        listing = await api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods",
                                    params={"labelSelector": f"{SANDBOX_POOL_LABEL}={phase.name}", "limit": 1})
        return not listing.get("items")

    await _until(gone, cfg.fill_timeout_s, f"the pods of pool {phase.name} to go", alive)
    return out


async def _delete_all(api: KubeApi, path: str, timeout_s: float, alive: Any) -> None:
    """Delete every object of a collection: thousands of claims take the API server longer than
    its request timeout (a 504 while it goes on deleting), so again until none is listed."""
    async def none_left() -> bool:
        try:
            await api.request("DELETE", path, timeout_s=120)
        except KubeError as exc:
            if exc.status not in (0, 504):
                raise
        return not (await api.request("GET", path, params={"limit": 1})).get("items")

    await _until(none_left, timeout_s, f"every object of {path} deleted", alive)


async def _until(check: Any, timeout_s: float, what: str, alive: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        await asyncio.sleep(0.2)
