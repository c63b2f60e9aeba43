"""Gangs through the real broker and agents: a gang that cannot complete is released when
its waiting time runs out (the deciders' timer appends a GangTimeout to the gang's own
partition), so the capacity its members held goes to other pods; and wound-wait: an owner asks
a lower-ranked gang to yield (Yield on `holds`), its decider releases it, and the winner is
nominated on the freed capacity."""

from __future__ import annotations

import pytest

from schemas import topics
from schemas.records import (
    Binding,
    Claim,
    GangTimeout,
    Held,
    Node,
    NodeStateChange,
    Pod,
    Rejected,
    Release,
    ResourceList,
    Yield,
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


async def test_an_owner_makes_a_lower_ranked_gang_yield_through_the_broker(harness: Harness, run_id: str) -> None:
    # Two gangs' claims, as two scheduler replicas would send them, straight to the node's inbox.
    node = Node(name=f"ww-{run_id}", labels={"suite": f"ww-{run_id}"}, allocatable=ResourceList(cpu=1000, memory=2**32))
    await harness.publish(topics.NODES, [node])
    await harness.wait_for(NodeStateChange, lambda c: c.node == node.name)
    loser, winner = f"default/ww-b-{run_id}", f"default/ww-a-{run_id}"
    claim_b = Claim(uid=f"ww-b1-{run_id}", attempt=0, node=node.name, decision_key=loser, gang_min=2,
                    requests=ResourceList(cpu=1000, pods=1))
    await harness.publish(topics.NODE_INBOX, [claim_b])
    await harness.wait_for(Held, lambda h: h.uid == claim_b.uid)
    claim_a = Claim(uid=f"ww-a1-{run_id}", attempt=0, node=node.name, decision_key=winner, gang_min=2,
                    requests=ResourceList(cpu=1000, pods=1))
    await harness.publish(topics.NODE_INBOX, [claim_a])
    [rejected] = await harness.wait_for(Rejected, lambda r: r.uid == claim_a.uid, topic=topics.HOLDS)
    assert rejected.soft
    [y] = await harness.wait_for(Yield, lambda y: y.decision_key == loser, topic=topics.HOLDS)
    assert y.winner == winner and y.holds == (claim_b.hold_id,)
    await harness.wait_for(Release, lambda r: r.uid == claim_b.uid and "yielded" in r.reason, topic=topics.NODE_INBOX)
    [change] = await harness.wait_for(NodeStateChange, lambda c: c.node == node.name and claim_b.hold_id in c.holds
                                      and c.holds[claim_b.hold_id] == "released")
    assert [n.uid for n in change.nominations] == [claim_a.uid]  # the freed capacity is promised to a1
