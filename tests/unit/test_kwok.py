"""The Kwok-compatible lifecycle: the jq subset its selectors use, Stage files (the shipped
ones in `infra/kwok/`, and bad ones refused with file, field and value), and objects moving
through the stages on an injected clock (delays, jitter, weights, speed-up, deletion)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perf.kwok import (
    Jq,
    Lifecycle,
    LifecycleError,
    StageError,
    compile_jq,
    load_stages,
    parse_stage,
    stock_stages_dir,
)
from perf.kwok_render import KwokConfig

STAGES = sorted((Path(__file__).parents[2] / "infra" / "kwok").glob("*.yaml"))
NODE: dict[str, Any] = {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}


def pod(name: str = "p", owner: str = "Job", **annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": dict(annotations), "ownerReferences": [{"kind": owner}]},
            "spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}}


@pytest.mark.parametrize(("expr", "expected"), [
    (".metadata.name", ["n1"]),
    ('.metadata["name"]', ["n1"]),
    (".status.conditions.[].type", ["Ready"]),
    ('.status.conditions.[] | select( .type == "Ready" ) | .status', ["False"]),
    ('.status.conditions.[] | select( .type != "Ready" ) | .status', []),
    (".metadata.missing", []),
])
def test_the_jq_subset(expr: str, expected: list[Any]) -> None:
    assert compile_jq(expr).values(NODE) == expected


_leaf = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["a", "b", ""])
_objects = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(_objects, st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4))
def test_a_path_of_keys_yields_what_the_general_evaluation_yields(obj: Any, keys: list[str]) -> None:
    """A one-path expression without `[]` is looked up directly; on any object (lists, nulls,
    scalars on the way) it yields what the stage-by-stage evaluation yields."""
    direct = compile_jq("".join(f".{k}" for k in keys))
    general = Jq(direct.text, (*direct.stages, ("path", ())))  # a second, empty stage: no shortcut
    assert direct.values(obj) == general.values(obj)


@pytest.mark.parametrize("expr", ["metadata", ".a | map(.b)", '.a | select(.b == "x"', ""])
def test_unsupported_jq_is_refused(expr: str) -> None:
    with pytest.raises(ValueError):
        compile_jq(expr)


def test_the_shipped_stage_files_load() -> None:
    stages = load_stages(STAGES)
    assert {s.name for s in stages} == {"pod-ready", "pod-complete", "pod-delete", "node-initialize", "node-heartbeat"}
    ready = next(s for s in stages if s.name == "pod-ready")
    [step] = ready.steps  # statusTemplate: a patch of the status
    assert step.patch is not None and step.patch.root == "status" and step.patch.type is None
    delete = next(s for s in stages if s.name == "pod-delete")
    assert [bool(s.finalizers) for s in delete.steps] == [True, False] and delete.delete


def test_a_job_pod_runs_then_completes_and_a_deleted_pod_goes() -> None:
    life = Lifecycle(load_stages(STAGES), speedup=10.0)
    life.upsert("Node", "n1", {"metadata": {"name": "n1"}, "status": {}}, now=0.0)
    life.upsert("Pod", "job", pod("job", **{"pod-complete.stage.kwok.x-k8s.io/delay": "30s"}), now=0.0)
    life.upsert("Pod", "web", pod("web", owner="ReplicaSet"), now=0.0)
    first = life.due(0.0)
    assert sorted((t.key, t.stage, t.phase) for t in first) == [
        ("job", "pod-ready", "Running"), ("n1", "node-initialize", "Running"), ("web", "pod-ready", "Running")]
    # the templates ran: addresses from the node's pod CIDR (Kwok's --cidr), conditions merged
    assert [life.objects[("Pod", k)]["status"]["podIP"] for k in ("job", "web")] == ["10.0.0.1", "10.0.0.2"]
    assert [c["type"] for c in life.objects[("Pod", "job")]["status"]["conditions"]] == [
        "Initialized", "Ready", "ContainersReady"]
    seen = life.due(2.9)
    assert [t for t in seen if t.kind == "Pod"] == []  # 30 s at a speed-up of 10: 3 s
    [done] = [t for t in life.due(3.0) if t.kind == "Pod"]
    assert (done.key, done.stage, done.phase) == ("job", "pod-complete", "Succeeded")
    web = life.objects[("Pod", "web")]
    web["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # evicted
    life.upsert("Pod", "web", web, now=4.0)
    [gone] = [t for t in life.due(4.0) if t.kind == "Pod"]
    assert gone.deleted and ("Pod", "web") not in life.objects
    beats = [t.at for t in seen + life.due(4.5) if t.stage == "node-heartbeat"]
    assert len(beats) in (1, 2) and 2.0 <= beats[0] <= 2.5  # every 20-25 s at a speed-up of 10


def test_weights_pick_stages_in_proportion() -> None:
    doc: dict[str, Any] = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage",  # selector {}: every pod
           "spec": {"resourceRef": {"kind": "Pod"}, "selector": {}, "next": {"statusTemplate": "phase: X"}}}
    heavy = parse_stage({**doc, "metadata": {"name": "heavy"}, "spec": {**doc["spec"], "weight": 9}}, "t")
    light = parse_stage({**doc, "metadata": {"name": "light"}, "spec": {**doc["spec"], "weight": 1}}, "t")
    life = Lifecycle([heavy, light], seed=3)
    for i in range(1000):
        life.upsert("Pod", f"p{i}", {"metadata": {}, "status": {}}, now=0.0)
    first: dict[str, str] = {}
    for t in life.due(0.0):  # then the other one applies too (each instant stage once)
        first.setdefault(t.key, t.stage)
    assert 850 <= list(first.values()).count("heavy") <= 950


@pytest.mark.parametrize(("change", "field"), [
    ({"spec": {"resourceRef": {"kind": "Pod"}, "colour": "red"}}, "spec.colour"),
    ({"spec": {"resourceRef": {"apiGroup": "v1"}}}, "spec.resourceRef.kind"),
    ({"spec": {"resourceRef": {"kind": "Node"}, "next": {"statusTemplate": "ip: {{ PodIP }}"}}},
     "spec.next.statusTemplate"),  # a pod's function in a node's template: Kwok has none there
    ({"spec": {"resourceRef": {"kind": "Pod"}, "next": {"patches": [{"template": "{{ if }}"}]}}},
     "spec.next.patches[0].template"),
    ({"spec": {"resourceRef": {"kind": "Pod"}, "steps": [{"patch": {"template": "a: 1", "type": "yaml"}}]}},
     "spec.steps[0].patch.type"),
    ({"spec": {"resourceRef": {"kind": "Pod"},
               "selector": {"matchExpressions": [{"cel": {"expression": "self.a =="}}]}}},
     "spec.selector.matchExpressions[0].cel.expression"),
    ({"spec": {"resourceRef": {"kind": "Pod"},
               "selector": {"matchExpressions": [{"key": ".a", "operator": "Near"}]}}},
     "spec.selector.matchExpressions[0].operator"),
    ({"spec": {"resourceRef": {"kind": "Pod"},
               "selector": {"matchExpressions": [{"key": ".a | map(.b)", "operator": "Exists"}]}}},
     "spec.selector.matchExpressions[0].key"),
    ({"spec": {"resourceRef": {"kind": "Pod"}, "delay": {"durationMilliseconds": -5}}},
     "spec.delay.durationMilliseconds"),
])
def test_a_bad_stage_names_the_file_the_field_and_the_value(change: dict[str, Any], field: str) -> None:
    raw = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": "s"}, **change}
    with pytest.raises(StageError) as exc:
        parse_stage(raw, "stages.yaml")
    assert exc.value.field == field and str(exc.value).startswith("stages.yaml")


def test_a_bad_file_is_refused_before_anything_runs(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata: {name: x}\n"
                   "spec: {resourceRef: {kind: Pod}, next: {delete: true, explode: true}}\n")
    with pytest.raises(StageError, match=r"bad.yaml .*spec.next.explode"):
        load_stages([*STAGES, bad])


def test_a_stage_without_a_selector_never_applies() -> None:
    """As in Kwok (NewStage skips it): `selector: {}` selects everything, no selector nothing."""
    doc = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": "s"},
           "spec": {"resourceRef": {"kind": "Pod"}, "next": {"statusTemplate": "phase: X"}}}
    life = Lifecycle([parse_stage(doc, "t")])
    life.upsert("Pod", "p", {"metadata": {}}, now=0.0)
    assert life.due(0.0) == []


def stage(name: str = "s", kind: str = "Pod", **spec: Any) -> Any:
    return parse_stage({"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name},
                        "spec": {"resourceRef": {"kind": kind}, "selector": {}, **spec}}, "stages.yaml")


def test_a_template_that_fails_on_an_object_names_the_stage_the_object_and_the_position() -> None:
    life = Lifecycle([stage(next={"statusTemplate": "phase: Running\nip: {{ index .status.ips 3 }}"})])
    life.upsert("Pod", "p1", {"metadata": {}, "status": {"ips": ["a"]}}, now=0.0)
    with pytest.raises(LifecycleError) as exc:
        life.due(0.0)
    assert "stages.yaml (stage s) on Pod p1" in str(exc.value)
    assert "spec.next.statusTemplate:2:7: executing" in str(exc.value) and "index out of range: 3" in str(exc.value)


def test_now_comes_from_the_injected_clock() -> None:
    life = Lifecycle([stage(next={"statusTemplate": "startTime: {{ Now | Quote }}"})],
                     config=KwokConfig(epoch=1136214245.0))
    life.upsert("Pod", "p", {"metadata": {}}, now=0.0)
    life.due(1.5)
    assert life.objects[("Pod", "p")]["status"]["startTime"] == "2006-01-02T15:04:05Z"  # planned at 0, no delay


def test_finalizer_steps_and_a_delete_held_by_finalizers() -> None:
    """A delete with finalizers left only marks the object (deletionTimestamp), as the API
    server does; a later stage that empties them lets the next delete remove it."""
    keep = stage("keep", steps=[{"finalizers": {"add": [{"value": "a"}, {"value": "b"}]}}, {"delete": True}],
                 selector={"matchExpressions": [{"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}]})
    drop = stage("drop", steps=[{"finalizers": {"remove": [{"value": "a"}]}}],
                 selector={"matchExpressions": [{"key": ".metadata.deletionTimestamp", "operator": "Exists"},
                                                {"key": '.metadata.finalizers.[] | select(. == "a")',
                                                 "operator": "Exists"}]})
    gone = stage("gone", next={"finalizers": {"empty": True}, "delete": True},
                 selector={"matchExpressions": [{"key": ".metadata.deletionTimestamp", "operator": "Exists"},
                                                {"key": '.metadata.finalizers.[] | select(. == "a")',
                                                 "operator": "DoesNotExist"}]})
    life = Lifecycle([keep, drop, gone], config=KwokConfig(epoch=1136214245.0))
    life.upsert("Pod", "p", {"metadata": {"finalizers": ["x"]}}, now=0.0)
    seen = life.due(0.0)
    assert [(t.stage, t.deleted) for t in seen] == [("keep", False), ("drop", False), ("gone", True)]
    assert ("Pod", "p") not in life.objects


def test_a_selector_that_fails_leaves_the_object_alone_and_loops_are_refused() -> None:
    cel = stage("cel", next={"statusTemplate": "phase: X"},
                selector={"matchExpressions": [{"cel": {"expression": "self.status.phase == 'Y'"}}]})
    life = Lifecycle([cel])
    life.upsert("Pod", "p", {"metadata": {}}, now=0.0)  # no status: CEL's "no such key"
    assert life.due(0.0) == []
    flip = stage("flip", next={"statusTemplate": "mode: {{ if eq .status.mode \"a\" }}b{{ else }}a{{ end }}"})
    life = Lifecycle([flip])
    life.upsert("Pod", "p", {"metadata": {}, "status": {"mode": "a"}}, now=0.0)
    with pytest.raises(LifecycleError, match="a loop in the stage files"):
        life.due(0.0)


@pytest.mark.parametrize(("annotation", "delay"), [
    pytest.param("1m30s", 90.0, id="go-duration"),
    pytest.param("1.5h", 5400.0, id="fraction"),
    pytest.param("2006-01-02T15:05:05Z", 60.0, id="timestamp-until-then"),
    pytest.param("soon", 2.0, id="unreadable-default"),
])
def test_delays_come_from_expressions(annotation: str, delay: float) -> None:
    s = stage(delay={"durationMilliseconds": 2000, "durationFrom": {"expressionFrom": '.metadata.annotations["d"]'}},
              next={"statusTemplate": "phase: X"})
    assert s.delay_s({"metadata": {"annotations": {"d": annotation}}}, 1136214245.0, random.Random(0)) == delay


def test_weight_from_an_annotation() -> None:
    s = stage(weight=3, weightFrom={"expressionFrom": '.metadata.annotations["w"]'})
    assert [s.weight_of({"metadata": {"annotations": a}}) for a in ({}, {"w": "0x10"}, {"w": "x"}, {"w": ""})] == [
        3, 16, None, None]


def test_kwok_config_is_validated() -> None:
    with pytest.raises(ValueError, match="cidr"):
        Lifecycle([], config=KwokConfig(cidr="10.0.0/33"))


def test_rendered_yaml_is_read_with_go_yaml_v2s_rules() -> None:
    """As in Kwok (sigs.k8s.io/yaml over go-yaml v2, YAML 1.1): `yes` / `n` are booleans, even
    as keys, `1e3` is a number, an unquoted timestamp is RFC 3339 text."""
    template = "ok: yes\nn: x\nsize: 1e3\nat: 2006-01-02\nquoted: 'no'"
    life = Lifecycle([stage(next={"statusTemplate": template})])
    life.upsert("Pod", "p", {"metadata": {}}, now=0.0)
    life.due(0.0)
    assert life.objects[("Pod", "p")]["status"] == {"ok": True, "false": "x", "size": 1000.0,
                                                    "at": "2006-01-02T00:00:00Z", "quoted": "no"}


def test_the_stock_stages_folder_names_make_kwok_stages_when_missing(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOORDSTREAM_KWOK_DIR", str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match="run `make kwok-stages`"):
        stock_stages_dir()
    (tmp_path / "nothing" / "stage").mkdir(parents=True)
    (tmp_path / "nothing" / ".complete").touch()
    assert stock_stages_dir() == tmp_path / "nothing" / "stage"
