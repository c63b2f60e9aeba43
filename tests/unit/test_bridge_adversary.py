"""Adversarial sequences for the bridge's pure parts: the `Mirror` driven with crafted watch
events, its outputs fed to the real `NodeOwner`, and the invariant checked against what the
API server says runs on each node:

    koordstream's free capacity on a node (the Node it was published with, less what the
    owner holds there) is never more than the API server's (the node's allocatable less every
    unfinished pod bound to it).

Each test names a fault an adversarial review found (see the report on branch
`bridge-adversary`)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from agents.ports import Output
from agents.state.owner import NodeOwner, NodeState, OwnerResult
from schemas import topics
from schemas.codec import encode
from schemas.records import (
    GANG_MIN_AVAILABLE_ANNOTATION,
    POD_GROUP_LABEL,
    BoundPod,
    Claim,
    Commit,
    DeadLetter,
    Held,
    Node,
    NodeDeleted,
    NodeStateChange,
    Pod,
    PodDeleted,
    ResourceList,
)
from streams.bridge.mirror import HOLD_ANNOTATION, NODE, POD, PODGROUP, Mirror

PROFILES = frozenset({"koordstream"})


def pod(name: str, *, node: str = "", phase: str = "Pending", cpu: str = "1", hold: str = "",
        scheduler: str = "koordstream", uid: str = "", rv: str = "1", labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    notes = dict(annotations or {})
    if hold:
        notes[HOLD_ANNOTATION] = hold
    spec: dict[str, Any] = {"schedulerName": scheduler,
                            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid or f"u-{name}", "resourceVersion": rv,
                         "labels": dict(labels or {}), "annotations": notes},
            "spec": spec, "status": {"phase": phase}}


def node(name: str, cpu: str = "8", uid: str = "", rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid or f"n-{name}", "resourceVersion": rv},
            "status": {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"}}}


def cpu_of(quantity: str) -> int:
    return int(float(quantity) * 1000)


@dataclass
class World:
    """The API server's objects (the truth), the mirror, and koordstream's owners fed with
    what the mirror publishes; a pod bound by koordstream is claimed and committed first."""

    mirror: Mirror = field(default_factory=lambda: Mirror(PROFILES))
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> object
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> object
    owners: dict[str, NodeState] = field(default_factory=dict)
    outputs: list[Output] = field(default_factory=list)

    def _owner(self, name: str, records: list[Any]) -> None:
        state = self.owners.setdefault(name, NodeState(name))
        NodeOwner().apply(state, records, OwnerResult())

    def feed(self, outputs: list[Output]) -> list[Output]:
        outputs = outputs + self.mirror.flush_nodes()
        self.outputs += outputs
        for o in outputs:
            if o.topic == topics.NODES and isinstance(o.record, (Node, NodeDeleted)):
                self._owner(o.record.name, [o.record])
            elif o.topic == topics.NODE_INBOX:
                self._owner(o.key, [o.record])
        return outputs

    def event(self, kind: str, event: str, obj: dict[str, Any]) -> list[Output]:
        if kind == POD:
            uid = obj["metadata"]["uid"]
            if event == "DELETED":
                self.pods.pop(uid, None)
            else:
                self.pods[uid] = obj
        elif kind == NODE:
            if event == "DELETED":
                self.nodes.pop(obj["metadata"]["name"], None)
            else:
                self.nodes[obj["metadata"]["name"]] = obj
        return self.feed(self.mirror.apply(kind, event, obj))

    def bind(self, obj: dict[str, Any], node_name: str, attempt: int = 0) -> list[Output]:
        """koordstream binds the pod: its owner holds and commits the claim, then the API
        server shows it on the node with the Binding's hold annotation."""
        uid = obj["metadata"]["uid"]
        cpu = cpu_of(obj["spec"]["containers"][0]["resources"]["requests"]["cpu"])
        claim = Claim(uid=uid, attempt=attempt, node=node_name, decision_key=uid,
                      requests=ResourceList({"cpu": cpu, "pods": 1}))
        self._owner(node_name, [claim, Commit(uid, attempt, node_name, uid)])
        bound = pod(obj["metadata"]["name"], node=node_name, phase="Running", cpu=obj["spec"]["containers"][0]
                    ["resources"]["requests"]["cpu"], hold=f"{uid}/{attempt}/{node_name}", uid=uid, rv="2",
                    labels=obj["metadata"]["labels"])
        return self.event(POD, "MODIFIED", bound)

    def try_bind(self, obj: dict[str, Any], node_name: str, attempt: int) -> bool:
        """As `bind`, if the owner holds the claim (else it is released: nothing changes)."""
        uid = obj["metadata"]["uid"]
        cpu = cpu_of(obj["spec"]["containers"][0]["resources"]["requests"]["cpu"])
        claim = Claim(uid=uid, attempt=attempt, node=node_name, decision_key=uid,
                      requests=ResourceList({"cpu": cpu, "pods": 1}))
        state = self.owners.setdefault(node_name, NodeState(node_name))
        result = OwnerResult()
        NodeOwner().apply(state, [claim], result)
        if not any(isinstance(o.record, Held) for o in result.outputs):
            return False
        NodeOwner().apply(state, [Commit(uid, attempt, node_name, uid)], OwnerResult())
        bound = pod(obj["metadata"]["name"], node=node_name, phase="Running", cpu=obj["spec"]["containers"][0]
                    ["resources"]["requests"]["cpu"], hold=f"{uid}/{attempt}/{node_name}", uid=uid, rv="2",
                    labels=obj["metadata"]["labels"])
        self.event(POD, "MODIFIED", bound)
        return True

    def free(self, name: str) -> tuple[int, int]:
        """(koordstream's free cpu on the node, the API server's)."""
        state = self.owners[name]
        ours = state.allocatable.get("cpu", 0) - state.used().get("cpu", 0)
        truth = cpu_of(self.nodes[name]["status"]["allocatable"]["cpu"]) - sum(
            cpu_of(p["spec"]["containers"][0]["resources"]["requests"]["cpu"]) for p in self.pods.values()
            if p["spec"].get("nodeName") == name and p["status"]["phase"] not in ("Succeeded", "Failed"))
        return ours, truth

    def check(self, name: str) -> None:
        ours, truth = self.free(name)
        assert ours <= truth, f"koordstream sees {ours}m cpu free on {name}, the API server {truth}m: over-commit"


def test_a_kubectl_debug_copy_of_a_bound_pod_counts_against_its_node() -> None:
    """`kubectl debug P --copy-to=P-debug --same-node` copies P's annotations (our hold id,
    which names the node) and its nodeName: the copy must count as foreign, since no owner
    ever held it."""
    w = World()
    w.event(NODE, "ADDED", node("n1", cpu="8"))
    p = pod("p", cpu="1")
    w.event(POD, "ADDED", p)
    w.bind(p, "n1")
    w.check("n1")
    copy = pod("p-debug", node="n1", phase="Running", cpu="6", hold="u-p/0/n1", uid="u-copy")
    w.event(POD, "ADDED", copy)
    w.check("n1")


def test_a_node_deleted_and_created_again_still_counts_the_pods_bound_to_it() -> None:
    """A node deleted and added again under its name (a VM re-created; no pod GC ran, or the
    node came back within its grace): the pods bound to it are still there, and run on the
    new node. The owner terminated ours at the deletion (rule 9), so the mirror must count
    them from then on, or the new node is offered whole."""
    w = World()
    w.event(NODE, "ADDED", node("n1", cpu="4", uid="n1-a"))
    p = pod("p", cpu="3")
    w.event(POD, "ADDED", p)
    w.bind(p, "n1")
    w.check("n1")
    w.event(NODE, "DELETED", node("n1", cpu="4", uid="n1-a"))
    w.event(NODE, "ADDED", node("n1", cpu="4", uid="n1-b"))
    w.check("n1")
    # Once it finishes, the new node has all of its capacity again; its deletion still goes to `pods`.
    w.event(POD, "MODIFIED", pod("p", node="n1", phase="Succeeded", cpu="3", hold="u-p/0/n1", rv="3"))
    assert w.free("n1") == (4000, 4000)
    out = w.event(POD, "DELETED", pod("p", node="n1", phase="Succeeded", cpu="3", hold="u-p/0/n1", rv="4"))
    assert [o.record.uid for o in out if isinstance(o.record, PodDeleted)] == ["u-p"]


def test_a_node_recreated_during_a_watch_gap_keeps_the_invariant_too() -> None:
    """The same, seen through a relist (410 Gone): the list shows the node with a new uid.
    (This path holds: the mirror cannot name the old object, sends no NodeDeleted, and the
    owner keeps the pod.)"""
    w = World()
    w.feed(w.mirror.relisted(NODE, [node("n1", cpu="4", uid="n1-a")]))
    w.nodes["n1"] = node("n1", cpu="4", uid="n1-a")
    p = pod("p", cpu="3")
    w.event(POD, "ADDED", p)
    w.bind(p, "n1")
    w.nodes["n1"] = node("n1", cpu="4", uid="n1-b")
    w.feed(w.mirror.relisted(NODE, [node("n1", cpu="4", uid="n1-b")]))
    w.check("n1")


def test_pods_of_a_podgroup_created_before_it_are_not_scheduled_as_single_pods() -> None:
    """Members created before their PodGroup (kubectl apply of a folder, a Job's controller
    faster than the PodGroup's): Koordinator's coscheduling waits for the PodGroup ("gang
    has not init"); the mirror publishes them at once without the gang annotations, so
    each is scheduled alone, and a partial gang is bound."""
    w = World()
    w.mirror.podgroups_watched = True  # (the bridge watches PodGroups where their CRD is served)
    members = [pod(f"m{i}", labels={POD_GROUP_LABEL: "train"}) for i in range(3)]
    published: list[Pod] = []
    for m in members:
        published += [o.record for o in w.event(POD, "ADDED", m) if isinstance(o.record, Pod)]
    group = {"metadata": {"name": "train", "namespace": "ns"}, "spec": {"minMember": 3}}
    published += [o.record for o in w.event(PODGROUP, "ADDED", group) if isinstance(o.record, Pod)]
    # Every member reaches the scheduler as a member of a gang of 3, or not at all yet.
    assert sorted(p.name for p in published) == ["m0", "m1", "m2"], "the members were never published"
    assert all(p.annotations.get(GANG_MIN_AVAILABLE_ANNOTATION) == "3" for p in published), [
        (p.name, p.annotations) for p in published]


def test_an_older_event_replayed_after_a_newer_one_does_not_undo_it() -> None:
    """Events replayed out of order (a second reader of the same stream, a leader that lags
    behind its successor): a pod bound and running, then its older Pending version again.
    The mirror compared records, not versions, and published the pod as pending again."""
    w = World()
    w.event(NODE, "ADDED", node("n1"))
    p = pod("p", rv="1")
    w.event(POD, "ADDED", p)
    w.bind(p, "n1")  # resourceVersion 2
    stale = w.mirror.apply(POD, "MODIFIED", pod("p", rv="1"))
    assert [o.record for o in stale if isinstance(o.record, Pod)] == [], "a stale event published the pod as pending"
    # Nor does a stale event bring a deleted pod back; a newer one (a relist) still applies.
    w.event(POD, "DELETED", pod("p", node="n1", rv="5"))
    assert w.mirror.apply(POD, "MODIFIED", pod("p", rv="3")) == []
    q = pod("q", rv="7")
    w.event(POD, "ADDED", q)
    assert w.mirror.apply(POD, "MODIFIED", pod("q", rv="6")) == []
    assert [o.record.name for o in w.mirror.relisted(POD, [pod("q", rv="9", labels={"a": "b"})])
            if isinstance(o.record, Pod)] == ["q"]


def test_a_member_that_waits_for_its_podgroup_and_is_deleted_meanwhile_publishes_nothing() -> None:
    w = World()
    w.mirror.podgroups_watched = True
    w.event(POD, "ADDED", pod("m0", labels={POD_GROUP_LABEL: "train"}))
    assert w.event(POD, "DELETED", pod("m0", labels={POD_GROUP_LABEL: "train"})) == []
    group = {"metadata": {"name": "train", "namespace": "ns", "uid": "pg1"}, "spec": {"minMember": 1}}
    assert w.event(PODGROUP, "ADDED", group) == []
    # A pod that gives its gang's size itself, or a pod of a group while PodGroups are not watched, goes at once.
    sized = pod("s0", labels={POD_GROUP_LABEL: "other"}, annotations={GANG_MIN_AVAILABLE_ANNOTATION: "2"})
    assert [o.record.name for o in w.event(POD, "ADDED", sized) if isinstance(o.record, Pod)] == ["s0"]


def test_a_podgroup_deleted_during_a_watch_gap_is_forgotten() -> None:
    """A relist implies the deletion of a PodGroup by its uid alone: the group must go, or
    pods created later under its name get the deleted group's size."""
    w = World()
    w.mirror.podgroups_watched = True
    group = {"metadata": {"name": "train", "namespace": "ns", "uid": "pg1"}, "spec": {"minMember": 3}}
    w.feed(w.mirror.relisted(PODGROUP, [group]))
    w.feed(w.mirror.relisted(PODGROUP, []))
    assert w.mirror.podgroups == {}
    assert w.event(POD, "ADDED", pod("late", labels={POD_GROUP_LABEL: "train"})) == []  # waits for a new one


def test_pods_deleted_while_no_bridge_led_are_found_in_the_owners_state() -> None:
    """A new term's mirror starts empty: a pod bound by koordstream and deleted while no
    bridge led is in no list and in no watch. The owners' nodes as they are now name it
    (committed): it is deleted and terminated; a pod the API server has (listed, or created
    after the list and seen by the watch) is not, nor a pod on a node the API server does
    not have (published straight onto the topics)."""
    w = World()
    w.feed(w.mirror.relisted(NODE, [node("n1")]))
    w.feed(w.mirror.relisted(POD, [pod("kept", node="n1", hold="u-kept/0/n1", phase="Running")]))
    w.event(POD, "ADDED", pod("late"))  # created after the list
    committed = tuple(BoundPod(uid=u, namespace="ns", name=u[2:], decision_key=u) for u in ("u-kept", "u-gone", "u-late"))
    reports = [NodeStateChange(node="n1", seq=1, committed=committed),
               NodeStateChange(node="elsewhere", seq=1, committed=(BoundPod(uid="u-x"),))]
    out = w.mirror.vanished(reports)
    assert [(o.topic, type(o.record).__name__, getattr(o.record, "uid", "")) for o in out] == [
        (topics.PODS, "PodDeleted", "u-gone"), (topics.NODE_INBOX, "PodTerminated", "u-gone")]
    assert isinstance(out[0].record, PodDeleted) and out[0].record.decision_key == "u-gone" and out[1].key == "n1"


def test_the_dead_letter_of_a_huge_object_stays_under_a_message() -> None:
    """An object the API server took (up to etcd's 1.5 MiB) that cannot be converted: its dead
    letter names the field and value and carries the object's JSON cut, not whole (whole, it
    made a message Apache Kafka refused, and the bridge ended)."""
    big = pod("huge", node="n1", hold="u-huge/0/n1", phase="Running",
              annotations={f"a{i}": "x" * 100_000 for i in range(15)})
    big["spec"]["containers"][0]["resources"]["requests"]["memory"] = "9223372036854775807"
    [letter] = [o for o in Mirror(PROFILES).apply(POD, "ADDED", big) if o.topic == topics.DEAD_LETTER]
    record = letter.record
    assert isinstance(record, DeadLetter)
    assert (record.field, record.value) == ("spec.containers[0].resources.requests.memory", "9223372036854775807")
    assert len(encode(record)) < 512 * 1024 and "cut to" in record.error


def test_random_watch_sequences_never_over_commit_a_node() -> None:
    """Random runs (seeded): pods of ours created, bound by koordstream where its owner holds
    them, finished, deleted; foreign pods created bound, finished, deleted; nodes deleted and
    added again under their name; pods and nodes listed again (a 410). After every step, on
    every node the API server has: koordstream's free cpu <= the API server's (or none, where
    foreign pods filled the node past its allocatable)."""
    for seed in range(200):
        rng = random.Random(seed)
        w = World()
        names = ["n0", "n1"]
        generation = {n: 0 for n in names}
        for n in names:
            w.event(NODE, "ADDED", node(n, cpu="4", uid=f"{n}-0"))
        made = 0
        for step in range(40):
            op = rng.choice(["ours", "foreign", "bind", "finish", "delete", "node", "relist"])
            live = list(w.pods.values())
            if op == "ours":
                made += 1
                w.event(POD, "ADDED", pod(f"p{made}", cpu=rng.choice(["1", "2", "3"])))
            elif op == "foreign":
                made += 1
                there = rng.choice(names)
                if there in w.nodes:
                    w.event(POD, "ADDED", pod(f"f{made}", scheduler="default-scheduler", node=there, phase="Running",
                                              cpu=rng.choice(["1", "2"])))
            elif op == "bind":
                pending = [p for p in live if not p["spec"].get("nodeName")]
                there = rng.choice(names)
                if pending and there in w.nodes:
                    w.try_bind(rng.choice(pending), there, step)
            elif op == "finish" and live:
                p = rng.choice(live)
                if p["spec"].get("nodeName"):
                    done = {**p, "metadata": {**p["metadata"], "resourceVersion": str(100 + step)},
                            "status": {"phase": "Succeeded"}}
                    w.event(POD, "MODIFIED", done)
            elif op == "delete" and live:
                w.event(POD, "DELETED", rng.choice(live))
            elif op == "node":
                n = rng.choice(names)
                if n in w.nodes:
                    w.event(NODE, "DELETED", w.nodes[n])
                else:
                    generation[n] += 1
                    w.event(NODE, "ADDED", node(n, cpu="4", uid=f"{n}-{generation[n]}"))
            elif op == "relist":
                kind = rng.choice([POD, NODE])
                w.feed(w.mirror.relisted(kind, list(w.pods.values()) if kind == POD else list(w.nodes.values())))
            for n in w.nodes:
                if n in w.owners and w.owners[n].exists:
                    ours, truth = w.free(n)
                    assert ours <= max(truth, 0), f"seed {seed}, step {step} ({op}): {n} free {ours}m here, {truth}m there"


def test_events_out_of_the_usual_order_publish_what_the_object_says_once() -> None:
    """What held: MODIFIED before any ADDED is taken as the object; DELETED of objects never
    seen publishes nothing; a finished pod listed again within a term is not terminated twice;
    a foreign pod moved to another node (crafted: nodeName is immutable) leaves the first."""
    w = World()
    w.event(NODE, "ADDED", node("n1"))
    w.event(NODE, "ADDED", node("n2"))
    assert [type(o.record).__name__ for o in w.event(POD, "MODIFIED", pod("m"))] == ["Pod"]
    assert w.event(POD, "DELETED", pod("never-seen")) == []
    assert w.event(NODE, "DELETED", node("never-seen")) == []
    p = pod("p")
    w.event(POD, "ADDED", p)
    w.bind(p, "n1")
    done = pod("p", node="n1", phase="Succeeded", hold="u-p/0/n1", rv="3")
    first = w.event(POD, "MODIFIED", done)
    again = w.feed(w.mirror.relisted(POD, [done, pod("m")]))
    assert [o.topic for o in first if o.topic == topics.NODE_INBOX] == [topics.NODE_INBOX]
    assert [o for o in again if o.topic == topics.NODE_INBOX] == []
    theirs = pod("f", scheduler="default-scheduler", node="n1", phase="Running", cpu="3")
    w.event(POD, "ADDED", theirs)
    w.event(POD, "MODIFIED", {**theirs, "spec": {**theirs["spec"], "nodeName": "n2"}})
    assert w.free("n1") == (8000, 8000) and w.free("n2") == (5000, 5000)
