"""A warm pool's state worker killed -9 mid-burst, through the real broker: a scheduler worker
and a state worker (which runs the pools); the pool fills, then claims keep arriving while the
state worker gets SIGKILL and a new one starts. At the end every claim is answered Ready with a
sandbox of its own (an answer may come twice: a replay re-sends it; never two sandboxes for one
claim, never one sandbox for two claims), the pool is back at its replicas with no pod leaked,
and no node is over-committed (`perf.checker`, from the topics).

Runs on the embedded broker (no transactions: the recorded outputs re-sent carry the safety) in
`make test`, and on Apache Kafka (transactions) in `make e2e` (tests/integration/conftest.py,
E2E_ONLY)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from agents.sandbox.templates import pool_of
from perf.checker import Placement, check
from schemas import topics
from schemas.records import (
    Binding,
    Node,
    NodeStateChange,
    Pod,
    PodDeleted,
    PodTerminated,
    ResourceList,
    SandboxClaim,
    SandboxClaimStatus,
    SandboxPoolStatus,
    SandboxTemplate,
    SandboxWarmPool,
)
from streams.broker import EmbeddedBroker
from streams.kafka_broker import KafkaBroker
from streams.settings import load_settings
from streams.worker import prepare
from tests.integration.harness import PARTITIONS, Harness, Workers

pytestmark = [pytest.mark.integration, pytest.mark.kafka]
REPLICAS, CLAIMS = 12, 60
Broker = EmbeddedBroker | KafkaBroker


def progress(h: Harness, ns: str) -> str:
    """What reached the topics about the pool: for diagnosing a run that did not settle."""
    statuses = {s.uid: s.phase for s in h.seen(SandboxClaimStatus, lambda s: s.namespace == ns)}
    pools = h.seen(SandboxPoolStatus, lambda s: s.namespace == ns)
    answers: dict[str, list[SandboxClaimStatus]] = {}
    for a in h.seen(SandboxClaimStatus, lambda s: s.namespace == ns):
        answers.setdefault(a.uid, []).append(a)
    unready = {uid: [(a.phase, a.path, a.pod_uid, a.reason) for a in got] for uid, got in answers.items()
               if all(a.phase != "Ready" for a in got)}
    bound = {b.uid: b.node for b in h.seen(Binding, lambda b: b.namespace == ns, topic=topics.BINDINGS)}
    return (f"claims answered {len(statuses)} ({sum(p == 'Ready' for p in statuses.values())} Ready); last pool "
            f"status {pools[-1] if pools else None}; pods {len(h.seen(Pod, lambda p: p.namespace == ns))}, "
            f"bindings {len(h.seen(Binding, lambda b: b.namespace == ns))}; never Ready: {unready} "
            f"(their pods bound: {[bound.get(a[2]) for got in unready.values() for a in got]})")


async def test_a_state_worker_killed_mid_burst_answers_every_claim_once_and_refills_the_pool(
        broker_factory: Callable[[], Broker], tmp_path: Path) -> None:
    async with broker_factory() as broker:
        env = {**os.environ, "KOORDSTREAM_KAFKA_BOOTSTRAP": broker.bootstrap,
               "KOORDSTREAM_KAFKA_PARTITIONS": str(PARTITIONS), "KOORDSTREAM_WORKER_LOGLEVEL": "info"}
        await prepare(load_settings(env=env))
        with Workers(env, tmp_path) as workers:
            workers.start("scheduler", "scheduler")
            workers.start("state-1", "state")
            async with Harness(broker.bootstrap) as h:
                ns = f"crash-{uuid.uuid4().hex[:6]}"
                label = {"suite": ns}
                nodes = [Node(name=f"{ns}-{i}", labels=label, allocatable=ResourceList(cpu=3000, memory=2**34))
                         for i in range(4)]
                await h.publish(topics.NODES, nodes)
                await h.wait_for(NodeStateChange, lambda c: True, count=len(nodes), timeout=90)
                template = SandboxTemplate(namespace=ns, name="py", pod=Pod(
                    uid="", name="", node_selector=label, requests=ResourceList(cpu=100, memory=64 << 20)))
                pool = SandboxWarmPool(namespace=ns, name="pool", template=template, replicas=REPLICAS,
                                       refill_batch=6, refill_per_s=20.0)
                await h.publish(topics.SANDBOX, [pool])
                await h.wait_for(SandboxPoolStatus, lambda s: s.namespace == ns and s.ready == REPLICAS, timeout=90)

                claims = [SandboxClaim(uid=f"{ns}-u{i}", namespace=ns, name=f"c{i}", warm_pool="pool",
                                       created=time.time()) for i in range(CLAIMS)]

                async def publish_steadily() -> None:
                    for at in range(0, CLAIMS, 3):
                        await h.publish(topics.SANDBOX, claims[at:at + 3])
                        await asyncio.sleep(0.1)

                publisher = asyncio.create_task(publish_steadily())
                await h.wait_for(SandboxClaimStatus, lambda s: s.namespace == ns and s.phase == "Ready", count=8,
                                 timeout=60)
                workers.kill("state-1")  # mid-burst: claims, refills, Bindings in flight
                workers.start("state-2", "state")
                await publisher
                try:
                    await h.wait_for(SandboxClaimStatus, lambda s: s.namespace == ns and s.phase == "Ready",
                                     count=CLAIMS, timeout=120)
                    ready = {s.uid for s in h.seen(SandboxClaimStatus, lambda s: s.namespace == ns
                                                   and s.phase == "Ready")}
                    deadline = asyncio.get_running_loop().time() + 120
                    while ready != {c.uid for c in claims}:
                        assert asyncio.get_running_loop().time() < deadline, "not every claim answered Ready"
                        await asyncio.sleep(0.2)
                        ready = {s.uid for s in h.seen(SandboxClaimStatus, lambda s: s.namespace == ns
                                                       and s.phase == "Ready")}
                    await h.wait_for(SandboxPoolStatus, lambda s: s.namespace == ns and s.ready == REPLICAS
                                     and s.claimed == CLAIMS and s.starting == 0, timeout=90)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; {progress(h, ns)}") from None
                await asyncio.sleep(2.0)  # anything late (a re-sent answer, a stray pod) would show up by now

                statuses = h.seen(SandboxClaimStatus, lambda s: s.namespace == ns)
                sandboxes: dict[str, set[str]] = {}
                holders: dict[str, set[str]] = {}
                for s in statuses:
                    sandboxes.setdefault(s.uid, set()).add(s.pod_uid)
                    holders.setdefault(s.pod_uid, set()).add(s.uid)
                assert {u: v for u, v in sandboxes.items() if len(v) > 1} == {}  # one sandbox per claim
                assert {p: v for p, v in holders.items() if len(v) > 1} == {}  # one claim per sandbox
                bound = {b.uid: b.node for b in h.seen(Binding, lambda b: b.namespace == ns)}
                for s in statuses:
                    if s.phase == "Ready":
                        assert bound.get(s.pod_uid) == s.node, s  # Ready where its pod was bound

                # No pod leaked: the pool's live pods are its replicas and one per claim.
                said: dict[str, str] = {}
                for _, topic, r in h.collector.records:
                    if topic == topics.PODS and isinstance(r, (Pod, PodDeleted)) and pool_of(r.uid) == f"{ns}/pool":
                        said[r.uid] = type(r).__name__
                live = {uid for uid, last in said.items() if last == "Pod"}
                assert len(live) == REPLICAS + CLAIMS, (len(live), progress(h, ns))
                assert live <= set(bound)

                placed = [(i, r) for i, (_, topic, r) in enumerate(h.collector.records)
                          if isinstance(r, (Binding, PodTerminated)) and r.uid in said]
                result = check({n.name: n.allocatable for n in nodes}, {u: template.pod.requests for u in said},
                               [Placement(i, r.uid, r.node) for i, r in placed if isinstance(r, Binding)],
                               [Placement(i, r.uid, r.node) for i, r in placed if isinstance(r, PodTerminated)])
                assert result.pods_double_bound == 0 and result.nodes_overcommitted == 0, result.overcommitted
