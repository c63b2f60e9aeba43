"""The rebalancer service, pure: records in, records out, on an injected clock. A ReservationFirst
move from plan to Succeeded, the ttl, the eviction rate limit, both scale-down strategies and a
bad event; a follower writes nothing, a late read-back never undoes a step, and a new leader
finishes what the last one missed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agents.ports import Output
from agents.rebalance import config
from agents.rebalance import migration as mg
from agents.rebalance.binpack import DELETION_COST
from agents.rebalance.rebalancer import Rebalancer
from agents.rebalance.service import RebalancerService
from schemas.records import (
    Binding,
    CurrentOwner,
    EvictionCommand,
    MigrationJob,
    Pod,
    PodDeleted,
    PodDisruptionBudget,
    Reservation,
    ReservationEvent,
    ScaleDownEvent,
    SchedulingFeedback,
)
from tests.unit.rebalance.conftest import NOW
from tests.unit.rebalance.test_fragmentation import lopsided

MOVES = ("profiles: [{name: p, plugins: {balance: {enabled: [FragmentationAware]}}, "
         "pluginConfig: [{name: FragmentationAware, args: {minPodAge: 0}}]}]")


def service(text: str = MOVES, leading: bool = True) -> tuple[RebalancerService, list[float]]:
    now = [NOW]
    svc = RebalancerService(Rebalancer(config.load(text)), lambda: now[0], leading=leading)
    node_list, pods = lopsided()
    svc.on_records([*node_list, *[replace(p, node_name="") for p in pods]])
    svc.on_records([Binding(uid=p.uid, namespace=p.namespace, name=p.name, node=p.node_name, attempt=0,
                            decision_key=p.uid) for p in pods])
    return svc, now


def available(job: MigrationJob, node: str = "") -> ReservationEvent:
    return ReservationEvent(name=job.reservation, uid=job.reservation, phase="Available", node=node or job.destination)


def consumed(job: MigrationJob, by: str = "") -> ReservationEvent:
    """The job's reservation consumed by pod `by` (a new pod of the workload by default), as
    its owner says it (Koordinator's status.currentOwners)."""
    by = by or f"{job.pod_uid}-new"
    return ReservationEvent(name=job.reservation, uid=job.reservation, phase="Succeeded", node=job.destination,
                            current_owners=(CurrentOwner(uid=by, namespace=job.namespace, name=by),))


def test_a_move_from_plan_to_succeeded() -> None:
    svc, now = service()
    out = svc.cycle(now[0])
    reservations = [o.record for o in out if isinstance(o.record, Reservation)]
    assert reservations and len(svc.jobs) == len(reservations)
    assert svc.objective["p"][1].std_sum < svc.objective["p"][0].std_sum  # the cycle's objective, as planned
    first = {j.pod_uid for j in svc.jobs.values()}
    again = [o.record for o in svc.cycle(now[0]) if isinstance(o.record, MigrationJob)]
    assert not first & {j.pod_uid for j in again}  # a pod in flight is not planned again
    job = next(iter(svc.jobs.values()))
    svc.on_records([available(job)])
    evicted = [o.record for o in svc.actuate(now[0]) if isinstance(o.record, EvictionCommand)]
    assert [e.uid for e in evicted] == [job.pod_uid]
    assert svc.actuate(now[0]) == []  # burst 1, 10/s: the next one waits
    svc.on_records([PodDeleted(uid=job.pod_uid, name=job.pod_name)])
    done = consumed(job)
    svc.on_records([done])
    assert job.uid in svc.done and job.uid not in svc.jobs and svc.finished[("Succeeded", mg.DONE)] == 1
    assert svc.on_records([done]) == []  # redelivered: nothing changes
    assert svc.evictions == {"rebalance: FragmentationAware": 1}


def test_jobs_past_their_ttl_abort_and_release() -> None:
    svc, now = service()
    svc.cycle(now[0])
    started = len(svc.jobs)
    out = svc.tick(now[0] + 301)
    assert started and not svc.jobs and not svc.active and svc.finished[("Aborted", mg.TTL)] == started
    assert len([o for o in out if isinstance(o.record, PodDeleted)]) == started


def test_a_reservation_that_fits_nowhere_aborts_its_job() -> None:
    svc, now = service()
    svc.cycle(now[0])
    job = next(iter(svc.jobs.values()))
    out = svc.on_records([SchedulingFeedback(uid=job.reservation, namespace="default", name=job.reservation, attempt=1,
                                             message="0/4 nodes are available", final=True)])
    [ended] = [o.record for o in out if isinstance(o.record, MigrationJob)]
    assert ended.phase == "Aborted" and ended.reason == mg.UNSCHEDULABLE and job.uid not in svc.jobs
    assert [o.record.uid for o in out if isinstance(o.record, PodDeleted)] == [job.reservation]


def test_a_scale_down_evicts_directly_when_asked() -> None:
    svc, now = service("profiles: [{name: p, plugins: {balance: {enabled: [ScaleDownBinPack]}}, "
                       "pluginConfig: [{name: ScaleDownBinPack, args: {strategy: EvictDirectly, maxPodsToEvict: 2}}]}]")
    _, problems = svc.scale_down(ScaleDownEvent(workload="ReplicaSet/mem", replicas=3), now[0])
    [plan] = svc.scale_downs.values()
    assert not problems and len(plan.victims) == 2 and len(svc.jobs) == 2
    sent = []
    for _ in range(3):
        sent += [o.record.uid for o in svc.actuate(now[0]) if isinstance(o.record, EvictionCommand)]
        now[0] += 0.1  # the rate limit: one eviction per 0.1 s
    assert sorted(sent) == sorted(plan.victims)
    assert len(svc.jobs) == 2 and not svc.finished  # Succeeded once the pods are gone, not when asked to go
    svc.on_records([PodDeleted(uid=uid) for uid in sent])
    assert not svc.jobs and svc.finished[("Succeeded", mg.EVICTED)] == 2
    assert svc.evictions["rebalance: ScaleDownBinPack"] == 2


def test_calculate_only_publishes_the_ranks_as_deletion_costs() -> None:
    svc, now = service("profiles: [{name: p, plugins: {balance: {enabled: [ScaleDownBinPack]}}}]")
    out, problems = svc.scale_down(ScaleDownEvent(workload="mem", replicas=3), now[0])
    [plan] = svc.scale_downs.values()
    annotated = {o.record.uid: o.record for o in out if isinstance(o.record, Pod)}
    assert not problems and set(annotated) == set(plan.costs) and not svc.jobs
    assert all(p.annotations[DELETION_COST] == str(plan.costs[uid]) and p.node_name for uid, p in annotated.items())
    again, _ = svc.scale_down(ScaleDownEvent(workload="mem", replicas=3), now[0])
    assert again == []  # the same ranks again: nothing to write


def test_a_scale_down_of_no_workload_here_is_a_problem_naming_it() -> None:
    svc, now = service("profiles: [{name: p, plugins: {balance: {enabled: [ScaleDownBinPack]}}}]")
    out, [problem] = svc.scale_down(ScaleDownEvent(workload="nothing", replicas=1), now[0])
    assert out == [] and problem.field == "workload" and "default/nothing" in problem.error
    out, [problem] = svc.scale_down(ScaleDownEvent(workload="mem", replicas=-1), now[0])
    assert out == [] and problem.field == "replicas" and problem.value == "-1"


def test_a_follower_writes_nothing_and_a_new_leader_finishes_what_was_missed() -> None:
    leader, now = service()
    written = [o.record for o in leader.cycle(now[0]) if isinstance(o.record, MigrationJob)]
    job = written[0]
    follower, _ = service(leading=False)
    assert follower.cycle(now[0]) == [] and follower.actuate(now[0]) == []
    follower.on_records(written)
    # The leader saw the reservation Available and recorded it, then died before the eviction.
    stepped = [o.record for o in leader.on_records([available(job)]) if isinstance(o.record, MigrationJob)]
    assert follower.on_records([available(job), *stepped]) == []
    assert follower.jobs[job.uid].step == mg.EVICTING
    follower.on_records([written[0]])  # read again, older: nothing undone
    assert follower.jobs[job.uid].step == mg.EVICTING
    # Another job's source pod went while nobody led.
    other = written[1]
    follower.on_records([PodDeleted(uid=other.pod_uid, name=other.pod_name)])
    out = follower.lead(now[0])
    assert other.uid in follower.done and follower.finished[("Aborted", mg.SOURCE_GONE)] == 1
    assert other.reservation in {o.record.uid for o in out if isinstance(o.record, PodDeleted)}
    evicted = [o.record.uid for o in follower.actuate(now[0]) if isinstance(o.record, EvictionCommand)]
    assert evicted == [job.pod_uid]


def test_a_finished_job_read_back_leaves_memory() -> None:
    svc, now = service(leading=False)
    leader, _ = service()
    written = [o.record for o in leader.cycle(now[0]) if isinstance(o.record, MigrationJob)]
    svc.on_records(written)
    ended = [o.record for o in leader.tick(now[0] + 301) if isinstance(o.record, MigrationJob)]
    svc.on_records(ended)
    assert not svc.jobs and not svc.active
    assert all(svc.moved_at[j.pod_uid] == now[0] for j in written)  # still not moved again too soon


def test_a_new_leader_sends_an_eviction_recorded_but_not_seen_and_only_that() -> None:
    """The last leader recorded a job as evicted (its records go first) and died: if
    `evictions` shows the command, the new leader sends nothing; if not, it sends it."""
    leader, now = service()
    written = [o.record for o in leader.cycle(now[0]) if isinstance(o.record, MigrationJob)]
    log = [*written, *[o.record for o in leader.on_records([available(j) for j in written[:2]])]]
    sent = leader.actuate(now[0])
    now[0] += 0.1
    sent += leader.actuate(now[0])
    log += [o.record for o in sent if isinstance(o.record, MigrationJob)]
    commands = [o.record for o in sent if isinstance(o.record, EvictionCommand)]
    assert len(commands) == 2
    for seen in (True, False):
        follower, _ = service(leading=False)
        follower.on_records([*[available(j) for j in written[:2]], *log, *(commands if seen else [])])
        again = [o.record.uid for o in follower.lead(now[0]) if isinstance(o.record, EvictionCommand)]
        assert again == ([] if seen else [c.uid for c in commands])


def test_a_disruption_budget_holds_moves_back_and_a_bad_one_is_a_problem() -> None:
    blocked, now = service()
    blocked.on_records([PodDisruptionBudget(uid="default/all", name="all", selector={},
                                            max_unavailable="0")])
    assert blocked.cycle(now[0]) == [] and not blocked.problems  # an empty selector covers every pod
    blocked.on_records([PodDisruptionBudget(uid="default/all", name="all", deleted=True)])
    assert [o for o in blocked.cycle(now[0]) if isinstance(o.record, MigrationJob)]
    bad, _ = service()
    bad.on_records([PodDisruptionBudget(uid="default/x", name="x", selector={
        "matchExpressions": [{"key": "app", "operator": "Near", "values": ["a"]}]})])
    [problem] = bad.problems
    assert problem.field.endswith("matchExpressions[0].operator") and problem.value == "Near" and not bad.budgets


def test_a_sibling_reservation_consumed_ends_neither_the_waiting_move_nor_its_reservation() -> None:
    """Two moves of one workload: J1 evicted c00 and waits for its replacement; another new
    pod of the workload is bound into J2's reservation. J2 ends (nothing evicted: its
    reservation is gone); J1 goes on waiting with its reservation live (it is not told who
    consumed J2's, and a guess would delete capacity c00's replacement may still need). J1
    ends Succeeded only when its own reservation is consumed by a replacement."""
    svc, now = service()
    svc.cycle(now[0])
    first, second = sorted((j for j in svc.jobs.values() if j.workload.endswith("/cpu")), key=lambda j: j.uid)[:2]
    svc.on_records([available(first), available(second)])
    assert [o.record.uid for o in svc.actuate(now[0]) if isinstance(o.record, EvictionCommand)] == [first.pod_uid]
    svc.on_records([PodDeleted(uid=first.pod_uid, name=first.pod_name)])
    out = svc.on_records([consumed(second, by="c-new")])
    ended = {o.record.uid: o.record for o in out if isinstance(o.record, MigrationJob)}
    assert set(ended) == {second.uid} and (ended[second.uid].phase, ended[second.uid].reason) == (
        "Aborted", mg.CONSUMED_EARLY)
    assert [o for o in out if isinstance(o.record, PodDeleted)] == []  # J1's reservation stays
    assert svc.jobs[first.uid].step == mg.REPLACING and first.uid not in svc.done
    now[0] += 10
    assert [o for o in svc.tick(now[0]) + svc.actuate(now[0]) if isinstance(o.record, PodDeleted)] == []
    out = svc.on_records([consumed(first, by="c-newer")])
    [done] = [o.record for o in out if isinstance(o.record, MigrationJob)]
    assert (done.phase, done.reason) == ("Succeeded", mg.DONE) and not [o for o in out if isinstance(o.record, PodDeleted)]


def test_the_job_ttl_is_the_migration_controllers_default_job_ttl() -> None:
    """`defaultJobTTL` (MigrationController, Koordinator's arg, 5 min by default) is each job's
    ttl and its reservation's: it bounds how long a move whose replacement went into a
    sibling's reservation holds its own, waiting (the sibling case above). Set to 40 s, J1 keeps
    its reservation live through 39.9 s and is Aborted at 40 s, its reservation deleted; the
    Reservation says 40 s too, so the scheduler expires it at the same time (was fixed at
    300 s: the integration run's moves could not settle within 90 s)."""
    text = MOVES.replace("pluginConfig: [", "pluginConfig: [{name: MigrationController, args: "
                         "{defaultJobTTL: 40s, evictionTTLMargin: 10s}}, ", 1)
    svc, now = service(text)
    out = svc.cycle(now[0])
    assert {r.ttl_s for r in records(out, Reservation)} == {40.0} and {j.ttl_s for j in records(out, MigrationJob)} == {40.0}
    first, second = sorted((j for j in svc.jobs.values() if j.workload.endswith("/cpu")), key=lambda j: j.uid)[:2]
    svc.on_records([available(first), available(second)])
    assert [o.record.uid for o in svc.actuate(now[0]) if isinstance(o.record, EvictionCommand)] == [first.pod_uid]
    svc.on_records([PodDeleted(uid=first.pod_uid, name=first.pod_name), consumed(second, by="c-new")])
    now[0] += 39.9
    assert not records(svc.tick(now[0]), PodDeleted) and svc.jobs[first.uid].step == mg.REPLACING
    now[0] += 0.1
    out = svc.tick(now[0])
    ended = {j.uid: j for j in records(out, MigrationJob)}
    assert (ended[first.uid].phase, ended[first.uid].reason) == ("Aborted", mg.TTL)
    assert first.reservation in {d.uid for d in records(out, PodDeleted)}


# -- a leader that died between a job's record and its effect (issue 28, item 5) --------------

EVICT_DIRECTLY = ("profiles: [{name: p, plugins: {balance: {enabled: [ScaleDownBinPack]}}, "
                  "pluginConfig: [{name: ScaleDownBinPack, args: {strategy: EvictDirectly, maxPodsToEvict: 2}}]}]")


def records(outputs: list[Output], kind: type) -> list[Any]:
    return [o.record for o in outputs if isinstance(o.record, kind)]


def test_a_new_leader_sends_a_reservation_recorded_but_not_seen_and_only_that() -> None:
    """The last leader recorded its jobs as reserving and died before their Reservations went
    out: the new leader sends each again, the same record; one that `pods` shows is not sent."""
    leader, now = service()
    out = leader.cycle(now[0])
    written, sent = records(out, MigrationJob), records(out, Reservation)
    assert len(sent) >= 2
    for seen in (True, False):
        follower, _ = service(leading=False)
        follower.on_records([*written, *(sent[:1] if seen else [])])
        again = records(follower.lead(now[0] + 1), Reservation)
        assert again == (sent[1:] if seen else sent)  # the same records: the ttl counts from the job's start
        assert all(r.creation_timestamp == now[0] for r in again)


def test_a_new_leader_deletes_an_aborted_jobs_reservation_whose_deletion_was_lost() -> None:
    """A job aborted (its reservation fits nowhere) and recorded so; the deletion of its
    reservation was lost with the leader. The next leader deletes it (whichever order it read
    the topics in, once: a deletion `pods` shows is not sent again)."""
    leader, now = service()
    out = leader.cycle(now[0])
    written, posted = records(out, MigrationJob), records(out, Reservation)
    job = written[0]
    ended = leader.on_records([SchedulingFeedback(uid=job.reservation, namespace="default", name=job.reservation,
                                                  attempt=1, message="0/4 nodes are available", final=True)])
    [aborted], [deletion] = records(ended, MigrationJob), records(ended, PodDeleted)
    assert aborted.released and deletion.uid == job.reservation
    lost, _ = service(leading=False)
    lost.on_records([*written, *posted, aborted])
    assert records(lost.lead(now[0] + 1), PodDeleted) == [deletion]
    for log in ([*written, *posted, aborted, deletion], [*posted, deletion, *written, aborted]):
        seen, _ = service(leading=False)
        seen.on_records(log)
        assert records(seen.lead(now[0] + 1), PodDeleted) == []


def test_a_new_leader_sends_a_direct_eviction_recorded_but_not_seen() -> None:
    """A scale-down's EvictDirectly job recorded its eviction as sent; the eviction was lost
    with the leader. The job is not Succeeded (its pod is still there): the next leader sends
    the eviction, and the job ends Succeeded when the pod goes."""
    leader, now = service(EVICT_DIRECTLY)
    started, _ = leader.scale_down(ScaleDownEvent(workload="ReplicaSet/mem", replicas=3), now[0])
    stepped = leader.actuate(now[0])
    [command] = records(stepped, EvictionCommand)
    [job] = [j for j in records(stepped, MigrationJob) if j.pod_uid == command.uid]
    assert job.phase == mg.RUNNING and job.step == mg.TERMINATING
    for seen in (True, False):
        follower, _ = service(EVICT_DIRECTLY, leading=False)
        follower.on_records([*records(started, MigrationJob), job, *([command] if seen else [])])
        again = records(follower.lead(now[0] + 1), EvictionCommand)
        assert again == ([] if seen else [command])
        assert follower.jobs[job.uid].step == mg.TERMINATING
        [done] = records(follower.on_records([PodDeleted(uid=command.uid)]), MigrationJob)
        assert (done.phase, done.reason) == (mg.SUCCEEDED, mg.EVICTED)


def test_an_eviction_the_api_server_refuses_ends_its_move_and_a_new_leader_ends_it_too() -> None:
    """The bridge reports an eviction the API server refused for good (`EvictionRefused`,
    after retrying a PodDisruptionBudget's 429): the pod stays, so its move ends Aborted and
    its reservation is deleted; a leader that read the refusal as a follower ends it on taking
    over, and does not send the eviction again."""
    from schemas.records import EvictionRefused

    for leading in (True, False):
        svc, now = service()
        svc.cycle(now[0])
        job = next(iter(svc.jobs.values()))
        svc.on_records([available(job)])
        [evicted] = [o.record for o in svc.actuate(now[0]) if isinstance(o.record, EvictionCommand)]
        refusal = EvictionRefused(uid=evicted.uid, namespace=evicted.namespace, name=evicted.name,
                                  node=evicted.node, reason="429 TooManyRequests: would violate budget", status=429)
        if not leading:
            svc.follow()
        out = svc.on_records([evicted, refusal])
        if not leading:
            assert out == [] and job.uid in svc.jobs
            out = svc.lead(now[0])
            assert not [o for o in out if isinstance(o.record, EvictionCommand)], "the refused eviction was sent again"
        [ended] = [o.record for o in out if isinstance(o.record, MigrationJob)]
        assert ended.phase == "Aborted" and ended.reason.startswith(mg.EVICTION_REJECTED), ended.reason
        assert [o.record.uid for o in out if isinstance(o.record, PodDeleted)] == [job.reservation]
        assert evicted.uid not in svc.evicted and job.uid not in svc.jobs
