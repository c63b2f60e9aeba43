"""What owners and deciders keep of finished pods, and the late records they refuse
(`agents.state.retention`; the argument is in docs/architecture.md, "How long state is kept").

Times are log times handed to the cores; the retention is 600 s, so claims older than 300 s
at their log time are refused."""

from __future__ import annotations

import orjson

from agents.adapters.deciders import DeciderCore
from agents.adapters.loop import Outcome
from agents.state.ledger import REASON_STALE, Decider, Decision, LedgerState
from agents.state.owner import (
    COMMITTED,
    HELD,
    NodeOwner,
    NodeState,
    OwnerResult,
)
from agents.state.owner import (
    REASON_STALE as OWNER_STALE,
)
from schemas.records import (
    Commit,
    Held,
    PodDeleted,
    PodTerminated,
    Rejected,
    Release,
    Requeue,
    Reservation,
    ReservationExpired,
    ReservationOwner,
    ResourceList,
)
from tests.builders import make_claim, make_node

R = 600.0
T0 = 10_000.0


def owner_run(state: NodeState, records: list, t: float) -> OwnerResult:
    result = OwnerResult()
    NodeOwner(R).apply(state, records, result, [t] * len(records), t)
    return result


def decide(state: LedgerState, records: list, t: float) -> Decision:
    out = Decision()
    Decider(R).apply(state, records, out, [t] * len(records), t)
    return out


def answers(result: OwnerResult) -> list:
    return [o.record for o in result.outputs if isinstance(o.record, (Held, Rejected))]


# -- owners ---------------------------------------------------------------------------------------

def test_a_claim_older_than_half_the_retention_is_rejected_and_so_is_its_redelivery() -> None:
    state = NodeState("n1")
    owner_run(state, [make_node()], T0)
    fresh = make_claim("a", scheduled_at=T0)
    old = make_claim("b", scheduled_at=T0 - R / 2 - 1)
    [held, rejected] = answers(owner_run(state, [fresh, old], T0))
    assert isinstance(held, Held) and held.scheduled_at == T0
    assert isinstance(rejected, Rejected) and rejected.reason == OWNER_STALE and rejected.scheduled_at == old.scheduled_at
    assert state.used() == {"cpu": 500, "pods": 1}  # the stale claim holds nothing
    [again] = answers(owner_run(state, [old], T0 + 5))  # redelivered: the recorded answer
    assert again == rejected


def test_unstamped_claims_and_unknown_log_times_are_never_stale() -> None:
    state = NodeState("n1")
    owner_run(state, [make_node()], T0)
    [a] = answers(owner_run(state, [make_claim("a")], T0 + 10 * R))
    [b] = answers(owner_run(state, [make_claim("b", scheduled_at=1.0)], 0.0))
    assert isinstance(a, Held) and isinstance(b, Held)


def test_an_owner_forgets_finished_holds_and_tombstones_a_retention_after_they_finished() -> None:
    state = NodeState("n1")
    owner_run(state, [make_node(cpu=100_000)], T0)
    claims = [make_claim(u, scheduled_at=T0) for u in ("run", "done", "gone", "held")]
    owner_run(state, [*claims, make_claim("no", cpu=10**9, scheduled_at=T0)], T0)
    owner_run(state, [Commit("run", 0, "n1", "run"), Commit("done", 0, "n1", "done"), Release("gone", 0, "n1", "gone")], T0)
    owner_run(state, [PodTerminated(uid="done", node="n1")], T0 + 10)
    assert set(state.holds) == {"run/0/n1", "done/0/n1", "gone/0/n1", "held/0/n1", "no/0/n1"}
    owner_run(state, [make_node(cpu=100_000)], T0 + R)  # not yet: a late record may still need them
    assert len(state.holds) == 5 and "done" in state.tombstones
    owner_run(state, [make_node(cpu=100_000)], T0 + 11 + R)
    assert {h: e.status for h, e in state.holds.items()} == {"run/0/n1": COMMITTED, "held/0/n1": HELD}
    assert state.tombstones == {}


def test_what_finishes_in_a_batch_without_log_time_is_forgotten_a_retention_after_the_next_one() -> None:
    """The owner looks at a node's finished holds only once one can have expired; a hold that
    finished when the batch had no log time is stamped by the next batch that has one (an
    adversarial review found it kept for ever)."""
    state = NodeState("n1")
    owner_run(state, [make_node(cpu=1000)], T0)
    owner_run(state, [make_claim("big", cpu=5000)], 0.0)  # rejected, and no time to stamp it with
    assert state.holds["big/0/n1"].finished == 0.0
    owner_run(state, [make_node(cpu=1000)], T0 + 1)
    assert state.holds["big/0/n1"].finished == T0 + 1
    owner_run(state, [make_node(cpu=1000)], T0 + 2 + R)
    assert state.holds == {}


def test_a_reservation_leaves_with_its_hold() -> None:
    state = NodeState("n1")
    owner_run(state, [make_node()], T0)
    reservation = Reservation(uid="r", name="r", owners=(ReservationOwner(match_labels={"a": "b"}),),
                              requests=ResourceList(cpu=500))
    owner_run(state, [make_claim("r", reserving=reservation, scheduled_at=T0), Commit("r", 0, "n1", "r")], T0)
    owner_run(state, [PodTerminated(uid="r", node="n1")], T0 + 1)
    assert "r" in state.reservations
    owner_run(state, [make_node()], T0 + 2 + R)
    assert state.reservations == {} and state.holds == {}


def test_tombstones_of_a_state_written_without_times_are_forgotten_a_retention_after_it_is_next_read() -> None:
    state = NodeState("n1")
    owner_run(state, [make_node()], T0)
    raw = state.to_json()
    raw["tombstones"] = ["old"]
    restored = NodeState.from_json(raw)
    owner_run(restored, [make_node()], T0 + 5 * R)
    assert restored.tombstones == {"old": T0 + 5 * R}
    owner_run(restored, [make_node()], T0 + 6 * R + 1)
    assert restored.tombstones == {}


def test_an_owners_state_stays_the_same_size_as_pods_come_and_go() -> None:
    state = NodeState("n1")
    owner_run(state, [make_node(cpu=1_000_000, pods=10_000)], T0)
    sizes = []
    for i in range(3_000):  # a pod a second, each running 60 s
        t = T0 + i
        uid, done = f"p{i}", f"p{i - 60}"
        records = [make_claim(uid, cpu=10, scheduled_at=t), Commit(uid, 0, "n1", uid)]
        if i >= 60:
            records.append(PodTerminated(uid=done, node="n1"))
        owner_run(state, records, t)
        if i in (1_000, 2_999):
            sizes.append(len(orjson.dumps(state.to_json())))
    assert sizes[1] <= 1.05 * sizes[0], sizes
    assert len(state.holds) <= 60 + R + 2


# -- deciders -------------------------------------------------------------------------------------

def test_a_stale_held_of_a_pod_not_known_is_released_and_requeued_and_leaves_nothing() -> None:
    state = LedgerState("a")
    out = decide(state, [Held(uid="a", attempt=2, node="n1", decision_key="a", scheduled_at=T0 - R)], T0)
    assert [type(o.record).__name__ for o in out.first] == ["Release", "Requeue"]
    assert isinstance(out.first[1].record, Requeue) and out.first[1].record.attempt == 3
    assert out.after_commit == [] and state.pods == {} and state.decisions == {}


def test_a_stale_rejected_of_a_pod_not_known_requeues_and_leaves_nothing() -> None:
    state = LedgerState("a")
    out = decide(state, [Rejected(uid="a", attempt=0, node="n1", decision_key="a", reason="x",
                                  scheduled_at=T0 - R)], T0)
    assert [(o.record.uid, o.record.attempt) for o in out.first if isinstance(o.record, Requeue)] == [("a", 1)]
    assert state.pods == {} and state.decisions == {}


def test_a_stale_held_of_a_pending_pod_is_released_and_the_pod_placed_again() -> None:
    state = LedgerState("a")
    decide(state, [Rejected(uid="a", attempt=0, node="n1", decision_key="a", reason="x", scheduled_at=T0)], T0)
    out = decide(state, [Held(uid="a", attempt=1, node="n2", decision_key="a", scheduled_at=T0)], T0 + R)
    assert out.after_commit == []
    requeues = [o.record for o in out.first if isinstance(o.record, Requeue)]
    assert [(r.attempt, r.reason) for r in requeues] == [(2, REASON_STALE)]
    assert decide(state, [Held(uid="a", attempt=1, node="n2", decision_key="a", scheduled_at=T0)],
                  T0 + R).first == out.first  # redelivered: the same answer


def test_a_deleted_pod_is_forgotten_a_retention_later_and_its_key_with_it() -> None:
    core = DeciderCore(R)
    outcome = Outcome()
    held = Held(uid="a", attempt=0, node="n1", decision_key="a", scheduled_at=T0)
    state = core.apply("a", None, [held], [T0], T0, outcome)
    assert state is not None and outcome.after  # bound
    state = core.apply("a", state, [PodDeleted(uid="a", decision_key="a")], [T0 + 5], T0 + 5, Outcome())
    assert state is not None and core.expires("a", state) == T0 + 5 + R
    assert core.apply("a", state, [], [], T0 + 5 + R, Outcome()) is not None  # not yet
    assert core.apply("a", state, [], [], T0 + 6 + R, Outcome()) is None  # forgotten: the key goes


def test_a_gang_forgets_its_deleted_members_and_keeps_only_its_round() -> None:
    state = LedgerState("ns/g")
    members = [Held(uid=u, attempt=0, node="n1", decision_key="ns/g", gang_min=2, scheduled_at=T0) for u in ("g0", "g1")]
    decide(state, members, T0)
    decide(state, [PodDeleted(uid=u, decision_key="ns/g") for u in ("g0", "g1")], T0 + 1)
    decide(state, [], T0 + 2 + R)
    assert state.pods == {} and state.decisions == {} and state.accepted == {} and state.groups == {}
    assert state.round == 1 and not Decider.empty(state)  # a timer of round 0 must not end a new gang's round


def test_a_deciders_entries_stay_flat_as_pods_come_and_go() -> None:
    core = DeciderCore(R)
    table: dict[str, dict] = {}
    for i in range(3_000):
        t = T0 + i
        uid = f"p{i}"
        table[uid] = core.apply(uid, None, [Held(uid=uid, attempt=0, node="n1", decision_key=uid, scheduled_at=t)],
                                [t], t, Outcome()) or {}
        if i >= 60:
            done = f"p{i - 60}"
            table[done] = core.apply(done, table[done], [PodDeleted(uid=done, decision_key=done)], [t], t, Outcome()) or {}
        for key in [k for k, s in table.items() if 0 < core.expires(k, s) < t]:  # the loop's sweep
            state = core.apply(key, table[key], [], [], t, Outcome())
            if state is None:
                del table[key]
    assert len(table) <= 60 + R + 2


def test_a_held_of_a_hold_whose_claim_was_rejected_before_is_released() -> None:
    """Adversarial review (R4): an owner that forgot a rejected hold holds a replay of its
    claim; the decider, which requeued it, answered the Held with nothing."""
    state = LedgerState("p")
    decide(state, [Rejected(uid="p", attempt=0, node="n1", decision_key="p", reason="x", scheduled_at=T0)], T0)
    out = decide(state, [Held(uid="p", attempt=0, node="n1", decision_key="p", scheduled_at=T0)], T0 + 1)
    assert [type(o.record).__name__ for o in out.first] == ["Release"] and out.after_commit == []


def test_a_deleted_pod_of_a_state_written_before_deletions_had_times_is_forgotten_later() -> None:
    """Adversarial review (R5): such a pod was never forgotten."""
    core = DeciderCore(R)
    legacy = {"key": "u", "pods": {"u": {"status": "deleted", "node": "", "attempt": 1, "namespace": "d", "name": "u"}},
              "decisions": {"u/0/n1": "released"}, "waiting": {}, "round": 0, "timer_s": 0.0, "gave_up": {},
              "accepted": {}, "sent": {"deleted:u": []}}
    state = core.apply("u", legacy, [], [], T0, Outcome())
    assert state is not None and core.expires("u", state) == T0 + R
    assert core.apply("u", state, [], [], T0 + R + 1, Outcome()) is None


def test_a_reservation_that_ends_leaves_with_its_hold_without_waiting_for_a_deletion() -> None:
    """Consumed (allocate-once) or expired, a reservation is finished like a terminated pod:
    its hold and entry go a retention after it ended, and its owner deletes it on `pods` so
    its decider forgets it too. It was kept for ever (committed, counting nothing) unless
    someone deleted it."""
    state = NodeState("n1")
    owner_run(state, [make_node()], T0)
    once = Reservation(uid="r", name="r", owners=(ReservationOwner(match_labels={"a": "b"}),),
                       requests=ResourceList(cpu=500))
    timed = Reservation(uid="s", name="s", owners=(ReservationOwner(match_labels={"a": "b"}),),
                        requests=ResourceList(cpu=500), allocate_once=False, ttl_s=60.0)
    owner_run(state, [make_claim("r", reserving=once, scheduled_at=T0), Commit("r", 0, "n1", "r"),
                      make_claim("s", reserving=timed, scheduled_at=T0), Commit("s", 0, "n1", "s"),
                      make_claim("p", reservation="r", scheduled_at=T0)], T0)
    ended = owner_run(state, [Commit("p", 0, "n1", "p")], T0 + 1).outputs
    ended += owner_run(state, [ReservationExpired(uid="s", node="n1")], T0 + 60).outputs
    assert [o.record for o in ended if o.topic == "pods"] == [
        PodDeleted(uid="r", name="r", namespace="", decision_key="r"),
        PodDeleted(uid="s", name="s", namespace="", decision_key="s")]
    assert state.used() == {"cpu": 500, "pods": 1}  # p in full; the reservations nothing
    owner_run(state, [make_node()], T0 + 61 + R)
    assert list(state.holds) == ["p/0/n1"] and state.reservations == {} and state.tombstones == {}
    ledger = LedgerState("r")  # its decider, told by the scheduler that forwards the deletion
    decide(ledger, [Held(uid="r", attempt=0, node="n1", decision_key="r", scheduled_at=T0)], T0)
    decide(ledger, [PodDeleted(uid="r", name="r", namespace="", decision_key="r")], T0 + 2)
    decide(ledger, [], T0 + 3 + R)
    assert Decider.empty(ledger)
