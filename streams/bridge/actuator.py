"""koordstream's decisions as Kubernetes API calls: the one place where the bridge writes.

- **Binding** -> `POST pods/<name>/binding` with a UID precondition. The Binding object carries
  the device and NUMA results (`scheduling.koordinator.sh/device-allocated`, `resource-status`)
  and the hold id (`koordstream.io/hold-id`) as annotations: the API server writes them onto
  the pod in the same update that sets its node, so a kubelet never sees the node without
  the allocation (where patching first and binding second would leave a window between two
  writes). The API server is the final truth: a Binding it refuses (the pod is gone, another
  pod has its name, or it is already bound elsewhere) is reported to the node's owner as
  `PodTerminated` (reason "binding refused by the API server: ..."), which frees the hold's
  capacity (and its quota); a pod bound elsewhere is then counted on that node by the mirror.
  A Binding already carried out (delivered again after a crash: the pod runs on that node with
  that hold id) is done. Every other failure (the server unreachable, 5xx, 429, and also 401,
  403 or a webhook's denial) is retried with back-off for as long as it takes, the batch
  waiting, unless the pod can never run: gone, being deleted, or its namespace being deleted
  (a 403 of NamespaceLifecycle). A Binding is never dropped while its pod may still run (a
  refusal tombstones the pod at its node, and nothing would ever schedule it again).
- **EvictionCommand** -> `policy/v1` Eviction (with the pod's UID as precondition), or, for a
  preemption's victims (`preemptor_uid`), a deletion, as kube-scheduler deletes victims. A 429
  (a PodDisruptionBudget) is retried with back-off for up to `eviction_retry_s`, then reported
  as `EvictionRefused` on `evictions`, which ends the rebalancer's job; a pod already gone is
  done.
- **SchedulingFeedback** -> the pod's `PodScheduled=False` condition (reason Unschedulable and
  kube-scheduler's message, `0/N nodes are available: ...`) and a `FailedScheduling` Warning
  Event; written when the message changes, not on every attempt.
- **Pod-deletion cost**: a Pod record (from the rebalancer) whose
  `controller.kubernetes.io/pod-deletion-cost` differs from the live pod's is patched onto it.
- **ReservationEvent** -> the Reservation's status (phase, node, current owners, allocated),
  for reservations that exist in the API server.
- **Sandbox pods** (`streams.bridge.sandboxes`): a pool's pod is created (`create_sandbox`; one
  already there with its `koordstream.io/uid` is done; one of an older pod of the name being
  deleted is waited for) and deleted (`delete_sandbox`, with the API server's uid as
  precondition). A sandbox pod's uid in koordstream is not the API server's: every call with a
  UID precondition (a Binding, an eviction) and every Event about a pod takes the API server's
  (`api_uid`, the mirror's map).
- **SandboxClaimStatus** -> the claim's annotation `agents.x-k8s.io/sandbox-name` (a merge
  patch) and its `status` (`Ready` condition, `sandbox.name`: a JSON patch), each with the
  claim's uid as precondition (a claim made again under the name is not written); written when
  the answer changes. A live claim answered `Deleted` (its shutdown time passed under the
  `Delete` policy: a claim deleted or replaced is no longer live) is then deleted, its uid as
  precondition.
- **SandboxPoolStatus** -> the pool's `status` (`replicas`, `readyReplicas`, `selector`: a JSON
  patch with the pool's uid as precondition); written when those change.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.ports import Output
from agents.rebalance.binpack import DELETION_COST
from agents.sandbox.pool import DELETED as CLAIM_DELETED
from agents.sandbox.pool import READY_PHASE
from schemas import topics
from schemas.quantity import format_canonical
from schemas.records import (
    Binding,
    EvictionCommand,
    EvictionRefused,
    Pod,
    PodTerminated,
    ReservationEvent,
    SandboxClaimStatus,
    SandboxPoolStatus,
    SchedulingFeedback,
)
from streams.bridge.mirror import HOLD_ANNOTATION
from streams.bridge.sandboxes import (
    UID_ANNOTATION,
    claim_annotation_patch,
    claim_status_patch,
    claims_path,
    pool_status_patch,
    pools_path,
)
from streams.kubeapi import JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, KubeApi, KubeError

log = logging.getLogger("koordstream.bridge")

REFUSED = "binding refused by the API server"
COMPONENT = "koordstream"
RESERVATIONS = "/apis/scheduling.koordinator.sh/v1alpha1/reservations"
PHASES = {"Available": "Available", "Succeeded": "Succeeded", "Failed": "Failed", "Deleted": "Failed"}


def _now_rfc3339(clock: Callable[[], float]) -> str:
    return datetime.datetime.fromtimestamp(clock(), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_rfc3339(clock: Callable[[], float]) -> str:
    return datetime.datetime.fromtimestamp(clock(), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def binding_body(b: Binding, api_uid: str = "") -> dict[str, Any]:
    """The Binding of `b`'s pod, whose uid in the API server (its precondition) is `api_uid`
    (by default the Binding's)."""
    return {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": b.name, "namespace": b.namespace, "uid": api_uid or b.uid,
                         "annotations": {**b.annotations, HOLD_ANNOTATION: b.hold_id}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": b.node}}


def condition_patch(f: SchedulingFeedback, clock: Callable[[], float]) -> dict[str, Any]:
    return {"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable" if f.final or f.reasons else "SchedulerError",
        "message": f.message, "lastProbeTime": None, "lastTransitionTime": _now_rfc3339(clock)}]}}


def event_body(f: SchedulingFeedback, clock: Callable[[], float], instance: str, api_uid: str = "") -> dict[str, Any]:
    """A `FailedScheduling` Warning event about the pod (events.k8s.io/v1), as kube-scheduler
    records one (`api_uid`: the pod's uid in the API server, by default the feedback's)."""
    return {"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": f"{f.name}.{int(clock() * 1e9):x}", "namespace": f.namespace},
            "eventTime": _micro_rfc3339(clock), "reportingController": COMPONENT, "reportingInstance": instance,
            "action": "Scheduling", "reason": "FailedScheduling", "type": "Warning", "note": f.message[:1024],
            "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": f.namespace, "name": f.name,
                          "uid": api_uid or f.uid}}


def reservation_status(e: ReservationEvent) -> dict[str, Any]:
    owners = [{"uid": o.uid, "namespace": o.namespace, "name": o.name, "apiVersion": "v1", "kind": "Pod"}
              for o in e.current_owners]
    status: dict[str, Any] = {"phase": PHASES.get(e.phase, e.phase), "nodeName": e.node or None,
                              "allocated": {k: format_canonical(k, v) for k, v in e.allocated.items()} or None,
                              "currentOwners": owners or None}
    if e.reason:
        status["conditions"] = [{"type": "Ready" if e.phase == "Available" else "Scheduled",
                                 "status": "True" if e.phase == "Available" else "False",
                                 "reason": e.reason[:256], "message": e.reason}]
    return {"status": status}


@dataclass
class Actuator:
    """See the module docstring. `live_annotations(uid)` is the mirror's last view of a pod (its
    annotations), for the deletion costs; `api_uid(uid)` a pod's uid in the API server."""

    api: KubeApi
    clock: Callable[[], float] = time.time
    instance: str = "koordstream-bridge"
    eviction_retry_s: float = 60.0
    retry_initial_s: float = 0.2
    retry_max_s: float = 10.0
    events: bool = True
    live_annotations: Callable[[str], dict[str, str] | None] = lambda uid: None
    is_bound: Callable[[str], bool] = lambda uid: False  # the mirror's view: the pod has a node
    api_uid: Callable[[str], str] = lambda uid: uid
    pod_ips: Callable[[str], tuple[str, ...]] = lambda uid: ()  # a sandbox pod's IPs, as the mirror last saw them
    counts: dict[str, int] = field(default_factory=dict)
    bound: set[str] = field(default_factory=set)  # uids this bridge bound (feedback for them is late)
    _feedback: dict[str, str] = field(default_factory=dict)  # uid -> the message last written
    _claims: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # claim uid -> the answer last written
    _pools: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # ns/name -> (uid, status) last written
    _metadata: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # sandbox uid -> the patch last written
    answers: dict[str, SandboxClaimStatus] = field(default_factory=dict)  # sandbox uid -> its claim's Ready answer
    _claim_locks: dict[str, asyncio.Lock] = field(default_factory=dict)  # claim uid -> one write at a time

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    async def _retrying(self, what: str, call: Callable[[], Any], retry: Callable[[KubeError], bool],
                        deadline: float | None = None) -> Any:
        delay = self.retry_initial_s
        while True:
            try:
                return await call()
            except KubeError as exc:
                if not retry(exc) or (deadline is not None and time.monotonic() + delay > deadline):
                    raise
                self._count(f"{what}_retries")
                log.log(logging.INFO if _transient(exc) else logging.WARNING, "%s: %s; retrying in %.1f s",
                        what, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max_s)

    # -- bindings -----------------------------------------------------------------------------

    async def bind(self, b: Binding, api_uid: str = "") -> list[Output]:
        """Carry out one Binding (of the pod whose uid in the API server is `api_uid`: by
        default the mirror's); what to report (a refusal), else nothing."""
        path = pod_path(b.namespace, b.name)
        uid = api_uid or self.api_uid(b.uid)
        delay = self.retry_initial_s
        while True:
            try:
                await self._retrying("binding", lambda: self.api.request(
                    "POST", path + "/binding", body=binding_body(b, uid)), _transient)
                self._count("bound")
                self.bound.add(b.uid)
                return []
            except KubeError as exc:
                if exc.status == 404:
                    return self.refused(b, "the pod is gone")
                if exc.status == 409:
                    conflict = exc
                    break
                # Another answer (401 / 403 while the bridge's credentials or RBAC change, an
                # admission webhook's denial, ...): only the pod's own state may refuse the
                # Binding (a refusal tombstones the pod at its node: it is never scheduled
                # again); a pod that is there and may still run is bound later, not dropped.
                why = await self._unbindable(b, uid, exc)
                if why:
                    return self.refused(b, why)
                self._count("binding_retries")
                log.warning("binding of %s/%s to %s: %s; retrying in %.1f s", b.namespace, b.name, b.node, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max_s)
        try:  # 409: already bound (by us, before a crash?), being deleted, or another pod of that name
            pod = await self._retrying("binding", lambda: self.api.request("GET", path), _transient)
        except KubeError as exc:
            if exc.status == 404:
                return self.refused(b, "the pod is gone")
            raise
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if meta.get("uid") != uid:
            return self.refused(b, "the pod is gone (another pod has its name)")
        if spec.get("nodeName") == b.node and (meta.get("annotations") or {}).get(HOLD_ANNOTATION) == b.hold_id:
            self._count("bound_before")
            self.bound.add(b.uid)
            return []
        if not spec.get("nodeName"):  # (the API server refuses to bind a pod that is being deleted)
            return self.refused(b, f"{conflict.status} {conflict.reason}: {conflict.message}")
        return self.refused(b, f"the pod is bound to node {spec.get('nodeName')!r} already")

    async def _unbindable(self, b: Binding, uid: str, exc: KubeError) -> str:
        """Why the pod can never be bound, after an answer that is not the pod's own (see
        `bind`): its namespace is being deleted (NamespaceLifecycle refuses new content), or
        the pod is gone or being deleted; "" when it is there and may still run."""
        if exc.status == 403 and "being terminated" in exc.message:
            return f"its namespace is being deleted ({exc.message})"
        try:
            pod = await self._retrying("binding", lambda: self.api.request("GET", pod_path(b.namespace, b.name)),
                                       _transient)
        except KubeError as again:
            return "the pod is gone" if again.status == 404 else ""
        meta = pod.get("metadata") or {}
        if meta.get("uid") != uid:
            return "the pod is gone (another pod has its name)"
        if meta.get("deletionTimestamp"):
            return f"the pod is being deleted ({exc.status} {exc.reason}: {exc.message})"
        return ""

    def refused(self, b: Binding, why: str) -> list[Output]:
        """The report of a Binding that will never be carried out: the hold's capacity is freed."""
        self._count("binding_refused")
        log.warning("binding of %s/%s to %s refused: %s", b.namespace, b.name, b.node, why)
        return [Output(topics.NODE_INBOX, b.node, PodTerminated(uid=b.uid, node=b.node, decision_key=b.decision_key,
                                                                reason=f"{REFUSED}: {why}"))]

    # -- evictions ----------------------------------------------------------------------------

    async def evict(self, e: EvictionCommand) -> list[Output]:
        path = pod_path(e.namespace, e.name)
        uid = self.api_uid(e.uid)
        try:
            if e.preemptor_uid:  # preemption deletes its victims, as kube-scheduler does
                await self._retrying("deletion", lambda: self.api.request(
                    "DELETE", path, body={"preconditions": {"uid": uid}}), _transient)
            else:
                body = {"apiVersion": "policy/v1", "kind": "Eviction",
                        "metadata": {"name": e.name, "namespace": e.namespace},
                        "deleteOptions": {"preconditions": {"uid": uid}}}
                deadline = time.monotonic() + self.eviction_retry_s
                await self._retrying("eviction", lambda: self.api.request("POST", path + "/eviction", body=body),
                                     lambda exc: exc.status == 429 or _transient(exc), deadline)
            self._count("evicted")
            return []
        except KubeError as exc:
            if exc.status in (404, 409):  # gone, or another pod of that name: the pod went
                self._count("evicted_gone")
                return []
            self._count("eviction_refused")
            log.warning("eviction of %s/%s refused: %s", e.namespace, e.name, exc)
            return [Output(topics.EVICTIONS, e.uid, EvictionRefused(
                uid=e.uid, namespace=e.namespace, name=e.name, node=e.node, status=exc.status,
                reason=f"{exc.status} {exc.reason}: {exc.message}"))]

    # -- feedback, deletion costs, reservations -----------------------------------------------

    async def feedback(self, f: SchedulingFeedback) -> None:
        """Feedback of an attempt that came before the pod's Binding (the two arrive on separate
        topics) is not written: the binding set PodScheduled=True. One whose write crossed the
        binding is undone (the answer shows the pod's node)."""
        if self._feedback.get(f.uid) == f.message or not f.name or f.uid in self.bound or self.is_bound(f.uid):
            return
        path = pod_path(f.namespace, f.name)
        try:
            pod = await self._retrying("feedback", lambda: self.api.request(
                "PATCH", path + "/status", body=condition_patch(f, self.clock), content_type=STRATEGIC_PATCH),
                _transient)
            if ((pod or {}).get("spec") or {}).get("nodeName"):
                await self.api.request("PATCH", path + "/status", content_type=STRATEGIC_PATCH, body={"status": {
                    "conditions": [{"type": "PodScheduled", "status": "True", "reason": "", "message": "",
                                    "lastTransitionTime": _now_rfc3339(self.clock)}]}})
                return
            self._feedback[f.uid] = f.message
            self._count("feedback")
            if self.events:
                await self._retrying("event", lambda: self.api.request(
                    "POST", f"/apis/events.k8s.io/v1/namespaces/{f.namespace}/events",
                    body=event_body(f, self.clock, self.instance, self.api_uid(f.uid))), _transient)
        except KubeError as exc:
            if exc.status != 404:
                log.warning("feedback for %s/%s not written: %s", f.namespace, f.name, exc)

    def forget(self, uid: str) -> None:
        self._feedback.pop(uid, None)
        self.bound.discard(uid)
        self._claims.pop(uid, None)
        self._metadata.pop(uid, None)
        self.answers.pop(uid, None)
        self._claim_locks.pop(uid, None)

    # -- sandbox pods and claims -------------------------------------------------------------

    async def create_sandbox(self, uid: str, manifest: dict[str, Any], wait_s: float = 60.0) -> str:
        """Create a pool's sandbox pod; its uid in the API server, or "" when it cannot be made
        (its namespace gone or going, the manifest refused, its name held by another pod that
        is not being deleted, or an older one of the name still going after `wait_s`)."""
        meta = manifest["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods"
        deadline = time.monotonic() + wait_s
        delay = self.retry_initial_s
        while True:
            try:
                created = await self._retrying("sandbox_creation", lambda: self.api.request(
                    "POST", path, body=manifest), _transient)
                self._count("sandboxes_created")
                return str((created.get("metadata") or {}).get("uid", ""))
            except KubeError as exc:
                if exc.status != 409:
                    log.warning("sandbox pod %s/%s not created: %s", meta["namespace"], meta["name"], exc)
                    return ""
            try:  # 409: made before (a batch carried out again after a crash), or the name is taken
                pod = await self._retrying("sandbox_creation", lambda: self.api.request(
                    "GET", pod_path(meta["namespace"], meta["name"])), _transient)
            except KubeError as exc:
                if exc.status != 404:
                    raise
                continue  # gone in between: create it again
            found = pod.get("metadata") or {}
            if (found.get("annotations") or {}).get(UID_ANNOTATION) == uid:
                return str(found.get("uid", ""))
            if not found.get("deletionTimestamp") or time.monotonic() + delay > deadline:
                log.warning("sandbox pod %s/%s not created: another pod has the name", meta["namespace"], meta["name"])
                return ""
            await asyncio.sleep(delay)  # an older pod of the name is being deleted
            delay = min(delay * 2, self.retry_max_s)

    async def delete_sandbox(self, uid: str, namespace: str, name: str, api_uid: str = "") -> None:
        """Delete a pool's sandbox pod (its uid in the API server `api_uid`, else found by name
        and its `koordstream.io/uid`); one gone already is done."""
        path = pod_path(namespace, name)
        try:
            if not api_uid:
                pod = await self._retrying("sandbox_deletion", lambda: self.api.request("GET", path), _transient)
                found = pod.get("metadata") or {}
                if (found.get("annotations") or {}).get(UID_ANNOTATION) != uid:
                    return
                api_uid = str(found.get("uid", ""))
            await self._retrying("sandbox_deletion", lambda: self.api.request(
                "DELETE", path, body={"preconditions": {"uid": api_uid}}), _transient)
            self._count("sandboxes_deleted")
        except KubeError as exc:
            if exc.status not in (404, 409):  # gone, or another pod has the name now
                log.warning("sandbox pod %s/%s not deleted: %s", namespace, name, exc)

    async def sandbox_metadata(self, pod: Pod, api_uid: str, patch: dict[str, Any]) -> None:
        """Merge a sandbox pod's missing labels and annotations into it (`sandboxes.metadata_patch`);
        its `metadata.uid` keeps the write off another pod made under the name."""
        if self._metadata.get(pod.uid) == (api_uid, patch):
            return  # written already: the pod's change is still to be seen
        body = {"metadata": {**patch["metadata"], "uid": api_uid}}
        try:
            await self._retrying("sandbox_metadata", lambda: self.api.request(
                "PATCH", pod_path(pod.namespace, pod.name), body=body, content_type=MERGE_PATCH), _transient)
            self._metadata[pod.uid] = (api_uid, patch)
            self._count("sandbox_metadata")
        except KubeError as exc:
            if exc.status not in (404, 409, 422):  # gone, or another pod of the name
                log.warning("metadata of sandbox pod %s/%s not written: %s", pod.namespace, pod.name, exc)

    async def claim_status(self, s: SandboxClaimStatus, again: bool = False) -> None:
        """Write a pool's answer to a claim (see the module docstring); the annotation first, so
        that a reader who sees the claim Ready finds its sandbox's name on it too. One write of
        a claim at a time: its Ready answer written `again` for its pod's IPs (`sandbox_ips`,
        from another task) is skipped if a later answer came meanwhile."""
        lock = self._claim_locks.get(s.uid)
        if lock is None:
            lock = self._claim_locks[s.uid] = asyncio.Lock()
        async with lock:
            if again and self.answers.get(s.pod_uid) is not s:
                return
            await self._claim_status(s)

    async def _claim_status(self, s: SandboxClaimStatus) -> None:
        ready = bool(s.pod_uid) and s.phase == READY_PHASE
        ips = self.pod_ips(s.pod_uid) if ready else ()
        written = (s.phase, s.sandbox, s.node, s.reason, s.message, ips)
        if ready:
            self.answers[s.pod_uid] = s  # written again when its pod's IPs change (`sandbox_ips`)
        elif s.pod_uid and self.answers.get(s.pod_uid, s).uid == s.uid:
            self.answers.pop(s.pod_uid, None)
        before = self._claims.get(s.uid)
        if before == written:
            return
        path = claims_path(s.namespace, s.name)
        try:
            if s.sandbox and (before is None or before[1] != s.sandbox):  # (new IPs: the status only)
                await self._retrying("claim_status", lambda: self.api.request(
                    "PATCH", path, body=claim_annotation_patch(s), content_type=MERGE_PATCH), _transient)
            await self._retrying("claim_status", lambda: self.api.request(
                "PATCH", path + "/status", body=claim_status_patch(s, _now_rfc3339(self.clock), ips),
                content_type=JSON_PATCH), _transient)
            self._claims[s.uid] = written
            self._count("claim_status")
            if s.phase == CLAIM_DELETED:
                await self._retrying("claim_deletion", lambda: self.api.request(
                    "DELETE", path, body={"preconditions": {"uid": s.uid}}), _transient)
                self._count("claims_deleted")
        except KubeError as exc:
            if exc.status not in (404, 409, 422):  # gone, or another claim of the name (its uid differs)
                log.warning("status of claim %s/%s not written: %s", s.namespace, s.name, exc)

    async def sandbox_ips(self, uid: str) -> None:
        """A sandbox pod changed: its claim's status again, if its IPs are not the ones written."""
        answer = self.answers.get(uid)
        if answer is not None:
            await self.claim_status(answer, again=True)

    async def pool_status(self, s: SandboxPoolStatus, uid: str) -> None:
        """Write a pool's depth into its status (see the module docstring)."""
        patch = pool_status_patch(s, uid)
        written = (uid, patch[1]["value"])
        key = f"{s.namespace}/{s.name}"
        if self._pools.get(key) == written:
            return
        try:
            await self._retrying("pool_status", lambda: self.api.request(
                "PATCH", pools_path(s.namespace, s.name) + "/status", body=patch, content_type=JSON_PATCH), _transient)
            self._pools[key] = written
            self._count("pool_status")
        except KubeError as exc:
            if exc.status not in (404, 422):  # gone, or another pool of the name (its uid differs)
                log.warning("status of pool %s not written: %s", key, exc)

    async def deletion_cost(self, pod: Pod) -> None:
        cost = pod.annotations.get(DELETION_COST)
        live = self.live_annotations(pod.uid)
        if cost is None or live is None or live.get(DELETION_COST) == cost:
            return
        try:
            await self._retrying("deletion_cost", lambda: self.api.request(
                "PATCH", pod_path(pod.namespace, pod.name), content_type=MERGE_PATCH,
                body={"metadata": {"annotations": {DELETION_COST: cost}}}), _transient)
            self._count("deletion_costs")
        except KubeError as exc:
            if exc.status != 404:
                log.warning("deletion cost of %s/%s not written: %s", pod.namespace, pod.name, exc)

    async def reservation(self, e: ReservationEvent) -> None:
        try:
            await self._retrying("reservation_status", lambda: self.api.request(
                "PATCH", f"{RESERVATIONS}/{e.name}/status", body=reservation_status(e), content_type=MERGE_PATCH),
                _transient)
            self._count("reservation_status")
        except KubeError as exc:
            if exc.status != 404:  # a reservation that lives only on the topics (a migration's)
                log.warning("status of reservation %s not written: %s", e.name, exc)


def _transient(exc: KubeError) -> bool:
    """Worth trying again: the server not reached, overloaded or failing, or throttling."""
    return exc.status in (0, 429) or exc.status >= 500
