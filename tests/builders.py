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
