"""The sandbox pipeline for AI agents (DESIGN.md, capability 2): a pure core.

- `templates`: template hashes, the uids that name a pool, validation, the pods and
  reservations a pool publishes.
- `pool`: the warm pool's core (one writer per pool: adoption, refill, lifecycles, bursts).
"""
