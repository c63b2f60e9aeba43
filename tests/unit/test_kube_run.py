"""The parts of `perf.kube_run` that need no cluster: what a run creates (pods for koordstream,
reservations owned by pod name), which Stage files it applies, and what its watch makes of pod
events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from perf import kube_run as kr
from perf import scenario as sc
from perf.kwok import StageError
from schemas.records import DEFAULT_SCHEDULER, Pod, Reservation, ReservationOwner, ResourceList
from streams.kubeapi import KubeApi

ROOT = Path(__file__).resolve().parents[2]
PROFILES = frozenset({"default-scheduler", "koordstream"})


@pytest.mark.parametrize(("name", "profiles", "expected"), [
    (DEFAULT_SCHEDULER, PROFILES, "koordstream"),
    ("koordstream", PROFILES, "koordstream"),
    ("gpu-fgd", frozenset({"gpu-fgd", "default-scheduler"}), "gpu-fgd"),
    ("gpu-fgd", PROFILES, None),
    (DEFAULT_SCHEDULER, frozenset({"gpu-fgd", "default-scheduler"}), None),
], ids=["default-to-koordstream", "koordstream", "own-profile", "no-such-profile", "no-koordstream-profile"])
def test_the_scheduler_name_a_pod_is_created_with(name: str, profiles: frozenset[str], expected: str | None) -> None:
    if expected is None:
        with pytest.raises(ValueError, match="no such profile"):
            kr.kube_scheduler_name(name, profiles)
    else:
        assert kr.kube_scheduler_name(name, profiles) == expected


@pytest.mark.parametrize(("profiles", "expected"), [
    (PROFILES, "koordstream"),
    (frozenset({"gpu-fgd", "default-scheduler"}), "gpu-fgd"),
    (frozenset({"default-scheduler"}), None),
], ids=["koordstream", "the-scenarios-own", "only-the-default"])
def test_the_probe_goes_to_a_profile_the_bridge_hands_pods_to(profiles: frozenset[str], expected: str | None) -> None:
    if expected is None:
        with pytest.raises(ValueError):
            kr.probe_scheduler(profiles)
    else:
        assert kr.probe_scheduler(profiles) == expected


def test_creations_are_pods_for_koordstream_and_reservations_owned_by_pod_name() -> None:
    pod = Pod(uid="web-0000001", name="web-0000001", namespace="mixed", requests=ResourceList(cpu=500))
    reservation = Reservation(uid="r-web-0000001", name="r-web-0000001", requests=ResourceList(cpu=500),
                              owners=(ReservationOwner(object_uid=pod.uid),), ttl_s=600.0)
    items = kr.creations([(0.0, reservation), (1.0, pod)], PROFILES)
    assert [(c.at, c.key, c.kind, c.path) for c in items] == [
        (0.0, "r-web-0000001", "Reservation", kr.RESERVATIONS),
        (1.0, "mixed/web-0000001", "Pod", "/api/v1/namespaces/mixed/pods")]
    r, p = (orjson.loads(c.body) for c in items)
    assert p["spec"]["schedulerName"] == "koordstream" and "uid" not in p["metadata"]
    assert r["spec"]["owners"] == [{"object": {"name": "web-0000001", "namespace": "mixed"}}]
    assert r["spec"]["template"]["spec"]["schedulerName"] == "koordstream"
    assert r["spec"]["template"]["metadata"]["namespace"] == "mixed"


def test_the_shipped_scenarios_create_what_they_publish() -> None:
    s = sc.load(ROOT / "perf" / "scenarios" / "mixed-100k.yaml").quick()
    arrivals = sc.arrivals(s)
    items = kr.creations(arrivals, PROFILES)
    assert len(items) == len(arrivals)
    assert [c.at for c in items] == sorted(c.at for c in items)
    assert {c.key.split("/")[0] for c in items if c.kind == "Pod"} == {"mixed-100k-quick"}


def test_a_scenarios_stage_files_become_stage_resources() -> None:
    s = sc.load(ROOT / "perf" / "scenarios" / "mixed-100k.yaml")
    docs = kr.stage_documents(s)
    assert [d["metadata"]["name"] for d in docs] == ["pod-ready", "pod-complete", "pod-delete", "node-initialize",
                                                       "node-heartbeat"]
    assert all(d["kind"] == "Stage" for d in docs)


@pytest.mark.parametrize(("text", "field"), [
    ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "apiVersion/kind"),
    ("apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata: {name: x}\n"
     "spec: {resourceRef: {apiGroup: v1, kind: Pod}, selector: {matchExpressions: []}, next: {delete: true}}\n"
     "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: y}\n", "apiVersion/kind"),
    ("apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata: {name: x}\n"
     "spec: {resourceRef: {apiGroup: v1, kind: Pod}, next: {statusTemplate: '{{ NoSuchFunc }}'}}\n", "statusTemplate"),
], ids=["not-a-stage", "a-stage-and-something-else", "unknown-template-function"])
def test_stage_files_that_are_not_kwok_stages_are_refused(text: str, field: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    s = sc.parse({"name": "t", "nodes": [{"pool": "a", "count": 1, "allocatable": {"cpu": "8", "memory": "8Gi"}}],
                  "pods": {"total": 1, "mix": [{"name": "x", "requests": {"cpu": "1"}}]},
                  "lifecycle": {"stages": [str(path)]}}, "t.yaml")
    with pytest.raises(StageError) as err:
        kr.stage_documents(s)
    assert field in str(err.value)


def obj(name: str, node: str = "", phase: str = "Pending", uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid}, "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase}}


EVENTS = [
    ("ADDED", obj("a"), 1.0),
    ("MODIFIED", obj("a", node="n1"), 1.25),
    ("MODIFIED", obj("a", node="n1", phase="Running"), 1.5),
    ("MODIFIED", obj("a", node="n1", phase="Running"), 1.75),  # a heartbeat-like update: nothing new
    ("MODIFIED", obj("a", node="n1", phase="Succeeded"), 2.0),
    ("DELETED", obj("a", node="n1", phase="Succeeded"), 3.0),
]


@pytest.mark.parametrize(("upto", "first", "bound", "running", "finished"), [
    (1, 1.0, None, None, None),
    (2, 1.0, 1.25, None, None),
    (4, 1.0, 1.25, 1.5, None),
    (5, 1.0, 1.25, 1.5, 2.0),
    (6, 1.0, 1.25, 1.5, 2.0),
], ids=["added", "bound", "running", "succeeded", "deleted-after"])
def test_the_watch_keeps_the_first_time_of_each_step(upto: int, first: float, bound: float | None,
                                                     running: float | None, finished: float | None) -> None:
    watch = kr.PodWatch(KubeApi.__new__(KubeApi))
    for kind, o, at in EVENTS[:upto]:
        watch.see(kind, o, at)
    key = "ns/a"
    assert (watch.first_seen.get(key), watch.bound_at.get(key), watch.running_at.get(key),
            watch.finished_at.get(key)) == (first, bound, running, finished)
    assert watch.node.get(key) == ("n1" if bound else None) and watch.events == upto


def test_a_pod_deleted_before_it_ran_is_finished_then() -> None:
    watch = kr.PodWatch(KubeApi.__new__(KubeApi))
    watch.see("ADDED", obj("b"), 1.0)
    watch.see("DELETED", obj("b"), 2.0)
    assert watch.finished_at == {"ns/b": 2.0} and watch.bound_at == {}
