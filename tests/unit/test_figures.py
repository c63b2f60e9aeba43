"""Allocation over time, fragmentation at the end and the burst throughput, on hand-checked cases."""

from __future__ import annotations

import pytest

from agents.state.devices import GPU_CORE
from perf.figures import allocation, burst_throughput


def test_allocation_follows_bindings_and_terminations() -> None:
    capacity = {"a": {"cpu": 4000, "memory": 8}, "b": {"cpu": 4000, "memory": 8}}
    requests = {"p1": {"cpu": 2000, "memory": 2}, "p2": {"cpu": 2000, "memory": 2}, "p3": {"cpu": 3000, "memory": 1}}
    bound = {"p1": (100.2, "a"), "p2": (101.5, "a"), "p3": (102.1, "b")}
    out = allocation(capacity, requests, bound, [(103.7, "p1")], t0=100.0)
    assert out["allocation_series_pct"]["cpu"] == [25.0, 50.0, 87.5, 62.5]  # p1 ends during second 3
    assert out["allocation_pct"]["cpu_peak"] == 87.5 and out["allocation_pct"]["cpu_final"] == 62.5
    assert "gpu" not in out["allocation_series_pct"]  # no GPUs in this cluster
    # Free at the end: a 2000m, b 1000m. Pods of 2000m could use a only (b's 1000m of 3000m
    # stranded), the pod of 3000m neither: (1/3 + 1/3 + 1) / 3.
    assert out["fragmentation_pct"]["cpu"] == round((1 / 3 + 1 / 3 + 1) / 3 * 100, 2)


def test_fragmentation_counts_only_free_capacity_the_pods_cannot_use() -> None:
    capacity = {"a": {"cpu": 8000, GPU_CORE: 800}, "b": {"cpu": 8000, GPU_CORE: 800}, "c": {"cpu": 8000}}
    requests = {"g": {"cpu": 1000, GPU_CORE: 350}, "h": {"cpu": 1000, GPU_CORE: 200}}
    out = allocation(capacity, requests, {"g": (0.5, "a"), "h": (0.5, "b")}, [], t0=0.0)
    # GPU free: a 450, b 600: both fit 350 and 200, nothing stranded. c has no GPUs: left out.
    assert out["fragmentation_pct"]["gpu"] == 0.0
    assert out["allocation_pct"]["gpu_final"] == round(550 * 100 / 1600, 2)
    # CPU: every node has at least 7000m free against a largest request of 1000m.
    assert out["fragmentation_pct"]["cpu"] == 0.0


def test_an_empty_run_has_no_allocation() -> None:
    out = allocation({"a": {"cpu": 1000}}, {}, {}, [], t0=0.0)
    assert out["allocation_pct"] == {"cpu_peak": 0.0, "cpu_final": 0.0}
    assert out["fragmentation_pct"] == {}


def test_free_gpu_on_a_nearly_full_node_is_stranded() -> None:
    capacity = {"a": {GPU_CORE: 800}, "b": {GPU_CORE: 800}}
    requests = {"x": {GPU_CORE: 700}, "y": {GPU_CORE: 350}, "z": {GPU_CORE: 200}}
    out = allocation(capacity, requests, {"x": (0.0, "a")}, [], t0=0.0)
    # Free: a 100, b 800. Each of the three pods asks more than 100: a's 100 of 900 is stranded.
    assert out["fragmentation_pct"]["gpu"] == round(100 * 100 / 900, 2)


def _burst(prefix: str, n: int, offset: float, start: float, end: float) -> tuple[dict[str, float], ...]:
    pods = [f"{prefix}{i}" for i in range(n)]
    return ({p: offset for p in pods}, {p: start for p in pods}, {p: start + (end - start) * (i + 1) / n
                                                                  for i, p in enumerate(pods)})


def _merge(*parts: tuple[dict[str, float], ...]) -> tuple[dict[str, float], ...]:
    return tuple({k: v for part in parts for k, v in part[i].items()} for i in range(3))


@pytest.mark.parametrize(("parts", "expected"), [
    ([_burst("a", 100, 0.0, 10.0, 12.0)], 50.0),
    ([_burst("a", 100, 0.0, 10.0, 12.0), _burst("b", 100, 5.0, 15.0, 17.0)], 50.0),  # apart: 4 s busy
    ([_burst("a", 100, 0.0, 10.0, 12.0), _burst("b", 100, 1.0, 11.0, 14.0)], 50.0),  # overlapping: 4 s
    ([_burst("a", 99, 0.0, 10.0, 12.0)], None),  # too small to be a burst
    ([_burst("a", 100, 0.0, 10.0, 12.0), ({"late": 0.0}, {"late": 10.0}, {})], None),  # one never bound
], ids=["one", "two-apart", "overlapping", "too-small", "unfinished"])
def test_burst_throughput_over_the_time_some_burst_was_in_flight(parts: list[tuple[dict[str, float], ...]],
                                                                 expected: float | None) -> None:
    offsets, started, done = _merge(*parts)
    assert burst_throughput(offsets, started, done) == expected
