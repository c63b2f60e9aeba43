"""The adapters: every line of faust, mode and aiokafka code under `agents/` lives here.

The decision cores (`agents.state`, `agents.scheduler`) are pure; this package runs them on
Kafka through faust-streaming and aiokafka, and `streams.app` wires it (`.importlinter` keeps
every other module of `agents` from importing faust, mode or aiokafka, and everything but
`streams` from importing this package):

- `batches`: micro-batches from a faust stream, split per input partition and the consumer
  group generation they were fetched in;
- `ownership`: which input partitions this worker owns, and since which generation;
- `tables`: versioned faust tables whose changelog the agents write themselves;
- `timers`: timers whose firing is a record, re-armed whenever a partition is assigned;
- `loop`: the one batch loop of the stateful agents (owners and deciders), parametrised by
  the core and its grouping key;
- `transactions`: the transactional sink (Apache Kafka: a batch is one transaction per input
  partition) and the plain one (Tansu: deliver, await acknowledgements, then commit offsets);
- `recovery`: a faust table manager whose restore ends at each changelog's last record as read
  from the partition (committed records only under transactions);
- `owners`, `deciders`, `scheduler`: the faust registration of each agent;
- `connection`: how every Kafka client connects (address, SASL, TLS), the one maker of
  aiokafka clients and of faust's broker credentials.
"""
