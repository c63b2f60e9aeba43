"""Random sequences through two rebalancer services that take turns leading, as the adapter
drives them: cycles, reservation events (some on the source node), pods deleted, final
feedback, ttl ticks, clock jumps, the log read back (and parts of it again), and leadership
handed over after both read the whole log. Whatever happens: a ReservationFirst move evicts
only after its reservation was Available on another node and before it was deleted, no pod
is evicted twice, no move is evicted with less than `evictionTTLMargin` of its ttl left (a
recorded eviction sent again by a new leader aside), and a follower writes nothing.

With a PodDisruptionBudget over every pod (drawn: minAvailable or maxUnavailable, integers
or percentages), pending replicas arriving and being bound, nodes deleted and added back
and EvictDirectly scale-downs: every eviction, on either path, is one the Eviction API would
let through, judged from the outside (the pods, bindings and nodes fed, and the evictions
sent so far): healthy = Running on a node that exists and not evicted, expected = every live
pod, disruptionsAllowed = healthy - desiredHealthy (percentages rounded up)."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.ports import Output
from agents.rebalance import migration as mg
from schemas.records import (
    Binding,
    EvictionCommand,
    MigrationJob,
    NodeDeleted,
    Pod,
    PodDeleted,
    PodDisruptionBudget,
    Record,
    ReservationEvent,
    ScaleDownEvent,
    SchedulingFeedback,
)
from tests.builders import GI
from tests.unit.rebalance.conftest import nodes, replica
from tests.unit.rebalance.test_fragmentation import lopsided
from tests.unit.rebalance.test_service import service

EVENTS = ("Available", "Available", "Succeeded", "Failed")
BOTH = ("profiles: [{name: p, plugins: {balance: {enabled: [FragmentationAware, ScaleDownBinPack]}}, "
        "pluginConfig: [{name: FragmentationAware, args: {minPodAge: 0}}, "
        "{name: ScaleDownBinPack, args: {strategy: EvictDirectly, maxPodsToEvict: 3}}]}]")
BUDGETS: tuple[tuple[str, str] | None, ...] = (
    None, ("10", ""), ("11", ""), ("12", ""), ("90%", ""), ("", "0"), ("", "1"), ("", "2"), ("", "10%"), ("", "20%"))


def desired_healthy(min_available: str, max_unavailable: str, expected: int) -> int:
    """The disruption controller's desiredHealthy, written apart from the code under test."""
    def scaled(text: str) -> int:
        return math.ceil(expected * int(text[:-1]) / 100) if text.endswith("%") else int(text)
    if max_unavailable:
        return max(0, expected - scaled(max_unavailable))
    return scaled(min_available) if min_available else expected


class World:
    def __init__(self, budget: tuple[str, str] | None = None) -> None:
        self.a, self.clock = service(BOTH)
        self.b, _ = service(BOTH, leading=False)
        for w in (self.a, self.b):
            w.clock = w.bucket.clock = lambda: self.clock[0]
        node_list, pods = lopsided()
        self.pods: dict[str, Pod] = {p.uid: p for p in pods}  # live, as fed
        self.bound: dict[str, str] = {p.uid: p.node_name for p in pods}
        self.nodes = {n.name: n for n in node_list}  # those that exist
        self.budget = budget
        self.added = 0
        if budget is not None:
            for w in (self.a, self.b):
                w.on_records([PodDisruptionBudget(uid="default/all", name="all", selector={},
                                                  min_available=budget[0], max_unavailable=budget[1])])
        self.leader = self.a
        self.log: list[Record] = []
        self.jobs: dict[str, MigrationJob] = {}
        self.available: set[str] = set()  # reservations seen Available off their source
        self.deleted: set[str] = set()  # reservations deleted
        self.evicted: Counter[str] = Counter()

    def emit(self, outputs: list[Output]) -> None:
        for o in outputs:
            r = o.record
            if isinstance(r, MigrationJob):
                before = self.jobs.get(r.uid)
                if r.mode == mg.RESERVATION_FIRST and r.step == mg.REPLACING and (before is None
                                                                                 or before.step != mg.REPLACING):
                    margin = self.leader.rebalancer.config.profiles[0].arbitration.eviction_ttl_margin_s
                    left = mg.ttl_left(r, self.clock[0])
                    assert left >= margin, f"{r.pod_uid} evicted with {left:.1f} s of its ttl left"
                self.jobs[r.uid] = r
            elif isinstance(r, PodDeleted) and r.uid.endswith(mg.RESERVATION_SUFFIX):
                self.deleted.add(r.uid)
            elif isinstance(r, EvictionCommand):
                self.check_budget(r.uid)
                self.evicted[r.uid] += 1
                job = self.jobs[r.reason.split("(migration ")[1].rstrip(")")]
                if job.mode == mg.RESERVATION_FIRST:
                    assert job.reservation in self.available, f"{r.uid} evicted before its reservation was Available"
                    assert job.reservation not in self.deleted, f"{r.uid} evicted after its reservation went"
            self.log.append(r)

    def check_budget(self, uid: str) -> None:
        """The Eviction API's answer to evicting `uid` now, from the outside."""
        if self.budget is None or uid in self.evicted or uid not in self.pods:
            return
        healthy = {u for u, p in self.pods.items()
                   if p.phase == "Running" and self.bound.get(u) in self.nodes and u not in self.evicted}
        desired = desired_healthy(*self.budget, len(self.pods))
        if uid in healthy:
            assert len(healthy) - desired >= 1, f"{uid} evicted: {len(healthy)} healthy, {desired} desired"
        else:
            assert len(healthy) >= max(desired, 1), f"unhealthy {uid} evicted with the budget broken"

    def feed(self, records: list[Record]) -> None:
        for r in records:
            if isinstance(r, Pod):
                self.pods[r.uid] = r
            elif isinstance(r, PodDeleted):
                self.pods.pop(r.uid, None)
            elif isinstance(r, Binding):
                self.bound[r.uid] = r.node
            elif isinstance(r, NodeDeleted):
                self.nodes.pop(r.name, None)
        for w in (self.a, self.b):
            outputs = w.on_records(records)
            assert w.leading or not outputs, "a follower wrote"
            self.emit(outputs)

    def step(self, rng: random.Random) -> None:
        if rng.random() < 0.25:
            self.cluster_step(rng)
            return
        op, jobs = rng.random(), list(self.jobs.values())
        now = self.clock[0]
        if op < 0.1:
            self.emit(self.leader.cycle(now))
        elif op < 0.25 and jobs:
            j = rng.choice(jobs)
            phase, node = rng.choice(EVENTS), rng.choice(["n0", "n1", "n2", "n3", j.source])
            if phase == "Available" and node != j.source:
                self.available.add(j.reservation)
            self.feed([ReservationEvent(name=j.reservation, uid=j.reservation, phase=phase,
                                        node="" if phase == "Failed" else node,
                                        reason="Expired" if phase == "Failed" else "")])
        elif op < 0.32 and jobs:
            j = rng.choice(jobs)
            self.feed([PodDeleted(uid=j.pod_uid, name=j.pod_name)])
        elif op < 0.36 and jobs:
            j = rng.choice(jobs)
            self.feed([SchedulingFeedback(uid=j.reservation, namespace="default", name=j.reservation, attempt=1,
                                          message="0/4 nodes are available", final=True)])
        elif op < 0.5:
            self.emit(self.leader.actuate(now) + self.leader.tick(now))
        elif op < 0.6:
            self.clock[0] += rng.choice([0.05, 0.1, 1, 30, 200, 285, 400])  # 285: into the ttl margin
        elif op < 0.75 and self.log:
            self.feed([r for r in self.log[rng.randrange(len(self.log)):] if isinstance(r, (MigrationJob, PodDeleted))])
        elif op < 0.82:
            self.feed([r for r in self.log if isinstance(r, (MigrationJob, PodDeleted, EvictionCommand))])
            self.leader.follow()
            self.leader = self.b if self.leader is self.a else self.a
            self.emit(self.leader.lead(now))
        else:
            self.feed([r for r in self.log[-5:] if isinstance(r, ReservationEvent)])


    def cluster_step(self, rng: random.Random) -> None:
        """What moves around the budgets: pending replicas, their bindings, nodes, scale-downs."""
        op = rng.random()
        pending = [p for p in self.pods.values() if p.uid not in self.bound]
        if op < 0.3:
            self.added += 1
            workload = rng.choice(["cpu", "mem"])
            self.feed([replica(f"new{self.added}", "", workload=workload, cpu=100, memory=GI // 4, phase="Pending")])
        elif op < 0.5 and pending:
            p = rng.choice(pending)
            node = rng.choice(sorted(self.nodes) or ["n0"])
            self.feed([Binding(uid=p.uid, namespace=p.namespace, name=p.name, node=node, attempt=0, decision_key=p.uid),
                       replace(p, phase="Running")])
        elif op < 0.65:
            gone = [n for n in ("n0", "n1", "n2", "n3") if n not in self.nodes]
            if gone and rng.random() < 0.5:
                name = rng.choice(gone)
                node = next(n for n in nodes(4) if n.name == name)
                self.nodes[node.name] = node
                self.feed([node])
            elif self.nodes:
                self.feed([NodeDeleted(name=rng.choice(sorted(self.nodes)))])
        elif op < 0.8:
            event = ScaleDownEvent(workload=f"ReplicaSet/{rng.choice(['cpu', 'mem'])}", replicas=rng.randint(1, 3))
            out, _ = self.leader.scale_down(event, self.clock[0])
            self.emit(out)
        else:
            self.emit(self.leader.actuate(self.clock[0]))
            self.clock[0] += 0.1


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_moves_evict_only_when_reserved_and_never_twice_whoever_leads(seed: int) -> None:
    rng = random.Random(seed)
    world: Any = World(rng.choice(BUDGETS))
    for _ in range(60):
        world.step(rng)
    assert not {u: n for u, n in world.evicted.items() if n > 1}, "a pod evicted twice"
