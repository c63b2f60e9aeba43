"""Placement: the schedulers' read replica of the cluster (`replica`), the queue and
placement core (`core`), and the faust agent that runs them (`agent`)."""
