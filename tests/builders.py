"""Shared builders for tests: nodes, pods and claims with sensible defaults; a warm pool's
records (one pool, `agents/p`)."""

from __future__ import annotations

from typing import Any, cast

from agents.adapters.timers import TimerRequest
from schemas.records import (
    Binding,
    Claim,
    Node,
    Pod,
    ResourceList,
    SandboxClaim,
    SandboxClaimDeleted,
    SandboxTemplate,
    SandboxTick,
    SandboxWarmPool,
)

GI = 2**30


def make_node(name: str = "n1", cpu: int = 4000, memory: int = 8 * GI, pods: int = 110, **kw: object) -> Node:
    alloc = ResourceList({"cpu": cpu, "memory": memory, "pods": pods})
    return Node(name=name, capacity=alloc, allocatable=alloc, **kw)  # type: ignore[arg-type]


def make_pod(uid: str = "p1", cpu: int = 500, memory: int = GI, **kw: object) -> Pod:
    return Pod(uid=uid, name=uid, requests=ResourceList({"cpu": cpu, "memory": memory}), **kw)  # type: ignore[arg-type]


def make_claim(uid: str = "p1", node: str = "n1", attempt: int = 0, cpu: int = 500, key: str = "", **kw: object) -> Claim:
    return Claim(uid=uid, attempt=attempt, node=node, decision_key=key or uid,
                 requests=ResourceList({"cpu": cpu, "pods": 1}), **kw)  # type: ignore[arg-type]


# Kata's own kata-qemu RuntimeClass (kata-deploy), with koordstream's QoS rule in its annotations.
KATA_QEMU_RUNTIME_CLASS = """
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: kata-qemu
  annotations: {koordstream.io/qos-classes: "LSR, LS,BE", koordstream.io/default-qos-class: LS}
handler: kata-qemu
overhead: {podFixed: {memory: 160Mi, cpu: 250m}}
scheduling:
  nodeSelector: {katacontainers.io/kata-runtime: "true"}
  tolerations: [{key: kata, operator: Exists, effect: NoSchedule}]
"""


# --- a warm pool (agents.sandbox) ---------------------------------------------------------------

SANDBOX_NS = "agents"
SANDBOX_POOL = f"{SANDBOX_NS}/p"  # the pool's table key


def make_template(cpu: int = 250, **kw: Any) -> SandboxTemplate:
    return SandboxTemplate(namespace=SANDBOX_NS, name="py", pod=Pod(uid="", name="", requests=ResourceList(cpu=cpu)),
                           **kw)


def make_pool(replicas: int = 2, template: SandboxTemplate | None = None, **kw: Any) -> SandboxWarmPool:
    return SandboxWarmPool(namespace=SANDBOX_NS, name="p", template=template or make_template(), replicas=replicas,
                           **kw)


def make_sandbox_claim(name: str, uid: str | None = None, **kw: Any) -> SandboxClaim:
    return SandboxClaim(uid=uid or f"u-{name}", namespace=SANDBOX_NS, name=name, warm_pool=kw.pop("warm_pool", "p"),
                        **kw)


def sandbox_claim_deleted(name: str, uid: str | None = None) -> SandboxClaimDeleted:
    return SandboxClaimDeleted(uid=uid or f"u-{name}", namespace=SANDBOX_NS, name=name, warm_pool="p")


def pool_tick(at: float) -> SandboxTick:
    return SandboxTick(namespace=SANDBOX_NS, name="p", at=at)


def sandbox_bound(uid: str, node: str = "n0") -> Binding:
    return Binding(uid=uid, namespace=SANDBOX_NS, name=uid, node=node, attempt=0, decision_key=uid)


def tick_at(request: TimerRequest) -> float:
    """The log time a pool's timer request asks a tick for."""
    return cast(SandboxTick, request.output.record).at
