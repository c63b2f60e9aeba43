"""Owners and deciders forget deleted pods a retention later, by the log times of the records
they read on the real broker: the deciders' changelog ends each deleted pod's key with a
tombstone, and the node's last state (its head and its entries, as compaction keeps them)
holds neither the terminated holds nor their tombstones, while the pods that still run stay."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.adapters.owners import OwnerCore
from agents.adapters.tables import ChangelogImage
from schemas import topics
from schemas.partitioner import partition_for
from schemas.records import Binding, Node, NodeStateChange, Pod, PodDeleted, ResourceList
from streams.catalogue import TABLE_NODE_STATE, TABLE_POD_LEDGER
from streams.process import spawn_tied, stop
from tests.integration.harness import PARTITIONS, Harness
from tests.integration.test_restart import WORKER, Broker, worker_env

# In `make e2e` (about 40 s for both brokers, beyond `make test`'s 10 minutes).
pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.e2e]
RETENTION_S = 3.0


async def last_values(bootstrap: str, topic: str, idle_s: float = 2.0) -> dict[bytes, dict | None]:
    """Every key's last value in a changelog (None: a tombstone), read committed."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                isolation_level="read_committed")
    await consumer.start()
    out: dict[bytes, dict | None] = {}
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        last = time.monotonic()
        while time.monotonic() - last < idle_s:
            for msgs in (await consumer.getmany(timeout_ms=200)).values():
                for m in msgs:
                    last = time.monotonic()
                    out[m.key] = orjson.loads(m.value) if m.value is not None else None
    finally:
        await consumer.stop()
    return out


def uids_in_every_partition(prefix: str, per_partition: int) -> list[str]:
    """Pod uids whose decision keys (their uids) fall in every `holds` partition."""
    out: list[str] = []
    counts = dict.fromkeys(range(PARTITIONS), 0)
    i = 0
    while min(counts.values()) < per_partition:
        uid = f"{prefix}-{i}"
        p = partition_for(uid, PARTITIONS)
        if counts[p] < per_partition:
            counts[p] += 1
            out.append(uid)
        i += 1
    return out


async def test_deleted_pods_leave_the_owners_and_deciders_a_retention_later(broker_factory: Callable[[], Broker]) -> None:
    async with broker_factory() as broker:
        env = await worker_env(broker, KOORDSTREAM_WORKER_STATE_RETENTION_S=str(RETENTION_S))
        proc = spawn_tied(WORKER, env=env)
        try:
            async with Harness(broker.bootstrap) as h:
                await h.publish(topics.NODES, [Node(name="m0", allocatable=ResourceList(cpu=64_000, memory=2**36))])
                await h.wait_for(NodeStateChange, lambda c: c.node == "m0", timeout=90)
                gone = uids_in_every_partition("gone", 3)
                await h.publish(topics.PODS, [Pod(uid=u, name=u, requests=ResourceList(cpu=100)) for u in gone])
                await h.wait_for(Binding, lambda b: b.uid.startswith("gone-"), count=len(gone), timeout=60)
                await h.publish(topics.PODS, [PodDeleted(uid=u, name=u) for u in gone])
                await h.wait_for(NodeStateChange, lambda c: any(s == "terminated" for s in c.holds.values()),
                                 timeout=30)
                await asyncio.sleep(RETENTION_S + 1.0)  # log time: the broker's clock must pass the retention
                # Later traffic on every partition: the owners and deciders forget in their runs.
                stay = uids_in_every_partition("stay", 2)
                await h.publish(topics.PODS, [Pod(uid=u, name=u, requests=ResourceList(cpu=100)) for u in stay])
                await h.wait_for(Binding, lambda b: b.uid.startswith("stay-"), count=len(stay), timeout=60)
                await asyncio.sleep(1.0)  # the changelog writes of the batches that bound them

            ledger = await last_values(broker.bootstrap, f"koordstream-{TABLE_POD_LEDGER}-changelog")
            kept = sorted(u for u in gone if ledger.get(u.encode()) is not None)
            assert kept == [], f"deleted pods the deciders still keep a retention later: {kept}"
            assert all(ledger.get(u.encode()) is not None for u in stay)
            node = await last_values(broker.bootstrap, f"koordstream-{TABLE_NODE_STATE}-changelog")
            image = ChangelogImage(TABLE_NODE_STATE, OwnerCore.split)  # what compaction keeps, assembled
            image.apply([(key, value, 0) for key, value in node.items()])
            state = image.data.get(b"m0")
            assert state is not None
            holds = state["state"]["holds"]
            assert sorted(h.split("/")[0] for h in holds) == sorted(stay), holds
            assert not state["state"]["tombstones"]
        finally:
            stop(proc, deadline_s=10)
