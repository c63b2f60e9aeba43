"""The scheduler core: fit, least-allocated, assume / forget, requeue with backoff, parking."""

from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.state.owner import NodeOwner, NodeState, OwnerResult
from agents.state.resources import ResourceSpace
from schemas.records import (
    Claim,
    Commit,
    NodeStateChange,
    PodDeleted,
    Requeue,
    ResourceList,
    SchedulingFeedback,
)
from tests.builders import make_node, make_pod


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def changes_for(*nodes) -> list[NodeStateChange]:
    out = []
    for node in nodes:
        result = OwnerResult()
        NodeOwner().apply(NodeState(node.name), [node], result)
        out += [o.record for o in result.outputs]
    return out


def make_core(*nodes) -> tuple[SchedulerCore, FakeClock]:
    clock = FakeClock()
    space = ResourceSpace()
    core = SchedulerCore(space, ClusterState(space, capacity=2), clock)
    core.apply_state_changes(changes_for(*nodes))
    return core, clock


def claims(outputs) -> list[Claim]:
    return [o.record for o in outputs if isinstance(o.record, Claim)]


def test_least_allocated_spreads_and_assumptions_count() -> None:
    core, _ = make_core(make_node("a", cpu=2000), make_node("b", cpu=2000), make_node("c", cpu=4000))
    for i in range(4):
        core.add(make_pod(f"p{i}", cpu=1000, memory=0))
    placed = [c.node for c in claims(core.schedule())]
    assert placed == ["c", "a", "b", "c"]  # the emptiest node first; ties by node index


def test_pod_that_fits_nowhere_gets_feedback_and_returns_on_a_cluster_event() -> None:
    core, clock = make_core(make_node("a", cpu=1000))
    core.add(make_pod("big", cpu=3000))
    [out] = core.schedule()
    assert isinstance(out.record, SchedulingFeedback)
    assert out.record.reasons == {"Insufficient cpu": 1} and not out.record.final
    assert "0/1 nodes are available: 1 Insufficient cpu" in out.record.message
    clock.now += 10  # past its backoff; still nothing without a cluster event
    assert core.schedule() == []
    core.apply_state_changes(changes_for(make_node("b", cpu=4000)))
    assert [c.node for c in claims(core.schedule())] == ["b"]


def test_unknown_resource_is_final_feedback_not_a_retry_loop() -> None:
    core, _ = make_core(make_node("a"))
    out = core.add(make_pod("x").__class__(uid="x", name="x", requests=ResourceList({"example.com/foo": 1})))
    assert out[0].record.final and "example.com/foo" in out[0].record.message
    assert core.schedule() == []


def test_requeue_forgets_the_assumption_and_backs_off_on_the_clock() -> None:
    core, clock = make_core(make_node("a", cpu=1000))
    core.add(make_pod("p", cpu=1000))
    [claim] = claims(core.schedule())
    assert core.state.assumed[0][0] == 1000
    core.requeue(Requeue(uid="p", attempt=1, decision_key="p"))
    assert core.state.assumed[0][0] == 0
    assert core.schedule() == []  # still backing off
    clock.now += 1.0
    [retry] = claims(core.schedule())
    assert (retry.attempt, retry.node) == (1, "a")
    core.requeue(Requeue(uid="p", attempt=1, decision_key="p"))  # replayed: ignored
    assert core.pending == 0
    core.requeue(Requeue(uid="p", attempt=4, decision_key="p"))  # the decider knows a later attempt
    clock.now += 1.0
    [again] = claims(core.schedule())
    assert again.attempt == 4


def test_state_change_forgets_assumption_and_commit_drops_the_pod() -> None:
    clock = FakeClock()
    space = ResourceSpace()
    core = SchedulerCore(space, ClusterState(space), clock)
    state, owner = NodeState("a"), NodeOwner()
    result = OwnerResult()
    owner.apply(state, [make_node("a", cpu=1000)], result)
    core.apply_state_changes(o.record for o in result.outputs)
    core.add(make_pod("p", cpu=600))
    [claim] = claims(core.schedule())
    result = OwnerResult()
    owner.apply(state, [claim], result)
    assert not [o for o in result.outputs if isinstance(o.record, NodeStateChange)]  # a plain hold: no report
    assert core.state.used[0][0] == 0 and list(core.state.assumptions) == [claim.hold_id]
    result = OwnerResult()
    owner.apply(state, [make_node("a", cpu=1200)], result)  # the node's next report names the hold
    core.apply_state_changes([o.record for o in result.outputs if isinstance(o.record, NodeStateChange)])
    assert core.state.assumptions == {} and core.state.used[0][0] == 600
    assert "p" in core.pods
    result = OwnerResult()
    owner.apply(state, [Commit(uid="p", attempt=0, node="a", decision_key="p")], result)
    core.apply_state_changes(o.record for o in result.outputs)
    assert "p" not in core.pods
    assert core.add(make_pod("p", cpu=600)) == [] and core.schedule() == []  # an update of a bound pod


def test_deletion_is_forwarded_with_the_first_versions_decision_key() -> None:
    core, _ = make_core(make_node("a"))
    core.add(make_pod("p", namespace="ns", annotations={"gang.scheduling.koordinator.sh/name": "g"}))
    [out] = core.delete(PodDeleted(uid="p"))
    assert (out.topic, out.key) == ("holds", "ns/g")


def test_nothing_of_a_deleted_pod_stays_in_the_replicas_maps() -> None:
    """Issue 12: the replica kept every deleted pod's decision key and arrival for ever."""
    core, _ = make_core(make_node("a", cpu=64000))
    gang = {"gang.scheduling.koordinator.sh/name": "g", "gang.scheduling.koordinator.sh/min-available": "2"}
    pods = [make_pod(f"p{i}", cpu=100) for i in range(5)] + \
           [make_pod(f"g{i}", cpu=100, namespace="ns", annotations=gang) for i in range(2)]
    for pod in pods:
        core.add(pod)
    core.requeue(Requeue(uid="late", attempt=2, decision_key="late"))  # read before its pod
    core.schedule()
    assert core.decision_keys and core._group_arrival == {"ns/g": core.pods["g0"].info.group_arrival}
    for pod in [*pods, make_pod("late")]:
        core.delete(PodDeleted(uid=pod.uid))
    assert (core.pods, core.decision_keys, core._group_arrival, core._gang_members, core.requeued,
            core.bound) == ({}, {}, {}, {}, {}, set())


def test_a_gang_keeps_its_place_in_the_queue_while_some_of_its_pods_are_there() -> None:
    core, _ = make_core()
    gang = {"gang.scheduling.koordinator.sh/name": "g"}
    core.add(make_pod("g0", namespace="ns", annotations=gang))
    core.add(make_pod("solo"))
    core.add(make_pod("g1", namespace="ns", annotations=gang))
    assert core.pods["g1"].info.group_arrival == core.pods["g0"].info.group_arrival < core.pods["solo"].info.arrival
    core.delete(PodDeleted(uid="g0"))
    core.add(make_pod("g2", namespace="ns", annotations=gang))
    assert core.pods["g2"].info.group_arrival == core.pods["g1"].info.group_arrival


def test_reports_apply_in_arrival_order_even_when_a_restarted_owner_repeats_seq() -> None:
    core, _ = make_core(make_node("a", cpu=1000))
    core.add(make_pod("p", cpu=600))
    [claim] = claims(core.schedule())
    restarted = NodeState("a")  # a table restored behind what was published: seq starts over
    result = OwnerResult()
    NodeOwner().apply(restarted, [make_node("a", cpu=1000), claim], result)
    core.apply_state_changes(o.record for o in result.outputs if isinstance(o.record, NodeStateChange))
    assert core.state.assumptions == {}  # forgotten although its seq is not new
    assert core.state.used[0][0] == 600


def test_commit_seen_drops_a_queued_copy_of_the_pod() -> None:
    core, _ = make_core(make_node("a", cpu=1000))
    core.add(make_pod("p", cpu=600))  # e.g. re-read from `pods` after a restart
    core.apply_state_changes([NodeStateChange(node="a", seq=9, allocatable=ResourceList(cpu=1000),
                                              used=ResourceList(cpu=600), holds={"p/0/b": "committed"})])
    assert core.schedule() == [] and "p" not in core.pods


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 8000), min_size=1, max_size=12),
       st.lists(st.tuples(st.integers(1, 4000), st.integers(0, 3)), min_size=1, max_size=60))
def test_claims_never_exceed_what_the_replica_has_free(node_cpus: list[int], pods: list[tuple[int, int]]) -> None:
    core, _ = make_core(*[make_node(f"n{i}", cpu=c) for i, c in enumerate(node_cpus)])
    for i, (cpu, priority) in enumerate(pods):
        core.add(make_pod(f"p{i}", cpu=cpu, memory=0, priority=priority))
    claimed: dict[str, int] = {}
    for claim in claims(core.schedule(limit=7) + core.schedule(limit=1000)):
        claimed[claim.node] = claimed.get(claim.node, 0) + claim.requests["cpu"]
    for i, cpu in enumerate(node_cpus):
        assert claimed.get(f"n{i}", 0) <= cpu
    # A pod that got no claim fits on no node given what was claimed.
    placed = {c for c in core.state.assumptions}
    assert len(placed) == sum(1 for q in core.pods.values() if q.state == "claimed")


def test_replica_keeps_node_records_and_nominations_for_the_filters() -> None:
    from schemas.records import Nomination

    core, _ = make_core(make_node("a", labels={"zone": "z1"}))
    assert core.state.records[0].labels == {"zone": "z1"}
    nomination = Nomination(uid="x", node="a", priority=5, requests=ResourceList(cpu=100))
    core.apply_state_changes([NodeStateChange(node="a", seq=2, allocatable=ResourceList(cpu=4000),
                                              nominations=(nomination,))])
    assert core.state.nominator.of("x") == nomination and core.state.records[0].labels == {"zone": "z1"}


def test_a_waiting_pod_adopts_a_later_attempt_from_its_decider() -> None:
    core, _ = make_core(make_node("a"))
    core.add(make_pod("p"))  # re-read after a restart, before its old Requeue arrives
    core.requeue(Requeue(uid="p", attempt=2, decision_key="p"))
    [claim] = claims(core.schedule())
    assert claim.attempt == 2



def test_fit_counts_other_pods_nominations_of_equal_or_higher_priority() -> None:
    from schemas.records import Nomination

    core, _ = make_core(make_node("a", cpu=1000), make_node("b", cpu=1000))
    nomination = Nomination(uid="boss", node="a", priority=10, requests=ResourceList(cpu=800))
    core.apply_state_changes([NodeStateChange(node="a", seq=5, allocatable=make_node("a", cpu=1000).allocatable,
                                              nominations=(nomination,))])
    for uid, priority in [("low", 9), ("peer", 10), ("high", 11), ("boss", 10)]:
        core.add(make_pod(uid, cpu=500, memory=0, priority=priority))
    placed = {c.uid: c.node for c in claims(core.schedule())}
    # Queue order: high (11), then peer and boss (10, by arrival), then low (9).
    assert placed == {
        "high": "a",  # a higher priority does not count the nomination: a ties b, lowest index wins
        "peer": "b",  # equal priority counts it: a has 500 left, less the 800 promised to boss
        "boss": "a",  # a preemptor is never blocked by its own nomination
        "low": "b",
    }


def test_attempts_are_counted_by_result_per_profile() -> None:
    core, _ = make_core(make_node("a", cpu=2000))
    core.add(make_pod("fits", cpu=1000))
    core.add(make_pod("too-big", cpu=3000))
    core.schedule()
    profile = make_pod("x").scheduler_name
    assert core.attempts == {(profile, "scheduled"): 1, (profile, "unschedulable"): 1}


def test_pods_placed_in_an_equivalence_class_are_counted_apart_from_the_full_path() -> None:
    """`batched` (the fast path's share in a perf run): the members of a run of identical pods,
    not a pod alone nor one that differs from its neighbours."""
    core, _ = make_core(make_node("a", cpu=8000), make_node("b", cpu=8000))
    for i in range(5):
        core.add(make_pod(f"same-{i}", cpu=500))
    core.add(make_pod("other", cpu=700))
    core.schedule()
    profile = make_pod("x").scheduler_name
    assert core.attempts[profile, "scheduled"] == 6 and core.batched[profile] == 5


def test_a_claim_is_outstanding_until_decided_not_until_held() -> None:
    """`claims_out` (what `scheduling.max_outstanding_claims` counts): a held claim stays
    outstanding; a rejected one, a failed send and a deleted pod end it."""
    core, _ = make_core(make_node("a", cpu=1000))
    for uid in ("held", "refused", "unsent", "gone"):
        core.add(make_pod(uid, cpu=200, memory=0))
    placed = {c.uid: c for c in claims(core.schedule())}
    assert set(core.claims_out) == set(placed)
    state, result = NodeState("a"), OwnerResult()
    NodeOwner().apply(state, [make_node("a", cpu=300), placed["held"], placed["refused"]], result)  # room for one
    core.apply_state_changes(o.record for o in result.outputs if isinstance(o.record, NodeStateChange))
    core.unclaim([placed["unsent"]])
    core.delete(PodDeleted(uid="gone"))
    assert core.state.assumptions == {} and core.claims_out == {"held": placed["held"].hold_id}
