import pytest
import yaml

from schemas.errors import SchemaError
from schemas.kube import (
    load_manifests,
    node_from_manifest,
    pod_from_manifest,
    reservation_from_manifest,
)
from schemas.records import Node, Pod, PodDisruptionBudget, Reservation
from tests.builders import KATA_QEMU_RUNTIME_CLASS

POD_YAML = """
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: shop
  uid: 0b1c
  creationTimestamp: "2026-01-02T03:04:05Z"
  labels: {koordinator.sh/qosClass: LS}
  annotations: {gang.scheduling.koordinator.sh/name: g1}
  ownerReferences: [{kind: ReplicaSet, name: web-1, uid: rs1, controller: true}]
spec:
  schedulerName: koordstream
  priority: 9000
  priorityClassName: koord-prod
  runtimeClassName: gvisor
  overhead: {cpu: 100m, memory: 64Mi}
  nodeSelector: {zone: a}
  tolerations: [{key: gpu, operator: Exists, effect: NoSchedule}]
  initContainers:
  - name: init
    resources: {requests: {cpu: "2", memory: 1Gi}}
  - name: sidecar
    restartPolicy: Always
    resources: {requests: {cpu: 200m, memory: 128Mi}}
  containers:
  - name: app
    resources: {requests: {cpu: 500m, memory: 256Mi}}
  - name: limits-only
    resources: {limits: {cpu: "1", memory: 512Mi}}
"""


def test_pod_manifest_converts_with_kubernetes_effective_request() -> None:
    [pod] = load_manifests(POD_YAML)
    assert isinstance(pod, Pod)
    # apps 1.5 cpu + sidecar 0.2 = 1.7 < init 2 (started before the sidecar) -> 2, + overhead 0.1
    assert pod.requests["cpu"] == 2100
    # memory: apps 768Mi + sidecar 128Mi = 896Mi < init 1Gi -> 1Gi, + 64Mi overhead
    assert pod.requests["memory"] == (1024 + 64) * 2**20
    assert pod.priority == 9000 and pod.qos_class == "LS" and pod.scheduler_name == "koordstream"
    assert pod.owner_references[0].controller and pod.tolerations[0].operator == "Exists"
    assert pod.creation_timestamp == pytest.approx(1767323045.0)


def test_sidecar_started_before_init_counts_with_it() -> None:
    pod = pod_from_manifest({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "initContainers": [{"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                           {"name": "i", "resources": {"requests": {"cpu": "2"}}}],
        "containers": [{"name": "a", "resources": {"requests": {"cpu": "100m"}}}]}})
    assert pod.requests["cpu"] == 3000


def test_node_manifest_converts_with_devices() -> None:
    node = node_from_manifest({"apiVersion": "v1", "kind": "Node",
                               "metadata": {"name": "gpu-1", "uid": "6f1c", "labels": {"nvidia.com/gpu.product": "A100",
                                                                                   "nvidia.com/gpu.memory": "40960"}},
                               "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
                               "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110",
                                                          "nvidia.com/gpu": "8", "koordinator.sh/rdma": "8"},
                                          "conditions": [{"type": "Ready", "status": "True"}]}})
    assert isinstance(node, Node)
    assert node.allocatable["cpu"] == 64000 and len(node.gpus) == 8 and node.gpus[0].model == "A100"
    assert node.gpus[7].minor == 7 and node.gpus[0].memory == 40 * 2**30
    assert node.rdma[0].vfs == 8 and node.taints[0].key == "gpu"
    assert node.uid == "6f1c"  # which object of the name: NodeDeleted carries it too


def test_node_numa_cells_from_koordinators_cpu_topology_annotation() -> None:
    import json as _json

    detail = [{"id": cpu, "core": cpu // 2, "socket": 0, "node": cpu // 4} for cpu in range(8)]
    [node] = load_manifests(_json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "numa-1", "annotations": {"node.koordinator.sh/cpu-topology": _json.dumps({"detail": detail})}},
        "status": {"allocatable": {"cpu": "8"}}}))
    assert [(c.id, c.cpus, c.cores) for c in node.numa] == [(0, (0, 1, 2, 3), (0, 0, 1, 1)), (1, (4, 5, 6, 7), (2, 2, 3, 3))]
    with pytest.raises(SchemaError) as err:
        load_manifests(_json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": "numa-2", "annotations": {"node.koordinator.sh/cpu-topology": "[1, 2]"}}}))
    assert "cpu-topology" in err.value.field


def test_json_list_of_manifests() -> None:
    text = '{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"}}]}'
    assert [r.name for r in load_manifests(text)] == ["a"]  # type: ignore[attr-defined]


def test_bad_manifest_names_the_field() -> None:
    with pytest.raises(SchemaError) as err:
        load_manifests("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n"
                       "  - name: a\n    resources: {requests: {cpu: -2}}\n")
    assert err.value.field == "spec.containers[0].resources.requests.cpu"


RESERVATION_YAML = """
apiVersion: scheduling.koordinator.sh/v1alpha1
kind: Reservation
metadata: {name: reserve-web, uid: r-0b1c, creationTimestamp: "2026-01-02T03:04:05Z"}
spec:
  template:
    spec:
      priorityClassName: koord-prod
      nodeSelector: {zone: a}
      containers:
      - name: main
        resources: {requests: {cpu: "4", memory: 8Gi}}
  owners:
  - object: {name: web-0, namespace: shop}
  - controller: {name: web, kind: StatefulSet, namespace: shop}
  - labelSelector:
      matchLabels: {app: web}
      matchExpressions: [{key: tier, operator: In, values: [front]}]
  ttl: 1h30m
  allocateOnce: false
  allocatePolicy: Restricted
"""


def test_reservation_manifest_converts_template_owners_and_policy() -> None:
    [r] = load_manifests(RESERVATION_YAML)
    assert isinstance(r, Reservation)
    assert r.uid == "r-0b1c" and r.requests == {"cpu": 4000, "memory": 8 * 2**30}
    assert r.node_selector == {"zone": "a"} and r.priority_class_name == "koord-prod"
    assert [o.object_name for o in r.owners] == ["web-0", "", ""]
    assert r.owners[1].controller_kind == "StatefulSet" and r.owners[2].match_labels == {"app": "web"}
    assert r.ttl_s == 5400 and r.expires_at == pytest.approx(1767323045.0 + 5400)
    assert not r.allocate_once and r.allocate_policy == "Restricted"


@pytest.mark.parametrize(("change", "field"), [
    ({"ttl": "soon"}, "spec.ttl"),
    ({"template": None}, "spec.template"),
    ({"allocateOnce": "yes"}, "spec.allocateOnce"),
    ({"template": {"spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}}},
     "spec.template.spec.containers[0].resources.requests.cpu"),
])
def test_bad_reservation_manifest_names_the_field(change: dict[str, object], field: str) -> None:
    obj = yaml.safe_load(RESERVATION_YAML)
    obj["spec"].update(change)
    with pytest.raises(SchemaError) as exc:
        reservation_from_manifest(obj)
    assert exc.value.field == field


PDB = """apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: shop}
spec: {selector: {matchLabels: {app: web}}, %s}
"""


def test_a_disruption_budget_converts_with_its_amount_as_text() -> None:
    [pdb] = load_manifests(PDB % "maxUnavailable: 10%")
    assert isinstance(pdb, PodDisruptionBudget)
    assert (pdb.uid, pdb.namespace, pdb.max_unavailable, pdb.min_available) == ("shop/web", "shop", "10%", "")
    assert pdb.selector == {"matchLabels": {"app": "web"}}
    [pdb] = load_manifests(PDB % "minAvailable: 2")
    assert pdb.min_available == "2" and pdb.max_unavailable == ""


@pytest.mark.parametrize(("spec", "field"), [
    ("minAvailable: 1, maxUnavailable: 1", "spec.maxUnavailable"),
    ("minAvailable: -1", "spec.minAvailable"),
    ("maxUnavailable: lots", "spec.maxUnavailable"),
])
def test_a_bad_disruption_budget_is_refused_naming_the_field(spec: str, field: str) -> None:
    with pytest.raises(SchemaError) as err:
        load_manifests(PDB % spec)
    assert err.value.field == field


def test_records_to_manifests_and_back_give_the_records_again() -> None:
    """What the harness creates in a real API server (`pod_manifest`, `node_manifest`,
    `reservation_manifest`) converts back to the same records, the API server's uid, version
    and creation time aside: every node and arrival of the shipped mixed scenario."""
    import dataclasses
    from pathlib import Path

    from perf import scenario as sc
    from schemas.kube import node_manifest, pod_manifest, reservation_manifest

    s = sc.load(Path(__file__).resolve().parents[2] / "perf" / "scenarios" / "mixed-100k.yaml").quick()
    for node in sc.nodes(s)[:40] + sc.nodes(s)[-10:]:
        back = node_from_manifest(node_manifest(node))  # (GPU labels and the NUMA annotation added)
        assert dataclasses.replace(back, capacity=node.capacity, labels=node.labels, annotations=node.annotations) == node
        assert node.labels.items() <= back.labels.items()
    seen = 0
    for _, record in sc.arrivals(s)[:400]:
        if isinstance(record, Pod):
            back_pod = pod_from_manifest(pod_manifest(record))
            assert back_pod.requests == record.requests
            # (the QoS class from the label, as a manifest says it; the scenario's records leave it to the label)
            assert dataclasses.replace(back_pod, uid=record.uid, containers=record.containers,
                                       qos_class=record.qos_class) == record
            assert back_pod.qos_class == record.labels.get("koordinator.sh/qosClass", "")
        else:
            assert isinstance(record, Reservation)
            named = dataclasses.replace(record, owners=tuple(dataclasses.replace(o, object_uid="", object_name=o.object_uid)
                                                             for o in record.owners))
            back_r = reservation_from_manifest(reservation_manifest(named, namespace="mixed-100k"))
            assert dataclasses.replace(back_r, uid=named.uid) == named
        seen += 1
    assert seen == 400


RUNTIME_CLASS_YAML = KATA_QEMU_RUNTIME_CLASS


def test_runtime_class_manifest_converts_with_its_qos_rule() -> None:
    from schemas.records import RuntimeClass, Toleration

    [rc] = load_manifests(RUNTIME_CLASS_YAML)
    assert rc == RuntimeClass(name="kata-qemu", handler="kata-qemu", overhead={"cpu": 250, "memory": 160 * 2**20},
                              node_selector={"katacontainers.io/kata-runtime": "true"},
                              tolerations=(Toleration(key="kata", operator="Exists", effect="NoSchedule"),),
                              qos_classes=("LSR", "LS", "BE"), default_qos_class="LS")
    [plain] = load_manifests("{apiVersion: node.k8s.io/v1, kind: RuntimeClass, metadata: {name: gvisor}, handler: runsc}")
    assert (plain.overhead, plain.node_selector, plain.qos_classes, plain.default_qos_class) == ({}, {}, (), "")


@pytest.mark.parametrize(("change", "field"), [
    (("cpu: 250m", "cpu: -250m"), "overhead.podFixed.cpu"),
    (("handler: kata-qemu", "handler: ''"), "handler"),
    (("handler: kata-qemu", "handler: Kata_QEMU"), "handler"),
    (("name: kata-qemu", "name: ''"), "metadata.name"),
    (("operator: Exists", "operator: Matches"), "scheduling.tolerations[0]"),
    (('"LSR, LS,BE"', '"LSR,TURBO"'), "metadata.annotations.koordstream.io/qos-classes"),
    (("default-qos-class: LS", "default-qos-class: LSE"), "metadata.annotations.koordstream.io/default-qos-class"),
    (("podFixed: {memory: 160Mi, cpu: 250m}", "podFixed: [160Mi]"), "overhead.podFixed"),
], ids=["negative-overhead", "empty-handler", "handler-not-a-label", "no-name", "bad-toleration", "unknown-qos",
        "default-not-allowed", "overhead-not-a-map"])
def test_a_bad_runtime_class_names_the_field(change: tuple[str, str], field: str) -> None:
    with pytest.raises(SchemaError) as err:
        load_manifests(RUNTIME_CLASS_YAML.replace(*change))
    assert err.value.field == field, str(err.value)
