"""The bridge's calls as data, pure: the Binding it posts (allocation and hold id as
annotations, the pod's UID as precondition), kube-scheduler's PodScheduled condition and
FailedScheduling Event, the Reservation status, and the client's token bucket on an injected
clock."""

from __future__ import annotations

import pytest

from schemas.records import (
    Binding,
    CurrentOwner,
    ReservationEvent,
    ResourceList,
    SchedulingFeedback,
)
from streams.bridge.actuator import binding_body, condition_patch, event_body, reservation_status
from streams.bridge.mirror import HOLD_ANNOTATION
from streams.kubeapi import RateLimit


def test_a_binding_carries_the_allocation_the_hold_id_and_the_pods_uid() -> None:
    b = Binding(uid="u1", namespace="ns", name="p", node="n1", attempt=2, decision_key="u1",
                annotations={"scheduling.koordinator.sh/device-allocated": '{"gpu":[{"minor":0}]}'})
    body = binding_body(b)
    assert body["metadata"]["uid"] == "u1" and body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}
    assert body["metadata"]["annotations"] == {"scheduling.koordinator.sh/device-allocated": '{"gpu":[{"minor":0}]}',
                                               HOLD_ANNOTATION: "u1/2/n1"}


@pytest.mark.parametrize(("reasons", "final", "reason"), [
    ({"Insufficient cpu": 3}, False, "Unschedulable"),
    ({}, True, "Unschedulable"),
    ({}, False, "SchedulerError"),
], ids=["with-reasons", "final", "no-reason"])
def test_feedback_as_kube_schedulers_condition_and_event(reasons: dict[str, int], final: bool, reason: str) -> None:
    f = SchedulingFeedback(uid="u1", namespace="ns", name="p", attempt=1,
                           message="0/3 nodes are available: 3 Insufficient cpu.", reasons=reasons, final=final)
    [condition] = condition_patch(f, lambda: 0.0)["status"]["conditions"]
    assert condition == {"type": "PodScheduled", "status": "False", "reason": reason, "message": f.message,
                         "lastProbeTime": None, "lastTransitionTime": "1970-01-01T00:00:00Z"}
    event = event_body(f, lambda: 1.5, "bridge-0")
    assert event["reason"] == "FailedScheduling" and event["type"] == "Warning" and event["note"] == f.message
    assert event["metadata"]["name"] == f"p.{int(1.5e9):x}" and event["regarding"]["uid"] == "u1"


def test_a_reservation_event_as_its_status() -> None:
    e = ReservationEvent(name="r", uid="r1", phase="Succeeded", node="n1", allocated=ResourceList(cpu=1500),
                         current_owners=(CurrentOwner(uid="u9", namespace="ns", name="p"),))
    status = reservation_status(e)["status"]
    assert status["phase"] == "Succeeded" and status["nodeName"] == "n1" and status["allocated"] == {"cpu": "1500m"}
    assert status["currentOwners"] == [{"uid": "u9", "namespace": "ns", "name": "p", "apiVersion": "v1", "kind": "Pod"}]
    failed = reservation_status(ReservationEvent(name="r", uid="r1", phase="Failed", reason="expired"))["status"]
    assert failed["phase"] == "Failed" and failed["conditions"][0]["reason"] == "expired"


def test_the_token_bucket_lets_a_burst_through_then_paces_at_qps() -> None:
    now = [0.0]
    limit = RateLimit(qps=10.0, burst=3, clock=lambda: now[0])
    assert [limit.delay() for _ in range(3)] == [0.0, 0.0, 0.0]  # the burst
    assert limit.delay() == pytest.approx(0.1)  # then one every 1/qps
    assert limit.delay() == pytest.approx(0.2)
    now[0] = 10.0  # idle: the bucket fills again, no more than burst
    assert [limit.delay() for _ in range(3)] == [0.0, 0.0, 0.0] and limit.delay() > 0
