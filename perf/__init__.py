"""Measuring koordstream from the outside: workload generators, the collector that reads
what the agents published, the independent consistency checker, and the demo run."""
