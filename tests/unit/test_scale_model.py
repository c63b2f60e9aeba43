"""`perf.scale`: a profiled run's CPU per pod split into what partitions and what every scheduler
replica pays, the best split of the cores, and the refusals; `perf.run.worker_roles` names a
run's processes."""

from __future__ import annotations

from typing import Any

import pytest

from perf.run import worker_roles
from perf.scale import Costs, ModelError, best, costs, model, rate


def a_run(**over: Any) -> dict[str, Any]:
    run = {"scenario": "s", "pods_total": 1000, "worker_cpu_s": {"state": 0.2, "scheduler": 0.1},
           "broker_cpu_s": 0.05,
           "profile": {"state": {"stages": {"owner apply": 50, "idle": 10}},
                       "scheduler": {"stages": {"cycle": 60, "reports": 30, "intake": 10, "idle": 20}}}}
    return {**run, **over}


def test_costs_split_the_scheduler_by_its_busy_samples() -> None:
    c = costs(a_run())
    assert c.state == pytest.approx(200.0) and c.broker == pytest.approx(50.0)
    assert c.scheduler_every == pytest.approx(30.0) and c.scheduler_own == pytest.approx(70.0)  # idle left out


def test_every_replica_pays_the_reports_so_replicas_reach_a_ceiling() -> None:
    c = Costs(state=100.0, scheduler_own=90.0, scheduler_every=10.0, broker=0.0)
    assert rate(c, 1, 100) == pytest.approx(1e6 / 100)
    assert rate(c, 9, 100) == pytest.approx(1e6 / 20)
    assert rate(c, 10**6, 10**6) == pytest.approx(1e5, rel=1e-3)  # 1e6 / scheduler_every
    assert rate(c, 100, 2) == pytest.approx(2e4)  # the state workers' cores


def test_the_best_split_keeps_each_role_within_the_partitions() -> None:
    c = Costs(state=100.0, scheduler_own=90.0, scheduler_every=10.0, broker=50.0)
    point = best(c, 8, 8)
    assert point.schedulers + point.state_workers == 8
    assert point.pods_per_s == max(round(rate(c, r, 8 - r), 1) for r in range(1, 8))
    assert point.broker_cores == pytest.approx(point.pods_per_s * 50 / 1e6, abs=0.01)
    assert best(c, 8, 4).schedulers == 4  # four partitions: four of each at most
    with pytest.raises(ModelError, match="cores=9, partitions=4"):
        best(c, 9, 4)


def test_a_run_without_a_profile_or_with_other_processes_is_refused_naming_what_is_missing() -> None:
    with pytest.raises(ModelError, match="profile"):
        costs(a_run(profile=None))
    with pytest.raises(ModelError, match="worker_cpu_s"):
        costs(a_run(worker_cpu_s={"state": 1.0, "state-2": 1.0, "scheduler": 1.0}))


def test_the_model_lists_a_point_per_core_count() -> None:
    out = model(a_run(), [2, 4])
    assert [p["cores"] for p in out["points"]] == [2, 4] and [p["partitions"] for p in out["points"]] == [2, 4]
    assert out["ceiling_pods_per_s"] == pytest.approx(1e6 / 30, rel=1e-3)


def test_worker_roles_follow_the_systems_order() -> None:
    assert worker_roles("split", (1, 1)) == ["state", "scheduler"]
    assert worker_roles("split", (2, 3)) == ["state", "state-2", "scheduler", "scheduler-2", "scheduler-3"]
    assert worker_roles("single", (2, 2)) == ["worker"]
