"""An in-process pipeline for tests: the scheduler core, the node owners and the deciders
wired by topic, with no broker (the integration tests run the same cores through one)."""

from __future__ import annotations

from typing import Any

from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.state.ledger import Decider, Decision, LedgerState
from agents.state.owner import NodeOwner, NodeState, OwnerResult
from agents.state.resources import ResourceSpace
from schemas import topics
from schemas.records import PodDeleted


class Cluster:
    """Scheduler, owners and deciders in one process, records routed by topic until quiet.
    Timers are collected, not armed: a test fires them by routing their records. `timed`: the
    owners and deciders read every record at log time `now` (so they judge staleness and
    forget by the retention); otherwise log times are unknown, as in most tests."""

    def __init__(self, *nodes: Any, replicas: int = 1, timed: bool = False) -> None:
        self.now = 0.0
        self.timed = timed
        space = ResourceSpace()
        # Scheduler replicas, each with its own cluster state; a pod belongs to one (`add`).
        self.cores = [SchedulerCore(space, ClusterState(space), lambda: self.now) for _ in range(replicas)]
        self.core = self.cores[0]
        self.replica_of: dict[str, int] = {}
        self.owner, self.decider = NodeOwner(), Decider()
        self.nodes: dict[str, NodeState] = {}
        self.ledgers: dict[str, LedgerState] = {}
        self.bindings: dict[str, str] = {}
        self.timers: list[tuple[str, int, float]] = []
        self.expiries: list[tuple[str, str, float]] = []  # reservation timers: (node, uid, at)
        self.events: list[Any] = []  # ReservationEvents, in order
        self.route([*(o for n in nodes for o in self._to_owner(n.name, [n]))])

    def _to_owner(self, node: str, records: list[Any]) -> list[Any]:
        result = OwnerResult()
        self.owner.apply(self.nodes.setdefault(node, NodeState(node)), records, result, *self._times(records))
        self.expiries += result.timers
        return result.outputs

    def _times(self, records: list[Any]) -> tuple[list[float] | None, float]:
        return ([self.now] * len(records), self.now) if self.timed else (None, 0.0)

    def route(self, outputs: list[Any]) -> None:
        while outputs:
            o = outputs.pop(0)
            r = o.record
            if o.topic == topics.NODE_INBOX:
                outputs += self._to_owner(o.key, [r])
            elif o.topic == topics.HOLDS:
                out = Decision()
                self.decider.apply(self.ledgers.setdefault(o.key, LedgerState(o.key)), [r], out, *self._times([r]))
                outputs += out.first + out.after_commit
                self.timers += out.timers
            elif o.topic == topics.STATE_CHANGES:
                for core in self.cores:
                    core.apply_state_changes([r])
            elif o.topic == topics.REQUEUE:
                self.cores[self.replica_of.get(r.uid, 0)].requeue(r)
            elif o.topic == topics.PODS and isinstance(r, PodDeleted):  # (an owner deletes an ended reservation)
                outputs += self.cores[self.replica_of.get(r.uid, 0)].delete(r)
            elif o.topic == topics.RESERVATIONS:
                self.events.append(r)
            elif o.topic == topics.BINDINGS:
                assert r.uid not in self.bindings, f"{r.uid} bound twice"
                self.bindings[r.uid] = r.node

    def add(self, pod: Any, replica: int = 0) -> None:
        self.replica_of[pod.uid] = replica
        self.route(self.cores[replica].add(pod))

    def step(self, batch: int = 2) -> None:
        self.now += 5.0  # past every backoff
        for core in self.cores:  # small batches, so gangs interleave
            self.route(core.schedule(batch))

    def settle(self, rounds: int = 10) -> None:
        """Schedule until nothing is produced (or `rounds` run out)."""
        for _ in range(rounds):
            self.now += 5.0
            produced = [o for core in self.cores for o in core.schedule(512)]
            if not produced:
                return
            self.route(produced)

    def used(self, node: str) -> dict[str, int]:
        return self.nodes[node].used()
