"""The Kubernetes bridge: the API server's objects into koordstream's topics, and koordstream's
decisions back into API calls (docs/architecture.md, "The Kubernetes bridge").

- `mirror`: what the watched objects mean as records (pure: objects in, outputs out);
- `reflector`: list + watch of one resource, relisting on 410 Gone, in micro-batches;
- `sandboxes`: agent-sandbox's templates, warm pools and claims (pure), the pools' sandbox pods;
- `actuator`: Bindings, evictions, feedback, deletion costs, reservation status, sandbox pods
  and claims' status as calls;
- `lease`: leader election on a coordination.k8s.io Lease, so one bridge writes at a time;
- `service`: the bridge process that wires them to Kafka (`koordstream bridge`).
"""
