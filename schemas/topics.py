"""Logical topic names, shared by the agents (which address outputs by name) and the
catalogue in `streams.catalogue` (which gives each its key, partitions and compaction)."""

NODES = "nodes"
PODS = "pods"
SCALE_DOWN = "scale-down"
NODE_INBOX = "node-inbox"
HOLDS = "holds"
BINDINGS = "bindings"
REQUEUE = "requeue"
FEEDBACK = "feedback"
EVICTIONS = "evictions"
STATE_CHANGES = "state-changes"
DEAD_LETTER = "dead-letter"
