"""agent-sandbox's objects through the bridge's mirror, pure: templates, pools and claims to the
records on `sandbox` (a pool resolved with its template and published again when it changes,
deletions, relists, read-back seeds); the pools' sandbox pods known by their koordstream uid and
published only once bound by us; what `pods` says of each sandbox pod (`SandboxPods`: order,
replays, a uid used again); the pod created from its template's spec; claims' answers as their
Ready condition."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agents.ports import Output
from agents.sandbox.templates import sandbox_uid, template_hash
from schemas import topics
from schemas.records import (
    SANDBOX_POOL_LABEL,
    SANDBOX_TEMPLATE_HASH_LABEL,
    BoundPod,
    NodeStateChange,
    Pod,
    PodDeleted,
    SandboxClaim,
    SandboxClaimDeleted,
    SandboxClaimStatus,
    SandboxPoolStatus,
    SandboxWarmPool,
    SandboxWarmPoolDeleted,
)
from streams.bridge.mirror import HOLD_ANNOTATION, NODE, POD, Mirror
from streams.bridge.sandboxes import (
    API_VERSION,
    CLAIM,
    TEMPLATE,
    UID_ANNOTATION,
    WARMPOOL,
    SandboxPods,
    claim_condition,
    claim_status_patch,
    metadata_patch,
    pod_manifest,
    pool_status_patch,
)

NS = "agents"
SPEC = {"schedulerName": "koordstream", "containers": [
    {"name": "runtime", "image": "python:3.12", "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}}]}


def template(name: str = "py", uid: str = "t1", image: str = "python:3.12", cpu: str = "250m") -> dict[str, Any]:
    spec = {**SPEC, "containers": [{**SPEC["containers"][0], "image": image,
                                    "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}}]}
    return {"apiVersion": API_VERSION, "kind": "SandboxTemplate",
            "metadata": {"name": name, "namespace": NS, "uid": uid},
            "spec": {"podTemplate": {"metadata": {"labels": {"app": "sbx"}}, "spec": spec}}}


def pool(name: str = "pool", uid: str = "p1", replicas: int = 3, tpl: str = "py") -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "SandboxWarmPool", "metadata": {"name": name, "namespace": NS, "uid": uid},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": tpl}}}


def claim(name: str = "c", uid: str = "k1", pool_name: str = "pool", created: str | None = "2026-12-07T10:00:00Z"
          ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": uid}
    if created:
        meta["creationTimestamp"] = created
    return {"apiVersion": API_VERSION, "kind": "SandboxClaim", "metadata": meta,
            "spec": {"warmPoolRef": {"name": pool_name}}}


def records(outputs: list[Output]) -> list[Any]:
    assert all(o.topic == topics.SANDBOX for o in outputs if not isinstance(o.record, (Pod, PodDeleted)))
    return [o.record for o in outputs]


def test_a_pool_goes_out_with_its_template_and_again_when_the_template_changes() -> None:
    m = Mirror(frozenset({"koordstream"}))
    assert m.apply(WARMPOOL, "ADDED", pool()) == []  # it waits for its template
    [out] = m.apply(TEMPLATE, "ADDED", template())
    assert out.topic == topics.SANDBOX and out.key == "pool"
    published = out.record
    assert isinstance(published, SandboxWarmPool) and published.uid == "p1" and published.replicas == 3
    assert published.template.pod.requests["cpu"] == 250 and published.template.pod_spec["containers"][0]["image"] \
        == "python:3.12"
    assert m.apply(TEMPLATE, "MODIFIED", template()) == []  # unchanged: nothing
    assert m.apply(WARMPOOL, "MODIFIED", pool()) == []
    [again] = records(m.apply(TEMPLATE, "MODIFIED", template(cpu="500m")))
    assert isinstance(again, SandboxWarmPool) and again.template.pod.requests["cpu"] == 500
    [scaled] = records(m.apply(WARMPOOL, "MODIFIED", pool(replicas=5)))
    assert isinstance(scaled, SandboxWarmPool) and scaled.replicas == 5
    assert m.apply(TEMPLATE, "DELETED", template(cpu="500m")) == []  # the pool keeps the template it carries
    assert records(m.apply(WARMPOOL, "DELETED", pool())) == [SandboxWarmPoolDeleted(namespace=NS, name="pool")]


def test_claims_go_out_with_their_uid_and_creation_time_and_their_deletion() -> None:
    clock = [1000.0]
    m = Mirror(frozenset({"koordstream"}))
    m.sandboxes.clock = lambda: clock[0]
    [first] = records(m.apply(CLAIM, "ADDED", claim()))
    assert isinstance(first, SandboxClaim) and (first.uid, first.warm_pool) == ("k1", "pool")
    assert first.created == pytest.approx(1796637600.0)
    [bare] = records(m.apply(CLAIM, "ADDED", claim("d", "k2", created=None)))
    clock[0] = 2000.0
    assert isinstance(bare, SandboxClaim) and bare.created == 1000.0  # when the bridge first saw it
    assert m.apply(CLAIM, "MODIFIED", claim("d", "k2", created=None)) == []  # (a status write: the same claim)
    assert records(m.apply(CLAIM, "DELETED", claim())) == [
        SandboxClaimDeleted(uid="k1", namespace=NS, name="c", warm_pool="pool")]


def test_a_relist_deletes_what_is_gone_but_not_a_pool_made_again_under_its_name() -> None:
    m = Mirror(frozenset({"koordstream"}))
    m.relisted(TEMPLATE, [template()])
    m.relisted(WARMPOOL, [pool(), pool("other", "p2")])
    m.relisted(CLAIM, [claim(), claim("d", "k2")])
    # While no watch ran: `pool` made again (new uid), `other` and claim `d` deleted.
    assert records(m.relisted(WARMPOOL, [pool(uid="p3")])) == [
        m.sandboxes.published_pools["p3"], SandboxWarmPoolDeleted(namespace=NS, name="other")]
    assert records(m.relisted(CLAIM, [claim()])) == [SandboxClaimDeleted(uid="k2", namespace=NS, name="d",
                                                                          warm_pool="pool")]


def test_a_new_leader_publishes_only_what_changed_since_the_records_read_back() -> None:
    old = Mirror(frozenset({"koordstream"}))
    published = [o.record for o in old.relisted(TEMPLATE, [template()]) + old.relisted(WARMPOOL, [pool(), pool("x", "p2")])
                 + old.relisted(CLAIM, [claim(), claim("d", "k2")])]
    new = Mirror(frozenset({"koordstream"}))
    for record in published + [SandboxClaimDeleted(uid="k2", namespace=NS, name="d", warm_pool="pool")]:
        new.seed(record)
    assert new.relisted(TEMPLATE, [template()]) == []
    assert records(new.relisted(WARMPOOL, [pool()])) == [SandboxWarmPoolDeleted(namespace=NS, name="x")]
    assert new.relisted(CLAIM, [claim()]) == []


def test_a_sandbox_pods_spec_is_its_templates_by_hash_else_the_pools_current() -> None:
    m = Mirror(frozenset({"koordstream"}))
    m.relisted(TEMPLATE, [template()])
    [first] = records(m.relisted(WARMPOOL, [pool()]))
    [second] = records(m.apply(TEMPLATE, "MODIFIED", template(image="python:3.13", cpu="1")))
    old = Pod(uid=sandbox_uid(NS, "pool", 0), name="pool-0", namespace=NS, scheduler_name="koordstream",
              labels={SANDBOX_POOL_LABEL: "pool", SANDBOX_TEMPLATE_HASH_LABEL: template_hash(first.template)})
    spec = m.sandboxes.spec_for(old)
    assert spec is not None and spec["containers"][0]["image"] == "python:3.12"
    unknown = Pod(uid=old.uid, name="pool-0", namespace=NS, labels={SANDBOX_POOL_LABEL: "pool"})
    spec = m.sandboxes.spec_for(unknown)
    assert spec is not None and spec["containers"][0]["image"] == "python:3.13"
    assert template_hash(second.template) != template_hash(first.template)
    body = pod_manifest(old, {**SPEC, "nodeName": "n9"})
    assert body["metadata"] == {"name": "pool-0", "namespace": NS, "labels": old.labels,
                                "annotations": {UID_ANNOTATION: old.uid}}
    assert "nodeName" not in body["spec"] and body["spec"]["schedulerName"] == "koordstream"


def sandbox_pod(n: int = 0, node: str = "", api_uid: str = "a0", phase: str = "Pending",
                hold: str = "") -> dict[str, Any]:
    uid = sandbox_uid(NS, "pool", n)
    annotations = {UID_ANNOTATION: uid, **({HOLD_ANNOTATION: hold} if hold else {})}
    spec: dict[str, Any] = {**SPEC}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": f"pool-{n}", "namespace": NS, "uid": api_uid, "resourceVersion": "1",
                         "labels": {SANDBOX_POOL_LABEL: "pool"}, "annotations": annotations},
            "spec": spec, "status": {"phase": phase}}


def test_a_sandbox_pod_is_known_by_its_uid_and_published_once_bound_by_us() -> None:
    m = Mirror(frozenset({"koordstream"}))
    uid = sandbox_uid(NS, "pool", 0)
    assert m.apply(POD, "ADDED", sandbox_pod()) == []  # its pool published it
    assert uid in m.pods and m.api_uid(uid) == "a0" and m.api_uid("other") == "other"
    [bound] = m.apply(POD, "MODIFIED", sandbox_pod(node="n1", hold=f"{uid}/1/n1"))
    assert isinstance(bound.record, Pod) and (bound.key, bound.record.uid, bound.record.node_name) == (uid, uid, "n1")
    [running] = m.apply(POD, "MODIFIED", sandbox_pod(node="n1", hold=f"{uid}/1/n1", phase="Running"))
    assert isinstance(running.record, Pod) and running.record.phase == "Running"
    [deleted] = m.apply(POD, "DELETED", sandbox_pod(node="n1", hold=f"{uid}/1/n1", phase="Running"))
    assert deleted.record == PodDeleted(uid=uid, name="pool-0", namespace=NS, labels={SANDBOX_POOL_LABEL: "pool"},
                                        annotations={UID_ANNOTATION: uid, HOLD_ANNOTATION: f"{uid}/1/n1"})
    m.apply(POD, "ADDED", sandbox_pod(1, api_uid="a1"))
    assert m.apply(POD, "DELETED", sandbox_pod(1, api_uid="a1")) == []  # never published: its pool deletes it


def test_a_claims_metadata_is_merged_into_the_pod_it_adopted_and_what_others_put_there_stays() -> None:
    m = Mirror(frozenset({"koordstream"}))
    uid = sandbox_uid(NS, "pool", 0)
    obj = sandbox_pod()
    obj["metadata"]["labels"]["theirs"] = "kept"
    m.apply(POD, "ADDED", obj)
    live = m.pods[uid].live  # known before it is published (its pool published it pending)
    assert live is not None and live.labels["theirs"] == "kept"
    record = Pod(uid=uid, name="pool-0", namespace=NS, labels={SANDBOX_POOL_LABEL: "pool", "team": "x"},
                 annotations={"trace": "t1"})
    assert metadata_patch(record, live) == {"metadata": {"labels": {"team": "x"}, "annotations": {"trace": "t1"}}}
    forged = Pod(uid=uid, name="pool-0", namespace=NS, annotations={UID_ANNOTATION: sandbox_uid(NS, "pool", 9)},
                 labels={"scheduling.koordinator.sh/sandbox-template-hash": "other"})
    assert metadata_patch(forged, live) is None  # reserved domains are set at creation only
    obj["metadata"]["labels"]["team"] = "x"
    obj["metadata"]["annotations"]["trace"] = "t1"
    obj["metadata"]["resourceVersion"] = "2"
    m.apply(POD, "MODIFIED", obj)
    live = m.pods[uid].live
    assert live is not None and metadata_patch(record, live) is None


def test_vanished_leaves_the_sandbox_pods_whose_creation_may_be_to_come() -> None:
    m = Mirror(frozenset({"koordstream"}))
    m.apply(NODE, "ADDED", {"metadata": {"name": "n1", "uid": "n-1"}, "status": {"allocatable": {"cpu": "8"}}})
    coming, gone = sandbox_uid(NS, "pool", 0), sandbox_uid(NS, "pool", 1)
    report = NodeStateChange(node="n1", seq=1, committed=(BoundPod(uid=coming, name="pool-0", namespace=NS),
                                                   BoundPod(uid=gone, name="pool-1", namespace=NS)))
    out = m.vanished([report], to_come=lambda uid: uid == coming)
    assert {o.record.uid for o in out} == {gone}  # type: ignore[attr-defined]


def test_what_pods_says_of_a_sandbox_pod_is_its_last_record_in_log_order() -> None:
    pods = SandboxPods()
    uid = sandbox_uid(NS, "pool", 0)
    pod = Pod(uid=uid, name="pool-0", namespace=NS)
    assert pods.read(pod, False, 10, 0) and pods.pods[uid].creatable() and pods.to_come(uid)
    assert not pods.read(pod, False, 10, 0)  # read again (the consumer after the read-back): nothing new
    assert pods.read(Pod(uid=uid, name="pool-0", namespace=NS, node_name="n1"), True, 12, 0)
    assert not pods.pods[uid].creatable() and not pods.to_come(uid)  # bound before: never made again
    relabelled = Pod(uid=uid, name="pool-0", namespace=NS, labels={"team": "x"})  # adopted by a claim
    assert pods.read(relabelled, False, 12, 1) and pods.pods[uid].pod == relabelled
    assert not pods.pods[uid].creatable() and not pods.to_come(uid)  # still bound
    assert pods.read(PodDeleted(uid=uid), False, 13, 0) and pods.pods[uid].deleted
    assert not pods.read(pod, False, 10, 0)  # an older record replayed changes nothing
    fresh = sandbox_uid(NS, "pool", 1)
    assert pods.read(Pod(uid=fresh, name="pool-1", namespace=NS), False, 20, 1) and pods.pods[fresh].creatable()
    pods.deleted(fresh)
    assert not pods.pods[fresh].creatable()
    assert pods.read(Pod(uid=fresh, name="pool-1", namespace=NS), False, 21, 1)  # its pool sent it again
    assert pods.pods[fresh].creatable()  # never bound: made again
    assert not pods.read(Pod(uid=f"sbx~{NS}~pool~r-b-0", name="r"), False, 21, 0)  # a reservation: not a pod


async def test_a_binding_read_before_its_pod_waits_for_the_pods_record() -> None:
    pods = SandboxPods()
    uid = sandbox_uid(NS, "pool", 3)
    waiting = asyncio.create_task(pods.wait(uid, 5.0))
    await asyncio.sleep(0)
    pods.read(Pod(uid=uid, name="pool-3", namespace=NS), False, 1, 0)
    seen = await waiting
    assert seen is not None and seen.pod is not None and seen.pod.name == "pool-3"
    assert await pods.wait(sandbox_uid(NS, "pool", 4), 0.01) is None


@pytest.mark.parametrize(("status", "expected"), [
    (SandboxClaimStatus(uid="k1", namespace=NS, name="c", warm_pool="pool", phase="Ready", sandbox="pool-0",
                        node="n1"), ("True", "SandboxReady", "sandbox pool-0 runs on node n1")),
    (SandboxClaimStatus(uid="k1", namespace=NS, name="c", warm_pool="pool", phase="Pending", sandbox="pool-0",
                        reason="WarmPoolEmpty", message="starting"), ("False", "WarmPoolEmpty", "starting")),
    (SandboxClaimStatus(uid="k1", namespace=NS, name="c", warm_pool="nope", phase="Refused", reason="WarmPoolNotFound",
                        message="spec.warmPoolRef.name='nope': no SandboxWarmPool 'nope'", next_step="CreateWarmPool"),
     ("False", "WarmPoolNotFound", "spec.warmPoolRef.name='nope': no SandboxWarmPool 'nope' (next step: CreateWarmPool)")),
    (SandboxClaimStatus(uid="k1", namespace=NS, name="c", warm_pool="pool", phase="Refused", reason="not a reason!",
                        message="m"), ("False", "ClaimRefused", "m")),
    (SandboxClaimStatus(uid="k1", namespace=NS, name="c", warm_pool="pool", phase="Expired", message="shutdown"),
     ("False", "ClaimExpired", "shutdown")),
], ids=["ready", "pending", "refused", "refused-bad-reason", "expired"])
def test_a_claims_answer_as_its_ready_condition(status: SandboxClaimStatus, expected: tuple[str, str, str]) -> None:
    condition = claim_condition(status, "2026-12-07T10:00:00Z")
    assert (condition["status"], condition["reason"], condition["message"]) == expected
    assert condition["type"] == "Ready" and condition["lastTransitionTime"] == "2026-12-07T10:00:00Z"
    test, write = claim_status_patch(status, "2026-12-07T10:00:00Z")
    assert test == {"op": "test", "path": "/metadata/uid", "value": "k1"}  # not onto a claim made again
    assert write["path"] == "/status" and write["value"]["conditions"] == [condition]
    assert write["value"].get("sandbox") == ({"name": "pool-0"} if status.sandbox else None)


def test_generations_and_a_sandbox_pods_ips_reach_the_status() -> None:
    """metadata.generation travels on the pool and claim records, back as observedGeneration;
    the sandbox pod's IPs (podIPs, else podIP) reach the claim's status.sandbox.podIPs."""
    obj = claim()
    obj["metadata"]["generation"] = 2
    [record] = Mirror(frozenset({"koordstream"})).apply(CLAIM, "ADDED", obj)
    assert isinstance(record.record, SandboxClaim) and record.record.generation == 2
    ready = SandboxClaimStatus(uid="k1", namespace=NS, name="c", warm_pool="pool", phase="Ready", sandbox="pool-0",
                               node="n1", observed_generation=2)
    _, write = claim_status_patch(ready, "2026-12-07T10:00:00Z", ("10.0.0.7",))
    assert write["value"]["sandbox"] == {"name": "pool-0", "podIPs": ["10.0.0.7"]}
    assert write["value"]["conditions"][0]["observedGeneration"] == 2
    depth = SandboxPoolStatus(namespace=NS, name="pool", replicas=3, ready=3, observed_generation=4)
    assert pool_status_patch(depth, "p1")[1]["value"]["observedGeneration"] == 4
    m = Mirror(frozenset({"koordstream"}))
    uid = sandbox_uid(NS, "pool", 0)
    running = sandbox_pod(node="n1", phase="Running")
    m.apply(POD, "ADDED", {**running, "status": {"phase": "Running", "podIP": "10.0.0.7"}})
    assert m.pods[uid].ips == ("10.0.0.7",)
    m.apply(POD, "MODIFIED", {**running, "metadata": {**running["metadata"], "resourceVersion": "2"},
                              "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.7"}, {"ip": "fd00::7"}]}})
    assert m.pods[uid].ips == ("10.0.0.7", "fd00::7")


def test_a_pools_depth_as_its_status_and_only_onto_the_pool_of_its_uid() -> None:
    mirror = Mirror(frozenset({"koordstream"}))
    mirror.apply(WARMPOOL, "ADDED", pool(uid="p1"))
    assert mirror.sandboxes.pool_uid(NS, "pool") == "p1" and mirror.sandboxes.pool_uid(NS, "other") == ""
    depth = SandboxPoolStatus(namespace=NS, name="pool", replicas=3, ready=2, starting=1, claimed=4)
    test, write = pool_status_patch(depth, "p1")
    assert test == {"op": "test", "path": "/metadata/uid", "value": "p1"}  # not onto a pool made again
    assert write == {"op": "add", "path": "/status",
                     "value": {"replicas": 3, "readyReplicas": 2, "selector": f"{SANDBOX_POOL_LABEL}=pool"}}
    mirror.apply(WARMPOOL, "DELETED", pool(uid="p1"))
    assert mirror.sandboxes.pool_uid(NS, "pool") == ""
