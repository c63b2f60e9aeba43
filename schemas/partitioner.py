"""The partitioner rule every koordstream client follows (DESIGN.md, "Topics and keys").

Keys are UTF-8 strings, routed by Kafka's default partitioner: murmur2 of the key bytes, made
positive, modulo the topic's partition count. It is the Java client's default and aiokafka's;
librdkafka (confluent-kafka, kcat, the Go and .NET clients) defaults to `consistent_random`
(CRC32) and needs `partitioner=murmur2_random` to agree. A key lands on the same partition
whoever writes it: our producers, faust's changelogs (tables use the partitioner), and
clients in other languages. Here in `schemas` (stdlib only) so that the agents, which may
not import `streams`, can check where a record belongs.
"""

from __future__ import annotations

import struct
from functools import lru_cache


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (the Java client's `Utils.murmur2`), as an unsigned 32-bit int."""
    m = 0x5BD1E995
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for k in struct.unpack_from(f"<{length >> 2}I", data):  # the 4-byte words, little-endian
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        h = ((h * m) & 0xFFFFFFFF) ^ ((k * m) & 0xFFFFFFFF)
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
