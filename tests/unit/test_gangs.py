"""Gangs: annotations validated, the waiting-time timeout releasing a partial gang (as a
record, replayed safely), Strict mode, two gangs competing for the same capacity, members
beyond min-available, and replays that re-send a gang's recorded outputs in full."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest

from agents.state.gangs import GangError, GangSpec, gang_spec
from agents.state.ledger import (
    FELLOW_GRACE_S,
    GANG_DEFAULT_WAITING_S,
    Decider,
    Decision,
    LedgerState,
)
from agents.state.owner import NodeOwner, NodeState, OwnerResult
from schemas import topics
from schemas.codec import encode
from schemas.quantity import parse_duration
from schemas.records import (
    Binding,
    GangTimeout,
    GpuDevice,
    Held,
    NodeStateChange,
    NominationCleared,
    Pod,
    PodDeleted,
    PodTerminated,
    Rejected,
    Release,
    Requeue,
    ResourceList,
    SchedulingFeedback,
    Yield,
)
from tests.builders import make_claim, make_node
from tests.pipeline import Cluster

GANG = "gang.scheduling.koordinator.sh/"


@pytest.mark.parametrize(("text", "seconds"), [("600s", 600), ("10m", 600), ("1h30m", 5400), ("1.5s", 1.5),
                                               ("250ms", 0.25)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("annotations", "expected"), [
    ({}, GangSpec(0)),
    ({GANG + "min-available": "3"}, GangSpec(3, 600.0, True)),
    ({GANG + "min-available": "2", GANG + "waiting-time": "30s", GANG + "mode": "NonStrict"}, GangSpec(2, 30.0, False)),
], ids=["none", "defaults", "all"])
def test_gang_specs(annotations: dict[str, str], expected: GangSpec) -> None:
    assert gang_spec(annotations) == expected


@pytest.mark.parametrize(("annotations", "field"), [
    ({GANG + "min-available": "three"}, GANG + "min-available"),
    ({GANG + "min-available": "5", GANG + "total-number": "4"}, GANG + "min-available"),
    ({GANG + "min-available": "2", GANG + "waiting-time": "soon"}, GANG + "waiting-time"),
    ({GANG + "min-available": "2", GANG + "mode": "Lenient"}, GANG + "mode"),
], ids=["not-a-number", "min-over-total", "bad-duration", "bad-mode"])
def test_bad_gang_annotations_name_the_field(annotations: dict[str, str], field: str) -> None:
    with pytest.raises(GangError) as err:
        gang_spec(annotations)
    assert err.value.field == f"metadata.annotations.{field}"


def held(uid: str, node: str = "n1", attempt: int = 0, key: str = "ns/g", gang_min: int = 3, **kw: Any) -> Held:
    return Held(uid=uid, attempt=attempt, node=node, decision_key=key, gang_min=gang_min, **kw)


def run(state: LedgerState, *records: Any) -> Decision:
    out = Decision()
    Decider().apply(state, list(records), out)
    return out


def kinds(out: Decision) -> list[tuple[str, str, int]]:
    return sorted((type(o.record).__name__, o.record.uid, o.record.attempt) for o in out.first)  # type: ignore[attr-defined]


def test_a_partial_gang_is_released_and_requeued_when_its_waiting_time_runs_out() -> None:
    state = LedgerState("ns/g")
    out = run(state, held("a", gang_waiting_s=30.0), held("b", gang_waiting_s=30.0))
    assert out.first == [] and out.timers == [("ns/g", 0, 30.0)]
    out = run(state, GangTimeout(decision_key="ns/g", round=0))
    assert kinds(out) == [("Release", "a", 0), ("Release", "b", 0), ("Requeue", "a", 1), ("Requeue", "b", 1)]
    assert state.waiting == {} and state.round == 1
    # A replayed timeout re-sends the same outputs; a stale one does nothing.
    assert kinds(run(state, GangTimeout(decision_key="ns/g", round=0))) == kinds(out)
    assert run(state, GangTimeout(decision_key="ns/g", round=7)).first == []
    # The next wait asks for a new timer; a late Held of the old attempt is released, and the
    # latest attempt announced again (its scheduler may have lost count: test_adversary).
    again = run(state, held("a", attempt=1), held("b", node="n2", attempt=0))
    assert again.timers == [("ns/g", 1, 600.0)] and kinds(again) == [("Release", "b", 0), ("Requeue", "b", 1)]


def test_a_complete_gang_is_bound_and_its_timer_is_moot() -> None:
    state = LedgerState("ns/g")
    out = run(state, held("a"), held("b"), held("c"))
    assert sum(isinstance(o.record, Binding) for o in out.after_commit) == 3
    assert run(state, GangTimeout(decision_key="ns/g", round=0)).first == []


@pytest.mark.parametrize(("strict", "expected"), [
    (True, [("Release", "a", 0), ("Release", "b", 0), ("Requeue", "a", 1), ("Requeue", "b", 1), ("Requeue", "c", 1)]),
    (False, [("Requeue", "c", 1)]),
], ids=["strict", "non-strict"])
def test_strict_mode_takes_the_gang_down_with_a_rejected_member(strict: bool, expected: list[tuple[str, str, int]]) -> None:
    state = LedgerState("ns/g")
    run(state, held("a", gang_strict=strict), held("b", gang_strict=strict))
    rejected = Rejected(uid="c", attempt=0, node="n1", decision_key="ns/g", reason="Insufficient cpu")
    out = run(state, rejected)
    assert kinds(out) == expected
    assert kinds(run(state, rejected)) == expected  # a replay re-sends, never re-decides


def gang_pod(uid: str, gang: str) -> Pod:
    return Pod(uid=uid, name=uid, annotations={GANG + "name": gang, GANG + "min-available": "2"},
               requests=ResourceList(cpu=1000))


def test_two_gangs_competing_for_the_same_capacity_do_not_deadlock_and_one_wins() -> None:
    cluster = Cluster(make_node("n1", cpu=1000), make_node("n2", cpu=1000))  # room for one gang of 2
    for uid in ("a1", "b1", "a2", "b2"):  # interleaved: each gang gets one member held first
        cluster.core.add(gang_pod(uid, uid[0]))
    for _ in range(10):
        cluster.step()
        if len(cluster.bindings) == 2:
            break
    assert sorted(cluster.bindings) in (["a1", "a2"], ["b1", "b2"])
    assert set(cluster.bindings.values()) == {"n1", "n2"}
    # Nothing stays held by the loser: the owners hold exactly the winner's two claims.
    held_now = [h for n in cluster.nodes.values() for h in n.holds.values() if h.status in ("held", "committed")]
    assert sorted(h.uid for h in held_now) == sorted(cluster.bindings)


def test_bad_gang_annotation_is_final_feedback() -> None:
    cluster = Cluster(make_node("n1"))
    outputs = cluster.core.add(Pod(uid="g", name="g", annotations={GANG + "name": "x", GANG + "min-available": "0"}))
    [feedback] = [o.record for o in outputs if isinstance(o.record, SchedulingFeedback)]
    assert feedback.final and "min-available" in feedback.message
    assert isinstance(NodeStateChange, type) and Release and Requeue  # record kinds used above


def test_gangs_split_across_scheduler_replicas_do_not_deadlock_the_higher_ranked_wins() -> None:
    # Each replica holds one member of each gang; each gang gets one node: without wound-wait
    # both wait for their waiting time. Gang "a" outranks "b" (equal priority and creation
    # second, then the key): the owner asks b to yield and nominates a's member there.
    cluster = Cluster(make_node("n1", cpu=1000), make_node("n2", cpu=1000), replicas=2)
    for uid, replica in (("a1", 0), ("b1", 1), ("b2", 0), ("a2", 1)):
        cluster.add(gang_pod(uid, uid[0]), replica)
    for _ in range(6):
        cluster.step(batch=1)
        if len(cluster.bindings) == 2:
            break
    assert sorted(cluster.bindings) == ["a1", "a2"]
    held_now = [h.uid for n in cluster.nodes.values() for h in n.holds.values() if h.status in ("held", "committed")]
    assert sorted(held_now) == ["a1", "a2"]
    assert all(not n.nominations for n in cluster.nodes.values())  # cleared when a2 was bound
    b = cluster.ledgers["default/b"]
    assert [m[0]["trigger"] for m in b.gave_up.values()] == ["yield:n2:b1/0/n2"]


def test_a_yield_is_replayed_safely_and_ignored_once_accepted() -> None:
    state = LedgerState("ns/b")
    run(state, held("b1", key="ns/b", gang_min=2))
    y = Yield(decision_key="ns/b", node="n1", holds=("b1/0/n1",), winner="ns/a")
    first = run(state, y)
    assert kinds(first) == [("Release", "b1", 0), ("Requeue", "b1", 1)]
    assert kinds(run(state, y)) == kinds(first)  # a replay re-sends, never re-decides
    state2 = LedgerState("ns/b")
    run(state2, held("b1", key="ns/b", gang_min=1))  # accepted at once: a Yield comes too late
    assert run(state2, Yield(decision_key="ns/b", node="n1", holds=("b1/0/n1",), winner="ns/a")).first == []


def test_a_soft_rejection_keeps_the_other_members_held() -> None:
    state = LedgerState("ns/g")
    run(state, held("a"), held("b"))
    soft = Rejected(uid="c", attempt=0, node="n1", decision_key="ns/g", reason="waiting for gang(s)", soft=True)
    assert kinds(run(state, soft)) == [("Requeue", "c", 1)]
    assert len(state.waiting) == 2


def test_the_owner_asks_lower_ranked_gangs_to_yield_and_resends_on_replay() -> None:
    owner, state = NodeOwner(), NodeState("n1")

    def apply(*records: Any) -> list[Any]:
        result = OwnerResult()
        owner.apply(state, list(records), result)
        return [o.record for o in result.outputs]

    apply(make_node("n1", cpu=2000))
    apply(make_claim("b1", cpu=1000, key="ns/b", gang_min=2), make_claim("c1", cpu=1000, key="ns/c", gang_min=2))
    claim = make_claim("a1", cpu=2000, key="ns/a", gang_min=2)
    out = apply(claim)
    rejected = [r for r in out if isinstance(r, Rejected)]
    yields = [r for r in out if isinstance(r, Yield)]
    assert [r.soft for r in rejected] == [True] and "wound-wait" in rejected[0].reason
    assert [(y.decision_key, y.holds, y.winner) for y in yields] == [("ns/b", ("b1/0/n1",), "ns/a"),
                                                                    ("ns/c", ("c1/0/n1",), "ns/a")]
    assert state.nominations["a1"].requests["cpu"] == 2000  # what they free is promised to a1
    again = apply(claim)  # a redelivered claim re-sends, never re-decides
    assert [type(r).__name__ for r in again if not isinstance(r, NodeStateChange)] == ["Rejected", "Yield", "Yield"]
    # A higher-ranked gang is not asked to yield to a lower-ranked one.
    low = [r for r in apply(make_claim("z1", cpu=2000, key="ns/z", gang_min=2)) if isinstance(r, Rejected)]
    assert not low[0].soft and not any(isinstance(r, Yield) for r in apply(make_claim("z1", cpu=2000, key="ns/z", gang_min=2)))


# -- replay safety of gangs: a redelivered input re-sends everything it caused, from the record --


def wire(out: Decision) -> tuple[list[tuple[str, str, bytes]], list[tuple[str, str, bytes]]]:
    """A decision's outputs as they go on the wire (topic, key, encoded record)."""
    return ([(o.topic, o.key, encode(o.record)) for o in out.first],
            [(o.topic, o.key, encode(o.record)) for o in out.after_commit])


def test_a_replayed_member_resends_the_whole_gangs_acceptance() -> None:
    state = LedgerState("ns/g")
    assert run(state, held("a", gang_min=2, devices=("gpu/0/100/100",))).first == []  # its offset is committed
    first = run(state, held("b", node="n2", gang_min=2))  # completes the gang; crash before delivery
    assert sorted(o.record.uid for o in first.after_commit) == ["a", "b"]  # type: ignore[attr-defined]
    # Only Held(b) comes back (with other fields, even): a and b are re-sent, as the first time.
    again = run(state, held("b", node="n2", gang_min=2, devices=("gpu/3/100/100",), name="x"))
    assert wire(again) == wire(first)


def test_a_replayed_deletion_of_a_waiting_member_resends_its_release() -> None:
    state = LedgerState("ns/g")
    run(state, held("a"), held("b"))
    deleted = PodDeleted(uid="a", decision_key="ns/g")
    first = run(state, deleted)
    assert kinds(first) == [("Release", "a", 0)] and list(state.waiting) == ["b/0/n1"]
    assert wire(run(state, deleted)) == wire(first)  # the pod is gone and no longer waiting: re-sent


def test_members_beyond_min_available_bind_at_once_until_the_gang_is_gone() -> None:
    state = LedgerState("ns/g")
    run(state, held("a", gang_min=2), held("b", gang_min=2))
    late = run(state, held("c", gang_min=2))
    assert kinds(late) == [("Commit", "c", 0)] and [o.record.uid for o in late.after_commit] == ["c"]  # type: ignore[attr-defined]
    assert late.timers == [] and state.waiting == {}
    # Once every bound member is gone, the gang starts over: a new member waits for min-available.
    run(state, PodDeleted(uid="a", decision_key="ns/g"), PodTerminated(uid="b", node="n1", decision_key="ns/g"),
        PodDeleted(uid="c", decision_key="ns/g"))
    anew = run(state, held("d", gang_min=2))
    assert anew.first == [] and list(state.waiting) == ["d/0/n1"] and anew.timers == [("ns/g", 1, 600.0)]


def test_nominations_from_soft_rejections_are_cleared_when_the_pod_binds_elsewhere() -> None:
    state = LedgerState("ns/g")
    run(state, held("a", gang_min=2))
    soft = Rejected(uid="b", attempt=0, node="n1", decision_key="ns/g", reason="wound-wait", soft=True)
    run(state, soft)
    assert state.pods["b"].nominated == ["n1"]
    first = run(state, held("b", node="n2", attempt=1, gang_min=2))
    cleared = [(o.topic, o.key, o.record) for o in first.first if isinstance(o.record, NominationCleared)]
    assert cleared == [(topics.NODE_INBOX, "n1", NominationCleared(uid="b", node="n1"))]
    assert wire(run(state, held("a", gang_min=2))) == wire(first)  # re-sent with the group


def test_nominations_from_soft_rejections_are_cleared_when_the_pod_is_deleted() -> None:
    state = LedgerState("ns/g")
    run(state, Rejected(uid="b", attempt=0, node="n1", decision_key="ns/g", reason="wound-wait", soft=True))
    deleted = PodDeleted(uid="b", decision_key="ns/g")
    first = run(state, deleted)
    assert [(o.key, o.record) for o in first.first] == [("n1", NominationCleared(uid="b", node="n1"))]
    assert wire(run(state, deleted)) == wire(first)


def test_a_redelivered_yield_resends_what_it_sent_the_first_time() -> None:
    state = LedgerState("ns/b")
    run(state, held("b1", key="ns/b", gang_min=2))
    y = Yield(decision_key="ns/b", node="n1", holds=("b1/0/n1",), winner="ns/a")
    first = run(state, y)
    assert wire(run(state, replace(y, winner="ns/z"))) == wire(first)


def test_the_timer_of_a_round_given_up_otherwise_sends_nothing() -> None:
    state = LedgerState("ns/g")
    run(state, held("a"), held("b"))
    run(state, Rejected(uid="c", attempt=0, node="n1", decision_key="ns/g", reason="Insufficient cpu"))
    assert state.round == 1  # Strict mode gave up round 0; its timer still fires
    out = run(state, GangTimeout(decision_key="ns/g", round=0))
    assert out.first == [] and out.after_commit == []


def test_a_rejection_of_an_older_attempt_does_not_take_the_current_round_down() -> None:
    state = LedgerState("ns/g")
    run(state, held("a"), held("b"))
    run(state, Rejected(uid="c", attempt=0, node="n1", decision_key="ns/g", reason="Insufficient cpu"))
    run(state, held("a", attempt=1), held("b", attempt=1))  # round 1 waits for c's next attempt
    late = run(state, Rejected(uid="c", attempt=0, node="n2", decision_key="ns/g", reason="Insufficient cpu"))
    assert kinds(late) == [("Requeue", "c", 1)]  # the latest attempt announced again, nothing given up
    assert sorted(state.waiting) == ["a/1/n1", "b/1/n1"]


def test_a_gang_whose_waiting_members_were_all_deleted_arms_a_new_timer_for_the_next() -> None:
    state = LedgerState("ns/g")
    assert run(state, held("a")).timers == [("ns/g", 0, 600.0)]
    run(state, PodDeleted(uid="a", decision_key="ns/g"))
    assert run(state, GangTimeout(decision_key="ns/g", round=0)).first == []  # nothing waits
    out = run(state, held("b"))
    assert out.timers == [("ns/g", 1, 600.0)]  # else b would wait for ever (until a restart)
    again = run(state, GangTimeout(decision_key="ns/g", round=1))
    assert kinds(again) == [("Release", "b", 0), ("Requeue", "b", 1)]


def test_a_batch_replaying_several_members_resends_their_group_once() -> None:
    state = LedgerState("ns/g")
    first = run(state, held("a", gang_min=2), held("b", node="n2", gang_min=2))
    again = run(state, held("a", gang_min=2), held("b", node="n2", gang_min=2), held("a", gang_min=2))
    assert wire(again) == wire(first)


def test_a_termination_of_a_waiting_member_releases_its_hold_and_is_replayed() -> None:
    state = LedgerState("ns/g")
    run(state, held("a"), held("b"))
    terminated = PodTerminated(uid="a", node="n1", decision_key="ns/g", reason="node deleted")
    first = run(state, terminated)
    assert kinds(first) == [("Release", "a", 0)] and list(state.waiting) == ["b/0/n1"]
    assert wire(run(state, terminated)) == wire(first)


def test_members_placed_on_the_same_capacity_by_two_replicas_at_once_do_not_livelock() -> None:
    # Each replica places one member of a Strict gang in the same round, from the same state:
    # both choose the same node, which has room for one. Were the rejected member's refusal
    # a Strict give-up, both would be requeued together and collide again on every round
    # (seen on the embedded broker: a gang of five retried for a minute). The owner marks it
    # a refusal for a fellow member's hold: that member alone is requeued, its replica then
    # sees its fellow's hold and places it on the other node.
    cluster = Cluster(make_node("n1", cpu=1000), make_node("n2", cpu=1000), replicas=2)
    cluster.replica_of.update({"g1": 0, "g2": 1})
    for uid, replica in cluster.replica_of.items():
        cluster.cores[replica].add(gang_pod(uid, "g"))
    rounds = []
    for _ in range(6):
        cluster.now += 5.0
        produced = [o for core in cluster.cores for o in core.schedule(512)]  # both, before either routes
        rounds.append(sorted(o.key for o in produced if o.topic == topics.NODE_INBOX))
        cluster.route(produced)
        if len(cluster.bindings) == 2:
            break
    assert rounds[0] == ["n1", "n1"]  # the collision
    assert sorted(cluster.bindings) == ["g1", "g2"] and set(cluster.bindings.values()) == {"n1", "n2"}
    fellows = [h for n in cluster.nodes.values() for h in n.holds.values() if h.fellow]
    assert fellows and all(h.status == "rejected" and "fellow" in h.reason for h in fellows)
    assert not cluster.ledgers["default/g"].gave_up  # no Strict give-up


def test_a_member_with_nowhere_else_to_go_after_a_fellow_refusal_ends_the_round_soon() -> None:
    # Found by an adversarial review: g2 fits only on n1, where g1 (which could run on n2)
    # holds the room. The fellow refusal requeued g2 alone; its scheduler found no room and
    # claimed nothing more, while g1 kept n1 until the gang's timeout (600 s by default) ended
    # the round. The refusal now shortens the round to FELLOW_GRACE_S.
    cluster = Cluster(make_node("n1", cpu=1000, labels={"only": "n1"}), make_node("n2", cpu=1000), replicas=2)
    cluster.replica_of.update({"g1": 0, "g2": 1})
    cluster.cores[0].add(gang_pod("g1", "g"))
    cluster.cores[1].add(replace(gang_pod("g2", "g"), node_selector={"only": "n1"}))
    cluster.route([o for core in cluster.cores for o in core.schedule(512)])
    ledger = cluster.ledgers["default/g"]
    assert ledger.decisions == {"g1/0/n1": "waiting", "g2/0/n1": "requeued:1"} and not ledger.gave_up
    assert ledger.timer_s == FELLOW_GRACE_S  # what a restore re-arms
    assert [t for t in cluster.timers if t[0] == "default/g"] == [("default/g", 0, GANG_DEFAULT_WAITING_S),
                                                                  ("default/g", 0, FELLOW_GRACE_S)]
    out = Decision()
    cluster.decider.apply(ledger, [GangTimeout(decision_key="default/g", round=0)], out)
    cluster.route(out.first + out.after_commit)
    assert list(ledger.gave_up) == ["0"] and ledger.round == 1  # both retry; n1 is free again
    assert not [h for n in cluster.nodes.values() for h in n.holds.values() if h.status == "held"]


def test_the_owner_marks_a_refusal_for_fellow_members_holds_only() -> None:
    owner, state = NodeOwner(), NodeState("n1")

    def answer(claim: Any) -> Rejected | Held:
        result = OwnerResult()
        owner.apply(state, [claim], result)
        [out] = [o.record for o in result.outputs if isinstance(o.record, (Held, Rejected))]
        return out

    gpu = ("gpu/0/100/100",)
    owner.apply(state, [make_node("n1", cpu=4000, gpus=(GpuDevice(0), GpuDevice(1)))], OwnerResult())
    assert isinstance(answer(make_claim("a", cpu=1000, key="ns/g", gang_min=3, devices=gpu)), Held)
    fellow = make_claim("b", cpu=1000, key="ns/g", gang_min=3, devices=gpu)  # the same GPU as its fellow
    first = answer(fellow)
    assert isinstance(first, Rejected) and first.fellow and not first.soft
    assert first.reason == "Insufficient gpu 0 (held by fellow members of its gang)"
    assert answer(fellow) == first  # a redelivered claim gets the recorded answer
    # Another gang's member, a pod alone, and a fellow that would not fit anyway: plain refusals.
    other = answer(make_claim("x", cpu=1000, key="ns/x", gang_min=2, devices=gpu))
    single = answer(make_claim("s", cpu=1000, devices=gpu))
    too_big = answer(make_claim("c", cpu=5000, key="ns/g", gang_min=3))
    assert [(type(r).__name__, r.fellow) for r in (other, single, too_big)] == [("Rejected", False)] * 3


def test_a_rejection_for_fellows_requeues_that_member_alone_in_strict_mode() -> None:
    state = LedgerState("ns/g")
    run(state, held("a"), held("b"))
    fellow = Rejected(uid="c", attempt=0, node="n1", decision_key="ns/g", reason="Insufficient gpu 0", fellow=True)
    assert kinds(run(state, fellow)) == [("Requeue", "c", 1)]
    assert len(state.waiting) == 2 and not state.gave_up
    assert kinds(run(state, fellow)) == [("Requeue", "c", 1)]  # a replay re-sends, never re-decides


# -- a pending gang's ledger stays bounded however many rounds it loses (issue 28, item 10) --


def ledger_bytes(state: LedgerState) -> int:
    return len(orjson.dumps(state.to_json()))


def lose_a_round(state: LedgerState, k: int) -> Decision:
    """min-available 3: a and b are held (attempt k), c fits nowhere; the round times out."""
    run(state, held("a", attempt=k, gang_waiting_s=30.0), held("b", node="n2", attempt=k, gang_waiting_s=30.0))
    return run(state, GangTimeout(decision_key="ns/g", round=k))


def test_a_gang_that_loses_round_after_round_keeps_a_ledger_of_one_round() -> None:
    """Issue 28, item 10: 300 time-outs took the ledger from 516 B to 82 kB (602 decisions, 301
    give-ups), written whole on every batch while the pods live."""
    state = LedgerState("ns/g")
    lose_a_round(state, 0)
    one_round = ledger_bytes(state)
    for k in range(1, 300):
        last = lose_a_round(state, k)
    assert state.round == 300 and kinds(last) == [("Release", "a", 299), ("Release", "b", 299),
                                                  ("Requeue", "a", 300), ("Requeue", "b", 300)]
    assert ledger_bytes(state) < 2 * one_round, (one_round, ledger_bytes(state))
    # What can still come: the last round's timer again re-sends its give-up in full; an older
    # round's timer finds nothing to do (its give-up went out before a later batch was decided);
    # a Held of an older round's attempt is released again and the latest attempt announced.
    assert wire(run(state, GangTimeout(decision_key="ns/g", round=299))) == wire(last)
    assert run(state, GangTimeout(decision_key="ns/g", round=7)).first == []
    assert kinds(run(state, held("a", attempt=7))) == [("Release", "a", 7), ("Requeue", "a", 300)]
    # The pods still bind once the gang completes.
    done = run(state, held("a", attempt=300), held("b", node="n2", attempt=300), held("c", node="n3"))
    assert sorted(o.record.uid for o in done.after_commit) == ["a", "b", "c"]


def test_a_round_re_sent_in_the_batch_that_gives_up_the_next_is_kept_with_it() -> None:
    """After a crash the batch read again re-sends round 0's give-up (its outputs may never have
    gone out) and then gives up round 1: both are kept, for that batch may be read again too."""
    state = LedgerState("ns/g")
    first = lose_a_round(state, 0)
    run(state, held("a", attempt=1, gang_waiting_s=30.0), held("b", node="n2", attempt=1, gang_waiting_s=30.0))
    run(state, GangTimeout(decision_key="ns/g", round=0), GangTimeout(decision_key="ns/g", round=1))
    assert sorted(state.gave_up) == ["0", "1"]
    assert wire(run(state, GangTimeout(decision_key="ns/g", round=0))) == wire(first)
    lose_a_round(state, 2)  # a later batch gives up another round: the earlier ones went out
    assert sorted(state.gave_up) == ["2"]


def test_a_strict_rejection_that_gave_up_the_kept_round_is_re_sent_from_its_record() -> None:
    state = LedgerState("ns/g")
    lose_a_round(state, 0)
    run(state, held("a", attempt=1), held("b", node="n2", attempt=1))
    rejected = Rejected(uid="c", attempt=0, node="n3", decision_key="ns/g", reason="Insufficient cpu")
    first = run(state, rejected)
    assert sorted(state.gave_up) == ["1"] and "c/0/n3" in state.decisions  # the kept round's trigger
    assert wire(run(state, replace(rejected, reason="something else"))) == wire(first)
