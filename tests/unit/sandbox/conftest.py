"""Builders for the sandbox tests: sandbox pods with containers, Kata and NUMA nodes, a core
over them with an injected clock, and the records of a pod's attempt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agents.ports import Output
from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.state import cpus
from agents.state.resources import ResourceSpace
from schemas.records import (
    QOS_LABEL,
    SANDBOX_TEMPLATE_HASH_LABEL,
    Claim,
    ContainerResources,
    Node,
    NumaCell,
    Pod,
    ResourceList,
    SchedulingFeedback,
)

MI, GI = 2**20, 2**30
KATA = {"katacontainers.io/kata-runtime": "true"}


def sandbox(uid: str, runtime: str = "", cpu: int = 500, memory: int = 256 * MI, qos: str = "",
            guaranteed: bool = False, **kw: object) -> Pod:
    """A sandbox pod of one container (limits = requests when `guaranteed`), as its producer
    sends it: no overhead, its template's hash as a label."""
    labels = {SANDBOX_TEMPLATE_HASH_LABEL: "t1", **({QOS_LABEL: qos} if qos else {}), **kw.pop("labels", {})}  # type: ignore[dict-item]
    asked = ResourceList(cpu=cpu, memory=memory)
    container = ContainerResources("agent", asked, ResourceList(asked) if guaranteed else ResourceList())
    return Pod(uid=uid, name=uid, runtime_class_name=runtime, labels=labels, containers=(container,),
               requests=ResourceList(asked), **kw)  # type: ignore[arg-type]


def node(name: str, cpu: int = 4000, memory: int = 8 * GI, labels: dict[str, str] | None = None,
         numa: bool = False) -> Node:
    """A node; `numa`: two cells of four CPUs (two cores of two threads each), one NUMA node each."""
    cells = (NumaCell(0, (0, 1, 2, 3), cores=(0, 0, 1, 1)), NumaCell(1, (4, 5, 6, 7), cores=(2, 2, 3, 3))) if numa else ()
    policy = {cpus.NUMA_POLICY_LABEL: "SingleNUMANode"} if numa else {}
    alloc = ResourceList({"cpu": cpu, "memory": memory, "pods": 110})
    return Node(name=name, labels={**(labels or {}), **policy}, allocatable=alloc, capacity=alloc, numa=cells)


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def core_of(*nodes: Node, clock: Clock | None = None) -> SchedulerCore:
    space = ResourceSpace()
    return SchedulerCore(space, ClusterState.from_records(space, nodes), clock or Clock())


def claims(outputs: Sequence[Output]) -> list[Claim]:
    return [o.record for o in outputs if isinstance(o.record, Claim)]


def feedback(outputs: Sequence[Output]) -> list[SchedulingFeedback]:
    return [o.record for o in outputs if isinstance(o.record, SchedulingFeedback)]
