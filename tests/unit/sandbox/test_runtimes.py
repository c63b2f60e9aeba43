"""Runtime classes with QoS: the admission every pod naming one goes through (overhead once,
selector and tolerations merged as Kubernetes merges them, the QoS rule), the runtimes file,
and LSR sandboxes bound to CPUs through the real scheduling core."""

from __future__ import annotations

import dataclasses

import pytest

from agents.sandbox import runtimes
from agents.sandbox.runtimes import (
    DEFAULT_RUNTIMES,
    AdmissionError,
    RuntimeTable,
    covers,
    is_sandbox,
    load_runtimes,
    merge_tolerations,
)
from schemas.records import (
    QOS_LABEL,
    Pod,
    ResourceList,
    RuntimeClass,
    Toleration,
)
from tests.builders import KATA_QEMU_RUNTIME_CLASS
from tests.unit.sandbox.conftest import KATA, MI, claims, core_of, feedback, node, sandbox

TABLE = RuntimeTable()


# -- the shipped runtimes -------------------------------------------------------------------------


@pytest.mark.parametrize(("runtime", "handler", "overhead", "selector", "allowed"), [
    ("gvisor", "runsc", {}, {}, ("LS", "BE")),
    ("kata-qemu", "kata-qemu", {"cpu": 250, "memory": 160 * MI}, KATA, ("LSR", "LS", "BE")),
    ("kata-fc", "kata-fc", {"cpu": 250, "memory": 130 * MI}, KATA, ("LSR", "LS", "BE")),
    ("kata-clh", "kata-clh", {"cpu": 250, "memory": 130 * MI}, KATA, ("LSR", "LS", "BE")),
    ("wasmtime", "wasmtime", {}, {}, ("LS", "BE")),
    ("spin", "spin", {}, {}, ("LS", "BE")),
], ids=lambda v: v if isinstance(v, str) else None)
def test_each_shipped_runtime_adds_its_overhead_selector_and_default_qos(
        runtime: str, handler: str, overhead: dict[str, int], selector: dict[str, str], allowed: tuple[str, ...]) -> None:
    rc = TABLE.get(runtime)
    assert rc is not None and (rc.handler, rc.qos_classes, rc.default_qos_class) == (handler, allowed, "LS")
    admitted = TABLE.admit(sandbox("p", runtime, cpu=500, memory=256 * MI))
    assert admitted.overhead == overhead
    assert admitted.requests == {"cpu": 500 + overhead.get("cpu", 0), "memory": 256 * MI + overhead.get("memory", 0)}
    assert admitted.node_selector == selector
    assert admitted.labels[QOS_LABEL] == admitted.qos_class == "LS"


def test_a_pod_without_a_runtime_class_passes_unchanged() -> None:
    pod = sandbox("p")
    assert TABLE.admit(pod) is pod


# -- overhead: added once --------------------------------------------------------------------------


def test_the_overhead_is_added_once_however_often_the_pod_is_admitted() -> None:
    once = TABLE.admit(sandbox("p", "kata-qemu", cpu=1000))
    assert TABLE.admit(once) == once
    assert once.requests["cpu"] == 1250


@pytest.mark.parametrize(("containers", "expected_cpu"), [(True, 1250), (False, 1250)], ids=["containers", "requests-only"])
def test_a_pod_the_api_server_admitted_keeps_its_overhead_and_request(containers: bool, expected_cpu: int) -> None:
    """Through the bridge, spec.overhead is already set and counted in the effective request."""
    sent = sandbox("p", "kata-qemu", cpu=1000)
    bridged = dataclasses.replace(sent, overhead=ResourceList(cpu=250, memory=160 * MI),
                                  requests=ResourceList(cpu=1250, memory=(256 + 160) * MI))
    if not containers:
        bridged = dataclasses.replace(bridged, containers=())
    admitted = TABLE.admit(bridged)
    assert admitted.requests["cpu"] == expected_cpu and admitted.overhead == bridged.overhead


@pytest.mark.parametrize(("runtime", "overhead", "says"), [
    ("kata-qemu", {"cpu": 100, "memory": 160 * MI}, "does not match RuntimeClass 'kata-qemu'"),
    ("gvisor", {"cpu": 100}, "RuntimeClass 'gvisor' defines no overhead"),
], ids=["unequal", "class-has-none"])
def test_a_preset_overhead_other_than_the_classs_is_refused(runtime: str, overhead: dict[str, int], says: str) -> None:
    pod = dataclasses.replace(sandbox("p", runtime), overhead=ResourceList(overhead))
    with pytest.raises(AdmissionError) as err:
        TABLE.admit(pod)
    assert err.value.code == runtimes.OVERHEAD_MISMATCH and err.value.field == "spec.overhead" and says in str(err.value)


# -- scheduling: selector and tolerations ------------------------------------------------------


def test_the_classs_node_selector_is_merged_into_the_pods() -> None:
    admitted = TABLE.admit(sandbox("p", "kata-fc", node_selector={"zone": "a"}))
    assert admitted.node_selector == {"zone": "a", **KATA}


def test_a_conflicting_selector_key_is_refused_naming_it() -> None:
    with pytest.raises(AdmissionError) as err:
        TABLE.admit(sandbox("p", "kata-fc", node_selector={"katacontainers.io/kata-runtime": "false"}))
    assert err.value.code == runtimes.NODE_SELECTOR_CONFLICT
    assert err.value.field == "spec.nodeSelector.katacontainers.io/kata-runtime" and err.value.value == "false"


GPU = Toleration(key="gpu", operator="Exists", effect="NoSchedule")
SANDBOXES = Toleration(key="sandbox", operator="Equal", value="kata", effect="NoSchedule")
EVERYTHING = Toleration(operator="Exists")
SHORT = Toleration(key="gone", operator="Exists", effect="NoExecute", toleration_seconds=30)
LONG = Toleration(key="gone", operator="Exists", effect="NoExecute", toleration_seconds=300)


@pytest.mark.parametrize(("pods", "classes", "expected"), [
    ((), (SANDBOXES,), (SANDBOXES,)),
    ((GPU,), (SANDBOXES,), (GPU, SANDBOXES)),
    ((SANDBOXES,), (SANDBOXES,), (SANDBOXES,)),  # equal: once
    ((GPU,), (EVERYTHING,), (EVERYTHING,)),  # covered by the class's
    ((EVERYTHING,), (SANDBOXES,), (EVERYTHING,)),  # covered by the pod's
    ((LONG,), (SHORT,), (LONG,)),  # a longer NoExecute toleration covers a shorter one
], ids=["appended", "both", "deduplicated", "class-covers", "pod-covers", "toleration-seconds"])
def test_tolerations_are_merged_as_kubernetes_merges_them(
        pods: tuple[Toleration, ...], classes: tuple[Toleration, ...], expected: tuple[Toleration, ...]) -> None:
    assert merge_tolerations(pods, classes) == expected
    rc = RuntimeClass(name="tolerant", handler="runc", tolerations=classes)
    admitted = RuntimeTable([rc]).admit(sandbox("p", "tolerant", tolerations=pods))
    assert admitted.tolerations == expected


def test_covers_needs_a_matching_value_for_equal() -> None:
    other = Toleration(key="sandbox", operator="Equal", value="gvisor", effect="NoSchedule")
    assert not covers(SANDBOXES, other) and not covers(other, SANDBOXES) and covers(EVERYTHING, other)


# -- unknown runtime classes and the QoS rule ----------------------------------------------------


def test_an_unknown_runtime_class_is_refused_naming_the_field_and_value() -> None:
    with pytest.raises(AdmissionError) as err:
        TABLE.admit(sandbox("p", "firecracker-please"))
    assert err.value.code == runtimes.RUNTIME_CLASS_NOT_FOUND
    assert str(err.value).startswith("spec.runtimeClassName='firecracker-please': no such RuntimeClass")


@pytest.mark.parametrize(("runtime", "asked", "via_field", "expected"), [
    ("gvisor", "", False, "LS"),  # none asked: the runtime's default
    ("gvisor", "BE", False, "BE"),
    ("kata-qemu", "LSR", False, "LSR"),
    ("kata-qemu", "LSR", True, "LSR"),  # asked by the record's qos_class, without the label
    ("gvisor", "LSR", False, None),
    ("spin", "LSR", False, None),
    ("wasmtime", "LSE", False, None),
    ("kata-clh", "SYSTEM", True, None),
], ids=["default", "allowed", "lsr-in-kata", "lsr-by-field", "gvisor-refuses-lsr", "spin-refuses-lsr",
        "wasm-refuses-lse", "kata-refuses-system"])
def test_the_qos_rule(runtime: str, asked: str, via_field: bool, expected: str | None) -> None:
    pod = sandbox("p", runtime, qos="" if via_field else asked)
    if via_field:
        pod = dataclasses.replace(pod, qos_class=asked)
    if expected is None:
        with pytest.raises(AdmissionError) as err:
            TABLE.admit(pod)
        assert err.value.code == runtimes.QOS_NOT_ALLOWED and err.value.field == f"metadata.labels.{QOS_LABEL}"
        assert err.value.value == asked and f"RuntimeClass {runtime!r} runs pods as" in str(err.value)
    else:
        admitted = TABLE.admit(pod)
        assert admitted.labels[QOS_LABEL] == admitted.qos_class == expected


def test_a_runtime_without_a_qos_rule_leaves_koordinators_default() -> None:
    table = RuntimeTable([RuntimeClass(name="runc", handler="runc")])
    admitted = table.admit(sandbox("p", "runc", guaranteed=True))
    assert QOS_LABEL not in admitted.labels and not admitted.qos_class  # Guaranteed: LSR by Koordinator's rule


def test_is_sandbox_is_a_template_hash_or_a_runtime_class() -> None:
    assert is_sandbox(Pod(uid="a", name="a", runtime_class_name="gvisor"))
    assert is_sandbox(sandbox("b"))  # the builder's pods carry their template's hash
    assert not is_sandbox(Pod(uid="c", name="c"))


# -- the runtimes file (sandbox.runtimes) ----------------------------------------------------------

# The kata-qemu of the shipped runtimes with another overhead, and a runtime of the file's own.
RUNTIMES_FILE = KATA_QEMU_RUNTIME_CLASS.replace("cpu: 250m", "cpu: 500m") + """---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: runc-sandbox}
handler: runc
"""


def test_a_runtimes_file_replaces_a_shipped_runtime_by_name_and_adds_its_own() -> None:
    table = load_runtimes(RUNTIMES_FILE)
    assert set(table.names) == {rc.name for rc in DEFAULT_RUNTIMES} | {"runc-sandbox"}
    kata = table.get("kata-qemu")
    assert kata is not None and kata.overhead == {"cpu": 500, "memory": 160 * MI}
    admitted = table.admit(sandbox("p", "kata-qemu"))
    assert admitted.requests["cpu"] == 1000 and admitted.labels[QOS_LABEL] == "LS"
    assert admitted.tolerations == (Toleration(key="kata", operator="Exists", effect="NoSchedule"),)


def test_without_the_shipped_runtimes_only_the_files_are_known() -> None:
    assert load_runtimes(RUNTIMES_FILE, defaults=False).names == ["kata-qemu", "runc-sandbox"]


@pytest.mark.parametrize(("change", "field"), [
    (("cpu: 500m", "cpu: -500m"), "overhead.podFixed.cpu"),  # (every field's check: test_kube.py)
    (("kind: RuntimeClass\nmetadata: {name: runc-sandbox}", "kind: Pod\nmetadata: {name: runc-sandbox}"), "kind"),
], ids=["negative-overhead", "not-a-runtime-class"])
def test_a_bad_runtimes_file_names_the_field(change: tuple[str, str], field: str) -> None:
    with pytest.raises(ValueError) as err:
        load_runtimes(RUNTIMES_FILE.replace(*change))
    assert str(err.value).startswith(field), str(err.value)


@pytest.mark.parametrize(("record", "says"), [
    (RuntimeClass(name="x", handler=""), "handler"),
    (RuntimeClass(name="x", handler="h", overhead=ResourceList(cpu=-1)), "overhead.cpu"),
    (RuntimeClass(name="X!", handler="h"), "name"),
    (RuntimeClass(name="x", handler="h", qos_classes=("LS",)), "default_qos_class"),
], ids=["empty-handler", "negative-overhead", "bad-name", "no-default"])
def test_a_table_refuses_a_record_that_cannot_be_used(record: RuntimeClass, says: str) -> None:
    with pytest.raises(ValueError) as err:
        RuntimeTable([record])
    assert f"runtime class {record.name!r}: {says}" in str(err.value)


# -- LSR sandboxes get bound CPUs (NodeNUMAResource, through the real core) ---------------------


@pytest.mark.parametrize(("runtime", "qos", "cpu", "bound", "claimed_cpu"), [
    ("kata-qemu", "LSR", 2000, ("cpuset/0/0,1",), 2250),  # whole CPUs asked: bound; the overhead's 250m is not
    ("kata-fc", "LSR", 4000, ("cpuset/0/0,1,2,3",), 4250),
    ("kata-clh", "LSR", 1500, (), 1750),  # not whole CPUs: not bound (Koordinator's rule)
    ("kata-qemu", "LS", 2000, (), 2250),  # LS shares the CPUs
    ("kata-qemu", "", 2000, (), 2250),  # no QoS asked: the runtime's default, LS
    ("gvisor", "LS", 2000, (), 2000),
], ids=["kata-qemu-lsr", "kata-fc-lsr-whole-cell", "kata-clh-fractional", "kata-ls", "kata-default", "gvisor-ls"])
def test_an_lsr_sandbox_is_bound_to_whole_cpus_beside_its_overhead(
        runtime: str, qos: str, cpu: int, bound: tuple[str, ...], claimed_cpu: int) -> None:
    core = core_of(node("k1", cpu=8000, labels=KATA, numa=True))
    assert core.add(sandbox("p", runtime, cpu=cpu, qos=qos, guaranteed=True)) == []
    [claim] = claims(core.schedule())
    assert (claim.devices, claim.requests["cpu"], claim.sandbox) == (bound, claimed_cpu, True)


# -- every pod that enters the scheduler is admitted first -------------------------------------


@pytest.mark.parametrize(("pod", "says"), [
    (sandbox("bad", "firecracker"), "spec.runtimeClassName='firecracker': no such RuntimeClass"),
    (sandbox("bad", "gvisor", qos="LSR"), "metadata.labels.koordinator.sh/qosClass='LSR': RuntimeClass 'gvisor'"),
    (sandbox("bad", "kata-qemu", node_selector={"katacontainers.io/kata-runtime": "no"}),
     "spec.nodeSelector.katacontainers.io/kata-runtime='no': conflicts"),
], ids=["unknown-class", "qos-refused", "selector-conflict"])
def test_a_refused_pod_gets_final_feedback_naming_the_field_and_the_next_is_placed(pod: Pod, says: str) -> None:
    core = core_of(node("k1", labels=KATA))
    [refused] = feedback(core.add(pod))
    assert refused.final and refused.message.startswith(says)
    assert core.add(sandbox("good", "kata-qemu")) == []
    assert [c.uid for c in claims(core.schedule())] == ["good"]
    assert core.schedule() == []  # not retried


def test_a_pod_the_api_server_admitted_claims_what_one_admitted_here_claims() -> None:
    core = core_of(node("k1", labels=KATA))
    sent = sandbox("here", "kata-qemu", cpu=1000)
    bridged = dataclasses.replace(TABLE.admit(sent), uid="bridged", name="bridged")  # overhead set by the API server
    core.add(sent)
    core.add(bridged)
    requests = {c.uid: c.requests for c in claims(core.schedule())}
    assert requests["here"] == requests["bridged"] == {"cpu": 1250, "memory": (256 + 160) * MI, "pods": 1}
