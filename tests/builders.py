"""Shared builders for tests: nodes, pods and claims with sensible defaults."""

from __future__ import annotations

from schemas.records import Claim, Node, Pod, ResourceList

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
