"""An adversarial review of the decision cores: sequences a reviewer would try against
`NodeOwner`, `Decider`, `SchedulerCore` and a `ClusterState` replica (DESIGN.md, "The commit
protocol" and its safety rules).

Each regression below failed on the cores before its fix:

1. A scheduler that lost count of a pod's attempts (a restarted or newly assigned replica
   reads `pods` and `requeue` from their start, in no order between the two, and dropped a
   Requeue read before its pod) claimed an attempt its decider had moved past: the Held got a
   Release and nothing else, and the pod stayed claimed for ever, though it fits. Fixed twice:
   the scheduler keeps a Requeue read before its pod, and the decider answers a Held of an
   older attempt of a pending pod with the latest attempt too (recorded, re-sent on replay).
2. A NonStrict gang member with a second claim of the same attempt (another replica, or a send
   whose acknowledgement was lost though the record arrived): the second claim's rejection
   requeued the pod, the next attempt's claim was released (another claim waits), and the
   gang's give-up then requeued it to that same attempt, which its scheduler ignores: lost.
   Fixed: a give-up requeues past every attempt the pod's scheduler may hold.
3. A hold taken on a node that was then deleted and added again smaller (or updated: less cpu,
   a GPU gone) was committed as it was held: the node over-committed, a pod bound to a GPU that
   no longer exists. Fixed: such a Commit is applied and the pod terminated at once, as on a
   deleted node (rule 9); one that still fits commits as before.
4. A Requeue read while the pod waited in Permit changed its attempt under the reservation
   made for the old one: that assumption never ended in the replica. Fixed: the pod leaves
   Permit (giving back what it reserved) and is placed again with the new attempt.
5. A claim that named one GPU (or NIC, CPU, NUMA cell's memory) twice was checked part by
   part against the others' usage only, and held: 120% of one GPU. Fixed: each part counts
   against the next.
6. A pod terminated at once on its commit (its node gone or changed) is reported terminated,
   never committed: its scheduler kept it claimed for ever. Fixed: a terminated hold ends the
   pod there as a committed one does.

The tests at the end were gaps that needed a record or an agent change: a NodeDeleted names the
node's uid, and nominations lapse on the owners' timers (`NominationLapsed`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from agents.ports import Output
from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.scheduler.framework.interface import CycleState
from agents.scheduler.framework.runtime import Waiting
from agents.state.ledger import PENDING, Decider, Decision, LedgerState
from agents.state.owner import (
    BY_COMMIT_ON_DELETED_NODE,
    COMMITTED,
    TERMINATED,
    NodeOwner,
    NodeState,
    OwnerResult,
)
from agents.state.resources import ResourceSpace
from schemas import topics
from schemas.records import (
    Binding,
    Claim,
    Commit,
    GangTimeout,
    GpuDevice,
    Held,
    NodeDeleted,
    NodeStateChange,
    Nomination,
    NominationCleared,
    NominationLapsed,
    NumaCell,
    PodDeleted,
    PodTerminated,
    RdmaDevice,
    Record,
    Rejected,
    Release,
    Requeue,
    ResourceList,
    SchedulingFeedback,
    Yield,
)
from tests.builders import make_claim, make_node, make_pod
from tests.unit.test_owner_replay import (
    test_a_redelivered_input_re_sends_exactly_what_it_sent_the_first_time as redelivery_resends_the_same,
)
from tests.unit.test_owner_replay import (
    test_after_a_crash_anywhere_the_replay_re_sends_everything_and_replicas_converge as crash_anywhere_converges,
)
from tests.unit.test_scheduler_core import FakeClock, claims, make_core

SPACE = ResourceSpace()


def own(state: NodeState, *records: Record) -> OwnerResult:
    result = OwnerResult()
    NodeOwner().apply(state, list(records), result)
    return result


def decide(state: LedgerState, *records: Record) -> Decision:
    out = Decision()
    Decider().apply(state, list(records), out)
    return out


def sent(out: Decision) -> list[tuple[str, str, int]]:
    """(kind, uid, attempt) of what a decider sent, in order."""
    return [(o.record.KIND, o.record.uid, o.record.attempt)  # type: ignore[attr-defined]
            for o in out.first + out.after_commit if isinstance(o.record, (Release, Requeue, Commit))]


def of(outputs: Iterable[Output], kind: type[Record]) -> list[Any]:
    return [o.record for o in outputs if isinstance(o.record, kind)]


class Cluster:
    """Owners and deciders wired to one scheduler core, delivering every output at once."""

    def __init__(self, core: SchedulerCore, *nodes: str) -> None:
        self.core = core
        self.owners = {n: NodeState(n) for n in nodes}
        self.ledgers: dict[str, LedgerState] = {}
        self.bindings: list[Binding] = []
        self.changes: list[NodeStateChange] = []  # every report, as a new replica reads them

    def deliver(self, outputs: list[Output]) -> None:
        queue = list(outputs)
        while queue:
            out = queue.pop(0)
            if out.topic == topics.NODE_INBOX:
                result = own(self.owners[out.key], out.record)
                queue += result.outputs
            elif out.topic == topics.HOLDS:
                ledger = self.ledgers.setdefault(out.key, LedgerState(out.key))
                decision = decide(ledger, out.record)
                queue += decision.first + decision.after_commit
            elif out.topic == topics.STATE_CHANGES:
                assert isinstance(out.record, NodeStateChange)
                self.changes.append(out.record)
                self.core.apply_state_changes([out.record])
            elif out.topic == topics.REQUEUE:
                assert isinstance(out.record, Requeue)
                self.core.requeue(out.record)
            elif out.topic == topics.BINDINGS:
                assert isinstance(out.record, Binding)
                self.bindings.append(out.record)

    def settle(self, clock: FakeClock, rounds: int = 10) -> None:
        for _ in range(rounds):
            clock.now += 60.0
            self.deliver(self.core.schedule())


# -- 1. a scheduler that lost count of a pod's attempts ----------------------------------------


def test_a_requeue_read_before_its_pod_is_kept_for_the_pod() -> None:
    core, _ = make_core(make_node("a", cpu=4000))
    core.requeue(Requeue(uid="p", attempt=3, decision_key="p"))  # read before the pod, after a restart
    core.add(make_pod("p", cpu=1000))
    [claim] = claims(core.schedule())
    assert claim.attempt == 3 and core.requeued == {}


def test_a_restarted_scheduler_that_read_the_requeue_first_still_binds_the_pod() -> None:
    """p was rejected on a (full) and requeued to attempt 1; the scheduler restarts, reads that
    Requeue before the pod, and places p on b. Before: attempt 0 on b, released as an older
    attempt, and p claimed for ever."""
    clock = FakeClock()
    core = SchedulerCore(SPACE, ClusterState(SPACE, capacity=4), clock)
    cluster = Cluster(core, "a", "b")
    cluster.deliver([Output(topics.NODE_INBOX, n, make_node(n, cpu=1000)) for n in "ab"])
    cluster.deliver([Output(topics.NODE_INBOX, "a", make_claim("q", node="a", cpu=1000)),
                     Output(topics.NODE_INBOX, "a", make_claim("p", node="a", cpu=800))])
    restarted = SchedulerCore(SPACE, ClusterState(SPACE, capacity=4), clock)
    restarted.apply_state_changes(cluster.changes)  # its replica reads state-changes from the start
    cluster.core = restarted
    restarted.requeue(Requeue(uid="p", attempt=1, decision_key="p"))
    restarted.add(make_pod("p", cpu=800, memory=0))
    cluster.settle(clock)
    assert [(b.uid, b.node) for b in cluster.bindings if b.uid == "p"] == [("p", "b")]
    assert restarted.pods == {} and restarted.state.assumptions == {}


HELD_OLDER_ATTEMPT: dict[str, tuple[list[Record], Held, list[tuple[str, str, int]]]] = {
    # A pending pod requeued to attempt 1 (rejected), then a Held of attempt 0 on another node.
    "single-pod-after-a-rejection": (
        [Rejected(uid="p", attempt=0, node="n1", decision_key="p", reason="Insufficient cpu")],
        Held(uid="p", attempt=0, node="n2", decision_key="p"),
        [("Release", "p", 0), ("Requeue", "p", 1)],
    ),
    # A gang member given up for the waiting time, then a claim of its old attempt elsewhere.
    "gang-member-after-a-give-up": (
        [Held(uid="g0", attempt=0, node="n1", decision_key="p", gang_min=2), GangTimeout(decision_key="p", round=0)],
        Held(uid="g0", attempt=0, node="n2", decision_key="p", gang_min=2),
        [("Release", "g0", 0), ("Requeue", "g0", 1)],
    ),
    # Bound or deleted: a Release is all (nobody waits for that pod).
    "bound-pod": (
        [Held(uid="p", attempt=1, node="n1", decision_key="p")],
        Held(uid="p", attempt=0, node="n2", decision_key="p"),
        [("Release", "p", 0)],
    ),
    "deleted-pod": (
        [Rejected(uid="p", attempt=0, node="n1", decision_key="p", reason="x"), PodDeleted(uid="p", decision_key="p")],
        Held(uid="p", attempt=0, node="n2", decision_key="p"),
        [("Release", "p", 0)],
    ),
}


@pytest.mark.parametrize("before,stale,expected", HELD_OLDER_ATTEMPT.values(), ids=HELD_OLDER_ATTEMPT.keys())
def test_a_held_of_an_older_attempt_announces_the_latest_and_resends_it_on_replay(
        before: list[Record], stale: Held, expected: list[tuple[str, str, int]]) -> None:
    state = LedgerState("p")
    decide(state, *before)
    first = decide(state, stale)
    assert sent(first) == expected
    replayed = decide(LedgerState.from_json(state.to_json()), stale)
    assert replayed.first == first.first and replayed.after_commit == first.after_commit


# -- 2. a NonStrict gang member's give-up must pass every attempt its scheduler may hold --------


def nonstrict(uid: str, node: str, attempt: int = 0, key: str = "ns/h") -> Held:
    return Held(uid=uid, attempt=attempt, node=node, decision_key=key, gang_min=2, gang_strict=False)


@pytest.mark.parametrize("give_up", [
    GangTimeout(decision_key="ns/h", round=0),
    Yield(decision_key="ns/h", node="n1", holds=("h0/0/n1",), winner="ns/a"),
], ids=["timeout", "yield"])
def test_a_give_up_requeues_past_the_attempt_a_second_claim_was_requeued_to(give_up: Record) -> None:
    state = LedgerState("ns/h")
    assert decide(state, nonstrict("h0", "n1")).first == []  # waits for h1
    # A second claim of the same attempt, rejected: the pod is requeued to attempt 1 ...
    out = decide(state, Rejected(uid="h0", attempt=0, node="n2", decision_key="ns/h", reason="Insufficient cpu"))
    assert sent(out) == [("Requeue", "h0", 1)]
    # ... and attempt 1's claim is released (another claim of the pod waits): its scheduler waits.
    assert sent(decide(state, nonstrict("h0", "n3", attempt=1))) == [("Release", "h0", 1)]
    out = decide(state, give_up)
    [requeue] = of(out.first, Requeue)
    assert requeue.attempt > 1, "the scheduler holds attempt 1 and ignores a Requeue that does not pass it"
    assert state.pods["h0"].status == PENDING and state.pods["h0"].attempt == requeue.attempt


def test_a_nonstrict_member_with_a_second_claim_is_never_lost_end_to_end() -> None:
    """The same through a scheduler core: after the give-up the pod is placed again."""
    core, clock = make_core(make_node("n1", cpu=1000))
    core.add(make_pod("h0", cpu=500, memory=0, annotations={
        "gang.scheduling.koordinator.sh/name": "h", "gang.scheduling.koordinator.sh/min-available": "2",
        "gang.scheduling.koordinator.sh/mode": "NonStrict"}))
    [claim] = claims(core.schedule())
    key = claim.decision_key
    state = LedgerState(key)
    decide(state, nonstrict("h0", "x", key=key))  # an earlier claim of attempt 0 (another replica's) waits
    for requeue in of(decide(state, Rejected(uid="h0", attempt=0, node="n1", decision_key=key,
                                             reason="Insufficient cpu")).first, Requeue):
        core.requeue(requeue)
    clock.now += 60.0
    [claim] = claims(core.schedule())
    assert claim.attempt == 1
    assert sent(decide(state, nonstrict("h0", "n1", attempt=1, key=key))) == [("Release", "h0", 1)]  # another waits
    for requeue in of(decide(state, GangTimeout(decision_key=key, round=0)).first, Requeue):
        core.requeue(requeue)
    clock.now += 60.0
    assert [c.attempt for c in claims(core.schedule())] == [2], "h0 claimed for ever, never placed again"


# -- 3. a Commit of a hold its node no longer fits ----------------------------------------------


GPU_NODE = make_node("n1", cpu=1000, gpus=(GpuDevice(0), GpuDevice(1)))
ONE_GPU = make_node("n1", cpu=1000, gpus=(GpuDevice(0),))
SMALL = make_node("n1", cpu=500, gpus=(GpuDevice(0), GpuDevice(1)))
ON_GPU1 = Claim(uid="p", attempt=0, node="n1", decision_key="p", devices=("gpu/1/100/100",),
                requests=ResourceList({"cpu": 800, "pods": 1, "koordinator.sh/gpu-core": 100,
                                       "koordinator.sh/gpu-memory-ratio": 100}))
COMMIT = Commit(uid="p", attempt=0, node="n1", decision_key="p")

MISFITS: dict[str, tuple[list[Record], str]] = {
    "deleted-then-added-smaller": ([GPU_NODE, ON_GPU1, NodeDeleted(name="n1"), SMALL], "Insufficient cpu"),
    "deleted-then-added-without-its-gpu": ([GPU_NODE, ON_GPU1, NodeDeleted(name="n1"), ONE_GPU],
                                           "gpu 1 does not exist on the node"),
    "updated-smaller": ([GPU_NODE, ON_GPU1, SMALL], "Insufficient cpu"),
    "updated-without-its-gpu": ([GPU_NODE, ON_GPU1, ONE_GPU], "gpu 1 does not exist on the node"),
}


@pytest.mark.parametrize("log,reason", MISFITS.values(), ids=MISFITS.keys())
def test_a_commit_of_a_hold_its_node_no_longer_fits_terminates_the_pod_at_once(log: list[Record], reason: str) -> None:
    state = NodeState("n1")
    own(state, *log)
    result = own(state, COMMIT)
    hold = state.holds[COMMIT.hold_id]
    assert hold.status == TERMINATED and hold.terminated_by == BY_COMMIT_ON_DELETED_NODE
    assert result.problems == []
    for name, amount in state.used().items():
        assert amount <= state.allocatable.get(name, 0), f"over-committed: {name}"
    assert state.device_usage() == {}
    [terminated] = of(result.outputs, PodTerminated)
    [feedback] = of(result.outputs, SchedulingFeedback)
    assert terminated.reason == reason and feedback.reasons == {reason: 1}
    [report] = of(result.outputs, NodeStateChange)
    assert report.holds == {COMMIT.hold_id: TERMINATED} and report.committed == ()
    # The redelivered Commit re-sends the same, from the record.
    again = own(NodeState.from_json(state.to_json()), COMMIT)
    assert of(again.outputs, PodTerminated) == [terminated] and of(again.outputs, SchedulingFeedback) == [feedback]


@pytest.mark.parametrize("log", [
    [GPU_NODE, ON_GPU1, NodeDeleted(name="n1"), GPU_NODE],  # added again as it was
    [GPU_NODE, ON_GPU1, make_node("n1", cpu=900, gpus=(GpuDevice(0), GpuDevice(1)))],  # smaller, still fits
], ids=["re-added-same", "shrunk-but-fits"])
def test_a_commit_of_a_hold_that_still_fits_its_changed_node_commits(log: list[Record]) -> None:
    state = NodeState("n1")
    own(state, *log)
    result = own(state, COMMIT)
    assert state.holds[COMMIT.hold_id].status == COMMITTED
    assert of(result.outputs, PodTerminated) == [] and [p.uid for p in of(result.outputs, NodeStateChange)[0].committed] == ["p"]


@pytest.mark.parametrize("log", [[*log, COMMIT, make_claim("q", cpu=400)] for log, _ in MISFITS.values()],
                         ids=list(MISFITS))
def test_a_terminated_misfit_is_replay_safe_and_replicas_converge(log: list[Record]) -> None:
    redelivery_resends_the_same(log)
    crash_anywhere_converges(log)


def test_a_pod_terminated_at_once_on_its_commit_leaves_its_scheduler() -> None:
    """Its report says terminated, never committed: the pod is bound (decisions are final) and
    its scheduler must stop tracking it, as for a commit (before: claimed for ever)."""
    core, _ = make_core(make_node("n1", cpu=1000))
    core.add(make_pod("p", cpu=800, memory=0))
    [claim] = claims(core.schedule())
    owner = NodeState("n1")
    own(owner, make_node("n1", cpu=1000), claim)
    result = own(owner, NodeDeleted(name="n1"), Commit(uid="p", attempt=claim.attempt, node="n1", decision_key="p"))
    [report] = of(result.outputs, NodeStateChange)
    assert report.holds == {claim.hold_id: TERMINATED}
    core.apply_state_changes([report])
    assert "p" not in core.pods and "p" in core.bound and core.state.assumptions == {}


# -- 5. a claim that names one device twice --------------------------------------------------


DEVICE_NODE = make_node("n1", cpu=4000, gpus=(GpuDevice(0), GpuDevice(1)), rdma=(RdmaDevice("mlx0", minor=0, vfs=4),),
                        numa=(NumaCell(0, cpus=(0, 1, 2, 3), memory=8 * 2**30),))


@pytest.mark.parametrize("claimed", [
    ("gpu/0/60/60", "gpu/0/60/60"),  # 120% of GPU 0
    ("rdma/0/3", "rdma/0/3"),  # 6 of the NIC's 4 VFs
    ("cpuset/0/0,1", "cpuset/0/1,2"),  # CPU 1 twice
    ("cpuset/0/0/6442450944", "cpuset/0/1/6442450944"),  # 12 GiB of cell 0's 8
], ids=["gpu", "rdma", "cpu", "numa-memory"])
def test_a_claim_naming_a_device_twice_cannot_over_commit_it(claimed: tuple[str, ...]) -> None:
    state = NodeState("n1")
    result = own(state, DEVICE_NODE, make_claim("p", cpu=100, devices=claimed))
    [rejected] = of(result.outputs, Rejected)
    assert state.device_usage() == {} and rejected.reason


# -- 4. a requeue while waiting in Permit --------------------------------------------------------


def test_a_requeue_while_waiting_in_permit_gives_back_what_the_old_attempt_reserved() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    core.add(make_pod("w", cpu=1000))
    tracked = core.pods["w"]
    info, fw = tracked.info, core.frameworks[tracked.info.profile]
    core.queue.remove("w")
    row = core.state.index["a"]
    core.state.assume("w/0/a", row, info.request)  # what Reserve did before Permit said wait
    fw.waiting["w"] = Waiting(info, row, CycleState(), 1e9)
    tracked.state, tracked.row, tracked.profile = "waiting", row, info.profile
    core.requeue(Requeue(uid="w", attempt=1, decision_key="w"))  # e.g. re-read after a restart
    assert "w" not in fw.waiting and core.state.assumptions == {}
    clock.now += 60.0
    [claim] = claims(core.schedule())
    assert claim.attempt == 1 and set(core.state.assumptions) == {claim.hold_id}


# -- what held -------------------------------------------------------------------------------
# Orders a reviewer tries that the cores already handle: each ends with nothing held, nothing
# over-committed and the pod's fate decided once.

HELD_ORDERS: dict[str, list[Record]] = {
    # A Commit reaching the owner before the claim (a zombie's, or reordered): dead letter, then
    # the claim is held, its Held re-sent to the decider, which re-sends the Commit.
    "commit-before-claim": [make_node("n1"), Commit(uid="a", attempt=0, node="n1", decision_key="a"),
                            make_claim("a")],
    # A Release before its claim: the claim is held later and released again by its decider.
    "release-before-claim": [make_node("n1"), Release(uid="a", attempt=0, node="n1", decision_key="a"),
                             make_claim("a")],
    # A Release after the Commit: ignored.
    "release-after-commit": [make_node("n1"), make_claim("a"), Commit(uid="a", attempt=0, node="n1", decision_key="a"),
                             Release(uid="a", attempt=0, node="n1", decision_key="a")],
    # The node deleted between Held and Commit: committed and terminated at once.
    "node-deleted-between-held-and-commit": [make_node("n1"), make_claim("a"), NodeDeleted(name="n1"),
                                             Commit(uid="a", attempt=0, node="n1", decision_key="a")],
}


@pytest.mark.parametrize("log", HELD_ORDERS.values(), ids=HELD_ORDERS.keys())
def test_orders_that_hold(log: list[Record]) -> None:
    owner, ledger = NodeState("n1"), LedgerState("a")
    pending = list(log)
    bindings = []
    while pending:
        result = own(owner, pending.pop(0))
        for out in result.outputs:
            if out.topic == topics.HOLDS:
                decision = decide(ledger, out.record)
                pending += [o.record for o in decision.first if o.topic == topics.NODE_INBOX]
                bindings += of(decision.after_commit, Binding)
    assert [h.status for h in owner.holds.values() if h.status == "held"] == []
    assert len({(b.uid, b.node) for b in bindings}) <= 1
    for name, amount in owner.used().items():
        assert amount <= owner.allocatable.get(name, 0)


# -- gaps that needed a record or an agent change ----------------------------------------------


def test_a_node_deletion_replayed_after_the_node_came_back_terminates_nothing_new() -> None:
    """A NodeDeleted names the node object it deleted (its uid): the owner's table ran ahead of
    the offset, so the deletion is read again after the node was added again (another object,
    another uid), and must not terminate the pods bound on the new node."""
    state = NodeState("n1")
    own(state, make_node("n1", uid="u1"), NodeDeleted(name="n1", uid="u1"), make_node("n1", uid="u2"),
        make_claim("a"), Commit(uid="a", attempt=0, node="n1", decision_key="a"))
    restored = NodeState.from_json(state.to_json())  # the table ran ahead of the offset: replay from the deletion
    result = own(restored, NodeDeleted(name="n1", uid="u1"), make_node("n1", uid="u2"))
    assert of(result.outputs, PodTerminated) == [], "a pod running on the new node is terminated (capacity freed)"
    assert restored.exists and [h.status for h in restored.holds.values()] == ["committed"]
    # The new node's own deletion still terminates it; so does one without a uid (older records).
    for deletion in (NodeDeleted(name="n1", uid="u2"), NodeDeleted(name="n1")):
        again = NodeState.from_json(state.to_json())
        assert [t.uid for t in of(own(again, deletion).outputs, PodTerminated)] == ["a"] and not again.exists


def own_at(state: NodeState, t: float, *records: Record) -> OwnerResult:
    result = OwnerResult()
    NodeOwner().apply(state, list(records), result, [t] * len(records), t)
    return result


def lapse_of(result: OwnerResult) -> NominationLapsed:
    """The record the lapse timer the owner asked for appends to the inbox when it fires."""
    (node, uid, since), = result.lapses
    return NominationLapsed(uid=uid, node=node, since=since)


def test_a_late_copy_of_a_cleared_nomination_lapses() -> None:
    """A Nomination delivered again after its NominationCleared (a producer retry reordered on a
    broker without idempotent producers) is taken for a new one, and its lapse timer ends it."""
    state = NodeState("n1")
    nomination = Nomination(uid="p", node="n1", priority=10, requests=ResourceList(cpu=600))
    own_at(state, 100.0, make_node("n1", cpu=1000), nomination, NominationCleared(uid="p", node="n1"))
    late = own_at(state, 200.0, nomination)
    assert set(state.nominations) == {"p"}
    own_at(state, 500.0, lapse_of(late))
    assert state.nominations == {}, "the deleted preemptor's 600m stay promised for ever"


def test_a_nomination_made_again_outlives_the_lapse_of_the_first() -> None:
    """A lapse names the time its nomination was recorded: the preemptor nominated again since
    (a new preemption) keeps the new promise until its own lapse; a replay keeps the same."""
    state = NodeState("n1")
    nomination = Nomination(uid="p", node="n1", priority=10, requests=ResourceList(cpu=600))
    first = own_at(state, 100.0, make_node("n1", cpu=1000), nomination)
    again = own_at(state, 350.0, nomination)
    own_at(state, 400.0, lapse_of(first))
    assert set(state.nominations) == {"p"}, "the lapse of the first nomination ended the second"
    restored = NodeState.from_json(state.to_json())
    assert NodeOwner.lapses(restored) == [("n1", "p", 350.0)], "a restore re-arms the second's lapse"
    own_at(restored, 650.0, lapse_of(again))
    assert restored.nominations == {}


def test_a_nomination_the_claim_did_not_name_lapses_when_the_pod_binds_elsewhere() -> None:
    """A claim carries the nomination its replica knows; a replica that took the pod over before
    the owner's report of another replica's preemption nomination reached it claims without it,
    and the decider cannot clear what it was not told: the nomination lapses."""
    owner_n2, ledger = NodeState("n2"), LedgerState("p")
    made = own_at(owner_n2, 100.0, make_node("n2"), Nomination(uid="p", node="n2", priority=10,
                                                               requests=ResourceList(cpu=600)))
    decision = decide(ledger, Held(uid="p", attempt=0, node="n1", decision_key="p"))  # no nominated_node
    for out in decision.first:
        if out.key == "n2":
            own_at(owner_n2, 110.0, out.record)
    own_at(owner_n2, 400.0, lapse_of(made))
    assert owner_n2.nominations == {}


def test_the_owners_agent_arms_a_lapse_per_nomination_and_re_arms_it_after_a_restore() -> None:
    """The lapse timers at the edge: `scheduling.nomination_ttl_s` after the log time the owner
    recorded the nomination (what is left of it after a restore); keyed by that time, so a
    nomination made again gets a timer of its own."""
    from agents.adapters.owners import OwnerCore

    core = OwnerCore(clock=lambda: 1100.0, nomination_ttl_s=300.0)
    state = NodeState("n1")
    result = own_at(state, 1000.0, make_node("n1"), Nomination(uid="p", node="n1", priority=10,
                                                               requests=ResourceList(cpu=600)))
    [armed] = [core.lapse(*lapse) for lapse in result.lapses]
    [restored] = core.timers("n1", state.to_json())
    for timer in (armed, restored):
        assert timer.delay_s == 200.0 and timer.key == ("lapse", "n1", "p", 1000.0)
        assert timer.output.record == NominationLapsed(uid="p", node="n1", since=1000.0)
    assert core.timers("n1", NodeState("n2").to_json()) == []
