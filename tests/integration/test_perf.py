"""`koordstream perf run` on its own embedded broker: a small mixed scenario (gangs,
reservations, GPU shares, Job pods that complete through the Kwok-compatible lifecycle and free
their nodes) is bound whole and consistently, the JSON result has the documented keys and
figures, and the report comes with its plots; the warm pools' runs (sandbox-warm,
sandbox-churn) answer every claim with no sandbox adopted twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

KEYS = {"scenario", "startup_s", "wall_s", "pods_total", "pods_bound", "pods_unschedulable", "pods_double_bound",
        "nodes_overcommitted", "throughput_pods_per_s", "throughput_samples_pods_per_s", "queue_latency_ms",
        "start_latency_ms", "gang_latency_ms", "harness_cpu_s", "scheduler_cpu_s", "noop_limit_pods_per_s",
        "ratio_to_limit", "plugins"}

SCENARIO = {
    "name": "small-mixed", "seed": 5,
    "nodes": [{"pool": "cpu", "count": 20, "allocatable": {"cpu": "16", "memory": "64Gi"}},
              {"pool": "gpu", "count": 6, "allocatable": {"cpu": "32", "memory": "128Gi"},
               "gpus": {"count": 4, "model": "A100", "memory": "40Gi"}}],
    "pods": {"total": 400, "arrival": {"rate": 200}, "mix": [
        {"name": "web", "share": 50, "qos": "LS", "requests": {"cpu": "500m", "memory": "1Gi"}},
        {"name": "job", "share": 35, "qos": "BE", "requests": {"cpu": "1", "memory": "1Gi"}, "duration": "500ms"},
        {"name": "infer", "share": 10, "qos": "LS", "requests": {"cpu": "1", "memory": "2Gi"}, "gpu": {"share": 50},
         "reserved": 0.5},
        {"name": "train", "share": 5, "qos": "LS", "requests": {"cpu": "2", "memory": "4Gi"},
         "gang": {"size": 2, "waitingTime": "30s"}}]},
    "lifecycle": {"stages": ["infra/kwok/pod-ready.yaml", "infra/kwok/pod-complete.yaml", "infra/kwok/pod-delete.yaml",
                             "infra/kwok/node-initialize.yaml"]},  # nodes register not ready
}


def test_a_small_mixed_scenario_runs_through_the_real_system(tmp_path: Path) -> None:
    spec, out = tmp_path / "small-mixed.yaml", tmp_path / "run.json"
    spec.write_text(yaml.safe_dump(SCENARIO))
    done = subprocess.run([sys.executable, "-m", "cli.main", "perf", "run", str(spec), "--json", str(out),
                           "--report", str(tmp_path / "report"), "--floor"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result) >= KEYS
    assert result["pods_bound"] == result["pods_total"] == 400
    assert result["pods_double_bound"] == result["nodes_overcommitted"] == 0
    assert result["pods_terminated"] > 0  # Job pods completed and were terminated at their nodes
    assert result["gang_latency_ms"]["p99"] > 0 and result["start_latency_ms"]["p50"] > 0
    assert set(result["throughput_samples_pods_per_s"]) == {"p50", "p90", "p95", "p99"}
    assert result["noop_limit_pods_per_s"] > 0 and result["ratio_to_limit"] > 0
    # The protocol's floor moved every pod through its records in two processes of its own.
    assert result["floor_pods_per_s"] > 0 and result["floor_ratio_to_limit"] > 0 and result["ratio_to_floor"] > 0
    assert result["floor_cpu_us_per_pod"] > 0 and result["worker_cpu_us_per_pod"] > 0
    assert result["plugins"]["NodeResourcesFit"]["Filter"] > 0  # the scheduler's profiling samples
    assert result["attempts"]["scheduled"] >= 400  # the scheduler's AttemptsSamples
    assert 0 <= result["fast_path_share"] <= 1
    assert 0 < result["allocation_pct"]["cpu_peak"] <= 100 and result["allocation_pct"]["gpu_peak"] > 0
    assert set(result["fragmentation_pct"]) >= {"cpu"}
    assert result["worker_memory_peak_mb"]["scheduler"] > 0 and result["worker_memory_peak_mb"]["state"] > 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert text.startswith("# koordstream perf run: small-mixed")
    for png in ("throughput.png", "latency_cdf.png", "allocation.png"):
        assert (tmp_path / "report" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in text


SANDBOX_KEYS = {"claims_total", "claims_adopted", "claims_cold", "claims_refused", "warm_hit_rate", "claim_latency_ms",
                "sandboxes_double_adopted", "nodes_overcommitted", "pods_double_bound", "fast_path_share",
                "pool_depth_series", "latency_cdf_ms"}


def sandbox_run(name: str, tmp_path: Path) -> dict[str, Any]:
    out, report = tmp_path / f"{name}.json", tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "cli.main", "perf", "run", name, "--quick", "--json", str(out),
                           "--report", str(report)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result: dict[str, Any] = json.loads(out.read_text())
    assert result["scenario"] == f"{name} (quick)" and set(result) >= SANDBOX_KEYS
    # The invariants, from the topics: no sandbox adopted by two claims, no pod bound twice, no node
    # over-committed; every claim answered, and the counts add up.
    assert result["sandboxes_double_adopted"] == result["pods_double_bound"] == result["nodes_overcommitted"] == 0
    assert result["claims_unanswered"] == 0 and result["claims_total"] > 0
    assert result["claims_warm"] + result["claims_starting"] + result["claims_cold"] + result["claims_refused"] \
        == result["claims_total"]
    assert result["claims_adopted"] == result["claims_warm"] + result["claims_starting"]
    assert set(result["claim_latency_ms"]) == {"p50", "p90", "p99", "max"}
    text = (report / "report.md").read_text()
    for png in ("claim_latency_cdf.png", "pool_depth.png", "allocation.png"):
        assert (report / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({png})" in text
    return result


@pytest.mark.e2e  # 20 s; tests/integration/test_sandbox.py drives the pools through the broker in `make test`
def test_sandbox_warm_quick_runs_its_phases_through_the_real_system(tmp_path: Path) -> None:
    result = sandbox_run("sandbox-warm", tmp_path)
    phases = result["phases"]
    assert list(phases) == ["warm-45-per-s", "warm-1000-per-s", "burst-360"]
    assert [p["claims_total"] for p in phases.values()] == [135, 1000, 360]
    for name, p in phases.items():  # each pool is deep enough for its phase: every claim adopts a ready sandbox
        assert p["warm_hit_rate"] == 1.0 and p["claims_ready"] == p["claims_total"]
        assert result["pool_depth_series"][name]["ready"]
    assert 0 < result["fast_path_share"] <= 1  # the pools' refills went through the scheduler


@pytest.mark.e2e
def test_sandbox_churn_quick_churns_claims_through_the_real_system(tmp_path: Path) -> None:
    result = sandbox_run("sandbox-churn", tmp_path)
    assert set(result["pools"]) == {"python", "browser", "notebook"}
    assert result["claims_deleted"] > 0 and result["claims_ready"] == result["claims_total"]
    assert 0 < result["warm_hit_rate"] <= 1 and 0 < result["nodes_used"]["max"] <= 20


TRACE = Path(__file__).resolve().parents[3] / "shared" / "data" / "alibaba-gpu-2023"


@pytest.mark.e2e  # 43 s; tests/unit/test_trace.py replays the trace through the core in `make test`
@pytest.mark.skipif(not (TRACE / "openb_node_list_gpu_node.csv").exists(),
                    reason="the Alibaba trace is not next to the repository")
def test_the_alibaba_trace_runs_through_the_real_system_with_fgd(tmp_path: Path) -> None:
    out = tmp_path / "alibaba.json"
    done = subprocess.run([sys.executable, "-m", "cli.main", "perf", "run", "alibaba", "--quick", "--json", str(out),
                           "--nodes-csv", str(TRACE / "openb_node_list_gpu_node.csv"),
                           "--pods-csv", str(TRACE / "openb_pod_list_default.csv")],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["pods_total"] == 600 and result["pods_bound"] + result["pods_unschedulable"] <= 600
    assert result["pods_bound"] > 500 and result["pods_double_bound"] == result["nodes_overcommitted"] == 0
    assert result["plugins"]["FGD"]["Score"] > 0  # the scenario's profile: FGD scores the GPU pods
    assert result["allocation_pct"]["gpu_final"] > 50 and "gpu" in result["fragmentation_pct"]


def test_a_trace_scenario_without_its_files_is_refused_before_the_run() -> None:
    done = subprocess.run([sys.executable, "-m", "cli.main", "perf", "run", "alibaba", "--quick"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "needs --nodes-csv and --pods-csv" in done.stdout


# In `make e2e`: three whole perf runs (broker, workers, lifecycle), about two minutes, beyond
# `make test`'s ten.
@pytest.mark.e2e
@pytest.mark.parametrize("name", ["basic", "mixed-100k", "sandbox-burst"])
def test_the_quick_variants_of_the_shipped_scenarios_run_whole_and_consistent(name: str, tmp_path: Path) -> None:
    out = tmp_path / f"{name}.json"
    done = subprocess.run([sys.executable, "-m", "cli.main", "perf", "run", name, "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["scenario"] == f"{name} (quick)" and set(result) >= KEYS
    assert result["pods_bound"] == result["pods_total"] > 0
    assert result["pods_double_bound"] == result["nodes_overcommitted"] == 0
    assert result["harness_cpu_s"] < result["scheduler_cpu_s"]
    if name == "sandbox-burst":  # identical pods in bursts: placed as equivalence classes
        assert result["fast_path_share"] > 0.9
