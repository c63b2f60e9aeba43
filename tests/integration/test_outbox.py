"""The outbox through the real broker: one message per destination partition and origin,
each small enough for Kafka, and the origin in the headers."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.intake import origin_from_headers
from agents.ports import Origin, Output
from schemas import topics
from schemas.codec import decode_message
from schemas.records import Pod
from streams import outbox as outbox_module
from streams.catalogue import partition_for
from tests.builders import make_pod
from tests.integration.harness import PARTITIONS, Harness

pytestmark = pytest.mark.integration


async def test_batches_by_partition_and_origin_within_the_size_limit(
        harness: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox_module, "MAX_MESSAGE_BYTES", 4000)
    pods = [make_pod(f"ob-{run_id}-{i}", labels={"filler": "x" * 200}) for i in range(40)]
    origin = Origin(f"test-outbox-{run_id}/0", 1)
    outputs = [Output(topics.PODS, p.uid, p) for p in pods] + [Output(topics.PODS, pods[0].uid, pods[0], origin)]
    await harness.producer.flush(await harness.producer.outbox.send(outputs))

    consumer = AIOKafkaConsumer(bootstrap_servers=harness.bootstrap, group_id=None)
    await consumer.start()
    messages = []
    try:
        tps = [TopicPartition(topics.PODS, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning()
        ends = await consumer.end_offsets(tps)
        while any([await consumer.position(tp) < end for tp, end in ends.items()]):
            for msgs in (await consumer.getmany(timeout_ms=1000)).values():
                messages += msgs
    finally:
        await consumer.stop()
    seen = []
    for m in messages:
        records = [r for r in decode_message(m.value) if isinstance(r, Pod) and r.uid.startswith(f"ob-{run_id}")]
        if not records:
            continue
        assert len(m.value) <= 4000
        assert all(partition_for(r.uid, PARTITIONS) == m.partition for r in records)
        seen += [(r.uid, origin_from_headers(m.headers)) for r in records]
    assert sorted(seen, key=str) == sorted([(p.uid, None) for p in pods] + [(pods[0].uid, origin)], key=str)
