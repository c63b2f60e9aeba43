"""Which partitions of one input topic this worker owns, and in which group generation.

A rebalance starts with the revocation of every partition (faust's eager protocol) and ends
with an assignment stamped with the new generation. A run of messages fetched in generation G
of partition P is processed only while this worker owns P in G: a run fetched before a
rebalance, or still in hand while one is under way, is dropped (not written, not delivered,
its offsets never committed) and read again by whoever owns P afterwards. A partition whose
transactional producer was fenced is lost at once (someone else owns it now).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

log = logging.getLogger("koordstream.ownership")


class TopicPartitionLike(Protocol):
    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...


class Ownership:
    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.owned: dict[int, int] = {}  # partition -> the generation it was assigned in
        self.dropped = 0  # messages dropped because they were fetched under another assignment

    def mine(self, tps: Iterable[TopicPartitionLike]) -> set[int]:
        return {tp.partition for tp in tps if tp.topic == self.topic}

    def revoke(self, tps: Iterable[TopicPartitionLike]) -> set[int]:
        """Partitions revoked (a rebalance started): nothing fetched before is processed."""
        gone = self.mine(tps) & set(self.owned)
        for partition in gone:
            del self.owned[partition]
        return gone

    def assign(self, tps: Iterable[TopicPartitionLike], generation: int) -> set[int]:
        """The assignment of `generation` (every partition we hold now, kept or new)."""
        partitions = self.mine(tps)
        self.owned = {p: generation for p in partitions}
        return partitions

    def lose(self, partition: int) -> None:
        """Someone else owns `partition` (our producer was fenced): stop processing it."""
        if self.owned.pop(partition, None) is not None:
            log.warning("%s/%s: lost to another worker; its batches are dropped until it is assigned again",
                        self.topic, partition)

    def owns(self, partition: int, generation: int) -> bool:
        return self.owned.get(partition) == generation

    @property
    def partitions(self) -> set[int]:
        return set(self.owned)
