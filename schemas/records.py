"""koordstream's records: immutable, versioned events and commands (DESIGN.md, "Records").

Every record is a frozen dataclass with two trailing fields, `kind` (the discriminator on the
wire) and `schema_version` ("MAJOR.MINOR"). Readers ignore unknown fields within a major
version and reject an unknown major version. Resource amounts are `ResourceList`s of canonical
integers (cpu in millicores, everything else in base units); on the wire they are Kubernetes
quantities. Change a record with `dataclasses.replace`.

Keys (DESIGN.md, "Topics and keys"): `Pod`/`PodDeleted`/`Reservation` by uid on `pods`; `Node`/`NodeDeleted`
by name on `nodes` and `node-inbox`; `Claim`, `Commit`, `Release`, `PodTerminated`,
`Nomination`, `NominationCleared` by node on `node-inbox`; `Held`, `Rejected`, `Yield` and
forwarded deletions by decision key on `holds`; `QuotaAsk` / `QuotaReturn` by `quota:<root quota>`
and `QuotaGranted` / `QuotaDenied` by the asker's decision key on `holds`; `Binding`, `Requeue`, `SchedulingFeedback`,
`EvictionCommand` and `EvictionRefused` by uid; `ReservationEvent` by uid on `reservations`; `ReservationExpired` and
`NominationLapsed` by node on `node-inbox`; `NodeStateChange` by node on `state-changes`.
`RuntimeClass` travels on no topic: it is configuration (`sandbox.runtimes`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, NamedTuple, TypeVar

SCHEMA_MAJOR = 1
SCHEMA_VERSION = "1.1"

GANG_NAME_ANNOTATION = "gang.scheduling.koordinator.sh/name"
GANG_MIN_AVAILABLE_ANNOTATION = "gang.scheduling.koordinator.sh/min-available"
GANG_WAITING_TIME_ANNOTATION = "gang.scheduling.koordinator.sh/waiting-time"
GANG_MODE_ANNOTATION = "gang.scheduling.koordinator.sh/mode"
GANG_DEFAULT_WAITING_S = 600.0
POD_GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io"
QOS_LABEL = "koordinator.sh/qosClass"
QOS_CLASSES = ("LSE", "LSR", "LS", "BE", "SYSTEM")  # Koordinator's QoS classes, the label's values
QUOTA_LABEL = "quota.scheduling.koordinator.sh/name"
DEFAULT_SCHEDULER = "default-scheduler"
# A sandbox for AI agents (`agents.sandbox`): a pod made from a sandbox template carries the
# template's hash; one kept warm in a pool also names its pool (its name).
SANDBOX_TEMPLATE_HASH_LABEL = "scheduling.koordinator.sh/sandbox-template-hash"
SANDBOX_POOL_LABEL = "agents.x-k8s.io/warm-pool"


class ResourceList(dict[str, int]):
    """Resource name -> canonical amount. Written as Kubernetes quantities on the wire."""

    def plus(self, other: dict[str, int]) -> ResourceList:
        out = ResourceList(self)
        for name, amount in other.items():
            out[name] = out.get(name, 0) + amount
        return out


def _resources() -> ResourceList:
    return ResourceList()


@dataclass(frozen=True, slots=True)
class Record:
    """Base of every record: `KIND` names it on the wire."""

    KIND: ClassVar[str] = ""


# --- building blocks of Pod and Node ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OwnerReference:
    kind: str
    name: str
    uid: str
    controller: bool = False


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    requests: ResourceList = field(default_factory=_resources)
    limits: ResourceList = field(default_factory=_resources)
    restart_policy: str = ""  # "Always" marks a sidecar init container


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class NodeCondition:
    type: str
    status: str


@dataclass(frozen=True, slots=True)
class GpuDevice:
    minor: int
    model: str = ""
    memory: int = 0  # bytes
    core: int = 100  # koordinator.sh/gpu-core capacity of this GPU
    memory_ratio: int = 100  # koordinator.sh/gpu-memory-ratio capacity of this GPU


@dataclass(frozen=True, slots=True)
class RdmaDevice:
    name: str
    minor: int = 0
    vfs: int = 0  # virtual functions this NIC offers


@dataclass(frozen=True, slots=True)
class NumaCell:
    id: int
    cpus: tuple[int, ...] = ()
    memory: int = 0  # bytes
    cores: tuple[int, ...] = ()  # the physical core of each CPU (same order); empty: one CPU per core


@dataclass(frozen=True, slots=True)
class BoundPod:
    """A pod committed on a node, as its owner reports it: what preemption needs to pick victims."""

    uid: str
    namespace: str = "default"
    name: str = ""
    priority: int = 0
    requests: ResourceList = field(default_factory=_resources)
    quota: str = ""  # the elastic quota it counts against ("" for none)
    devices: tuple[str, ...] = ()  # the devices it holds, as claimed ("gpu/<minor>/<core>/<ratio>", ...)
    # Its claim's decision key, the key of the decider that bound it: where its deletion goes,
    # whatever the pod's later versions or its deletion record say ("": an owner older than it).
    decision_key: str = ""
    sandbox: bool = False  # a sandbox for AI agents (its claim's; `agents.sandbox.runtimes.is_sandbox`)
    warm_pool: str = ""  # the warm pool it belongs to, if any (its claim's)


@dataclass(frozen=True, slots=True)
class ReservationOwner:
    """Who may consume a reservation (Koordinator's `spec.owners[]`; one of three ways):
    an object (the pod's uid, or namespace and name), a controller (the uid, or namespace,
    kind and name, of the pod's controller owner reference), or a label selector."""

    object_uid: str = ""
    object_namespace: str = ""
    object_name: str = ""
    controller_uid: str = ""
    controller_namespace: str = ""
    controller_kind: str = ""
    controller_name: str = ""
    match_labels: dict[str, str] = field(default_factory=dict)
    match_expressions: tuple[dict[str, Any], ...] = ()  # {key, operator: In|NotIn|Exists|DoesNotExist, values}


# --- inputs from the cluster -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pod(Record):
    """A pod as the scheduler sees it. `requests` is the effective request (see `kube`)."""

    KIND: ClassVar[str] = "Pod"
    uid: str
    name: str
    namespace: str = "default"
    resource_version: str = ""
    creation_timestamp: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    owner_references: tuple[OwnerReference, ...] = ()
    scheduler_name: str = DEFAULT_SCHEDULER
    priority: int = 0
    priority_class_name: str = ""
    qos_class: str = ""
    containers: tuple[ContainerResources, ...] = ()
    init_containers: tuple[ContainerResources, ...] = ()
    overhead: ResourceList = field(default_factory=_resources)
    requests: ResourceList = field(default_factory=_resources)
    runtime_class_name: str = ""
    node_selector: dict[str, str] = field(default_factory=dict)
    affinity: dict[str, Any] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    node_name: str = ""
    phase: str = "Pending"
    deletion_timestamp: float | None = None
    # The kinds of its volumes (spec.volumes[].<kind>: "emptyDir", "hostPath",
    # "persistentVolumeClaim", ...), what the rebalancer's evictor protects.
    volume_kinds: tuple[str, ...] = ()
    kind: str = field(default="Pod", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class PodDeleted(Record):
    """The pod is gone from the cluster. Labels and annotations locate its gang."""

    KIND: ClassVar[str] = "PodDeleted"
    uid: str
    name: str = ""
    namespace: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    decision_key: str = ""
    kind: str = field(default="PodDeleted", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


RESERVATION_DEFAULT_TTL_S = 86400.0  # Koordinator's default ttl (24h) when neither ttl nor expires is set
RESERVATION_POLICIES = ("", "Default", "Aligned", "Restricted")


@dataclass(frozen=True, slots=True)
class Reservation(Record):
    """A `scheduling.koordinator.sh/v1alpha1` Reservation: capacity held on one node for the
    pods its `owners` match. Scheduled like a pod from its template (`requests` is the
    template's effective request; selector, affinity, tolerations and priority come from it
    too). `ttl_s` counts from `creation_timestamp` (0, a manifest without one: its node's
    owner counts from when it first read its claim); `expires` is absolute (unix seconds); a
    ttl of 0 never expires. `allocate_once`: the first pod that binds to it ends it.
    `allocate_policy`: "" / Default / Aligned (a pod may take the rest from the node's free
    capacity) or Restricted (resources the reservation holds must come from it alone)."""

    KIND: ClassVar[str] = "Reservation"
    uid: str
    name: str
    owners: tuple[ReservationOwner, ...] = ()
    requests: ResourceList = field(default_factory=_resources)
    ttl_s: float | None = None
    expires: float | None = None
    allocate_once: bool = True
    allocate_policy: str = ""
    creation_timestamp: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    scheduler_name: str = DEFAULT_SCHEDULER
    priority: int = 0
    priority_class_name: str = ""
    node_selector: dict[str, str] = field(default_factory=dict)
    affinity: dict[str, Any] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    kind: str = field(default="Reservation", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)

    @property
    def expires_at(self) -> float | None:
        """When it expires (unix seconds), None for never."""
        if self.expires is not None:
            return self.expires
        ttl = RESERVATION_DEFAULT_TTL_S if self.ttl_s is None else self.ttl_s
        return self.creation_timestamp + ttl if ttl > 0 else None


@dataclass(frozen=True, slots=True)
class ReservationState:
    """An available reservation on a node, as its owner reports it: what it holds and what
    the pods consuming it (held or committed) take of that."""

    reservation: Reservation
    allocated: ResourceList = field(default_factory=_resources)
    consumers: int = 0


@dataclass(frozen=True, slots=True)
class Node(Record):
    KIND: ClassVar[str] = "Node"
    name: str
    resource_version: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    capacity: ResourceList = field(default_factory=_resources)
    allocatable: ResourceList = field(default_factory=_resources)
    unschedulable: bool = False
    conditions: tuple[NodeCondition, ...] = ()
    gpus: tuple[GpuDevice, ...] = ()
    rdma: tuple[RdmaDevice, ...] = ()
    numa: tuple[NumaCell, ...] = ()
    uid: str = ""  # metadata.uid: which object of that name it is (a node deleted and added again is another)
    kind: str = field(default="Node", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class NodeDeleted(Record):
    """The node object `name` was deleted. `uid`: the deleted object's `metadata.uid` (empty in
    records written before it was carried: the node of that name, whichever it is). An owner
    ignores the deletion of another object than the node it has (`agents.state.owner`): a
    deletion delivered again after the node was added again deletes nothing new."""

    KIND: ClassVar[str] = "NodeDeleted"
    name: str
    uid: str = ""
    kind: str = field(default="NodeDeleted", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class ScaleDownEvent(Record):
    """A workload asks to lose `replicas` pods; the rebalancer picks which."""

    KIND: ClassVar[str] = "ScaleDownEvent"
    workload: str
    namespace: str = "default"
    replicas: int = 1
    kind: str = field(default="ScaleDownEvent", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class RuntimeClass(Record):
    """A `node.k8s.io/v1` RuntimeClass, with koordstream's QoS rule for the pods that run in it.

    `handler` names the CRI handler (`runsc`, `kata-qemu`, ...); `overhead` is the class's
    `overhead.podFixed`, added to the request of every pod that names the class; `node_selector`
    and `tolerations` are its `scheduling` (merged into such a pod's). `qos_classes`: the
    Koordinator QoS classes (`koordinator.sh/qosClass`) a pod of the class may run as (empty:
    any); `default_qos_class`: the class a pod that names none gets ("": Koordinator's default,
    from the pod's Kubernetes QoS). Runtime classes are configuration (`sandbox.runtimes`,
    `agents.sandbox.runtimes`), read by every scheduler worker at start, not events on a topic."""

    KIND: ClassVar[str] = "RuntimeClass"
    name: str
    handler: str
    overhead: ResourceList = field(default_factory=_resources)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    qos_classes: tuple[str, ...] = ()
    default_qos_class: str = ""
    kind: str = field(default="RuntimeClass", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


# --- the commit protocol ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claim(Record):
    """A scheduler asks a node's owner to hold capacity for one attempt of one pod."""

    KIND: ClassVar[str] = "Claim"
    uid: str
    attempt: int
    node: str
    decision_key: str
    requests: ResourceList
    priority: int = 0
    namespace: str = "default"
    name: str = ""
    creation_timestamp: float = 0.0
    devices: tuple[str, ...] = ()  # devices claimed, e.g. "gpu/<minor>/<core>/<ratio>" (cpusets too)
    gang_min: int = 0  # min-available of the pod's gang; 0 when it has none
    gang_waiting_s: float = 0.0  # how long held members wait for the rest (0: the default, 600 s)
    gang_strict: bool = True  # Strict mode: one member's failure releases the whole gang
    nominated_node: str = ""  # where the pod was nominated, cleared on accept
    quota: str = ""  # the elastic quota the pod counts against
    reservation: str = ""  # the uid of the reservation the pod consumes first
    reserving: Reservation | None = None  # set when the claim is for a reservation itself
    # Wall time (s) when the scheduler began the cycle that placed it; owners and deciders
    # refuse a claim (and its answer) that reaches them later than half the state retention
    # (docs/architecture.md, "How long state is kept"). 0: not stamped.
    scheduled_at: float = 0.0
    # The pod is a sandbox (`agents.sandbox.runtimes.is_sandbox`), of this warm pool: owners keep
    # both with the hold and report them with the bound pod, from which every scheduler replica
    # learns how long sandboxes live and how many pods a pool has placed (`agents.sandbox.feedback`).
    sandbox: bool = False
    warm_pool: str = ""
    kind: str = field(default="Claim", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)

    @property
    def hold_id(self) -> str:
        return hold_id(self.uid, self.attempt, self.node)


@dataclass(frozen=True, slots=True)
class Held(Record):
    """The owner holds the claim's capacity; the decider will accept or release it."""

    KIND: ClassVar[str] = "Held"
    uid: str
    attempt: int
    node: str
    decision_key: str
    namespace: str = "default"
    name: str = ""
    gang_min: int = 0
    gang_waiting_s: float = 0.0
    gang_strict: bool = True
    nominated_node: str = ""
    devices: tuple[str, ...] = ()  # as claimed; the decider writes them on the Binding
    scheduled_at: float = 0.0  # the claim's
    quota: str = ""  # the claim's elastic quota: its decider asks the quota's ledger before it commits
    requests: ResourceList = field(default_factory=_resources)  # as claimed: what the quota is asked for
    kind: str = field(default="Held", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)

    @property
    def hold_id(self) -> str:
        return hold_id(self.uid, self.attempt, self.node)


@dataclass(frozen=True, slots=True)
class Rejected(Record):
    KIND: ClassVar[str] = "Rejected"
    uid: str
    attempt: int
    node: str
    decision_key: str
    reason: str
    soft: bool = False  # the owner asked a lower-ranked gang to yield: retry, no Strict give-up
    fellow: bool = False  # only fellow members of its own gang hold what it asked for: no Strict give-up
    scheduled_at: float = 0.0  # the claim's
    kind: str = field(default="Rejected", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)

    @property
    def hold_id(self) -> str:
        return hold_id(self.uid, self.attempt, self.node)


@dataclass(frozen=True, slots=True)
class GangTimeout(Record):
    """A gang's waiting time ran out (`round`: which wait). The deciders' agent appends it to
    the gang's own `holds` partition when the timer it armed fires, so the decision to give
    up comes from the log, never from a clock read inside the decider."""

    KIND: ClassVar[str] = "GangTimeout"
    decision_key: str
    round: int
    kind: str = field(default="GangTimeout", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class Yield(Record):
    """Wound-wait between gangs: an owner rejected a claim of a higher-ranked gang (`winner`)
    because this gang's held, not yet accepted, claims (`holds`, on `node`) take the capacity;
    its decider releases every held member and requeues them if they are still waiting."""

    KIND: ClassVar[str] = "Yield"
    decision_key: str
    node: str
    holds: tuple[str, ...]
    winner: str
    kind: str = field(default="Yield", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class QuotaItem:
    """One pod's share of a `QuotaAsk`: the quota it counts against and what it requests."""

    uid: str
    quota: str
    requests: ResourceList = field(default_factory=_resources)


@dataclass(frozen=True, slots=True)
class QuotaAsk(Record):
    """A decider asks the ledger of an elastic quota tree (key `quota:<root quota>` on `holds`)
    to admit pods it is about to commit (`group`: the pods it accepts together, a pod's hold id
    or a gang's round). All of them are granted, or none."""

    KIND: ClassVar[str] = "QuotaAsk"
    decision_key: str  # quota:<root>
    asker: str  # the asking decider's decision key
    group: str
    items: tuple[QuotaItem, ...]
    kind: str = field(default="QuotaAsk", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class QuotaGranted(Record):
    """The quota ledger counts the group's pods (`uids`) against their quotas: commit them."""

    KIND: ClassVar[str] = "QuotaGranted"
    decision_key: str  # the asker's
    group: str
    quota_key: str  # quota:<root>
    uids: tuple[str, ...]
    kind: str = field(default="QuotaGranted", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class QuotaDenied(Record):
    """The group would take a quota past its max: its decider releases and requeues it."""

    KIND: ClassVar[str] = "QuotaDenied"
    decision_key: str  # the asker's
    group: str
    quota_key: str
    reason: str
    kind: str = field(default="QuotaDenied", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class QuotaReturn(Record):
    """A decider gives back what the ledger granted `group` for `uids` (the pods ended, or the
    group was not committed after all); a grant since moved to another group stays."""

    KIND: ClassVar[str] = "QuotaReturn"
    decision_key: str  # quota:<root>
    asker: str
    group: str
    uids: tuple[str, ...]
    kind: str = field(default="QuotaReturn", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class GangHold:
    """A gang member's claim held on a node and not yet accepted (owners report them, so a
    higher-ranked gang's scheduler may claim that capacity and have the owner ask for it)."""

    hold_id: str
    decision_key: str
    priority: int
    created: float
    requests: ResourceList = field(default_factory=_resources)


@dataclass(frozen=True, slots=True)
class Commit(Record):
    KIND: ClassVar[str] = "Commit"
    uid: str
    attempt: int
    node: str
    decision_key: str
    kind: str = field(default="Commit", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)

    @property
    def hold_id(self) -> str:
        return hold_id(self.uid, self.attempt, self.node)


@dataclass(frozen=True, slots=True)
class Release(Record):
    KIND: ClassVar[str] = "Release"
    uid: str
    attempt: int
    node: str
    decision_key: str
    reason: str = ""
    kind: str = field(default="Release", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)

    @property
    def hold_id(self) -> str:
        return hold_id(self.uid, self.attempt, self.node)


@dataclass(frozen=True, slots=True)
class PodTerminated(Record):
    """A bound pod is gone (finished, deleted, evicted, or its node deleted): free it."""

    KIND: ClassVar[str] = "PodTerminated"
    uid: str
    node: str
    decision_key: str = ""
    reason: str = ""
    kind: str = field(default="PodTerminated", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class Nomination(Record):
    """A preemptor is promised capacity on `node`, with its full claim."""

    KIND: ClassVar[str] = "Nomination"
    uid: str
    node: str
    priority: int
    requests: ResourceList
    devices: tuple[str, ...] = ()
    kind: str = field(default="Nomination", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class NominationCleared(Record):
    KIND: ClassVar[str] = "NominationCleared"
    uid: str
    node: str
    kind: str = field(default="NominationCleared", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class NominationLapsed(Record):
    """A nomination's time ran out (`scheduling.nomination_ttl_s`): the owners' agent appends it
    to the node's `node-inbox` partition when the timer it armed fires. `since` is the log time
    the owner recorded the nomination it is for: a nomination made again since then (a new
    preemption, or a copy of the Nomination delivered late) has another and does not lapse."""

    KIND: ClassVar[str] = "NominationLapsed"
    uid: str
    node: str
    since: float
    kind: str = field(default="NominationLapsed", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class Binding(Record):
    """The decider's final word: the pod runs on `node`. Written once per pod."""

    KIND: ClassVar[str] = "Binding"
    uid: str
    namespace: str
    name: str
    node: str
    attempt: int
    decision_key: str
    annotations: dict[str, str] = field(default_factory=dict)  # device / NUMA results
    kind: str = field(default="Binding", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)

    @property
    def hold_id(self) -> str:
        return hold_id(self.uid, self.attempt, self.node)


@dataclass(frozen=True, slots=True)
class Requeue(Record):
    """The decider sends a pod back to its scheduler for attempt `attempt`."""

    KIND: ClassVar[str] = "Requeue"
    uid: str
    attempt: int
    decision_key: str
    reason: str = ""
    kind: str = field(default="Requeue", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class Alternative:
    """One way a pod that cannot be placed would be placed now, found by the scheduling core
    (`agents.sandbox.feedback`): `kind` (SmallerRequest, QoSClass, RuntimeClass, ScaleWarmPool,
    Wait), a sentence for people, and `changes`: the fields to change, by their path in the
    pod's manifest (`spec.runtimeClassName`, `metadata.labels.koordinator.sh/qosClass`,
    `spec.containers[0].resources.requests.cpu`, ...), to their new values (quantities as
    Kubernetes writes them)."""

    kind: str
    description: str
    changes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SchedulingFeedback(Record):
    """Why a pod could not be placed: reasons with the number of nodes that gave each.

    For a sandbox (`agents.sandbox.runtimes.is_sandbox`) it also carries a hint a program can
    act on: `reason` (a code: InsufficientResources, NoMatchingNode, RuntimeClassNotFound,
    QoSClassNotAllowed, ...), `next_step` (the kind of the first alternative, or Wait,
    FixPod, AddCapacity), `retry_after_s` (when enough capacity is expected to free, None
    when there is no estimate) and `alternatives`, each checked through the scheduling core
    against the cluster as it was when the pod failed."""

    KIND: ClassVar[str] = "SchedulingFeedback"
    uid: str
    namespace: str
    name: str
    attempt: int
    message: str
    reasons: dict[str, int] = field(default_factory=dict)
    final: bool = False  # the pod will not be retried without a cluster change
    reason: str = ""
    next_step: str = ""
    retry_after_s: float | None = None
    alternatives: tuple[Alternative, ...] = ()
    kind: str = field(default="SchedulingFeedback", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class EvictionCommand(Record):
    KIND: ClassVar[str] = "EvictionCommand"
    uid: str
    namespace: str
    name: str
    node: str
    reason: str
    preemptor_uid: str = ""
    kind: str = field(default="EvictionCommand", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class EvictionRefused(Record):
    """The API server refused an `EvictionCommand` for good: the pod stays. The bridge sends it
    on `evictions` (by uid, after the command) once a 429 from a PodDisruptionBudget persisted
    past `bridge.eviction_retry_s`, or the call failed otherwise; `status` is the HTTP code."""

    KIND: ClassVar[str] = "EvictionRefused"
    uid: str
    namespace: str
    name: str
    node: str
    reason: str
    status: int = 0
    kind: str = field(default="EvictionRefused", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class CurrentOwner:
    """A pod that consumes a reservation (an entry of Koordinator's Reservation
    `status.currentOwners`, an object reference)."""

    uid: str
    namespace: str = ""
    name: str = ""


@dataclass(frozen=True, slots=True)
class ReservationEvent(Record):
    """A reservation changed phase, as its node's owner decided: Available (it holds capacity
    on `node`), Succeeded (an allocate-once reservation was consumed), Failed (expired, or its
    node was deleted; `reason` says which). `current_owners` are the pods that consumed it when
    it ended (Koordinator's `status.currentOwners`): for Succeeded, the pod bound into it."""

    KIND: ClassVar[str] = "ReservationEvent"
    name: str
    uid: str
    phase: str
    node: str = ""
    reason: str = ""
    requests: ResourceList = field(default_factory=_resources)
    allocated: ResourceList = field(default_factory=_resources)
    current_owners: tuple[CurrentOwner, ...] = ()
    kind: str = field(default="ReservationEvent", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class MigrationJob(Record):
    """One move of a running pod (Koordinator's PodMigrationJob), as the rebalancer last
    recorded it: `phase` (Pending, Running, Succeeded, Failed, Aborted) and `reason`; `step`
    says where a Running job is (reserving, evicting, replacing; terminating for an
    EvictDirectly job whose eviction was sent). ReservationFirst moves own the Reservation
    `reservation`, pinned to `destination` when one was planned. Every effect of a job can be
    derived from its record: a new leader sends again what the record says was sent."""

    KIND: ClassVar[str] = "MigrationJob"
    uid: str
    pod_uid: str
    namespace: str = "default"
    pod_name: str = ""
    workload: str = ""
    source: str = ""
    destination: str = ""
    mode: str = "ReservationFirst"
    phase: str = "Pending"
    step: str = ""
    reason: str = ""
    reservation: str = ""
    reserved_on: str = ""
    created: float = 0.0
    ttl_s: float = 300.0
    updated: float = 0.0
    version: int = 0  # bumped each time the job is recorded: of two versions, a reader keeps the higher
    released: bool = False  # ended with its reservation deleted (a new leader sends the deletion again)
    kind: str = field(default="MigrationJob", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class ReservationExpired(Record):
    """A reservation's time ran out. The owners' agent appends it to the node's `node-inbox`
    partition when the timer it armed fires; the owner ends the reservation when it reads it."""

    KIND: ClassVar[str] = "ReservationExpired"
    uid: str
    node: str
    kind: str = field(default="ReservationExpired", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class NodeStateChange(Record):
    """An owner's view of one node after a batch: totals plus the holds that changed.

    `used` counts committed and held capacity. `holds` maps each hold id touched by the
    batch to its state (held, committed, released, rejected, terminated), so schedulers can
    forget their assumptions. `seq` grows with every change of the node. `node_record` is the
    Node as last published (labels, taints, devices), sent when it changed in the batch;
    `nominations` are every pod nominated to the node, with their full claims; `committed` are
    the pods committed in the batch (terminations show up in `holds`), so that schedulers know
    every bound pod's priority and request (preemption picks victims among them);
    `device_usage` is what committed and held claims use of each GPU; `reservations` are the
    node's available reservations (`used` counts what is left in each, not yet consumed).
    """

    KIND: ClassVar[str] = "NodeStateChange"
    node: str
    seq: int
    allocatable: ResourceList = field(default_factory=_resources)
    used: ResourceList = field(default_factory=_resources)
    unschedulable: bool = False
    deleted: bool = False
    holds: dict[str, str] = field(default_factory=dict)
    node_record: Node | None = None
    nominations: tuple[Nomination, ...] = ()
    committed: tuple[BoundPod, ...] = ()
    device_usage: dict[str, int] = field(default_factory=dict)  # "gpu/<minor>/core" | ".../ratio" -> used
    reservations: tuple[ReservationState, ...] = ()  # every available reservation on the node
    gang_holds: tuple[GangHold, ...] = ()  # every gang member held on the node, not yet accepted
    kind: str = field(default="NodeStateChange", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class DeadLetter(Record):
    """An input that could not be accepted, with where it came from and its original bytes
    (on the first letter of a message only: a batch whose shared value is bad fails every
    member, and each letter carrying the whole message would multiply it by the members)."""

    KIND: ClassVar[str] = "DeadLetter"
    error: str
    field: str
    value: str
    topic: str
    partition: int
    offset: int
    original: str  # base64 of the original message value; "" on a message's later letters
    # (`field` names a record field here, so the dataclasses helper is reached by module.)
    kind: str = dataclasses.field(default="DeadLetter", init=False)
    schema_version: str = dataclasses.field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class ProfilingSample(Record):
    KIND: ClassVar[str] = "ProfilingSample"
    profile: str
    plugin: str
    extension_point: str
    duration_ns: int
    pods: int = 1
    kind: str = field(default="ProfilingSample", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class AttemptsSample(Record):
    """Scheduling attempts a profile made since its last sample, by result (kube-scheduler's
    `scheduler_schedule_attempts_total`: scheduled, unschedulable, error). `batched`, for
    result scheduled: how many of those pods were placed as members of an equivalence class
    (filtered and scored once for the class) rather than by the full path."""

    KIND: ClassVar[str] = "AttemptsSample"
    profile: str
    result: str
    count: int
    batched: int = 0
    kind: str = field(default="AttemptsSample", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class PodDisruptionBudget(Record):
    """A `policy/v1` PodDisruptionBudget: pods of `namespace` whose labels match `selector` (a
    label selector as Kubernetes writes it: matchLabels, matchExpressions); at most one of
    `min_available` and `max_unavailable`, each an integer or "N%" as text ("" when unset).
    `uid` ("namespace/name" unless the manifest has one) is its key; `deleted` removes it."""

    KIND: ClassVar[str] = "PodDisruptionBudget"
    uid: str
    name: str
    namespace: str = "default"
    selector: dict[str, Any] = field(default_factory=dict)
    min_available: str = ""
    max_unavailable: str = ""
    deleted: bool = False
    kind: str = field(default="PodDisruptionBudget", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


# --- sandboxes (agent-sandbox's `extensions.agents.x-k8s.io/v1beta1`; `agents.sandbox`) -------

SANDBOX_CLAIM_UID_LABEL = "agents.x-k8s.io/claim-uid"  # on an adopted or cold pod: its claim's uid
SANDBOX_NAME_ANNOTATION = "agents.x-k8s.io/sandbox-name"  # on a claim: the pod it got
ENV_POLICIES = ("Disallowed", "Allowed", "Overrides")
SHUTDOWN_POLICIES = ("Retain", "Delete", "DeleteForeground")
UPDATE_STRATEGIES = ("OnReplenish", "Recreate")
OVERFLOW_POLICIES = ("Allow", "Deny")
BURST_MODES = ("Reserve", "AccountingOnly")


@dataclass(frozen=True, slots=True)
class EnvVar:
    """An environment variable a claim injects (agent-sandbox's EnvVar)."""

    name: str
    value: str = ""
    container_name: str = ""


@dataclass(frozen=True, slots=True)
class SandboxTemplate(Record):
    """A SandboxTemplate: the pod every sandbox of it starts from (`pod`: its podTemplate as a
    Pod record, uid and name empty) and whether claims may inject environment variables
    (`env_policy`: Disallowed, Allowed, Overrides; `env_names`: the variables its containers
    define, which Allowed keeps a claim from overriding). `hash` is the pods' equivalence signature
    (`agents.sandbox.templates.template_hash`), set where the template is converted; its pods
    carry it as the label `scheduling.koordinator.sh/sandbox-template-hash`. `pod_spec` is the
    podTemplate's `spec` as the manifest has it (containers, images, volumes: what a Pod record
    does not carry), from which the bridge creates the pool's pods in the API server; empty for
    a template published without a manifest. It travels inside the SandboxWarmPools that use
    it, never alone on a topic (so it is not in `RECORD_TYPES`)."""

    KIND: ClassVar[str] = "SandboxTemplate"
    namespace: str
    name: str
    pod: Pod
    env_policy: str = "Disallowed"
    env_names: tuple[str, ...] = ()
    hash: str = ""
    pod_spec: dict[str, Any] = field(default_factory=dict)
    kind: str = field(default="SandboxTemplate", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class SandboxWarmPool(Record):
    """A SandboxWarmPool, keyed by its name on `sandbox` (its warm pools' table entry is
    `namespace/name`): `replicas` sandboxes of
    `template` kept started. The pool carries its template resolved (where it was published:
    `schemas.kube`, the bridge), so that the pool's partition alone decides everything about
    it; publishing the pool again with a changed template is a template update
    (`update_strategy`: OnReplenish or Recreate). koordstream's own fields (annotations
    `sandbox.koordstream.io/*` on a manifest): `overflow` (Allow: a claim that finds the pool
    empty starts a sandbox through the scheduler; Deny: it is refused with feedback),
    `refill_per_s` and `refill_batch` (the rate limit of refills: at most `refill_batch` pods
    per round, `refill_per_s` a second)."""

    KIND: ClassVar[str] = "SandboxWarmPool"
    namespace: str
    name: str
    template: SandboxTemplate
    replicas: int = 0
    update_strategy: str = "OnReplenish"
    overflow: str = "Allow"
    refill_per_s: float = 500.0
    refill_batch: int = 200
    uid: str = ""
    generation: int = 0  # the manifest's metadata.generation (0: not from the API server)
    kind: str = field(default="SandboxWarmPool", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class SandboxWarmPoolDeleted(Record):
    """The pool is gone: its unclaimed sandboxes are deleted; claimed ones stay with their claims."""

    KIND: ClassVar[str] = "SandboxWarmPoolDeleted"
    namespace: str
    name: str
    kind: str = field(default="SandboxWarmPoolDeleted", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class SandboxClaim(Record):
    """A SandboxClaim (v1beta1: `warmPoolRef`, `lifecycle`, `additionalPodMetadata`, `env`),
    keyed by its pool's name (`warm_pool`) on `sandbox`. `created` is when it was published
    (unix seconds): latency counts from it. `shutdown_time` (unix seconds) ends the sandbox;
    `shutdown_policy` says whether the claim's status then reads Expired (Retain) or Deleted."""

    KIND: ClassVar[str] = "SandboxClaim"
    uid: str
    namespace: str
    name: str
    warm_pool: str
    env: tuple[EnvVar, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    shutdown_time: float | None = None
    shutdown_policy: str = "Retain"
    created: float = 0.0
    generation: int = 0  # the manifest's metadata.generation (0: not from the API server)
    kind: str = field(default="SandboxClaim", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class SandboxClaimDeleted(Record):
    """The claim is gone: its sandbox is deleted."""

    KIND: ClassVar[str] = "SandboxClaimDeleted"
    uid: str
    namespace: str
    name: str
    warm_pool: str
    kind: str = field(default="SandboxClaimDeleted", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class SandboxBurst(Record):
    """"Capacity for `count` sandboxes of the pool's template for the next `ttl_s` seconds",
    keyed by its pool on `sandbox`. `mode` Reserve: Reservations on the hold protocol, consumed
    first by the pool's cold-path pods, released on their ttl; AccountingOnly: the capacity is
    counted against the pool (claims beyond it are refused) and nothing is held on nodes."""

    KIND: ClassVar[str] = "SandboxBurst"
    namespace: str
    name: str
    warm_pool: str
    count: int
    ttl_s: float = 600.0
    mode: str = "Reserve"
    created: float = 0.0
    kind: str = field(default="SandboxBurst", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class SandboxTick(Record):
    """A pool's timer fired (refill rate limit, claims' shutdown times): the pool's agent
    appends it to the pool's own `sandbox` partition, so time enters its decisions from the log."""

    KIND: ClassVar[str] = "SandboxTick"
    namespace: str
    name: str
    at: float
    kind: str = field(default="SandboxTick", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class SandboxClaimStatus(Record):
    """A claim's answer, keyed by the claim's uid on `sandbox-status`. `phase`: Ready (its
    sandbox is `sandbox` on `node`), Pending (a sandbox is starting for it), Refused (with
    `reason`, `message`, `next_step`, `retry_after_s` and `alternatives`), Expired or Deleted.
    `path`: warm (a ready sandbox adopted at once), starting (a pool sandbox still starting),
    cold (a sandbox started for it through the scheduler). `claimed_at` is the claim's
    `created`; `answered_at` the log time of what decided it."""

    KIND: ClassVar[str] = "SandboxClaimStatus"
    uid: str
    namespace: str
    name: str
    warm_pool: str
    phase: str
    path: str = ""
    sandbox: str = ""
    pod_uid: str = ""
    node: str = ""
    env: tuple[EnvVar, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    message: str = ""
    next_step: str = ""
    retry_after_s: float | None = None
    alternatives: tuple[Alternative, ...] = ()
    claimed_at: float = 0.0
    answered_at: float = 0.0
    observed_generation: int = 0  # the generation of the claim this answers (its first decided)
    kind: str = field(default="SandboxClaimStatus", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


@dataclass(frozen=True, slots=True)
class SandboxPoolStatus(Record):
    """A pool's status, keyed by the pool's name on `sandbox-status` after every batch that
    changed it: `ready` (started, unclaimed: the pool's depth), `starting`, `claimed` (live
    sandboxes of claims), and counters since the pool was created: claims, warm hits (claims
    that adopted a ready sandbox), starting and cold paths, refusals."""

    KIND: ClassVar[str] = "SandboxPoolStatus"
    namespace: str
    name: str
    replicas: int
    ready: int = 0
    starting: int = 0
    claimed: int = 0
    claims: int = 0
    warm_hits: int = 0
    starting_hits: int = 0
    cold: int = 0
    refused: int = 0
    reserved: int = 0
    message: str = ""
    at: float = 0.0
    observed_generation: int = 0  # the generation of the pool record this status reflects
    kind: str = field(default="SandboxPoolStatus", init=False)
    schema_version: str = field(default=SCHEMA_VERSION, init=False)


RECORD_TYPES: tuple[type[Record], ...] = (
    Pod, PodDeleted, Reservation, Node, NodeDeleted, ScaleDownEvent, Claim, Held, Rejected, GangTimeout, Commit, Release,
    PodTerminated, Nomination, NominationCleared, NominationLapsed, Binding, Yield, Requeue, SchedulingFeedback,
    EvictionCommand, EvictionRefused, ReservationEvent, ReservationExpired, NodeStateChange, DeadLetter, ProfilingSample, AttemptsSample,
    MigrationJob, PodDisruptionBudget, QuotaAsk, QuotaGranted, QuotaDenied, QuotaReturn, RuntimeClass,
    SandboxWarmPool, SandboxWarmPoolDeleted, SandboxClaim, SandboxClaimDeleted, SandboxBurst,
    SandboxTick, SandboxClaimStatus, SandboxPoolStatus,
)
BY_KIND: dict[str, type[Record]] = {cls.KIND: cls for cls in RECORD_TYPES}


def quick_init(cls: type[Any]) -> None:
    """Give a frozen, slotted dataclass an `__init__` that sets each slot through the slot's
    own descriptor instead of `object.__setattr__` (what `dataclasses` writes for frozen
    classes): the same signature, defaults and result at half the cost. Records are built by
    the hundred thousand a second (decoded, replaced, carried), and the frozen `__init__`
    was the largest single cost of the state worker. `tests/unit/test_codec_fast_path.py` checks
    that both build equal records with equal signatures."""
    fields = dataclasses.fields(cls)
    if hasattr(cls, "__post_init__") or any(f.kw_only for f in fields):
        raise TypeError(f"quick_init does not handle {cls.__name__}'s __post_init__ or keyword-only fields")
    original = inspect.signature(cls.__init__).parameters
    scope: dict[str, Any] = {}
    params, body = ["self"], []
    for index, f in enumerate(fields):
        if not f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            continue  # left unset, as dataclasses leaves it
        scope[f"set{index}"] = _slot(cls, f.name).__set__
        if f.default is not dataclasses.MISSING:
            scope[f"default{index}"] = f.default
            value = f.name if f.init else f"default{index}"
            params.append(f"{f.name}=default{index}" if f.init else "")
        elif f.default_factory is not dataclasses.MISSING:
            scope[f"factory{index}"] = f.default_factory
            if f.init:  # the marker dataclasses gives such a parameter as its default
                scope[f"marker{index}"] = original[f.name].default
            value = f"(factory{index}() if {f.name} is marker{index} else {f.name})" if f.init else f"factory{index}()"
            params.append(f"{f.name}=marker{index}" if f.init else "")
        else:
            value = f.name
            params.append(f.name)
        body.append(f"    set{index}(self, {value})")
    source = f"def __init__({', '.join(p for p in params if p)}):\n" + "\n".join(body or ["    pass"])
    exec(source, scope)  # noqa: S102 - built above from the class's own fields
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__dataclass_init__ = cls.__init__  # kept for the test that compares the two
    cls.__init__ = init


_R = TypeVar("_R")
_REPLACERS: dict[type[Any], Callable[[Any, dict[str, Any]], Any]] = {}


def replace(record: _R, /, **changes: Any) -> _R:
    """`dataclasses.replace` for records, at half its cost: the same result (an init field not
    given is copied, one that cannot be given takes its default) and the same refusals, from a
    function made once per record class that sets each slot through its descriptor. A record is
    replaced a few times on its way (admitted, stamped, decoded with its effective requests);
    other dataclasses go to `dataclasses.replace`."""
    made = _REPLACERS.get(type(record))
    if made is None:
        return dataclasses.replace(record, **changes)  # type: ignore[type-var]
    out: _R = made(record, changes)
    return out


def _replacer(cls: type[Any]) -> Callable[[Any, dict[str, Any]], Any]:
    fields = dataclasses.fields(cls)
    given = frozenset(f.name for f in fields if f.init)
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls, "given": given, "slow": dataclasses.replace}
    body = ["def replacer(record, changes):",
            "    if changes.keys() - given:",
            "        return slow(record, **changes)  # its refusal, word for word"]
    body.append("    out = new(cls)")
    for index, f in enumerate(fields):
        slot = _slot(cls, f.name)
        scope[f"set{index}"], scope[f"get{index}"] = slot.__set__, slot.__get__
        if f.init:
            body.append(f"    set{index}(out, changes[{f.name!r}] if {f.name!r} in changes else get{index}(record))")
        elif f.default is not dataclasses.MISSING:
            scope[f"default{index}"] = f.default
            body.append(f"    set{index}(out, default{index})")
        elif f.default_factory is not dataclasses.MISSING:
            scope[f"factory{index}"] = f.default_factory
            body.append(f"    set{index}(out, factory{index}())")
    body.append("    return out")
    exec("\n".join(body), scope)  # noqa: S102 - built above from the class's own fields
    replacer: Callable[[Any, dict[str, Any]], Any] = scope["replacer"]
    return replacer


def _slot(cls: type[Any], name: str) -> Any:
    """The slot descriptor of a field of a slotted class (on the class that declares it)."""
    return next(k.__dict__[name] for k in cls.__mro__ if name in k.__dict__)


def _quick_records() -> None:
    for value in list(globals().values()):
        if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == __name__:
            quick_init(value)
            _REPLACERS[value] = _replacer(value)


_quick_records()


class HoldStatus(StrEnum):
    """A hold's state at its node's owner, as `NodeStateChange.holds` reports it."""

    HELD = "held"  # capacity held for the claim; the decider will accept or release it
    COMMITTED = "committed"  # accepted: the pod is bound there
    RELEASED = "released"  # given back before it was committed
    REJECTED = "rejected"  # refused (no room, node gone, ...)
    TERMINATED = "terminated"  # was committed; the pod is gone


def hold_id(uid: str, attempt: int, node: str) -> str:
    """The identity of one claim: a pod's attempt on a node (`HoldId.parse` reads it back)."""
    return f"{uid}/{attempt}/{node}"


class HoldId(NamedTuple):
    """The parts of a hold id."""

    uid: str
    attempt: int
    node: str

    @classmethod
    def parse(cls, hid: str) -> HoldId:
        """The inverse of `hold_id`: the node and the attempt are the last two parts (neither
        holds a "/"; a uid may)."""
        uid, attempt, node = hid.rsplit("/", 2)
        return cls(uid, int(attempt), node)


def decision_key(namespace: str, labels: dict[str, str], annotations: dict[str, str], uid: str) -> str:
    """The gang (namespace/name) a pod belongs to, else its uid (DESIGN.md, "Topics and keys")."""
    gang = annotations.get(GANG_NAME_ANNOTATION) or labels.get(POD_GROUP_LABEL)
    return f"{namespace}/{gang}" if gang else uid


def carry(target: type[Any], source: object, **given: Any) -> Any:
    """`target(...)` with each of its fields that `source` has an attribute of the same name
    for copied from it, then `given`. This is how a claim's fields travel: Claim -> the
    owner's hold (`HoldEntry`) -> Held (and the decider's waiting entry -> Binding): a field
    declared on the next record under the same name travels without code of its own.
    Sequences take the target's kind (a tuple on records, a list on JSON-backed entries) and
    mappings are copied, so no two records share a mutable value. For a dataclass source the
    copying is a function made once per target, source class and names given (`_carrier`),
    as the owners carry a claim twice per pod."""
    key = (target, type(source), tuple(given))
    made = _CARRIERS.get(key)
    if made is None:
        made = _CARRIERS[key] = _carrier(target, type(source), given)
    try:
        return made(source, given)
    except AttributeError:  # an attribute its class declares, missing on this instance
        return _carry_slowly(target, source, given)


def _carry_slowly(target: type[Any], source: object, given: dict[str, Any]) -> Any:
    values: dict[str, Any] = {}
    for name, kind in _carried_kinds(target).items():
        if name in given or not hasattr(source, name):
            continue
        value = getattr(source, name)
        if kind is not None and value is not None:
            value = kind(value)
        values[name] = value
    return target(**values, **given)


_CARRIERS: dict[tuple[type[Any], type[Any], tuple[str, ...]], Callable[[Any, dict[str, Any]], Any]] = {}


def _carrier(target: type[Any], source: type[Any], given: dict[str, Any]) -> Callable[[Any, dict[str, Any]], Any]:
    """`carry` for one target, source class and names given, as straight-line code: the names
    the source's instances have are its dataclass fields and its class's attributes, and, for
    a class without slots, whatever else of the target's an instance has of its own."""
    if not dataclasses.is_dataclass(source) or hasattr(source, "__getattr__"):
        return functools.partial(_carry_slowly, target)
    fields = {f.name for f in dataclasses.fields(source)}
    scope: dict[str, Any] = {"target": target, "own_values": _own_values}
    body, args, own = ["def carrier(source, given):"], [], []
    for index, (name, kind) in enumerate(_carried_kinds(target).items()):
        if name in given:
            continue
        if not (name in fields or hasattr(source, name)):
            if "__slots__" not in source.__dict__:
                own.append((name, kind))
            continue
        body.append(f"    v{index} = source.{name}")
        if kind is not None:
            scope[f"kind{index}"] = kind
            body.append(f"    if v{index} is not None:\n        v{index} = kind{index}(v{index})")
        args.append(f"{name}=v{index}")
    if own:
        scope["own"] = tuple(own)
        args.append("**own_values(source.__dict__, own)")
    body.append(f"    return target({', '.join([*args, '**given'])})")
    exec("\n".join(body), scope)  # noqa: S102 - built above from the classes' own fields
    carrier: Callable[[Any, dict[str, Any]], Any] = scope["carrier"]
    return carrier


def _own_values(attributes: dict[str, Any], names: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """Of `names` (with their kinds), those an instance's own `attributes` hold, as carried."""
    out = {}
    for name, kind in names:
        if name in attributes:
            value = attributes[name]
            out[name] = kind(value) if kind is not None and value is not None else value
    return out


_KINDS: dict[type[Any], dict[str, Any]] = {}


def _carried_kinds(target: type[Any]) -> dict[str, Any]:
    """Per init field of `target`, the constructor its copies go through (None: as is)."""
    kinds = _KINDS.get(target)
    if kinds is None:
        kinds = {}
        for f in dataclasses.fields(target):
            if not f.init:
                continue
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            kind = type(default) if isinstance(default, (tuple, list, dict)) else None
            kinds[f.name] = ResourceList if kind is ResourceList else kind
        _KINDS[target] = kinds
    return kinds
