"""agent-sandbox manifests (`extensions.agents.x-k8s.io/v1beta1`) to records.

SandboxTemplate (`spec.podTemplate`, its `spec` kept whole for the pods the bridge creates;
`spec.envVarsInjectionPolicy`), SandboxWarmPool
(`spec.replicas`, `spec.sandboxTemplateRef.name`, `spec.updateStrategy.type`) and
SandboxClaim (`spec.warmPoolRef.name`, `spec.lifecycle.shutdownTime` / `shutdownPolicy`,
`spec.additionalPodMetadata`, `spec.env`), converted like Pods are (`schemas.kube`), plus
koordstream's own `SandboxBurst` (`sandbox.koordstream.io/v1alpha1`: `spec.warmPoolRef.name`,
`spec.count`, `spec.ttl` as a Go duration, `spec.mode` Reserve or AccountingOnly).

A pool carries its template (`SandboxWarmPool.template`): `resolve` puts each pool's template
in from the templates of the same input and drops the templates, so what is published is
self-contained (a pool whose template is not there is an error naming
`spec.sandboxTemplateRef.name`). A pool's koordstream settings are annotations:
`sandbox.koordstream.io/overflow` (Allow, Deny), `sandbox.koordstream.io/refill-per-second`,
`sandbox.koordstream.io/refill-batch`. A claim without `metadata.uid` gets `<namespace>.<name>`,
so publishing the same manifest again is a redelivery (it gets its recorded answer).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from schemas.errors import SchemaError
from schemas.kube import _str_map, _timestamp, pod_from_manifest
from schemas.quantity import parse_duration
from schemas.records import (
    EnvVar,
    Pod,
    Record,
    SandboxBurst,
    SandboxClaim,
    SandboxTemplate,
    SandboxWarmPool,
)

GROUP = "extensions.agents.x-k8s.io"
BURST_GROUP = "sandbox.koordstream.io"
KINDS = ("SandboxTemplate", "SandboxWarmPool", "SandboxClaim", "SandboxBurst")
OVERFLOW_ANNOTATION = "sandbox.koordstream.io/overflow"
REFILL_RATE_ANNOTATION = "sandbox.koordstream.io/refill-per-second"
REFILL_BATCH_ANNOTATION = "sandbox.koordstream.io/refill-batch"


def is_sandbox_manifest(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("kind") in KINDS and str(obj.get("apiVersion", "")).split("/")[0] in (
        GROUP, BURST_GROUP)


def _meta(obj: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    meta = obj.get("metadata") or {}
    if not isinstance(meta, dict) or not meta.get("name"):
        raise SchemaError("metadata.name", meta.get("name") if isinstance(meta, dict) else meta, "is required")
    return str(meta.get("namespace") or "default"), str(meta["name"]), meta


def _spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise SchemaError("spec", spec, "is required and must be an object")
    return spec


def _ref(spec: dict[str, Any], field: str) -> str:
    ref = spec.get(field)
    if not isinstance(ref, dict) or not ref.get("name"):
        raise SchemaError(f"spec.{field}.name", ref.get("name") if isinstance(ref, dict) else ref, "is required")
    return str(ref["name"])


def _int(value: Any, path: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SchemaError(path, value, f"must be an integer, {minimum} or more")
    return value


def _integer(value: Any) -> Any:
    """An annotation's integer (annotations are strings), else the value as it was (refused by `_int`)."""
    return int(value) if isinstance(value, str) and value.strip().isdigit() else value


def _number(value: Any, path: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise SchemaError(path, value, "must be a number") from exc
    if not number > 0:
        raise SchemaError(path, value, "must be more than 0")
    return number


def template_from_manifest(obj: dict[str, Any]) -> SandboxTemplate:
    namespace, name, _ = _meta(obj)
    spec = _spec(obj)
    pod_template = spec.get("podTemplate")
    if not isinstance(pod_template, dict) or not isinstance(pod_template.get("spec"), dict):
        raise SchemaError("spec.podTemplate.spec", pod_template, "is required")
    meta = dict(pod_template.get("metadata") or {})
    try:
        pod = pod_from_manifest({"metadata": {**meta, "name": name, "namespace": namespace, "uid": ""},
                                 "spec": pod_template["spec"]})
    except SchemaError as exc:
        raise exc.under("spec.podTemplate") from exc
    env_names = tuple(sorted({str(e.get("name", "")) for c in pod_template["spec"].get("containers") or []
                              for e in (c.get("env") or []) if isinstance(e, dict)} - {""}))
    policy = str(spec.get("envVarsInjectionPolicy") or "Disallowed")
    return SandboxTemplate(namespace=namespace, name=name, pod=dataclasses.replace(pod, uid="", name=""),
                           env_policy=policy, env_names=env_names, pod_spec=dict(pod_template["spec"]))


@dataclasses.dataclass(frozen=True)
class UnresolvedPool:
    """A pool as its manifest says it, its template named only (`resolve` finds it)."""

    pool: SandboxWarmPool
    template: str


def pool_from_manifest(obj: dict[str, Any]) -> UnresolvedPool:
    namespace, name, meta = _meta(obj)
    spec = _spec(obj)
    annotations = meta.get("annotations") or {}
    strategy = spec.get("updateStrategy") or {}
    placeholder = SandboxTemplate(namespace=namespace, name=_ref(spec, "sandboxTemplateRef"), pod=Pod(uid="", name=""))
    pool = SandboxWarmPool(
        namespace=namespace, name=name, template=placeholder,
        replicas=_int(spec.get("replicas", 0), "spec.replicas", 0),
        update_strategy=str(strategy.get("type") or "OnReplenish") if isinstance(strategy, dict) else "OnReplenish",
        overflow=str(annotations.get(OVERFLOW_ANNOTATION, "Allow")),
        refill_per_s=_number(annotations.get(REFILL_RATE_ANNOTATION, 500.0), f"metadata.annotations.{REFILL_RATE_ANNOTATION}"),
        refill_batch=_int(_integer(annotations.get(REFILL_BATCH_ANNOTATION, 200)),
                          f"metadata.annotations.{REFILL_BATCH_ANNOTATION}", 1),
        uid=str(meta.get("uid") or ""), generation=_generation(meta))
    return UnresolvedPool(pool, placeholder.name)


def claim_from_manifest(obj: dict[str, Any]) -> SandboxClaim:
    namespace, name, meta = _meta(obj)
    spec = _spec(obj)
    lifecycle = spec.get("lifecycle") or {}
    extra = spec.get("additionalPodMetadata") or {}
    env = []
    for i, e in enumerate(spec.get("env") or []):
        if not isinstance(e, dict) or not e.get("name"):
            raise SchemaError(f"spec.env[{i}].name", e.get("name") if isinstance(e, dict) else e, "is required")
        env.append(EnvVar(name=str(e["name"]), value=str(e.get("value", "")), container_name=str(e.get("containerName", ""))))
    shutdown = lifecycle.get("shutdownTime")
    return SandboxClaim(
        uid=str(meta.get("uid") or f"{namespace}.{name}"), namespace=namespace, name=name,
        warm_pool=_ref(spec, "warmPoolRef"), env=tuple(env),
        labels=_str_map(extra.get("labels"), "spec.additionalPodMetadata.labels"),
        annotations=_str_map(extra.get("annotations"), "spec.additionalPodMetadata.annotations"),
        shutdown_time=_timestamp(shutdown, "spec.lifecycle.shutdownTime") if shutdown else None,
        shutdown_policy=str(lifecycle.get("shutdownPolicy") or "Retain"),
        created=_timestamp(meta.get("creationTimestamp"), "metadata.creationTimestamp"), generation=_generation(meta))


def _generation(meta: dict[str, Any]) -> int:
    return _int(meta.get("generation", 0), "metadata.generation", 0)


def burst_from_manifest(obj: dict[str, Any]) -> SandboxBurst:
    namespace, name, meta = _meta(obj)
    spec = _spec(obj)
    ttl = spec.get("ttl", "10m")
    try:
        ttl_s = parse_duration(str(ttl)) if not isinstance(ttl, (int, float)) else float(ttl)
    except ValueError as exc:
        raise SchemaError("spec.ttl", ttl, "not a duration (e.g. 600s, 10m)") from exc
    return SandboxBurst(namespace=namespace, name=name, warm_pool=_ref(spec, "warmPoolRef"),
                        count=_int(spec.get("count"), "spec.count", 1), ttl_s=ttl_s,
                        mode=str(spec.get("mode") or "Reserve"),
                        created=_timestamp(meta.get("creationTimestamp"), "metadata.creationTimestamp"))


def sandbox_from_manifest(obj: dict[str, Any]) -> Record | SandboxTemplate | UnresolvedPool:
    kind = obj.get("kind")
    if kind == "SandboxTemplate":
        return template_from_manifest(obj)
    if kind == "SandboxWarmPool":
        return pool_from_manifest(obj)
    if kind == "SandboxClaim":
        return claim_from_manifest(obj)
    return burst_from_manifest(obj)


def resolve(items: list[Any]) -> list[Record]:
    """The records of a converted input: each pool given its template from the same input,
    templates dropped (they travel inside their pools)."""
    templates = {(t.namespace, t.name): t for t in items if isinstance(t, SandboxTemplate)}
    out: list[Record] = []
    for i, item in enumerate(items):
        if isinstance(item, SandboxTemplate):
            continue
        if isinstance(item, UnresolvedPool):
            template = templates.get((item.pool.namespace, item.template))
            if template is None:
                raise SchemaError(f"[{i}].spec.sandboxTemplateRef.name", item.template,
                                  f"no SandboxTemplate {item.template!r} in namespace {item.pool.namespace!r} in the "
                                  "same input: a pool is published with its template")
            out.append(dataclasses.replace(item.pool, template=template))
        else:
            out.append(item)
    return out
