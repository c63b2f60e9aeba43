"""Routing of the cores' outputs: one message per destination partition per batch.

Outputs are grouped by (topic, partition under the catalogue's partitioner rule) and each
group is produced as one batch message, chunked to keep messages small, with `partition` set
explicitly. The same code serves the agents (faust's producer) and outside publishers
(aiokafka), so the rule is applied identically everywhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from agents.ports import Output
from schemas.codec import encode_batch
from streams.catalogue import partition_for

SendFn = Callable[[str, bytes | None, bytes, int], Awaitable[Awaitable[object]]]
MAX_RECORDS_PER_MESSAGE = 500


class PartitionedOutbox:
    def __init__(self, send: SendFn, partitions: int) -> None:
        self._send = send
        self.partitions = partitions

    def group(self, outputs: Sequence[Output]) -> dict[tuple[str, int], list[Output]]:
        groups: dict[tuple[str, int], list[Output]] = {}
        for out in outputs:
            groups.setdefault((out.topic, partition_for(out.key, self.partitions)), []).append(out)
        return groups

    async def send(self, outputs: Sequence[Output]) -> list[Awaitable[object]]:
        """Produce `outputs`; the returned awaitables resolve when the broker acknowledged."""
        futures: list[Awaitable[object]] = []
        for (topic, partition), group in self.group(outputs).items():
            for start in range(0, len(group), MAX_RECORDS_PER_MESSAGE):
                chunk = group[start:start + MAX_RECORDS_PER_MESSAGE]
                keys = {o.key for o in chunk}
                key = chunk[0].key.encode() if len(keys) == 1 else None
                value = encode_batch(o.record for o in chunk)
                futures.append(await self._send(topic, key, value, partition))
        return futures
