"""Random sequences through two rebalancer services that take turns leading, as the adapter
drives them: cycles, reservation events (some on the source node), pods deleted, final
feedback, ttl ticks, clock jumps, the log read back (and parts of it again), and leadership
handed over after both read the whole log. Whatever happens: a ReservationFirst move evicts
only after its reservation was Available on another node and before it was deleted, no pod
is evicted twice, no move is evicted with less than `evictionTTLMargin` of its ttl left (a
recorded eviction sent again by a new leader aside), and a follower writes nothing."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.ports import Output
from agents.rebalance import migration as mg
from schemas.records import (
    EvictionCommand,
    MigrationJob,
    PodDeleted,
    Record,
    ReservationEvent,
    SchedulingFeedback,
)
from tests.unit.rebalance.test_service import service

EVENTS = ("Available", "Available", "Succeeded", "Failed")


class World:
    def __init__(self) -> None:
        self.a, self.clock = service()
        self.b, _ = service(leading=False)
        for w in (self.a, self.b):
            w.clock = w.bucket.clock = lambda: self.clock[0]
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
                self.evicted[r.uid] += 1
                job = self.jobs[r.reason.split("(migration ")[1].rstrip(")")]
                if job.mode == mg.RESERVATION_FIRST:
                    assert job.reservation in self.available, f"{r.uid} evicted before its reservation was Available"
                    assert job.reservation not in self.deleted, f"{r.uid} evicted after its reservation went"
            self.log.append(r)

    def feed(self, records: list[Record]) -> None:
        for w in (self.a, self.b):
            outputs = w.on_records(records)
            assert w.leading or not outputs, "a follower wrote"
            self.emit(outputs)

    def step(self, rng: random.Random) -> None:
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


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_moves_evict_only_when_reserved_and_never_twice_whoever_leads(seed: int) -> None:
    rng = random.Random(seed)
    world: Any = World()
    for _ in range(60):
        world.step(rng)
    assert not {u: n for u, n in world.evicted.items() if n > 1}, "a pod evicted twice"
