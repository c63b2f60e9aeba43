"""Reservations: scheduled like pods, holding capacity only their owners' pods may use; matching
pods consume them first (Aligned, Restricted, allocate-once); expiry and deletion release what
is left; bad reservations get final feedback naming the field. Through the in-process
pipeline (scheduler core, owners, deciders), plus the owners' rules on their own."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.adapters.owners import OwnerCore
from agents.rebalance.migration import pinned
from agents.scheduler.reservation_table import ReservationTable
from agents.state import devices
from agents.state import reservations as rsv
from agents.state.ledger import Decision
from agents.state.owner import NodeOwner, NodeState, OwnerResult
from agents.state.resources import ResourceSpace
from schemas.records import (
    Commit,
    GpuDevice,
    Node,
    NodeStateChange,
    NominationCleared,
    OwnerReference,
    Pod,
    PodDeleted,
    Rejected,
    Reservation,
    ReservationEvent,
    ReservationExpired,
    ReservationOwner,
    ReservationState,
    ResourceList,
    SchedulingFeedback,
)
from streams.publish import read_records, stamped
from tests.builders import GI, make_claim, make_node, make_pod
from tests.pipeline import Cluster

WEB = (ReservationOwner(match_labels={"app": "web"}),)


def reservation(uid: str = "r1", cpu: int = 2000, owners: tuple[ReservationOwner, ...] = WEB, **kw: Any) -> Reservation:
    return Reservation(uid=uid, name=uid, owners=owners, requests=ResourceList(cpu=cpu, memory=GI), **kw)


def web(uid: str, cpu: int = 1000) -> Pod:
    return make_pod(uid, cpu=cpu, labels={"app": "web"})


def phases(cluster: Cluster, uid: str) -> list[str]:
    return [e.phase for e in cluster.events if isinstance(e, ReservationEvent) and e.uid == uid]


def test_reserved_capacity_is_kept_from_others_and_consumed_first_by_its_owners() -> None:
    cluster = Cluster(make_node("n1", cpu=4000), make_node("n2", cpu=4000))
    cluster.core.add_reservation(reservation(cpu=3000))
    cluster.settle()
    x = cluster.bindings["r1"]
    y = "n2" if x == "n1" else "n1"
    assert phases(cluster, "r1") == [rsv.AVAILABLE]
    assert cluster.used(x)["cpu"] == 3000
    for uid in ("o1", "o2", "o3"):  # others: 2000 + 2000 fill y; 1500 fits nowhere (x has 1000 free)
        cluster.core.add(make_pod(uid, cpu=2000 if uid != "o3" else 1500))
        cluster.settle()
    assert cluster.bindings["o1"] == cluster.bindings["o2"] == y and "o3" not in cluster.bindings
    # An owner's pod goes to the reservation (x is fuller than nothing, but the reservation wins),
    # consumes it, and ends it (allocate-once): what it left is the node's again, so o3 fits.
    cluster.core.add(web("w1", cpu=2000))
    cluster.settle()
    assert cluster.bindings["w1"] == x
    assert phases(cluster, "r1") == [rsv.AVAILABLE, rsv.SUCCEEDED]
    assert cluster.bindings["o3"] == x
    assert cluster.used(x)["cpu"] == 3500


def test_matching_pods_prefer_the_reservation_over_an_emptier_node() -> None:
    cluster = Cluster(make_node("n1", cpu=8000), make_node("n2", cpu=8000))
    cluster.core.add_reservation(reservation(cpu=1000, allocate_once=False))
    cluster.settle()
    x = cluster.bindings["r1"]
    cluster.core.add(web("w1", cpu=500))
    cluster.core.add(web("w2", cpu=500))
    cluster.settle()
    assert cluster.bindings["w1"] == cluster.bindings["w2"] == x
    taken, count = cluster.nodes[x].consumption("r1")
    assert taken["cpu"] == 1000 and count == 2
    assert cluster.used(x)["cpu"] == 1000  # the pods, inside the reservation: nothing more


def test_aligned_takes_the_rest_from_the_node_and_restricted_does_not() -> None:
    for policy, expected in (("Aligned", "n1"), ("Restricted", None)):
        cluster = Cluster(make_node("n1", cpu=4000))
        cluster.core.add_reservation(reservation(cpu=2000, allocate_once=False, allocate_policy=policy))
        cluster.settle()
        cluster.core.add(make_pod("o1", cpu=1000))  # the node keeps 1000 of its own free
        cluster.settle()
        cluster.core.add(web("w1", cpu=3000))  # 2000 from the reservation, 1000 from the node
        cluster.settle()
        assert cluster.bindings.get("w1") == expected, policy
        assert cluster.nodes["n1"].consumption("r1")[0].get("cpu", 0) == (2000 if expected else 0)
    # Restricted: a pod that fits inside the reservation still consumes it.
    cluster.core.add(web("w2", cpu=1500))
    cluster.settle()
    assert cluster.bindings["w2"] == "n1"
    assert cluster.nodes["n1"].consumption("r1")[0]["cpu"] == 1500


def test_expiry_releases_what_is_left_and_a_replayed_expiry_re_sends_and_changes_nothing() -> None:
    cluster = Cluster(make_node("n1", cpu=4000))
    cluster.core.add_reservation(reservation(cpu=3000, ttl_s=60.0, creation_timestamp=1000.0))
    cluster.settle()
    assert cluster.expiries == [("n1", "r1", 1060.0)]
    cluster.core.add(make_pod("o1", cpu=2000))
    cluster.settle()
    assert "o1" not in cluster.bindings
    expired = ReservationExpired(uid="r1", node="n1")
    cluster.route(cluster._to_owner("n1", [expired]))  # the owners' agent appends it when due
    cluster.settle()
    assert phases(cluster, "r1") == [rsv.AVAILABLE, rsv.FAILED]
    assert [e.reason for e in cluster.events][-1] == rsv.REASON_EXPIRED
    assert cluster.bindings["o1"] == "n1"
    cluster.route(cluster._to_owner("n1", [expired]))  # replayed: the same event again (rule 1), nothing else
    assert cluster.events[1:] == [cluster.events[1]] * 2 and cluster.used("n1")["cpu"] == 2000


def test_deleting_a_reservation_frees_it_and_its_consumers_keep_their_share() -> None:
    cluster = Cluster(make_node("n1", cpu=4000))
    cluster.core.add_reservation(reservation(cpu=3000, allocate_once=False))
    cluster.settle()
    cluster.core.add(web("w1", cpu=1000))
    cluster.settle()
    assert cluster.used("n1")["cpu"] == 3000
    cluster.route(cluster.core.delete(PodDeleted(uid="r1", name="r1", namespace="")))
    assert cluster.used("n1")["cpu"] == 1000  # w1 stays counted in full
    cluster.core.add(make_pod("o1", cpu=3000))
    cluster.settle()
    assert cluster.bindings["o1"] == "n1"


def test_a_reserved_gpu_share_goes_to_its_owner_not_to_others() -> None:
    alloc = ResourceList(cpu=8000, memory=8 * GI, pods=110)
    alloc[devices.NVIDIA_GPU] = 1
    cluster = Cluster(Node(name="g", allocatable=alloc, capacity=alloc, gpus=(GpuDevice(minor=0),)))
    share = {devices.GPU_CORE: 50, devices.GPU_RATIO: 50}

    def gpu_pod(uid: str, **kw: Any) -> Pod:
        return Pod(uid=uid, name=uid, requests=ResourceList(cpu=1000, **share), **kw)

    cluster.core.add_reservation(Reservation(uid="r1", name="r1", owners=WEB, requests=ResourceList(cpu=1000, **share)))
    cluster.settle()
    cluster.core.add(gpu_pod("first"))
    cluster.settle()  # takes the free half of the GPU
    cluster.core.add(gpu_pod("other"))
    cluster.core.add(gpu_pod("mine", labels={"app": "web"}))
    cluster.settle()
    assert {uid: cluster.bindings.get(uid) for uid in ("first", "other", "mine")} == {
        "first": "g", "other": None, "mine": "g"}  # the reserved half is mine's, device and all


def test_owner_refuses_claims_on_taken_missing_or_too_small_reservations() -> None:
    owner, state = NodeOwner(), NodeState("n1")

    def apply(*records: Any) -> OwnerResult:
        result = OwnerResult()
        owner.apply(state, list(records), result)
        return result

    apply(make_node("n1", cpu=4000))
    r = reservation(cpu=2000, allocate_policy="Restricted")
    apply(make_claim("r1", cpu=2000, reserving=r), Commit(uid="r1", attempt=0, node="n1", decision_key="r1"))
    refused = apply(make_claim("p1", cpu=2500, reservation="r1"), make_claim("p2", cpu=500, reservation="nope"))
    reasons = [o.record.reason for o in refused.outputs if isinstance(o.record, Rejected)]
    assert reasons == ["Insufficient cpu in reservation r1 (Restricted)", "reservation nope is not available on the node"]
    apply(make_claim("p3", cpu=500, reservation="r1"))
    assert state.consumption("r1") == ({"cpu": 500, "pods": 1}, 1)
    again = apply(make_claim("p4", cpu=500, reservation="r1"))  # allocate-once: the first consumer has it
    assert [o.record.reason for o in again.outputs if isinstance(o.record, Rejected)] == [
        "reservation r1 is allocate-once and already taken"]
    assert NodeState.from_json(state.to_json()).reservations == state.reservations


@pytest.mark.parametrize(("owner", "pod", "matches"), [
    (ReservationOwner(object_uid="u1"), make_pod("u1"), True),
    (ReservationOwner(object_name="u1", object_namespace="other"), make_pod("u1"), False),
    (ReservationOwner(controller_uid="rs1"),
     make_pod("u1", owner_references=(OwnerReference(kind="ReplicaSet", name="web", uid="rs1", controller=True),)), True),
    (ReservationOwner(controller_name="web", controller_kind="StatefulSet"),
     make_pod("u1", owner_references=(OwnerReference(kind="ReplicaSet", name="web", uid="rs1", controller=True),)), False),
    (ReservationOwner(match_expressions=({"key": "tier", "operator": "In", "values": ["a", "b"]},)),
     make_pod("u1", labels={"tier": "b"}), True),
    (ReservationOwner(match_expressions=({"key": "tier", "operator": "DoesNotExist"},)),
     make_pod("u1", labels={"tier": "b"}), False),
], ids=["object-uid", "object-namespace", "controller-uid", "controller-kind", "selector-in", "selector-absent"])
def test_owners_match_by_object_controller_or_selector(owner: ReservationOwner, pod: Pod, matches: bool) -> None:
    assert rsv.owner_matches(owner, pod) is matches


@pytest.mark.parametrize(("change", "field"), [
    ({"owners": ()}, "owners"),
    ({"owners": (ReservationOwner(object_uid="a", match_labels={"x": "y"}),)}, "owners[0]"),
    ({"allocate_policy": "Sometimes"}, "allocatePolicy"),
    ({"ttl_s": 10.0, "expires": 5.0}, "ttl"),
    ({"owners": (ReservationOwner(match_expressions=({"key": "a", "operator": "Near"},)),)},
     "owners[0].labelSelector.matchExpressions[0].operator"),
    ({"requests": ResourceList(pods=1)}, "template.spec.containers[*].resources.requests"),
])
def test_a_bad_reservation_gets_final_feedback_naming_the_field(change: dict[str, Any], field: str) -> None:
    cluster = Cluster(make_node("n1"))
    outputs = cluster.core.add_reservation(dataclasses.replace(reservation(), **change))
    [feedback] = [o.record for o in outputs if isinstance(o.record, SchedulingFeedback)]
    assert feedback.final and feedback.message.startswith(field + "=")
    cluster.core.add(make_pod("ok"))  # nothing else stops
    cluster.settle()
    assert cluster.bindings == {"ok": "n1"}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["reservation", "web", "other"]), st.integers(1, 6),
                          st.sampled_from(["", "Aligned", "Restricted"]), st.booleans()), min_size=1, max_size=14))
def test_no_node_is_over_committed_and_no_reservation_over_consumed(steps: list[tuple[str, int, str, bool]]) -> None:
    cluster = Cluster(make_node("n1", cpu=4000), make_node("n2", cpu=3000))
    for i, (what, size, policy, once) in enumerate(steps):
        cpu = size * 500
        if what == "reservation":
            cluster.core.add_reservation(reservation(f"r{i}", cpu=cpu, allocate_policy=policy, allocate_once=once))
        else:
            cluster.core.add(web(f"w{i}", cpu=cpu) if what == "web" else make_pod(f"o{i}", cpu=cpu))
        cluster.step(batch=3)
    cluster.settle()
    for name, node in cluster.nodes.items():
        pods = sum(h.requests.get("cpu", 0) for h in node.holds.values() if h.status in ("held", "committed")
                   and h.reserving is None)
        assert node.used().get("cpu", 0) <= node.allocatable["cpu"], name
        assert pods <= node.allocatable["cpu"], name
        for uid in node.reservations:
            held = node.holds[node.reservations[uid]["hold"]].requests
            assert node.consumption(uid)[0].get("cpu", 0) <= held["cpu"], uid


OWNERS = st.one_of(
    st.sampled_from(["p1", "p2", "p3"]).map(lambda uid: ReservationOwner(object_uid=uid)),
    st.sampled_from(["p1", "web"]).map(lambda name: ReservationOwner(object_name=name)),
    st.sampled_from(["a", "b"]).map(lambda v: ReservationOwner(match_labels={"app": v})),
)


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.lists(OWNERS, min_size=1, max_size=2), max_size=3)),
                max_size=6),
       st.lists(st.tuples(st.sampled_from(["p1", "p2", "p4"]), st.sampled_from(["p1", "web", "x"]),
                          st.sampled_from(["a", "b", "c"])), min_size=1, max_size=4))
def test_the_schedulers_index_of_reservation_owners_matches_as_every_reservation_would(
        reports: list[tuple[int, list[list[ReservationOwner]]]], pods: list[tuple[str, str, str]]) -> None:
    """`ReservationTable.matches_any` (owners indexed by object uid, rebuilt after each report)
    answers as `rsv.matches` tried on every available reservation."""
    table = ReservationTable(ResourceSpace())
    for step, (row, owner_lists) in enumerate(reports):
        table.report(row, [ReservationState(Reservation(uid=f"r{step}-{i}", name="r", owners=tuple(owners),
                                                        requests=ResourceList(cpu=100)))
                           for i, owners in enumerate(owner_lists)])
        for uid, name, app in pods:
            pod = Pod(uid=uid, name=name, labels={"app": app})
            expected = any(rsv.matches(a.reservation, pod) for entries in table.by_row.values() for a in entries)
            assert table.matches_any(pod) == expected


def test_a_search_of_a_share_of_the_nodes_keeps_the_nodes_of_the_pods_reservations() -> None:
    """kube-scheduler's adaptive search scores about half of 300 nodes from a rotating start;
    a pod that owns a reservation on a node outside that share still goes to it (else the
    reservation stays unused until it expires: a rebalancer's move would wait for its ttl)."""
    cluster = Cluster(*[make_node(f"n{i:03d}", cpu=4000) for i in range(300)])
    for i in range(3):
        cluster.core.add_reservation(reservation(uid=f"r{i}", cpu=1000, affinity=pinned(f"n{299 - i}")))
        cluster.settle()
        assert cluster.bindings[f"r{i}"] == f"n{299 - i}"
        cluster.core.add(web(f"w{i}"))
        cluster.settle()
        assert cluster.bindings[f"w{i}"] == f"n{299 - i}" and phases(cluster, f"r{i}")[-1] == rsv.SUCCEEDED


# -- expiry counts from when the reservation was first seen -----------------------------------

T0 = 1_700_000_000.0  # log times of a real cluster: a ttl counted from 0 ended in 1970


def timed_owner(state: NodeState) -> Any:
    owner = NodeOwner()

    def apply(t: float, *records: Any) -> OwnerResult:
        result = OwnerResult()
        owner.apply(state, list(records), result, [t] * len(records), t)
        return result
    return apply


def test_a_reservation_without_a_creation_time_expires_a_ttl_after_its_owner_first_read_it() -> None:
    """A user's manifest has no metadata.creationTimestamp (creation time 0): its 1 h ttl was
    counted from 0, so it had expired in 1970 and its timer fired at once. Its ttl counts from
    the log time of the claim that first brought it to its owner, recorded with the hold: a
    redelivered claim or Commit, and a restored table (the owners' agent re-arms from it), ask
    for the same expiry."""
    state = NodeState("n1")
    apply = timed_owner(state)
    apply(T0 - 100, make_node("n1"))
    unstamped = reservation(cpu=1000, ttl_s=3600.0)
    apply(T0, make_claim("r1", cpu=1000, reserving=unstamped))
    apply(T0 + 30, make_claim("r1", cpu=1000, reserving=unstamped))  # redelivered: first read at T0
    first = apply(T0 + 40, Commit(uid="r1", attempt=0, node="n1", decision_key="r1"))
    assert first.timers == [("n1", "r1", T0 + 3600)]
    assert apply(T0 + 900, Commit(uid="r1", attempt=0, node="n1", decision_key="r1")).timers == first.timers
    restored = NodeState.from_json(state.to_json())
    assert restored.expires_at("r1") == T0 + 3600
    [timer] = OwnerCore(clock=lambda: T0 + 1000).timers("n1", state.to_json())
    assert timer.delay_s == 2600 and timer.output.record == ReservationExpired(uid="r1", node="n1")
    # A creation time, when there is one, is the reservation's own: its ttl counts from it.
    stamped_r2 = reservation("r2", cpu=1000, ttl_s=3600.0, creation_timestamp=T0 - 500)
    apply(T0 + 50, make_claim("r2", cpu=1000, reserving=stamped_r2))
    assert apply(T0 + 60, Commit(uid="r2", attempt=0, node="n1", decision_key="r2")).timers == [
        ("n1", "r2", T0 + 3100)]


def test_publish_stamps_reservations_without_a_creation_time_when_it_reads_them(tmp_path: Path) -> None:
    """`koordstream publish` is where a user's manifest enters, as kubectl's does at the API
    server: a Reservation without metadata.creationTimestamp is stamped with the time the file
    was read there; one with a creation time keeps it."""
    path = tmp_path / "r.yaml"
    path.write_text(RESERVATION_MANIFEST + "---\n" + RESERVATION_MANIFEST.replace(
        "name: mine", "name: theirs\n  creationTimestamp: '2024-01-01T00:00:00Z'"))
    mine, theirs = stamped(read_records(path), now=T0)
    assert isinstance(mine, Reservation) and mine.creation_timestamp == T0 and mine.expires_at == T0 + 3600
    assert isinstance(theirs, Reservation) and theirs.creation_timestamp == 1704067200.0


RESERVATION_MANIFEST = """\
apiVersion: scheduling.koordinator.sh/v1alpha1
kind: Reservation
metadata:
  name: mine
spec:
  ttl: 1h
  owners: [{object: {name: web-0, namespace: default}}]
  template:
    spec:
      containers: [{name: c, resources: {requests: {cpu: "1"}}}]
"""


# -- an ended reservation leaves every table ----------------------------------------------------

RETENTION = 600.0  # the default retention: what finished is forgotten a retention later


def forget_all(cluster: Cluster) -> None:
    """A retention later: a record of every node (owners forget in their nodes' batches) and
    each decision key swept (the deciders' loop applies a key with something to forget)."""
    cluster.now += RETENTION + 1
    for name in list(cluster.nodes):
        cluster.route(cluster._to_owner(name, [NominationCleared(uid="nobody", node=name)]))
    for key, ledger in list(cluster.ledgers.items()):
        cluster.decider.apply(ledger, [], Decision(), [], cluster.now)
        if cluster.decider.empty(ledger):
            del cluster.ledgers[key]


def test_consumed_reservations_leave_the_owner_the_ledgers_and_the_replica_like_finished_pods() -> None:
    """20 moves onto a node (a reservation each, consumed by the pod it was made for) left 40
    holds in the node's report, 40 ledger keys and 40 uids bound in the replica: the consumed
    reservations' were kept for ever. Now the owner folds a consumed reservation away (its hold
    terminated: it counted nothing since it ended, so nothing is freed twice) and deletes it
    from `pods`; the scheduler forgets it and forwards the deletion; a retention later only
    the 20 pods are left anywhere."""
    cluster = Cluster(make_node("n1", cpu=64_000, memory=640 * GI), timed=True)
    cluster.now = T0
    for i in range(20):
        cluster.core.add_reservation(reservation(f"r{i}", cpu=1000, owners=(ReservationOwner(object_uid=f"p{i}"),)))
        cluster.settle()
        cluster.core.add(make_pod(f"p{i}", cpu=1000))
        cluster.settle()
        assert phases(cluster, f"r{i}") == [rsv.AVAILABLE, rsv.SUCCEEDED] and cluster.bindings[f"p{i}"] == "n1"
    node = cluster.nodes["n1"]
    assert cluster.used("n1")["cpu"] == 20_000  # the pods in full; the reservations nothing
    forget_all(cluster)
    assert len(NodeOwner.current(node).holds) == 20 and node.reservations == {} and node.tombstones == {}
    assert cluster.used("n1")["cpu"] == 20_000
    assert sorted(cluster.ledgers) == sorted(f"p{i}" for i in range(20))
    sizes = cluster.core.map_sizes()
    assert sizes["bound"] == sizes["decision_keys"] == 20 and sizes["pods"] == 0
    assert cluster.core.state.reservations.by_row == {} and cluster.core.state.reservations._consumed == {}


@pytest.mark.parametrize("end", ["expired", "deleted"])
def test_a_reservation_that_expires_or_is_deleted_leaves_every_table(end: str) -> None:
    cluster = Cluster(make_node("n1", cpu=4000), timed=True)
    cluster.now = T0
    cluster.core.add_reservation(reservation(cpu=3000, ttl_s=60.0, allocate_once=False))
    cluster.settle()
    cluster.core.add(web("w1", cpu=1000))
    cluster.settle()
    assert cluster.bindings == {"r1": "n1", "w1": "n1"} and cluster.used("n1")["cpu"] == 3000
    if end == "expired":
        cluster.now = T0 + 60
        cluster.route(cluster._to_owner("n1", [ReservationExpired(uid="r1", node="n1")]))
        assert phases(cluster, "r1") == [rsv.AVAILABLE, rsv.FAILED]
    else:
        cluster.route(cluster.core.delete(PodDeleted(uid="r1", name="r1", namespace="")))
    assert cluster.used("n1")["cpu"] == 1000  # w1 in full, once
    forget_all(cluster)
    node = cluster.nodes["n1"]
    assert [h.uid for h in node.holds.values()] == ["w1"] and node.reservations == {} and node.tombstones == {}
    assert sorted(cluster.ledgers) == ["w1"]
    assert cluster.core.map_sizes()["bound"] == 1


def test_the_input_that_ended_a_reservation_re_sends_its_end_and_deletion_when_redelivered() -> None:
    """Replay re-sends (rule 1): the consumer's Commit, and an expiry, come again with the
    reservation's end event, its deletion, and its hold reported terminated; nothing changes.
    A late claim of the ended reservation is refused on its node."""
    state = NodeState("n1")
    apply = timed_owner(state)
    apply(T0, make_node("n1"))
    apply(T0, make_claim("r1", cpu=2000, reserving=reservation(cpu=2000)),
          make_claim("r2", cpu=500, reserving=reservation("r2", cpu=500)),
          Commit(uid="r1", attempt=0, node="n1", decision_key="r1"),
          Commit(uid="r2", attempt=0, node="n1", decision_key="r2"))
    apply(T0 + 1, make_claim("w1", cpu=1500, reservation="r1"))

    def ends(result: OwnerResult) -> list[Any]:
        return [(o.topic, o.record) for o in result.outputs if isinstance(o.record, (ReservationEvent, PodDeleted))]

    for redelivery in range(2):
        consumed = apply(T0 + 2 + redelivery, Commit(uid="w1", attempt=0, node="n1", decision_key="w1"))
        [(_, event), (topic, deleted)] = ends(consumed)
        assert event.phase == rsv.SUCCEEDED and topic == "pods"
        assert deleted == PodDeleted(uid="r1", name="r1", namespace="", decision_key="r1")
        [report] = [o.record for o in consumed.outputs if isinstance(o.record, NodeStateChange)]
        assert report.holds == {"w1/0/n1": "committed", "r1/0/n1": "terminated"}
        assert state.used()["cpu"] == 1500 + 500
    for redelivery in range(2):
        expired = apply(T0 + 10 + redelivery, ReservationExpired(uid="r2", node="n1"))
        [(_, event), (topic, deleted)] = ends(expired)
        assert event.reason == rsv.REASON_EXPIRED and topic == "pods" and deleted.uid == "r2"
        assert state.used()["cpu"] == 1500
    late = apply(T0 + 20, make_claim("r1", attempt=1, cpu=2000, reserving=reservation(cpu=2000)))
    assert [o.record.reason for o in late.outputs if isinstance(o.record, Rejected)] == ["pod already terminated"]
