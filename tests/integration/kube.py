"""Helpers for the bridge's tests against the real control plane: Kwok nodes, pod manifests as
`kubectl` would send them, and waiting on the API server's view."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from schemas.records import Binding, Taint
from streams.kube_cluster import kwok_node as cluster_node
from streams.kubeapi import KubeApi, KubeError
from tests.integration.harness import Harness

TEST_TAINT = "koordstream.io/bridge-test"  # keeps the other tests' pods (published on the topics) off Kwok's nodes


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def kwok_node(name: str, group: str, cpu: str = "8", memory: str = "32Gi", gpus: int = 0, pods: str = "110",
              labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A node for Kwok to manage (`streams.kube_cluster.kwok_node`), labelled with the test's
    group and tainted so that only the test's pods (which tolerate it) land there."""
    return cluster_node(name, cpu=cpu, memory=memory, pods=pods, gpus=gpus,
                        labels={"koordstream.io/group": group, **(labels or {})},
                        taints=(Taint(TEST_TAINT, group, "NoSchedule"),))


def pod_manifest(name: str, namespace: str, group: str, cpu: str = "1", memory: str = "1Gi",
                 scheduler: str = "koordstream", extra: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
                 owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Pod as `kubectl apply` sends it: for `group`'s nodes only (selector and toleration).
    `extra`: extended resources (requests equal limits, as the API server requires)."""
    requests = {"cpu": cpu, "memory": memory, **(extra or {})}
    limits = dict(extra or {})
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {"app": group, **(labels or {})},
                            "annotations": dict(annotations or {})}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"schedulerName": scheduler, "nodeSelector": {"koordstream.io/group": group},
                     "tolerations": [{"key": TEST_TAINT, "operator": "Equal", "value": group, "effect": "NoSchedule"}],
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": requests, **({"limits": limits} if limits else {})}}]}}


async def create_namespace(api: KubeApi, name: str) -> None:
    try:
        await api.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                               "metadata": {"name": name}})
    except KubeError as exc:
        if exc.status != 409:
            raise


async def create_all(api: KubeApi, path: str, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = await asyncio.gather(*(api.request("POST", path, body=o) for o in objects))
    return out


async def pods(api: KubeApi, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await api.request("GET", f"/api/v1/namespaces/{namespace}/pods"))["items"]
    return items


async def wait_until(what: str, check: Callable[[], Any], timeout: float = 90.0, every: float = 0.25) -> Any:
    """Poll the async `check` until it returns something true; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f}s for {what}; last: {value!r}")
        await asyncio.sleep(every)


async def nodes_ready(api: KubeApi, names: list[str]) -> bool:
    for name in names:
        node = await api.request("GET", f"/api/v1/nodes/{name}")
        conditions = {c["type"]: c["status"] for c in (node.get("status") or {}).get("conditions") or []}
        if conditions.get("Ready") != "True":
            return False
    return True


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def no_pod_bound_twice(h: Harness, uids: set[str]) -> None:
    """Each pod has one Binding target on the topic (a Binding sent again names the same node)."""
    targets: dict[str, set[str]] = {}
    for b in h.seen(Binding, lambda b: b.uid in uids):
        targets.setdefault(b.uid, set()).add(b.node)
    assert {u: n for u, n in targets.items() if len(n) > 1} == {}
