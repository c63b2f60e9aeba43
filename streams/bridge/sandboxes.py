"""agent-sandbox's objects in the API server (`extensions.agents.x-k8s.io/v1beta1`) for the bridge.

In: `SandboxObjects` (pure, part of the `Mirror`) turns SandboxTemplates, SandboxWarmPools and
SandboxClaims into the records the pools read on `sandbox` (keyed by the pool's name):
- a pool goes out resolved with its template (`schemas.agent_sandbox.resolve`'s rule), again
  whenever the record changes, and so whenever its template changes: every pool that names a
  template is published again when it changes. A pool whose template is not there yet waits
  for it unpublished; a template deleted leaves its pools as they were last published (the
  template travels inside them). A pool deleted is `SandboxWarmPoolDeleted` (not while another
  pool of that name lives: a relist may see the new one before the old one's deletion);
- a claim goes out with its API uid and `created` its creationTimestamp (when the bridge first
  saw it, for an object without one); a claim deleted is `SandboxClaimDeleted`.
Every pool published is remembered with its template's pod spec under the template's hash
(`spec_for`), so that a sandbox pod is created from the very template it was scheduled with, and
a new leader reads them back from `sandbox` (`seed`) with what it published before: a pool or
claim deleted while no bridge led is published deleted after the first list.

Out: the pools' sandbox pods. A pool publishes its pods as Pod records on `pods` (uids
`sbx~<namespace>~<pool>~<n>`, `agents.sandbox.templates`), and the scheduler places them; the
bridge makes them real pods so that a kubelet (Kwok) runs them: `pod_manifest` is the pod to
create (the Pod record's name, namespace, labels and annotations, the template's pod spec),
tied to its record by the annotation `koordstream.io/uid` (a label cannot hold the uid: `~` is
not allowed in a label value, nor more than 63 characters). The mirror knows such a pod by
that uid, not by the API server's (`Mirror._pod`), publishes it only once koordstream bound it
(the pool published it pending), and its deletion and end as for every pod of ours.
`SandboxPods` is what the bridge knows of each sandbox pod from `pods` (the last record of its
uid in log order, of any producer): whether it may be created (the pool's record, not deleted
since, never published bound by a bridge: a pod that was bound and is gone was deleted, and is
not made again), and the record it is created from. A claim's labels and annotations reach the
pod it adopted the same way: its pool publishes the pod's record again with them, and the bridge
merges into the pod in the API server what it lacks of them (`metadata_patch`), when it reads
that record or sees the pod change.

Out: the pools' status. The last `SandboxPoolStatus` of each pool of the API server's in a
batch is written into its `status` as agent-sandbox's controller keeps it (`pool_status_patch`):
`replicas` (its unclaimed sandboxes, started or starting), `readyReplicas` (started: what
`kubectl get sandboxwarmpools` shows as Ready), `selector` (its pods' label selector, which
the scale subresource reads) and `observedGeneration` (the pool's generation the pool decided
on; a claim's Ready condition has its claim's).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.ports import Output
from agents.sandbox import pool as pools
from agents.sandbox.templates import is_pod_uid, pool_key, reserved_key, template_hash
from schemas import topics
from schemas.agent_sandbox import (
    UnresolvedPool,
    claim_from_manifest,
    pool_from_manifest,
    template_from_manifest,
)
from schemas.records import (
    SANDBOX_NAME_ANNOTATION,
    SANDBOX_POOL_LABEL,
    SANDBOX_TEMPLATE_HASH_LABEL,
    Pod,
    PodDeleted,
    Record,
    SandboxClaim,
    SandboxClaimDeleted,
    SandboxClaimStatus,
    SandboxPoolStatus,
    SandboxTemplate,
    SandboxWarmPool,
    SandboxWarmPoolDeleted,
)

API_VERSION = "extensions.agents.x-k8s.io/v1beta1"
TEMPLATE, WARMPOOL, CLAIM = "SandboxTemplate", "SandboxWarmPool", "SandboxClaim"
KINDS = (TEMPLATE, WARMPOOL, CLAIM)
UID_ANNOTATION = "koordstream.io/uid"  # on a sandbox pod in the API server: its uid in koordstream
READY_REASON = "SandboxReady"
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")  # a condition's reason (metav1.Condition)


def sandbox_uid(meta: Mapping[str, Any]) -> str:
    """The koordstream uid of a pod object that is a pool's sandbox, else ""."""
    uid = str((meta.get("annotations") or {}).get(UID_ANNOTATION) or "")
    return uid if is_pod_uid(uid) else ""


def claims_path(namespace: str, name: str = "") -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/sandboxclaims" + (f"/{name}" if name else "")


def pools_path(namespace: str, name: str = "") -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/sandboxwarmpools" + (f"/{name}" if name else "")


def pool_status_patch(s: SandboxPoolStatus, uid: str) -> list[dict[str, Any]]:
    """A JSON patch of a pool's whole status (see the module docstring), whose `test` of
    `metadata.uid` keeps it off a pool made again under the name."""
    status: dict[str, Any] = {"replicas": s.ready + s.starting, "readyReplicas": s.ready,
                              "selector": f"{SANDBOX_POOL_LABEL}={s.name}"}
    if s.observed_generation:
        status["observedGeneration"] = s.observed_generation
    return [{"op": "test", "path": "/metadata/uid", "value": uid}, {"op": "add", "path": "/status", "value": status}]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


@dataclass
class SandboxObjects:
    """See the module docstring ("In"). Keys are the objects' uids."""

    clock: Callable[[], float] = time.time  # a claim's `created` when its object has no creationTimestamp
    templates: dict[tuple[str, str], SandboxTemplate] = field(default_factory=dict)  # (ns, name) -> template
    template_names: dict[str, tuple[str, str]] = field(default_factory=dict)  # template uid -> (ns, name)
    pools: dict[str, UnresolvedPool] = field(default_factory=dict)  # pool uid -> as its manifest says
    published_pools: dict[str, SandboxWarmPool] = field(default_factory=dict)  # pool uid -> last published
    claims: dict[str, SandboxClaim] = field(default_factory=dict)  # claim uid -> last published
    first_seen: dict[str, float] = field(default_factory=dict)  # claim uid -> when seen (no creationTimestamp)
    specs: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (ns, pool, hash) -> spec

    def apply(self, kind: str, event: str, obj: Mapping[str, Any], key: str) -> list[Output]:
        if kind == TEMPLATE:
            return self._template(event, obj, key)
        if kind == WARMPOOL:
            return self._pool(event, obj, key)
        return self._claim(event, obj, key)

    def seed(self, record: Record) -> tuple[str, str, bool] | None:
        """A record a bridge published on `sandbox` before (read back in log order); its kind,
        key, and whether it is there (for the mirror's `known`)."""
        if isinstance(record, SandboxWarmPool):
            key = record.uid or pool_key(record.namespace, record.name)
            self.published_pools[key] = record
            self._remember_spec(record)
            return WARMPOOL, key, True
        if isinstance(record, SandboxWarmPoolDeleted):
            key = next((k for k, p in self.published_pools.items()
                        if (p.namespace, p.name) == (record.namespace, record.name)), "")
            return (WARMPOOL, key, False) if self.published_pools.pop(key, None) is not None else None
        if isinstance(record, SandboxClaim):
            self.claims[record.uid] = record
            return CLAIM, record.uid, True
        if isinstance(record, SandboxClaimDeleted):
            return (CLAIM, record.uid, False) if self.claims.pop(record.uid, None) is not None else None
        return None

    def last_object(self, kind: str, key: str) -> Mapping[str, Any] | None:
        """A minimal object for a deletion a relist implied (the handlers work from what they keep)."""
        if kind == TEMPLATE:
            known = key in self.template_names
        elif kind == WARMPOOL:
            known = key in self.pools or key in self.published_pools
        else:
            known = key in self.claims
        return {"metadata": {"uid": key}} if known else None

    # -- what the bridge's other parts ask -------------------------------------------------------

    def pool_live(self, pool: str) -> bool:
        """A pool (`namespace/name`) of the API server's: its pods are the bridge's to create."""
        return any(pool_key(p.pool.namespace, p.pool.name) == pool for p in self.pools.values())

    def pool_uid(self, namespace: str, name: str) -> str:
        """The API server's uid of the live pool `namespace/name`, else ""."""
        return next((uid for uid, p in self.pools.items() if (p.pool.namespace, p.pool.name) == (namespace, name)), "")

    def claim_live(self, uid: str) -> bool:
        return uid in self.claims

    def spec_for(self, pod: Pod) -> dict[str, Any] | None:
        """The pod spec of the template a sandbox pod was made from (by its pool and hash
        labels), else the pool's template as it is now, else None."""
        pool = pod.labels.get(SANDBOX_POOL_LABEL, "")
        spec = self.specs.get((pod.namespace, pool, pod.labels.get(SANDBOX_TEMPLATE_HASH_LABEL, "")))
        if spec is not None:
            return spec
        current = next((p for p in self.published_pools.values() if (p.namespace, p.name) == (pod.namespace, pool)),
                       None)
        return current.template.pod_spec if current is not None and current.template.pod_spec else None

    # -- the kinds ------------------------------------------------------------------------------------

    def _template(self, event: str, obj: Mapping[str, Any], key: str) -> list[Output]:
        if event == "DELETED":
            name = self.template_names.pop(key, None)
            if name is not None:
                self.templates.pop(name, None)
            return []  # its pools keep the template they were published with
        template = template_from_manifest(dict(obj))
        name = (template.namespace, template.name)
        self.template_names[key] = name
        if self.templates.get(name) == template:
            return []
        self.templates[name] = template
        out: list[Output] = []
        for uid, pool in self.pools.items():
            if (pool.pool.namespace, pool.template) == name:
                out += self._publish_pool(uid, pool)
        return out

    def _pool(self, event: str, obj: Mapping[str, Any], key: str) -> list[Output]:
        if event == "DELETED":
            self.pools.pop(key, None)
            gone = self.published_pools.pop(key, None)
            if gone is None or self.pool_live(pool_key(gone.namespace, gone.name)):
                return []
            return [Output(topics.SANDBOX, gone.name, SandboxWarmPoolDeleted(namespace=gone.namespace,
                                                                             name=gone.name))]
        pool = pool_from_manifest(dict(obj))
        self.pools[key] = pool
        return self._publish_pool(key, pool)

    def _publish_pool(self, key: str, pool: UnresolvedPool) -> list[Output]:
        template = self.templates.get((pool.pool.namespace, pool.template))
        if template is None:
            return []  # it waits for its template
        record = dataclasses.replace(pool.pool, template=template)
        if self.published_pools.get(key) == record:
            return []
        self.published_pools[key] = record
        self._remember_spec(record)
        return [Output(topics.SANDBOX, record.name, record)]

    def _remember_spec(self, pool: SandboxWarmPool) -> None:
        if pool.template.pod_spec:
            self.specs[(pool.namespace, pool.name, template_hash(pool.template))] = pool.template.pod_spec

    def _claim(self, event: str, obj: Mapping[str, Any], key: str) -> list[Output]:
        if event == "DELETED":
            self.first_seen.pop(key, None)
            gone = self.claims.pop(key, None)
            if gone is None:
                return []
            return [Output(topics.SANDBOX, gone.warm_pool, SandboxClaimDeleted(
                uid=gone.uid, namespace=gone.namespace, name=gone.name, warm_pool=gone.warm_pool))]
        claim = claim_from_manifest(dict(obj))
        claim = dataclasses.replace(claim, uid=key, created=claim.created or self.first_seen.setdefault(key, self.clock()))
        if self.claims.get(key) == claim:
            return []
        self.claims[key] = claim
        return [Output(topics.SANDBOX, claim.warm_pool, claim)]


# -- the sandbox pods ---------------------------------------------------------------------------------


@dataclass
class SandboxPod:
    """What `pods` says of one sandbox pod: its name, the pool's record, whether a deletion came
    last, whether a bridge published it bound (it was created and bound), and where the last
    record read is (offset, index in its message; a uid is always on the same partition)."""

    namespace: str = ""
    name: str = ""
    pod: Pod | None = None
    deleted: bool = False
    bound: bool = False
    at: tuple[int, int] = (-1, -1)

    def creatable(self) -> bool:
        return self.pod is not None and not self.deleted and not self.bound


class SandboxPods:
    """See the module docstring ("Out"). Filled by the read-back at a term's start and by the
    bridge's consumer of `pods` after it (which may read again what the read-back read: a record
    at or before the last one read of its uid changes nothing). Deleted pods are kept for the
    term (a Binding replayed later is refused, not carried out): each term starts afresh."""

    def __init__(self) -> None:
        self.pods: dict[str, SandboxPod] = {}
        self._arrived: dict[str, asyncio.Event] = {}

    def read(self, record: Record, by_bridge: bool, offset: int, index: int) -> bool:
        """A record on `pods` (`by_bridge`: published by a bridge); whether it was news."""
        uid = str(getattr(record, "uid", ""))
        if not isinstance(record, (Pod, PodDeleted)) or not is_pod_uid(uid):
            return False
        seen = self.pods.setdefault(uid, SandboxPod())
        if (offset, index) <= seen.at:
            return False
        seen.at = (offset, index)
        seen.namespace, seen.name = record.namespace, record.name or seen.name
        if isinstance(record, PodDeleted):
            seen.deleted = True
        elif by_bridge:
            seen.bound = seen.bound or bool(record.node_name)
        else:  # the pool's: the pod made anew (a re-send after its deletion), or its claim's metadata
            seen.pod, seen.deleted = record, False
        arrived = self._arrived.pop(uid, None)
        if arrived is not None:
            arrived.set()
        return True

    def to_come(self, uid: str) -> bool:
        """A sandbox pod no bridge published bound: it may not have been created yet."""
        seen = self.pods.get(uid)
        return is_pod_uid(uid) and (seen is None or not seen.bound)

    def deleted(self, uid: str) -> None:
        """The bridge published the pod's deletion (its record comes back later, changing nothing)."""
        if is_pod_uid(uid):
            self.pods.setdefault(uid, SandboxPod()).deleted = True

    async def wait(self, uid: str, timeout_s: float) -> SandboxPod | None:
        """The pod as `pods` has it, once its pool's record was read (the Binding of a pod may be
        read before the pod on its own topic); None after `timeout_s`."""
        while True:
            seen = self.pods.get(uid)
            if seen is not None and (seen.pod is not None or seen.deleted):
                return seen
            arrived = self._arrived.setdefault(uid, asyncio.Event())
            try:
                await asyncio.wait_for(arrived.wait(), timeout_s)
            except TimeoutError:
                self._arrived.pop(uid, None)
                return self.pods.get(uid)


def pod_manifest(pod: Pod, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The Pod to create for a sandbox pod's record: its template's pod spec (unassigned, with
    the record's scheduler), the record's name, namespace, labels and annotations, and its uid
    as `koordstream.io/uid`."""
    body = copy.deepcopy(dict(spec))
    body.pop("nodeName", None)
    body["schedulerName"] = pod.scheduler_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "labels": dict(pod.labels),
                         "annotations": {**pod.annotations, UID_ANNOTATION: pod.uid}},
            "spec": body}


def metadata_patch(record: Pod, live: Pod) -> dict[str, Any] | None:
    """A merge patch of the labels and annotations the pool's record of a sandbox pod has and
    the pod in the API server lacks or has otherwise (its claim's, once adopted: agent-sandbox's
    `additionalPodMetadata`); None when there are none. What others put on the pod stays, and
    keys of the domains a claim may not set (`templates.reserved_key`) are never written."""
    meta: dict[str, Any] = {}
    for name, want, have in (("labels", record.labels, live.labels), ("annotations", record.annotations,
                                                                       live.annotations)):
        # (keys of reserved domains, the uid annotation among them, are set at creation only)
        changed = {k: v for k, v in want.items() if have.get(k) != v and not reserved_key(k)}
        if changed:
            meta[name] = changed
    return {"metadata": meta} if meta else None


def _reason(reason: str, default: str) -> str:
    return reason if reason and _REASON.match(reason) else default


def claim_condition(s: SandboxClaimStatus, now: str) -> dict[str, Any]:
    """A claim's `Ready` condition from the pool's answer: True with its sandbox; False with the
    pool's reason and message while it is Pending, or when Refused, Expired or Deleted."""
    if s.phase == pools.READY_PHASE:
        status, reason, message = "True", READY_REASON, f"sandbox {s.sandbox} runs on node {s.node}"
    elif s.phase == pools.PENDING:
        status, reason = "False", _reason(s.reason, "SandboxPending")
        message = s.message or f"sandbox {s.sandbox} is starting"
    elif s.phase == pools.REFUSED:
        status, reason, message = "False", _reason(s.reason, "ClaimRefused"), s.message
        if s.next_step:
            message = f"{message} (next step: {s.next_step})"
    elif s.phase == pools.EXPIRED:
        status, reason, message = "False", "ClaimExpired", s.message
    else:
        status, reason, message = "False", "SandboxDeleted", s.message
    condition: dict[str, Any] = {"type": "Ready", "status": status, "reason": reason,
                                 "message": (message or s.phase)[:32768], "lastTransitionTime": now}
    if s.observed_generation:
        condition["observedGeneration"] = s.observed_generation
    return condition


def claim_status_patch(s: SandboxClaimStatus, now: str, ips: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """A JSON patch of the claim's whole status, whose `test` of `metadata.uid` keeps it off a
    claim made again under the name (on `/status`, a merge patch's `metadata.uid` is dropped
    with the rest of the metadata, and the write goes through). `ips`: its sandbox pod's."""
    status: dict[str, Any] = {"conditions": [claim_condition(s, now)]}
    if s.sandbox and s.phase in (pools.READY_PHASE, pools.PENDING):
        status["sandbox"] = {"name": s.sandbox, **({"podIPs": list(ips)} if ips else {})}
    return [{"op": "test", "path": "/metadata/uid", "value": s.uid}, {"op": "add", "path": "/status", "value": status}]


def claim_annotation_patch(s: SandboxClaimStatus) -> dict[str, Any]:
    """A merge patch of the claim's sandbox annotation; its `metadata.uid` makes it fail (422:
    immutable) on a claim made again under the name."""
    return {"metadata": {"uid": s.uid, "annotations": {SANDBOX_NAME_ANNOTATION: s.sandbox}}}
