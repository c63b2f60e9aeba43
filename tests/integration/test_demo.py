"""`koordstream demo` end to end on its own embedded broker: the summary keys, the checker's
verdict, and the exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

KEYS = {"pods_total", "pods_bound", "pods_unschedulable", "pods_double_bound", "nodes_overcommitted",
        "throughput_pods_per_s", "queue_latency_ms", "startup_s", "wall_s"}


def test_small_demo_binds_every_pod_and_writes_the_summary(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    done = subprocess.run([sys.executable, "-m", "cli.main", "demo", "--nodes", "50", "--pods", "500",
                           "--rate", "1000", "--json", str(out)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert set(summary) >= KEYS
    assert summary["pods_total"] == summary["pods_bound"] == 500
    assert summary["pods_double_bound"] == summary["nodes_overcommitted"] == summary["pods_unschedulable"] == 0
    assert set(summary["queue_latency_ms"]) == {"p50", "p90", "p99"}
    assert summary["wall_s"] > 0 and summary["startup_s"] > 0
    assert "pods bound to two different nodes" in done.stdout
