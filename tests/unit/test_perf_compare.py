"""`koordstream perf compare` flags a regression beyond the baseline's thresholds (exit 1),
passes otherwise (exit 0); `perf run` refuses a bad scenario before anything starts (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from perf.run import compare

BASE: dict[str, Any] = {"scenario": "basic", "throughput_pods_per_s": 1000.0, "queue_latency_ms": {"p99": 400.0},
                        "wall_s": 10.0, "thresholds": {"throughput_drop_pct": 10, "queue_p99_rise_pct": 25}}


@pytest.mark.parametrize(("throughput", "p99", "code"), [
    (950.0, 450.0, 0),    # within 10% and 25%
    (850.0, 400.0, 1),    # throughput down 15%
    (1000.0, 520.0, 1),   # p99 up 30%
])
def test_compare_exits_non_zero_on_a_regression(tmp_path: Path, throughput: float, p99: float, code: int) -> None:
    base, new = tmp_path / "base.json", tmp_path / "new.json"
    base.write_text(json.dumps(BASE))
    new.write_text(json.dumps({**BASE, "throughput_pods_per_s": throughput, "queue_latency_ms": {"p99": p99}}))
    assert main(["perf", "compare", str(base), str(new)]) == code


def test_run_refuses_a_bad_scenario_before_starting(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nnodes: [{pool: a, count: 1, allocatable: {cpu: '1', memory: 1Gi}, colour: red}]\n"
                   "pods: {total: 1, mix: [{name: x, requests: {cpu: 100m}}]}\n")
    assert main(["perf", "run", str(bad)]) == 2


@pytest.mark.parametrize("args", [["basic", "--kwok", "--floor"], ["basic", "--pods", "20000"],
                                  ["basic", "--rate", "-5"]], ids=["floor-with-kwok", "more-pods-than-it-has", "no-rate"])
def test_run_refuses_what_it_cannot_run_before_starting(args: list[str]) -> None:
    assert main(["perf", "run", *args]) == 2


BASELINES = sorted((Path(__file__).parents[2] / "perf" / "baselines").glob("*.json"))


@pytest.mark.parametrize("path", BASELINES, ids=[p.stem for p in BASELINES])
def test_every_shipped_baseline_is_a_consistent_run_of_its_scenario(path: Path) -> None:
    result = json.loads(path.read_text())
    assert result["scenario"] == path.stem and (path.parents[1] / "scenarios" / f"{path.stem}.yaml").exists()
    assert result["pods_double_bound"] == result["nodes_overcommitted"] == 0
    rows, regressed = compare(result, result)
    assert not regressed and rows[0][0] == "throughput_pods_per_s"


KWOK_BASELINES = sorted((Path(__file__).parents[2] / "perf" / "baselines" / "kwok").glob("*.json"))


@pytest.mark.parametrize("path", KWOK_BASELINES, ids=[p.stem for p in KWOK_BASELINES])
def test_every_kwok_baseline_is_a_consistent_run_that_perf_compare_reads(path: Path) -> None:
    """perf/baselines/kwok: `<scenario>-<quick|pods>.json` from `perf run --kwok` (checked on
    the topics and against the API server), and `in-process-...` the same size in-process."""
    result = json.loads(path.read_text())
    stem = path.stem.removeprefix("in-process-")
    scenario, size = stem.rsplit("-", 1)
    assert (path.parents[2] / "scenarios" / f"{scenario}.yaml").exists() and (size == "quick" or size.isdigit())
    assert result["scenario"].startswith(scenario)
    assert result["pods_double_bound"] == result["nodes_overcommitted"] == 0
    if path.stem.startswith("in-process-"):
        assert "mode" not in result
    else:
        assert result["mode"] == "kwok" and result["pods_bound"] == result["pods_total"]
        assert result["bindings_disagreeing"] == result["nodes_overcommitted_apiserver"] == 0
        assert result["limit"]["limit"] and result["apiserver_requests_per_s"]["POST pods/binding"] > 0
    rows, regressed = compare(result, result)
    assert not regressed and rows[0][0] == "throughput_pods_per_s"


SANDBOX_BASELINES = sorted(p for p in (Path(__file__).parents[2] / "perf" / "baselines" / "sandbox").glob("*.json")
                           if json.loads(p.read_text()).get("claims_total") is not None)


@pytest.mark.parametrize("path", SANDBOX_BASELINES, ids=[p.stem for p in SANDBOX_BASELINES])
def test_every_warm_pool_baseline_is_a_safe_run_that_perf_compare_reads(path: Path) -> None:
    result = json.loads(path.read_text())
    assert path.stem.startswith(result["scenario"].split(" ")[0])  # (e.g. "sandbox-warm --kwok (quick)")
    assert result["sandboxes_double_adopted"] == result["pods_double_bound"] == result["nodes_overcommitted"] == 0
    assert result["claims_unanswered"] == 0
    rows, regressed = compare(result, result)
    assert not regressed and rows[0][0] == "claim_latency_ms.p99"
    assert {r[0] for r in rows} >= {f"phases.{name}.claim_latency_ms.p99" for name in result.get("phases") or {}}


WARM: dict[str, Any] = {"scenario": "sandbox-warm", "claims_total": 100, "warm_hit_rate": 1.0,
                        "claim_latency_ms": {"p99": 100.0}, "sandboxes_double_adopted": 0, "pods_double_bound": 0,
                        "nodes_overcommitted": 0, "claims_unanswered": 0,
                        "phases": {"warm-1000-per-s": {"warm_hit_rate": 1.0, "claim_latency_ms": {"p99": 100.0}}}}


@pytest.mark.parametrize(("change", "regressed"), [
    ({}, False),
    ({"claim_latency_ms": {"p99": 140.0}}, False),  # within 50%
    ({"claim_latency_ms": {"p99": 160.0}}, True),
    ({"phases": {"warm-1000-per-s": {"warm_hit_rate": 1.0, "claim_latency_ms": {"p99": 151.0}}}}, True),
    ({"phases": {"warm-1000-per-s": {"warm_hit_rate": 0.9, "claim_latency_ms": {"p99": 100.0}}}}, True),
    ({"phases": {}}, True),  # a phase missing
    ({"sandboxes_double_adopted": 1}, True),
    ({"claims_unanswered": 2}, True),
], ids=["same", "p99-within", "p99-up", "phase-p99-up", "phase-hits-down", "phase-missing", "double-adopted",
        "unanswered"])
def test_compare_flags_a_warm_pool_run_that_regressed(change: dict[str, Any], regressed: bool) -> None:
    assert compare(WARM, {**WARM, **change})[1] is regressed
