"""The warm pools as faust agents: the forwarder of their pods' outcomes, and the pools.

- **The forwarder** (stateless) reads `bindings` and `feedback` and sends the Binding or
  SchedulingFeedback of every sandbox pod to its pool's `sandbox` partition (the pool is named
  by the pod's uid, `agents.sandbox.templates.pool_of`; a message without such a uid in its
  bytes is not even decoded). At least once: the pool ignores what it already knows. A batch
  it cannot deliver is never acknowledged, and the worker stops (`forward`).
- **The pools** run `agents.sandbox.pool.PoolCore` in the shared loop
  (`agents.adapters.loop`) over `sandbox`, keyed by `namespace/pool` (the message key is the
  pool's name: records of one pool share a partition): one writer per pool. The claims'
  recorded answers (live and replaced) and the sandboxes are split fields of the table value
  (written entry by entry). A pool's ticks (refill rounds, shutdown times, bursts' ends) are
  timers on the event loop that append `SandboxTick` to the pool's partition; one is armed again
  for every pool that needs one after a restore (the ticks a pool asked for are not in its
  state: they died with the worker that armed them). A pool's key leaves the table once the
  pool is deleted and nothing of it is left to answer for (`PoolCore.empty`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import faust

from agents.adapters.loop import Outcome, StatefulLoop
from agents.adapters.stateful import Transactions, register_forwarder, register_stateful
from agents.adapters.tables import cached_state, read_state
from agents.adapters.timers import TimerRequest
from agents.intake import RawMessage, intake
from agents.ports import AgentConfig, Outbox, Output, deliver
from agents.sandbox.pool import POOL_KINDS, PoolCore, PoolResult, PoolState, ended_times, forget_at
from agents.sandbox.templates import UID_MARK, pool_of
from schemas import topics
from schemas.records import (
    Binding,
    PodDeleted,
    PodTerminated,
    Record,
    SandboxBurst,
    SandboxClaim,
    SandboxClaimDeleted,
    SandboxClaimStatus,
    SandboxPoolStatus,
    SandboxTick,
    SchedulingFeedback,
)

# The claim latency histogram's upper bounds (seconds): a warm claim answers in milliseconds,
# a cold one in a scheduling cycle or a few.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
log = logging.getLogger("koordstream.sandbox")


def pool_key_of(record: Record) -> str:
    """The table key (`namespace/pool`) of a record on `sandbox`."""
    if isinstance(record, (SandboxClaim, SandboxClaimDeleted, SandboxBurst)):
        return f"{record.namespace}/{record.warm_pool}"
    if isinstance(record, (Binding, SchedulingFeedback, PodDeleted, PodTerminated)):
        return pool_of(record.uid) or ""
    return f"{getattr(record, 'namespace', '')}/{getattr(record, 'name', '')}"


def message_key(pool: str) -> str:
    """A pool's message key on `sandbox`: its name (`namespace/name` -> name)."""
    return pool.split("/", 1)[-1]


class SandboxCore:
    kinds: tuple[type[Record], ...] = POOL_KINDS
    split: tuple[str, ...] = ("sandboxes", "claims", "ended")

    def __init__(self, retention_s: float, clock: Callable[[], float] = time.time) -> None:
        self.core = PoolCore(retention_s)
        self.clock = clock  # the wall clock, here at the edge: timers' delays only
        self.decoded: dict[str, tuple[dict[str, Any], PoolState]] = {}
        # pool -> (counts per bucket of LATENCY_BUCKETS and +Inf, sum of seconds): claims answered
        # Ready by this worker, from the claim's publication to the log time of what decided it
        self.latency: dict[str, tuple[list[int], float]] = {}

    def observe(self, key: str, outputs: list[Output], times: list[float]) -> None:
        """Count the claims this batch answered Ready (a re-sent answer is older than the batch)."""
        first = min(times) if times else 0.0
        for o in outputs:
            r = o.record
            if isinstance(r, SandboxClaimStatus) and r.phase == "Ready" and r.claimed_at and r.answered_at >= first:
                seconds = max(0.0, r.answered_at - r.claimed_at)
                counts, total = self.latency.setdefault(key, ([0] * (len(LATENCY_BUCKETS) + 1), 0.0))
                counts[next((i for i, b in enumerate(LATENCY_BUCKETS) if seconds <= b), len(LATENCY_BUCKETS))] += 1
                self.latency[key] = (counts, total + seconds)

    def key_of(self, record: Record) -> str:
        return pool_key_of(record)

    def tick(self, key: str, at: float) -> TimerRequest:
        namespace, name = key.split("/", 1)
        return TimerRequest(("tick", key, at), at - self.clock(),
                            Output(topics.SANDBOX, name, SandboxTick(namespace=namespace, name=name, at=at)))

    def apply(self, key: str, stored: dict[str, Any] | None, records: list[Record], times: list[float],
              now: float, outcome: Outcome) -> dict[str, Any] | None:
        state = cached_state(self.decoded, "sandbox-pools", key, stored, PoolState.from_json, PoolState)
        result = PoolResult()
        self.core.apply(state, records, times, now, result)
        self.observe(key, result.outputs, times)
        outcome.first += [routed(o) for o in result.outputs]
        outcome.problems += result.problems
        outcome.timers += [self.tick(key, at) for at in result.ticks]
        if PoolCore.empty(state):
            self.decoded.pop(key, None)
            return None
        new = state.to_json()
        self.decoded[key] = (new, state)
        return new

    def timers(self, key: str, raw: dict[str, Any]) -> list[TimerRequest]:
        """A restored pool that needs a tick gets one (its armed tick died with the old worker)."""
        state = read_state("sandbox-pools", key, raw, PoolState.from_json)
        due = self.core.due(state, self.clock())
        return [self.tick(key, due)] if due is not None else []

    def expires(self, key: str, raw: dict[str, Any]) -> float:
        cached = self.decoded.get(key)
        if cached is not None and cached[0] is raw:  # the state this worker just wrote: its heaps
            return self.core.expires(cached[1])
        return forget_at(ended_times(raw.get("claims") or {}, raw.get("ended") or {}), raw.get("bursts") or {},
                         raw.get("sent") or (), self.core.retention_s)

    def prune(self, keys: Collection[str]) -> None:
        for key in [k for k in self.decoded if k not in keys]:
            del self.decoded[key]


def routed(output: Output) -> Output:
    """A core's output with the catalogue's message key: a pool's name on `sandbox`, a claim's
    uid or a pool's name on `sandbox-status` (the core addresses both by `namespace/name`)."""
    record = output.record
    if output.topic == topics.SANDBOX:
        return Output(output.topic, message_key(output.key), record)
    if isinstance(record, SandboxClaimStatus):
        return Output(output.topic, record.uid, record)
    if isinstance(record, SandboxPoolStatus):
        return Output(output.topic, record.name, record)
    return output


def forwarded(records: list[Record]) -> list[Output]:
    """The sandbox pods' Bindings and SchedulingFeedback, addressed to their pools."""
    out = []
    for record in records:
        pool = pool_of(getattr(record, "uid", ""))
        if pool is not None:
            out.append(Output(topics.SANDBOX, message_key(pool), record))
    return out


def outcomes_sender(outbox: Outbox) -> Callable[[list[RawMessage]], Awaitable[None]]:
    """What the forwarder does with a micro-batch of `bindings` and `feedback`: the Bindings and
    feedback of pools' sandbox pods, to their pools. A Binding lost would leave its sandbox
    starting for good (its pool waits for it, and so may a claim): see `forward_batch`."""
    async def send(messages: list[RawMessage]) -> None:
        mine = [m for m in messages if m.value is not None and UID_MARK in m.value]
        if mine:  # what does not decode is dead-lettered by the topics' own readers, not here
            await deliver(outbox, forwarded(intake(mine, expect=(Binding, SchedulingFeedback)).records))
    return send


def register(app: faust.App, outcomes: faust.TopicT, sandbox: faust.TopicT, outbox: Outbox, config: AgentConfig,
             transactions: Transactions | None = None) -> StatefulLoop:
    """The forwarder over `outcomes` (bindings, feedback) and the pools over `sandbox`."""

    transactions = transactions or Transactions()
    register_forwarder(app, outcomes, "koordstream.sandbox-outcomes", config, transactions, outcomes_sender(outbox))
    return register_stateful(app, "pools", sandbox, SandboxCore(config.retention_s), outbox, config, transactions)
