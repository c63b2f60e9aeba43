"""The decider: accept once, release the rest, requeue rejections, close deletions."""

from agents.state.ledger import BOUND, DELETED, TERMINATED, Decider, Decision, LedgerState
from schemas.records import Binding, Commit, Held, PodDeleted, Rejected, Release, Requeue


def held(uid: str = "p", node: str = "n1", attempt: int = 0, key: str = "", gang_min: int = 0) -> Held:
    return Held(uid=uid, attempt=attempt, node=node, decision_key=key or uid, name=uid, gang_min=gang_min)


def run(records: list, state: LedgerState | None = None, key: str = "p") -> tuple[LedgerState, Decision]:
    state = state or LedgerState(key)
    out = Decision()
    Decider().apply(state, records, out)
    return state, out


def kinds(outputs: list) -> list[str]:
    return [o.record.KIND for o in outputs]


def test_first_held_is_accepted_commit_before_binding() -> None:
    state, out = run([held(node="n1"), held(node="n2", attempt=1)])
    assert kinds(out.first) == ["Commit", "Release"]
    assert kinds(out.after_commit) == ["Binding"]
    assert out.after_commit[0].record.node == "n1"
    assert state.pods["p"].status == BOUND


def test_redelivered_held_resends_the_recorded_decision() -> None:
    state, _ = run([held(node="n1"), held(node="n2", attempt=1)])
    _, out = run([held(node="n1"), held(node="n2", attempt=1)], state)
    assert kinds(out.first) == ["Commit", "Release"] and kinds(out.after_commit) == ["Binding"]
    assert isinstance(out.first[0].record, Commit) and isinstance(out.first[1].record, Release)


def test_rejection_requeues_once_and_never_after_binding() -> None:
    rejected = Rejected(uid="p", attempt=0, node="n1", decision_key="p", reason="Insufficient cpu")
    state, out = run([rejected])
    assert isinstance(out.first[0].record, Requeue) and out.first[0].record.attempt == 1
    _, out = run([rejected], state)  # replay re-sends the same requeue
    assert [o.record.attempt for o in out.first] == [1]
    state, out = run([held(attempt=1), Rejected(uid="p", attempt=0, node="n9", decision_key="p", reason="x")], state)
    assert kinds(out.first) == ["Commit"]  # a stale rejection of a bound pod does nothing


def test_deleted_pending_pod_releases_later_holds_and_bound_pod_is_terminated() -> None:
    state, out = run([PodDeleted(uid="p", decision_key="p"), held()])
    assert state.pods["p"].status == DELETED and kinds(out.first) == ["Release"]
    state, out = run([held(uid="q", key="q")], key="q")
    state, out = run([PodDeleted(uid="q", decision_key="q")], state)
    assert state.pods["q"].status == TERMINATED
    assert kinds(out.first) == ["PodTerminated"] and out.first[0].key == "n1"


def test_gang_commits_all_members_once_min_available_are_held() -> None:
    key = "ns/g"
    state, out = run([held("a", key=key, gang_min=3), held("b", key=key, gang_min=3)], key=key)
    assert out.first == [] and out.after_commit == []
    state, out = run([held("c", key=key, gang_min=3)], state, key=key)
    assert sorted(o.record.uid for o in out.after_commit) == ["a", "b", "c"]
    assert all(isinstance(o.record, Binding) for o in out.after_commit)


def test_ledger_round_trips_through_json() -> None:
    state, _ = run([held(), Rejected(uid="p", attempt=5, node="n", decision_key="p", reason="r")])
    assert LedgerState.from_json(state.to_json()) == state


def test_stale_rejection_announces_the_latest_attempt_again() -> None:
    state, out = run([Rejected(uid="p", attempt=0, node="n1", decision_key="p", reason="full")])
    assert [o.record.attempt for o in out.first] == [1]
    # A restarted scheduler lost count and claims attempt 0 again, elsewhere.
    state, out = run([Rejected(uid="p", attempt=0, node="n2", decision_key="p", reason="full")], state)
    assert [o.record.attempt for o in out.first] == [1]
    state, out = run([Rejected(uid="p", attempt=3, node="n3", decision_key="p", reason="full")], state)
    assert [o.record.attempt for o in out.first] == [4]
    _, out = run([Rejected(uid="p", attempt=0, node="n2", decision_key="p", reason="full")], state)
    assert [o.record.attempt for o in out.first] == [1]  # a replay re-sends what it sent
