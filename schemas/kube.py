"""Plain Kubernetes v1 Pod and Node manifests, `node.k8s.io/v1` RuntimeClasses, and
Koordinator's `scheduling.koordinator.sh/v1alpha1` Reservation, (JSON or YAML) to koordstream
records.

The effective pod request follows Kubernetes (resource helpers, KEP-753 sidecars): for
each resource, the larger of (sum of app containers + sum of sidecar init containers) and
(each regular init container + the sidecars started before it), plus the pod overhead.
A container without a request for cpu or memory gets its limit, as the API server defaults.
Node devices: `nvidia.com/gpu` allocatable (or, without it, `koordinator.sh/gpu-core` / 100)
becomes that many GPUs (minors 0..N-1, each core 100 and memory-ratio 100), their model from
the `nvidia.com/gpu.product` label and their memory from `nvidia.com/gpu.memory` (MiB per GPU;
both labels as NVIDIA's GPU feature discovery publishes them); `koordinator.sh/rdma`
allocatable becomes one NIC with that many virtual functions. NUMA cells come from the
annotation `node.koordinator.sh/cpu-topology` as Koordinator's koordlet writes it
(`{"detail": [{"id": cpu, "core": core, "socket": socket, "node": numa cell}, ...]}`).
A Reservation's `spec.template` is read as a pod's (its effective request, selector, affinity,
tolerations, priority); `spec.ttl` is a Go duration ("1h"), `spec.expires` an RFC 3339 time.
A RuntimeClass keeps its `handler`, `overhead.podFixed` and `scheduling` (nodeSelector,
tolerations); koordstream's QoS rule for its pods comes from two annotations,
`koordstream.io/qos-classes` (the Koordinator QoS classes allowed, comma-separated) and
`koordstream.io/default-qos-class` (`validate_runtime_class` checks both).

The other way (`pod_manifest`, `node_manifest`, `reservation_manifest`): records as the
manifests a harness creates in a real API server; converting one back gives the record again
(the API server's uid, resourceVersion and creation time aside).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import yaml

from schemas.errors import SchemaError
from schemas.quantity import format_canonical, parse_duration, to_canonical
from schemas.records import (
    QOS_CLASSES,
    QOS_LABEL,
    ContainerResources,
    GpuDevice,
    Node,
    NodeCondition,
    NumaCell,
    OwnerReference,
    Pod,
    PodDisruptionBudget,
    RdmaDevice,
    Record,
    Reservation,
    ReservationOwner,
    ResourceList,
    RuntimeClass,
    Taint,
    Toleration,
)

_DEFAULTED_FROM_LIMITS = ("cpu", "memory")
RUNTIME_QOS_ANNOTATION = "koordstream.io/qos-classes"
RUNTIME_DEFAULT_QOS_ANNOTATION = "koordstream.io/default-qos-class"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_OPERATORS = ("Equal", "Exists")
_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")


def effective_requests(
    containers: Sequence[ContainerResources],
    init_containers: Sequence[ContainerResources] = (),
    overhead: dict[str, int] | None = None,
) -> ResourceList:
    """The request Kubernetes schedules a pod by (see module docstring)."""
    apps = ResourceList()
    for c in containers:
        apps = apps.plus(c.requests)
    sidecars = ResourceList()
    init_peak = ResourceList()
    for c in init_containers:
        if c.restart_policy == "Always":
            sidecars = sidecars.plus(c.requests)
            candidate = sidecars
        else:
            candidate = sidecars.plus(c.requests)
        for name, amount in candidate.items():
            init_peak[name] = max(init_peak.get(name, 0), amount)
    total = apps.plus(sidecars)
    for name, amount in init_peak.items():
        total[name] = max(total.get(name, 0), amount)
    if overhead:
        total = total.plus(overhead)
    return ResourceList({k: v for k, v in total.items() if v > 0})


def _resource_map(raw: Any, path: str) -> ResourceList:
    if raw is None:
        return ResourceList()
    if not isinstance(raw, dict):
        raise SchemaError(path, raw, "must be a map of resource name to quantity")
    return ResourceList({str(k): to_canonical(str(k), v, f"{path}.{k}") for k, v in raw.items()})


def _timestamp(raw: Any, path: str) -> float:
    if raw in (None, ""):
        return 0.0
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    if isinstance(raw, datetime):
        return raw.timestamp()
    try:
        return datetime.fromisoformat(str(raw).replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise SchemaError(path, raw, "not an RFC 3339 timestamp") from exc


def _container(raw: Any, path: str) -> ContainerResources:
    if not isinstance(raw, dict):
        raise SchemaError(path, raw, "a container must be an object")
    resources = raw.get("resources") or {}
    requests = _resource_map(resources.get("requests"), f"{path}.resources.requests")
    limits = _resource_map(resources.get("limits"), f"{path}.resources.limits")
    for name in _DEFAULTED_FROM_LIMITS:
        if name not in requests and name in limits:
            requests[name] = limits[name]
    return ContainerResources(
        name=str(raw.get("name", "")),
        requests=requests,
        limits=limits,
        restart_policy=str(raw.get("restartPolicy", "")),
    )


def _tolerations(raw: Any, path: str) -> tuple[Toleration, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise SchemaError(path, raw, "must be a list of tolerations")
    return tuple(
        Toleration(key=str(t.get("key", "")), operator=str(t.get("operator", "Equal")), value=str(t.get("value", "")),
                   effect=str(t.get("effect", "")), toleration_seconds=t.get("tolerationSeconds"))
        for t in raw
    )


def _str_map(raw: Any, path: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SchemaError(path, raw, "must be a map of strings")
    return {str(k): str(v) for k, v in raw.items()}


def pod_from_manifest(obj: dict[str, Any]) -> Pod:
    """A v1 Pod manifest (parsed JSON/YAML) to a `Pod` record."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    uid = meta.get("uid") or f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
    if not meta.get("name"):
        raise SchemaError("metadata.name", meta.get("name"), "is required")
    containers = tuple(_container(c, f"spec.containers[{i}]") for i, c in enumerate(spec.get("containers") or []))
    inits = tuple(_container(c, f"spec.initContainers[{i}]") for i, c in enumerate(spec.get("initContainers") or []))
    overhead = _resource_map(spec.get("overhead"), "spec.overhead")
    labels = _str_map(meta.get("labels"), "metadata.labels")
    priority = spec.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise SchemaError("spec.priority", priority, "must be an integer")
    owners = tuple(
        OwnerReference(kind=str(o.get("kind", "")), name=str(o.get("name", "")), uid=str(o.get("uid", "")),
                       controller=bool(o.get("controller", False)))
        for o in meta.get("ownerReferences") or []
    )
    tolerations = _tolerations(spec.get("tolerations"), "spec.tolerations")
    affinity = spec.get("affinity") or {}
    if not isinstance(affinity, dict):
        raise SchemaError("spec.affinity", affinity, "must be an object")
    return Pod(
        uid=str(uid),
        name=str(meta["name"]),
        namespace=str(meta.get("namespace", "default")),
        resource_version=str(meta.get("resourceVersion", "")),
        creation_timestamp=_timestamp(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
        labels=labels,
        annotations=_str_map(meta.get("annotations"), "metadata.annotations"),
        owner_references=owners,
        scheduler_name=str(spec.get("schedulerName", "default-scheduler")),
        priority=priority,
        priority_class_name=str(spec.get("priorityClassName", "")),
        qos_class=labels.get(QOS_LABEL, ""),
        containers=containers,
        init_containers=inits,
        overhead=overhead,
        requests=effective_requests(containers, inits, overhead),
        runtime_class_name=str(spec.get("runtimeClassName") or ""),
        node_selector=_str_map(spec.get("nodeSelector"), "spec.nodeSelector"),
        affinity=affinity,
        tolerations=tolerations,
        node_name=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase", "Pending")),
        deletion_timestamp=_timestamp(meta["deletionTimestamp"], "metadata.deletionTimestamp")
        if meta.get("deletionTimestamp") else None,
        volume_kinds=_volume_kinds(spec.get("volumes")),
    )


def _volume_kinds(raw: Any) -> tuple[str, ...]:
    """The source kind of each volume (the one key beside `name`), in order, once each."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise SchemaError("spec.volumes", raw, "must be a list")
    kinds: dict[str, None] = {}
    for i, volume in enumerate(raw):
        if not isinstance(volume, dict):
            raise SchemaError(f"spec.volumes[{i}]", volume, "must be an object")
        for key in volume:
            if key != "name":
                kinds[str(key)] = None
    return tuple(kinds)


CPU_TOPOLOGY_ANNOTATION = "node.koordinator.sh/cpu-topology"


def _numa_cells(raw: str | None) -> tuple[NumaCell, ...]:
    if not raw:
        return ()
    field = f"metadata.annotations.{CPU_TOPOLOGY_ANNOTATION}"
    try:
        detail = json.loads(raw).get("detail")
        cpus = sorted((int(d["node"]), int(d["id"]), int(d["core"])) for d in detail)
    except (ValueError, TypeError, KeyError, AttributeError):
        raise SchemaError(field, raw[:80], 'must be {"detail": [{"id", "core", "node"}, ...]}') from None
    cells: dict[int, list[tuple[int, int]]] = {}
    for node, cpu, core in cpus:
        cells.setdefault(node, []).append((cpu, core))
    return tuple(NumaCell(id=node, cpus=tuple(c for c, _ in items), cores=tuple(k for _, k in items))
                 for node, items in sorted(cells.items()))


def node_from_manifest(obj: dict[str, Any]) -> Node:
    """A v1 Node manifest to a `Node` record (devices: see module docstring)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if not meta.get("name"):
        raise SchemaError("metadata.name", meta.get("name"), "is required")
    labels = _str_map(meta.get("labels"), "metadata.labels")
    capacity = _resource_map(status.get("capacity"), "status.capacity")
    allocatable = _resource_map(status.get("allocatable"), "status.allocatable") or ResourceList(capacity)
    memory_mib = labels.get("nvidia.com/gpu.memory", "0")
    if not memory_mib.isdigit():
        raise SchemaError("metadata.labels.nvidia.com/gpu.memory", memory_mib, "must be a whole number of MiB")
    count = allocatable.get("nvidia.com/gpu", 0) or allocatable.get("koordinator.sh/gpu-core", 0) // 100
    gpus = tuple(
        GpuDevice(minor=i, model=labels.get("nvidia.com/gpu.product", ""), memory=int(memory_mib) * 2**20)
        for i in range(count)
    )
    numa = _numa_cells(_str_map(meta.get("annotations"), "metadata.annotations").get(CPU_TOPOLOGY_ANNOTATION))
    rdma_vfs = allocatable.get("koordinator.sh/rdma", 0)
    rdma = (RdmaDevice(name="rdma0", minor=0, vfs=rdma_vfs),) if rdma_vfs else ()
    taints = tuple(
        Taint(key=str(t.get("key", "")), value=str(t.get("value", "")), effect=str(t.get("effect", "NoSchedule")))
        for t in spec.get("taints") or []
    )
    conditions = tuple(
        NodeCondition(type=str(c.get("type", "")), status=str(c.get("status", "")))
        for c in status.get("conditions") or []
    )
    return Node(
        name=str(meta["name"]),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        labels=labels,
        annotations=_str_map(meta.get("annotations"), "metadata.annotations"),
        taints=taints,
        capacity=capacity,
        allocatable=allocatable,
        unschedulable=bool(spec.get("unschedulable", False)),
        conditions=conditions,
        gpus=gpus,
        rdma=rdma,
        numa=numa,
    )


def _owner(raw: Any, path: str) -> ReservationOwner:
    if not isinstance(raw, dict):
        raise SchemaError(path, raw, "an owner must be an object")
    obj, controller, selector = raw.get("object") or {}, raw.get("controller") or {}, raw.get("labelSelector") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list) or not all(isinstance(e, dict) for e in expressions):
        raise SchemaError(f"{path}.labelSelector.matchExpressions", expressions, "must be a list of objects")
    return ReservationOwner(
        object_uid=str(obj.get("uid", "")), object_namespace=str(obj.get("namespace", "")),
        object_name=str(obj.get("name", "")),
        controller_uid=str(controller.get("uid", "")), controller_namespace=str(controller.get("namespace", "")),
        controller_kind=str(controller.get("kind", "")), controller_name=str(controller.get("name", "")),
        match_labels=_str_map(selector.get("matchLabels"), f"{path}.labelSelector.matchLabels"),
        match_expressions=tuple(dict(e) for e in expressions),
    )


def reservation_from_manifest(obj: dict[str, Any]) -> Reservation:
    """A `scheduling.koordinator.sh/v1alpha1` Reservation manifest to a `Reservation` record."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if not meta.get("name"):
        raise SchemaError("metadata.name", meta.get("name"), "is required")
    template = spec.get("template")
    if not isinstance(template, dict):
        raise SchemaError("spec.template", template, "a reservation needs a pod template")
    try:
        pod = pod_from_manifest({"metadata": {**(template.get("metadata") or {}), "name": meta["name"]},
                                 "spec": template.get("spec") or {}})
    except SchemaError as exc:
        raise exc.under("spec.template") from exc
    owners = spec.get("owners") or []
    if not isinstance(owners, list):
        raise SchemaError("spec.owners", owners, "must be a list")
    ttl = spec.get("ttl")
    try:
        ttl_s = parse_duration(str(ttl)) if ttl not in (None, "") else None
    except ValueError as exc:
        raise SchemaError("spec.ttl", ttl, "not a duration such as 1h30m") from exc
    allocate_once = spec.get("allocateOnce", True)
    if not isinstance(allocate_once, bool):
        raise SchemaError("spec.allocateOnce", allocate_once, "must be true or false")
    return Reservation(
        uid=str(meta.get("uid") or meta["name"]),
        name=str(meta["name"]),
        owners=tuple(_owner(o, f"spec.owners[{i}]") for i, o in enumerate(owners)),
        requests=pod.requests,
        ttl_s=ttl_s,
        expires=_timestamp(spec["expires"], "spec.expires") if spec.get("expires") else None,
        allocate_once=allocate_once,
        allocate_policy=str(spec.get("allocatePolicy") or ""),
        creation_timestamp=_timestamp(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
        labels=_str_map(meta.get("labels"), "metadata.labels"),
        scheduler_name=pod.scheduler_name,
        priority=pod.priority,
        priority_class_name=pod.priority_class_name,
        node_selector=pod.node_selector,
        affinity=pod.affinity,
        tolerations=pod.tolerations,
    )


def _int_or_percent(raw: Any, path: str) -> str:
    if raw is None:
        return ""
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
        return str(raw)
    if isinstance(raw, str) and re.fullmatch(r"[0-9]+%?", raw):
        return raw
    raise SchemaError(path, raw, "must be a non-negative integer or a percentage such as 10%")


def pdb_from_manifest(obj: dict[str, Any]) -> PodDisruptionBudget:
    """A `policy/v1` PodDisruptionBudget manifest to a `PodDisruptionBudget` record (the
    selector's operators are checked where it is used, by the rebalancer)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if not meta.get("name"):
        raise SchemaError("metadata.name", meta.get("name"), "is required")
    selector = spec.get("selector") if spec.get("selector") is not None else {}
    if not isinstance(selector, dict):
        raise SchemaError("spec.selector", selector, "must be a label selector {matchLabels, matchExpressions}")
    least, most = (_int_or_percent(spec.get(k), f"spec.{k}") for k in ("minAvailable", "maxUnavailable"))
    if least and most:
        raise SchemaError("spec.maxUnavailable", spec.get("maxUnavailable"), "give minAvailable or maxUnavailable, not both")
    namespace = str(meta.get("namespace") or "default")
    return PodDisruptionBudget(uid=str(meta.get("uid") or f"{namespace}/{meta['name']}"), name=str(meta["name"]),
                               namespace=namespace, selector=selector, min_available=least, max_unavailable=most)


def runtime_class_from_manifest(obj: dict[str, Any]) -> RuntimeClass:
    """A `node.k8s.io/v1` RuntimeClass manifest to a `RuntimeClass` record, checked
    (`validate_runtime_class`)."""
    meta = obj.get("metadata") or {}
    if not isinstance(meta, dict):
        raise SchemaError("metadata", meta, "must be an object")
    overhead = obj.get("overhead") or {}
    scheduling = obj.get("scheduling") or {}
    if not isinstance(overhead, dict):
        raise SchemaError("overhead", overhead, "must be an object {podFixed: {resource: quantity}}")
    if not isinstance(scheduling, dict):
        raise SchemaError("scheduling", scheduling, "must be an object {nodeSelector, tolerations}")
    annotations = _str_map(meta.get("annotations"), "metadata.annotations")
    allowed = annotations.get(RUNTIME_QOS_ANNOTATION, "")
    record = RuntimeClass(
        name=str(meta.get("name") or ""),
        handler=str(obj.get("handler") or ""),
        overhead=_resource_map(overhead.get("podFixed"), "overhead.podFixed"),
        node_selector=_str_map(scheduling.get("nodeSelector"), "scheduling.nodeSelector"),
        tolerations=_tolerations(scheduling.get("tolerations"), "scheduling.tolerations"),
        qos_classes=tuple(c.strip() for c in allowed.split(",") if c.strip()),
        default_qos_class=annotations.get(RUNTIME_DEFAULT_QOS_ANNOTATION, "").strip(),
    )
    return validate_runtime_class(record)


# Where each field of a RuntimeClass record stands in its manifest (`validate_runtime_class`).
RUNTIME_CLASS_PATHS = {"name": "metadata.name", "handler": "handler", "overhead": "overhead.podFixed",
                       "tolerations": "scheduling.tolerations",
                       "qos_classes": f"metadata.annotations.{RUNTIME_QOS_ANNOTATION}",
                       "default_qos_class": f"metadata.annotations.{RUNTIME_DEFAULT_QOS_ANNOTATION}"}


def validate_runtime_class(rc: RuntimeClass, paths: dict[str, str] | None = None) -> RuntimeClass:
    """`rc` if it can be used, else a SchemaError naming the field (by its path in the
    manifest; `paths={}`: by the record's field names) and the value: a name that is no DNS
    subdomain, a handler that is no DNS label (empty included, as the API server refuses it),
    a negative overhead, a toleration Kubernetes would refuse, an unknown QoS class, a default
    QoS class that is not among the allowed ones (or missing when some are)."""
    where = RUNTIME_CLASS_PATHS if paths is None else paths

    def fail(name: str, value: Any, reason: str, suffix: str = "") -> SchemaError:
        return SchemaError(where.get(name, name) + suffix, value, reason)

    if not _DNS_SUBDOMAIN.match(rc.name):
        raise fail("name", rc.name, "must be a DNS subdomain (lower-case letters, digits, '-' and '.')")
    if not _DNS_LABEL.match(rc.handler):
        raise fail("handler", rc.handler, "must name the CRI handler: a DNS label (lower-case letters, digits, '-')")
    for resource, amount in rc.overhead.items():
        if amount < 0:
            raise fail("overhead", amount, "an overhead cannot be negative", f".{resource}")
    for i, t in enumerate(rc.tolerations):
        if t.operator not in _OPERATORS or t.effect not in _EFFECTS or (t.operator == "Exists" and t.value):
            raise fail("tolerations", t, "operator must be Equal or Exists (Exists without a value), effect one of "
                       "NoSchedule, PreferNoSchedule, NoExecute or empty", f"[{i}]")
    unknown = [c for c in rc.qos_classes if c not in QOS_CLASSES]
    if unknown:
        raise fail("qos_classes", ",".join(rc.qos_classes), f"must name Koordinator QoS classes ({', '.join(QOS_CLASSES)})")
    if rc.default_qos_class and rc.default_qos_class not in (rc.qos_classes or QOS_CLASSES):
        raise fail("default_qos_class", rc.default_qos_class,
                   f"must be one of the allowed classes ({', '.join(rc.qos_classes or QOS_CLASSES)})")
    if rc.qos_classes and not rc.default_qos_class:
        raise fail("default_qos_class", "", "a runtime that allows only some QoS classes needs a default among them "
                   f"({', '.join(rc.qos_classes)})")
    return rc


def from_manifest(obj: Any) -> list[Record]:
    """One parsed manifest (a Pod, a Node, a Reservation, a PodDisruptionBudget, a
    RuntimeClass, or a List of them) to records."""
    if not isinstance(obj, dict):
        raise SchemaError("", obj, "a manifest must be an object")
    kind = obj.get("kind")
    if kind == "Pod":
        return [pod_from_manifest(obj)]
    if kind == "Node":
        return [node_from_manifest(obj)]
    if kind == "Reservation":
        return [reservation_from_manifest(obj)]
    if kind == "PodDisruptionBudget":
        return [pdb_from_manifest(obj)]
    if kind == "RuntimeClass":
        return [runtime_class_from_manifest(obj)]
    from schemas import agent_sandbox  # it builds on this module: imported here, not at its top

    if agent_sandbox.is_sandbox_manifest(obj):
        return [agent_sandbox.sandbox_from_manifest(obj)]  # type: ignore[list-item]  # resolved by load_manifests
    if kind == "List" or (isinstance(kind, str) and kind.endswith("List")):
        out: list[Record] = []
        for i, item in enumerate(obj.get("items") or []):
            try:
                out.extend(from_manifest(item))
            except SchemaError as exc:
                raise exc.under(f"items[{i}]") from exc
        return out
    raise SchemaError("kind", kind, "expected a v1 Pod, Node or List, a Reservation, a PodDisruptionBudget, a "
                                    "RuntimeClass, or an agent-sandbox SandboxTemplate, SandboxWarmPool or SandboxClaim "
                                    "(or a SandboxBurst)")


def load_manifests(text: str) -> list[Record]:
    """JSON or (multi-document) YAML text of Kubernetes manifests to records."""
    docs: Iterable[Any] = yaml.safe_load_all(text)
    out: list[Record] = []
    for doc in docs:
        if doc is not None:
            out.extend(from_manifest(doc))
    from schemas import agent_sandbox

    return agent_sandbox.resolve(out)  # pools given their templates from the same text


def is_manifest(obj: Any) -> bool:
    return isinstance(obj, dict) and "apiVersion" in obj and "metadata" in obj


# --- records to manifests (what a harness creates in a real API server) ------------------------

NATIVE = ("cpu", "memory", "ephemeral-storage", "pods")  # the resources requests may exceed limits of
OWNER_API_VERSIONS = {"Job": "batch/v1", "ReplicaSet": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1",
                      "Deployment": "apps/v1"}


def _quantities(amounts: dict[str, int]) -> dict[str, str]:
    return {name: format_canonical(name, amount) for name, amount in sorted(amounts.items())}


def _container_manifest(c: ContainerResources) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if c.requests:
        resources["requests"] = _quantities(c.requests)
    limits = {**{n: a for n, a in c.requests.items() if n not in NATIVE}, **c.limits}  # extended: limits = requests
    if limits:
        resources["limits"] = _quantities(limits)
    out: dict[str, Any] = {"name": c.name, "image": "registry.k8s.io/pause:3.10", "resources": resources}
    if c.restart_policy:
        out["restartPolicy"] = c.restart_policy
    return out


def pod_manifest(pod: Pod) -> dict[str, Any]:
    """A v1 Pod manifest for `pod`, as `kubectl` would create it (its uid and resourceVersion
    are the API server's to give): one container asking the pod's effective request when the
    record has no containers; extended resources with limits equal to requests, as the API
    server requires; the priority by its class when it has one (the Priority admission plugin
    fills the number in)."""
    containers = pod.containers or (ContainerResources(name="main", requests=ResourceList(pod.requests)),)
    meta: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace}
    if pod.labels:
        meta["labels"] = dict(pod.labels)
    if pod.annotations:
        meta["annotations"] = dict(pod.annotations)
    if pod.owner_references:
        meta["ownerReferences"] = [{"apiVersion": OWNER_API_VERSIONS.get(o.kind, "v1"), "kind": o.kind, "name": o.name,
                                    "uid": o.uid, "controller": o.controller} for o in pod.owner_references]
    spec: dict[str, Any] = {"schedulerName": pod.scheduler_name,
                            "containers": [_container_manifest(c) for c in containers]}
    if pod.init_containers:
        spec["initContainers"] = [_container_manifest(c) for c in pod.init_containers]
    if pod.priority_class_name:
        spec["priorityClassName"] = pod.priority_class_name
    elif pod.priority:
        spec["priority"] = pod.priority
    if pod.overhead:
        spec["overhead"] = _quantities(pod.overhead)
    for key, value in (("runtimeClassName", pod.runtime_class_name), ("nodeName", pod.node_name),
                       ("nodeSelector", dict(pod.node_selector)), ("affinity", dict(pod.affinity))):
        if value:
            spec[key] = value
    if pod.tolerations:
        spec["tolerations"] = [{k: v for k, v in (("key", t.key), ("operator", t.operator), ("value", t.value),
                                                  ("effect", t.effect), ("tolerationSeconds", t.toleration_seconds))
                                if v not in ("", None)} for t in pod.tolerations]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def node_manifest(node: Node, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A v1 Node manifest for `node` (status included, as a node registers itself): whole GPUs
    as `nvidia.com/gpu` with their model and memory as labels, NUMA cells as Koordinator's
    `node.koordinator.sh/cpu-topology` annotation, RDMA functions as `koordinator.sh/rdma`."""
    labels = dict(node.labels)
    allocatable = dict(node.allocatable)
    if node.gpus:
        allocatable.setdefault("nvidia.com/gpu", len(node.gpus))
        if node.gpus[0].model:
            labels.setdefault("nvidia.com/gpu.product", node.gpus[0].model)
        if node.gpus[0].memory:
            labels.setdefault("nvidia.com/gpu.memory", str(node.gpus[0].memory // 2**20))
    if node.rdma:
        allocatable.setdefault("koordinator.sh/rdma", sum(d.vfs for d in node.rdma))
    notes = dict(node.annotations)
    if node.numa:
        detail = [{"id": cpu, "core": cell.cores[i] if cell.cores else cpu, "socket": 0, "node": cell.id}
                  for cell in node.numa for i, cpu in enumerate(cell.cpus)]
        notes[CPU_TOPOLOGY_ANNOTATION] = json.dumps({"detail": detail}, separators=(",", ":"))
    notes.update(annotations or {})
    meta: dict[str, Any] = {"name": node.name}
    if labels:
        meta["labels"] = labels
    if notes:
        meta["annotations"] = notes
    spec: dict[str, Any] = {}
    if node.unschedulable:
        spec["unschedulable"] = True
    if node.taints:
        spec["taints"] = [{"key": t.key, "value": t.value, "effect": t.effect} if t.value
                          else {"key": t.key, "effect": t.effect} for t in node.taints]
    capacity = {**dict(node.capacity), **{k: v for k, v in allocatable.items() if k not in node.capacity}}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec,
            "status": {"allocatable": _quantities(allocatable), "capacity": _quantities(capacity)}}


def reservation_manifest(r: Reservation, namespace: str = "default") -> dict[str, Any]:
    """A `scheduling.koordinator.sh/v1alpha1` Reservation manifest for `r` (its template's pod
    in `namespace`)."""
    template = pod_manifest(Pod(uid=r.uid, name=r.name, namespace=namespace, labels=r.labels,
                                scheduler_name=r.scheduler_name, priority=r.priority,
                                priority_class_name=r.priority_class_name, requests=ResourceList(r.requests),
                                node_selector=r.node_selector, affinity=r.affinity, tolerations=r.tolerations))
    owners = []
    for o in r.owners:
        entry: dict[str, Any] = {}
        if o.object_uid or o.object_name:
            entry["object"] = {k: v for k, v in (("uid", o.object_uid), ("name", o.object_name),
                                                  ("namespace", o.object_namespace)) if v}
        if o.controller_uid or o.controller_name:
            entry["controller"] = {k: v for k, v in (("uid", o.controller_uid), ("name", o.controller_name),
                                                      ("namespace", o.controller_namespace),
                                                      ("kind", o.controller_kind)) if v}
        if o.match_labels or o.match_expressions:
            entry["labelSelector"] = {k: v for k, v in (("matchLabels", dict(o.match_labels)),
                                                         ("matchExpressions", list(o.match_expressions))) if v}
        owners.append(entry)
    spec: dict[str, Any] = {"template": {"metadata": {"namespace": namespace, **({"labels": dict(r.labels)} if r.labels
                                                                                  else {})},
                                         "spec": template["spec"]},
                            "owners": owners, "allocateOnce": r.allocate_once}
    if r.ttl_s is not None:
        spec["ttl"] = f"{r.ttl_s:g}s"
    if r.allocate_policy:
        spec["allocatePolicy"] = r.allocate_policy
    return {"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
            "metadata": {"name": r.name, **({"labels": dict(r.labels)} if r.labels else {})}, "spec": spec}
