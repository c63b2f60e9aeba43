"""Koordinator's QoS and priority classes, and their defaults when a pod states none."""

from __future__ import annotations

import pytest

from agents.scheduler import koordinator
from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.state.resources import ResourceSpace
from schemas.records import Claim, ContainerResources, Pod, ResourceList, SchedulingFeedback
from tests.builders import make_node


def container(requests: dict[str, int], limits: dict[str, int] | None = None) -> ContainerResources:
    return ContainerResources("c", ResourceList(requests), ResourceList(limits or {}))


def pod(**kw: object) -> Pod:
    return Pod(uid="p", name="p", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("containers", "expected"), [
    ((container({}),), koordinator.BEST_EFFORT),
    ((container({"cpu": 100}),), koordinator.BURSTABLE),
    ((container({"cpu": 100, "memory": 10}, {"cpu": 100, "memory": 10}),), koordinator.GUARANTEED),
    ((container({}, {"cpu": 100, "memory": 10}),), koordinator.GUARANTEED),  # requests default to limits
    ((container({"cpu": 50, "memory": 10}, {"cpu": 100, "memory": 10}),), koordinator.BURSTABLE),
    ((container({"cpu": 100, "memory": 10}, {"cpu": 100, "memory": 10}), container({"cpu": 1})),
     koordinator.BURSTABLE),
], ids=["best-effort", "burstable", "guaranteed", "limits-only", "request-below-limit", "one-burstable-container"])
def test_kubernetes_qos(containers: tuple[ContainerResources, ...], expected: str) -> None:
    assert koordinator.kube_qos(pod(containers=containers)) == expected


@pytest.mark.parametrize(("fields", "qos", "klass", "priority"), [
    ({"labels": {"koordinator.sh/qosClass": "BE"}}, "BE", "koord-batch", 5500),
    ({"labels": {"koordinator.sh/qosClass": "LSR"}}, "LSR", "koord-prod", 9500),
    ({"containers": (container({"cpu": 1, "memory": 1}, {"cpu": 1, "memory": 1}),)}, "LSR", "koord-prod", 9500),
    ({"containers": (container({"cpu": 1}),)}, "LS", "koord-prod", 9500),
    ({"containers": (container({}),)}, "BE", "koord-batch", 5500),
    ({"priority_class_name": "koord-mid"}, "BE", "koord-mid", 7500),
    ({"priority_class_name": "koord-free", "labels": {"koordinator.sh/qosClass": "BE"}}, "BE", "koord-free", 3500),
    ({"priority": 7200}, "BE", "koord-mid", 7200),
    ({"priority": 123, "labels": {"koordinator.sh/qosClass": "LS"}}, "LS", "koord-prod", 123),
], ids=["be-label", "lsr-label", "guaranteed", "burstable", "best-effort", "class-name", "free", "value-range",
        "own-value-wins"])
def test_qos_and_priority_defaults(fields: dict[str, object], qos: str, klass: str, priority: int) -> None:
    p = pod(**fields)
    assert koordinator.qos_class(p) == qos
    assert koordinator.priority_class(p) == klass
    assert koordinator.priority(p) == priority
    defaulted = koordinator.with_defaults(p)
    assert (defaulted.qos_class, defaulted.priority) == (qos, priority)


def test_defaults_order_the_queue_and_a_bad_qos_label_is_final_feedback() -> None:
    space = ResourceSpace()
    core = SchedulerCore(space, ClusterState.from_records(space, [make_node("a", cpu=1000)]), lambda: 0.0)
    core.add(Pod(uid="batch", name="batch", priority_class_name="koord-batch", requests=ResourceList(cpu=1000)))
    core.add(Pod(uid="prod", name="prod", requests=ResourceList(cpu=1000)))  # Burstable -> LS -> prod, 9500
    bad = core.add(Pod(uid="gold", name="gold", labels={"koordinator.sh/qosClass": "GOLD"}))
    outputs = core.schedule()
    assert [(o.record.uid, o.record.priority) for o in outputs if isinstance(o.record, Claim)] == [("prod", 9500)]
    [feedback] = [o.record for o in bad if isinstance(o.record, SchedulingFeedback)]
    assert feedback.final and "labels.koordinator.sh/qosClass='GOLD'" in feedback.message
