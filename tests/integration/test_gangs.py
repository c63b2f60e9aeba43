"""Gangs through the real broker and agents: a gang that cannot complete is released when
its waiting time runs out (the deciders' timer appends a GangTimeout to the gang's own
partition), so the capacity its members held goes to other pods."""

from __future__ import annotations

import pytest

from schemas import topics
from schemas.records import (
    Binding,
    GangTimeout,
    Held,
    Node,
    NodeStateChange,
    Pod,
    Release,
    ResourceList,
)
from tests.integration.harness import Harness

pytestmark = pytest.mark.integration
GANG = "gang.scheduling.koordinator.sh/"


async def test_a_partial_gang_is_released_when_its_waiting_time_runs_out(harness: Harness, run_id: str) -> None:
    label = {"suite": f"gang-{run_id}"}
    node = Node(name=f"gang-{run_id}", labels=label, allocatable=ResourceList(cpu=2000, memory=2**32))
    await harness.publish(topics.NODES, [node])
    await harness.wait_for(NodeStateChange, lambda c: c.node == node.name)
    gang = {GANG + "name": f"g-{run_id}", GANG + "min-available": "3", GANG + "waiting-time": "2s"}
    members = [Pod(uid=f"gm-{run_id}-{i}", name=f"gm-{i}", annotations=gang, node_selector=label,
                   requests=ResourceList(cpu=1000)) for i in range(3)]  # room for two of the three
    await harness.publish(topics.PODS, members)
    await harness.wait_for(Held, lambda h: h.decision_key == f"default/g-{run_id}", count=2)
    [timeout] = await harness.wait_for(GangTimeout, lambda t: t.decision_key == f"default/g-{run_id}",
                                       topic=topics.HOLDS, timeout=30)
    assert timeout.round == 0
    releases = await harness.wait_for(Release, lambda r: r.uid.startswith(f"gm-{run_id}")
                                      and "waiting time" in r.reason, count=2, topic=topics.NODE_INBOX)
    assert {r.node for r in releases} == {node.name}
    assert harness.seen(Binding, lambda b: b.uid.startswith(f"gm-{run_id}")) == []
    # The capacity is free again: a plain pod that needs all of it is bound.
    big = Pod(uid=f"after-gang-{run_id}", name="after", node_selector=label, requests=ResourceList(cpu=2000),
              priority=9999)
    await harness.publish(topics.PODS, [big])
    [binding] = await harness.wait_for(Binding, lambda b: b.uid == big.uid, timeout=60)
    assert binding.node == node.name
