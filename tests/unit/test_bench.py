"""`koordstream bench basic` runs the real core end to end and writes the documented keys
(a small run: speed is reported by the benchmark, never asserted in tests)."""

from __future__ import annotations

import json
from pathlib import Path

from cli.main import main

KEYS = {"nodes", "pods", "throughput_pods_per_s", "attempt_latency_ms", "nodes_evaluated_per_pod",
        "plugin_share", "peak_memory_mib"}


def test_bench_basic_writes_every_key(tmp_path: Path) -> None:
    out = tmp_path / "basic.json"
    assert main(["bench", "basic", "--nodes", "50", "--init-pods", "20", "--pods", "200", "--runs", "1",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result) >= KEYS and result["pods"] == 200 and result["pods_placed"] == 200
    assert set(result["attempt_latency_ms"]) == {"p50", "p90", "p99"}
    assert result["nodes_evaluated_per_pod"] == 50
    assert "NodeResourcesFit" in result["plugin_share"]


def test_bench_identical_compares_with_one_by_one(tmp_path: Path) -> None:
    out = tmp_path / "identical.json"
    assert main(["bench", "basic", "--nodes", "50", "--init-pods", "20", "--pods", "300", "--identical",
                 "--runs", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert KEYS | {"one_by_one_pods_per_s", "speedup"} <= set(result)
    assert result["one_by_one_pods_placed"] == 300


def test_bench_takes_a_profiles_file(tmp_path: Path) -> None:
    out = tmp_path / "kube.json"
    profiles = Path(__file__).resolve().parents[2] / "perf" / "profiles" / "kube-default.yaml"
    assert main(["bench", "basic", "--nodes", "30", "--init-pods", "10", "--pods", "100", "--runs", "1",
                 "--profiles", str(profiles), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["profile"] == "from --profiles" and "DeviceShare" not in result["plugin_share"]
