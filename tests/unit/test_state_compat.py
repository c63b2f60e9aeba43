"""Tables written by the code before the replay-safety work are read and served.

`data/states-22e8b29.json` holds what commit 22e8b29 (the last one before the owners and
deciders recorded their outcomes) wrote to the two changelogs, with the inputs that made it: a
node with a running pod, a waiting gang member, a terminated pod and a rejected claim; the
deciders' ledgers of the bound pod, the gang and the requeued pod. It was made by driving that
commit's `NodeOwner` and `Decider` with those inputs and `to_json`. The stored format is the same
(the new fields have defaults), so an upgraded worker restores such a table and goes on: the
inputs after the last committed offset are replayed against it (answered from what the old
state recorded, rebuilt as the old code built them where it kept no record), and new inputs are
served. README.md ("Upgrading") says what such a replay cannot re-send.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.state.ledger import Decider, Decision, LedgerState
from agents.state.owner import COMMITTED, NodeOwner, NodeState, OwnerResult
from schemas import topics
from schemas.codec import decode_object
from schemas.records import Binding, Commit, Held, NodeStateChange, Record, Rejected, Requeue
from tests.builders import make_claim

OLD = json.loads((Path(__file__).parent / "data" / "states-22e8b29.json").read_text())


def records(raw: list[dict[str, Any]]) -> list[Record]:
    return [decode_object(r) for r in raw]


def owner_state() -> NodeState:
    return NodeState.from_json(OLD["owner"]["n1"]["state"])


def ledger(key: str) -> LedgerState:
    return LedgerState.from_json(OLD["deciders"][key]["state"])


def test_the_fixture_was_written_by_the_old_code() -> None:
    assert OLD["written_by"].startswith("22e8b29")
    assert "accepted" not in OLD["deciders"]["a"]["state"]  # the old ledger kept no acceptance record


def test_an_old_node_state_answers_replayed_claims_with_what_it_recorded() -> None:
    state = owner_state()
    result = OwnerResult()
    NodeOwner().apply(state, records(OLD["owner_inputs"]), result)
    assert not result.problems
    answers = {o.record.uid: type(o.record) for o in result.outputs if isinstance(o.record, (Held, Rejected))}
    assert answers == {"a": Held, "g1": Held, "t": Held, "r": Rejected}
    report = next(o.record for o in result.outputs if isinstance(o.record, NodeStateChange))
    assert report.used["cpu"] == 1000  # a (committed) and g1 (held); t terminated, r rejected
    assert [p.uid for p in report.committed] == ["a"]
    assert state.to_json()["holds"] == OLD["owner"]["n1"]["state"]["holds"]  # the replay changed nothing


def test_an_old_node_state_serves_new_claims() -> None:
    state = owner_state()
    result = OwnerResult()
    NodeOwner().apply(state, [make_claim("g2", cpu=500, key="g", gang_min=2), Commit("g1", 0, "n1", "g"),
                              Commit("g2", 0, "n1", "g"), make_claim("t", attempt=1, cpu=500)], result)
    assert not result.problems
    assert state.holds["g1/0/n1"].status == COMMITTED and state.holds["g2/0/n1"].status == COMMITTED
    assert state.used()["cpu"] == 1500
    rejected = [o.record for o in result.outputs if isinstance(o.record, Rejected)]
    assert [r.uid for r in rejected] == ["t"]  # the old tombstone still refuses the terminated pod


@pytest.mark.parametrize(("key", "first", "after"), [
    ("a", [Commit], [Binding]),  # accepted by the old code: rebuilt from the Held, as it did
    ("g", [], []),  # still waiting: the replay causes nothing
    ("r", [Requeue], []),  # the recorded requeue, re-sent
])
def test_an_old_ledger_re_sends_its_recorded_decisions(key: str, first: list[type], after: list[type]) -> None:
    state = ledger(key)
    decision = Decision()
    Decider().apply(state, records(OLD["decider_inputs"][key]), decision)
    assert not decision.problems
    assert [type(o.record) for o in decision.first] == first
    assert [type(o.record) for o in decision.after_commit] == after


def test_an_old_waiting_gang_completes_with_a_new_member() -> None:
    state = ledger("g")
    decision = Decision()
    Decider().apply(state, [Held(uid="g2", attempt=0, node="n1", decision_key="g", name="g2",
                                 namespace="default", gang_min=2)], decision)
    assert not decision.problems
    commits = sorted(o.record.uid for o in decision.first if isinstance(o.record, Commit))
    bindings = sorted(o.record.uid for o in decision.after_commit if isinstance(o.record, Binding))
    assert commits == bindings == ["g1", "g2"]
    assert all(o.topic == topics.NODE_INBOX for o in decision.first if isinstance(o.record, Commit))
    # A redelivery of either member now re-sends the whole gang's acceptance.
    again = Decision()
    Decider().apply(state, [Held(uid="g1", attempt=0, node="n1", decision_key="g", name="g1",
                                 namespace="default", gang_min=2)], again)
    assert sorted(o.record.uid for o in again.after_commit if isinstance(o.record, Binding)) == ["g1", "g2"]



def test_an_old_node_state_restores_through_the_split_changelog_as_from_json_reads_it() -> None:
    """The old code wrote a node whole, its tombstones a list of uids: a restore of that record
    through the owners' split changelog gives the node `from_json` gives."""
    from agents.adapters.owners import OwnerCore
    from agents.adapters.tables import ChangelogImage

    image = ChangelogImage("node-state", OwnerCore.split)
    image.apply([(b"n1", OLD["owner"]["n1"], 0)])
    restored = NodeState.from_json(image.data[b"n1"]["state"])
    assert isinstance(OLD["owner"]["n1"]["state"]["tombstones"], list)
    assert restored.to_json() == owner_state().to_json()
