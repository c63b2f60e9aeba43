"""A scheduler replica that starts from the owners' changelog (`owners.current_reports`: one
report per node as it is now) sees the cluster as a replica that read every report since the
beginning: the same nodes, capacity used, bound pods, nominations and device use."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.adapters.owners import OwnerCore, current_reports
from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.state.owner import NodeOwner, NodeState, OwnerResult
from agents.state.resources import ResourceSpace
from schemas.records import (
    Claim,
    Commit,
    Node,
    NodeDeleted,
    NodeStateChange,
    Nomination,
    PodTerminated,
    Record,
    Release,
    ResourceList,
)
from tests.builders import make_claim, make_node
from tests.unit.test_scheduler_core import FakeClock
from tests.unit.test_split_tables import PARTITION, table, write

NODES = ("n1", "n2")


def replica() -> SchedulerCore:
    space = ResourceSpace()
    return SchedulerCore(space, ClusterState(space, capacity=2), FakeClock())


def view(core: SchedulerCore, moot: set[str]) -> dict[str, Any]:
    """What a replica knows of the nodes, by name (leaving out the nominations of `moot` pods):
    what it counts on each is what the owners reported plus what it assumes and they have not
    reported yet (a plain hold is reported with the node's next batch)."""
    s = core.state
    rows = {name: s.index[name] for name in s.names}
    return {
        "nodes": {name: (bool(s.present[r]), bool(s.unschedulable[r]), s.allocatable[r].tolist(),
                         s.requested[r].tolist()) for name, r in rows.items()},
        "bound": {uid: (s.names[p.row], p.vector.tolist()) for uid, p in s.bound.items()},
        # A pod bound on one node may still be nominated on another until its decider's
        # NominationCleared reaches that owner; a replica clears it at the commit report, and a
        # later report of the other node brings it back, so such a pod's nomination depends on
        # the order the reports are read in (moot either way: the pod is or was bound; a replica
        # started from the changelog knows more of them, see `current.bound` below).
        "nominated": sorted(u for u in s.nominator.nominated_uids() if u not in s.bound and u not in moot),
    }


op = st.one_of(
    st.tuples(st.just("claim"), st.sampled_from(NODES), st.integers(0, 5), st.sampled_from([500, 1500, 3000])),
    st.tuples(st.just("commit"), st.sampled_from(NODES), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("release"), st.sampled_from(NODES), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("terminate"), st.sampled_from(NODES), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("nominate"), st.sampled_from(NODES), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("resize"), st.sampled_from(NODES), st.just(0), st.sampled_from([2000, 4000, 8000])),
    st.tuples(st.just("delete"), st.sampled_from(NODES), st.just(0), st.just(0)),
)


def record(kind: str, node: str, pod: int, amount: int) -> Record:
    uid = f"p{pod}"
    if kind == "claim":
        return make_claim(uid, node, cpu=amount)
    if kind == "commit":
        return Commit(uid=uid, attempt=0, node=node, decision_key=uid)
    if kind == "release":
        return Release(uid=uid, attempt=0, node=node, decision_key=uid)
    if kind == "terminate":
        return PodTerminated(uid=uid, node=node)
    if kind == "nominate":
        return Nomination(uid=uid, node=node, priority=pod, requests=ResourceList(cpu=500))
    if kind == "resize":
        return make_node(node, cpu=amount)
    return NodeDeleted(name=node)


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.lists(op, min_size=1, max_size=4), min_size=1, max_size=10))
def test_a_replica_started_from_the_changelog_sees_what_one_that_read_every_report_sees(
        batches: list[list[tuple[str, str, int, int]]]) -> None:
    owner = NodeOwner()
    states = {name: NodeState(name) for name in NODES}
    reports: list[NodeStateChange | Claim] = []  # and the claims, which the replica that sent them assumes
    t, _ = table()
    t.table.image.split = OwnerCore.split
    log = []
    for batch in [[("resize", n, 0, 4000) for n in NODES]] + batches:
        for name in NODES:
            records = [record(*o) for o in batch if o[1] == name]
            if not records:
                continue
            result = OwnerResult()
            owner.apply(states[name], records, result)
            reports += [r for r in records if isinstance(r, Claim)]
            reports += [o.record for o in result.outputs if isinstance(o.record, NodeStateChange)]
            t.put(name, states[name].to_json(), PARTITION, epoch=1)
        log += [(k, None if v is None else orjson.loads(v), PARTITION) for k, v in write(t)]
        t.settle(PARTITION, durable=True)

    history = replica()
    for read in reports:
        if isinstance(read, Claim):
            history.state.assume(read.hold_id, history.state.index[read.node], history.space.pod_request(read.requests))
        else:
            history.apply_state_changes([read])
    current = replica()
    reports_now, _ = current_reports(log)
    current.apply_state_changes(reports_now, current=True)
    assert view(current, current.bound) == view(history, current.bound)
    assert history.bound <= current.bound  # and pods terminated at once on their commit, which no report says committed
    assert np.array_equal(current.state.gpus.core_used[:2], history.state.gpus.core_used[:2])


def test_a_node_is_reported_with_its_record_and_every_hold_it_keeps() -> None:
    state = NodeState("n1")
    NodeOwner().apply(state, [make_node("n1"), make_claim("a", "n1"), make_claim("b", "n1")], OwnerResult())
    NodeOwner().apply(state, [Commit(uid="a", attempt=0, node="n1", decision_key="a"),
                              Release(uid="b", attempt=0, node="n1", decision_key="b")], OwnerResult())
    [report], epochs = current_reports([(b"n1", {"epoch": 1, "seq": 1, "state": state.to_json()}, 0),
                                (b"\x00clock/0", {"epoch": 1, "seq": 2, "state": {"now": 5.0}}, 0)])
    assert isinstance(report.node_record, Node) and report.node == "n1"
    assert report.holds == {"a/0/n1": "committed", "b/0/n1": "released"}
    assert [p.uid for p in report.committed] == ["a"] and epochs == {0: 1}
