"""Reservations through the real broker and agents: a Reservation published on `pods` is
placed and becomes Available; a pod its owners match is bound to it and ends it (allocate
once); a second reservation with a short ttl expires (the owners' timer appends a
ReservationExpired to the node's inbox) and a pod that needs its capacity is bound after.
Each, once ended, is deleted on `pods` by its owner (so the scheduler and its decider forget
it like a deleted pod)."""

from __future__ import annotations

import time

import pytest

from schemas import topics
from schemas.records import (
    Binding,
    Node,
    NodeStateChange,
    Pod,
    PodDeleted,
    ReservationEvent,
    ReservationExpired,
    ReservationOwner,
    ResourceList,
    SchedulingFeedback,
)
from schemas.records import Reservation as ReservationRecord
from tests.integration.harness import Harness

pytestmark = pytest.mark.integration


async def test_a_reservation_is_consumed_by_its_owner_and_another_expires(harness: Harness, run_id: str) -> None:
    label = {"suite": f"rsv-{run_id}"}
    node = Node(name=f"rsv-{run_id}", labels=label, allocatable=ResourceList(cpu=4000, memory=2**33))
    await harness.publish(topics.NODES, [node])
    await harness.wait_for(NodeStateChange, lambda c: c.node == node.name)
    owners = (ReservationOwner(match_labels={"app": f"web-{run_id}"}),)
    first = ReservationRecord(uid=f"r1-{run_id}", name=f"r1-{run_id}", owners=owners, node_selector=label,
                              requests=ResourceList(cpu=3000), creation_timestamp=time.time())
    await harness.publish(topics.PODS, [first])
    [available] = await harness.wait_for(ReservationEvent, lambda e: e.uid == first.uid and e.phase == "Available")
    assert available.node == node.name
    web = Pod(uid=f"w-{run_id}", name="w", labels={"app": f"web-{run_id}"}, requests=ResourceList(cpu=2000))
    await harness.publish(topics.PODS, [web])  # no selector: the reservation draws it to the node
    [binding] = await harness.wait_for(Binding, lambda b: b.uid == web.uid)
    assert binding.node == node.name
    [done] = await harness.wait_for(ReservationEvent, lambda e: e.uid == first.uid and e.phase == "Succeeded")
    assert done.allocated["cpu"] == 2000
    await harness.wait_for(PodDeleted, lambda d: d.uid == first.uid, topic=topics.PODS)
    await harness.wait_for(PodDeleted, lambda d: d.uid == first.uid, topic=topics.HOLDS)  # forwarded to its decider
    # 2000 left on the node: a reservation of all of it, expiring in 2 s, keeps a plain pod out until then.
    second = ReservationRecord(uid=f"r2-{run_id}", name=f"r2-{run_id}", owners=owners, node_selector=label,
                               requests=ResourceList(cpu=2000), ttl_s=2.0, creation_timestamp=time.time())
    await harness.publish(topics.PODS, [second])
    await harness.wait_for(ReservationEvent, lambda e: e.uid == second.uid and e.phase == "Available")
    plain = Pod(uid=f"p-{run_id}", name="p", node_selector=label, requests=ResourceList(cpu=2000))
    await harness.publish(topics.PODS, [plain])
    refused = (await harness.wait_for(SchedulingFeedback, lambda f: f.uid == plain.uid))[0]  # it fits nowhere yet
    assert "Insufficient cpu" in refused.message
    await harness.wait_for(ReservationExpired, lambda r: r.uid == second.uid, topic=topics.NODE_INBOX, timeout=30)
    [failed] = await harness.wait_for(ReservationEvent, lambda e: e.uid == second.uid and e.phase == "Failed")
    assert failed.reason == "Expired"
    await harness.wait_for(PodDeleted, lambda d: d.uid == second.uid, topic=topics.PODS)
    [bound] = await harness.wait_for(Binding, lambda b: b.uid == plain.uid, timeout=60)
    assert bound.node == node.name
    assert harness.seen(Binding, lambda b: b.uid == plain.uid and b.node != node.name) == []
