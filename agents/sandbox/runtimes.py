"""Runtime classes with QoS: the admission every pod naming a runtime class goes through
before the scheduler queues it.

A pod that names `spec.runtimeClassName` is admitted as Kubernetes' RuntimeClass admission
plugin admits it at the API server, and then by the runtime's QoS rule:

- overhead: the class's `overhead.podFixed` becomes the pod's `overhead` and is added to its
  effective request (`schemas.kube.effective_requests`). A pod that already carries an
  overhead (the API server set it: pods through the Kubernetes bridge) must carry exactly the
  class's, and keeps it: it is never added twice. One that carries an overhead while its class
  defines none is refused too, as the plugin's validation refuses it;
- scheduling: the class's `nodeSelector` is merged into the pod's (a key the pod sets to
  another value is refused), its tolerations appended, those another one already covers left
  out (Kubernetes' merge);
- QoS (Koordinator's `koordinator.sh/qosClass`): a pod asking for a class its runtime does not
  allow is refused; one that asks for none gets the runtime's default.
Admission is idempotent: admitting an admitted pod changes nothing. Every refusal is an
`AdmissionError`, which names the field and the value and carries a code (`code`) for the
sandbox feedback.

The shipped runtimes (`DEFAULT_RUNTIMES`; `sandbox.runtimes` adds to them or replaces one by
name, `sandbox.default_runtimes: false` drops them), and why their QoS rules are what they are:

- `gvisor` (handler `runsc`, as gVisor's own guide names both): no overhead and no node
  selector, as gVisor publishes none (runsc is installed beside runc; GKE Sandbox's nodes carry
  `sandbox.gke.io/runtime: gvisor`, which a cluster can add by configuration). QoS LS or BE,
  default LS: the Sentry serves the application's system calls from its own goroutines, which
  Go's scheduler moves across threads, so CPUs bound to the pod (LSR) would buy little of the
  isolation they buy a runc container, while taking whole CPUs from the node.
- `kata-qemu` (160Mi memory, 250m cpu), `kata-fc` (Firecracker) and `kata-clh` (Cloud
  Hypervisor; both 130Mi, 250m): Kata's own RuntimeClasses (kata-deploy's
  `runtimeclasses/`), handler equal to the name, on nodes labelled
  `katacontainers.io/kata-runtime: "true"`. QoS LSR, LS or BE, default LS: a VM's vCPU threads
  can be pinned to the CPUs NodeNUMAResource binds (`agents.state.cpus`), so latency-sensitive
  reserved sandboxes make sense there; the VMM's overhead stays on the shared CPUs (the
  binding counts the containers' whole CPUs, not the overhead's 250m).
- `wasmtime` (runwasi's wasmtime shim) and `spin` (SpinKube's shim; handler `spin`): no
  overhead and no selector, as their published RuntimeClasses have none (the KWasm operator
  marks nodes with an annotation, which no selector can match). QoS LS or BE, default LS: a
  Wasm module runs inside one shim process with the runtime's own thread pool; bound CPUs
  would be unused by design.

LSE and SYSTEM are allowed by no shipped runtime: exclusive CPUs and system pods are not
sandboxes. Which pods are sandboxes at all is one rule, `is_sandbox`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from schemas.errors import FieldError, SchemaError
from schemas.kube import effective_requests, load_manifests, validate_runtime_class
from schemas.quantity import format_canonical
from schemas.records import (
    QOS_LABEL,
    SANDBOX_TEMPLATE_HASH_LABEL,
    Pod,
    ResourceList,
    RuntimeClass,
    Toleration,
    replace,
)

MI = 2**20
KATA_NODE_LABEL = "katacontainers.io/kata-runtime"

# Refusal codes (`AdmissionError.code`), the `reason` of a refused sandbox's feedback.
RUNTIME_CLASS_NOT_FOUND = "RuntimeClassNotFound"
OVERHEAD_MISMATCH = "OverheadMismatch"
NODE_SELECTOR_CONFLICT = "NodeSelectorConflict"
QOS_NOT_ALLOWED = "QoSClassNotAllowed"


def _runtime(name: str, handler: str, qos: tuple[str, ...], *, cpu: int = 0, memory: int = 0,
             selector: Mapping[str, str] | None = None) -> RuntimeClass:
    overhead = ResourceList({k: v for k, v in (("cpu", cpu), ("memory", memory)) if v})
    return RuntimeClass(name=name, handler=handler, overhead=overhead, node_selector=dict(selector or {}),
                        qos_classes=qos, default_qos_class="LS")


_KATA = {KATA_NODE_LABEL: "true"}
DEFAULT_RUNTIMES: tuple[RuntimeClass, ...] = (
    _runtime("gvisor", "runsc", ("LS", "BE")),
    _runtime("kata-qemu", "kata-qemu", ("LSR", "LS", "BE"), cpu=250, memory=160 * MI, selector=_KATA),
    _runtime("kata-fc", "kata-fc", ("LSR", "LS", "BE"), cpu=250, memory=130 * MI, selector=_KATA),
    _runtime("kata-clh", "kata-clh", ("LSR", "LS", "BE"), cpu=250, memory=130 * MI, selector=_KATA),
    _runtime("wasmtime", "wasmtime", ("LS", "BE")),
    _runtime("spin", "spin", ("LS", "BE")),
)


class AdmissionError(FieldError):
    """A pod its runtime class refuses: `field=value: reason`, and a `code` (RuntimeClassNotFound,
    OverheadMismatch, NodeSelectorConflict, QoSClassNotAllowed)."""

    def __init__(self, code: str, field: str, value: object, reason: str) -> None:
        super().__init__(field, value, reason)
        self.code = code


def is_sandbox(pod: Pod) -> bool:
    """A sandbox for an AI agent: made from a sandbox template (it carries the template's
    hash), or run by a runtime class. The one rule for which pods get the sandbox feedback
    and count as sandboxes in the lifetimes the feedback's wait estimate learns from."""
    return bool(pod.runtime_class_name) or SANDBOX_TEMPLATE_HASH_LABEL in pod.labels


def covers(ss: Toleration, t: Toleration) -> bool:
    """`ss` tolerates every taint `t` does (Kubernetes' rule for merging tolerations)."""
    if ss == t:
        return True
    if t.key != ss.key and not (ss.key == "" and ss.operator == "Exists"):  # an empty key with Exists: every key
        return False
    if t.effect != ss.effect and ss.effect != "":  # an empty effect: every effect
        return False
    if ss.effect == "NoExecute" and ss.toleration_seconds is not None and (
            t.toleration_seconds is None or t.toleration_seconds > ss.toleration_seconds):
        return False
    if ss.operator == "Exists":
        return True
    return ss.operator in ("Equal", "") and t.operator in ("Equal", "") and t.value == ss.value


def merge_tolerations(first: Sequence[Toleration], second: Sequence[Toleration]) -> tuple[Toleration, ...]:
    """`first` then `second`, leaving out a toleration that another one covers (of two equal
    ones, the first stays)."""
    every = [*first, *second]
    merged: list[Toleration] = []
    for i, t in enumerate(every):
        if any(covers(m, t) for m in merged) or any(u != t and covers(u, t) for u in every[i + 1:]):
            continue
        merged.append(t)
    return tuple(merged)


def _quantities(amounts: Mapping[str, int]) -> str:
    return ", ".join(f"{name}={format_canonical(name, amount)}" for name, amount in sorted(amounts.items())) or "none"


def with_overhead(pod: Pod, overhead: Mapping[str, int]) -> Pod:
    """The pod with `overhead` as its overhead, its effective request recomputed with it (from
    its containers; a record built without containers: its request less the old overhead,
    plus the new)."""
    return replace(pod, **_overhead_changes(pod, overhead))


def _overhead_changes(pod: Pod, overhead: Mapping[str, int]) -> dict[str, ResourceList]:
    overhead = ResourceList({k: v for k, v in overhead.items() if v})
    if pod.containers or pod.init_containers:
        requests = effective_requests(pod.containers, pod.init_containers, overhead)
    else:
        requests = ResourceList(pod.requests)
        for name, amount in pod.overhead.items():
            requests[name] = requests.get(name, 0) - amount
        requests = ResourceList({k: v for k, v in requests.plus(overhead).items() if v > 0})
    return {"overhead": overhead, "requests": requests}


def admit(pod: Pod, rc: RuntimeClass) -> Pod:
    """The pod as it runs in `rc` (see the module docstring); raises AdmissionError."""
    overhead = {k: v for k, v in pod.overhead.items() if v}
    if overhead and overhead != {k: v for k, v in rc.overhead.items() if v}:
        why = (f"does not match RuntimeClass {rc.name!r}'s overhead.podFixed ({_quantities(rc.overhead)})"
               if rc.overhead else f"is set, but RuntimeClass {rc.name!r} defines no overhead")
        raise AdmissionError(OVERHEAD_MISMATCH, "spec.overhead", _quantities(overhead), why)
    selector = dict(pod.node_selector)
    for key, value in rc.node_selector.items():
        if selector.setdefault(key, value) != value:
            raise AdmissionError(NODE_SELECTOR_CONFLICT, f"spec.nodeSelector.{key}", selector[key],
                                 f"conflicts with RuntimeClass {rc.name!r}'s scheduling.nodeSelector {key}={value}")
    labels = pod.labels
    asked = labels.get(QOS_LABEL) or pod.qos_class
    if asked and rc.qos_classes and asked not in rc.qos_classes:
        raise AdmissionError(QOS_NOT_ALLOWED, f"metadata.labels.{QOS_LABEL}", asked,
                             f"RuntimeClass {rc.name!r} runs pods as {', '.join(rc.qos_classes)} only")
    qos = asked or rc.default_qos_class
    if qos and labels.get(QOS_LABEL) != qos:
        labels = {**labels, QOS_LABEL: qos}
    # One replace: the overhead's changes depend on nothing the others change.
    return replace(
        pod, node_selector=selector,
        tolerations=merge_tolerations(pod.tolerations, rc.tolerations) if rc.tolerations else pod.tolerations,
        labels=labels, qos_class=qos or pod.qos_class,
        **(_overhead_changes(pod, rc.overhead) if rc.overhead and not overhead else {}))


def withdraw(pod: Pod, rc: RuntimeClass | None) -> Pod:
    """The pod without its runtime class and what the class adds (its overhead, its selector's
    entries, its tolerations): what `admit` started from, as far as it can be told (an entry the
    pod had itself and the class has too goes as well). With `rc` None (a class nobody here
    knows), only the name and any overhead go. The QoS label stays."""
    selector = {k: v for k, v in pod.node_selector.items() if rc is None or rc.node_selector.get(k) != v}
    tolerations = tuple(t for t in pod.tolerations if rc is None or t not in rc.tolerations)
    bare = replace(pod, runtime_class_name="", node_selector=selector, tolerations=tolerations)
    return with_overhead(bare, {}) if pod.overhead else bare


class RuntimeTable:
    """The runtime classes a worker knows, by name, and the admission through them.

    Every scheduler worker builds the same table from its settings (`sandbox.runtimes`), so a
    pod is admitted alike whichever replica owns it."""

    def __init__(self, classes: Iterable[RuntimeClass] = DEFAULT_RUNTIMES) -> None:
        self.classes: dict[str, RuntimeClass] = {}
        for rc in classes:
            try:
                validate_runtime_class(rc, paths={})
            except SchemaError as exc:
                raise ValueError(f"runtime class {rc.name!r}: {exc}") from None
            self.classes[rc.name] = rc  # a later one of the same name replaces an earlier one

    @property
    def names(self) -> list[str]:
        return sorted(self.classes)

    def get(self, name: str) -> RuntimeClass | None:
        return self.classes.get(name)

    def admit(self, pod: Pod) -> Pod:
        """The pod as the scheduler places it: through its runtime class when it names one
        (the pod itself otherwise); raises AdmissionError. The warm pools build their pods
        from templates through this, like every pod that enters the scheduler."""
        if not pod.runtime_class_name:
            return pod
        rc = self.classes.get(pod.runtime_class_name)
        if rc is None:
            raise AdmissionError(RUNTIME_CLASS_NOT_FOUND, "spec.runtimeClassName", pod.runtime_class_name,
                                 f"no such RuntimeClass (known: {', '.join(self.names) or 'none'}; "
                                 "sandbox.runtimes lists them)")
        return admit(pod, rc)

    def rerun(self, pod: Pod, runtime: str, qos: str = "") -> Pod:
        """`pod`, withdrawn from its own runtime class, admitted through `runtime` instead
        (`qos`: as that QoS class; "": the QoS class it asked for, else the runtime's default);
        raises AdmissionError. What the sandbox feedback tries as an alternative."""
        bare = withdraw(pod, self.classes.get(pod.runtime_class_name)) if pod.runtime_class_name else pod
        labels = dict(bare.labels)
        if qos:
            labels[QOS_LABEL] = qos
        return self.admit(replace(bare, runtime_class_name=runtime, labels=labels,
                                  qos_class=qos or bare.qos_class))


def load_runtimes(text: str, *, defaults: bool = True) -> RuntimeTable:
    """A table from the text of a runtimes file: `node.k8s.io/v1` RuntimeClass manifests (YAML,
    several documents or a List, or JSON), each with its QoS rule in the annotations
    `koordstream.io/qos-classes` and `koordstream.io/default-qos-class`; added to the shipped
    runtimes (`defaults`), replacing one of the same name. Raises ValueError naming the
    document, the field and the value."""
    try:
        records = load_manifests(text)
    except SchemaError as exc:
        raise ValueError(str(exc)) from None
    others = sorted({r.KIND for r in records if not isinstance(r, RuntimeClass)})
    if others:
        raise ValueError(f"kind: only RuntimeClass manifests belong in a runtimes file, found {', '.join(others)}")
    return RuntimeTable([*(DEFAULT_RUNTIMES if defaults else ()), *(r for r in records if isinstance(r, RuntimeClass))])
