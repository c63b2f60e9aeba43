"""Everything that touches Kafka: the topic catalogue and partitioner rule, topic creation,
the embedded Tansu broker, settings, the faust app and worker, the outbox that routes the
cores' outputs, the schedulers' replica feed, and the producer API for outside publishers."""
