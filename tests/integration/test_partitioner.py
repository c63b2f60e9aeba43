"""Pods a producer put on partitions their uid does not hash to (librdkafka's default
partitioner is `consistent_random`, not murmur2): each is forwarded to its own partition of
`pods`, bound exactly once, and its Requeue reaches the replica that owns it (DESIGN.md,
safety rule 11)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas import topics
from schemas.codec import decode_message, encode_batch
from schemas.records import Binding, Claim, Node, NodeStateChange, Pod, Requeue, ResourceList
from streams.catalogue import partition_for
from tests.integration.harness import PARTITIONS, Harness

pytestmark = pytest.mark.integration
GANG = "gang.scheduling.koordinator.sh/"


def astray(uid: str) -> int:
    """A partition of `pods` that is not the uid's murmur2 partition."""
    return (partition_for(uid, PARTITIONS) + 1) % PARTITIONS


async def partitions_holding(bootstrap: str, uids: set[str]) -> dict[str, set[int]]:
    """For each uid, the partitions of `pods` that hold a record of it."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topics.PODS, p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        found: dict[str, set[int]] = {}
        for _ in range(10):
            batches = await consumer.getmany(timeout_ms=1000, max_records=100000)
            for tp, messages in batches.items():
                for m in messages:
                    for r in decode_message(m.value):
                        uid = getattr(r, "uid", None)
                        if uid in uids:
                            found.setdefault(uid, set()).add(tp.partition)
            if not batches:
                break
        return found
    finally:
        await consumer.stop()


async def test_pods_on_the_wrong_partitions_are_bound_once_and_their_requeues_find_them(
        harness: Harness, run_id: str) -> None:
    gang_label, plain_label = {"suite": f"astray-gang-{run_id}"}, {"suite": f"astray-plain-{run_id}"}
    first = Node(name=f"astray-{run_id}-g1", labels=gang_label, allocatable=ResourceList(cpu=1000, memory=2**32))
    roomy = Node(name=f"astray-{run_id}-p", labels=plain_label, allocatable=ResourceList(cpu=8000, memory=2**34))
    await harness.publish(topics.NODES, [first, roomy])
    await harness.wait_for(NodeStateChange, lambda c: c.node in (first.name, roomy.name), count=2)
    # A gang of two with room for one: its held member is released and requeued when the gang's
    # waiting time runs out (a Requeue keyed by uid, on the uid's murmur2 partition).
    gang = {GANG + "name": f"astray-{run_id}", GANG + "min-available": "2", GANG + "waiting-time": "2s"}
    members = [Pod(uid=f"astray-{run_id}-m{i}", name=f"m{i}", annotations=gang, node_selector=gang_label,
                   requests=ResourceList(cpu=1000)) for i in range(2)]
    plain = [Pod(uid=f"astray-{run_id}-s{i}", name=f"s{i}", node_selector=plain_label,
                 requests=ResourceList(cpu=100)) for i in range(6)]
    pods = members + plain
    uids = {p.uid for p in pods}
    for pod in pods:  # as a confluent-kafka producer without partitioner=murmur2_random would
        await harness.producer.send_raw(topics.PODS, encode_batch([pod]), key=pod.uid.encode(),
                                        partition=astray(pod.uid))
    member_uids = {m.uid for m in members}
    [requeue, *_] = await harness.wait_for(Requeue, lambda r: r.uid in member_uids, topic=topics.REQUEUE,
                                           timeout=90)
    # The Requeue reached the replica that schedules the pod: it claims it again, next attempt.
    await harness.wait_for(Claim, lambda c: c.uid == requeue.uid and c.attempt == requeue.attempt,
                           topic=topics.NODE_INBOX, timeout=60)
    second = Node(name=f"astray-{run_id}-g2", labels=gang_label, allocatable=ResourceList(cpu=1000, memory=2**32))
    await harness.publish(topics.NODES, [second])
    await harness.wait_for(Binding, lambda b: b.uid in uids, count=len(uids), timeout=120)
    await asyncio.sleep(1.0)  # a second Binding of any pod would show up by now
    bound = Counter(b.uid for b in harness.seen(Binding, lambda b: b.uid in uids))
    assert bound == Counter(uids), bound  # every pod bound, exactly once
    nodes = {b.uid: b.node for b in harness.seen(Binding, lambda b: b.uid in uids)}
    assert {nodes[m.uid] for m in members} == {first.name, second.name}
    # Each pod was forwarded to its own partition of `pods` (where its Requeues go).
    held = await partitions_holding(harness.bootstrap, uids)
    for uid in uids:
        assert held.get(uid) == {astray(uid), partition_for(uid, PARTITIONS)}, (uid, held.get(uid))
