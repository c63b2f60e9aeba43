"""Kwok's stock Stage files, loaded unchanged from the module `make kwok-stages` fetched, checked
against Kwok's own testdata the way Kwok's kustomize/stage/stage_test.go checks them: for each
`<group>/<set>/testdata/X.input.yaml`, every Stage file of `<group>/<set>` is loaded, the stages
for the input's kind that could apply (Kwok's ListAllPossible) are listed with their delay range
at Now = 2006-01-02T15:04:05Z (Kwok's DelayRangePossible), their weight, and what their steps
do to the object as the Go test records it (patches with their type and JSON, applied objects,
events, deletion), with the functions that depend on the cluster replaced by Kwok's markers
(`<Now>`, `<NodeIPWith("node")>`, `<0 of PodIPsWith(...)>`); the result must equal
X.output.yaml. The objects are unstructured there, so untyped patches are merge patches."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from perf.gotemplate import Func, GoType, JsonNumber, go_quote, sprint_value
from perf.kwok import (
    Effect,
    Lifecycle,
    Stage,
    all_possible,
    load_object,
    load_stages,
    stock_stages_dir,
)
from perf.kwok_render import KwokCluster, KwokConfig, kwok_funcs, unix_rfc3339nano

try:
    STOCK: Path | None = stock_stages_dir()
    MISSING = ""
except FileNotFoundError as exc:
    STOCK, MISSING = None, str(exc)

INPUTS = sorted(STOCK.glob("*/*/testdata/*.input.yaml")) if STOCK else []
NOW = datetime(2006, 1, 2, 15, 4, 5, tzinfo=UTC).timestamp()


def test_the_stock_files_are_fetched() -> None:
    assert not MISSING, MISSING
    assert STOCK is not None and (STOCK / "stage_test.go").is_file()
    assert len(INPUTS) >= 16  # Kwok v0.8.0 ships 16 input/output pairs


def test_every_stock_stage_file_loads_unchanged() -> None:
    assert STOCK is not None, MISSING
    files = [f for f in sorted(STOCK.rglob("*.yaml")) if "testdata" not in f.parts and f.name != "kustomization.yaml"]
    stages = load_stages(files)
    documents = [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]
    assert len(stages) == sum(d.get("kind") == "Stage" for d in documents) == 19  # beside RBAC, a StorageClass
    assert {s.kind for s in stages} == {"Pod", "Node", "PersistentVolume", "PersistentVolumeClaim"}


def go_sharp_v(arg: Any) -> str:
    """fmt's %#v for the arguments the stock templates pass."""
    if arg is None:
        return "<nil>"
    if isinstance(arg, str):  # json.Number is a string type too: quoted
        return go_quote(arg)
    if isinstance(arg, bool):
        return "true" if arg else "false"
    return sprint_value(arg)


def marker(name: str) -> Func:
    """stage_test.go's wrapStringFunction: `<Name>` or `<Name(arg, ...)>`."""
    def call(*args: Any) -> str:
        return f"<{name}({', '.join(go_sharp_v(a) for a in args)})>" if args else f"<{name}>"
    return Func(call, (), GoType.ANY)


def markers(name: str) -> Func:
    """wrapStringsFunction: two addresses, `<0 of Name(...)>` and `<1 of Name(...)>`."""
    def call(*args: Any) -> list[str]:
        inner = f"{name}({', '.join(go_sharp_v(a) for a in args)})" if args else name
        return [f"<0 of {inner}>", f"<1 of {inner}>"]
    return Func(call, (), GoType.ANY)


def marker_funcs(kind: str) -> dict[str, Func]:
    funcs = kwok_funcs(kind, KwokCluster())
    for name in ("NodeIP", "NodeName", "NodePort", "PodIP", "NodeIPWith", "PodIPWith", "Now", "now", "Version"):
        funcs[name] = marker(name)
    for name in ("NodeIPsWith", "PodIPsWith"):
        funcs[name] = markers(name)
    return funcs


def format_effect(effect: Effect) -> dict[str, Any]:
    if effect.kind == "event":
        return {"kind": "event", **{k: effect.event.get(k, "") for k in ("type", "reason", "message")}}
    if effect.kind == "delete":
        return {"kind": "delete"}
    out: dict[str, Any] = {"kind": effect.kind, "type": effect.type, "data": effect.data}
    if effect.subresource:
        out["subresource"] = effect.subresource
    return out


def run_stage_test(input_file: Path) -> dict[str, Any]:
    """stage_test.go's Testing, for one input file."""
    obj = load_object(input_file.read_text())
    stage_files = [f for f in sorted(input_file.parent.parent.glob("*.yaml")) if f.name != "kustomization.yaml"]
    group = str(obj.get("apiVersion", ""))
    kind = str(obj["kind"])
    stages: list[Stage] = [s for s in load_stages(stage_files) if (s.api_group, s.kind) == (group, kind)]
    meta: dict[str, Any] = {"apiGroup": group, "kind": kind, "name": obj["metadata"]["name"]}
    if obj["metadata"].get("namespace"):
        meta["namespace"] = obj["metadata"]["namespace"]
    out = []
    for stage in all_possible([s for s in stages if s.matches(obj)], obj):
        entry: dict[str, Any] = {"stage": stage.name}
        delay = stage.delay_range_ns(obj, NOW)
        if delay is not None:
            entry["delay"] = delay
        weight = stage.weight_of(obj)
        if weight is not None:
            entry["weight"] = weight
        entry["next"] = [format_effect(e) for e in stage.effects(obj, marker_funcs(kind), typed=False)]
        if stage.immediate_next:
            entry["next"].append({"kind": "immediate"})
        out.append(entry)
    meta["stages"] = out
    return meta


def differences(expected: Any, got: Any, path: str = "") -> list[str]:
    if isinstance(expected, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(expected) | set(got)):
            if k not in got:
                out.append(f"{path}.{k}: missing (expected {expected[k]!r})")
            elif k not in expected:
                out.append(f"{path}.{k}: unexpected {got[k]!r}")
            else:
                out += differences(expected[k], got[k], f"{path}.{k}")
        return out
    if isinstance(expected, list) and isinstance(got, list) and len(expected) == len(got):
        return [d for i, (e, g) in enumerate(zip(expected, got, strict=True)) for d in differences(e, g, f"{path}[{i}]")]
    same = expected == got and type(expected) is type(got) or isinstance(expected, int | float) \
        and isinstance(got, int | float) and not isinstance(got, bool) and expected == got
    return [] if same else [f"{path}: expected {expected!r}, got {got!r}"]


@pytest.mark.parametrize("input_file", INPUTS,
                         ids=[str(p.relative_to(STOCK)).replace("/testdata/", "/").removesuffix(".input.yaml")
                              for p in INPUTS] if STOCK else [])
def test_kwok_testdata(input_file: Path) -> None:
    expected = load_object(input_file.with_name(input_file.name.replace(".input.", ".output.")).read_text())
    got = run_stage_test(input_file)
    diff = differences(expected, got)
    assert not diff, "\n".join(diff)


def test_json_numbers_reach_the_markers_as_go_prints_them() -> None:
    assert go_sharp_v(JsonNumber("5")) == '"5"' and go_sharp_v(False) == "false" and go_sharp_v("") == '""'


# --- the stock stages in the lifecycle: their documented effects ---------------------------------

EPOCH = NOW  # the lifecycle's clock starts at Kwok's test time


def stock(*parts: str) -> list[Stage]:
    assert STOCK is not None, MISSING
    return load_stages(sorted(f for p in parts for f in (STOCK / p).glob("*.yaml") if f.name != "kustomization.yaml"))


def lifecycle(*parts: str, **config: Any) -> Lifecycle:
    return Lifecycle(stock(*parts), seed=7, config=KwokConfig(epoch=EPOCH, **config))


def test_node_initialize_makes_a_node_ready_and_the_heartbeat_keeps_it_so() -> None:
    """node/fast: a node without a Ready condition gets Kwok's five kubelet conditions (Ready
    True), its addresses (Kwok's node IP and name), allocatable and capacity (kept when the node
    has them), node info and phase Running. node/heartbeat: every 20-25 s the conditions are
    written again with a fresh heartbeat time, Ready stays True (no not-ready taint comes back)."""
    life = lifecycle("node/fast", "node/heartbeat", node_ip="10.1.0.1", node_name="kwok-0", node_port=10250)
    life.upsert("Node", "n1", {"metadata": {"name": "n1", "creationTimestamp": "2006-01-02T15:00:00Z"},
                               "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}}}, 0.0)
    [init] = life.due(0.0)
    node = life.objects[("Node", "n1")]
    assert (init.stage, init.phase) == ("node-initialize", "Running")
    status = node["status"]
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [
        ("Ready", "True"), ("MemoryPressure", "False"), ("DiskPressure", "False"), ("PIDPressure", "False"),
        ("NetworkUnavailable", "False")]
    assert {c["lastHeartbeatTime"] for c in status["conditions"]} == {"2006-01-02T15:04:05Z"}
    assert {c["lastTransitionTime"] for c in status["conditions"]} == {"2006-01-02T15:00:00Z"}  # creation time
    assert status["addresses"] == [{"address": "10.1.0.1", "type": "InternalIP"}, {"address": "kwok-0", "type": "Hostname"}]
    assert status["allocatable"] == {"cpu": "8", "memory": "32Gi"}  # the node's own, through YAML . 1
    assert status["capacity"] == {"cpu": "1k", "memory": "1Ti", "pods": "1M"}  # Kwok's default
    assert status["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10250}}
    assert status["nodeInfo"]["kubeletVersion"] == "kwok-0.8.0" and status["nodeInfo"]["architecture"] == "amd64"
    beats = life.due(100.0)
    assert beats and {b.stage for b in beats} == {"node-heartbeat"} and 4 <= len(beats) <= 5
    assert all(20.0 <= b.at - a.at <= 25.0 for a, b in zip([init, *beats], beats, strict=False))
    conditions = life.objects[("Node", "n1")]["status"]["conditions"]
    assert ("Ready", "True") in [(c["type"], c["status"]) for c in conditions]
    assert conditions[0]["lastHeartbeatTime"] == unix_rfc3339nano(EPOCH + beats[-1].at)


def test_pods_run_complete_and_go_with_kwoks_addresses() -> None:
    """pod/fast: a pod bound to a managed node runs (podIP from the node's pod CIDR, hostIP the
    node's InternalIP, containers running); a Job's pod then completes; a pod being deleted is
    deleted, and its address goes back to the pool."""
    life = lifecycle("node/fast", "pod/fast", node_ip="10.1.0.1")
    life.upsert("Node", "n1", {"metadata": {"name": "n1"}, "spec": {"podCIDR": "10.244.1.0/24"}}, 0.0)

    def pod(name: str, owner: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                             "ownerReferences": [{"kind": owner, "name": "o", "uid": "o"}]},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}, "status": {"phase": "Pending"}}

    life.upsert("Pod", "job", pod("job", "Job"), 0.0)
    life.upsert("Pod", "web", pod("web", "ReplicaSet"), 0.0)
    done = life.due(0.0)
    assert [(t.key, t.stage, t.phase) for t in done if t.kind == "Pod"] == [
        ("job", "pod-ready", "Running"), ("web", "pod-ready", "Running"), ("job", "pod-complete", "Succeeded")]
    web = life.objects[("Pod", "web")]["status"]
    assert (web["podIP"], web["podIPs"], web["hostIP"]) == ("10.244.1.2", [{"ip": "10.244.1.2"}], "10.1.0.1")
    assert web["containerStatuses"][0]["state"] == {"running": {"startedAt": "2006-01-02T15:04:05Z"}}
    job = life.objects[("Pod", "job")]["status"]
    assert job["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    life.objects[("Pod", "web")]["metadata"]["deletionTimestamp"] = "2006-01-02T15:04:06Z"
    life.upsert("Pod", "web", life.objects[("Pod", "web")], 1.0)
    [gone] = life.due(1.0)
    assert (gone.stage, gone.deleted) == ("pod-delete", True) and ("Pod", "web") not in life.objects
    life.upsert("Pod", "next", pod("next", "ReplicaSet"), 2.0)
    life.due(2.0)
    assert life.objects[("Pod", "next")]["status"]["podIP"] == "10.244.1.2"  # the freed address again


def test_general_pods_go_through_init_containers_and_keep_their_conditions() -> None:
    """pod/general: create (an event; init containers waiting), init containers run, complete,
    the pod is ready (its Initialized condition kept by the strategic merge of conditions), a
    Job's pod completes; each after 1-5 s. pod-delete waits until the finalizers are gone."""
    life = lifecycle("pod/general")
    life.upsert("Pod", "p", {"metadata": {"name": "p", "namespace": "default", "ownerReferences": [{"kind": "Job"}],
                                          "finalizers": ["example.com/keep"]},
                             "spec": {"nodeName": "n1", "initContainers": [{"name": "init", "image": "i"}],
                                      "containers": [{"name": "c", "image": "i"}]}}, 0.0)
    seen = life.due(60.0)
    assert [t.stage for t in seen] == ["pod-create", "pod-init-container-running", "pod-init-container-completed",
                                       "pod-ready", "pod-complete"]
    assert seen[0].event == {"type": "Normal", "reason": "Created", "message": "Created container"}
    assert all(1.0 <= b.at - a.at <= 5.0 for a, b in zip(seen, seen[1:], strict=False))
    pod = life.objects[("Pod", "p")]
    assert [(c["type"], c["status"]) for c in pod["status"]["conditions"]] == [
        ("Initialized", "True"), ("Ready", "True"), ("ContainersReady", "True")]
    assert pod["status"]["phase"] == "Succeeded"
    pod["metadata"]["deletionTimestamp"] = unix_rfc3339nano(EPOCH + 61.0)
    life.upsert("Pod", "p", pod, 61.0)
    assert life.due(120.0) == []  # a finalizer holds it
    del pod["metadata"]["finalizers"]
    life.upsert("Pod", "p", pod, 130.0)
    [gone] = life.due(130.0)  # the deletion time has passed: no jitter left
    assert (gone.stage, gone.deleted) == ("pod-delete", True)


def test_node_not_ready_chaos_marks_a_labelled_node() -> None:
    life = lifecycle("node/chaos")
    life.upsert("Node", "n1", {"metadata": {"name": "n1", "labels": {"node-not-ready.stage.kwok.x-k8s.io": "true"},
                                            "annotations": {"node-not-ready.stage.kwok.x-k8s.io/reason": "Drill"}},
                               "status": {"phase": "Running"}}, 0.0)
    [t] = life.due(1.0)  # 1 s delay, jitter equal
    conditions = {c["type"]: c for c in life.objects[("Node", "n1")]["status"]["conditions"]}
    assert t.stage == "node-not-ready" and conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["reason"] == "Drill"


def test_volume_stages_provision_and_bind_through_cel_selectors() -> None:
    """volume/fast (CEL selectors, steps with apply): a claim of the kwok-volume class gets a
    PersistentVolume applied and is bound to it; the volume is then bound too."""
    life = lifecycle("volume/fast")
    life.upsert("PersistentVolumeClaim", "default/c", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "c", "namespace": "default", "uid": "u1", "resourceVersion": "1"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "storageClassName": "kwok-volume"}, "status": {"phase": "Pending"}}, 0.0)
    done = life.due(0.0)
    assert [(t.kind, t.stage) for t in done] == [("PersistentVolumeClaim", "pvc-provision"),
                                                  ("PersistentVolume", "pv-bind")]
    claim = life.objects[("PersistentVolumeClaim", "default/c")]
    volume = life.objects[("PersistentVolume", "pvc-u1")]
    assert claim["status"]["phase"] == "Bound" and claim["spec"]["volumeName"] == "pvc-u1"
    assert volume["status"]["phase"] == "Bound" and volume["spec"]["capacity"] == {"storage": "1Gi"}
    assert "namespace" not in volume["metadata"]  # a cluster-scoped kind
