"""One admission rule (`agents.state.admission`): an owner deciding a claim and a scheduler
replica filtering the same pod with NodeResourcesFit, fed the owner's report of the node, agree
on random nodes (held, committed, released and terminated claims, nominations of every
priority, resizes, small pod limits) for probes of every priority and size; and the rule's
pieces on their own."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.scheduler.framework.interface import ALL
from agents.scheduler.plugins.noderesources import Fit
from agents.state import admission
from agents.state.owner import REJECTED, NodeOwner, NodeState, OwnerResult
from agents.state.resources import ResourceSpace
from schemas.records import Claim, Commit, Nomination, PodTerminated, Record, Release, ResourceList
from tests.builders import make_node, make_pod
from tests.unit.scheduler.conftest import info, prepared
from tests.unit.test_scheduler_core import FakeClock

GI = 2**30


def claim(uid: str, cpu: int, memory: int, priority: int) -> Claim:
    return Claim(uid=uid, attempt=0, node="n1", decision_key=uid, priority=priority,
                 requests=ResourceList({"cpu": cpu, "memory": memory, "pods": 1}))


op = st.one_of(
    st.tuples(st.just("claim"), st.integers(0, 7), st.integers(0, 3000), st.integers(0, 4), st.integers(0, 3)),
    st.tuples(st.just("commit"), st.integers(0, 7), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.just("release"), st.integers(0, 7), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.just("terminate"), st.integers(0, 7), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.just("nominate"), st.integers(0, 9), st.integers(0, 3000), st.integers(0, 4), st.integers(0, 3)),
    st.tuples(st.just("resize"), st.just(0), st.sampled_from([1000, 4000, 8000]), st.integers(1, 4), st.just(0)),
)


def record(kind: str, pod: int, cpu: int, memory_gi: int, priority: int) -> Record:
    uid = f"p{pod}"
    if kind == "claim":
        return claim(uid, cpu, memory_gi * GI, priority)
    if kind == "commit":
        return Commit(uid=uid, attempt=0, node="n1", decision_key=uid)
    if kind == "release":
        return Release(uid=uid, attempt=0, node="n1", decision_key=uid)
    if kind == "terminate":
        return PodTerminated(uid=uid, node="n1")
    if kind == "nominate":
        return Nomination(uid=uid, node="n1", priority=priority,
                          requests=ResourceList({"cpu": cpu, "memory": memory_gi * GI, "pods": 1}))
    return make_node("n1", cpu=cpu, memory=8 * GI, pods=memory_gi + 2)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, max_size=14),
       probe=st.tuples(st.sampled_from(["new", "p0", "p8"]), st.integers(0, 4000), st.integers(0, 8), st.integers(0, 3)))
def test_owner_and_scheduler_admit_the_same_claims(ops: list[tuple[str, int, int, int, int]],
                                                     probe: tuple[str, int, int, int]) -> None:
    owner, node = NodeOwner(), NodeState("n1")
    owner.apply(node, [make_node("n1", cpu=4000, memory=8 * GI, pods=4)], OwnerResult())
    for o in ops:
        owner.apply(node, [record(*o)], OwnerResult())

    space = ResourceSpace()
    replica = SchedulerCore(space, ClusterState(space, capacity=1), FakeClock())
    replica.apply_state_changes([NodeOwner.current(node)], current=True)

    uid, cpu, memory_gi, priority = probe
    if any(h.uid == uid for h in node.holds.values()) or uid in node.tombstones:
        return  # a pod the node knows already: the owner answers from its record, not the rule
    pod = make_pod(uid, cpu=cpu, memory=memory_gi * GI, priority=priority)
    p = info(pod)
    scheduler_admits = bool(Fit().filter(prepared(Fit(), p, replica.state), p, replica.state, ALL)[0])

    result = OwnerResult()
    trial = NodeState.from_json(node.to_json())
    owner.apply(trial, [claim(uid, cpu, memory_gi * GI, priority)], result)
    owner_admits = trial.holds[f"{uid}/0/n1"].status != REJECTED
    assert owner_admits == scheduler_admits, (trial.holds[f"{uid}/0/n1"].reason, node.to_json())


def test_counts_against_on_scalars_and_arrays() -> None:
    assert admission.counts_against(5, "a", 5, "b")  # equal priority counts
    assert not admission.counts_against(4, "a", 5, "b")  # a lower one does not
    assert not admission.counts_against(9, "b", 5, "b")  # nor the pod's own
    got = admission.counts_against(np.array([5, 4, 9]), np.array(["a", "a", "b"], dtype=object), 5, "b")
    assert got.tolist() == [True, False, False]


def test_shortfall_names_the_first_missing_resource() -> None:
    request = {"cpu": 500, "memory": 2, "pods": 1}
    assert admission.shortfall({"cpu": 1000, "memory": 2, "pods": 1}, {}, request) == ""
    assert admission.shortfall({"cpu": 1000, "memory": 2, "pods": 1}, {"memory": 1}, request) == "memory"
    assert admission.shortfall({"cpu": 1000, "memory": 2, "pods": 1}, {}, request, [{"cpu": 600}]) == "cpu"
    assert admission.shortfall({"cpu": 1000, "memory": 2, "pods": 1}, {"cpu": 900}, request,
                               reserved={"cpu": 400}) == ""
    assert admission.shortfall({}, {}, {"cpu": 0}) == ""  # nothing requested fits anywhere


def test_copies_counts_what_admits_would_admit_one_after_another() -> None:
    room, request, columns = [1000, 7, 3], [300, 2, 0], [0, 1]
    n = admission.copies(room, request, columns, limit=10)
    assert n == 3
    for k in range(5):
        left = np.array([[room[0] - k * request[0], room[1] - k * request[1], room[2]]], dtype=np.int64)
        assert bool(admission.admits(left, np.array(request), np.array(columns))[0]) == (k < n)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, max_size=20))
def test_an_owners_kept_sum_of_what_its_holds_use_is_the_sum_afresh(ops: list[tuple[str, int, int, int, int]]) -> None:
    """`NodeState.used` keeps its sum while no hold changed; after every input it equals the
    sum taken again, on the node and on a copy restored from its table value."""
    owner, node = NodeOwner(), NodeState("n1")
    owner.apply(node, [make_node("n1", cpu=4000, memory=8 * GI, pods=4)], OwnerResult())
    for o in ops:
        owner.apply(node, [record(*o)], OwnerResult())
        assert node.used() == node.count_used()
        node.to_json()  # (a table write asks every hold's plain form)
        assert node.used() == node.count_used() == NodeState.from_json(node.to_json()).used()
