"""The rebalancer service, pure: the records it reads go in, the records it writes come out,
time is injected. Its adapter (`agents.adapters.rebalancer`) reads the topics, decides who
leads and produces what comes out.

Inputs (`on_records`): Node / NodeDeleted (`nodes`), Pod / PodDeleted (`pods`), Binding
(`bindings`), EvictionCommand (`evictions`: a pod being evicted is neither planned nor
evicted again) and EvictionRefused (`evictions`: the API server refused it for good, as the
bridge reports; the pod stays, and the job that sent it ends Aborted, its reservation deleted), ReservationEvent (`reservations`), SchedulingFeedback (`feedback`: a final one
for a migration's reservation means it fits nowhere) and its own MigrationJob records
(`migrations`: of two versions of a job the higher wins, so a record read back late never
undoes a step), and PodDisruptionBudgets (`disruption-budgets`: planners plan no move that
would break one, and the actuator sends no eviction that would, on every path: moves and
EvictDirectly scale-downs; counted as the Eviction API counts them, see `healthy`, `covered`
and `arbitration`; one whose selector or amounts cannot be read is a problem for the
dead-letter topic, and protects nothing).

Every worker with the rebalancer role keeps this view; one of them leads (`lead`), and only
the leader steps jobs and writes. A follower records the last event of each migration's
reservation and which pods went; `lead(now)` replays them over the jobs in flight, so that
a job whose event the last leader never handled moves on (a step taken twice changes
nothing: a finished job ignores every input, a job past a step ignores that step's event).

Led, every `deschedulingInterval` `cycle(now)` plans over the bound pods and starts a
migration job per planned move (their Reservations go to `pods`, the jobs to `migrations`);
`actuate(now)` sends the evictions that jobs wait for, ReservationFirst moves through the
arbitration again and only with `evictionTTLMargin` of their ttl left, all through the
eviction rate limit (`TokenBucket`); `tick(now)` ends jobs past their ttl (each job records
its own, its profile's `defaultJobTTL` when it began). `scale_down` answers a ScaleDownEvent: with CalculateOnly the ranks go out as
`controller.kubernetes.io/pod-deletion-cost` annotations on the pods (a Pod update of a bound
pod on `pods`, which the scheduler ignores and a ReplicaSet controller, or the bridge that
patches the pod, acts on); with EvictDirectly the victims are evicted by jobs of mode
EvictDirectly (no replacement is reserved: the workload is shrinking).

The adapter delivers outputs in two waves: the MigrationJob records first, then what they
do. A leader that dies between the two left its jobs recorded one step ahead, so every effect
of a job can be derived from its record, and `lead` (after the events the jobs missed and the
ttl) sends again each one the topics do not show:
- a job recorded as reserving whose Reservation is not on `pods` (nor any event or feedback
  of it): the Reservation (`migration.reservation_of`, the same record);
- a job recorded as evicted (ReservationFirst replacing, EvictDirectly terminating) whose
  eviction `evictions` does not show, its pod still there: the EvictionCommand;
- a job recorded as ended with its reservation deleted (`released`) whose deletion `pods`
  does not show: the PodDeleted.
So nothing the jobs say happened is left undone. Each is the same record as the first time,
and sent twice only when the last leader's landed but was not read yet: a Reservation again
is the same pod again, a deletion again deletes nothing more, and the Eviction API answers a
pod already going with nothing new.

Memory holds the live view and the jobs in flight, not the history (`prune`, called by the
adapter): a finished job leaves `jobs` at once and is remembered as finished (`done`, so that
no late version brings it back) for `DONE_KEEP_S`; reservation events and feedback, and which
reservations were read on `pods`, are kept only for jobs not known to be finished, and those
of jobs never seen for `ORPHAN_KEEP_S`; a finished job's reservation deletion until it is read
(or for `DONE_KEEP_S`);
`moved_at` for the longest `moveInterval`; a scale-down plan per profile and workload.
The tail reads `pods` and `bindings` interleaved in no fixed order, so a short-lived pod's
Binding may be read after its PodDeleted (or before its Pod): a deleted uid is remembered in
`gone` for `GONE_KEEP_S` and a Binding read for it then is dropped (pod uids are never
reused), while a Binding read before its Pod is kept for the Pod to come. Memory of deletions
is bounded by the deletion rate times `GONE_KEEP_S`, not by history.

Counted for the metrics: evictions by reason, migrations finished by phase and reason, and
each profile's cluster objective as its last cycle measured it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial

from agents.ports import Output, Problem
from agents.rebalance import migration as mg
from agents.rebalance.arbitration import Arbitrator, Budget, TokenBucket, running
from agents.rebalance.binpack import DELETION_COST, ScaleDownPlan
from agents.rebalance.objective import Objective
from agents.rebalance.rebalancer import Rebalancer, budget_of
from agents.rebalance.view import TERMINAL
from agents.scheduler.plugins.args import ArgsError
from agents.state import reservations
from schemas import topics
from schemas.records import (
    Binding,
    EvictionCommand,
    EvictionRefused,
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

RESERVATION_SUFFIX = mg.RESERVATION_SUFFIX
MOVE_REASON = "rebalance: FragmentationAware"
SCALE_DOWN_REASON = "rebalance: ScaleDownBinPack"
DONE_KEEP_S = 3600.0  # a finished job's uid is remembered this long (no later version revives it)
ORPHAN_KEEP_S = 600.0  # an event for a job not seen yet is kept this long
EVICTED_KEEP_S = 600.0  # a pod an eviction was sent for is left alone this long, unless deleted
GONE_KEEP_S = 600.0  # a deleted pod's uid is remembered this long: its Binding read later is dropped
PRUNE_EVERY_S = 10.0
_SEQUENCE = re.compile(r"-([0-9]+)$")


@dataclass
class RebalancerService:
    rebalancer: Rebalancer
    clock: Callable[[], float]
    leading: bool = False
    nodes: dict[str, Node] = field(default_factory=dict)
    pods: dict[str, Pod] = field(default_factory=dict)
    bound: dict[str, str] = field(default_factory=dict)  # pod uid -> node
    jobs: dict[str, MigrationJob] = field(default_factory=dict)  # unfinished, by job uid
    active: dict[str, str] = field(default_factory=dict)  # pod uid -> its unfinished job
    done: dict[str, float] = field(default_factory=dict)  # finished job uid -> when it was seen finished
    departed: dict[str, Pod] = field(default_factory=dict)  # deleted pods of unfinished jobs
    gone: dict[str, float] = field(default_factory=dict)  # deleted pod uid -> when its deletion was read
    evicted: dict[str, float] = field(default_factory=dict)  # pod uid -> when its eviction was sent
    refused: dict[str, tuple[str, float]] = field(default_factory=dict)  # pod uid -> (why, when) its eviction was refused
    moved_at: dict[str, float] = field(default_factory=dict)  # pod uid -> when its last move began
    events: dict[str, tuple[ReservationEvent, float]] = field(default_factory=dict)  # reservation -> last event
    # A job's reservation read on `pods` -> (whether its deletion was read, when it was read).
    posted: dict[str, tuple[bool, float]] = field(default_factory=dict)
    releasing: dict[str, tuple[MigrationJob, float]] = field(default_factory=dict)  # deletion not read yet
    unschedulable: dict[str, float] = field(default_factory=dict)  # reservations that fit nowhere
    budgets: dict[str, Budget] = field(default_factory=dict)  # PodDisruptionBudget uid -> budget
    problems: list[Problem] = field(default_factory=list)  # bad inputs, for the dead-letter topic (drained by the adapter)
    scale_downs: dict[tuple[str, str], ScaleDownPlan] = field(default_factory=dict)  # (profile, workload) -> plan
    evictions: Counter[str] = field(default_factory=Counter)
    finished: Counter[tuple[str, str]] = field(default_factory=Counter)  # (phase, reason) -> jobs
    objective: dict[str, tuple[Objective, Objective]] = field(default_factory=dict)  # profile -> (now, planned)
    sequence: int = 0
    pruned: float = 0.0
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
            elif isinstance(r, Reservation) and r.uid.endswith(RESERVATION_SUFFIX):
                if not self.posted.get(r.uid, (False, 0.0))[0]:
                    self.posted[r.uid] = (False, now)
            elif isinstance(r, PodDeleted):
                if r.uid.endswith(RESERVATION_SUFFIX):
                    self.posted[r.uid] = (True, now)
                    self.releasing.pop(r.uid, None)
                out += self._deleted(r.uid, now)
            elif isinstance(r, Binding):
                if r.uid not in self.gone:  # read after its pod's deletion: it binds nothing any more
                    self.bound[r.uid] = r.node
            elif isinstance(r, EvictionCommand):
                self.refused.pop(r.uid, None)
                if r.uid in self.pods:
                    self.evicted[r.uid] = now  # whoever sent it (a past leader, a preemption): the pod is going
            elif isinstance(r, EvictionRefused):
                self.evicted.pop(r.uid, None)  # the pod stays
                self.refused[r.uid] = (r.reason, now)
                job = self.active.get(r.uid)
                if job is not None:
                    out += self._apply(job, partial(mg.on_eviction_rejected, reason=r.reason, now=now))
            elif isinstance(r, ReservationEvent) and r.uid.endswith(RESERVATION_SUFFIX):
                if r.phase in (reservations.SUCCEEDED, reservations.FAILED):
                    self.bound.pop(r.uid, None)  # a reservation's Binding: it holds nothing any more
                job = r.uid.removesuffix(RESERVATION_SUFFIX)
                if job not in self.done:
                    self.events[r.uid] = (r, now)
                    out += self._apply(job, partial(mg.on_reservation, event=r, now=now, pods=self.pods))
            elif isinstance(r, SchedulingFeedback) and r.final and r.uid.endswith(RESERVATION_SUFFIX):
                job = r.uid.removesuffix(RESERVATION_SUFFIX)
                if job not in self.done:
                    self.unschedulable[r.uid] = now
                    out += self._apply(job, partial(mg.on_unschedulable, reservation_uid=r.uid, now=now))
            elif isinstance(r, MigrationJob):
                self._read_back(r, now)
            elif isinstance(r, PodDisruptionBudget):
                self._budget(r)
        return out

    def _budget(self, pdb: PodDisruptionBudget) -> None:
        if pdb.deleted:
            self.budgets.pop(pdb.uid, None)
            return
        try:
            self.budgets[pdb.uid] = budget_of(pdb)
        except (ArgsError, ValueError) as exc:
            self.budgets.pop(pdb.uid, None)  # a budget that cannot be read protects nothing: said, not guessed
            field_name = exc.field if isinstance(exc, ArgsError) else "min_available/max_unavailable"
            value = exc.value if isinstance(exc, ArgsError) else f"{pdb.min_available}/{pdb.max_unavailable}"
            self.problems.append(Problem(field_name, str(value), str(exc), pdb))

    def _deleted(self, uid: str, now: float) -> list[Output]:
        self.gone[uid] = now
        pod = self.pods.pop(uid, None)
        node = self.bound.pop(uid, None)
        self.evicted.pop(uid, None)
        self.refused.pop(uid, None)
        job = self.active.get(uid)
        if job is None:
            self.moved_at.pop(uid, None)
            return []
        if pod is not None:  # counted against the limits until its job ends
            self.departed[uid] = replace(pod, node_name=node or self.jobs[job].source)
        return self._apply(job, partial(mg.on_pod_gone, uid=uid, now=now))

    def _read_back(self, job: MigrationJob, now: float) -> None:
        """A job as `migrations` has it. A finished one leaves memory and is remembered as
        finished; an unfinished one is kept unless this worker holds it at an equal or newer
        version, or knows it finished."""
        if job.uid in self.done:
            return
        mine = self.jobs.get(job.uid)
        if mine is not None and (mine.version > job.version or (mine.version == job.version
                                                                 and job.phase not in mg.FINISHED)):
            return  # older, or as new and not finished (of two equal versions, the finished one wins)
        self.moved_at[job.pod_uid] = max(self.moved_at.get(job.pod_uid, 0.0), job.created)
        found = _SEQUENCE.search(job.uid)
        self.sequence = max(self.sequence, int(found.group(1)) if found else 0)
        if job.phase in mg.FINISHED:
            if job.released and not self.posted.get(job.reservation, (False, 0.0))[0]:
                self.releasing[job.reservation] = (job, now)  # its deletion not read (yet)
            self._finish(job, now)
        else:
            self.jobs[job.uid] = job
            self.active[job.pod_uid] = job.uid

    def _finish(self, job: MigrationJob, now: float) -> None:
        self.jobs.pop(job.uid, None)
        self.done[job.uid] = now
        self.events.pop(job.reservation, None)
        self.unschedulable.pop(job.reservation, None)
        self.posted.pop(job.reservation, None)
        self.departed.pop(job.pod_uid, None)
        if self.active.get(job.pod_uid) == job.uid:
            del self.active[job.pod_uid]
        if job.pod_uid not in self.pods:
            self.moved_at.pop(job.pod_uid, None)

    def _apply(self, uid: str, step: Callable[[MigrationJob], mg.Step]) -> list[Output]:
        """Step one unfinished job (when leading)."""
        job = self.jobs.get(uid)
        if not self.leading or job is None:
            return []
        return self._step(step(job))

    def _step(self, step: mg.Step) -> list[Output]:
        job, outputs = step
        if job.phase in mg.FINISHED:
            self.finished[(job.phase, job.reason)] += 1
            self._finish(job, self.clock())
        else:
            self.jobs[job.uid] = job
            self.active[job.pod_uid] = job.uid
        return outputs

    def prune(self, now: float) -> None:
        """Forget what only history would keep (see the module docstring); at most every
        `PRUNE_EVERY_S`."""
        if now - self.pruned < PRUNE_EVERY_S:
            return
        self.pruned = now
        jobs = self.jobs
        self.done = {uid: t for uid, t in self.done.items() if now - t < DONE_KEEP_S}
        self.events = {k: v for k, v in self.events.items()
                       if k.removesuffix(RESERVATION_SUFFIX) in jobs or now - v[1] < ORPHAN_KEEP_S}
        self.unschedulable = {k: t for k, t in self.unschedulable.items()
                              if k.removesuffix(RESERVATION_SUFFIX) in jobs or now - t < ORPHAN_KEEP_S}
        self.posted = {k: v for k, v in self.posted.items()
                       if k.removesuffix(RESERVATION_SUFFIX) in jobs or now - v[1] < ORPHAN_KEEP_S}
        self.releasing = {k: v for k, v in self.releasing.items() if now - v[1] < DONE_KEEP_S}
        self.evicted = {uid: t for uid, t in self.evicted.items() if now - t < EVICTED_KEEP_S}
        self.refused = {uid: v for uid, v in self.refused.items() if uid in self.active or now - v[1] < EVICTED_KEEP_S}
        self.gone = {uid: t for uid, t in self.gone.items() if now - t < GONE_KEEP_S}
        keep = max((p.fragmentation.move_interval_s for p in self.rebalancer.config.profiles if p.fragmentation),
                   default=0.0)
        self.moved_at = {uid: t for uid, t in self.moved_at.items() if uid in self.active or now - t < keep}

    # -- leadership --------------------------------------------------------------------------

    def lead(self, now: float) -> list[Output]:
        """Become the leader (the jobs read back whole): apply what the jobs in flight may have
        missed, end the jobs past their ttl, then send again every effect a job's record says
        was sent and the topics do not show (see the module docstring): a reserving job's
        Reservation, an evicted job's eviction (its pod still there), an ended job's
        reservation deletion."""
        self.leading = True
        out: list[Output] = []
        for uid in list(self.jobs):
            job = self.jobs[uid]
            seen = self.events.get(job.reservation)
            steps = [partial(mg.on_reservation, event=seen[0], now=now, pods=self.pods)] if seen else []
            if job.reservation in self.unschedulable:
                steps.append(partial(mg.on_unschedulable, reservation_uid=job.reservation, now=now))
            if job.pod_uid not in self.pods:
                steps.append(partial(mg.on_pod_gone, uid=job.pod_uid, now=now))
            if job.pod_uid in self.refused:
                steps.append(partial(mg.on_eviction_rejected, reason=self.refused[job.pod_uid][0], now=now))
            for step in steps:
                out += self._apply(uid, step)
        out += self.tick(now)
        for job in list(self.jobs.values()):
            pod = self.pods.get(job.pod_uid)
            if pod is None or job.phase != mg.RUNNING:
                continue
            if (job.step == mg.RESERVING and job.reservation not in self.posted and job.reservation not in self.events
                    and job.reservation not in self.unschedulable):
                reservation = mg.reservation_of(job, pod)
                if reservation is not None:
                    self.posted[reservation.uid] = (False, now)
                    out.append(Output(topics.PODS, reservation.uid, reservation))
            elif mg.sent_eviction(job) and job.pod_uid not in self.evicted:
                out += self._evict(job, now)
        for job, _ in list(self.releasing.values()):
            out.append(Output(topics.PODS, job.reservation, mg.deletion(job)))
        return out

    def follow(self) -> None:
        self.leading = False

    # -- the cycle ---------------------------------------------------------------------------

    def placed(self) -> list[Pod]:
        """The bound pods, as the planners see them (node_name set)."""
        return [replace(p, node_name=self.bound[uid]) for uid, p in self.pods.items() if uid in self.bound]

    def in_flight(self) -> list[tuple[Pod, str, str]]:
        """Every unfinished job's pod (deleted or not), source and destination."""
        out = []
        for j in self.jobs.values():
            pod = self.pods.get(j.pod_uid) or self.departed.get(j.pod_uid)
            if pod is not None:
                out.append((pod, j.source, j.reserved_on or j.destination))
        return out

    def _start(self, pod: Pod, source: str, destination: str, now: float, mode: str, profile: str) -> list[Output]:
        """A job for `pod`, with its profile's `defaultJobTTL` (recorded in the job)."""
        self.sequence += 1
        ttl_s = next(p.arbitration.job_ttl_s for p in self.rebalancer.config.profiles if p.name == profile)
        job = mg.new_job(pod, source=source, destination=destination, now=now, mode=mode, ttl_s=ttl_s,
                         sequence=self.sequence)
        self.moved_at[pod.uid] = now
        return self._step(mg.start(job, pod, now))

    def cycle(self, now: float) -> list[Output]:
        """Plan, and start a migration job per planned move (unless the profile is a dry run)."""
        if not self.leading:
            return []
        out: list[Output] = []
        staying = [p for p in self.placed() if p.uid not in self.evicted]
        plans = self.rebalancer.cycle(self.nodes.values(), staying, now=now, moved_at=self.moved_at,
                                      in_flight=self.in_flight(), budgets=list(self.budgets.values()),
                                      covered=self.covered(), healthy=self.healthy)
        for c in plans:
            self.objective[c.profile] = (c.moves.before, c.moves.after)
            args = next(p.fragmentation for p in self.rebalancer.config.profiles if p.name == c.profile)
            if args is None or args.dry_run:
                continue
            for move in c.moves.moves:
                out += self._start(self.pods[move.uid], move.source, move.destination, now, mg.RESERVATION_FIRST,
                                   c.profile)
        return out

    def healthy(self, pod: Pod) -> bool:
        """Healthy as the Eviction API counts it: Running (standing for Ready: the Pod record
        carries no Ready condition), not terminating, still there, not evicted already (the
        API's disruptedPods) and bound to a node that exists."""
        return (running(pod) and pod.uid in self.pods and pod.uid not in self.evicted
                and self.bound.get(pod.uid, "") in self.nodes)

    def covered(self) -> list[Pod]:
        """The pods the budgets count: every live pod that has not finished, bound or pending,
        and the deleted pods of unfinished jobs (their replacements may not be there yet)."""
        live = [p for p in self.pods.values() if p.phase not in TERMINAL]
        return live + [p for uid, p in self.departed.items() if uid not in self.pods]

    def actuate(self, now: float) -> list[Output]:
        """Evictions that jobs wait for, within the arbitration and the rate limit; every one,
        EvictDirectly included, within the PodDisruptionBudgets, each eviction of the batch
        counted. Every unfinished job counts against the limits, its pod deleted or not."""
        if not self.leading or not self.rebalancer.config.profiles:
            return []
        if not any(mg.eviction(job) is not None for job in self.jobs.values()):
            return []
        out: list[Output] = []
        departed = [p for p in self.departed.values() if p.uid not in self.pods]
        arbitrator = Arbitrator.over(self.rebalancer.config.profiles[0].arbitration, [*self.placed(), *departed],
                                     self.budgets.values(), covered=self.covered(), budget_healthy=self.healthy)
        waiting = []
        for job in self.jobs.values():
            pod = self.pods.get(job.pod_uid) or self.departed.get(job.pod_uid)
            if pod is None:
                continue
            if mg.eviction(job) is None:
                arbitrator.admit(pod, job.source)
            else:
                waiting.append((job, pod))
        margin = self.rebalancer.config.profiles[0].arbitration.eviction_ttl_margin_s
        for job, pod in waiting:
            moving = job.mode == mg.RESERVATION_FIRST
            if job.pod_uid not in self.pods or (moving and (mg.ttl_left(job, now) < margin
                                                            or arbitrator.refusal(pod, job.source))):
                continue  # too little ttl left: its reservation would go before the replacement came
            if not moving and arbitrator.budget_refusal(pod):
                continue  # a scale-down's eviction waits for its budget too (until its ttl)
            if not self.bucket.take():
                break
            arbitrator.admit(pod, job.source)
            out += self._step(mg.evicted(job, now))
            out += self._evict(job, now)
        return out

    def _evict(self, job: MigrationJob, now: float) -> list[Output]:
        reason = MOVE_REASON if job.mode == mg.RESERVATION_FIRST else SCALE_DOWN_REASON
        command = mg.command(job, reason)
        self.evictions[reason] += 1
        self.evicted[job.pod_uid] = now
        return [Output(topics.EVICTIONS, command.uid, command)]

    def tick(self, now: float) -> list[Output]:
        out: list[Output] = []
        for uid in list(self.active.values()):
            out += self._apply(uid, partial(mg.on_tick, now=now))
        return out

    # -- scale-down --------------------------------------------------------------------------

    def scale_down(self, event: ScaleDownEvent, now: float) -> tuple[list[Output], list[Problem]]:
        """Rank the workload's pods (every profile with ScaleDownBinPack), leaving out pods in
        flight or being evicted. CalculateOnly: the ranks as pod-deletion-cost annotations;
        EvictDirectly: the victims evicted by jobs. An event naming no workload here, or
        asking to remove fewer than one pod, is a problem naming the field. A follower answers
        nothing."""
        if not self.leading:
            return [], []
        if event.replicas < 1:
            return [], [Problem("replicas", str(event.replicas),
                                f"replicas={event.replicas}: a scale-down removes at least one pod", event)]
        staying = [p for p in self.placed() if p.uid not in self.active and p.uid not in self.evicted]
        try:
            plans = self.rebalancer.scale_down(self.nodes.values(), staying, event, now=now)
        except ValueError as exc:
            return [], [Problem("workload", f"{event.namespace}/{event.workload}", str(exc), event)]
        out: list[Output] = []
        for profile, plan in plans:
            self.scale_downs[(profile, plan.workload)] = plan
            args = next(p.binpack for p in self.rebalancer.config.profiles if p.name == profile)
            if args is not None and args.strategy == "EvictDirectly":
                for uid in plan.victims:
                    if uid not in self.active:
                        out += self._start(self.pods[uid], self.bound[uid], "", now, mg.EVICT_DIRECTLY, profile)
                continue
            for uid, cost in plan.costs.items():
                pod = self.pods[uid]
                if pod.annotations.get(DELETION_COST) != str(cost):
                    annotated = replace(pod, node_name=self.bound[uid], annotations={**pod.annotations,
                                                                                     DELETION_COST: str(cost)})
                    self.pods[uid] = annotated
                    out.append(Output(topics.PODS, uid, annotated))
        return out, []
