"""The quick chaos run on each broker (`make e2e`, after `make test` in CI): workers killed -9
under load (and Apache Kafka killed -9 and restarted on its log), then the independent check, with
two scheduler replicas sharing an elastic quota and a rebalancer evicting under PodDisruptionBudgets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("broker", ["kafka", "tansu"])
def test_quick_chaos_run_binds_every_pod_once_and_leaks_nothing(broker: str, tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    done = subprocess.run([sys.executable, "-m", "cli.main", "perf", "run", "chaos", "--broker", broker, "--quick",
                           "--seed", "11", "--run-dir", str(tmp_path / "run"), "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert out.exists(), f"no result (exit {done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}"
    r = json.loads(out.read_text())
    bad = {k: r[k] for k in ("pods_unschedulable", "pods_double_bound", "nodes_overcommitted", "devices_overcommitted",
                             "gangs_partial", "holds_leaked", "nominations_leaked", "quotas_overcommitted",
                             "pdb_violations") if r[k]}
    assert not bad, f"{bad}; examples: {r['examples']}; kills: {r['kill_log']}"
    assert r["pods_bound"] + r["pods_deleted_before_binding"] == r["pods_total"]
    # Two scheduler replicas admitted the quota's pods, and the rebalancer evicted budgeted pods.
    assert r["quota_pods"] > 0 and r["budgets"] > 0 and r["scale_downs_asked"] == r["budgets"]
    assert r["evictions_carried_out"] > 0
    assert r["kills"] >= 3 and r["broker_restarts"] == (1 if broker == "kafka" else 0)
    assert all(s is not None for s in r["recovery_s"]), f"a killed worker's partitions never decided again: {r}"
    assert done.returncode == 0
