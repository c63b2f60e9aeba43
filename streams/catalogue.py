"""The topic catalogue: every topic's name, key, partitions and compaction, in one place.

The partitioner rule: keys are UTF-8 strings, routed by Kafka's default partitioner
(murmur2 of the key bytes, positive, modulo the partition count), so a key lands on the same
partition whoever writes it: our producers, faust's changelogs (tables use the partitioner),
and Kafka clients in other languages.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from schemas import topics


@dataclass(frozen=True)
class TopicSpec:
    name: str
    key: str
    partitions: int
    compacted: bool = False
    retention_ms: int | None = None
    doc: str = ""


TABLE_NODE_STATE = "node-state"
TABLE_POD_LEDGER = "pod-ledger"


def catalogue(partitions: int, app_id: str = "koordstream") -> dict[str, TopicSpec]:
    """All topics, including the changelogs of the agents' tables (co-partitioned with input)."""
    p = partitions
    specs = [
        TopicSpec(topics.NODES, "node name", p, compacted=True, doc="Node adds and updates, NodeDeleted"),
        TopicSpec(topics.PODS, "pod uid", p, doc="Pod adds, updates and PodDeleted"),
        TopicSpec(topics.SCALE_DOWN, "workload", p, doc="ScaleDownEvent"),
        TopicSpec(topics.NODE_INBOX, "node name", p, doc="everything that changes a node's state"),
        TopicSpec(topics.HOLDS, "decision key", p, doc="Held, Rejected, forwarded deletions"),
        TopicSpec(topics.BINDINGS, "pod uid", p, doc="Binding, written once per pod by its decider"),
        TopicSpec(topics.REQUEUE, "pod uid", p, doc="Requeue (partitioned like pods)"),
        TopicSpec(topics.FEEDBACK, "pod uid", p, doc="SchedulingFeedback"),
        TopicSpec(topics.EVICTIONS, "pod uid", p, doc="EvictionCommand"),
        TopicSpec(topics.RESERVATIONS, "reservation uid", p, doc="ReservationEvent (phase changes)"),
        TopicSpec(topics.PROFILING, "plugin", p, doc="ProfilingSample (plugin time per extension point) and AttemptsSample (attempts by result), each second"),
        TopicSpec(topics.STATE_CHANGES, "node name", p, doc="NodeStateChange, read by every scheduler"),
        TopicSpec(topics.DEAD_LETTER, "source topic", p, doc="DeadLetter envelopes"),
        TopicSpec(f"{app_id}-{TABLE_NODE_STATE}-changelog", "node name", p, compacted=True,
                  doc="changelog of the owners' table"),
        TopicSpec(f"{app_id}-{TABLE_POD_LEDGER}-changelog", "decision key", p, compacted=True,
                  doc="changelog of the deciders' table"),
    ]
    return {spec.name: spec for spec in specs}


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (the Java client's `Utils.murmur2`), as an unsigned 32-bit int."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length % 4
    index = length - tail
    if tail >= 3:
        h ^= data[index + 2] << 16
    if tail >= 2:
        h ^= data[index + 1] << 8
    if tail >= 1:
        h ^= data[index]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


@lru_cache(maxsize=1 << 17)
def partition_for(key: str, partitions: int) -> int:
    """The partition of `key` under Kafka's default partitioner (memoised: keys repeat)."""
    return (murmur2(key.encode("utf-8")) & 0x7FFFFFFF) % partitions
