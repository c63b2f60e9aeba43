"""`koordstream perf run SCENARIO --kwok` on a tiny scenario: the real kube-apiserver, etcd and
Kwok (`make k8s`) with the scenario's own Stage files, the embedded broker, the workers and the
bridge; every pod (plain, Job pods that complete, GPU shares, whole-GPU gangs, reserved pods)
is created through the API and bound by koordstream, nothing is bound twice or over a node
(on the topics and as the API server lists it at the end), and the figures are there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

SCENARIO = {
    "name": "tiny-kwok", "seed": 5,
    "nodes": [{"pool": "cpu", "count": 12, "allocatable": {"cpu": "16", "memory": "64Gi"}},
              {"pool": "gpu", "count": 8, "allocatable": {"cpu": "32", "memory": "128Gi"},
               "gpus": {"count": 8, "model": "A100", "memory": "40Gi"}}],
    "pods": {"total": 300, "arrival": {"rate": 100}, "mix": [
        {"name": "web", "share": 50, "qos": "LS", "priorityClass": "koord-prod",
         "requests": {"cpu": "500m", "memory": "1Gi"}},
        {"name": "job", "share": 35, "qos": "BE", "priorityClass": "koord-batch",
         "requests": {"cpu": "1", "memory": "1Gi"}, "duration": "200ms"},
        {"name": "infer", "share": 10, "qos": "LS", "requests": {"cpu": "1", "memory": "2Gi"}, "gpu": {"share": 50},
         "reserved": 0.5},
        {"name": "train", "share": 5, "qos": "LS", "priorityClass": "koord-mid",
         "requests": {"cpu": "2", "memory": "4Gi"}, "gpu": {"whole": 1}, "gang": {"size": 2, "waitingTime": "30s"}}]},
    "lifecycle": {"stages": ["infra/kwok/pod-ready.yaml", "infra/kwok/pod-complete.yaml", "infra/kwok/pod-delete.yaml",
                             "infra/kwok/node-initialize.yaml", "infra/kwok/node-heartbeat.yaml"]},
}

KEYS = {"scenario", "mode", "startup_s", "wall_s", "pods_total", "pods_bound", "pods_double_bound",
        "nodes_overcommitted", "devices_overcommitted", "nodes_overcommitted_apiserver", "bindings_disagreeing",
        "throughput_pods_per_s", "throughput_samples_pods_per_s", "queue_latency_ms", "queue_latency_apiserver_ms",
        "queue_latency_split_ms", "start_latency_ms", "create_latency_ms", "plugins", "apiserver_requests_per_s",
        "apiserver_request_mean_ms", "cpu_s", "limit", "memory_peak_mb", "etcd", "stages"}


def test_a_tiny_scenario_runs_through_the_real_api_server_and_kwok(tmp_path: Path) -> None:
    spec, out = tmp_path / "tiny-kwok.yaml", tmp_path / "run.json"
    spec.write_text(yaml.safe_dump(SCENARIO))
    done = subprocess.run([sys.executable, "-m", "cli.main", "perf", "run", str(spec), "--kwok", "--json", str(out),
                           "--report", str(tmp_path / "report")], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert set(r) >= KEYS and r["mode"] == "kwok"
    # Every pod bound, as the API server lists them; nothing twice, nothing over a node.
    assert r["pods_bound"] == r["pods_total"] == 300 and r["pods_create_failed"] == 0
    assert r["pods_double_bound"] == r["nodes_overcommitted"] == r["devices_overcommitted"] == 0
    assert r["nodes_overcommitted_apiserver"] == r["bindings_disagreeing"] == 0
    assert r["reservations_created"] > 0
    # The scenario's stages ran on real Kwok: pods started, Job pods completed and freed their nodes.
    assert r["stages"] == ["node-heartbeat", "node-initialize", "pod-complete", "pod-delete", "pod-ready"]
    assert r["pods_by_phase"]["Running"] + r["pods_by_phase"]["Succeeded"] > 0
    assert r["pods_terminated"] > 0
    # The figures.
    assert r["throughput_pods_per_s"] > 0 and r["queue_latency_ms"]["p50"] > 0
    assert r["queue_latency_apiserver_ms"]["p99"] % 1000 == 0  # whole seconds
    assert r["apiserver_requests_per_s"]["POST pods/binding"] > 0 and r["apiserver_requests_per_s"]["POST pods"] > 0
    assert r["plugins"]["NodeResourcesFit"]["Filter"] > 0
    assert set(r["cpu_s"]) >= {"kube-apiserver", "etcd", "kwok", "state", "scheduler", "bridge", "broker", "harness"}
    assert r["limit"]["limit"] and r["limit"]["note"]
    assert r["etcd"]["keys"] > 300
    text = (tmp_path / "report" / "report.md").read_text()
    assert text.startswith("# koordstream perf run: tiny-kwok")
    assert (tmp_path / "report" / "throughput.png").read_bytes()[:4] == b"\x89PNG"


def test_warm_claims_through_the_real_api_server_are_answered_once_each(tmp_path: Path) -> None:
    """`perf run sandbox-warm --kwok --quick`: pools and claims created as agent-sandbox's custom
    resources, every claim Ready through the bridge, each with a sandbox of its own."""
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, "-m", "cli.main", "perf", "run", "sandbox-warm", "--kwok", "--quick",
                           "--json", str(out), "--report", str(tmp_path / "report")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["claims_ready"] == r["claims_total"] == 1495 and r["claims_unanswered"] == 0
    assert r["sandboxes_double_adopted"] == r["sandboxes_double_named"] == 0
    assert r["pods_double_bound"] == r["nodes_overcommitted"] == 0
    for phase in r["phases"].values():
        assert phase["claims_created"] == phase["claims_ready"] and phase["claim_latency_ms"]["p50"] > 0
        assert phase["claim_latency_decided_ms"]["p50"] <= phase["claim_latency_ms"]["p50"]
        assert set(phase["machine"]["cores_by_process"]) >= {"kube-apiserver", "etcd", "kwok", "bridge", "state"}
    assert (tmp_path / "report" / "report.md").is_file()
