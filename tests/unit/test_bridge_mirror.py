"""The bridge's mirror, pure: API objects in, records out. Which pods are koordstream's, what
a foreign pod takes from its node, terminal phases, deletions (also implied by a relist),
PodGroups as gang annotations, ReplicaSet scale-downs, budgets, Reservations, unchanged
objects publishing nothing, and bad objects dead-lettered with their field."""

from __future__ import annotations

from typing import Any

import pytest

from agents.ports import Output
from schemas import topics
from schemas.records import (
    GANG_MIN_AVAILABLE_ANNOTATION,
    GANG_WAITING_TIME_ANNOTATION,
    POD_GROUP_LABEL,
    DeadLetter,
    Node,
    NodeDeleted,
    Pod,
    PodDeleted,
    PodDisruptionBudget,
    PodTerminated,
    Reservation,
    ScaleDownEvent,
)
from streams.bridge.mirror import (
    HOLD_ANNOTATION,
    NODE,
    PDB,
    POD,
    PODGROUP,
    REPLICASET,
    RESERVATION,
    Mirror,
)


def pod(name: str, *, scheduler: str = "koordstream", node: str = "", phase: str = "Pending", cpu: str = "1",
        hold: str = "", labels: dict[str, str] | None = None, rv: str = "1") -> dict[str, Any]:
    annotations = {HOLD_ANNOTATION: hold} if hold else {}
    spec: dict[str, Any] = {"schedulerName": scheduler,
                            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": rv,
                         "labels": labels or {}, "annotations": annotations},
            "spec": spec, "status": {"phase": phase}}


def node(name: str, cpu: str = "8", gpus: int = 0, rv: str = "1") -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": "16Gi", "pods": "10"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    return {"metadata": {"name": name, "uid": f"n-{name}", "resourceVersion": rv},
            "status": {"allocatable": allocatable}}


def records(outputs: list[Output], kind: type[Any] | None = None) -> list[Any]:
    return [o.record for o in outputs if kind is None or isinstance(o.record, kind)]


@pytest.fixture
def mirror() -> Mirror:
    return Mirror(frozenset({"koordstream"}))


@pytest.mark.parametrize(("obj", "published"), [
    (pod("pending"), True),
    (pod("other-scheduler", scheduler="default-scheduler"), False),
    (pod("bound-by-us", node="n1", hold="u-bound-by-us/0/n1"), True),
    (pod("ours-created-bound", node="n1"), False),
    (pod("ours-hold-elsewhere", node="n1", hold="u-x/0/n2"), False),
], ids=["unassigned-ours", "another-scheduler", "bound-by-koordstream", "created-with-a-node", "hold-of-another-node"])
def test_which_pods_are_koordstreams(mirror: Mirror, obj: dict[str, Any], published: bool) -> None:
    out = mirror.apply(NODE, "ADDED", node("n1")) + mirror.apply(POD, "ADDED", obj)
    assert bool(records(out, Pod)) == published


def test_an_unchanged_object_publishes_nothing_again(mirror: Mirror) -> None:
    assert records(mirror.apply(POD, "ADDED", pod("a")), Pod)
    assert mirror.apply(POD, "MODIFIED", pod("a", rv="7")) == []  # a new resourceVersion only
    assert records(mirror.apply(POD, "MODIFIED", pod("a", cpu="2", rv="8")), Pod)
    assert records(mirror.apply(NODE, "ADDED", node("n1")), Node)
    assert mirror.apply(NODE, "MODIFIED", node("n1", rv="9")) == []  # a heartbeat
    assert mirror.relisted(POD, [pod("a", cpu="2", rv="10")]) == []  # a relist of the same


def test_foreign_pods_take_their_requests_from_the_node(mirror: Mirror) -> None:
    mirror.apply(NODE, "ADDED", node("n1", cpu="8", gpus=4))
    theirs = pod("theirs", scheduler="default-scheduler", node="n1", cpu="3")
    theirs["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
    assert mirror.apply(POD, "ADDED", theirs) == []
    [n1] = records(mirror.flush_nodes(), Node)
    assert n1.allocatable["cpu"] == 5000 and n1.allocatable["pods"] == 9 and len(n1.gpus) == 3
    finished = {**theirs, "status": {"phase": "Succeeded"}}
    mirror.apply(POD, "MODIFIED", finished)  # a finished pod takes nothing
    [again] = records(mirror.flush_nodes(), Node)
    assert again.allocatable["cpu"] == 8000 and len(again.gpus) == 4
    assert mirror.flush_nodes() == []


def test_a_pod_of_ours_bound_elsewhere_counts_there_and_its_deletion_is_forwarded(mirror: Mirror) -> None:
    mirror.apply(NODE, "ADDED", node("n2"))
    mirror.apply(POD, "ADDED", pod("p"))
    mirror.apply(POD, "MODIFIED", pod("p", node="n2"))  # bound by someone else
    [n2] = records(mirror.flush_nodes(), Node)
    assert n2.allocatable["cpu"] == 7000
    [deleted] = records(mirror.apply(POD, "DELETED", pod("p", node="n2")), PodDeleted)
    assert deleted.uid == "u-p"
    assert records(mirror.flush_nodes(), Node)[0].allocatable["cpu"] == 8000


def test_a_finished_pod_of_ours_is_terminated_at_its_node_once(mirror: Mirror) -> None:
    mirror.apply(POD, "ADDED", pod("p"))
    mirror.apply(POD, "MODIFIED", pod("p", node="n1", hold="u-p/0/n1", phase="Running"))
    out = mirror.apply(POD, "MODIFIED", pod("p", node="n1", hold="u-p/0/n1", phase="Succeeded"))
    [ended] = records(out, PodTerminated)
    assert ended.uid == "u-p" and ended.node == "n1"
    assert [o.topic for o in out if isinstance(o.record, PodTerminated)] == [topics.NODE_INBOX]
    again = mirror.apply(POD, "MODIFIED", pod("p", node="n1", hold="u-p/0/n1", phase="Succeeded", rv="5"))
    assert records(again, PodTerminated) == []


def test_a_relist_reports_what_went_meanwhile(mirror: Mirror) -> None:
    mirror.relisted(POD, [pod("a"), pod("b")])
    mirror.relisted(NODE, [node("n1"), node("n2")])
    gone = mirror.relisted(POD, [pod("a")]) + mirror.relisted(NODE, [node("n1")])
    assert [r.uid for r in records(gone, PodDeleted)] == ["u-b"]
    assert [(r.name, r.uid) for r in records(gone, NodeDeleted)] == [("n2", "n-n2")]


def test_a_podgroup_gives_its_pods_the_gang_annotations(mirror: Mirror) -> None:
    group = {"metadata": {"name": "train", "namespace": "ns"}, "spec": {"minMember": 3, "scheduleTimeoutSeconds": 90}}
    assert mirror.apply(PODGROUP, "ADDED", group) == []
    [member] = records(mirror.apply(POD, "ADDED", pod("m0", labels={POD_GROUP_LABEL: "train"})), Pod)
    assert member.annotations[GANG_MIN_AVAILABLE_ANNOTATION] == "3"
    assert member.annotations[GANG_WAITING_TIME_ANNOTATION] == "90s"
    bad = {"metadata": {"name": "bad", "namespace": "ns"}, "spec": {"minMember": 0}}
    [letter] = records(mirror.apply(PODGROUP, "ADDED", bad), DeadLetter)
    assert letter.field == "spec.minMember" and letter.value == "0"


def test_a_replicaset_scaled_down_becomes_a_scale_down_event(mirror: Mirror) -> None:
    rs = {"metadata": {"name": "web", "namespace": "ns", "uid": "rs1"}, "spec": {"replicas": 5}}
    assert mirror.apply(REPLICASET, "ADDED", rs) == []
    assert mirror.apply(REPLICASET, "MODIFIED", {**rs, "spec": {"replicas": 6}}) == []
    [event] = records(mirror.apply(REPLICASET, "MODIFIED", {**rs, "spec": {"replicas": 2}}), ScaleDownEvent)
    assert (event.workload, event.namespace, event.replicas) == ("ReplicaSet/web", "ns", 4)


def test_budgets_and_reservations(mirror: Mirror) -> None:
    pdb = {"metadata": {"name": "keep", "namespace": "ns", "uid": "b1"},
           "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}
    [budget] = records(mirror.apply(PDB, "ADDED", pdb), PodDisruptionBudget)
    assert budget.min_available == "2" and not budget.deleted
    [deleted] = records(mirror.apply(PDB, "DELETED", pdb), PodDisruptionBudget)
    assert deleted.deleted
    reservation = {"metadata": {"name": "r", "uid": "r1"},
                   "spec": {"template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}},
                            "ttl": "1h"}}
    [made] = records(mirror.apply(RESERVATION, "ADDED", reservation), Reservation)
    assert made.uid == "r1" and made.requests["cpu"] == 2000
    status = {**reservation, "status": {"phase": "Available", "nodeName": "n1"}}
    assert mirror.apply(RESERVATION, "MODIFIED", status) == []  # our own status write changes nothing
    [gone] = records(mirror.apply(RESERVATION, "DELETED", reservation), PodDeleted)
    assert gone.uid == "r1"


def test_a_bad_object_is_dead_lettered_with_its_field_and_the_rest_goes_on(mirror: Mirror) -> None:
    bad = pod("bad")
    bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    [letter] = records(mirror.apply(POD, "ADDED", bad), DeadLetter)
    assert "cpu" in letter.field and letter.value == "lots" and letter.topic == "kubernetes/Pod"
    assert records(mirror.apply(POD, "ADDED", pod("good")), Pod)


def test_a_new_leader_starts_from_what_was_published_and_reports_what_went_meanwhile() -> None:
    """Seeded with what a bridge published before (read back from the topics), the first lists
    publish nothing unchanged, and the deletions that happened while no bridge ran."""
    before = Mirror(frozenset({"koordstream"}))
    published = before.relisted(NODE, [node("n1"), node("n2")]) + before.relisted(POD, [pod("a"), pod("b")])
    after = Mirror(frozenset({"koordstream"}))
    for out in published:
        after.seed(out.record)
    assert after.relisted(NODE, [node("n1"), node("n2")]) == []
    assert after.relisted(POD, [pod("a"), pod("b")]) == []
    again = Mirror(frozenset({"koordstream"}))
    for out in published:
        again.seed(out.record)
    gone = again.relisted(POD, [pod("a")]) + again.relisted(NODE, [node("n1")])
    assert [r.uid for r in records(gone, PodDeleted)] == ["u-b"]
    assert [r.name for r in records(gone, NodeDeleted)] == ["n2"]
    # A deletion published before is read back too: nothing to delete again.
    later = Mirror(frozenset({"koordstream"}))
    for out in published + gone:
        later.seed(out.record)
    assert later.relisted(POD, [pod("a")]) == [] and later.relisted(NODE, [node("n1")]) == []
