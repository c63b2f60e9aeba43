"""Random sequences through two rebalancer services that take turns leading, as the adapter
drives them: cycles, scale-downs that evict directly, reservation events (some on the source
node; a consumed one names the pod that consumed it), pods deleted, final feedback, ttl
ticks, clock jumps, the log read back (and parts of it again), and leadership handed over
after both read the whole log. The leader also crashes while delivering: its job records
(the first wave) land, and only part of what they do (the second wave: Reservations,
evictions, reservation deletions); it restarts with nothing but the log, and the other takes
over. Whatever happens: a ReservationFirst move evicts only after its reservation was
Available on another node and before it was deleted, no pod is evicted twice, no move is
evicted with less than `evictionTTLMargin` of its ttl left (a recorded eviction sent again by
a new leader aside: it was judged when it was decided), a follower writes nothing, every
effect a job's record says was sent is on the topics once a leader took over (its
Reservation, its eviction, its reservation's deletion), sent again as the same record, and a
job is Succeeded only once its pod went (EvictDirectly) or its own reservation was consumed
by a replacement (ReservationFirst).

With a PodDisruptionBudget over every pod (drawn: minAvailable or maxUnavailable, integers
or percentages), pending replicas arriving and being bound, nodes deleted and added back
and EvictDirectly scale-downs: every eviction, on either path, re-sent ones included, is one
the Eviction API would let through, judged from the outside (the pods, bindings and nodes
fed, and the evictions sent so far): healthy = Running on a node that exists and not
evicted, expected = every live pod, disruptionsAllowed = healthy - desiredHealthy
(percentages rounded up). The cluster's records are on the log too, so a restarted worker
rebuilds the same view and budgets from it."""

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
from agents.rebalance.service import RebalancerService
from schemas import topics
from schemas.records import (
    Binding,
    CurrentOwner,
    EvictionCommand,
    MigrationJob,
    Node,
    NodeDeleted,
    Pod,
    PodDeleted,
    PodDisruptionBudget,
    Record,
    Reservation,
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
READ_BACK = (MigrationJob, PodDeleted, EvictionCommand, Reservation, ReservationEvent, SchedulingFeedback,
             Pod, Binding, Node, NodeDeleted, PodDisruptionBudget)
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
    def __init__(self, rng: random.Random, crashes: float = 0.0, budget: tuple[str, str] | None = None) -> None:
        self.rng, self.crashes = rng, crashes
        self.clock = [0.0]
        self.a, self.b = self.fresh(leading=True), self.fresh(leading=False)
        self.leader = self.a
        node_list, pods = lopsided()
        self.pods: dict[str, Pod] = {p.uid: p for p in pods}  # live, as fed
        self.bound: dict[str, str] = {p.uid: p.node_name for p in pods}
        self.nodes = {n.name: n for n in node_list}  # those that exist
        self.budget = budget
        self.added = 0
        self.log: list[Record] = []  # everything on the topics, in order
        self.jobs: dict[str, MigrationJob] = {}  # each job's last record
        self.posted: dict[str, Reservation] = {}  # reservations on `pods`
        self.available: set[str] = set()  # reservations seen Available off their source
        self.ended: set[str] = set()  # reservations consumed or failed (events say so)
        self.replaced: set[str] = set()  # reservations consumed by a replacement of their job's pod
        self.deleted: set[str] = set()  # reservations deleted
        self.gone: set[str] = set()  # pods deleted
        self.evicted: Counter[str] = Counter()
        self.crashed = 0
        self.lost: Counter[str] = Counter()  # effects lost in crashes, by kind
        if budget is not None:
            self.feed([PodDisruptionBudget(uid="default/all", name="all", selector={},
                                           min_available=budget[0], max_unavailable=budget[1])])

    def fresh(self, leading: bool) -> RebalancerService:
        """A service as a worker starts it (the cluster view), on the world's clock."""
        svc, now = service(BOTH, leading=leading)
        self.clock[0] = self.clock[0] or now[0]
        svc.clock = svc.bucket.clock = lambda: self.clock[0]
        return svc

    def emit(self, outputs: list[Output], crash: bool = True) -> bool:
        """The leader's outputs, delivered as the adapter does: the job records first, then
        what they do. Maybe it crashes in between (True): part of the second wave is lost."""
        jobs = [o for o in outputs if o.topic == topics.MIGRATIONS]
        effects = [o for o in outputs if o.topic != topics.MIGRATIONS]
        lost = crash and bool(effects) and self.rng.random() < self.crashes
        if lost:
            kept = [o for o in effects if self.rng.random() < 0.3]
            self.lost.update(type(o.record).__name__ for o in effects if o not in kept)
            effects = kept
        for o in [*jobs, *effects]:
            self.deliver(o.record)
        if lost:
            self.crash()
        return lost

    def deliver(self, r: Record) -> None:
        if isinstance(r, MigrationJob):
            before = self.jobs.get(r.uid)
            assert before is None or r.version >= before.version, "a job's record went back"
            if r.mode == mg.RESERVATION_FIRST and r.step == mg.REPLACING and (before is None
                                                                             or before.step != mg.REPLACING):
                # decided now (a recorded eviction sent again by a new leader writes no record)
                margin = self.leader.rebalancer.config.profiles[0].arbitration.eviction_ttl_margin_s
                left = mg.ttl_left(r, self.clock[0])
                assert left >= margin, f"{r.pod_uid} evicted with {left:.1f} s of its ttl left"
            self.jobs[r.uid] = r
        elif isinstance(r, Reservation):
            assert self.posted.get(r.uid, r) == r, "a Reservation sent again differs"
            self.posted[r.uid] = r
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

    def crash(self) -> None:
        """The leader dies: it restarts with only the log, the other takes over."""
        self.crashed += 1
        restarted = self.fresh(leading=False)
        restarted.on_records([r for r in self.log if isinstance(r, READ_BACK)])
        if self.leader is self.a:
            self.a, self.leader = restarted, self.b
        else:
            self.b, self.leader = restarted, self.a
        self.take_over(self.leader)

    def take_over(self, leader: RebalancerService) -> None:
        leader.on_records([r for r in self.log if isinstance(r, READ_BACK)])  # read up to the ends first
        if not self.emit(leader.lead(self.clock[0]), crash=self.crashed < 20):
            self.check_effects()

    def check_effects(self) -> None:
        """What every job's record says was sent is on the topics."""
        for j in self.jobs.values():
            if j.phase == mg.RUNNING and j.mode == mg.RESERVATION_FIRST:
                assert j.reservation in self.posted, f"{j.uid} recorded as reserving, its Reservation never sent"
            if j.released:
                assert j.reservation in self.deleted, f"{j.uid} recorded its reservation deleted, never sent"
            if mg.sent_eviction(j) and j.pod_uid not in self.gone:
                assert self.evicted[j.pod_uid], f"{j.uid} recorded as evicted, its eviction never sent"

    def feed(self, records: list[Record]) -> None:
        """Records from the cluster: on the topics, read by both."""
        for r in records:
            self.log.append(r)
            if isinstance(r, Pod):
                self.pods[r.uid] = r
            elif isinstance(r, PodDeleted):
                self.pods.pop(r.uid, None)
                if not r.uid.endswith(mg.RESERVATION_SUFFIX):
                    self.gone.add(r.uid)
            elif isinstance(r, Binding):
                self.bound[r.uid] = r.node
            elif isinstance(r, NodeDeleted):
                self.nodes.pop(r.name, None)
        self.read(records)

    def read(self, records: list[Record]) -> None:
        leader = self.leader
        for w in (self.a, self.b):
            if w is not leader:
                assert not w.on_records(records), "a follower wrote"
        self.emit(leader.on_records(records))

    def step(self) -> None:
        rng = self.rng
        if rng.random() < 0.25:
            self.cluster_step(rng)
            return
        op, jobs = rng.random(), list(self.jobs.values())
        live = [j for j in jobs if j.reservation in self.posted and j.reservation not in self.deleted | self.ended]
        now = self.clock[0]
        if op < 0.08:
            self.emit(self.leader.cycle(now))
        elif op < 0.11:
            event = ScaleDownEvent(workload=rng.choice(["ReplicaSet/mem", "ReplicaSet/cpu"]), replicas=rng.choice([1, 2]))
            self.emit(self.leader.scale_down(event, now)[0])
        elif op < 0.25 and live:
            j = rng.choice(live)
            phase, node = rng.choice(EVENTS), rng.choice(["n0", "n1", "n2", "n3", j.source])
            if phase == "Available" and node != j.source:
                self.available.add(j.reservation)
            owners: tuple[CurrentOwner, ...] = ()
            if phase == "Succeeded":  # a new pod of the workload, now and then the pod itself (never the replacement)
                by = j.pod_uid if rng.random() < 0.2 else f"{j.pod_uid}-new-{len(self.log)}"
                owners = (CurrentOwner(uid=by, namespace=j.namespace, name=by),)
                if by != j.pod_uid and j.step == mg.REPLACING:
                    self.replaced.add(j.reservation)
            if phase != "Available":
                self.ended.add(j.reservation)
            self.feed([ReservationEvent(name=j.reservation, uid=j.reservation, phase=phase,
                                        node="" if phase == "Failed" else node,
                                        reason="Expired" if phase == "Failed" else "", current_owners=owners)])
        elif op < 0.32 and jobs:
            j = rng.choice(jobs)
            if j.pod_uid not in self.gone:
                self.feed([PodDeleted(uid=j.pod_uid, name=j.pod_name)])
        elif op < 0.36 and live:
            j = rng.choice(live)
            self.feed([SchedulingFeedback(uid=j.reservation, namespace="default", name=j.reservation, attempt=1,
                                          message="0/4 nodes are available", final=True)])
        elif op < 0.5:
            self.emit(self.leader.actuate(now) + self.leader.tick(now))
        elif op < 0.6:
            self.clock[0] += rng.choice([0.05, 0.1, 1, 30, 200, 285, 400])  # 285: into the ttl margin
        elif op < 0.75 and self.log:
            self.read([r for r in self.log[rng.randrange(len(self.log)):] if isinstance(r, READ_BACK)])
        elif op < 0.82:
            self.read([r for r in self.log if isinstance(r, READ_BACK)])
            self.leader.follow()
            self.leader = self.b if self.leader is self.a else self.a
            self.take_over(self.leader)
        else:
            self.read([r for r in self.log[-5:] if isinstance(r, ReservationEvent)])

    def check_ends(self) -> None:
        for j in self.jobs.values():
            if j.phase == mg.SUCCEEDED and j.mode == mg.EVICT_DIRECTLY:
                assert j.pod_uid in self.gone, f"{j.uid} Succeeded with its pod still there"
            if j.phase == mg.SUCCEEDED and j.mode == mg.RESERVATION_FIRST:
                assert j.reservation in self.replaced, f"{j.uid} Succeeded without a replacement in its reservation"

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


def run(seed: int, crashes: float) -> World:
    rng = random.Random(seed)
    world = World(rng, crashes, rng.choice(BUDGETS))
    for _ in range(60):
        world.step()
    assert not {u: n for u, n in world.evicted.items() if n > 1}, "a pod evicted twice"
    world.check_ends()
    return world


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_moves_evict_only_when_reserved_and_never_twice_whoever_leads(seed: int) -> None:
    run(seed, crashes=0.0)


@settings(max_examples=80, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_a_leader_that_dies_between_a_job_record_and_its_effects_leaves_nothing_undone(seed: int) -> None:
    """Crashes between a job's record and each of its effects: a new leader sends again the
    Reservation, the eviction (either mode) and the reservation's deletion the record says
    were sent, within the budgets."""
    world: Any = run(seed, crashes=0.25)
    world.crashes = 0.0
    world.take_over(world.leader)  # one last takeover: its effects are all on the topics
