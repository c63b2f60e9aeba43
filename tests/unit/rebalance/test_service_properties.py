"""Random sequences through two rebalancer services that take turns leading, as the adapter
drives them: cycles, scale-downs that evict directly, reservation events (some on the source
node; a consumed one names the pod that consumed it), pods deleted, final feedback, ttl
ticks, clock jumps, the log read back (and parts of it again), and leadership handed over
after both read the whole log. The leader also crashes while delivering: its job records
(the first wave) land, and only part of what they do (the second wave: Reservations,
evictions, reservation deletions); it restarts with nothing but the log, and the other takes
over. Whatever happens: a ReservationFirst move evicts only after its reservation was
Available on another node and before it was deleted, no pod is evicted twice, a follower
writes nothing, every effect a job's record says was sent is on the topics once a leader
took over (its Reservation, its eviction, its reservation's deletion), sent again as the same
record, and a job is Succeeded only once its pod went (EvictDirectly) or its own reservation
was consumed by a replacement (ReservationFirst)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.ports import Output
from agents.rebalance import migration as mg
from agents.rebalance.service import RebalancerService
from schemas import topics
from schemas.records import (
    CurrentOwner,
    EvictionCommand,
    MigrationJob,
    PodDeleted,
    Record,
    Reservation,
    ReservationEvent,
    ScaleDownEvent,
    SchedulingFeedback,
)
from tests.unit.rebalance.test_service import service

EVENTS = ("Available", "Available", "Succeeded", "Failed")
BOTH = ("profiles: [{name: p, plugins: {balance: {enabled: [FragmentationAware, ScaleDownBinPack]}}, "
        "pluginConfig: [{name: FragmentationAware, args: {minPodAge: 0}}, "
        "{name: ScaleDownBinPack, args: {strategy: EvictDirectly, maxPodsToEvict: 2}}]}]")
READ_BACK = (MigrationJob, PodDeleted, EvictionCommand, Reservation, ReservationEvent, SchedulingFeedback)


class World:
    def __init__(self, rng: random.Random, crashes: float = 0.0) -> None:
        self.rng, self.crashes = rng, crashes
        self.clock = [0.0]
        self.a, self.b = self.fresh(leading=True), self.fresh(leading=False)
        self.leader = self.a
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
            assert r.version > self.jobs.get(r.uid, r).version - 1, "a job's record went back"
            self.jobs[r.uid] = r
        elif isinstance(r, Reservation):
            assert self.posted.get(r.uid, r) == r, "a Reservation sent again differs"
            self.posted[r.uid] = r
        elif isinstance(r, PodDeleted) and r.uid.endswith(mg.RESERVATION_SUFFIX):
            self.deleted.add(r.uid)
        elif isinstance(r, EvictionCommand):
            self.evicted[r.uid] += 1
            job = self.jobs[r.reason.split("(migration ")[1].rstrip(")")]
            if job.mode == mg.RESERVATION_FIRST:
                assert job.reservation in self.available, f"{r.uid} evicted before its reservation was Available"
                assert job.reservation not in self.deleted, f"{r.uid} evicted after its reservation went"
        self.log.append(r)

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
            if isinstance(r, PodDeleted) and not r.uid.endswith(mg.RESERVATION_SUFFIX):
                self.gone.add(r.uid)
        self.read(records)

    def read(self, records: list[Record]) -> None:
        leader = self.leader
        for w in (self.a, self.b):
            if w is not leader:
                assert not w.on_records(records), "a follower wrote"
        self.emit(leader.on_records(records))

    def step(self) -> None:
        rng = self.rng
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
            self.clock[0] += rng.choice([0.05, 0.1, 1, 30, 200, 400])
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


def run(seed: int, crashes: float) -> World:
    world = World(random.Random(seed), crashes)
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
    were sent."""
    world: Any = run(seed, crashes=0.25)
    world.crashes = 0.0
    world.take_over(world.leader)  # one last takeover: its effects are all on the topics
