"""Which running pods may be disturbed at all: the descheduler's DefaultEvictor protections,
with its arg names, plus Koordinator's QoS classes.

Never moved unless the args say otherwise: mirror (static) pods, pods already terminating,
DaemonSet pods (any DaemonSet owner reference; `evictDaemonSetPods`), bare pods without a controller (`evictFailedBarePods`
lets failed ones go), system-critical pods (priority >= 2,000,000,000 or the
system-*-critical classes; `evictSystemCriticalPods`), pods with local storage (emptyDir or
hostPath volumes; `evictLocalStoragePods`), pods with a PersistentVolumeClaim when
`ignorePvcPods`, pods at or above `priorityThreshold`, pods younger than `minPodAge`, and
pods of the `protectedQoSClasses` (SYSTEM and LSE by default; the class read as the
scheduler reads it, the `koordinator.sh/qosClass` label first; a label that is not a class
protects the pod). `refusal` returns the reason
(a constant below), or "" for a pod that may go.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agents.rebalance.args import INT32_MAX, duration_s, integer
from agents.scheduler import koordinator
from agents.scheduler.koordinator import KoordinatorError
from agents.scheduler.plugins.args import ArgsError, reject_unknown
from schemas.records import QOS_CLASSES, Pod

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
CRITICAL_CLASSES = frozenset({"system-cluster-critical", "system-node-critical"})
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
LOCAL_STORAGE = frozenset({"emptyDir", "hostPath"})

MIRROR = "mirror pod"
TERMINATING = "terminating"
DAEMONSET = "DaemonSet pod"
BARE = "bare pod (no controller)"
CRITICAL = "system-critical priority"
LOCAL = "local storage"
PVC = "PersistentVolumeClaim"
PRIORITY = "priority at or above priorityThreshold"
YOUNG = "younger than minPodAge"
QOS = "protected QoS class"
BAD_QOS = "QoS class label not valid"

def controller_of(pod: Pod) -> tuple[str, str, str] | None:
    """(kind, name, uid) of the pod's controller owner reference, if any (the first owner when
    none is marked controller, as older manifests leave it out)."""
    refs = pod.owner_references
    for ref in refs:
        if ref.controller:
            return ref.kind, ref.name, ref.uid
    return (refs[0].kind, refs[0].name, refs[0].uid) if refs else None


def workload_of(pod: Pod) -> str:
    """The workload a pod belongs to, "namespace/Kind/name" of its controller ("" if bare)."""
    owner = controller_of(pod)
    return f"{pod.namespace}/{owner[0]}/{owner[1]}" if owner else ""


@dataclass(frozen=True)
class EvictorArgs:
    evict_local_storage_pods: bool = False
    evict_daemon_set_pods: bool = False
    evict_system_critical_pods: bool = False
    ignore_pvc_pods: bool = False
    evict_failed_bare_pods: bool = False
    priority_threshold: int | None = None
    min_pod_age_s: float = 0.0
    protected_qos_classes: frozenset[str] = frozenset({"SYSTEM", "LSE"})

    FLAGS = {"evictLocalStoragePods": "evict_local_storage_pods", "evictDaemonSetPods": "evict_daemon_set_pods",
             "evictSystemCriticalPods": "evict_system_critical_pods", "ignorePvcPods": "ignore_pvc_pods",
             "evictFailedBarePods": "evict_failed_bare_pods"}

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], path: str = "") -> EvictorArgs:
        reject_unknown(raw, {*cls.FLAGS, "priorityThreshold", "minPodAge", "protectedQoSClasses"}, path)
        kw: dict[str, Any] = {}
        for name, attr in cls.FLAGS.items():
            if name in raw:
                if not isinstance(raw[name], bool):
                    raise ArgsError(f"{path}{name}", raw[name], "must be true or false")
                kw[attr] = raw[name]
        if "priorityThreshold" in raw:
            pt = raw["priorityThreshold"]
            if not isinstance(pt, Mapping) or set(pt) != {"value"}:
                raise ArgsError(f"{path}priorityThreshold", pt, "must be {value: <integer priority>}")
            kw["priority_threshold"] = integer(pt, "value", f"{path}priorityThreshold.", None, -INT32_MAX - 1)
        if "minPodAge" in raw:
            kw["min_pod_age_s"] = duration_s(raw["minPodAge"], f"{path}minPodAge")
        if "protectedQoSClasses" in raw:
            classes = raw["protectedQoSClasses"]
            if not isinstance(classes, list) or any(c not in QOS_CLASSES for c in classes):
                raise ArgsError(f"{path}protectedQoSClasses", classes, f"must be a list of {', '.join(QOS_CLASSES)}")
            kw["protected_qos_classes"] = frozenset(classes)
        return cls(**kw)

    def refusal(self, pod: Pod, now: float) -> str:
        """Why `pod` may not be evicted ("" if it may)."""
        if MIRROR_ANNOTATION in pod.annotations:
            return MIRROR
        if pod.deletion_timestamp is not None:
            return TERMINATING
        owner = controller_of(pod)
        if owner is None and not (self.evict_failed_bare_pods and pod.phase == "Failed"):
            return BARE
        if not self.evict_daemon_set_pods and any(ref.kind == "DaemonSet" for ref in pod.owner_references):
            return DAEMONSET
        if not self.evict_system_critical_pods and (pod.priority >= SYSTEM_CRITICAL_PRIORITY
                                                    or pod.priority_class_name in CRITICAL_CLASSES):
            return CRITICAL
        if self.priority_threshold is not None and pod.priority >= self.priority_threshold:
            return PRIORITY
        try:
            qos = koordinator.qos_class(pod)  # the label first, as the scheduler reads it
        except KoordinatorError:
            return BAD_QOS
        if qos in self.protected_qos_classes:
            return QOS
        if not self.evict_local_storage_pods and LOCAL_STORAGE.intersection(pod.volume_kinds):
            return LOCAL
        if self.ignore_pvc_pods and "persistentVolumeClaim" in pod.volume_kinds:
            return PVC
        if now - pod.creation_timestamp < self.min_pod_age_s:
            return YOUNG
        return ""
