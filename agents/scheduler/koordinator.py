"""Koordinator's QoS classes and priority classes, with Koordinator's defaults.

- QoS (`koordinator.sh/qosClass`: LSE, LSR, LS, BE, SYSTEM). A pod without the label gets the
  class its Kubernetes QoS implies: Guaranteed -> LSR, Burstable -> LS, BestEffort -> BE.
- Priority classes by value range: koord-prod [9000, 9999], koord-mid [7000, 7999],
  koord-batch [5000, 5999], koord-free [3000, 3999]. A pod's class is its
  `priorityClassName` when that names one of them, else the range its priority falls in, else
  the class its QoS implies (SYSTEM, LSE, LSR, LS -> koord-prod; BE -> koord-batch).
- The priority the scheduler uses: the pod's own when it is non-zero, else the default value
  of its class (prod 9500, mid 7500, batch 5500, free 3500; none 0).

The scheduler keeps them beside the pod (`defaults`; `PodInfo.qos`, `PodInfo.priority`), and
`with_defaults(pod)` returns a copy with them filled in; a QoS label with another value is
bad input (`KoordinatorError` names the field).
"""

from __future__ import annotations

from schemas.errors import FieldError
from schemas.records import QOS_CLASSES, QOS_LABEL, ContainerResources, Pod, replace

PROD, MID, BATCH, FREE = "koord-prod", "koord-mid", "koord-batch", "koord-free"
# class -> (lowest, highest, default value)
PRIORITY_CLASSES: dict[str, tuple[int, int, int]] = {
    PROD: (9000, 9999, 9500),
    MID: (7000, 7999, 7500),
    BATCH: (5000, 5999, 5500),
    FREE: (3000, 3999, 3500),
}
_LOWEST = min(low for low, _, _ in PRIORITY_CLASSES.values())  # below it, a priority is in no class
GUARANTEED, BURSTABLE, BEST_EFFORT = "Guaranteed", "Burstable", "BestEffort"
_COMPUTE = ("cpu", "memory")


class KoordinatorError(FieldError):
    """A Koordinator label or annotation with a value Koordinator does not know."""


def kube_qos(pod: Pod) -> str:
    """Kubernetes' QoS class from the containers' cpu and memory requests and limits."""
    containers: tuple[ContainerResources, ...] = pod.containers + pod.init_containers
    if not containers:  # a record built without containers: only the effective request is known
        return BURSTABLE if pod.requests.get("cpu") or pod.requests.get("memory") else BEST_EFFORT
    if not any(c.requests.get(r) or c.limits.get(r) for c in containers for r in _COMPUTE):
        return BEST_EFFORT
    for c in containers:
        for r in _COMPUTE:
            limit = c.limits.get(r)
            if not limit or c.requests.get(r, limit) != limit:  # a missing request defaults to the limit
                return BURSTABLE
    return GUARANTEED


_QOS_OF_KUBE = {GUARANTEED: "LSR", BURSTABLE: "LS", BEST_EFFORT: "BE"}


def qos_class(pod: Pod) -> str:
    label = pod.labels.get(QOS_LABEL) or pod.qos_class
    if label:
        if label not in QOS_CLASSES:
            raise KoordinatorError(f"labels.{QOS_LABEL}", label, f"must be one of {', '.join(QOS_CLASSES)}")
        return label
    return _QOS_OF_KUBE[kube_qos(pod)]


def priority_class(pod: Pod, qos: str | None = None) -> str:
    """The pod's Koordinator priority class (`qos`: its QoS class, when already known)."""
    if pod.priority_class_name in PRIORITY_CLASSES:
        return pod.priority_class_name
    if pod.priority >= _LOWEST:
        for name, (low, high, _) in PRIORITY_CLASSES.items():
            if low <= pod.priority <= high:
                return name
    return BATCH if (qos or qos_class(pod)) == "BE" else PROD


def priority(pod: Pod, qos: str | None = None) -> int:
    if pod.priority != 0:
        return pod.priority
    return PRIORITY_CLASSES[priority_class(pod, qos)][2]


def with_defaults(pod: Pod) -> Pod:
    """The pod with its Koordinator QoS class and priority filled in where it stated none."""
    qos, value = qos_class(pod), priority(pod)
    if qos == pod.qos_class and value == pod.priority:
        return pod
    return replace(pod, qos_class=qos, priority=value)


def defaults(pod: Pod) -> tuple[str, int]:
    """(QoS class, priority) with Koordinator's defaults, without copying the pod."""
    qos = qos_class(pod)
    return qos, priority(pod, qos)
