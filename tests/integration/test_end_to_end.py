"""Through the real broker and the real agents: pods in, bindings out, checked independently."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from perf.checker import Placement, check
from perf.workload import make_nodes, make_pods
from schemas import topics
from schemas.records import (
    Binding,
    Claim,
    DeadLetter,
    Node,
    NodeDeleted,
    NodeStateChange,
    Pod,
    PodDeleted,
    Rejected,
    Requeue,
    ResourceList,
    SchedulingFeedback,
)
from streams.catalogue import TABLE_NODE_STATE, partition_for
from streams.settings import load_settings
from tests.integration.harness import PARTITIONS, Harness

pytestmark = pytest.mark.integration


async def test_every_pod_bound_once_and_no_node_overcommitted(harness: Harness, run_id: str) -> None:
    nodes = make_nodes(20, prefix=f"e2e-{run_id}", pods=30)  # room for every pod
    pods = make_pods(300, prefix=f"e2e-{run_id}", seed=7)
    await harness.publish(topics.NODES, nodes)
    names = {n.name for n in nodes}
    await harness.wait_for(NodeStateChange, lambda r: r.node in names, count=20)
    await harness.publish(topics.PODS, pods)
    uids = {p.uid for p in pods}
    await harness.wait_for(Binding, lambda b: b.uid in uids, count=len(pods))
    bindings = harness.seen(Binding, lambda b: b.uid in uids)
    # The nodes they name, as `nodes` has them (the pods may go to other tests' nodes of the
    # shared session, and this test's collector reads `nodes` from its start: it may not have
    # read that far yet, and a node it has not read counts as having nothing).
    named = {b.node for b in bindings}
    await harness.wait_for(Node, lambda n: n.name in named, count=len(named), topic=topics.NODES,
                           distinct=lambda n: n.name)
    result = check(harness.allocatable(), {p.uid: p.requests for p in pods},
                   [Placement(i, b.uid, b.node) for i, b in enumerate(bindings)])
    assert result.pods_bound == 300 and result.consistent, result.overcommitted


async def test_table_changelogs_are_co_partitioned_with_their_inputs(harness: Harness, run_id: str) -> None:
    """A node's changelog record sits in the partition number of its node-inbox records, so
    the two move together on a rebalance (DESIGN.md, safety rule 3)."""
    node = Node(name=f"copart-{run_id}", allocatable=ResourceList(cpu=1000))
    await harness.publish(topics.NODES, [node])
    await harness.wait_for(NodeStateChange, lambda c: c.node == node.name)
    changelog = f"{load_settings(env={}).kafka.app_id}-{TABLE_NODE_STATE}-changelog"
    consumer = AIOKafkaConsumer(bootstrap_servers=harness.bootstrap, group_id=None)
    await consumer.start()
    mine: list[int] = []
    try:
        tps = [TopicPartition(changelog, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning()
        ends = await consumer.end_offsets(tps)
        # One fetch may answer for some partitions only: read each to where it ended.
        for _ in range(100):
            batches = await consumer.getmany(timeout_ms=200, max_records=100000)
            mine += [m.partition for msgs in batches.values() for m in msgs if m.key == node.name.encode()]
            if all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                break
    finally:
        await consumer.stop()
    assert mine, "the owner wrote no changelog record for the node"
    assert set(mine) == {partition_for(node.name, PARTITIONS)}


async def test_pods_beyond_capacity_get_feedback_and_fit_once_room_appears(harness: Harness, run_id: str) -> None:
    small = Node(name=f"small-{run_id}", allocatable=ResourceList(cpu=1000, memory=2**30))
    await harness.publish(topics.NODES, [small])
    big = Pod(uid=f"big-{run_id}", name="big", requests=ResourceList(cpu=64000, memory=2**30))
    odd = Pod(uid=f"odd-{run_id}", name="odd", requests=ResourceList({"example.com/fpga": 1}))
    await harness.publish(topics.PODS, [big, odd])
    feedback = (await harness.wait_for(SchedulingFeedback, lambda f: f.uid == odd.uid))[0]
    assert feedback.final and "example.com/fpga" in feedback.message
    feedback = (await harness.wait_for(SchedulingFeedback, lambda f: f.uid == big.uid))[0]
    assert not feedback.final and feedback.reasons.get("Insufficient cpu", 0) >= 1
    roomy = Node(name=f"roomy-{run_id}", allocatable=ResourceList(cpu=128000, memory=2**40))
    await harness.publish(topics.NODES, [roomy])
    [binding] = await harness.wait_for(Binding, lambda b: b.uid == big.uid)
    assert binding.node == roomy.name


async def test_claim_for_a_vanished_node_is_rejected_and_requeued_not_dead_lettered(harness: Harness, run_id: str) -> None:
    ghost = f"ghost-{run_id}"
    claim = Claim(uid=f"lost-{run_id}", attempt=0, node=ghost, decision_key=f"lost-{run_id}",
                  requests=ResourceList(cpu=100, pods=1))
    await harness.publish(topics.NODE_INBOX, [claim])
    rejected = (await harness.wait_for(Rejected, lambda r: r.node == ghost))[0]
    assert rejected.reason == "node not found"
    [requeue] = await harness.wait_for(Requeue, lambda r: r.uid == claim.uid)
    assert requeue.attempt == 1 and ghost in requeue.reason
    assert not harness.seen(DeadLetter, lambda d: ghost in d.value)


async def test_deleted_node_rejects_new_claims_and_pods_go_elsewhere(harness: Harness, run_id: str) -> None:
    doomed = Node(name=f"doomed-{run_id}", uid=f"doomed-{run_id}-1", allocatable=ResourceList(cpu=8000, memory=2**34))
    await harness.publish(topics.NODES, [doomed])
    await harness.wait_for(NodeStateChange, lambda c: c.node == doomed.name)
    await harness.publish(topics.NODES, [NodeDeleted(name=doomed.name, uid=doomed.uid)])
    await harness.wait_for(NodeStateChange, lambda c: c.node == doomed.name and c.deleted)
    safe = Node(name=f"safe-{run_id}", allocatable=ResourceList(cpu=2000, memory=2**32))
    await harness.publish(topics.NODES, [safe])
    pod = Pod(uid=f"mover-{run_id}", name="mover", requests=ResourceList(cpu=1000))
    await harness.publish(topics.PODS, [pod])
    [binding] = await harness.wait_for(Binding, lambda b: b.uid == pod.uid)
    assert binding.node != doomed.name


async def test_deleting_a_bound_pod_frees_its_capacity_at_its_owner(harness: Harness, run_id: str) -> None:
    node = Node(name=f"one-{run_id}", allocatable=ResourceList(cpu=1000, memory=2**32))
    await harness.publish(topics.NODES, [node])
    await harness.wait_for(NodeStateChange, lambda c: c.node == node.name)
    pod = Pod(uid=f"gone-{run_id}", name="gone", requests=ResourceList(cpu=900), scheduler_name="koordstream")
    await harness.publish(topics.PODS, [pod])
    [b] = await harness.wait_for(Binding, lambda b: b.uid == pod.uid)

    def touched(status: str):
        return lambda c: c.node == b.node and any(h.startswith(f"{pod.uid}/") and s == status for h, s in c.holds.items())

    committed = (await harness.wait_for(NodeStateChange, touched("committed")))[0]
    await harness.publish(topics.PODS, [PodDeleted(uid=pod.uid, name="gone")])
    terminated = (await harness.wait_for(NodeStateChange, touched("terminated")))[0]
    assert terminated.used.get("cpu", 0) == committed.used["cpu"] - 900
