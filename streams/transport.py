"""faust's aiokafka transport with a configurable fetch wait (`koordstream://` broker URLs).

Why: faust hard-codes `fetch_max_wait_ms=1500` for its consumers. The embedded Tansu broker
answers a fetch only when that wait runs out (measured: ~450 ms per fetch with an idle
partition, ~3 ms with a 100 ms wait), even when data arrived earlier, so every hop of the
pipeline (pods -> scheduler -> owners -> deciders -> owners) paid it. This transport is the
stock one except that the worker consumer waits `FETCH_MAX_WAIT_MS` (set from
`kafka.fetch_max_wait_ms`); against a real Kafka, which answers as soon as data arrives, a
short wait only costs a few more idle fetch requests.

`koordstream-committed://` is the same transport whose consumer reads `read_committed` (records
of aborted transactions never reach the agents): the workers use it when they run with
transactions (`kafka.transactions`).
"""

from __future__ import annotations

from typing import Any

from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers import aiokafka as faust_aiokafka

SCHEME = "koordstream"
COMMITTED_SCHEME = "koordstream-committed"
FETCH_MAX_WAIT_MS = 20
COMPRESSION = "zstd"  # record batches the agents and publishers produce (aiokafka, through cramjam)
MAX_BATCH_BYTES = 1024 * 1024  # per partition per produce request (aiokafka's default: 16 KiB)


class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):  # type: ignore[misc]
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer


class Consumer(faust_aiokafka.Consumer):  # type: ignore[misc]
    def _new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(faust_aiokafka.Transport):  # type: ignore[misc]
    Consumer = Consumer


TRANSPORTS.aliases.setdefault(SCHEME, f"{__name__}:Transport")


class CommittedConsumerThread(ConsumerThread):
    """The worker's consumer reads committed records only (aborted transactions are skipped)."""

    def _create_worker_consumer(self, t: Any) -> Any:
        consumer = super()._create_worker_consumer(t)
        consumer._isolation_level = "read_committed"  # read by aiokafka when the consumer starts
        return consumer


class CommittedConsumer(Consumer):
    def _new_consumer_thread(self) -> CommittedConsumerThread:
        return CommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)


class CommittedTransport(Transport):
    Consumer = CommittedConsumer


TRANSPORTS.aliases.setdefault(COMMITTED_SCHEME, f"{__name__}:CommittedTransport")
