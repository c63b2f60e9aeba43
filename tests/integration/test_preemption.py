"""Preemption through the real broker and agents: the scheduler nominates the preemptor and
sends EvictionCommands; the test acts as the cluster (as the Kubernetes bridge and the perf
lifecycle will) and deletes the victims; the preemptor binds where it was nominated, and a
lower-priority pod of another profile does not take the capacity meanwhile."""

from __future__ import annotations

import asyncio

import pytest

from schemas import topics
from schemas.records import (
    Binding,
    EvictionCommand,
    Node,
    NodeStateChange,
    Nomination,
    Pod,
    PodDeleted,
    ResourceList,
)
from tests.integration.harness import Harness

pytestmark = pytest.mark.integration


async def test_preemptor_binds_after_its_victims_are_gone(harness: Harness, run_id: str) -> None:
    label = {"suite": f"preempt-{run_id}"}
    node = Node(name=f"pre-{run_id}", labels=label, allocatable=ResourceList(cpu=2000, memory=2**32))
    await harness.publish(topics.NODES, [node])
    await harness.wait_for(NodeStateChange, lambda c: c.node == node.name)

    def pod(name: str, priority: int, cpu: int, profile: str = "default-scheduler") -> Pod:
        return Pod(uid=f"{name}-{run_id}", name=name, priority=priority, scheduler_name=profile,
                   node_selector=label, requests=ResourceList(cpu=cpu))

    low = [pod("low-a", 1, 1000), pod("low-b", 1, 1000)]
    await harness.publish(topics.PODS, low)
    await harness.wait_for(Binding, lambda b: b.uid in {p.uid for p in low}, count=2)

    boss = pod("boss", 100, 1500)
    await harness.publish(topics.PODS, [boss])
    evictions = await harness.wait_for(EvictionCommand, lambda e: e.preemptor_uid == boss.uid, count=2)
    assert {e.uid for e in evictions} == {p.uid for p in low} and {e.node for e in evictions} == {node.name}
    await harness.wait_for(Nomination, lambda n: n.uid == boss.uid and n.node == node.name, topic=topics.NODE_INBOX)

    # Another profile's pod of lower priority arrives while the victims are leaving.
    sneaky = pod("sneaky", 50, 1000, profile="koordstream")
    await harness.publish(topics.PODS, [sneaky])
    await asyncio.sleep(0.5)
    await harness.publish(topics.PODS, [PodDeleted(uid=e.uid, name=e.name, namespace=e.namespace) for e in evictions])

    [binding] = await harness.wait_for(Binding, lambda b: b.uid == boss.uid)
    assert binding.node == node.name
    await asyncio.sleep(1.0)
    assert harness.seen(Binding, lambda b: b.uid == sneaky.uid) == []
