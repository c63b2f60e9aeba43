"""DefaultBinder (Bind): binding a pod here means claiming the node in the commit protocol.

It produces the Claim for the node's owner (hold id = pod uid, attempt, node), with the full
request, the priority, the decision key, the gang's min-available, waiting time and mode, and the node the pod is
nominated to (the decider clears that nomination when it accepts the pod), the devices the Reserve
plugins chose (`CycleState.allocated`), the reservation the pod consumes (`CycleState.reservation`),
and, for a reservation itself, the Reservation; whether the pod is a sandbox, and its warm
pool (`agents.sandbox.feedback` learns from them). The Binding itself
is the decider's to write, once the owner holds the claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from agents.ports import Output
from agents.sandbox.runtimes import is_sandbox
from agents.scheduler.cluster import ClusterState
from agents.scheduler.framework.interface import CycleState, PodInfo
from agents.scheduler.plugins import reservation
from agents.scheduler.plugins.args import NoArgs
from agents.state.gangs import gang_spec
from schemas import topics
from schemas.records import QUOTA_LABEL, SANDBOX_POOL_LABEL, Claim, ResourceList

NAME = "DefaultBinder"


class DefaultBinder:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: NoArgs | None = None) -> None:
        self._requests: dict[bytes, ResourceList] = {}  # equal requests share one (immutable) map

    def bind(self, cycle: CycleState, pod: PodInfo, state: ClusterState, row: int) -> list[Output]:
        return self.bind_run(cycle, (pod,), state, row)[0]

    def bind_run(self, cycle: CycleState, pods: Sequence[PodInfo], state: ClusterState, row: int) -> list[list[Output]]:
        """`bind` for pods of one class placed on one node together: what they share (the
        node, the request map, the devices and reservation of the cycle) is looked up once."""
        node = state.names[row]
        first = pods[0]
        key = first.request_key or first.request.tobytes()
        requests = self._requests.get(key)
        if requests is None:
            if len(self._requests) > 4096:
                self._requests.clear()
            requests = self._requests[key] = ResourceList(state.space.to_map(first.request))
        nominated = state.nominator.nominated_uids()
        devices, consumed = cycle.allocated(), cycle.reservation
        out = []
        for pod in pods:
            p = pod.pod
            gang = pod.derived.get("gang") or gang_spec(p.annotations)  # validated when the pod was queued
            nomination = state.nominator.of(p.uid) if p.uid in nominated else None
            out.append([Output(topics.NODE_INBOX, node, Claim(
                uid=p.uid, attempt=pod.attempt, node=node, decision_key=pod.decision_key, requests=requests,
                priority=pod.priority, namespace=p.namespace, name=p.name, creation_timestamp=p.creation_timestamp,
                gang_min=gang.min_available, gang_waiting_s=gang.waiting_s, gang_strict=gang.strict,
                nominated_node=nomination.node if nomination is not None else "",
                devices=devices, quota=p.labels.get(QUOTA_LABEL, ""),
                reservation=consumed, reserving=pod.derived.get(reservation.DERIVED),
                sandbox=is_sandbox(p), warm_pool=p.labels.get(SANDBOX_POOL_LABEL, ""),
            ))])
        return out
