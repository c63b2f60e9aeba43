"""What the API server's objects mean as koordstream records (pure: objects in, outputs out).

`Mirror` keeps, per object, the record it last published and publishes again only when the
record changes (its resourceVersion aside): a relist, a watch event replayed after a
reconnect, or a status write that changes nothing koordstream reads (Kwok's heartbeats, our
own status patches) publishes nothing. A bridge that restarts publishes each object once
more, unchanged; every consumer of these topics takes a record equal to the last as a no-op.

Pods. A pod is *ours* when its `schedulerName` is one of the profiles and it is unassigned, or
was bound by koordstream (its `koordstream.io/hold-id` annotation, which the bridge's
Bindings carry, names the pod's uid and the node it runs on). Ours go to `pods` on every change that the
record shows (a bound one too: the rebalancer reads node, phase and annotations); when one of
ours reaches Succeeded or Failed its node's owner is told (`PodTerminated` into `node-inbox`),
and its deletion goes to `pods` (`PodDeleted`, with its labels and annotations, which locate
its gang). Every other assigned pod that has not finished is *foreign*: bound by another
scheduler or created with a node name. koordstream's owners never saw it, so the node it
runs on is published with its allocatable less what foreign pods request (cpu, memory, pods,
GPUs as whole devices...), again whenever that changes (`flush_nodes`, once per batch).

A pod of a PodGroup (`pod-group.scheduling.sigs.k8s.io` label) whose PodGroup
(`scheduling.sigs.k8s.io/v1alpha1`) is known gets the gang annotations Koordinator reads from
it: min-available from `spec.minMember`, waiting-time from `spec.scheduleTimeoutSeconds`
(annotations the pod sets itself win). Where PodGroups are watched (`podgroups_watched`), a
pod whose PodGroup is not known yet waits for it unpublished (Koordinator's coscheduling
waits for it too): published as a single pod, it would bind without its gang.

A pool's sandbox pod (its object carries the annotation `koordstream.io/uid`, see
`sandboxes`) is known by that uid, not by the API server's (`api_uid` maps it back): it is
ours, published only once koordstream bound it (its pool published it pending), and then as
every pod of ours (changes, its end, its deletion).

agent-sandbox's SandboxTemplates, SandboxWarmPools and SandboxClaims go to `sandbox`
(`sandboxes.SandboxObjects`).

Also: Nodes and their deletions (`nodes`), Koordinator Reservations (`pods`, deleted as a
pod is), PodDisruptionBudgets (`disruption-budgets`, a deletion as `deleted`), and ReplicaSets
whose `spec.replicas` went down (`scale-down`: `ScaleDownEvent("ReplicaSet/<name>", by how
many)`; a Deployment scales down through its ReplicaSet). An object that cannot be converted
goes to the dead-letter topic with the field and value, and the rest of the batch goes on.
After a relist (`relisted`), what the list no longer has is taken as deleted.

A new leader starts from what the bridges published before (`seed`: the records stamped with
the bridge's origin, read back from `pods`, `nodes`, `disruption-budgets` and `sandbox`): an object deleted
while no bridge ran is then missing from the first list and its deletion is published, and an
object unchanged since is not published again.
"""

from __future__ import annotations

import base64
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from agents.ports import Output
from schemas import topics
from schemas.errors import SchemaError
from schemas.kube import (
    node_from_manifest,
    pdb_from_manifest,
    pod_from_manifest,
    reservation_from_manifest,
)
from schemas.records import (
    GANG_MIN_AVAILABLE_ANNOTATION,
    GANG_WAITING_TIME_ANNOTATION,
    POD_GROUP_LABEL,
    DeadLetter,
    GpuDevice,
    HoldId,
    Node,
    NodeDeleted,
    NodeStateChange,
    Pod,
    PodDeleted,
    PodDisruptionBudget,
    PodTerminated,
    Record,
    Reservation,
    ResourceList,
    ScaleDownEvent,
    replace,
)
from streams.bridge import sandboxes
from streams.bridge.sandboxes import SandboxObjects, sandbox_uid

HOLD_ANNOTATION = "koordstream.io/hold-id"  # on a pod koordstream bound: the hold id of its Binding
TERMINAL = ("Succeeded", "Failed")
NVIDIA_GPU = "nvidia.com/gpu"

# The resources watched, as (kind, apiVersion): what `Mirror.apply` takes.
POD, NODE, RESERVATION, PDB, REPLICASET, PODGROUP = (
    "Pod", "Node", "Reservation", "PodDisruptionBudget", "ReplicaSet", "PodGroup")


def _bare(record: Record) -> Record:
    """The record as compared: its resourceVersion left out."""
    if isinstance(record, (Pod, Node)):
        return replace(record, resource_version="")
    return record


def _pod_ips(status: Mapping[str, Any]) -> tuple[str, ...]:
    """A pod's IPs: `status.podIPs`, else `status.podIP` (a kubelet that sets only that)."""
    ips = tuple(str(p.get("ip")) for p in status.get("podIPs") or () if isinstance(p, Mapping) and p.get("ip"))
    return ips or ((str(status["podIP"]),) if status.get("podIP") else ())


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _key(obj: Mapping[str, Any]) -> str:
    """An object's key: its uid (a sandbox pod's: its uid in koordstream, `sandboxes`)."""
    meta = _meta(obj)
    return sandbox_uid(meta) or str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


def _bound_by_us(uid: str, node: str, annotations: Mapping[str, Any]) -> bool:
    """Whether the pod's hold annotation is the one our Binding of *this* pod to *this* node
    wrote: a hold id names the pod's uid, its attempt and the node. A copy of a pod carries its
    annotations (`kubectl debug --copy-to --same-node` keeps annotations and nodeName): its
    hold id names another uid, and no owner ever held it."""
    try:
        held = HoldId.parse(str(annotations.get(HOLD_ANNOTATION, "")))
    except ValueError:
        return False
    return held.uid == uid and held.node == node


def _version(obj: Mapping[str, Any]) -> int | None:
    """An object's resourceVersion as a number (etcd's revision at its last write), or None
    where it has none or not a number (the minimal objects of deletions a relist implies)."""
    try:
        return int(_meta(obj).get("resourceVersion"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


MAX_DELETED_VERSIONS = 100_000  # deleted objects whose last resourceVersion is kept, oldest forgotten first
MAX_ORIGINAL_BYTES = 256 * 1024  # of an object in its dead letter: the envelope stays well under a message's 1 MiB


def dead_letter(kind: str, obj: Mapping[str, Any], error: SchemaError | Exception) -> Output:
    """An object that could not be converted: the dead-letter topic, with the field and value,
    and the object's JSON, cut to MAX_ORIGINAL_BYTES (the API server takes objects up to
    etcd's 1.5 MiB: whole, in base64, one made a dead letter that Apache Kafka refused, which
    ended the bridge, and the next one at the same object)."""
    field_name = getattr(error, "field", "") or ""
    value = getattr(error, "value", "")
    meta = _meta(obj)
    where = f"{kind} {meta.get('namespace', '')}/{meta.get('name', '')}".replace(" /", " ")
    original = orjson.dumps(obj)
    cut = f" (its JSON cut to its first {MAX_ORIGINAL_BYTES} of {len(original)} bytes)" \
        if len(original) > MAX_ORIGINAL_BYTES else ""
    return Output(topics.DEAD_LETTER, f"bridge/{kind}", DeadLetter(
        error=f"{where}: {error}{cut}", field=str(field_name), value=str(value)[:500], topic=f"kubernetes/{kind}",
        partition=-1, offset=-1, original=base64.b64encode(original[:MAX_ORIGINAL_BYTES]).decode()))


@dataclass
class _PodSeen:
    ours: bool
    node: str = ""
    foreign: ResourceList | None = None  # what it takes from its node when foreign
    record: Pod | None = None  # the last published (ours)
    terminated: bool = False  # its PodTerminated was sent
    orphaned: bool = False  # bound by us to a node object since deleted: the owner terminated it, it counts as foreign
    api_uid: str = ""  # the API server's uid (a sandbox pod's key is its uid in koordstream)
    live: Pod | None = None  # a sandbox pod as the API server has it now (published or not)
    ips: tuple[str, ...] = ()  # a sandbox pod's status.podIPs


@dataclass
class Mirror:
    """See the module docstring."""

    profiles: frozenset[str]
    pods: dict[str, _PodSeen] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> the Node object as last read
    published_nodes: dict[str, Node] = field(default_factory=dict)
    foreign: dict[str, dict[str, ResourceList]] = field(default_factory=dict)  # node -> uid -> requests
    dirty: set[str] = field(default_factory=set)  # nodes whose foreign usage changed since the last flush
    published: dict[tuple[str, str], Record] = field(default_factory=dict)  # (kind, key) -> last record
    replicas: dict[str, int] = field(default_factory=dict)  # ReplicaSet uid -> spec.replicas last seen
    podgroups: dict[str, tuple[int, int]] = field(default_factory=dict)  # ns/name -> (minMember, timeout s)
    podgroups_watched: bool = False  # the PodGroup CRD is served and watched: members wait for their PodGroup
    podgroup_names: dict[str, str] = field(default_factory=dict)  # PodGroup key (uid) -> ns/name
    waiting: dict[str, dict[str, Mapping[str, Any]]] = field(default_factory=dict)  # ns/name -> uid -> pod object
    known: dict[str, set[str]] = field(default_factory=dict)  # kind -> keys seen since the last list
    sandboxes: SandboxObjects = field(default_factory=SandboxObjects)  # agent-sandbox's objects
    versions: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, key) -> newest resourceVersion seen
    deleted: deque[tuple[str, str]] = field(default_factory=deque)  # keys of `versions` whose object was deleted

    # -- the entry points ---------------------------------------------------------------------

    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> list[Output]:
        """One watch event (ADDED, MODIFIED, DELETED) of an object of `kind`. An event older
        than one already applied to the same object (its resourceVersion lower: replayed out of
        order, by a reader that lags behind another) changes nothing."""
        key = _key(obj)
        if self._stale(kind, key, event, obj):
            return []
        if event == "DELETED":
            self.known.get(kind, set()).discard(key)
        else:
            self.known.setdefault(kind, set()).add(key)
        try:
            if kind == POD:
                return self._pod(event, obj, key)
            if kind == NODE:
                return self._node(event, obj)
            if kind == RESERVATION:
                return self._reservation(event, obj, key)
            if kind == PDB:
                return self._pdb(event, obj, key)
            if kind == REPLICASET:
                return self._replicaset(event, obj, key)
            if kind == PODGROUP:
                return self._podgroup(event, obj)
            if kind in sandboxes.KINDS:
                return self.sandboxes.apply(kind, event, obj, key)
        except SchemaError as exc:
            return [dead_letter(kind, obj, exc)]
        raise ValueError(f"kind={kind!r}: not a resource the bridge mirrors")

    def _stale(self, kind: str, key: str, event: str, obj: Mapping[str, Any]) -> bool:
        """Whether the event is older than the newest applied to its object; else remember
        its version. The API server's resourceVersions are etcd revisions, which grow with
        every write: for one object, a lower one is an older state of it. A deleted object's
        last version is kept a while, so that a stale event after its deletion does not bring
        it back."""
        version = _version(obj)
        if version is None:
            return False
        newest = self.versions.get((kind, key))
        if newest is not None and version < newest:
            return True
        self.versions[(kind, key)] = version
        if event == "DELETED":
            self.deleted.append((kind, key))
            while len(self.deleted) > MAX_DELETED_VERSIONS:
                self.versions.pop(self.deleted.popleft(), None)
        return False

    def relisted(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> list[Output]:
        """A full list of `kind` (at start, or after a 410 Gone): every object as ADDED, and
        the deletion of every one known before that the list no longer has."""
        return [o for part in self.relisting(kind, objs) for o in part]

    def relisting(self, kind: str, objs: Iterable[Mapping[str, Any]], chunk: int = 500) -> Iterator[list[Output]]:
        """`relisted`, in parts of `chunk` objects, so that its caller may let other work run
        in between (the bridge's Lease renewals share its event loop: about 90 us a pod, a
        list of 100,000 pods blocked the loop past the renew deadline)."""
        before = self.known.get(kind, set())
        self.known[kind] = set()
        listed: set[str] = set()
        out: list[Output] = []
        for i, obj in enumerate(objs, 1):
            listed.add(_key(obj))
            out += self.apply(kind, "ADDED", obj)
            if i % chunk == 0:
                yield out
                out = []
        for key in sorted(before - listed):
            gone = self._last_object(kind, key)
            if gone is not None:
                out += self.apply(kind, "DELETED", gone)
        yield out

    def vanished(self, reports: Iterable[NodeStateChange],
                 to_come: Callable[[str], bool] = lambda uid: False) -> list[Output]:
        """The pods that koordstream's owners hold committed (`reports`: each node as its
        owner has it now) on a node the API server has, and that the API server no longer has:
        deleted while no bridge led, so no term's watch or relist saw them go (each term's
        mirror starts empty). Each goes out as deleted (`pods`, to its decider by its decision
        key) and terminated at its node (`node-inbox`), as a deletion seen by the watch would;
        both are idempotent. Called once the pods and nodes are listed, and compared with what
        the mirror has at that moment, the watch included: a pod committed at all was published
        by a bridge first, so one created after the list is here too (or was seen deleted).
        Not a pod that may be `to_come`: a pool's sandbox pod that no bridge published bound may
        not have been created yet (its Binding, carried out again, creates it)."""
        out: list[Output] = []
        for report in reports:
            if report.node not in self.nodes or report.deleted:
                continue  # not a node of this API server (a pod published straight onto the topics)
            for bound in report.committed:
                if bound.uid in self.pods or to_come(bound.uid):
                    continue
                out.append(Output(topics.PODS, bound.uid, PodDeleted(
                    uid=bound.uid, name=bound.name, namespace=bound.namespace, decision_key=bound.decision_key)))
                out.append(Output(topics.NODE_INBOX, report.node, PodTerminated(
                    uid=bound.uid, node=report.node, decision_key=bound.decision_key,
                    reason="the pod was deleted while no bridge led")))
        return out

    def seed(self, record: Record) -> None:
        """A record a bridge published before (read back in log order): what this term's first
        lists are compared with."""
        if isinstance(record, Pod):
            self.pods[record.uid] = _PodSeen(True, node=record.node_name, record=record,
                                             terminated=record.phase in TERMINAL)
            self.known.setdefault(POD, set()).add(record.uid)
        elif isinstance(record, PodDeleted):
            self.pods.pop(record.uid, None)
            self.known.get(POD, set()).discard(record.uid)
            if self.published.pop((RESERVATION, record.uid), None) is not None:
                self.known.get(RESERVATION, set()).discard(record.uid)
        elif isinstance(record, Reservation):
            self.published[(RESERVATION, record.uid)] = record
            self.known.setdefault(RESERVATION, set()).add(record.uid)
        elif isinstance(record, Node):
            self.published_nodes[record.name] = record
            self.known.setdefault(NODE, set()).add(record.uid or f"/{record.name}")
        elif isinstance(record, NodeDeleted):
            gone = self.published_nodes.pop(record.name, None)
            if gone is not None:
                self.known.get(NODE, set()).discard(gone.uid or f"/{gone.name}")
        elif isinstance(record, PodDisruptionBudget):
            if record.deleted:
                self.published.pop((PDB, record.uid), None)
                self.known.get(PDB, set()).discard(record.uid)
            else:
                self.published[(PDB, record.uid)] = record
                self.known.setdefault(PDB, set()).add(record.uid)
        else:
            seeded = self.sandboxes.seed(record)
            if seeded is not None:
                kind, key, present = seeded
                (self.known.setdefault(kind, set()).add if present else self.known.get(kind, set()).discard)(key)

    def api_uid(self, uid: str) -> str:
        """The API server's uid of a pod the mirror knows by `uid` (they differ for sandbox pods)."""
        seen = self.pods.get(uid)
        return seen.api_uid if seen is not None and seen.api_uid else uid

    def flush_nodes(self) -> list[Output]:
        """The nodes whose foreign pods changed, published again."""
        out: list[Output] = []
        for name in sorted(self.dirty):
            if name in self.nodes:
                out += self._publish_node(name)
        self.dirty.clear()
        return out

    # -- pods ---------------------------------------------------------------------------------

    def _pod(self, event: str, obj: Mapping[str, Any], uid: str) -> list[Output]:
        seen = self.pods.get(uid)
        self._stop_waiting(uid, obj)
        if event == "DELETED":
            self.pods.pop(uid, None)
            self._set_foreign(uid, seen, None, "")
            if seen is None or not seen.ours or seen.record is None:  # (a member that waited: never published)
                return []
            meta = _meta(obj)
            return [Output(topics.PODS, uid, PodDeleted(
                uid=uid, name=str(meta.get("name", "")), namespace=str(meta.get("namespace", "default")),
                labels=dict(meta.get("labels") or {}), annotations=dict(meta.get("annotations") or {})))]
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        node = str(spec.get("nodeName") or "")
        phase = str(status.get("phase") or "Pending")
        meta = _meta(obj)
        annotations = meta.get("annotations") or {}
        bound_by_us = bool(node) and _bound_by_us(uid, node, annotations)
        sandbox = uid != str(meta.get("uid") or uid)  # a pool's pod, known by its uid in koordstream
        # Ours: published, its deletion forwarded. One of ours that someone else bound stays
        # ours (its scheduler and decider must forget it when it goes), and counts as foreign.
        # A sandbox pod is ours; its pool published it pending, the mirror only once we bound it.
        ours = sandbox or (spec.get("schedulerName", "default-scheduler") in self.profiles
                           and (not node or bound_by_us)) or (seen is not None and seen.ours)
        orphaned = seen is not None and seen.orphaned and seen.node == node
        counts = bool(node) and (not bound_by_us or orphaned) and phase not in TERMINAL
        group = self._missing_group(obj) if ours and not sandbox and not node and (seen is None or seen.record is None) \
            else ""
        if group:  # a member of a PodGroup not seen yet: it waits for it, as Koordinator's coscheduling does
            self.waiting.setdefault(group, {})[uid] = obj
            self.pods.setdefault(uid, _PodSeen(True))
            return []
        record = pod_from_manifest(self._with_gang(dict(obj))) if ours or counts else None
        if record is not None and sandbox:
            record = replace(record, uid=uid)
        if seen is None:
            seen = self.pods[uid] = _PodSeen(ours)
        seen.ours = ours
        seen.api_uid = str(meta.get("uid") or seen.api_uid)
        if sandbox:
            seen.live = record
            seen.ips = _pod_ips(status)
        out: list[Output] = []
        self._set_foreign(uid, seen, record.requests if counts and record is not None else None, node)
        if ours and record is not None and (not sandbox or bound_by_us or seen.record is not None):
            if seen.record is None or _bare(seen.record) != _bare(record):
                out.append(Output(topics.PODS, uid, record))
            seen.record = record
            if node and phase in TERMINAL and not seen.terminated:
                seen.terminated = True
                out.append(Output(topics.NODE_INBOX, node, PodTerminated(uid=uid, node=node, reason=f"pod {phase}")))
        seen.node = node
        return out

    def _missing_group(self, obj: Mapping[str, Any]) -> str:
        """The PodGroup (ns/name) a pod names by its label and that is not known yet, when
        PodGroups are watched and the pod does not give its gang's size itself; else ""."""
        if not self.podgroups_watched:
            return ""
        meta = _meta(obj)
        group = (meta.get("labels") or {}).get(POD_GROUP_LABEL)
        if not group or (meta.get("annotations") or {}).get(GANG_MIN_AVAILABLE_ANNOTATION):
            return ""
        name = f"{meta.get('namespace', 'default')}/{group}"
        return "" if name in self.podgroups else name

    def _stop_waiting(self, uid: str, obj: Mapping[str, Any]) -> None:
        meta = _meta(obj)
        group = (meta.get("labels") or {}).get(POD_GROUP_LABEL)
        name = f"{meta.get('namespace', 'default')}/{group}"
        members = self.waiting.get(name)
        if members is None:  # (a relist's minimal object has no labels: look everywhere)
            name, members = next(((n, m) for n, m in self.waiting.items() if uid in m), ("", None))
        if members is not None and members.pop(uid, None) is not None and not members:
            del self.waiting[name]

    def _with_gang(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = _meta(obj)
        group = (meta.get("labels") or {}).get(POD_GROUP_LABEL)
        spec = self.podgroups.get(f"{meta.get('namespace', 'default')}/{group}") if group else None
        if spec is None:
            return obj
        annotations = dict(meta.get("annotations") or {})
        annotations.setdefault(GANG_MIN_AVAILABLE_ANNOTATION, str(spec[0]))
        if spec[1]:
            annotations.setdefault(GANG_WAITING_TIME_ANNOTATION, f"{spec[1]}s")
        return {**obj, "metadata": {**meta, "annotations": annotations}}

    def _set_foreign(self, uid: str, seen: _PodSeen | None, requests: ResourceList | None, node: str) -> None:
        old_node = seen.node if seen is not None else ""
        if seen is not None and seen.foreign is not None and old_node:
            used = self.foreign.get(old_node, {})
            if used.pop(uid, None) is not None:
                self.dirty.add(old_node)
                if not used:
                    self.foreign.pop(old_node, None)
        if seen is not None:
            seen.foreign = requests
        if requests is not None and node:
            self.foreign.setdefault(node, {})[uid] = requests
            self.dirty.add(node)

    # -- nodes --------------------------------------------------------------------------------

    def _node(self, event: str, obj: Mapping[str, Any]) -> list[Output]:
        name = str(_meta(obj).get("name", ""))
        if event == "DELETED":
            self.nodes.pop(name, None)
            self.dirty.discard(name)
            if self.published_nodes.pop(name, None) is None:
                return []
            self._orphan(name)
            return [Output(topics.NODES, name, NodeDeleted(name=name, uid=str(_meta(obj).get("uid", ""))))]
        node_from_manifest(dict(obj))  # refuse a bad one before keeping it
        self.nodes[name] = dict(obj)
        return self._publish_node(name)

    def _orphan(self, name: str) -> None:
        """The node's owner terminates the pods committed there when it reads the NodeDeleted
        (rule 9), but the pod objects stay bound to the name (no pod GC, or the node comes
        back within its grace) and run on a node added again under it: each of ours that
        runs there counts as foreign from now on, until it finishes or goes."""
        for uid, seen in self.pods.items():
            record = seen.record
            if (seen.ours and seen.node == name and seen.foreign is None and record is not None
                    and record.phase not in TERMINAL):
                seen.orphaned = True
                self._set_foreign(uid, seen, record.requests, name)
        self.dirty.discard(name)

    def _publish_node(self, name: str) -> list[Output]:
        record = self.node_record(name)
        last = self.published_nodes.get(name)
        if last is not None and _bare(last) == _bare(record):
            return []
        self.published_nodes[name] = record
        return [Output(topics.NODES, name, record)]

    def node_record(self, name: str) -> Node:
        """The node as koordstream sees it: its allocatable less what its foreign pods request."""
        record = node_from_manifest(self.nodes[name])
        used = self.foreign.get(name)
        if not used:
            return record
        total: dict[str, int] = {}
        for requests in used.values():
            for resource, amount in requests.items():
                total[resource] = total.get(resource, 0) + amount
        total["pods"] = total.get("pods", 0) + len(used) - sum(1 for r in used.values() if "pods" in r)
        left = ResourceList({r: max(0, a - total.get(r, 0)) for r, a in record.allocatable.items()})
        gpus: tuple[GpuDevice, ...] = record.gpus
        if NVIDIA_GPU in left and len(gpus) > left[NVIDIA_GPU]:
            gpus = gpus[:left[NVIDIA_GPU]]  # whole GPUs a foreign pod took: which ones is not known here
        return replace(record, allocatable=left, gpus=gpus)

    # -- the rest -----------------------------------------------------------------------------

    def _changed(self, kind: str, key: str, record: Record | None) -> bool:
        last = self.published.get((kind, key))
        if record is None:
            return self.published.pop((kind, key), None) is not None
        if last is not None and _bare(last) == _bare(record):
            return False
        self.published[(kind, key)] = record
        return True

    def _reservation(self, event: str, obj: Mapping[str, Any], key: str) -> list[Output]:
        if event == "DELETED":
            if not self._changed(RESERVATION, key, None):
                return []
            meta = _meta(obj)
            return [Output(topics.PODS, key, PodDeleted(uid=key, name=str(meta.get("name", "")), namespace=""))]
        record = reservation_from_manifest(dict(obj))
        return [Output(topics.PODS, record.uid, record)] if self._changed(RESERVATION, key, record) else []

    def _pdb(self, event: str, obj: Mapping[str, Any], key: str) -> list[Output]:
        record = pdb_from_manifest(dict(obj))
        if event == "DELETED":
            if not self._changed(PDB, key, None):
                return []
            return [Output(topics.DISRUPTION_BUDGETS, record.uid, replace(record, deleted=True))]
        return [Output(topics.DISRUPTION_BUDGETS, record.uid, record)] if self._changed(PDB, key, record) else []

    def _replicaset(self, event: str, obj: Mapping[str, Any], key: str) -> list[Output]:
        if event == "DELETED":
            self.replicas.pop(key, None)
            return []
        raw = (obj.get("spec") or {}).get("replicas", 1)
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise SchemaError("spec.replicas", raw, "must be a whole number")
        before = self.replicas.get(key)
        self.replicas[key] = raw
        if before is None or raw >= before:
            return []
        meta = _meta(obj)
        return [Output(topics.SCALE_DOWN, f"ReplicaSet/{meta.get('name', '')}", ScaleDownEvent(
            workload=f"ReplicaSet/{meta.get('name', '')}", namespace=str(meta.get("namespace", "default")),
            replicas=before - raw))]

    def _podgroup(self, event: str, obj: Mapping[str, Any]) -> list[Output]:
        meta = _meta(obj)
        key = _key(obj)
        name = self.podgroup_names.get(key) or f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
        if event == "DELETED":  # (a relist's minimal object names only the uid)
            self.podgroups.pop(name, None)
            self.podgroup_names.pop(key, None)
            return []
        spec = obj.get("spec") or {}
        minimum, timeout = spec.get("minMember", 0), spec.get("scheduleTimeoutSeconds") or 0
        if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 1:
            raise SchemaError("spec.minMember", minimum, "must be a positive integer")
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
            raise SchemaError("spec.scheduleTimeoutSeconds", timeout, "must be a whole number of seconds")
        self.podgroups[name] = (minimum, timeout)
        self.podgroup_names[key] = name
        out: list[Output] = []
        for uid, member in self.waiting.pop(name, {}).items():  # its members that waited for it
            try:
                out += self._pod("MODIFIED", member, uid)
            except SchemaError as exc:
                out.append(dead_letter(POD, member, exc))
        return out

    def _last_object(self, kind: str, key: str) -> Mapping[str, Any] | None:
        """A minimal object for a deletion the relist implied."""
        if kind == POD:
            seen = self.pods.get(key)
            if seen is None:
                return None
            record = seen.record
            return {"metadata": {"uid": key, "name": record.name if record else "",
                                 "namespace": record.namespace if record else "",
                                 "labels": dict(record.labels) if record else {},
                                 "annotations": dict(record.annotations) if record else {}}}
        if kind == NODE:
            node = next((n for n in self.nodes.values() if _key(n) == key), None)
            if node is None:  # known only from what was published before
                last_node = next((r for r in self.published_nodes.values() if (r.uid or f"/{r.name}") == key), None)
                node = {"metadata": {"name": last_node.name, "uid": last_node.uid}} if last_node is not None else None
            return node
        last = self.published.get((kind, key))
        if kind == PDB and isinstance(last, PodDisruptionBudget):
            return {"metadata": {"uid": last.uid, "name": last.name, "namespace": last.namespace},
                    "spec": {"selector": last.selector}}
        if kind == RESERVATION and last is not None:
            return {"metadata": {"uid": key, "name": getattr(last, "name", "")}}
        if kind in sandboxes.KINDS:
            return self.sandboxes.last_object(kind, key)
        return {"metadata": {"uid": key}}
