"""The Kubernetes API's patch types on plain objects (perf.kubepatch), table-driven: merge
patches (RFC 7386), strategic merge patches with the Pod and Node schemas (the expected results
are what apimachinery v0.37's StrategicMergePatch gives for the same JSON with corev1.Pod / Node;
the directives it has and this module refuses are the exception), and JSON patches (RFC 6902)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from perf.kubepatch import (
    NODE,
    POD,
    PatchError,
    apply_patch,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)

COND = {"status": {"conditions": [{"type": "Initialized", "status": "True"},
                                  {"type": "Ready", "status": "False", "reason": "x"},
                                  {"type": "ContainersReady", "status": "False"}]}}


@pytest.mark.parametrize(("target", "patch", "expected"), [
    pytest.param({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": None, "e": 4}}, {"a": 1, "b": {"d": 3, "e": 4}},
                 id="nested-null-deletes"),
    pytest.param({"l": [1, 2]}, {"l": [3]}, {"l": [3]}, id="lists-replace"),
    pytest.param({"a": 1}, {"b": {"c": None, "d": 1}}, {"a": 1, "b": {"d": 1}}, id="new-map-without-nulls"),
    pytest.param({"a": 1}, {"l": [{"x": None}]}, {"a": 1, "l": [{"x": None}]}, id="nulls-inside-lists-stay"),
    pytest.param({"a": 1}, None, None, id="null-document"),
])
def test_merge_patch(target: Any, patch: Any, expected: Any) -> None:
    before = copy.deepcopy(target)
    assert merge_patch(target, patch) == expected
    assert target == before  # arguments are left alone


@pytest.mark.parametrize(("schema", "target", "patch", "expected"), [
    pytest.param(POD, COND, {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": None},
                                                       {"type": "PodScheduled", "status": "True"}]}},
                 {"status": {"conditions": [{"type": "Initialized", "status": "True"},
                                            {"type": "Ready", "status": "True"},
                                            {"type": "PodScheduled", "status": "True"},
                                            {"type": "ContainersReady", "status": "False"}]}},
                 id="pod-conditions-merge-by-type"),
    pytest.param(POD, {"status": {"containerStatuses": [{"name": "a", "ready": True}], "phase": "Running"}},
                 {"status": {"containerStatuses": [{"name": "b"}], "initContainerStatuses": None, "phase": None}},
                 {"status": {"containerStatuses": [{"name": "b"}]}}, id="pod-container-statuses-replace"),
    pytest.param(POD, {"metadata": {"finalizers": ["a", "b"]}}, {"metadata": {"finalizers": ["c", "a"]}},
                 {"metadata": {"finalizers": ["c", "a", "b"]}}, id="finalizers-union"),
    pytest.param(POD, {"status": {"podIPs": [{"ip": "10.0.0.1"}]}}, {"status": {"podIPs": [{"ip": "10.0.0.2"}]}},
                 {"status": {"podIPs": [{"ip": "10.0.0.2"}, {"ip": "10.0.0.1"}]}},  # apimachinery's order
                 id="pod-ips-merge-by-ip"),
    pytest.param(POD, COND, {"status": {"conditions": [{"type": "Ready", "$patch": "delete"}]}},
                 {"status": {"conditions": [{"type": "Initialized", "status": "True"},
                                            {"type": "ContainersReady", "status": "False"}]}},
                 id="delete-an-element"),
    pytest.param(POD, COND, {"status": {"conditions": [{"$patch": "replace"}, {"type": "Ready", "status": "True"}]}},
                 {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, id="replace-a-list"),
    pytest.param(POD, {"status": {"a": 1, "b": 2}}, {"status": {"$patch": "replace", "c": 3}}, {"status": {"c": 3}},
                 id="replace-a-map"),
    pytest.param(NODE, {"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                                                 {"type": "Hostname", "address": "n1"}]}},
                 {"status": {"addresses": [{"type": "Hostname", "address": "n2"}]}},
                 {"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                                           {"type": "Hostname", "address": "n2"}]}}, id="node-addresses-by-type"),
    pytest.param(NODE, {"spec": {"taints": [{"key": "a"}]}}, {"spec": {"taints": [{"key": "b"}]}},
                 {"spec": {"taints": [{"key": "b"}]}}, id="node-taints-replace"),
    pytest.param(NODE, {"status": {"allocatable": {"cpu": "1"}}}, {"status": {"allocatable": {"memory": "1Gi"}}},
                 {"status": {"allocatable": {"cpu": "1", "memory": "1Gi"}}}, id="maps-merge"),
])
def test_strategic_merge_patch(schema: Any, target: Any, patch: Any, expected: Any) -> None:
    before = copy.deepcopy(target)
    assert strategic_merge_patch(target, patch, schema) == expected
    assert target == before


@pytest.mark.parametrize(("patch", "message"), [
    pytest.param({"status": {"conditions": [{"status": "True"}]}}, "does not contain declared merge key: type",
                 id="missing-merge-key"),
    pytest.param({"status": {"$retainKeys": ["a"]}}, r"'\$retainKeys' is not supported", id="unsupported-directive"),
    pytest.param({"status": {"$patch": "explode"}}, "unknown patch type", id="unknown-directive"),
])
def test_strategic_merge_patch_refuses_bad_patches(patch: Any, message: str) -> None:
    with pytest.raises(PatchError, match=message):
        strategic_merge_patch(COND, patch, POD)


@pytest.mark.parametrize(("ops", "expected"), [
    pytest.param([{"op": "remove", "path": "/metadata/finalizers"}], {"metadata": {}}, id="remove"),
    pytest.param([{"op": "add", "path": "/metadata/finalizers/-", "value": "c"}],
                 {"metadata": {"finalizers": ["a", "b", "c"]}}, id="append"),
    pytest.param([{"op": "remove", "path": "/metadata/finalizers/0"}], {"metadata": {"finalizers": ["b"]}},
                 id="remove-index"),
    pytest.param([{"op": "replace", "path": "/metadata/finalizers/1", "value": "z"}],
                 {"metadata": {"finalizers": ["a", "z"]}}, id="replace"),
    pytest.param([{"op": "copy", "from": "/metadata/finalizers", "path": "/metadata/x~1y"}],
                 {"metadata": {"finalizers": ["a", "b"], "x/y": ["a", "b"]}}, id="copy-escaped-pointer"),
    pytest.param([{"op": "test", "path": "/metadata/finalizers/0", "value": "a"},
                  {"op": "move", "from": "/metadata/finalizers", "path": "/f"}], {"metadata": {}, "f": ["a", "b"]},
                 id="test-and-move"),
])
def test_json_patch(ops: Any, expected: Any) -> None:
    assert json_patch({"metadata": {"finalizers": ["a", "b"]}}, ops) == expected


@pytest.mark.parametrize("ops", [
    pytest.param([{"op": "remove", "path": "/metadata/nothing"}], id="remove-missing"),
    pytest.param([{"op": "test", "path": "/metadata/finalizers/0", "value": "z"}], id="failed-test"),
    pytest.param([{"op": "jump", "path": "/a"}], id="unknown-op"),
    pytest.param({"op": "add"}, id="not-a-list"),
])
def test_json_patch_refuses_bad_operations(ops: Any) -> None:
    with pytest.raises(PatchError):
        json_patch({"metadata": {"finalizers": ["a", "b"]}}, ops)


def test_apply_patch_picks_the_patch_type_and_the_kinds_schema() -> None:
    patch = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert len(apply_patch(COND, patch, "application/strategic-merge-patch+json", "Pod")["status"]["conditions"]) == 3
    assert len(apply_patch(COND, patch, "application/merge-patch+json", "Pod")["status"]["conditions"]) == 1
    with pytest.raises(PatchError, match="no schema"):
        apply_patch(COND, patch, "application/strategic-merge-patch+json", "PersistentVolume")
