"""The node owner's hold state machine, table-driven."""

import pytest

from agents.state.owner import (
    COMMITTED,
    HELD,
    REASON_NODE_NOT_FOUND,
    REASON_POD_TERMINATED,
    RELEASED,
    TERMINATED,
    NodeOwner,
    NodeState,
    OwnerResult,
)
from schemas.records import (
    Commit,
    Held,
    NodeDeleted,
    NodeStateChange,
    Nomination,
    NominationCleared,
    PodTerminated,
    Rejected,
    Release,
    ResourceList,
)
from tests.builders import make_claim, make_node


def run(records: list, state: NodeState | None = None) -> tuple[NodeState, OwnerResult]:
    state = state or NodeState("n1")
    result = OwnerResult()
    NodeOwner().apply(state, records, result)
    return state, result


def answers(result: OwnerResult) -> list:
    return [o.record for o in result.outputs if isinstance(o.record, (Held, Rejected))]


NODE = make_node("n1", cpu=1000)


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([NODE, make_claim("a", cpu=600)], ["Held"]),
        ([NODE, make_claim("a", cpu=600), make_claim("b", cpu=600)], ["Held", "Rejected"]),
        ([make_claim("a")], ["Rejected"]),  # node never seen: a normal rejection
        ([NODE, NodeDeleted("n1"), make_claim("a")], ["Rejected"]),
        ([NODE, make_claim("a", cpu=600), make_claim("a", cpu=600)], ["Held", "Held"]),  # redelivery
        ([NODE, make_claim("a", cpu=600), Release("a", 0, "n1", "a"), make_claim("b", cpu=600)], ["Held", "Held"]),
        ([NODE, Nomination("x", "n1", 100, ResourceList(cpu=600)), make_claim("a", cpu=600)], ["Rejected"]),
        ([NODE, Nomination("x", "n1", 100, ResourceList(cpu=600)), make_claim("a", cpu=600, priority=100)], ["Rejected"]),
        ([NODE, Nomination("x", "n1", 100, ResourceList(cpu=600)), make_claim("a", cpu=600, priority=101)], ["Held"]),
        ([NODE, Nomination("a", "n1", 100, ResourceList(cpu=600)), make_claim("a", cpu=600)], ["Held"]),  # own
        ([NODE, Nomination("x", "n1", 100, ResourceList(cpu=600)), NominationCleared("x", "n1"),
          make_claim("a", cpu=600)], ["Held"]),
        ([NODE, PodTerminated("a", "n1"), make_claim("a")], ["Rejected"]),  # tombstone
    ],
    ids=["fits", "second-does-not-fit", "unknown-node", "deleted-node", "redelivered-claim",
         "released-capacity-reused", "higher-nomination-blocks", "equal-nomination-blocks",
         "lower-nomination-ignored", "own-nomination", "cleared-nomination", "terminated-pod"],
)
def test_claim_outcomes(records: list, expected: list[str]) -> None:
    _, result = run(records)
    assert [a.KIND for a in answers(result)] == expected


def test_commit_release_and_termination_follow_the_state_machine() -> None:
    state, _ = run([NODE, make_claim("a", cpu=600)])
    hid = "a/0/n1"
    assert state.holds[hid].status == HELD
    run([Commit("a", 0, "n1", "a")], state)
    assert state.holds[hid].status == COMMITTED
    run([Release("a", 0, "n1", "a")], state)  # a Release never undoes a commit
    assert state.holds[hid].status == COMMITTED
    _, result = run([PodTerminated("a", "n1")], state)
    assert state.holds[hid].status == TERMINATED and state.used().get("cpu", 0) == 0
    change = [o.record for o in result.outputs if isinstance(o.record, NodeStateChange)][0]
    assert change.holds == {hid: TERMINATED}
    _, result = run([make_claim("a", cpu=600)], state)  # redelivered: the recorded answer
    assert [a.KIND for a in answers(result)] == ["Held"] and state.holds[hid].status == TERMINATED


def test_commit_of_a_hold_not_held_is_a_problem() -> None:
    state, _ = run([NODE, make_claim("a", cpu=600), Release("a", 0, "n1", "a")])
    assert state.holds["a/0/n1"].status == RELEASED
    _, result = run([Commit("a", 0, "n1", "a"), Commit("zz", 0, "n1", "zz")], state)
    assert [p.value for p in result.problems] == ["a/0/n1", "zz/0/n1"]
    assert state.holds["a/0/n1"].status == RELEASED


def test_node_delete_terminates_committed_pods_and_keeps_open_holds() -> None:
    state, _ = run([NODE, make_claim("a", cpu=300), make_claim("b", cpu=300), Commit("a", 0, "n1", "a")])
    _, result = run([NodeDeleted("n1")], state)
    terminated = [o for o in result.outputs if isinstance(o.record, PodTerminated)]
    assert [(o.topic, o.record.uid) for o in terminated] == [("holds", "a")]
    assert state.holds["b/0/n1"].status == HELD  # its decider decides it
    _, result = run([make_claim("c", cpu=1)], state)
    assert answers(result)[0].reason == REASON_NODE_NOT_FOUND


def test_state_round_trips_through_json() -> None:
    state, _ = run([NODE, make_claim("a", cpu=300), PodTerminated("z", "n1"),
                    Nomination("x", "n1", 5, ResourceList(cpu=1))])
    assert NodeState.from_json(state.to_json()) == state
    assert REASON_POD_TERMINATED


def test_the_written_state_follows_every_change_of_a_hold() -> None:
    """Holds keep their JSON between writes; each state written must still be the state."""
    state, _ = run([NODE, make_claim("a", cpu=300)])
    written = [state.to_json()]
    for record in (Commit("a", 0, "n1", "a"), PodTerminated("a", "n1")):
        run([record], state)
        written.append(state.to_json())
        assert NodeState.from_json(written[-1]) == state
    assert [w["holds"]["a/0/n1"]["status"] for w in written] == [HELD, COMMITTED, TERMINATED]
    assert "devices" not in written[0]["holds"]["a/0/n1"]  # defaults are left out


def test_state_changes_carry_the_node_record_when_it_changed_and_every_nomination() -> None:
    state, result = run([make_node("n1", labels={"zone": "a"}), Nomination("x", "n1", 7, ResourceList(cpu=100))])
    [change] = [o.record for o in result.outputs if isinstance(o.record, NodeStateChange)]
    assert change.node_record is not None and change.node_record.labels == {"zone": "a"}
    assert [n.uid for n in change.nominations] == ["x"]
    _, result = run([make_claim("a", cpu=10**9)], state)  # refused: reported
    [change] = [o.record for o in result.outputs if isinstance(o.record, NodeStateChange)]
    assert change.node_record is None and [n.priority for n in change.nominations] == [7]


def test_a_batch_that_only_made_plain_holds_sends_no_report_and_the_next_report_names_them() -> None:
    def reports(result: OwnerResult) -> list[NodeStateChange]:
        return [o.record for o in result.outputs if isinstance(o.record, NodeStateChange)]

    state, _ = run([NODE])
    _, result = run([make_claim("a", cpu=10), make_claim("b", cpu=10)], state)
    assert reports(result) == [] and state.holds["a/0/n1"].status == HELD  # the claimer assumes them already
    _, result = run([make_claim("c", cpu=10**9)], state)  # refused: reported, with the holds not yet reported
    [change] = reports(result)
    assert list(change.holds.items()) == [("a/0/n1", HELD), ("b/0/n1", HELD), ("c/0/n1", "rejected")]
    assert change.used["cpu"] == 20
    _, result = run([Commit("a", 0, "n1", "a")], state)
    assert list(reports(result)[0].holds) == ["a/0/n1"]  # named once
    _, result = run([make_claim("b", cpu=10)], state)  # redelivered: answered from the record, and reported
    assert list(reports(result)[0].holds) == ["b/0/n1"]
    for special in (make_claim("g", cpu=10, gang_min=2), make_claim("n", cpu=10, nominated_node="n1"),
                    make_claim("d", cpu=10, devices=("gpu/0/50/50",)), make_claim("q", cpu=10, quota="team")):
        _, result = run([special], state)
        assert len(reports(result)) == 1, special  # a gang's holds, a nomination, devices, a quota: at once
    _, result = run([make_claim("e", cpu=10), Commit("a", 0, "n1", "a")], state)  # with anything else: reported
    assert list(reports(result)[0].holds) == ["e/0/n1", "a/0/n1"]


def test_a_claims_fields_travel_to_its_held_and_binding_by_name() -> None:
    """`carry`: what the Claim says reaches the owner's hold, the Held and the Binding without
    a copy per field (adding a field under the same name on each record is enough)."""
    from agents.state.ledger import Decider, Decision, LedgerState
    from schemas.records import Binding, GpuDevice, Held, carry

    claim = make_claim("p1", "n1", nominated_node="n9", namespace="ns", name="web-1", gang_waiting_s=7.0,
                       gang_strict=False, scheduled_at=3.5, devices=("gpu/0/100/100",))
    owner, state, result = NodeOwner(), NodeState("n1"), OwnerResult()
    gpu = make_node("n1", gpus=(GpuDevice(minor=0, model="A100", memory=2**30),))
    owner.apply(state, [gpu, claim], result)
    held = next(o.record for o in result.outputs if isinstance(o.record, Held))
    assert held == carry(Held, claim)  # every Held field the claim has, as the claim said it
    decision = Decision()
    Decider().apply(LedgerState("p1"), [held], decision)
    binding = next(o.record for o in decision.after_commit if isinstance(o.record, Binding))
    assert (binding.namespace, binding.name, binding.node) == ("ns", "web-1", "n1")
    assert "gpu" in binding.annotations["scheduling.koordinator.sh/device-allocated"]
