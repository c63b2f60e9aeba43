"""`koordstream bench trace` on the real Alibaba trace, shrunk: every policy runs, the JSON has
the documented keys, allocation is a percentage, and the method holds (no GPU allocated twice,
inflation up to the load). Figures are the benchmark's business, not asserted here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from perf.trace import POLICIES, Replay, load_nodes, load_pods, parse_seeds, typical_pods, workload

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "alibaba-gpu-2023"
NODES, PODS = DATA / "openb_node_list_gpu_node.csv", DATA / "openb_pod_list_default.csv"
pytestmark = pytest.mark.skipif(not NODES.exists(), reason="the Alibaba trace is not next to the repository")


def test_every_policy_writes_the_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    assert main(["bench", "trace", "--nodes-csv", str(NODES), "--pods-csv", str(PODS), "--load", "0.1",
                 "--seeds", "42", "--policy", "all", "--limit", "400", "--workers", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"nodes_csv", "pods_csv", "load", "results", "summary"} <= set(result)
    assert set(result["summary"]) == set(POLICIES) and len(result["results"]) == len(POLICIES)
    for r in result["results"]:
        assert {"policy", "seed", "gpu_allocation_pct", "pods_failed"} <= set(r)
        assert 0 <= r["gpu_allocation_pct"]["at_100"] <= r["gpu_allocation_pct"]["final"] <= 100


def test_the_replay_never_overcommits_a_gpu_and_inflates_to_the_load() -> None:
    cluster, pods = load_nodes(NODES), load_pods(PODS)[:300]
    capacity = int(cluster.gpu_count.sum()) * 1000
    order = workload(pods, capacity, 0.05, seed=1)
    assert sum(p.gpu_request for p in order) <= 0.05 * capacity
    replay = Replay(cluster, "FGD", typical_pods(pods, sorted(set(cluster.model))), seed=1)
    for p in order:
        replay.place(p)
    assert (replay.c.gpu_left >= -1).all() and (replay.c.cpu >= 0).all() and (replay.c.memory >= 0).all()
    assert ((replay.c.gpu_left >= 0) | (replay.c.gpu_left == -1)).all()


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--seeds"):
        parse_seeds("")
    assert main(["bench", "trace", "--nodes-csv", str(NODES), "--pods-csv", str(PODS), "--policy", "Tetris",
                 "--seeds", "1"]) == 2
    broken = tmp_path / "nodes.csv"
    broken.write_text("sn,cpu\nx,1\n")
    assert main(["bench", "trace", "--nodes-csv", str(broken), "--pods-csv", str(PODS), "--seeds", "1"]) == 2
