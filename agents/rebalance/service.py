"""The rebalancer service, pure: the records it reads go in, the records it writes come out,
time is injected. Its adapter (`agents.adapters.rebalancer`) reads the topics, decides who
leads and produces what comes out.

Inputs (`on_records`): Node / NodeDeleted (`nodes`), Pod / PodDeleted (`pods`), Binding
(`bindings`), ReservationEvent (`reservations`), SchedulingFeedback (`feedback`: a final one
for a migration's reservation means it fits nowhere) and its own MigrationJob records
(`migrations`: of two versions of a job the higher wins, so a record read back late never
undoes a step).

Every worker with the rebalancer role keeps this view; one of them leads (`lead`), and only
the leader steps jobs and writes. A follower records the last event of each migration's
reservation and which pods went; `lead(now)` replays them over the jobs in flight, so that
a job whose event the last leader never handled moves on (a step taken twice changes
nothing: a finished job ignores every input, a job past a step ignores that step's event).

Led, every `deschedulingInterval` `cycle(now)` plans over the bound pods and starts a
migration job per planned move (their Reservations go to `pods`, the jobs to `migrations`);
`actuate(now)` sends the evictions that jobs wait for, ReservationFirst moves through the
arbitration again, all through the eviction rate limit (`TokenBucket`); `tick(now)` ends jobs
past their ttl. `scale_down` answers a ScaleDownEvent: with CalculateOnly the ranks go out as
`controller.kubernetes.io/pod-deletion-cost` annotations on the pods (a Pod update of a bound
pod on `pods`, which the scheduler ignores and a ReplicaSet controller, or the bridge that
patches the pod, acts on); with EvictDirectly the victims are evicted by jobs of mode
EvictDirectly (no replacement is reserved: the workload is shrinking).

Counted for the metrics: evictions by reason, migrations finished by phase and reason, and
each profile's cluster objective as its last cycle measured it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial

from agents.ports import Output, Problem
from agents.rebalance import migration as mg
from agents.rebalance.arbitration import Arbitrator, TokenBucket
from agents.rebalance.binpack import DELETION_COST, ScaleDownPlan
from agents.rebalance.objective import Objective
from agents.rebalance.rebalancer import Rebalancer
from agents.state import reservations
from schemas import topics
from schemas.records import (
    Binding,
    MigrationJob,
    Node,
    NodeDeleted,
    Pod,
    PodDeleted,
    Record,
    ReservationEvent,
    ScaleDownEvent,
    SchedulingFeedback,
)

RESERVATION_SUFFIX = mg.RESERVATION_SUFFIX
MOVE_REASON = "rebalance: FragmentationAware"
SCALE_DOWN_REASON = "rebalance: ScaleDownBinPack"


@dataclass
class RebalancerService:
    rebalancer: Rebalancer
    clock: Callable[[], float]
    leading: bool = False
    nodes: dict[str, Node] = field(default_factory=dict)
    pods: dict[str, Pod] = field(default_factory=dict)
    bound: dict[str, str] = field(default_factory=dict)  # pod uid -> node
    jobs: dict[str, MigrationJob] = field(default_factory=dict)
    moved_at: dict[str, float] = field(default_factory=dict)  # pod uid -> when its last move began
    events: dict[str, ReservationEvent] = field(default_factory=dict)  # a job's reservation -> its last event
    unschedulable: set[str] = field(default_factory=set)  # reservations that fit nowhere
    gone: set[str] = field(default_factory=set)  # pods of unfinished jobs deleted
    active: dict[str, str] = field(default_factory=dict)  # pod uid -> its unfinished job
    scale_downs: list[tuple[str, ScaleDownPlan]] = field(default_factory=list)
    evictions: Counter[str] = field(default_factory=Counter)
    finished: Counter[tuple[str, str]] = field(default_factory=Counter)  # (phase, reason) -> jobs
    objective: dict[str, tuple[Objective, Objective]] = field(default_factory=dict)  # profile -> (now, planned)
    sequence: int = 0
    bucket: TokenBucket = field(init=False)

    def __post_init__(self) -> None:
        a = self.rebalancer.config.profiles[0].arbitration if self.rebalancer.config.profiles else None
        self.bucket = TokenBucket(a.eviction_qps if a else 10.0, a.eviction_burst if a else 1, self.clock)

    # -- inputs -----------------------------------------------------------------------------

    def on_records(self, records: Iterable[Record]) -> list[Output]:
        """Keep the view; when leading, step the jobs the records concern."""
        now = self.clock()
        out: list[Output] = []
        for r in records:
            if isinstance(r, Node):
                self.nodes[r.name] = r
            elif isinstance(r, NodeDeleted):
                self.nodes.pop(r.name, None)
            elif isinstance(r, Pod):
                self.pods[r.uid] = r
            elif isinstance(r, PodDeleted):
                self.pods.pop(r.uid, None)
                self.bound.pop(r.uid, None)
                if r.uid in self.active:
                    self.gone.add(r.uid)
                    out += self._apply(self.active[r.uid], partial(mg.on_pod_gone, uid=r.uid, now=now))
                else:
                    self.moved_at.pop(r.uid, None)
            elif isinstance(r, Binding):
                self.bound[r.uid] = r.node
            elif isinstance(r, ReservationEvent) and r.uid.endswith(RESERVATION_SUFFIX):
                if r.phase in (reservations.SUCCEEDED, reservations.FAILED):
                    self.bound.pop(r.uid, None)  # a reservation's Binding: it holds nothing any more
                self.events[r.uid] = r
                out += self._apply(r.uid.removesuffix(RESERVATION_SUFFIX), partial(mg.on_reservation, event=r, now=now))
            elif isinstance(r, SchedulingFeedback) and r.final and r.uid.endswith(RESERVATION_SUFFIX):
                self.unschedulable.add(r.uid)
                out += self._apply(r.uid.removesuffix(RESERVATION_SUFFIX),
                                   partial(mg.on_unschedulable, reservation_uid=r.uid, now=now))
            elif isinstance(r, MigrationJob):
                self._read_back(r)
        return out

    def _read_back(self, job: MigrationJob) -> None:
        """A job as `migrations` has it. Finished, it leaves memory (no older version of it can
        follow in the log); otherwise it is kept unless this worker holds a newer version."""
        mine = self.jobs.get(job.uid)
        if mine is not None and mine.version > job.version:
            return
        self.moved_at[job.pod_uid] = max(self.moved_at.get(job.pod_uid, 0.0), job.created)
        self.sequence = max(self.sequence, int(job.uid.rsplit("-", 1)[-1]) if job.uid[-1:].isdigit() else 0)
        if job.phase in mg.FINISHED:
            self.jobs.pop(job.uid, None)
            self._forget(job)
        elif mine is None or job.version > mine.version:
            self.jobs[job.uid] = job
            self.active[job.pod_uid] = job.uid

    def _forget(self, job: MigrationJob) -> None:
        self.events.pop(job.reservation, None)
        self.unschedulable.discard(job.reservation)
        self.gone.discard(job.pod_uid)
        if self.active.get(job.pod_uid) == job.uid:
            del self.active[job.pod_uid]

    def _apply(self, uid: str, step: Callable[[MigrationJob], mg.Step]) -> list[Output]:
        """Step one unfinished job (when leading)."""
        job = self.jobs.get(uid)
        if not self.leading or job is None or job.phase in mg.FINISHED:
            return []
        return self._step(uid, step(job))

    def _step(self, uid: str, step: mg.Step) -> list[Output]:
        job, outputs = step
        before = self.jobs.get(uid)
        self.jobs[uid] = job
        if job.phase not in mg.FINISHED:
            self.active[job.pod_uid] = uid
        elif before is None or before.phase not in mg.FINISHED:
            self.finished[(job.phase, job.reason)] += 1
            self._forget(job)
        return outputs

    # -- leadership --------------------------------------------------------------------------

    def lead(self, now: float) -> list[Output]:
        """Become the leader (the jobs read back whole): apply what the jobs in flight may have
        missed, then end those past their ttl."""
        self.leading = True
        out: list[Output] = []
        for uid in [uid for uid, job in self.jobs.items() if job.phase not in mg.FINISHED]:
            job = self.jobs[uid]
            event = self.events.get(job.reservation)
            if event is not None:
                out += self._step(uid, mg.on_reservation(self.jobs[uid], event, now))
            if job.reservation in self.unschedulable:
                out += self._step(uid, mg.on_unschedulable(self.jobs[uid], job.reservation, now))
            if job.pod_uid in self.gone or job.pod_uid not in self.pods:
                out += self._step(uid, mg.on_pod_gone(self.jobs[uid], job.pod_uid, now))
        return out + self.tick(now)

    def follow(self) -> None:
        self.leading = False

    # -- the cycle ---------------------------------------------------------------------------

    def placed(self) -> list[Pod]:
        """The bound pods, as the planners see them (node_name set)."""
        return [replace(p, node_name=self.bound[uid]) for uid, p in self.pods.items() if uid in self.bound]

    def in_flight(self) -> list[tuple[Pod, str, str]]:
        return [(self.pods[j.pod_uid], j.source, j.reserved_on or j.destination) for j in self.jobs.values()
                if j.phase not in mg.FINISHED and j.pod_uid in self.pods]

    def _start(self, pod: Pod, source: str, destination: str, now: float, mode: str) -> list[Output]:
        self.sequence += 1
        job = mg.new_job(pod, source=source, destination=destination, now=now, mode=mode, sequence=self.sequence)
        self.moved_at[pod.uid] = now
        return self._step(job.uid, mg.start(job, pod, now))

    def cycle(self, now: float) -> list[Output]:
        """Plan, and start a migration job per planned move (unless the profile is a dry run)."""
        if not self.leading:
            return []
        out: list[Output] = []
        plans = self.rebalancer.cycle(self.nodes.values(), self.placed(), now=now, moved_at=self.moved_at,
                                      in_flight=self.in_flight())
        for c in plans:
            self.objective[c.profile] = (c.moves.before, c.moves.after)
            args = next(p.fragmentation for p in self.rebalancer.config.profiles if p.name == c.profile)
            if args is None or args.dry_run:
                continue
            for move in c.moves.moves:
                out += self._start(self.pods[move.uid], move.source, move.destination, now, mg.RESERVATION_FIRST)
        return out

    def actuate(self, now: float) -> list[Output]:
        """Evictions that jobs wait for, within the arbitration and the rate limit."""
        if not self.leading or not self.rebalancer.config.profiles:
            return []
        out: list[Output] = []
        arbitrator = Arbitrator.over(self.rebalancer.config.profiles[0].arbitration, self.placed())
        for job in self.jobs.values():
            if job.phase not in mg.FINISHED and job.step == mg.REPLACING and job.pod_uid in self.pods:
                arbitrator.admit(self.pods[job.pod_uid], job.source)
        for uid, job in list(self.jobs.items()):
            moving = job.mode == mg.RESERVATION_FIRST
            command = mg.eviction(job, MOVE_REASON if moving else SCALE_DOWN_REASON)
            pod = self.pods.get(job.pod_uid)
            if command is None or pod is None:
                continue
            if moving and arbitrator.refusal(pod, job.source):
                continue
            if not self.bucket.take():
                break
            if moving:
                arbitrator.admit(pod, job.source)
            self.evictions[MOVE_REASON if moving else SCALE_DOWN_REASON] += 1
            out += [Output(topics.EVICTIONS, command.uid, command), *self._step(uid, mg.evicted(job, now))]
        return out

    def tick(self, now: float) -> list[Output]:
        out: list[Output] = []
        for uid in list(self.active.values()):
            out += self._apply(uid, partial(mg.on_tick, now=now))
        return out

    # -- scale-down --------------------------------------------------------------------------

    def scale_down(self, event: ScaleDownEvent, now: float) -> tuple[list[Output], list[Problem]]:
        """Rank the workload's pods (every profile with ScaleDownBinPack). CalculateOnly: the
        ranks as pod-deletion-cost annotations; EvictDirectly: the victims evicted by jobs.
        An event naming no workload here, or asking for a bad count, is a problem."""
        if event.replicas < 0:
            return [], [Problem("replicas", str(event.replicas), f"replicas={event.replicas}: must be 0 or more",
                                event)]
        try:
            plans = self.rebalancer.scale_down(self.nodes.values(), self.placed(), event, now=now)
        except ValueError as exc:
            return [], [Problem("workload", f"{event.namespace}/{event.workload}", str(exc), event)]
        out: list[Output] = []
        for profile, plan in plans:
            self.scale_downs.append((profile, plan))
            args = next(p.binpack for p in self.rebalancer.config.profiles if p.name == profile)
            if args is not None and args.strategy == "EvictDirectly":
                for uid in plan.victims:
                    out += self._start(self.pods[uid], self.bound[uid], "", now, mg.EVICT_DIRECTLY)
                continue
            for uid, cost in plan.costs.items():
                pod = self.pods[uid]
                if pod.annotations.get(DELETION_COST) != str(cost):
                    annotated = replace(pod, node_name=self.bound[uid], annotations={**pod.annotations,
                                                                                     DELETION_COST: str(cost)})
                    self.pods[uid] = annotated
                    out.append(Output(topics.PODS, uid, annotated))
        return out, []
