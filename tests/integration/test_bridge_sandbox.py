"""agent-sandbox's warm pools through the bridge, against the real control plane (`make k8s`,
agent-sandbox's CRDs from `make agent-sandbox-crds`), the session's broker and worker: a
SandboxTemplate and a SandboxWarmPool created as custom resources fill the pool with real pods
(created by the bridge, bound by koordstream through `pods/binding`, run by Kwok); each
SandboxClaim is answered in its status (Ready with a sandbox of its own, its name in
`status.sandbox.name` and in the annotation `agents.x-k8s.io/sandbox-name`); a claim deleted
takes its pod with it and the pool refills; a claim of a pool that does not exist is Ready=False
naming `spec.warmPoolRef.name`; a template changed is a pool updated (Recreate); an answer is
never written onto a claim made again under its name; and the bridge killed -9 while the pool
fills loses no sandbox and makes none twice.

Each test has its own namespace and Kwok nodes (labelled and tainted for its pods only, as in
test_bridge.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from schemas import topics
from schemas.agent_sandbox import REFILL_BATCH_ANNOTATION, REFILL_RATE_ANNOTATION
from schemas.records import SANDBOX_NAME_ANNOTATION, SANDBOX_POOL_LABEL, Binding, SandboxClaimStatus
from streams.bridge.actuator import Actuator
from streams.bridge.sandboxes import API_VERSION, UID_ANNOTATION, claims_path, pools_path
from streams.kube_cluster import ControlPlane
from streams.kubeapi import KubeApi, KubeError
from tests.integration.conftest import BridgeProcess
from tests.integration.harness import Harness
from tests.integration.kube import (
    TEST_TAINT,
    create_all,
    create_namespace,
    kwok_node,
    no_pod_bound_twice,
    nodes_ready,
    pods,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

BASE = f"/apis/{API_VERSION}"


@pytest.fixture
async def api(control_plane: ControlPlane, bridge: BridgeProcess) -> Any:
    assert bridge.alive(), f"the bridge died: {bridge.log.read_text()[-3000:]}"
    async with control_plane.api() as client:
        yield client


async def cluster(api: KubeApi, group: str, nodes: int = 3) -> None:
    manifests = [kwok_node(f"{group}-{i}", group, cpu="16", memory="64Gi") for i in range(nodes)]
    await create_namespace(api, group)
    await create_all(api, "/api/v1/nodes", manifests)
    await wait_until("Kwok to make the nodes Ready", lambda: nodes_ready(api, [n["metadata"]["name"] for n in manifests]))


def template(group: str, name: str = "py", labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A SandboxTemplate whose pods are koordstream's and go to `group`'s Kwok nodes only."""
    return {"apiVersion": API_VERSION, "kind": "SandboxTemplate", "metadata": {"name": name, "namespace": group},
            "spec": {"podTemplate": {
                "metadata": {"labels": {"app": group, **(labels or {})}},
                "spec": {"schedulerName": "koordstream", "nodeSelector": {"koordstream.io/group": group},
                         "tolerations": [{"key": TEST_TAINT, "operator": "Equal", "value": group,
                                          "effect": "NoSchedule"}],
                         "containers": [{"name": "runtime", "image": "registry.k8s.io/pause:3.10",
                                         "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}}}


def warm_pool(group: str, replicas: int, name: str = "pool", strategy: str = "OnReplenish") -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "SandboxWarmPool", "metadata": {"name": name, "namespace": group},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "py"}, "updateStrategy": {"type": strategy}}}


def claim(group: str, name: str, pool: str = "pool") -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "SandboxClaim", "metadata": {"name": name, "namespace": group},
            "spec": {"warmPoolRef": {"name": pool}}}


async def create(api: KubeApi, group: str, plural: str, body: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = await api.request("POST", f"{BASE}/namespaces/{group}/{plural}", body=body)
    return created


async def sandbox_pods(api: KubeApi, group: str) -> list[dict[str, Any]]:
    return [p for p in await pods(api, group) if UID_ANNOTATION in (p["metadata"].get("annotations") or {})]


def running(pod: dict[str, Any]) -> bool:
    return bool(pod["spec"].get("nodeName")) and (pod.get("status") or {}).get("phase") == "Running" \
        and not pod["metadata"].get("deletionTimestamp")


async def pool_running(api: KubeApi, group: str, count: int, timeout: float = 90.0) -> list[dict[str, Any]]:
    """Wait until `count` sandbox pods of the namespace run (bound to its Kwok nodes) and none other is there."""
    async def check() -> list[dict[str, Any]] | None:
        found = await sandbox_pods(api, group)
        return found if len(found) == count and all(running(p) for p in found) else None
    result: list[dict[str, Any]] = await wait_until(f"{count} sandbox pods of {group} running", check, timeout)
    return result


def ready_condition(obj: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), None)


async def pool_status(api: KubeApi, group: str, where: Callable[[dict[str, Any]], bool],
                      timeout: float = 60.0) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        status: dict[str, Any] = (await api.request("GET", pools_path(group, "pool"))).get("status") or {}
        return status if where(status) else None
    result: dict[str, Any] = await wait_until(f"pool of {group}: its status", check, timeout)
    return result


async def answered(api: KubeApi, group: str, name: str, status: str = "True", timeout: float = 60.0) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        got: dict[str, Any] = await api.request("GET", claims_path(group, name))
        found = ready_condition(got)
        return got if found is not None and found["status"] == status else None
    result: dict[str, Any] = await wait_until(f"claim {name} Ready={status}", check, timeout)
    return result


async def gone(api: KubeApi, path: str) -> bool:
    try:
        await api.request("GET", path)
    except KubeError as exc:
        if exc.status == 404:
            return True
        raise
    return False


async def test_a_warm_pool_fills_with_real_pods_and_each_claim_gets_one_of_its_own(api: KubeApi) -> None:
    group = unique("swp")
    await cluster(api, group)
    await create(api, group, "sandboxtemplates", template(group))
    made = await create(api, group, "sandboxwarmpools", warm_pool(group, 6))
    filled = await pool_running(api, group, 6)
    # The pool's status, as agent-sandbox's controller keeps it (`kubectl get` shows readyReplicas).
    status = await pool_status(api, group, lambda s: s.get("readyReplicas") == 6)
    assert status == {"replicas": 6, "readyReplicas": 6, "selector": f"{SANDBOX_POOL_LABEL}=pool",
                      "observedGeneration": made["metadata"]["generation"]}
    for pod in filled:
        uid = pod["metadata"]["annotations"][UID_ANNOTATION]
        assert uid.startswith(f"sbx~{group}~pool~") and pod["metadata"]["labels"][SANDBOX_POOL_LABEL] == "pool"
        assert pod["spec"]["nodeName"].startswith(f"{group}-")
        assert pod["spec"]["containers"][0]["image"] == "registry.k8s.io/pause:3.10"  # the template's spec
        assert pod["metadata"]["annotations"]["koordstream.io/hold-id"].startswith(uid)

    labelled = claim(group, "c3")
    labelled["spec"]["additionalPodMetadata"] = {"labels": {"team": "x"}, "annotations": {"trace": "t1"}}
    await asyncio.gather(*(create(api, group, "sandboxclaims", claim(group, f"c{i}")) for i in range(3)),
                         create(api, group, "sandboxclaims", labelled))
    claims = [await answered(api, group, f"c{i}") for i in range(4)]
    names = [c["status"]["sandbox"]["name"] for c in claims]
    assert len(set(names)) == 4, names  # a sandbox of its own
    assert all(c["metadata"]["annotations"][SANDBOX_NAME_ANNOTATION] == c["status"]["sandbox"]["name"] for c in claims)
    assert {p["metadata"]["name"] for p in filled} >= set(names)  # warm: the pool's ready pods, no new start

    async def claim_metadata() -> dict[str, Any] | None:  # agent-sandbox's additionalPodMetadata, onto the pod
        meta: dict[str, Any] = (await api.request("GET", f"/api/v1/namespaces/{group}/pods/{names[3]}"))["metadata"]
        return meta if meta["labels"].get("team") == "x" and meta["annotations"].get("trace") == "t1" else None
    adopted = await wait_until("c3's metadata on its sandbox pod", claim_metadata, 30)
    condition = ready_condition(claims[3])
    assert condition is not None and condition["observedGeneration"] == claims[3]["metadata"]["generation"]

    async def claim_ips() -> list[str] | None:  # the sandbox pod's IPs (Kwok's), on the claim's status
        got = await api.request("GET", claims_path(group, "c0"))
        return got["status"]["sandbox"].get("podIPs") or None
    pod0 = await api.request("GET", f"/api/v1/namespaces/{group}/pods/{names[0]}")
    assert await wait_until("c0's podIPs", claim_ips, 30) == [pod0["status"]["podIP"]]
    assert adopted["labels"][SANDBOX_POOL_LABEL] == "pool" and UID_ANNOTATION in adopted["annotations"]
    others = [p for p in await sandbox_pods(api, group) if p["metadata"]["name"] in names[:3]]
    assert len(others) == 3 and not any("team" in p["metadata"]["labels"] for p in others)
    # The pool refills its 4 claimed sandboxes: 6 unclaimed again, 10 in all.
    await pool_running(api, group, 10)
    await pool_status(api, group, lambda s: s.get("readyReplicas") == 6 and s.get("replicas") == 6)
    assert (await api.request("GET", pools_path(group, "pool")))["metadata"]["uid"] == made["metadata"]["uid"]

    # A claim deleted: its pod goes, the others stay.
    await api.request("DELETE", claims_path(group, "c0"))
    await wait_until("c0's pod deleted", lambda: gone(api, f"/api/v1/namespaces/{group}/pods/{names[0]}"))
    left = await pool_running(api, group, 9)
    assert set(names[1:]) <= {p["metadata"]["name"] for p in left}

    # A claim of a pool that is not there: refused, naming the field.
    await create(api, group, "sandboxclaims", claim(group, "lost", pool="nope"))
    lost = ready_condition(await answered(api, group, "lost", status="False"))
    assert lost is not None and lost["reason"] == "WarmPoolNotFound", lost
    assert "spec.warmPoolRef.name" in lost["message"], lost

    # A claim whose shutdown time passes under the Delete policy: its sandbox and the claim go.
    soon = datetime.datetime.fromtimestamp(time.time() + 3, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    brief = claim(group, "brief")
    brief["spec"]["lifecycle"] = {"shutdownTime": soon, "shutdownPolicy": "Delete"}
    await create(api, group, "sandboxclaims", brief)
    sandbox = (await answered(api, group, "brief"))["status"]["sandbox"]["name"]
    await wait_until("the brief claim deleted", lambda: gone(api, claims_path(group, "brief")))
    await wait_until("its pod deleted", lambda: gone(api, f"/api/v1/namespaces/{group}/pods/{sandbox}"))


async def test_a_template_changed_recreates_the_pools_sandboxes_and_a_pool_deleted_takes_its_unclaimed_ones(
        api: KubeApi) -> None:
    group = unique("swt")
    await cluster(api, group, nodes=2)
    await create(api, group, "sandboxtemplates", template(group))
    await create(api, group, "sandboxwarmpools", warm_pool(group, 3, strategy="Recreate"))
    first = {p["metadata"]["name"] for p in await pool_running(api, group, 3)}
    await create(api, group, "sandboxclaims", claim(group, "kept"))
    kept = (await answered(api, group, "kept"))["status"]["sandbox"]["name"]
    await pool_running(api, group, 4)

    changed = template(group, labels={"revision": "2"})
    current = await api.request("GET", f"{BASE}/namespaces/{group}/sandboxtemplates/py")
    changed["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    await api.request("PUT", f"{BASE}/namespaces/{group}/sandboxtemplates/py", body=changed)

    async def recreated() -> list[dict[str, Any]] | None:
        found = await sandbox_pods(api, group)
        unclaimed = [p for p in found if p["metadata"]["name"] != kept]
        ok = len(unclaimed) == 3 and all(running(p) and p["metadata"]["labels"].get("revision") == "2"
                                         for p in unclaimed)
        return found if ok and any(p["metadata"]["name"] == kept for p in found) else None
    found = await wait_until("the pool's unclaimed sandboxes made again from the new template", recreated)
    assert not first & {p["metadata"]["name"] for p in found if p["metadata"]["name"] != kept}

    await api.request("DELETE", f"{BASE}/namespaces/{group}/sandboxwarmpools/pool")
    left = await pool_running(api, group, 1)
    assert [p["metadata"]["name"] for p in left] == [kept]  # a claimed sandbox stays with its claim


async def test_a_claims_answer_is_never_written_onto_a_claim_made_again_under_its_name(api: KubeApi) -> None:
    """The answer to a claim that was deleted and made again (another uid) under its name: its
    uid is the precondition of both writes, the status's too (a merge patch of `/status` drops
    the uid it carries and writes anyway)."""
    group = unique("swu")
    await create_namespace(api, group)
    made = await create(api, group, "sandboxclaims", claim(group, "c", pool="elsewhere"))
    stale = SandboxClaimStatus(uid="an-older-claim", namespace=group, name="c", warm_pool="elsewhere",
                               phase="Ready", sandbox="elsewhere-0", node="n1")
    await Actuator(api).claim_status(stale)
    got = await api.request("GET", claims_path(group, "c"))
    assert SANDBOX_NAME_ANNOTATION not in (got["metadata"].get("annotations") or {})
    assert "sandbox" not in (got.get("status") or {}) and (ready_condition(got) or {}).get("status") != "True"
    await Actuator(api).claim_status(dataclasses.replace(stale, uid=made["metadata"]["uid"]))
    got = await api.request("GET", claims_path(group, "c"))
    assert got["metadata"]["annotations"][SANDBOX_NAME_ANNOTATION] == "elsewhere-0"


async def test_the_bridge_killed_while_a_pool_fills_loses_no_sandbox_and_makes_none_twice(
        api: KubeApi, bridge: BridgeProcess, bootstrap: str) -> None:
    """The pool refills 8 a second, so the bridge is killed -9 with pods published, created,
    bound and running in between; its successor (after the Lease expires) creates and binds the
    rest, recognises what was done, and answers a claim."""
    group = unique("swk")
    await cluster(api, group)
    await create(api, group, "sandboxtemplates", template(group))
    pool = warm_pool(group, 40)
    pool["metadata"]["annotations"] = {REFILL_RATE_ANNOTATION: "8", REFILL_BATCH_ANNOTATION: "4"}
    async with Harness(bootstrap) as h:
        await create(api, group, "sandboxwarmpools", pool)
        await wait_until("the pool's first pods", lambda: _at_least(sandbox_pods(api, group), 6))
        bridge.kill()
        await asyncio.sleep(2.0)  # the pool publishes more pods meanwhile
        bridge.start()
        filled = await pool_running(api, group, 40, timeout=180)
        uids = Counter(p["metadata"]["annotations"][UID_ANNOTATION] for p in filled)
        assert len(uids) == 40 and set(uids.values()) == {1}
        await h.wait_for(Binding, lambda b: b.uid in uids, count=40, topic=topics.BINDINGS, distinct=lambda b: b.uid)
        no_pod_bound_twice(h, set(uids))
    await create(api, group, "sandboxclaims", claim(group, "after"))
    assert (await answered(api, group, "after"))["status"]["sandbox"]["name"]


async def _at_least(found: Any, count: int) -> bool:
    return len(await found) >= count


async def test_claim_latency_from_creation_to_ready(api: KubeApi) -> None:
    """50 claims, one every 20 ms, on a pool of 60: the time from each claim's creation (the
    POST sent) to its Ready condition seen by a watch. Printed; a loose bound asserted (the
    2-core machine is shared)."""
    group = unique("swl")
    await cluster(api, group)
    await create(api, group, "sandboxtemplates", template(group))
    await create(api, group, "sandboxwarmpools", warm_pool(group, 60))
    await pool_running(api, group, 60, timeout=120)
    listing = await api.request("GET", claims_path(group))
    sent: dict[str, float] = {}
    ready: dict[str, float] = {}

    async def watch() -> None:
        version = listing["metadata"]["resourceVersion"]
        while len(ready) < 50:
            async for event in api.watch(claims_path(group), {"resourceVersion": version, "timeoutSeconds": 60}):
                obj = event.get("object") or {}
                version = (obj.get("metadata") or {}).get("resourceVersion", version)
                found = ready_condition(obj)
                name = (obj.get("metadata") or {}).get("name", "")
                if found is not None and found["status"] == "True" and name not in ready:
                    ready[name] = time.monotonic()
                if len(ready) >= 50:
                    return

    watcher = asyncio.create_task(watch())

    async def one(i: int) -> None:
        await asyncio.sleep(i * 0.02)
        sent[f"l{i}"] = time.monotonic()
        await create(api, group, "sandboxclaims", claim(group, f"l{i}"))

    await asyncio.gather(*(one(i) for i in range(50)))
    await asyncio.wait_for(watcher, 60)
    latencies = sorted((ready[n] - sent[n]) * 1000 for n in sent)
    p50, p99 = statistics.median(latencies), latencies[int(0.99 * (len(latencies) - 1))]
    print(f"\nclaim latency (creation -> Ready seen), 50 claims: p50 {p50:.0f} ms, p99 {p99:.0f} ms, "
          f"max {latencies[-1]:.0f} ms")
    assert p99 < 10_000, latencies


class _Slowed:
    """The real API server, a claim's Ready status write held until `gate` opens (a slow answer)."""

    def __init__(self, api: KubeApi) -> None:
        self.api, self.gate = api, asyncio.Event()
        self.gate.set()

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        body = kw.get("body")
        if path.endswith("/status") and isinstance(body, list) and \
                body[1]["value"]["conditions"][0]["reason"] == "SandboxReady":
            await self.gate.wait()
        return await self.api.request(method, path, **kw)


async def test_a_claims_ready_status_written_again_for_its_ips_never_lands_after_a_later_answer(
        control_plane: ControlPlane) -> None:
    """The claim's Ready answer is written again when its pod's IPs change (from the pods'
    watch), while the pool's next answer (Expired) is written from the sandbox-status consumer:
    one write of a claim at a time, and the Ready one is dropped once a later answer came."""
    group = unique("sip")
    async with control_plane.api() as real:
        await create_namespace(real, group)
        made = await create(real, group, "sandboxclaims", claim(group, "c"))
        uid = made["metadata"]["uid"]
        api = _Slowed(real)
        ips = {"sbx": ("10.0.0.1",)}
        actuator = Actuator(api, pod_ips=lambda u: ips.get(u, ()))  # type: ignore[arg-type]
        ready = SandboxClaimStatus(uid=uid, namespace=group, name="c", warm_pool="pool", phase="Ready",
                                   sandbox="pool-0", pod_uid="sbx", node="n1")
        await actuator.claim_status(ready)
        ips["sbx"] = ("10.0.0.2",)
        api.gate.clear()
        again = asyncio.create_task(actuator.sandbox_ips("sbx"))  # held at the API server's door
        await asyncio.sleep(0.05)
        expired = dataclasses.replace(ready, phase="Expired", message="its shutdown time passed")
        later = asyncio.create_task(actuator.claim_status(expired))
        await asyncio.sleep(0.05)
        api.gate.set()
        await asyncio.gather(again, later)
        got = ready_condition(await real.request("GET", claims_path(group, "c")))
        assert got is not None and got["reason"] == "ClaimExpired", got
        assert "sbx" not in actuator.answers  # nothing to write again for it
