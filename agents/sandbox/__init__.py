"""The sandbox pipeline for AI agents (DESIGN.md, capability 2): the decision core (pure: no
faust, aiokafka, Kubernetes client or `streams`).

- `runtimes`: the runtime classes a worker knows (gVisor, Kata, Wasm by default; `sandbox.runtimes`
  overrides them) and the admission every pod naming one goes through before it is queued:
  the class's overhead, node selector and tolerations, and the Koordinator QoS classes it allows.
- `feedback`: for a sandbox that cannot be placed, the hint beside kube-scheduler's message:
  a reason, the next step, when to retry, and alternatives each checked through the
  scheduling core.
- `templates`: template hashes, the uids that name a pool, validation, the pods and
  reservations a pool publishes.
- `pool`: the warm pool's core (one writer per pool: adoption, refill, lifecycles, bursts);
  its agent is `agents.adapters.sandbox`.
"""
