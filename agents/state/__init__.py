"""Cluster state: node owners (`owner`), the pod ledger and its deciders (`ledger`), the
resource index (`resources`), and the faust agents that run them (`agent_*`)."""
