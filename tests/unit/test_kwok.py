"""The Kwok-compatible lifecycle: the jq subset its selectors use, Stage files (the shipped
ones in `infra/kwok/`, and bad ones refused with file, field and value), and objects moving
through the stages on an injected clock (delays, jitter, weights, speed-up, deletion)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perf.kwok import Jq, Lifecycle, StageError, compile_jq, load_stages, parse_stage, read_status

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
    assert ready.status is not None and ready.status.phase == "Running" and ready.status.pod_ip
    assert ("Ready", "True") in ready.status.conditions


def test_a_job_pod_runs_then_completes_and_a_deleted_pod_goes() -> None:
    life = Lifecycle(load_stages(STAGES), speedup=10.0)
    life.upsert("Pod", "job", pod("job", **{"pod-complete.stage.kwok.x-k8s.io/delay": "30s"}), now=0.0)
    life.upsert("Pod", "web", pod("web", owner="ReplicaSet"), now=0.0)
    life.upsert("Node", "n1", {"metadata": {"name": "n1"}, "status": {}}, now=0.0)
    first = life.due(0.0)
    assert sorted((t.key, t.stage, t.phase) for t in first) == [
        ("job", "pod-ready", "Running"), ("n1", "node-initialize", "Running"), ("web", "pod-ready", "Running")]
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
    doc = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage",
           "spec": {"resourceRef": {"kind": "Pod"}, "next": {"statusTemplate": "phase: X"}}}
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
    ({"spec": {"resourceRef": {"kind": "Deployment"}}}, "spec.resourceRef.kind"),
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


def test_status_templates_are_read_for_phase_and_conditions() -> None:
    status = read_status('{{ $now := Now }}\nconditions:\n- type: Ready\n  status: "True"\n'
                         "- lastTransitionTime: {{ $now }}\n  type: Initialized\n  status: 'False'\nphase: Failed\n")
    assert status.phase == "Failed" and status.conditions == (("Ready", "True"), ("Initialized", "False"))
