"""A table's restore ends at its changelog's last record.

faust ends a restore at the end offset that ListOffsets answers. The embedded Tansu 0.6 answers
the base offset of the partition's last record *batch* plus one, and the agents write each
micro-batch's changelog records as one batch per partition: a worker that took a partition over
restored the first key of its predecessor's last batch and started deciding without the others
(holds and decisions lost: devices given twice), and a worker that kept a partition whose last
restore had read past that number crashed with faust's ConsistencyError.
`agents.adapters.recovery` reads where the partition really ends."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agents.adapters.positions import CommittedStart
from agents.adapters.recovery import last_record_offsets
from agents.state.owner import NodeOwner, NodeState, OwnerResult
from schemas import topics
from schemas.records import Held, Rejected
from streams.admin import ensure_topics
from streams.broker import EmbeddedBroker, wait_ready
from streams.catalogue import TABLE_NODE_STATE, TopicSpec, partition_for
from streams.kafka_broker import KafkaBroker
from streams.process import spawn_tied, stop
from streams.settings import load_settings
from streams.worker import prepare
from tests.builders import make_claim, make_node
from tests.integration.harness import PARTITIONS, Harness

pytestmark = pytest.mark.integration
WORKER = [sys.executable, "-m", "cli.main", "worker"]


async def write_batch(producer: AIOKafkaProducer, topic: str, partition: int, records: list[tuple[bytes, bytes]]) -> int:
    """`records` as one record batch; returns its base offset."""
    batch = producer.create_batch()
    for key, value in records:
        assert batch.append(key=key, value=value, timestamp=None) is not None
    metadata = await (await producer.send_batch(batch, topic, partition=partition))
    return int(metadata.offset)


async def write_three_batches(bootstrap: str, topic: str) -> list[int]:
    """Batches of 3, 1 and 2 records to partition 0 (the last batch holds several); their base
    offsets."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        return [await write_batch(producer, topic, 0, records)
                for records in ([(b"a", b"1"), (b"b", b"1"), (b"c", b"1")], [(b"a", b"2")], [(b"b", b"2"), (b"c", b"2")])]
    finally:
        await producer.stop()


@pytest.mark.kafka
@pytest.mark.parametrize("read_committed", [False, True])
async def test_the_last_record_of_a_partition_whose_last_batch_holds_several(bootstrap: str,
                                                                            read_committed: bool) -> None:
    topic = f"restore-end-{uuid.uuid4().hex[:8]}"
    await wait_ready(bootstrap)
    await ensure_topics(bootstrap, [TopicSpec(topic, "none", 1)])
    assert await write_three_batches(bootstrap, topic) == [0, 3, 4]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        listed = (await consumer.end_offsets([tp]))[tp]  # Apache Kafka: 6; Tansu 0.6: 5 (4 + 1)
    finally:
        await consumer.stop()
    assert listed in (5, 6)
    assert await last_record_offsets(bootstrap, {(topic, 0): listed}, read_committed) == {(topic, 0): 5}


@pytest.mark.kafka
@pytest.mark.parametrize("read_committed", [False, True])
async def test_the_schedulers_end_probe_finds_a_partitions_real_end(bootstrap: str, read_committed: bool) -> None:
    """`CommittedStart.end` (where a replica must read a `pods` partition to before it places
    its pods) from a fetch: 6 after batches of 3, 1 and 2 records, on either broker; 0 when
    empty."""
    topic = f"pods-end-{uuid.uuid4().hex[:8]}"
    await wait_ready(bootstrap)
    await ensure_topics(bootstrap, [TopicSpec(topic, "none", 2)])
    await write_three_batches(bootstrap, topic)
    probe = CommittedStart(bootstrap, None, read_committed)
    try:
        assert await probe.end(topic, 0) == 6
        assert await probe.end(topic, 1) == 0
        assert await probe(topic, 0) == 0  # the first record: the probe goes on working after it
    finally:
        await probe.close()


def nodes_in_partition(partition: int, count: int, run: str) -> list[str]:
    names = (f"restore-{run}-{i}" for i in range(10_000))
    return [name for name in names if partition_for(name, PARTITIONS) == partition][:count]


def owner_state(name: str) -> dict[str, object]:
    """A node's state at its owner once the owner has read the Node (the table's value)."""
    state = NodeState(name)
    NodeOwner().apply(state, [make_node(name, cpu=4000)], OwnerResult())
    return state.to_json()


async def test_a_state_worker_restores_every_key_of_the_last_changelog_batch(
        broker_factory: Callable[[], EmbeddedBroker | KafkaBroker], tmp_path: Path) -> None:
    """The owners' changelog of one partition ends with one batch of three nodes, as their
    previous owner left it; a new state worker must know all three when the claims come."""
    async with broker_factory() as broker:
        env = {**os.environ, "KOORDSTREAM_KAFKA_BOOTSTRAP": broker.bootstrap,
               "KOORDSTREAM_KAFKA_PARTITIONS": str(PARTITIONS), "KOORDSTREAM_WORKER_ROLES": "state"}
        await prepare(load_settings(env=env))
        partition = 1
        names = nodes_in_partition(partition, 3, uuid.uuid4().hex[:6])
        changelog = f"koordstream-{TABLE_NODE_STATE}-changelog"
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            await write_batch(producer, changelog, partition, [
                (name.encode(), orjson.dumps({"epoch": 0, "seq": 1, "state": owner_state(name)})) for name in names])
        finally:
            await producer.stop()
        log = tmp_path / "worker.log"
        with log.open("wb") as out:
            worker = spawn_tied(WORKER, env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                async with Harness(broker.bootstrap) as h:
                    claims = [make_claim(f"pod-{name}", node=name) for name in names]
                    await h.publish(topics.NODE_INBOX, claims)
                    # Generous: the worker must join its group and restore first; in one full suite
                    # run on a loaded machine the embedded variant answered nothing within 90 s.
                    deadline = asyncio.get_running_loop().time() + 240

                    def answered() -> set[str]:
                        return {r.uid for r in h.seen(Held)} | {r.uid for r in h.seen(Rejected)}

                    while answered() < {c.uid for c in claims}:
                        assert worker.poll() is None, log.read_text(errors="replace")
                        assert asyncio.get_running_loop().time() < deadline, f"answered: {answered()}"
                        await asyncio.sleep(0.1)
                    assert [(r.uid, r.reason) for r in h.seen(Rejected)] == []
                    assert {r.node for r in h.seen(Held)} == set(names)
            finally:
                stop(worker, 5)
