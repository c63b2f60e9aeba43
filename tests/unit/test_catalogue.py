"""The partitioner rule equals Kafka's default partitioner; the catalogue is consistent."""

from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from schemas import topics
from streams.catalogue import catalogue, murmur2, partition_for


@given(st.binary(max_size=64))
def test_murmur2_matches_the_kafka_client(data: bytes) -> None:
    assert murmur2(data) & 0x7FFFFFFF == aiokafka_murmur2(data) & 0x7FFFFFFF


def test_known_java_client_values() -> None:
    # Kafka's own test vectors (UtilsTest.testMurmur2) as signed ints.
    for text, signed in [("21", -973932308), ("foobar", -790332482), ("a-little-bit-long-string", -985981536)]:
        assert murmur2(text.encode()) == signed & 0xFFFFFFFF


def test_co_partitioned_topics_share_partition_counts() -> None:
    cat = catalogue(6, "app")
    assert cat[topics.PODS].partitions == cat[topics.REQUEUE].partitions
    assert cat[topics.NODE_INBOX].partitions == cat["app-node-state-changelog"].partitions
    assert cat[topics.HOLDS].partitions == cat["app-pod-ledger-changelog"].partitions
    assert cat[topics.NODES].compacted
    assert 0 <= partition_for("node-1", 6) < 6

