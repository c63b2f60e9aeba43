"""The topic catalogue: every topic's name, key, partitions and compaction, in one place.

The partitioner rule: keys are UTF-8 strings, routed by Kafka's default partitioner
(murmur2 of the key bytes, positive, modulo the partition count), so a key lands on the same
partition whoever writes it: our producers, faust's changelogs (tables use the partitioner),
and Kafka clients in other languages.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas import topics
from schemas.partitioner import murmur2 as murmur2  # re-exported: the rule lives in schemas
from schemas.partitioner import partition_for as partition_for

# The compacted topics (nodes, the tables' changelogs) keep the last record of each key. A
# broker compacts only closed segments whose share of superseded records is high enough, so
# these segments roll after 10 s (or 16 MiB) and are cleaned once a tenth of them is dirty:
# compaction happens within a run, and a restarting worker restores its table from a short
# log. Tombstones stay a minute after compaction so a reader that is behind still sees them.
COMPACTED_SEGMENT_MS = 10_000
COMPACTED_SEGMENT_BYTES = 16 * 1024 * 1024
COMPACTED_DIRTY_RATIO = 0.1
TOMBSTONE_RETENTION_MS = 60_000


@dataclass(frozen=True)
class TopicSpec:
    """One topic: its name, what its key is, its partition count and its log settings.

    The log settings go to the broker as topic configs (`configs()`); None leaves the broker's
    default. `compacted` selects `cleanup.policy=compact` (else `delete`, with `retention_ms`).
    """

    name: str
    key: str
    partitions: int
    compacted: bool = False
    retention_ms: int | None = None
    doc: str = ""
    segment_ms: int | None = None
    segment_bytes: int | None = None
    min_compaction_lag_ms: int | None = None
    delete_retention_ms: int | None = None
    min_cleanable_dirty_ratio: float | None = None

    def configs(self) -> dict[str, str]:
        """The topic configs to create this topic with (Kafka's names, string values)."""
        values: dict[str, int | float | None] = {
            "retention.ms": self.retention_ms,
            "segment.ms": self.segment_ms,
            "segment.bytes": self.segment_bytes,
            "min.compaction.lag.ms": self.min_compaction_lag_ms,
            "delete.retention.ms": self.delete_retention_ms,
            "min.cleanable.dirty.ratio": self.min_cleanable_dirty_ratio,
        }
        return {"cleanup.policy": "compact" if self.compacted else "delete",
                **{k: str(v) for k, v in values.items() if v is not None}}


def compacted(name: str, key: str, partitions: int, doc: str) -> TopicSpec:
    """A compacted topic whose compaction happens within a run (the settings above)."""
    return TopicSpec(name, key, partitions, compacted=True, doc=doc,
                     segment_ms=COMPACTED_SEGMENT_MS, segment_bytes=COMPACTED_SEGMENT_BYTES,
                     min_compaction_lag_ms=0, delete_retention_ms=TOMBSTONE_RETENTION_MS,
                     min_cleanable_dirty_ratio=COMPACTED_DIRTY_RATIO)


TABLE_NODE_STATE = "node-state"
TABLE_POD_LEDGER = "pod-ledger"
TABLE_SANDBOX_POOLS = "sandbox-pools"


def catalogue(partitions: int, app_id: str = "koordstream") -> dict[str, TopicSpec]:
    """All topics, including the changelogs of the agents' tables (co-partitioned with input)."""
    p = partitions
    specs = [
        compacted(topics.NODES, "node name", p, doc="Node adds and updates, NodeDeleted"),
        TopicSpec(topics.PODS, "pod uid", p, doc="Pod adds, updates and PodDeleted"),
        TopicSpec(topics.SCALE_DOWN, "workload", p, doc="ScaleDownEvent"),
        TopicSpec(topics.NODE_INBOX, "node name", p, doc="everything that changes a node's state"),
        TopicSpec(topics.HOLDS, "decision key", p, doc="Held, Rejected, forwarded deletions"),
        TopicSpec(topics.BINDINGS, "pod uid", p, doc="Binding, written once per pod by its decider"),
        TopicSpec(topics.REQUEUE, "pod uid", p, doc="Requeue (partitioned like pods)"),
        TopicSpec(topics.FEEDBACK, "pod uid", p, doc="SchedulingFeedback"),
        TopicSpec(topics.EVICTIONS, "pod uid", p, doc="EvictionCommand, EvictionRefused"),
        TopicSpec(topics.RESERVATIONS, "reservation uid", p, doc="ReservationEvent (phase changes)"),
        compacted(topics.MIGRATIONS, "migration job uid", p,
                  doc="MigrationJob: each ReservationFirst move's phase and reason, its latest version per job"),
        compacted(topics.DISRUPTION_BUDGETS, "budget uid (namespace/name)", p,
                  doc="PodDisruptionBudget: the budgets the rebalancer's evictions keep to"),
        TopicSpec(topics.PROFILING, "plugin", p, doc="ProfilingSample (plugin time per extension point) and AttemptsSample (attempts by result), each second"),
        TopicSpec(topics.STATE_CHANGES, "node name", p, doc="NodeStateChange, read by every scheduler"),
        TopicSpec(topics.DEAD_LETTER, "source topic", p, doc="DeadLetter envelopes"),
        TopicSpec(topics.SANDBOX, "warm pool name", p,
                  doc="SandboxWarmPool(Deleted), SandboxClaim(Deleted), SandboxBurst, SandboxTick, and the "
                      "Bindings and SchedulingFeedback of sandbox pods forwarded to their pool"),
        TopicSpec(topics.SANDBOX_STATUS, "claim uid (SandboxClaimStatus), pool name (SandboxPoolStatus)", p,
                  doc="the pools' answers: claims' statuses and pools' depth and counters"),
        compacted(f"{app_id}-{TABLE_NODE_STATE}-changelog", "node name", p, doc="changelog of the owners' table"),
        compacted(f"{app_id}-{TABLE_POD_LEDGER}-changelog", "decision key", p, doc="changelog of the deciders' table"),
        compacted(f"{app_id}-{TABLE_SANDBOX_POOLS}-changelog", "namespace/pool", p, doc="changelog of the pools' table"),
    ]
    return {spec.name: spec for spec in specs}
