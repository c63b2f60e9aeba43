"""The decision logic and the thin faust agents that run it.

`state/` holds the node owners (capacity, holds, nominations per node) and the deciders (the
pod ledger); `scheduler/` the read replica of the cluster and the placement core. Modules whose
names start with `agent` wire a core to faust; everything else is pure (no Kafka, no clock it
was not given) and is used directly by tests, benchmarks and the perf harness.
"""
