"""Sandbox templates, pools and claims: the rules the pool's core and its edges share.

- `template_hash`: a template's equivalence signature, the hash of what scheduling reads of
  its pod (requests, overhead, runtime class, QoS, priority, selector, affinity, tolerations,
  scheduler name, the template's labels): two templates that would schedule alike hash alike.
  Its pods carry it as `scheduling.koordinator.sh/sandbox-template-hash`, so the scheduler's
  equivalence classes and the reservations of a burst (`owners` select it) find them.
- The uids of a pool's pods name their pool: `sbx~<namespace>~<pool>~<life>-<n>` for the pool's
  own (n counts up per life of the pool, which `life` names; their names are
  `<pool>-<life>-<n>`), `sbx~<namespace>~<pool>~c-<claim uid>` for a claim's cold start, and
  `sbx~<namespace>~<pool>~r-<burst>-<i>` for a burst's reservations. `~` is in no Kubernetes
  name and in no hold id's separator, so `pool_of` reads the pool back from a Binding or a
  SchedulingFeedback alone: that is how they are forwarded to the pool's own partition;
  `is_pod_uid` tells a pod's from a reservation's.
- `validate_pool`, `validate_claim`, `validate_burst`: the first field that makes a record
  unusable, as a `FieldError` (the agent sends it to the dead-letter topic).
- `sandbox_pod`: the pod a pool starts (the template's, with the pool's labels) or a claim
  starts cold (with the claim's env and metadata applied).
"""

from __future__ import annotations

import dataclasses
import hashlib

import orjson

from schemas.codec import to_plain
from schemas.errors import FieldError
from schemas.records import (
    BURST_MODES,
    ENV_POLICIES,
    OVERFLOW_POLICIES,
    SANDBOX_CLAIM_UID_LABEL,
    SANDBOX_POOL_LABEL,
    SANDBOX_TEMPLATE_HASH_LABEL,
    SHUTDOWN_POLICIES,
    UPDATE_STRATEGIES,
    Pod,
    Reservation,
    ReservationOwner,
    SandboxBurst,
    SandboxClaim,
    SandboxTemplate,
    SandboxWarmPool,
    replace,
)

UID_PREFIX = "sbx"
SEP = "~"
UID_MARK = f'"{UID_PREFIX}{SEP}'.encode()  # in the bytes of every message that holds a sandbox uid (a JSON string)
# Label and annotation domains a claim's additionalPodMetadata may not set (agent-sandbox's claim
# controller refuses metadata outside an allowed list of domains the same way: InvalidMetadata).
RESERVED_DOMAINS = ("koordstream.io", "koordinator.sh", "x-k8s.io", "kubernetes.io", "k8s.io")
ACCOUNTING_LABEL = "sandbox.koordstream.io/accounting-only"  # no pod carries it: nothing consumes such a reservation
# What scheduling reads of a pod (the template's hash covers these and nothing else).
_SIGNED = ("requests", "overhead", "runtime_class_name", "qos_class", "priority", "priority_class_name",
           "scheduler_name", "node_selector", "affinity", "tolerations", "labels")


def pool_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def template_hash(template: SandboxTemplate) -> str:
    """The template pod's scheduling signature (10 hex digits of a sha256)."""
    pod = template.pod
    signed = {name: getattr(pod, name) for name in _SIGNED}
    signed["labels"] = {k: v for k, v in pod.labels.items() if k != SANDBOX_TEMPLATE_HASH_LABEL}
    signed["tolerations"] = [dataclasses.asdict(t) for t in pod.tolerations]
    digest = hashlib.sha256(orjson.dumps(signed, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return digest[:10]


def template_key(template: SandboxTemplate) -> str:
    """A template's identity in a pool's state: a digest of all of it (`template_hash` covers
    only what scheduling reads)."""
    return hashlib.sha256(orjson.dumps(to_plain(template), option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def with_hash(template: SandboxTemplate) -> SandboxTemplate:
    """The template with its `hash` set (recomputed: a producer's hash is not trusted)."""
    return replace(template, hash=template_hash(template))


def life(t: float) -> str:
    """A life of a pool (from its creation to its state being forgotten), named by the log time
    it was created at (milliseconds, base 36): its pods' uids and names carry it."""
    n, digits = max(0, int(round(t * 1000))), ""
    while True:
        n, d = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[d] + digits
        if not n:
            return digits


def sandbox_uid(namespace: str, pool: str, n: int, life: str = "") -> str:
    return SEP.join((UID_PREFIX, namespace, pool, f"{life}-{n}" if life else str(n)))


def sandbox_name(pool: str, n: int, life: str = "") -> str:
    return f"{pool}-{life}-{n}" if life else f"{pool}-{n}"


def cold_uid(namespace: str, pool: str, claim_uid: str) -> str:
    return SEP.join((UID_PREFIX, namespace, pool, f"c-{claim_uid}"))


def reservation_uid(namespace: str, pool: str, burst: str, i: int) -> str:
    return SEP.join((UID_PREFIX, namespace, pool, f"r-{burst}-{i}"))


def pool_of(uid: str) -> str | None:
    """The pool key (`namespace/name`) a sandbox pod's or reservation's uid names, else None."""
    if not uid.startswith(UID_PREFIX + SEP):
        return None
    parts = uid.split(SEP)
    if len(parts) != 4 or not parts[1] or not parts[2]:
        return None
    return pool_key(parts[1], parts[2])


def is_pod_uid(uid: str) -> bool:
    """A sandbox pod's uid (a pool's own, or a claim's cold start), not a burst's reservation's."""
    return pool_of(uid) is not None and not uid.rsplit(SEP, 1)[1].startswith("r-")


def _check_name(field: str, value: str) -> None:
    if not value or SEP in value or "/" in value:
        raise FieldError(field, value, "a Kubernetes object name is needed (no '/' or '~')")


def validate_pool(pool: SandboxWarmPool) -> None:
    """Raise FieldError naming the first field that makes the pool unusable."""
    _check_name("metadata.namespace", pool.namespace)
    _check_name("metadata.name", pool.name)
    _check_name("spec.sandboxTemplateRef.name", pool.template.name)
    if pool.template.namespace != pool.namespace:
        raise FieldError("spec.sandboxTemplateRef.name", pool.template.name,
                         f"the template is in namespace {pool.template.namespace!r}, the pool in {pool.namespace!r}")
    if pool.replicas < 0:
        raise FieldError("spec.replicas", pool.replicas, "must be 0 or more")
    if pool.update_strategy not in UPDATE_STRATEGIES:
        raise FieldError("spec.updateStrategy.type", pool.update_strategy, f"expected one of {UPDATE_STRATEGIES}")
    if pool.overflow not in OVERFLOW_POLICIES:
        raise FieldError("overflow", pool.overflow, f"expected one of {OVERFLOW_POLICIES}")
    if not pool.refill_per_s > 0:
        raise FieldError("refill_per_s", pool.refill_per_s, "must be more than 0")
    if pool.refill_batch < 1:
        raise FieldError("refill_batch", pool.refill_batch, "must be 1 or more")
    if pool.template.env_policy not in ENV_POLICIES:
        raise FieldError("spec.envVarsInjectionPolicy", pool.template.env_policy, f"expected one of {ENV_POLICIES}")
    if not pool.template.pod.requests:
        raise FieldError("spec.podTemplate.spec.containers", [], "the template's pod requests nothing")


def validate_claim(claim: SandboxClaim) -> None:
    _check_name("metadata.namespace", claim.namespace)
    _check_name("metadata.name", claim.name)
    _check_name("spec.warmPoolRef.name", claim.warm_pool)
    if not claim.uid:
        raise FieldError("metadata.uid", claim.uid, "a claim needs a uid")
    if claim.shutdown_policy not in SHUTDOWN_POLICIES:
        raise FieldError("spec.lifecycle.shutdownPolicy", claim.shutdown_policy, f"expected one of {SHUTDOWN_POLICIES}")
    for i, env in enumerate(claim.env):
        if not env.name:
            raise FieldError(f"spec.env[{i}].name", env.name, "an environment variable needs a name")
    for where, keys in (("labels", claim.labels), ("annotations", claim.annotations)):
        for key in keys:
            if reserved_key(key):
                raise FieldError(f"spec.additionalPodMetadata.{where}", key, "a claim may not set a key of a domain "
                                 f"koordstream, Koordinator, agent-sandbox or Kubernetes reserve ({', '.join(RESERVED_DOMAINS)}): "
                                 "the pod's scheduling, its pool and its identity depend on them")


def reserved_key(key: str) -> bool:
    """A label or annotation key of a domain a claim's metadata may not set (`RESERVED_DOMAINS`)."""
    domain, slash, _ = key.partition("/")
    return bool(slash) and any(domain == d or domain.endswith("." + d) for d in RESERVED_DOMAINS)


def validate_burst(burst: SandboxBurst) -> None:
    _check_name("metadata.name", burst.name)
    _check_name("spec.warmPoolRef.name", burst.warm_pool)
    if burst.count < 1:
        raise FieldError("spec.count", burst.count, "must be 1 or more")
    if not burst.ttl_s > 0:
        raise FieldError("spec.ttl", burst.ttl_s, "must be more than 0")
    if burst.mode not in BURST_MODES:
        raise FieldError("spec.mode", burst.mode, f"expected one of {BURST_MODES}")


def env_refusal(claim: SandboxClaim, template: SandboxTemplate) -> FieldError | None:
    """Why the template's `envVarsInjectionPolicy` refuses the claim's env, else None."""
    if not claim.env or template.env_policy == "Overrides":
        return None
    if template.env_policy == "Disallowed":
        return FieldError("spec.env", [e.name for e in claim.env],
                          f"template {template.name!r} has envVarsInjectionPolicy Disallowed")
    overridden = sorted(e.name for e in claim.env if e.name in template.env_names)
    if overridden:
        return FieldError("spec.env", overridden,
                          f"template {template.name!r} allows new variables only (envVarsInjectionPolicy Allowed)")
    return None


def sandbox_pod(pool: SandboxWarmPool, uid: str, name: str, created: float,
                claim: SandboxClaim | None = None, cold: bool = True) -> Pod:
    """The pod of one sandbox: the template's, labelled with its hash and pool; once a claim
    has it, with the claim's labels under the template's and its annotations over them, and
    the claim's uid label when it started `cold` for the claim (a burst's reservations select it)."""
    template = pool.template
    labels = {**template.pod.labels, SANDBOX_TEMPLATE_HASH_LABEL: template.hash, SANDBOX_POOL_LABEL: pool.name}
    annotations = dict(template.pod.annotations)
    if claim is not None:
        labels = {**claim.labels, **labels}
        if cold:
            labels[SANDBOX_CLAIM_UID_LABEL] = claim.uid
        annotations = {**annotations, **claim.annotations}
    return replace(template.pod, uid=uid, name=name, namespace=pool.namespace, labels=labels,
                   annotations=annotations, creation_timestamp=created, node_name="", phase="Pending")


def burst_reservations(pool: SandboxWarmPool, burst: SandboxBurst, created: float) -> list[Reservation]:
    """A burst as Reservations, one per sandbox: Reserve mode's are consumed (allocate-once)
    by the pool's cold-path pods (owners select the template's hash, the pool and a claim's
    uid label: refills do not take them); AccountingOnly's by nothing (Koordinator's
    accounting-only reservations: capacity that sandboxes outside Kubernetes' pods use)."""
    pod = pool.template.pod
    if burst.mode == "AccountingOnly":
        owner = ReservationOwner(match_labels={ACCOUNTING_LABEL: burst.name})
    else:
        owner = ReservationOwner(match_labels={SANDBOX_TEMPLATE_HASH_LABEL: pool.template.hash,
                                               SANDBOX_POOL_LABEL: pool.name},
                                 match_expressions=({"key": SANDBOX_CLAIM_UID_LABEL, "operator": "Exists"},))
    requests = pod.requests
    return [Reservation(uid=reservation_uid(pool.namespace, pool.name, burst.name, i),
                        name=f"{pool.name}-{burst.name}-{i}", owners=(owner,), requests=requests,
                        ttl_s=burst.ttl_s, allocate_once=True, creation_timestamp=burst.created or created,
                        labels={SANDBOX_POOL_LABEL: pool.name, SANDBOX_TEMPLATE_HASH_LABEL: pool.template.hash},
                        scheduler_name=pod.scheduler_name, priority=pod.priority,
                        priority_class_name=pod.priority_class_name, node_selector=dict(pod.node_selector),
                        affinity=dict(pod.affinity), tolerations=pod.tolerations)
            for i in range(burst.count)]
