"""The partitioner rule equals Kafka's default partitioner; the catalogue is consistent."""

from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from schemas import topics
from streams.catalogue import TopicSpec, catalogue, murmur2, partition_for


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



def test_compacted_topics_roll_and_clean_within_a_run() -> None:
    cat = catalogue(4, "app")
    compacted = {name for name, spec in cat.items() if spec.compacted}
    assert compacted == {topics.NODES, topics.MIGRATIONS, topics.DISRUPTION_BUDGETS, "app-node-state-changelog",
                         "app-pod-ledger-changelog", "app-sandbox-pools-changelog"}
    for name in compacted:
        configs = cat[name].configs()
        assert configs["cleanup.policy"] == "compact"
        assert int(configs["segment.ms"]) <= 30_000  # a segment closes, so it can be compacted, within a run
        assert 1024 * 1024 <= int(configs["segment.bytes"]) <= 64 * 1024 * 1024  # Kafka 4's minimum is 1 MiB
        assert 0 < float(configs["min.cleanable.dirty.ratio"]) <= 0.5
        assert int(configs["min.compaction.lag.ms"]) == 0
        assert int(configs["delete.retention.ms"]) >= 10_000  # a lagging reader still sees the tombstones
    assert cat[topics.PODS].configs() == {"cleanup.policy": "delete"}  # the broker's defaults otherwise


def test_topic_configs_carry_every_setting_given_as_kafka_strings() -> None:
    spec = TopicSpec("t", "k", 2, retention_ms=3_600_000, segment_ms=5000, segment_bytes=2 ** 20,
                     min_compaction_lag_ms=100, delete_retention_ms=1000, min_cleanable_dirty_ratio=0.25)
    assert spec.configs() == {"cleanup.policy": "delete", "retention.ms": "3600000", "segment.ms": "5000",
                              "segment.bytes": "1048576", "min.compaction.lag.ms": "100",
                              "delete.retention.ms": "1000", "min.cleanable.dirty.ratio": "0.25"}
