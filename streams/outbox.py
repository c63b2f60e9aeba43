"""Routing of the cores' outputs: one message per destination partition per batch.

Outputs are grouped by (topic, partition under the catalogue's partitioner rule, origin) and
each group is produced as one batch message, its origin in the headers, chunked to keep
messages small, with `partition` set explicitly. On a compacted topic (`nodes`) every message
carries one key (Kafka refuses a message without key there, and compaction keeps the last
message per key), so its groups are split by key. The same code serves the agents (faust's producer) and outside publishers
(aiokafka), so the rule is applied identically everywhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence

from agents.intake import origin_headers
from agents.ports import Origin, Output
from schemas.codec import encode_batch
from streams.catalogue import catalogue, partition_for

Headers = list[tuple[str, bytes]]
SendFn = Callable[[str, bytes | None, bytes, int, Headers | None], Awaitable[Awaitable[object]]]
MAX_RECORDS_PER_MESSAGE = 500
MAX_MESSAGE_BYTES = 512 * 1024  # well under Kafka's default message.max.bytes (1 MiB)


def compacted_topics(partitions: int) -> frozenset[str]:
    return frozenset(spec.name for spec in catalogue(partitions).values() if spec.compacted)


class PartitionedOutbox:
    def __init__(self, send: SendFn, partitions: int, keyed: Collection[str] | None = None,
                 batched: bool = True) -> None:
        self._send = send
        self.partitions = partitions
        self.batched = batched  # kafka.record_batches
        self.keyed = frozenset(compacted_topics(partitions) if keyed is None else keyed)  # one key per message

    def group(self, outputs: Sequence[Output]) -> dict[tuple[str, int, Origin | None, str], list[Output]]:
        groups: dict[tuple[str, int, Origin | None, str], list[Output]] = {}
        keyed = self.keyed
        for out in outputs:
            key = out.key if out.topic in keyed else ""
            groups.setdefault((out.topic, partition_for(out.key, self.partitions), out.origin, key), []).append(out)
        return groups

    async def send(self, outputs: Sequence[Output]) -> list[Awaitable[object]]:
        """Produce `outputs`; the returned awaitables resolve when the broker acknowledged."""
        futures: list[Awaitable[object]] = []
        for (topic, partition, origin, _), group in self.group(outputs).items():
            headers = origin_headers(origin) if origin is not None else None
            for start in range(0, len(group), MAX_RECORDS_PER_MESSAGE):
                for chunk, value in self._messages(group[start:start + MAX_RECORDS_PER_MESSAGE]):
                    keys = {o.key for o in chunk}
                    key = chunk[0].key.encode() if len(keys) == 1 else None
                    futures.append(await self._send(topic, key, value, partition, headers))
        return futures

    def _messages(self, chunk: Sequence[Output]) -> list[tuple[Sequence[Output], bytes]]:
        """Encoded batches of at most MAX_MESSAGE_BYTES (halving a chunk that is larger)."""
        value = encode_batch((o.record for o in chunk), self.batched)
        if len(value) <= MAX_MESSAGE_BYTES or len(chunk) == 1:
            return [(chunk, value)]
        middle = len(chunk) // 2
        return self._messages(chunk[:middle]) + self._messages(chunk[middle:])
