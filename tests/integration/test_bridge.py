"""The Kubernetes bridge against the real control plane (`make k8s`: kube-apiserver, etcd and
Kwok, one for the session), the session's broker and worker: pods created in the API server as
`kubectl` would create them are bound by koordstream through `pods/binding`, read back from
the API server; unschedulable pods get kube-scheduler's condition and an Event; deletions free
nodes; pods of other schedulers count against their nodes; evictions go through the Eviction
API, a budget's 429 retried and reported; ReplicaSet scale-downs become ScaleDownEvents and
deletion costs land on the pods; reservation phases land in the Reservation's status; and the
bridge killed -9 and started again loses nothing and binds nothing twice.

Each test has its own namespace and its own Kwok nodes (labelled and tainted for its pods
only: the other tests of the session publish pods straight onto the topics)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agents.rebalance.binpack import DELETION_COST
from agents.state.devices import DEVICE_ALLOCATED
from schemas import topics
from schemas.records import (
    GANG_MIN_AVAILABLE_ANNOTATION,
    GANG_NAME_ANNOTATION,
    Binding,
    EvictionCommand,
    EvictionRefused,
    Pod,
    PodDeleted,
    ScaleDownEvent,
)
from streams.bridge.mirror import HOLD_ANNOTATION, POD, Mirror
from streams.bridge.reflector import Reflector
from streams.kube_cluster import ControlPlane
from streams.kubeapi import KubeApi, KubeError
from tests.integration.conftest import BridgeProcess
from tests.integration.harness import Harness
from tests.integration.kube import (
    condition,
    create_all,
    create_namespace,
    kwok_node,
    no_pod_bound_twice,
    nodes_ready,
    pod_manifest,
    pods,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(control_plane: ControlPlane, bridge: BridgeProcess) -> Any:
    assert bridge.alive(), f"the bridge died: {bridge.log.read_text()[-3000:]}"
    async with control_plane.api() as client:
        yield client


async def cluster(api: KubeApi, group: str, nodes: list[dict[str, Any]]) -> None:
    await create_namespace(api, group)
    await create_all(api, "/api/v1/nodes", nodes)
    await wait_until("Kwok to make the nodes Ready", lambda: nodes_ready(api, [n["metadata"]["name"] for n in nodes]))


async def bound(api: KubeApi, namespace: str, count: int, timeout: float = 120.0) -> list[dict[str, Any]]:
    async def check() -> list[dict[str, Any]] | None:
        found = [p for p in await pods(api, namespace) if (p.get("spec") or {}).get("nodeName")]
        return found if len(found) >= count else None
    result: list[dict[str, Any]] = await wait_until(f"{count} pods of {namespace} bound", check, timeout)
    return result


async def test_pods_created_in_the_api_server_are_bound_through_pods_binding(api: KubeApi, bootstrap: str) -> None:
    group = unique("bind")
    nodes = [kwok_node(f"{group}-gpu-{i}", group, cpu="32", memory="128Gi", gpus=4) for i in range(2)]
    nodes += [kwok_node(f"{group}-cpu-{i}", group, cpu="8") for i in range(2)]
    await cluster(api, group, nodes)
    gpu = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
    gang = {GANG_NAME_ANNOTATION: "train", GANG_MIN_AVAILABLE_ANNOTATION: "3"}
    manifests = [pod_manifest(f"plain-{i}", group, group) for i in range(20)]
    manifests += [pod_manifest(f"gpu-{i}", group, group, extra=gpu) for i in range(4)]
    manifests += [pod_manifest(f"train-{i}", group, group, cpu="2", annotations=gang) for i in range(3)]
    async with Harness(bootstrap) as h:
        created = await create_all(api, f"/api/v1/namespaces/{group}/pods", manifests)
        placed = await bound(api, group, len(manifests))
        uids = {p["metadata"]["uid"] for p in created}
        assert {p["metadata"]["uid"] for p in placed} == uids
        for pod in placed:
            annotations = pod["metadata"].get("annotations") or {}
            assert annotations.get(HOLD_ANNOTATION, "").endswith("/" + pod["spec"]["nodeName"]), annotations
            if pod["metadata"]["name"].startswith("gpu-"):
                assert DEVICE_ALLOCATED in annotations and pod["spec"]["nodeName"].startswith(f"{group}-gpu-")
            scheduled = condition(pod, "PodScheduled")
            assert scheduled is not None and scheduled["status"] == "True"
        await h.wait_for(Binding, lambda b: b.uid in uids, count=len(uids))
        no_pod_bound_twice(h, uids)
        # The API server's word (read back): 1 cpu pods fill at most 8 per cpu node, GPU shares
        # at most 2 per GPU; nothing over a node's allocatable.
        per_node = Counter(p["spec"]["nodeName"] for p in placed)
        assert all(n <= 110 for n in per_node.values())


async def test_a_reservation_is_scheduled_its_status_written_and_a_pod_consumes_it(api: KubeApi) -> None:
    group = unique("resv")
    await cluster(api, group, [kwok_node(f"{group}-0", group, cpu="4")])
    template = pod_manifest("tpl", group, group, cpu="3")
    reservation = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation", "metadata": {"name": group},
        "spec": {"template": {"metadata": {"namespace": group}, "spec": template["spec"]},
                 "owners": [{"labelSelector": {"matchLabels": {"reserved-for": group}}}],
                 "ttl": "1h", "allocateOnce": True}}
    path = "/apis/scheduling.koordinator.sh/v1alpha1/reservations"
    await api.request("POST", path, body=reservation)

    async def phase() -> str:
        got = await api.request("GET", f"{path}/{group}")
        return str((got.get("status") or {}).get("phase") or "")
    assert await wait_until("the reservation Available", lambda: _equals(phase, "Available")) == "Available"
    got = await api.request("GET", f"{path}/{group}")
    assert got["status"]["nodeName"] == f"{group}-0"
    # 3 of 4 cpus held for the owner: a stranger asking 2 cpus waits, the owner gets in.
    await api.request("POST", f"/api/v1/namespaces/{group}/pods", body=pod_manifest("stranger", group, group, cpu="2"))
    await api.request("POST", f"/api/v1/namespaces/{group}/pods",
                      body=pod_manifest("owner", group, group, cpu="3", labels={"reserved-for": group}))
    placed = await bound(api, group, 1)
    assert [p["metadata"]["name"] for p in placed] == ["owner"]
    assert await wait_until("the reservation Succeeded", lambda: _equals(phase, "Succeeded")) == "Succeeded"


async def _equals(get: Any, want: str) -> str | None:
    value = await get()
    return value if value == want else None


async def test_unschedulable_pods_get_kube_schedulers_condition_and_an_event(api: KubeApi) -> None:
    group = unique("unsched")
    await cluster(api, group, [kwok_node(f"{group}-0", group, cpu="2")])
    await api.request("POST", f"/api/v1/namespaces/{group}/pods", body=pod_manifest("big", group, group, cpu="4"))

    async def unschedulable() -> dict[str, Any] | None:
        [pod] = await pods(api, group)
        found = condition(pod, "PodScheduled")
        return found if found and found["status"] == "False" else None
    found = await wait_until("PodScheduled=False", unschedulable)
    assert found["reason"] == "Unschedulable"
    assert found["message"].startswith("0/") and "nodes are available" in found["message"], found["message"]
    assert "Insufficient cpu" in found["message"]
    events = await api.request("GET", f"/apis/events.k8s.io/v1/namespaces/{group}/events")
    assert any(e["reason"] == "FailedScheduling" and e["regarding"]["name"] == "big" and e["type"] == "Warning"
               for e in events["items"])


async def test_a_deleted_pod_frees_its_node(api: KubeApi) -> None:
    group = unique("delete")
    await cluster(api, group, [kwok_node(f"{group}-0", group, cpu="2")])
    await api.request("POST", f"/api/v1/namespaces/{group}/pods", body=pod_manifest("first", group, group, cpu="2"))
    await bound(api, group, 1)
    await api.request("POST", f"/api/v1/namespaces/{group}/pods", body=pod_manifest("second", group, group, cpu="2"))
    await asyncio.sleep(2)
    assert [p["metadata"]["name"] for p in await pods(api, group) if p["spec"].get("nodeName")] == ["first"]
    await api.request("DELETE", f"/api/v1/namespaces/{group}/pods/first")  # Kwok's pod-delete stage finishes it

    async def second_bound() -> bool:
        return any(p["metadata"]["name"] == "second" and p["spec"].get("nodeName") for p in await pods(api, group))
    await wait_until("the second pod bound once the first is gone", second_bound)


async def test_pods_of_other_schedulers_count_against_their_nodes(api: KubeApi) -> None:
    group = unique("foreign")
    node = f"{group}-0"
    await cluster(api, group, [kwok_node(node, group, cpu="8")])
    other = pod_manifest("theirs", group, group, cpu="6", scheduler="default-scheduler")
    other["spec"]["nodeName"] = node  # bound by someone else
    await api.request("POST", f"/api/v1/namespaces/{group}/pods", body=other)
    await asyncio.sleep(1)
    await create_all(api, f"/api/v1/namespaces/{group}/pods",
                     [pod_manifest(f"ours-{i}", group, group, cpu="1500m") for i in range(3)])
    await bound(api, group, 2)  # theirs (6 cpu) and one of ours (1.5): two would be 9 of 8

    async def refused() -> list[str]:
        return [p["metadata"]["name"] for p in await pods(api, group)
                if (c := condition(p, "PodScheduled")) and c["status"] == "False"]
    assert len(await wait_until("two of ours unschedulable", lambda: _at_least(refused, 2))) == 2
    assert len([p for p in await pods(api, group) if p["spec"].get("nodeName")]) == 2


async def _at_least(get: Any, count: int) -> list[str] | None:
    value = await get()
    return value if len(value) >= count else None


async def test_an_eviction_refused_by_a_budget_is_retried_then_reported(api: KubeApi, bootstrap: str) -> None:
    """The Eviction API answers 429 while a PodDisruptionBudget allows no disruption (here its
    status says none, as the disruption controller would): the bridge retries, then reports
    `EvictionRefused`; once the budget allows one, the same command evicts the pod."""
    group = unique("evict")
    await cluster(api, group, [kwok_node(f"{group}-0", group, cpu="4")])
    [pod] = await create_all(api, f"/api/v1/namespaces/{group}/pods", [pod_manifest("victim", group, group)])
    await bound(api, group, 1)
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep", "namespace": group},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": group}}}}
    created = await api.request("POST", f"/apis/policy/v1/namespaces/{group}/poddisruptionbudgets", body=pdb)
    pdb_path = f"/apis/policy/v1/namespaces/{group}/poddisruptionbudgets/keep"

    async def budget_status(allowed: int) -> None:  # what the disruption controller would write
        current = await api.request("GET", pdb_path)
        current["status"] = {"observedGeneration": created["metadata"].get("generation", 1), "disruptionsAllowed": allowed,
                             "currentHealthy": 1, "desiredHealthy": 1 - allowed, "expectedPods": 1}
        await api.request("PUT", pdb_path + "/status", body=current)
    await budget_status(0)
    uid = pod["metadata"]["uid"]
    command = EvictionCommand(uid=uid, namespace=group, name="victim", node=f"{group}-0", reason="test")
    async with Harness(bootstrap) as h:
        await h.publish(topics.EVICTIONS, [command])
        [refused] = await h.wait_for(EvictionRefused, lambda r: r.uid == uid, timeout=60)
        assert refused.status == 429 and "disruption budget" in refused.reason
        assert [p["metadata"]["name"] for p in await pods(api, group)] == ["victim"]
        await budget_status(1)
        await h.publish(topics.EVICTIONS, [command])

        async def gone() -> bool:
            return not [p for p in await pods(api, group) if not p["metadata"].get("deletionTimestamp")]
        await wait_until("the victim evicted", gone)
        await h.wait_for(PodDeleted, lambda d: d.uid == uid, topic=topics.PODS)


async def test_scale_downs_become_events_and_deletion_costs_land_on_pods(api: KubeApi, bootstrap: str) -> None:
    group = unique("scale")
    await cluster(api, group, [kwok_node(f"{group}-0", group, cpu="8")])
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web", "namespace": group},
          "spec": {"replicas": 3, "selector": {"matchLabels": {"app": group}},
                   "template": {"metadata": {"labels": {"app": group}},
                                "spec": pod_manifest("x", group, group)["spec"]}}}
    made = await api.request("POST", f"/apis/apps/v1/namespaces/{group}/replicasets", body=rs)
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": made["metadata"]["uid"],
             "controller": True}
    created = await create_all(api, f"/api/v1/namespaces/{group}/pods",
                               [pod_manifest(f"web-{i}", group, group, owner=owner) for i in range(3)])
    await bound(api, group, 3)
    async with Harness(bootstrap) as h:
        made["spec"]["replicas"] = 1
        await api.request("PUT", f"/apis/apps/v1/namespaces/{group}/replicasets/web", body=made)
        [event] = await h.wait_for(ScaleDownEvent, lambda e: e.namespace == group, topic=topics.SCALE_DOWN)
        assert event.workload == "ReplicaSet/web" and event.replicas == 2
        # The rebalancer's ranks (CalculateOnly) are Pod records on `pods`; the bridge patches them.
        first = created[0]
        # (waited for: the collector may not have read that far in `pods` yet, shared by the session)
        ranked = (await h.wait_for(Pod, lambda p: p.uid == first["metadata"]["uid"] and bool(p.node_name),
                                   topic=topics.PODS))[-1]
        await h.publish(topics.PODS, [ranked.__class__(**{**_fields(ranked), "annotations": {
            **ranked.annotations, DELETION_COST: "-5"}})])

    async def cost() -> str | None:
        pod = await api.request("GET", f"/api/v1/namespaces/{group}/pods/web-0")
        return (pod["metadata"].get("annotations") or {}).get(DELETION_COST)
    assert await wait_until("the deletion cost on the pod", cost) == "-5"


def _fields(record: Any) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(record, f.name) for f in fields(record) if f.init}


async def test_the_bridge_killed_and_restarted_loses_nothing_and_binds_nothing_twice(
        api: KubeApi, bridge: BridgeProcess, bootstrap: str) -> None:
    group = unique("crash")
    await cluster(api, group, [kwok_node(f"{group}-{i}", group, cpu="16") for i in range(4)])
    async with Harness(bootstrap) as h:
        first = await create_all(api, f"/api/v1/namespaces/{group}/pods",
                                 [pod_manifest(f"a-{i}", group, group, cpu="500m") for i in range(60)])
        await bound(api, group, 10)
        bridge.kill()
        second = await create_all(api, f"/api/v1/namespaces/{group}/pods",  # while no bridge runs
                                  [pod_manifest(f"b-{i}", group, group, cpu="500m") for i in range(60)])
        await api.request("DELETE", f"/api/v1/namespaces/{group}/pods/a-59")
        bridge.start()
        placed = await bound(api, group, 119, timeout=180)
        deleted = first[-1]["metadata"]["uid"]
        uids = {p["metadata"]["uid"] for p in first + second} - {deleted}
        assert uids <= {p["metadata"]["uid"] for p in placed}
        no_pod_bound_twice(h, uids | {deleted})
        per_node = Counter(p["spec"]["nodeName"] for p in placed if p["metadata"]["uid"] != deleted)
        assert all(n * 500 <= 16000 for n in per_node.values()), per_node


async def test_the_bridge_runs_with_least_privilege_and_a_verb_not_granted_is_refused(
        api: KubeApi, bridge_kubeconfig: Path) -> None:
    """Every test here runs the bridge as its service account under RBAC (infra/k8s/rbac.yaml);
    with the same token, what the manifest does not grant is refused (403)."""
    group = unique("rbac")
    await create_namespace(api, group)
    async with await KubeApi.connect(str(bridge_kubeconfig)) as limited:
        await limited.request("GET", "/api/v1/pods", params={"limit": 1})  # granted: list pods
        refused = [
            ("PUT", f"/api/v1/namespaces/{group}/pods/anything", pod_manifest("anything", group, group)),
            ("DELETE", "/api/v1/nodes/anything", None),
            ("POST", f"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{group}/sandboxwarmpools",
             {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
              "metadata": {"name": "x"}, "spec": {"sandboxTemplateRef": {"name": "x"}}}),
            ("DELETE", f"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{group}/sandboxwarmpools/x", None),
            ("PATCH", f"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{group}/sandboxtemplates/x", {}),
            ("GET", "/api/v1/namespaces/kube-system/secrets", None),
            ("POST", f"/apis/coordination.k8s.io/v1/namespaces/{group}/leases",
             {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "x"}}),
        ]
        for method, path, body in refused:
            with pytest.raises(KubeError) as caught:
                await limited.request(method, path, body=body)
            assert caught.value.status == 403, (method, path, caught.value)


async def test_a_watch_whose_version_was_compacted_away_lists_again(tmp_path: Path) -> None:
    """410 Gone: a watch resumed from a resourceVersion that etcd compacted away (the API
    server's watch cache off, compaction every second) is answered 410; the reflector lists
    again, and what was deleted meanwhile is reported deleted."""
    args = ("--watch-cache=false", "--etcd-compaction-interval=1s")
    async with ControlPlane(tmp_path / "k8s", kwok=False, crds=False, apiserver_args=args) as cp, cp.api() as api:
        await create_namespace(api, "gone")
        await create_all(api, "/api/v1/namespaces/gone/pods", [pod_manifest(f"p{i}", "gone", "g") for i in range(3)])
        mirror = Mirror(frozenset({"koordstream"}))
        published: list[Any] = []

        async def on_list(items: list[dict[str, Any]]) -> None:
            published.extend(o.record for o in mirror.relisted(POD, items))

        async def on_events(events: list[tuple[str, dict[str, Any]]]) -> None:
            published.extend(o.record for e, obj in events for o in mirror.apply(POD, e, obj))

        reflector = Reflector(api, "/api/v1/namespaces/gone/pods", on_list, on_events, timeout_s=5)
        items, reflector.resource_version = await reflector.list()
        await on_list(items)
        assert len([r for r in published if isinstance(r, Pod)]) == 3
        await api.request("DELETE", "/api/v1/namespaces/gone/pods/p0", params={"gracePeriodSeconds": 0})
        for i in range(3, 6):  # newer revisions, so that the one the reflector holds is compacted
            await api.request("POST", "/api/v1/namespaces/gone/pods", body=pod_manifest(f"p{i}", "gone", "g"))
        await asyncio.sleep(3.5)
        task = asyncio.create_task(reflector.run())
        try:
            await wait_until("a relist", lambda: _true(reflector.relists >= 1 and len(mirror.pods) == 5))
        finally:
            task.cancel()
        assert reflector.errors >= 1, "the watch was not answered 410"
        assert [r.name for r in published if isinstance(r, PodDeleted)] == ["p0"]
        assert sorted(mirror.known[POD]) == sorted(s for s in mirror.pods)


async def _true(value: bool) -> bool:
    return value


@pytest.mark.e2e
async def test_a_thousand_pods_from_manifests_are_bound_once_each_through_the_api_server(
        api: KubeApi, bridge: BridgeProcess, bootstrap: str) -> None:
    """Issue 29's run: Kwok nodes, 1,000 pods as `kubectl` creates them (GPU shares, gangs, a
    reservation's owner, plain pods, some that fit nowhere), the bridge killed -9 half way and
    started again, a budget's refusal on the way: every pod that fits bound once, read back from
    the API server, with its annotations; the others carry kube-scheduler's condition."""
    group = unique("thousand")
    nodes = [kwok_node(f"{group}-gpu-{i}", group, cpu="64", memory="512Gi", gpus=8) for i in range(4)]
    nodes += [kwok_node(f"{group}-cpu-{i}", group, cpu="32", memory="128Gi") for i in range(16)]
    await cluster(api, group, nodes)
    gpu = {"koordinator.sh/gpu-core": "25", "koordinator.sh/gpu-memory-ratio": "25"}
    manifests = [pod_manifest(f"plain-{i}", group, group, cpu="500m") for i in range(800)]
    manifests += [pod_manifest(f"gpu-{i}", group, group, extra=gpu) for i in range(100)]
    for g in range(20):
        gang = {GANG_NAME_ANNOTATION: f"gang-{g}", GANG_MIN_AVAILABLE_ANNOTATION: "4"}
        manifests += [pod_manifest(f"gang-{g}-{i}", group, group, annotations=gang) for i in range(4)]
    manifests += [pod_manifest(f"huge-{i}", group, group, cpu="100") for i in range(19)]  # fits nowhere
    manifests.append(pod_manifest("owner", group, group, cpu="2", labels={"reserved-for": group}))
    template = pod_manifest("tpl", group, group, cpu="2")
    await api.request("POST", "/apis/scheduling.koordinator.sh/v1alpha1/reservations", body={
        "apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation", "metadata": {"name": group},
        "spec": {"template": {"metadata": {"namespace": group}, "spec": template["spec"]},
                 "owners": [{"labelSelector": {"matchLabels": {"reserved-for": group}}}], "ttl": "1h"}})
    assert len(manifests) == 1000
    async with Harness(bootstrap) as h:
        created = await create_all(api, f"/api/v1/namespaces/{group}/pods", manifests[:500])
        await bound(api, group, 100)
        bridge.kill()
        created += await create_all(api, f"/api/v1/namespaces/{group}/pods", manifests[500:])
        bridge.start()
        placed = await bound(api, group, 981, timeout=300)
        fits = {p["metadata"]["uid"] for p in created if not p["metadata"]["name"].startswith("huge-")}
        assert fits <= {p["metadata"]["uid"] for p in placed}
        no_pod_bound_twice(h, fits)
        for pod in placed:
            annotations = pod["metadata"].get("annotations") or {}
            assert annotations[HOLD_ANNOTATION].endswith("/" + pod["spec"]["nodeName"])
            assert not pod["metadata"]["name"].startswith("gpu-") or DEVICE_ALLOCATED in annotations

        async def conditions() -> list[dict[str, Any]] | None:
            huge = [condition(p, "PodScheduled") for p in await pods(api, group) if p["metadata"]["name"].startswith("huge-")]
            return huge if all(c and c["status"] == "False" for c in huge) else None
        for found in await wait_until("the huge pods' conditions", conditions):
            assert found["message"].startswith("0/") and "Insufficient cpu" in found["message"]
