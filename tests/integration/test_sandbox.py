"""The warm pools through the real broker and agents: a pool fills (its pods scheduled like any
other, their Bindings forwarded back to the pool), claims adopt its ready sandboxes at once,
claims beyond them take starting ones or start cold through the scheduler, a burst's
reservations are placed, and every claim is answered with a sandbox of its own."""

from __future__ import annotations

import base64
import time

import pytest

from schemas import topics
from schemas.records import (
    Binding,
    DeadLetter,
    EnvVar,
    Node,
    NodeDeleted,
    NodeStateChange,
    Pod,
    ReservationEvent,
    ResourceList,
    SandboxBurst,
    SandboxClaim,
    SandboxClaimStatus,
    SandboxPoolStatus,
    SandboxTemplate,
    SandboxWarmPool,
)
from tests.integration.harness import Harness
from tests.integration.test_metrics import scrape, value

pytestmark = pytest.mark.integration


async def test_claims_adopt_warm_sandboxes_and_the_rest_start_cold(harness: Harness, run_id: str,
                                                                   metrics_port: int) -> None:
    ns, label = f"sbx-{run_id}", {"suite": f"sbx-{run_id}"}
    nodes = [Node(name=f"sbx-{run_id}-{i}", labels=label, allocatable=ResourceList(cpu=8000, memory=2**34, pods=110))
             for i in range(2)]
    await harness.publish(topics.NODES, nodes)
    for n in nodes:
        await harness.wait_for(NodeStateChange, lambda c, n=n: c.node == n.name)  # type: ignore[misc]
    template = SandboxTemplate(namespace=ns, name="py", env_policy="Allowed", pod=Pod(
        uid="", name="", node_selector=label, requests=ResourceList(cpu=100, memory=128 << 20)))
    pool = SandboxWarmPool(namespace=ns, name="pool", template=template, replicas=6)
    await harness.publish(topics.SANDBOX, [pool])
    await harness.wait_for(SandboxPoolStatus, lambda s: s.namespace == ns and s.ready == 6, timeout=60)
    now = time.time()
    claims = [SandboxClaim(uid=f"{run_id}-{i}", namespace=ns, name=f"c{i}", warm_pool="pool", created=now,
                           labels={"team": "x"} if i == 0 else {})
              for i in range(10)]
    await harness.publish(topics.SANDBOX, claims)
    ready = await harness.wait_for(SandboxClaimStatus, lambda s: s.namespace == ns and s.phase == "Ready",
                                   count=10, timeout=60, distinct=lambda s: s.name)
    by_claim = {s.name: s for s in ready}
    assert len(by_claim) == 10
    assert len({s.pod_uid for s in by_claim.values()}) == 10  # a sandbox of its own
    paths = sorted(s.path for s in by_claim.values())
    assert paths.count("warm") == 6 and set(paths) - {"warm"} <= {"starting", "cold"}
    # Their Bindings, read from the bindings topic (the forwarder copies them to the pool's
    # topic, which the collector reads too): every one names the node the answer named.
    node_of = {s.pod_uid: s.node for s in by_claim.values()}
    bindings = await harness.wait_for(Binding, lambda b: b.uid in node_of, count=10, topic=topics.BINDINGS,
                                      distinct=lambda b: b.uid)
    assert all(b.node == node_of[b.uid] for b in bindings)
    # The first claim's labels reach the pod it adopted (agent-sandbox's additionalPodMetadata).
    adopted = by_claim["c0"].pod_uid
    await harness.wait_for(Pod, lambda p: p.uid == adopted and p.labels.get("team") == "x", topic=topics.PODS)
    # The pool refills to its replicas.
    await harness.wait_for(SandboxPoolStatus, lambda s: s.namespace == ns and s.ready == 6 and s.claims == 10,
                           timeout=60)
    # The worker's metrics: the pool's depth, its decisions by path, the claims' latency.
    _, body = await scrape(metrics_port)
    pool_label = f'pool="{ns}/pool"'
    assert value(body, f'koordstream_sandbox_claims_total{{path="warm",{pool_label}}}') == 6
    assert value(body, f'koordstream_sandbox_pool_sandboxes{{{pool_label},state="ready"}}') == 6
    assert value(body, f'koordstream_sandbox_warm_hit_ratio{{{pool_label}}}') == 0.6
    assert value(body, f'koordstream_sandbox_claim_latency_seconds_count{{{pool_label}}}') == 10
    # A burst: reservations for the pool's cold path, placed on the pool's nodes.
    await harness.publish(topics.SANDBOX, [SandboxBurst(namespace=ns, name="b", warm_pool="pool", count=3, ttl_s=600)])
    events = await harness.wait_for(ReservationEvent, lambda e: e.phase == "Available" and f"~{ns}~" in e.uid,
                                    count=3, timeout=60)
    assert {e.node for e in events} <= {n.name for n in nodes}


async def test_bad_pools_and_claims_are_refused_naming_the_field_and_the_pool_goes_on(
        harness: Harness, run_id: str) -> None:
    ns = f"sbx-bad-{run_id}"
    template = SandboxTemplate(namespace=ns, name="t", pod=Pod(uid="", name="", node_selector={"none": run_id},
                                                               requests=ResourceList(cpu=100)))
    negative = SandboxWarmPool(namespace=ns, name="neg", template=template, replicas=-1)
    good = SandboxWarmPool(namespace=ns, name="ok", template=template, replicas=0, overflow="Deny")
    unknown = SandboxClaim(uid=f"u1-{run_id}", namespace=ns, name="c1", warm_pool="missing")
    env = SandboxClaim(uid=f"u2-{run_id}", namespace=ns, name="c2", warm_pool="ok", env=(EnvVar("A", "1"),))
    await harness.publish(topics.SANDBOX, [negative, good, unknown, env])
    letters = await harness.wait_for(DeadLetter, lambda d: d.topic == topics.SANDBOX and ns in base64.b64decode(
        d.original).decode(), count=3)
    assert {d.field for d in letters} == {"spec.replicas", "spec.warmPoolRef.name", "spec.env"}, letters
    refused = await harness.wait_for(SandboxClaimStatus, lambda s: s.namespace == ns and s.phase == "Refused", count=2)
    assert {s.reason for s in refused} == {"WarmPoolNotFound", "InvalidClaim"}
    # The pool goes on: a good claim on the Deny pool (empty) is refused with what to do.
    late = SandboxClaim(uid=f"u3-{run_id}", namespace=ns, name="c3", warm_pool="ok")
    await harness.publish(topics.SANDBOX, [late])
    [answer] = await harness.wait_for(SandboxClaimStatus, lambda s: s.uid == late.uid)
    assert answer.phase == "Refused" and answer.reason == "WarmPoolEmpty" and answer.next_step == "ScaleWarmPool"
    assert [a.kind for a in answer.alternatives] == ["ScaleWarmPool"]


async def test_a_node_deleted_under_a_pool_fails_its_claims_and_the_pool_refills(harness: Harness, run_id: str) -> None:
    ns, label = f"sbx-gone-{run_id}", {"suite": f"sbx-gone-{run_id}"}
    nodes = [Node(name=f"sbx-gone-{run_id}-{i}", labels=label, allocatable=ResourceList(cpu=1000, memory=2**33))
             for i in range(2)]
    await harness.publish(topics.NODES, nodes)
    for n in nodes:
        await harness.wait_for(NodeStateChange, lambda c, n=n: c.node == n.name)  # type: ignore[misc]
    template = SandboxTemplate(namespace=ns, name="t", pod=Pod(uid="", name="", node_selector=label,
                                                               requests=ResourceList(cpu=100)))
    await harness.publish(topics.SANDBOX, [SandboxWarmPool(namespace=ns, name="pool", template=template, replicas=4)])
    await harness.wait_for(SandboxPoolStatus, lambda s: s.namespace == ns and s.ready == 4, timeout=60)
    claims = [SandboxClaim(uid=f"{run_id}-g{i}", namespace=ns, name=f"c{i}", warm_pool="pool") for i in range(4)]
    await harness.publish(topics.SANDBOX, claims)
    ready = await harness.wait_for(SandboxClaimStatus, lambda s: s.namespace == ns and s.phase == "Ready", count=4)
    doomed = ready[0].node
    on_doomed = {s.name for s in ready if s.node == doomed}
    await harness.publish(topics.NODES, [NodeDeleted(name=doomed)])
    failed = await harness.wait_for(SandboxClaimStatus, lambda s: s.namespace == ns and s.phase == "Failed",
                                    count=len(on_doomed), timeout=60)
    assert {s.name for s in failed} == on_doomed
    # The pool refills to its replicas, on the node that is left.
    await harness.wait_for(SandboxPoolStatus, lambda s: s.namespace == ns and s.ready == 4 and s.claimed == 4 - len(
        on_doomed), timeout=60)
