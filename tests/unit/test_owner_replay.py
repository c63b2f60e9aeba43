"""Node owners under crashes and replays (DESIGN.md, rules 1, 6, 9 and 12).

A crash, here: the owner applies a batch, its table write (changelog) lands, and it dies
before the batch's outputs are delivered; it restarts from its last committed offset, restores
its table, and sees the same inputs again against the already-updated state. Every input's
outcome must then be re-sent in full, built from the record, and a scheduler replica must end
up with the view of one that never saw a crash.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agents.ports import Output
from agents.scheduler.cluster import ClusterState
from agents.state import gangs
from agents.state import reservations as rsv
from agents.state.owner import COMMITTED, HELD, TERMINATED, NodeOwner, NodeState, OwnerResult
from agents.state.resources import ResourceSpace
from schemas import topics
from schemas.records import (
    Claim,
    Commit,
    CurrentOwner,
    GpuDevice,
    Held,
    NodeDeleted,
    NodeStateChange,
    Nomination,
    PodTerminated,
    Record,
    Rejected,
    Release,
    Reservation,
    ReservationEvent,
    ReservationExpired,
    ReservationOwner,
    ResourceList,
    SchedulingFeedback,
    Yield,
)
from tests.builders import GI, make_claim, make_node

NODE = make_node("n1", cpu=1000)
SPACE = ResourceSpace()


def run(records: list[Record], state: NodeState) -> OwnerResult:
    result = OwnerResult()
    NodeOwner().apply(state, records, result)
    return result


def restored(state: NodeState) -> NodeState:
    """The owner's table as a restarted owner restores it from the changelog."""
    return NodeState.from_json(state.to_json())


def reports(result: OwnerResult) -> list[NodeStateChange]:
    return [o.record for o in result.outputs if isinstance(o.record, NodeStateChange)]


def others(result: OwnerResult) -> list[Output]:
    """The outputs but the reports."""
    return [o for o in result.outputs if not isinstance(o.record, NodeStateChange)]


def of(result: OwnerResult, kind: type[Record]) -> list[Output]:
    return [o for o in result.outputs if isinstance(o.record, kind)]


def comparable(outputs: list[Output]) -> list[tuple[str, str, Record]]:
    """Outputs as sent, but a report's sequence number (it grows with every report)."""
    return [(o.topic, o.key, dataclasses.replace(o.record, seq=0) if isinstance(o.record, NodeStateChange) else o.record)
            for o in outputs]


class Replica:
    """A scheduler replica's view of the cluster, fed by the owners' reports; it assumes each
    claim when it sends it, as the scheduler core does."""

    def __init__(self) -> None:
        self.cluster = ClusterState(SPACE)

    def send(self, record: Record) -> None:
        row = self.cluster.index.get(record.node) if isinstance(record, Claim) else None
        if isinstance(record, Claim) and row is not None:
            self.cluster.assume(record.hold_id, row, SPACE.pod_request(record.requests))

    def read(self, result: OwnerResult) -> None:
        for change in reports(result):
            self.cluster.apply(change)

    def view(self) -> dict[str, Any]:
        """What the replica counts on each node (what the owners reported plus what it assumes
        and they have not reported yet: a plain hold is reported with the node's next batch)."""
        c = self.cluster
        rows = range(c.size)
        return {
            "bound": sorted((uid, p.row, p.pod) for uid, p in c.bound.items()),
            "requested": [c.requested[r].tolist() for r in rows],
            "present": [bool(c.present[r]) for r in rows],
            "nominated": sorted(c.nominator.nominated_uids()),
            "gang_holds": {r: tuple(h.hold_id for h in hs) for r, hs in c.gang_holds.items()},
            "reservations": {r: [(a.reservation.uid, a.allocated.tolist(), a.consumers) for a in avail]
                             for r, avail in c.reservations.by_row.items()},
        }


def reservation(uid: str = "r1", cpu: int = 600, **kw: Any) -> Reservation:
    return Reservation(uid=uid, name=uid, owners=(ReservationOwner(match_labels={"app": "web"}),),
                       requests=ResourceList(cpu=cpu, memory=GI), **kw)


def gpu_node(name: str = "n1") -> Any:
    return make_node(name, cpu=4000, gpus=(GpuDevice(minor=0), GpuDevice(minor=1)))


def commit(uid: str, node: str = "n1", key: str = "") -> Commit:
    return Commit(uid=uid, attempt=0, node=node, decision_key=key or uid)


# Input logs: each position is a place where the owner may crash after its table write.
SCENARIOS: dict[str, list[Record]] = {
    "claims-commit-release-terminate-delete": [
        NODE, make_claim("a", cpu=600), make_claim("b", cpu=600), make_claim("c", cpu=300),
        commit("a"), Release(uid="c", attempt=0, node="n1", decision_key="c"), PodTerminated(uid="a", node="n1"),
        make_claim("d", cpu=500), commit("d"), NodeDeleted(name="n1"), make_claim("e", cpu=1),
    ],
    "wound-wait": [
        make_node("n1", cpu=2000), make_claim("b1", cpu=1000, key="ns/b", gang_min=2),
        make_claim("c1", cpu=1000, key="ns/c", gang_min=2), make_claim("a1", cpu=2000, key="ns/a", gang_min=2),
        Release(uid="b1", attempt=0, node="n1", decision_key="ns/b"),
        Release(uid="c1", attempt=0, node="n1", decision_key="ns/c"),
        make_claim("a1", attempt=1, cpu=2000, key="ns/a", gang_min=2), commit("a1", key="ns/a"),
    ],
    "reservation-consumed": [
        make_node("n1", cpu=4000), make_claim("r1", cpu=600, reserving=reservation(ttl_s=60.0, creation_timestamp=1000.0)),
        commit("r1"), make_claim("w1", cpu=400, reservation="r1"), commit("w1"), ReservationExpired(uid="r1", node="n1"),
    ],
    "reservation-expired-then-deleted": [
        make_node("n1", cpu=4000), make_claim("r1", cpu=600, reserving=reservation(ttl_s=60.0, creation_timestamp=1000.0)),
        commit("r1"), make_claim("w1", cpu=400, reservation="r1"), ReservationExpired(uid="r1", node="n1"),
        commit("w1"), PodTerminated(uid="r1", node="n1"), ReservationExpired(uid="r1", node="n1"),
    ],
    "reservation-on-a-deleted-node": [
        make_node("n1", cpu=4000), make_claim("r1", cpu=600, reserving=reservation(allocate_once=False)),
        commit("r1"), make_claim("w1", cpu=400, reservation="r1"), commit("w1"), make_claim("w2", cpu=100, reservation="r1"),
        make_claim("r2", cpu=600, reserving=reservation("r2")), NodeDeleted(name="n1"), commit("w2"), commit("r2"),
    ],
    "commit-after-node-deleted": [
        NODE, make_claim("a", cpu=600), make_claim("b", cpu=300), commit("b"), NodeDeleted(name="n1"), commit("a"),
        NODE, make_claim("c", cpu=1000),
    ],
    "nominations": [
        NODE, Nomination(uid="a", node="n1", priority=5, requests=ResourceList(cpu=600)),
        make_claim("a", cpu=600, priority=5), Nomination(uid="x", node="n1", priority=1, requests=ResourceList(cpu=100)),
        commit("a"), PodTerminated(uid="a", node="n1"),
    ],
}


@pytest.mark.parametrize("log", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_a_redelivered_input_re_sends_exactly_what_it_sent_the_first_time(log: list[Record]) -> None:
    """Crash right after each input's table write: the redelivered input re-sends the same
    outputs, and problems, and timers; and a report (the first time a claim that only made a
    plain hold sent none, its hold left to the node's next report; the first report may also
    name such holds of earlier batches, which the restored state no longer knows to name)."""
    for i, record in enumerate(log):
        state = NodeState("n1")
        for earlier in log[:i]:
            run([earlier], state)
        first = run([record], state)
        state = restored(state)
        again = run([record], state)
        assert comparable(others(again)) == comparable(others(first)), (i, record)
        [report] = reports(again)
        if reports(first):
            [then] = reports(first)
            assert dataclasses.replace(report, seq=0, holds={}) == dataclasses.replace(then, seq=0, holds={}), i
            assert report.holds.items() <= then.holds.items(), (i, record)
        else:
            assert isinstance(record, Claim) and report.holds == {record.hold_id: HELD}, (i, record)
        assert [(p.field, p.value) for p in again.problems] == [(p.field, p.value) for p in first.problems]
        assert again.timers == first.timers, (i, record)


def is_subsequence(needle: list[Any], haystack: list[Any]) -> bool:
    it = iter(haystack)
    return all(any(n == h for h in it) for n in needle)


@pytest.mark.parametrize("log", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_after_a_crash_anywhere_the_replay_re_sends_everything_and_replicas_converge(log: list[Record]) -> None:
    """The owner processed the whole log and wrote its table, but the outputs of the inputs
    from `i` on were lost; the replay from `i` re-sends all of them (in order), and a replica
    that read only the reports delivered ends up where a replica that saw no crash is."""
    clean_state, clean = NodeState("n1"), Replica()
    firsts = []
    for record in log:
        clean.send(record)
        firsts.append(run([record], clean_state))
        clean.read(firsts[-1])
    for i in range(len(log)):
        state, replica = NodeState("n1"), Replica()
        for record in log[:i]:
            replica.send(record)
            replica.read(run([record], state))
        for record in log[i:]:  # processed, table written, outputs lost
            replica.send(record)
            run([record], state)
        state = restored(state)
        replayed = [o for record in log[i:] for o in run([record], state).outputs]
        lost = [o for r in firsts[i:] for o in r.outputs if not isinstance(o.record, NodeStateChange)]
        sent = [o for o in replayed if not isinstance(o.record, NodeStateChange)]
        assert is_subsequence(comparable(lost), comparable(sent)), i
        for o in replayed:
            if isinstance(o.record, NodeStateChange):
                replica.cluster.apply(o.record)
        assert replica.view() == clean.view(), i
        assert dataclasses.replace(restored(state), seq=0) == dataclasses.replace(restored(clean_state), seq=0)


# -- 1. reports are re-sent --------------------------------------------------------------------

CLAIM = make_claim("a", cpu=600)
HID = CLAIM.hold_id


@pytest.mark.parametrize(("before", "lost", "status"), [
    ([NODE], CLAIM, HELD),
    ([NODE, CLAIM], commit("a"), COMMITTED),
    ([NODE, CLAIM], Release(uid="a", attempt=0, node="n1", decision_key="a"), "released"),
    ([NODE, CLAIM, commit("a")], PodTerminated(uid="a", node="n1"), TERMINATED),
    ([NODE, CLAIM, commit("a")], NodeDeleted(name="n1"), TERMINATED),
], ids=["claim", "commit", "release", "pod-terminated", "node-deleted"])
def test_a_lost_report_is_re_sent_and_the_replica_converges(before: list[Record], lost: Record, status: str) -> None:
    state, crashed, clean = NodeState("n1"), Replica(), Replica()
    for record in before:
        for replica in (crashed, clean):
            replica.send(record)
        result = run([record], state)
        crashed.read(result)
        clean.read(result)
    crashed.send(lost)
    clean.send(lost)
    clean.read(run([lost], state))  # the first time: the crashed replica never got it
    again = run([lost], restored(state))  # a claim's first answer sent no report (a plain hold), its replay one
    [change] = reports(again)
    assert change.holds == {HID: status}
    if status == COMMITTED:
        assert [p.uid for p in change.committed] == ["a"]
    crashed.read(again)
    assert crashed.view() == clean.view()
    assert ("a" in crashed.cluster.bound) is (status == COMMITTED)


# -- 2. a node deletion's terminations are re-sent --------------------------------------------

def test_a_redelivered_node_deletion_re_sends_the_terminations_it_owes() -> None:
    state = NodeState("n1")
    run([NODE, make_claim("a", cpu=300, key="ns/g"), make_claim("b", cpu=300), make_claim("c", cpu=300),
         Commit(uid="a", attempt=0, node="n1", decision_key="ns/g"), commit("b")], state)
    first = run([NodeDeleted(name="n1")], state)
    expected = [(topics.HOLDS, "ns/g", "a"), (topics.HOLDS, "b", "b")]
    assert [(o.topic, o.key, o.record.uid) for o in of(first, PodTerminated)] == expected  # type: ignore[attr-defined]
    again = run([NodeDeleted(name="n1")], restored(state))
    assert [(o.topic, o.key, o.record.uid) for o in of(again, PodTerminated)] == expected  # type: ignore[attr-defined]
    assert comparable(of(again, PodTerminated)) == comparable(of(first, PodTerminated))
    assert reports(again)[0].holds == {"a/0/n1": TERMINATED, "b/0/n1": TERMINATED}


def test_a_replayed_node_record_before_the_deletion_still_re_sends_the_terminations() -> None:
    """Replay from before the Node record: the Node revives the node for a moment, and the
    redelivered NodeDeleted must still re-send what it owes."""
    state = NodeState("n1")
    log: list[Record] = [make_node("n1", cpu=1000, labels={"v": "2"}), NodeDeleted(name="n1")]
    run([NODE, make_claim("a", cpu=300), commit("a")], state)
    for record in log:
        run([record], state)
    state = restored(state)
    outputs = [o for record in log for o in run([record], state).outputs]
    assert [o.record.uid for o in outputs if isinstance(o.record, PodTerminated)] == ["a"]


# -- 3. re-sends are built from the record ---------------------------------------------------

def test_a_claim_redelivered_with_other_devices_is_answered_from_the_record() -> None:
    state = NodeState("n1")
    run([gpu_node()], state)
    first = make_claim("a", cpu=500, devices=("gpu/0/50/50",), gang_min=2, gang_waiting_s=30.0, key="ns/g")
    [held] = [o.record for o in run([first], state).outputs if isinstance(o.record, Held)]
    other = dataclasses.replace(first, devices=("gpu/1/100/100",), requests=ResourceList(cpu=900, pods=1),
                                gang_waiting_s=5.0)
    result = run([other], restored(state))
    [again] = [o.record for o in result.outputs if isinstance(o.record, Held)]
    assert again == held and again.devices == ("gpu/0/50/50",) and again.gang_waiting_s == 30.0
    assert [p.value for p in result.problems] == [first.hold_id]
    assert "devices" in result.problems[0].error and "requests" in result.problems[0].error
    # The owner still accounts the first claim, devices included.
    assert state.device_usage() == {"gpu/0/core": 50, "gpu/0/ratio": 50}


def test_a_rejection_and_its_yields_are_re_sent_from_the_record() -> None:
    state = NodeState("n1")
    run([make_node("n1", cpu=2000), make_claim("b1", cpu=1000, key="ns/b", gang_min=2),
         make_claim("c1", cpu=1000, key="ns/c", gang_min=2)], state)
    claim = make_claim("a1", cpu=2000, key="ns/a", gang_min=2)
    first = run([claim], state)
    impostor = dataclasses.replace(claim, decision_key="ns/x", priority=9)  # same hold id
    again = run([impostor], restored(state))
    sent = [o for o in again.outputs if isinstance(o.record, (Rejected, Yield))]
    assert comparable(sent) == comparable([o for o in first.outputs if isinstance(o.record, (Rejected, Yield))])
    assert [o.key for o in sent] == ["ns/a", "ns/b", "ns/c"]
    assert {o.record.winner for o in sent if isinstance(o.record, Yield)} == {"ns/a"}
    assert [p.value for p in again.problems] == [claim.hold_id]


def test_an_identical_redelivered_claim_is_no_problem() -> None:
    state = NodeState("n1")
    claim = make_claim("a", cpu=600, reservation="nope", reserving=None, gang_min=3, quota="q")
    run([NODE, claim], state)
    assert run([claim], restored(state)).problems == []


# -- 4. a Commit after the node's deletion ----------------------------------------------------

def test_a_commit_after_the_node_was_deleted_terminates_the_pod_at_once_with_feedback() -> None:
    state = NodeState("n1")
    run([gpu_node(), make_claim("a", cpu=3000, key="ns/g", devices=("gpu/0/100/100",), namespace="ns", name="pa"),
         NodeDeleted(name="n1")], state)
    late = Commit(uid="a", attempt=0, node="n1", decision_key="ns/g")
    first = run([late], state)
    assert first.problems == [] and state.holds["a/0/n1"].status == TERMINATED
    [terminated] = of(first, PodTerminated)
    assert (terminated.topic, terminated.key) == (topics.HOLDS, "ns/g")
    assert terminated.record == PodTerminated(uid="a", node="n1", decision_key="ns/g", reason="node deleted")
    [feedback] = of(first, SchedulingFeedback)
    assert (feedback.topic, feedback.key) == (topics.FEEDBACK, "a")
    assert isinstance(feedback.record, SchedulingFeedback)
    assert (feedback.record.namespace, feedback.record.name) == ("ns", "pa") and "deleted" in feedback.record.message
    assert reports(first)[0].holds == {"a/0/n1": TERMINATED} and reports(first)[0].committed == ()
    # Replayed: re-sent from the record.
    state = restored(state)
    again = run([late], state)
    assert comparable(of(again, PodTerminated) + of(again, SchedulingFeedback)) == comparable([terminated, feedback])
    # The node comes back: nothing of the ghost counts.
    run([gpu_node()], state)
    assert state.used().get("cpu", 0) == 0 and state.device_usage() == {}
    held = [o.record for o in run([make_claim("b", cpu=4000, devices=("gpu/0/100/100",))], state).outputs
            if isinstance(o.record, Held)]
    assert [h.uid for h in held] == ["b"]
    assert [type(o.record).__name__ for o in run([make_claim("a", attempt=1, cpu=1)], state).outputs
            if isinstance(o.record, (Held, Rejected))] == ["Rejected"]  # tombstoned


def test_a_misfit_commit_reports_every_hold_of_the_pod_it_ends() -> None:
    """A pod committed here and claimed here again; the node shrinks; the second claim's
    commit no longer fits, and ends the pod: both of its holds are reported terminated, and
    again when the commit is redelivered (the first was left out of the report, so replicas
    kept it as committed; an adversarial review found it)."""
    state = NodeState("n1")
    run([NODE, make_claim("u", cpu=400), Commit(uid="u", attempt=0, node="n1", decision_key="u"),
         make_claim("u", attempt=1, cpu=400), make_node("n1", cpu=500)], state)
    commit = Commit(uid="u", attempt=1, node="n1", decision_key="u")
    first = run([commit], state)
    assert reports(first)[0].holds == {"u/1/n1": TERMINATED, "u/0/n1": TERMINATED}
    again = run([commit], restored(state))  # its first report lost in a crash
    assert reports(again)[0].holds == {"u/1/n1": TERMINATED, "u/0/n1": TERMINATED}


# -- 5. gangs rank by the gang -----------------------------------------------------------------

def test_two_gangs_never_yield_to_each_other_whatever_their_members_creation_times() -> None:
    """Gang A's members were created at t=10 and t=12, gang B's at t=11. Each owner holds one
    gang's member when the other gang's claims: only one gang may be asked to yield."""
    def member(uid: str, node: str, key: str, created: float) -> Claim:
        return make_claim(uid, node=node, cpu=1000, key=key, gang_min=2, creation_timestamp=created)

    n1, n2 = NodeState("n1"), NodeState("n2")
    run([make_node("n1", cpu=1000), member("b1", "n1", "ns/b", 11.0)], n1)
    run([make_node("n2", cpu=1000), member("a2", "n2", "ns/a", 12.0)], n2)
    yields = [o.record for o in run([member("a1", "n1", "ns/a", 10.0)], n1).outputs if isinstance(o.record, Yield)]
    yields += [o.record for o in run([member("b2", "n2", "ns/b", 11.0)], n2).outputs if isinstance(o.record, Yield)]
    assert [(y.decision_key, y.winner) for y in yields] == [("ns/b", "ns/a")]


def test_replicas_expect_the_same_yields_as_the_owners() -> None:
    n1 = NodeState("n1")
    result = run([make_node("n1", cpu=1000), make_claim("b1", cpu=1000, key="ns/b", gang_min=2,
                                                         creation_timestamp=11.0)], n1)
    replica = Replica()
    replica.read(result)
    # Gang a outranks gang b (same priority; the name decides), whenever its member was created.
    assert replica.cluster.yieldable(gangs.rank(0, "ns/a"), "ns/a") is not None
    assert replica.cluster.yieldable(gangs.rank(0, "ns/c"), "ns/c") is None


# -- 6. a Commit drops the pod's nomination here ----------------------------------------------

def test_a_commit_drops_the_pods_nomination_on_the_node_and_reports_it() -> None:
    state = NodeState("n1")
    nomination = Nomination(uid="a", node="n1", priority=5, requests=ResourceList(cpu=600))
    run([NODE, nomination, make_claim("a", cpu=600, priority=5)], state)
    result = run([commit("a")], state)
    assert "a" not in state.nominations
    assert reports(result)[0].nominations == ()
    # A replayed Nomination (before the Commit in the log) does not bring it back.
    run([nomination], state)
    assert "a" not in state.nominations
    assert state.used()["cpu"] == 600  # counted once, as the bound pod


# -- 7. reservations, re-sent in full ----------------------------------------------------------

def test_a_redelivered_reservation_commit_re_sends_its_event_and_its_timer() -> None:
    state = NodeState("n1")
    run([make_node("n1", cpu=4000), make_claim("r1", cpu=600, reserving=reservation(ttl_s=60.0, creation_timestamp=1000.0))],
        state)
    first = run([commit("r1")], state)
    assert [o.record.phase for o in of(first, ReservationEvent)] == [rsv.AVAILABLE]  # type: ignore[attr-defined]
    assert first.timers == [("n1", "r1", 1060.0)]
    again = run([commit("r1")], restored(state))
    assert comparable(of(again, ReservationEvent)) == comparable(of(first, ReservationEvent))
    assert again.timers == first.timers


def test_a_redelivered_expiry_or_consuming_commit_re_sends_the_end_of_the_reservation() -> None:
    for ender, phase in ((ReservationExpired(uid="r1", node="n1"), rsv.FAILED), (commit("w1"), rsv.SUCCEEDED)):
        state = NodeState("n1")
        run([make_node("n1", cpu=4000), make_claim("r1", cpu=600, reserving=reservation(ttl_s=60.0)), commit("r1"),
             make_claim("w1", cpu=400, reservation="r1")], state)
        first = of(run([ender], state), ReservationEvent)
        assert [(o.record.phase, o.record.allocated) for o in first] == [(phase, {"cpu": 400, "pods": 1})]  # type: ignore[attr-defined]
        # Who consumed it (Koordinator's status.currentOwners): the rebalancer's jobs decide from it.
        assert [o.record.current_owners for o in first] == [(CurrentOwner(uid="w1", namespace="default"),)]  # type: ignore[attr-defined]
        state = restored(state)
        assert comparable(of(run([ender], state), ReservationEvent)) == comparable(first)
        run([PodTerminated(uid="r1", node="n1")], state)  # the reservation deleted since
        assert comparable(of(run([ender], state), ReservationEvent))[-1:] == comparable(first)


def test_a_reservation_ended_before_owners_were_recorded_names_its_consumer_when_redelivered() -> None:
    """A table written by an owner that did not record the current owners: the consuming
    commit's redelivery names the consumer it recorded as the reservation's end."""
    state = NodeState("n1")
    run([make_node("n1", cpu=4000), make_claim("r1", cpu=600, reserving=reservation(ttl_s=60.0)), commit("r1"),
         make_claim("w1", cpu=400, reservation="r1"), commit("w1")], state)
    raw = state.to_json()
    del raw["reservations"]["r1"]["owners"]
    [event] = of(run([commit("w1")], NodeState.from_json(raw)), ReservationEvent)
    assert event.record.current_owners == (CurrentOwner(uid="w1", namespace="default"),)  # type: ignore[attr-defined]


def test_a_redelivered_node_deletion_re_sends_the_reservations_it_failed() -> None:
    state = NodeState("n1")
    run([make_node("n1", cpu=4000), make_claim("r1", cpu=600, reserving=reservation(allocate_once=False)),
         commit("r1")], state)
    first = of(run([NodeDeleted(name="n1")], state), ReservationEvent)
    assert [(o.record.phase, o.record.reason) for o in first] == [(rsv.FAILED, rsv.REASON_NODE_DELETED)]  # type: ignore[attr-defined]
    assert comparable(of(run([NodeDeleted(name="n1")], restored(state)), ReservationEvent)) == comparable(first)


def test_states_written_before_replays_were_recorded_still_read() -> None:
    """A table value as the previous owner code wrote it (no new fields) restores, and its
    holds answer as recorded."""
    raw = {
        "name": "n1", "exists": True, "allocatable": {"cpu": 1000, "pods": 110}, "unschedulable": False,
        "holds": {"a/0/n1": {"uid": "a", "attempt": 0, "decision_key": "a", "requests": {"cpu": 600, "pods": 1},
                             "priority": 0, "status": "committed", "namespace": "default", "name": "a"},
                  "r1/0/n1": {"uid": "r1", "attempt": 0, "decision_key": "r1", "requests": {"cpu": 100},
                              "priority": 0, "status": "committed", "namespace": "default",
                              "reserving": {"kind": "Reservation", "schema_version": "1.0", "uid": "r1", "name": "r1",
                                            "requests": {"cpu": 100}}}},
        "nominations": {}, "tombstones": [], "seq": 4, "record": None,
        "reservations": {"r1": {"hold": "r1/0/n1", "phase": "Available"}},
    }
    state = NodeState.from_json(raw)
    assert state.used()["cpu"] == 700
    result = run([make_claim("a", cpu=600)], state)
    assert [o.record.uid for o in result.outputs if isinstance(o.record, Held)] == ["a"]
    assert reports(result)[0].holds == {"a/0/n1": COMMITTED}
    assert NodeState.from_json(state.to_json()) == state
