"""Allocation over time and fragmentation at the end, on a hand-checked cluster."""

from __future__ import annotations

from agents.state.devices import GPU_CORE
from perf.figures import allocation


def test_allocation_follows_bindings_and_terminations() -> None:
    capacity = {"a": {"cpu": 4000, "memory": 8}, "b": {"cpu": 4000, "memory": 8}}
    requests = {"p1": {"cpu": 2000, "memory": 2}, "p2": {"cpu": 2000, "memory": 2}, "p3": {"cpu": 3000, "memory": 1}}
    bound = {"p1": (100.2, "a"), "p2": (101.5, "a"), "p3": (102.1, "b")}
    out = allocation(capacity, requests, bound, [(103.7, "p1")], t0=100.0)
    assert out["allocation_series_pct"]["cpu"] == [25.0, 50.0, 87.5, 62.5]  # p1 ends during second 3
    assert out["allocation_pct"]["cpu_peak"] == 87.5 and out["allocation_pct"]["cpu_final"] == 62.5
    assert "gpu" not in out["allocation_series_pct"]  # no GPUs in this cluster
    # Free at the end: a 2000m, b 1000m; the largest request is 3000m, so all free CPU is stranded.
    assert out["fragmentation_pct"]["cpu"] == 100.0


def test_fragmentation_counts_only_free_capacity_the_largest_pod_cannot_use() -> None:
    capacity = {"a": {"cpu": 8000, GPU_CORE: 800}, "b": {"cpu": 8000, GPU_CORE: 800}, "c": {"cpu": 8000}}
    requests = {"g": {"cpu": 1000, GPU_CORE: 350}, "h": {"cpu": 1000, GPU_CORE: 200}}
    out = allocation(capacity, requests, {"g": (0.5, "a"), "h": (0.5, "b")}, [], t0=0.0)
    # GPU free: a 450 (fits 350), b 600: nothing stranded. c has no GPUs and is left out.
    assert out["fragmentation_pct"]["gpu"] == 0.0
    assert out["allocation_pct"]["gpu_final"] == round(550 * 100 / 1600, 2)
    # CPU: every node has at least 7000m free against a largest request of 1000m.
    assert out["fragmentation_pct"]["cpu"] == 0.0


def test_an_empty_run_has_no_allocation() -> None:
    out = allocation({"a": {"cpu": 1000}}, {}, {}, [], t0=0.0)
    assert out["allocation_pct"] == {"cpu_peak": 0.0, "cpu_final": 0.0}
    assert out["fragmentation_pct"] == {}
