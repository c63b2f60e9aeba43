"""Actionable feedback for sandboxes that cannot be placed: every alternative offered places
the pod it describes through the same core, none is offered when none exists, the wait
estimate is deterministic on the injected clock, and a burst costs one hint per class."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from agents.sandbox import feedback as fb
from agents.sandbox.feedback import Capacity, Lifetimes, apply, largest_fractions, wait_estimate
from agents.scheduler.core import SchedulerCore
from agents.state import cpus
from schemas.records import (
    QOS_LABEL,
    SANDBOX_POOL_LABEL,
    BoundPod,
    NodeStateChange,
    Pod,
    ResourceList,
    SchedulingFeedback,
)
from tests.unit.sandbox.conftest import (
    GI,
    KATA,
    MI,
    Clock,
    claims,
    core_of,
    feedback,
    node,
    sandbox,
)

# A scenario: the nodes (and what is bound there), the sandbox that fails, and what the hint says.
Build = Callable[[], SchedulerCore]


def numa_full() -> SchedulerCore:
    """A Kata node whose CPUs are all bound, with room by totals."""
    core = core_of(node("k1", cpu=8000, labels=KATA, numa=True))
    core.state.cpus.used[core.state.index["k1"]] = set(range(8))
    return core


def pool_full() -> SchedulerCore:
    """A node full of warm pool p1's pods."""
    core = core_of(node("n1", cpu=1000))
    for i in range(2):
        core.state.add_bound(BoundPod(uid=f"w{i}", requests=ResourceList(cpu=500, pods=1), sandbox=True,
                                      warm_pool="p1"), "n1")
    return core


SCENARIOS: list[tuple[str, Build, Pod, str, str, list[str]]] = [
    ("lsr-cpus-gone", numa_full, sandbox("p", "kata-qemu", cpu=2000, qos="LSR", guaranteed=True),
     fb.INSUFFICIENT, "ChangeQoSClass", [fb.QOS_CLASS, fb.QOS_CLASS, fb.RUNTIME_CLASS, fb.RUNTIME_CLASS,
                                         fb.RUNTIME_CLASS]),
    ("too-big", lambda: core_of(node("n1", cpu=2000), node("n2", cpu=1000)), sandbox("p", "gvisor", cpu=3000),
     fb.INSUFFICIENT, "ShrinkRequest", [fb.SMALLER_REQUEST]),
    ("too-big-lsr", lambda: core_of(node("k1", cpu=8000, labels=KATA, numa=True)),
     sandbox("p", "kata-fc", cpu=6000, qos="LSR", guaranteed=True), fb.INSUFFICIENT, "ChangeQoSClass",
     [fb.QOS_CLASS, fb.QOS_CLASS, fb.RUNTIME_CLASS, fb.RUNTIME_CLASS, fb.RUNTIME_CLASS, fb.SMALLER_REQUEST]),
    ("no-kata-node", lambda: core_of(node("n1")), sandbox("p", "kata-clh"),
     fb.NO_MATCHING_NODE, "ChangeRuntimeClass", [fb.RUNTIME_CLASS] * 3),
    ("nothing-helps", lambda: core_of(node("n1")), sandbox("p", "gvisor", node_selector={"zone": "nowhere"}),
     fb.NO_MATCHING_NODE, fb.ADD_CAPACITY, []),
    ("warm-pool-full", pool_full, sandbox("p", "gvisor", cpu=500, labels={SANDBOX_POOL_LABEL: "p1"}),
     fb.INSUFFICIENT, "ScaleWarmPool", [fb.SCALE_WARM_POOL]),
    ("unresolvable", lambda: core_of(node("k1", cpu=8000, labels=KATA, numa=True)),
     sandbox("p", "kata-qemu", cpu=2000, qos="LSR", annotations={cpus.RESOURCE_SPEC: "{nope"}),
     fb.UNRESOLVABLE, fb.FIX_POD, []),  # the annotation is wrong whatever the QoS or runtime
    ("unknown-runtime", lambda: core_of(node("n1")), sandbox("p", "firecracker"),
     "RuntimeClassNotFound", "ChangeRuntimeClass", [fb.RUNTIME_CLASS] * 3),
    ("unknown-runtime-no-nodes", core_of, sandbox("p", "firecracker"), "RuntimeClassNotFound", fb.FIX_POD, []),
    ("qos-refused", lambda: core_of(node("n1")), sandbox("p", "spin", qos="LSR"),
     "QoSClassNotAllowed", "ChangeQoSClass", [fb.QOS_CLASS, fb.QOS_CLASS, fb.RUNTIME_CLASS, fb.RUNTIME_CLASS]),
]


def failed(core: SchedulerCore, pod: Pod) -> SchedulingFeedback:
    [fed] = feedback(core.add(pod) + core.schedule())
    return fed


@pytest.mark.parametrize(("build", "pod", "reason", "next_step", "kinds"), [s[1:] for s in SCENARIOS],
                         ids=[s[0] for s in SCENARIOS])
def test_every_alternative_offered_places_the_pod_it_describes(
        build: Build, pod: Pod, reason: str, next_step: str, kinds: list[str]) -> None:
    fed = failed(build(), pod)
    assert fed.message and (fed.reason, fed.next_step) == (reason, next_step)
    assert [a.kind for a in fed.alternatives] == kinds
    for alternative in fed.alternatives:
        if alternative.kind == fb.SCALE_WARM_POOL:
            assert alternative.changes == {"pool": "p1", "replicas": "2"}
            continue
        core = build()  # the same cluster, nothing placed: the offered pod must place there
        offered = dataclasses.replace(apply(pod, alternative.changes, core.runtimes), uid="offered", name="offered")
        assert feedback(core.add(offered)) == []
        [claim] = claims(core.schedule())
        assert claim.uid == "offered" and claim.node in alternative.description, alternative


def test_a_smaller_request_is_the_largest_share_that_fits_and_keeps_the_overhead() -> None:
    fed = failed(core_of(node("k1", cpu=3000, memory=4 * GI, labels=KATA)), sandbox("p", "kata-qemu", cpu=4000,
                                                                                        memory=GI))
    [smaller] = [a for a in fed.alternatives if a.kind == fb.SMALLER_REQUEST]
    # 3000m free, 250m of it the VM's: 2750m of the 4000m asked (68.75%), memory alike.
    assert smaller.changes == {"spec.containers[0].resources.requests.cpu": "2750m",
                               "spec.containers[0].resources.requests.memory": "704Mi"}


def test_an_lsr_pods_smaller_request_keeps_whole_cpus() -> None:
    fed = failed(core_of(node("k1", cpu=8000, labels=KATA, numa=True)),
                 sandbox("p", "kata-fc", cpu=6000, qos="LSR", guaranteed=True))
    [smaller] = [a for a in fed.alternatives if a.kind == fb.SMALLER_REQUEST]
    assert smaller.changes["spec.containers[0].resources.requests.cpu"] == "4"  # one cell of four CPUs
    assert smaller.changes["spec.containers[0].resources.limits.cpu"] == "4"


def test_pods_that_are_no_sandboxes_get_no_hint() -> None:
    core = core_of(node("n1", cpu=1000))
    plain = dataclasses.replace(sandbox("p", cpu=5000), labels={})
    fed = failed(core, plain)
    assert (fed.reason, fed.next_step, fed.alternatives, fed.retry_after_s) == ("", "", (), None)
    assert core.advisor.computed == 0


def test_a_burst_of_identical_unschedulable_sandboxes_computes_one_hint() -> None:
    clock = Clock()
    core = core_of(node("n1", cpu=4000), node("n2", cpu=4000), clock=clock)
    for i in range(1000):
        core.add(sandbox(f"s{i}", "gvisor", cpu=5000))
    fed = feedback(core.schedule(1000))
    assert len(fed) == 1000 and core.advisor.computed == 1
    assert fed[0].alternatives and all(f.alternatives == fed[0].alternatives for f in fed)
    # The cluster changes: the next attempt's hint is computed afresh, once.
    core.apply_state_changes([NodeStateChange(node="n3", seq=1, allocatable=ResourceList(cpu=2000, pods=110),
                                              node_record=node("n3", cpu=2000))])
    clock.now += 60  # past every back-off
    assert len(feedback(core.schedule(1000))) == 1000 and core.advisor.computed == 2


# -- the wait estimate -----------------------------------------------------------------------------

ALLOCATABLE = ResourceList(cpu=1000, memory=8 * GI, pods=110)


def report(seq: int, running: list[str], committed: tuple[str, ...] = (), ended: tuple[str, ...] = ()) -> NodeStateChange:
    return NodeStateChange(
        node="n1", seq=seq, allocatable=ALLOCATABLE, used=ResourceList(cpu=500 * len(running), pods=len(running)),
        holds={**{f"{u}/0/n1": "committed" for u in committed}, **{f"{u}/0/n1": "terminated" for u in ended}},
        committed=tuple(BoundPod(uid=u, requests=ResourceList(cpu=500, pods=1), sandbox=True) for u in committed))


def lived(core: SchedulerCore, clock: Clock, lifetimes: list[float], then: float) -> None:
    """Sandboxes that lived `lifetimes` on n1, one after another; then two that started at `then`."""
    for seq, life in enumerate(lifetimes):
        uid = f"done{seq}"
        core.apply_state_changes([report(2 * seq, [uid], committed=(uid,))])
        clock.now += life
        core.apply_state_changes([report(2 * seq + 1, [], ended=(uid,))])
    clock.now = then
    core.apply_state_changes([report(100, ["r1", "r2"], committed=("r1", "r2"))])


@pytest.mark.parametrize(("lifetimes", "ask_at", "expected"), [
    ([10, 20, 30, 40, 50], 115.0, 15.0),  # age 15: the lives longer, 20..50, median 30: 15 s left
    ([10, 20, 30, 40, 50], 145.0, 5.0),  # age 45: only 50 is longer: 5 s left
    ([10, 20, 30, 40, 50], 160.0, None),  # age 60: they outlived every observation
    ([10, 20, 30, 40], 115.0, None),  # too few observed
], ids=["median-of-longer", "one-longer", "outlived", "too-few"])
def test_the_wait_estimate_is_deterministic_on_the_injected_clock(
        lifetimes: list[float], ask_at: float, expected: float | None) -> None:
    answers = []
    for _ in range(2):
        clock = Clock(0.0)
        core = core_of(node("n1", cpu=1000), clock=clock)
        lived(core, clock, lifetimes, then=100.0)
        clock.now = ask_at
        answers.append(failed(core, sandbox("p", "gvisor", cpu=500)))
    assert answers[0] == answers[1]
    fed = answers[0]
    assert fed.retry_after_s == expected
    if expected is None:
        assert fed.alternatives == () and fed.next_step == fb.ADD_CAPACITY
    else:
        [wait] = fed.alternatives
        assert (wait.kind, fed.next_step) == (fb.WAIT, "Wait") and "n1" in wait.description


def test_lifetimes_count_only_sandboxes_seen_starting_and_forget_the_ended() -> None:
    lives = Lifetimes()
    lives.start("seen", 10.0)
    lives.start("already-running", 10.0, known=False)  # read from the nodes' current state at start-up
    lives.start("seen", 20.0)  # a report read again: the first sight counts
    lives.end("seen", 40.0)
    lives.end("already-running", 40.0)
    lives.end("never-started", 40.0)
    assert lives.observed.tolist() == [30.0] and lives.running == 0


def test_wait_estimate_frees_each_nodes_sandboxes_in_order_of_time_left() -> None:
    capacity = Capacity(nodes=["a", "b"], free=np.array([[0], [100]]), request=np.array([300]),
                        overhead=np.array([0]), columns={"cpu": 0}, running_rows=np.array([0, 1, 1, 0]),
                        running_vectors=np.array([[300], [100], [100], [100]]), running_uids=("w", "x", "y", "z"))
    # b: 100 free, +100 at 5 s, +100 at 7 s: room for 300 at 7 s; a: 300 at 9 s.
    assert wait_estimate(capacity, np.array([9.0, 5.0, 7.0, np.nan])) == (7.0, "b")
    assert wait_estimate(capacity, np.array([np.nan] * 4)) is None


def test_largest_fractions_keep_the_overhead_whole() -> None:
    capacity = Capacity(nodes=["a", "b", "c"], free=np.array([[1250, 4 * GI, 1], [5000, MI, 1], [300, GI, 0]]),
                        request=np.array([2250, GI, 1]), overhead=np.array([250, 0, 0]),
                        columns={"cpu": 0, "memory": 1, "pods": 2})
    shares = largest_fractions(capacity)
    assert shares[0] == 0.5  # (1250 - 250) / 2000 of cpu
    assert shares[1] == MI / GI  # memory is what runs out
    assert shares[2] == -np.inf  # no pod slot left


def test_apply_refuses_a_path_no_alternative_writes() -> None:
    with pytest.raises(ValueError, match="not a change"):
        apply(sandbox("p", "gvisor"), {"spec.nodeName": "n1"}, core_of().runtimes)


def test_the_advisor_needs_no_node_of_the_pods_own_qos_to_offer_another() -> None:
    """Regression guard for the QoS label: the pod asked LSR in Kata; LS is offered, never LSR again."""
    fed = failed(numa_full(), sandbox("p", "kata-qemu", cpu=2000, qos="LSR", guaranteed=True))
    offered = {a.changes.get(f"metadata.labels.{QOS_LABEL}") for a in fed.alternatives if a.kind == fb.QOS_CLASS}
    assert offered == {"LS", "BE"}


def test_the_sandbox_flag_and_warm_pool_travel_from_the_claim_to_every_replicas_bound_pods() -> None:
    """What the lifetimes and the pool's size are learned from: the Claim (DefaultBinder) ->
    the owner's hold -> the bound pod it reports -> the replica's state."""
    from agents.state.owner import NodeOwner, NodeState, OwnerResult
    from schemas.records import Commit

    core = core_of(node("n1"))
    core.add(sandbox("p", "gvisor", labels={SANDBOX_POOL_LABEL: "p1"}))
    [claim] = claims(core.schedule())
    assert (claim.sandbox, claim.warm_pool) == (True, "p1")
    state, owner = NodeState("n1"), NodeOwner()
    owner.apply(state, [node("n1"), claim], OwnerResult())
    owner.apply(state, [Commit(uid="p", attempt=0, node="n1", decision_key="p")], OwnerResult())
    [bound] = NodeOwner.current(state).committed
    assert (bound.sandbox, bound.warm_pool) == (True, "p1")
    core.apply_state_changes([NodeOwner.current(state)])
    assert core.pool_size("p1") == 1 and core.lifetimes.running == 1


def test_the_library_hands_back_the_hint() -> None:
    from agents.scheduler.library import Scheduler

    [decision] = Scheduler([node("n1", cpu=1000)]).schedule([sandbox("p", "gvisor", cpu=2000)])
    assert decision.feedback is not None and decision.feedback.next_step == "ShrinkRequest"


def test_advise_answers_for_a_template_without_scheduling_it() -> None:
    """How the warm pools ask: a pod made from a template, through the same core; nothing queued."""
    core = core_of(node("n1", cpu=1000))
    assert core.advise(sandbox("fits", "gvisor", cpu=500)) is None
    hint = core.advise(sandbox("big", "gvisor", cpu=2000))
    assert hint is not None and hint.next_step == "ShrinkRequest" and hint.reason == fb.INSUFFICIENT
    refused = core.advise(sandbox("odd", "firecracker"))
    assert refused is not None and refused.reason == "RuntimeClassNotFound"
    assert core.pending == 0 and core.state.assumptions == {} and core.decision_keys == {}
