"""The decider: accept once, release the rest, requeue rejections, close deletions."""

from dataclasses import replace

from agents.state.ledger import BOUND, DELETED, TERMINATED, Decider, Decision, LedgerState
from schemas import topics
from schemas.codec import encode
from schemas.records import (
    Binding,
    Commit,
    Held,
    NominationCleared,
    PodDeleted,
    PodTerminated,
    Rejected,
    Release,
    Requeue,
)


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


# -- replay safety: a redelivered input re-sends its recorded outputs, built from the record --


def sent(out: Decision) -> tuple[list[tuple[str, str, bytes]], list[tuple[str, str, bytes]]]:
    """A decision's outputs as they go on the wire (topic, key, encoded record)."""
    return ([(o.topic, o.key, encode(o.record)) for o in out.first],
            [(o.topic, o.key, encode(o.record)) for o in out.after_commit])


def test_a_redelivered_held_with_changed_fields_resends_byte_identical_outputs() -> None:
    first = Held(uid="p", attempt=0, node="n1", decision_key="p", namespace="ns", name="p",
                 nominated_node="n7", devices=("gpu/0/100/100",))
    state, out = run([first])
    binding = out.after_commit[0].record
    assert isinstance(binding, Binding) and binding.annotations  # the GPU it claimed is on the Binding
    changed = replace(first, namespace="other", name="q", nominated_node="n9", devices=("gpu/1/50/50",),
                      decision_key="elsewhere")
    _, again = run([changed], state)
    assert sent(again) == sent(out)


def test_a_redelivered_released_held_resends_the_same_release() -> None:
    state, _ = run([held(node="n1")])
    _, out = run([held(node="n2", attempt=1)], state)
    assert kinds(out.first) == ["Release"]
    _, again = run([replace(held(node="n2", attempt=1), decision_key="elsewhere")], state)
    assert sent(again) == sent(out)


def test_a_redelivered_rejection_resends_the_recorded_requeue() -> None:
    rejected = Rejected(uid="p", attempt=0, node="n1", decision_key="p", reason="Insufficient cpu")
    state, out = run([rejected])
    _, again = run([replace(rejected, reason="something else")], state)
    assert sent(again) == sent(out)


def test_a_replayed_deletion_resends_the_termination_it_sent() -> None:
    state, _ = run([held(node="n1")])
    deleted = PodDeleted(uid="p", decision_key="p")
    state, out = run([deleted], state)
    assert kinds(out.first) == ["PodTerminated"]
    _, again = run([deleted], state)
    assert sent(again) == sent(out)


def test_a_termination_of_a_pod_the_ledger_does_not_know_is_final() -> None:
    # Only a pod that was bound can be terminated: a later claim of it must not bind it again.
    state, _ = run([PodTerminated(uid="p", node="n1", decision_key="p", reason="node deleted")])
    _, out = run([held(node="n2")], state)
    assert kinds(out.first) == ["Release"] and out.after_commit == []
    assert state.pods["p"].status == TERMINATED


def test_a_soft_rejection_of_a_bound_pod_clears_the_nomination_it_caused() -> None:
    state, _ = run([held(node="n1")])
    soft = Rejected(uid="p", attempt=0, node="n2", decision_key="p", reason="wound-wait", soft=True)
    state, out = run([soft], state)
    assert [(o.topic, o.key, o.record) for o in out.first] == [
        (topics.NODE_INBOX, "n2", NominationCleared(uid="p", node="n2"))]
    _, again = run([soft], state)
    assert sent(again) == sent(out)


def test_state_written_before_replay_records_reads_back_with_defaults() -> None:
    legacy = {"key": "p", "pods": {"p": {"status": "bound", "node": "n1", "attempt": 0, "namespace": "default",
                                         "name": "p"}},
              "decisions": {"p/0/n1": "accepted"}, "waiting": {}}
    state = LedgerState.from_json(legacy)
    assert state.pods["p"].nominated == [] and state.accepted == {} and state.sent == {}
    _, out = run([held(node="n1")], state)  # no record of the outputs: rebuilt as before
    assert kinds(out.first) == ["Commit"] and kinds(out.after_commit) == ["Binding"]
    assert LedgerState.from_json(state.to_json()) == state
