"""The rebalancer through the real broker and workers (`perf.rebalance_run`): a worker with only
the rebalancer role leads, ranks a scale-down so that the controller drains a whole node, and
evens out a lopsided cluster by ReservationFirst moves, each replacement bound into its
reservation, with no replica lost and no workload below its allowed unavailability; nothing
bound twice, no node over-committed. A killed leader's successor resumes its jobs."""

from __future__ import annotations

import asyncio

import pytest

from perf.rebalance_run import MoveRunConfig, run_moves, succeeded
from streams.settings import load_settings


@pytest.mark.parametrize(("broker", "kill_leader"), [
    ("tansu", False),
    pytest.param("kafka", True, marks=pytest.mark.e2e),  # about 80 s: in `make e2e`
])
def test_a_lopsided_cluster_is_evened_out_by_reservation_first_moves(broker: str, kill_leader: bool) -> None:
    """On Apache Kafka two rebalancer workers run and the leader is killed (-9) once the first
    moves began: the other takes over, and the jobs in flight end as they would have."""
    cfg = MoveRunConfig(broker=broker, rebalancers=2 if kill_leader else 1, kill_leader=kill_leader)
    r = asyncio.run(run_moves(cfg, load_settings(env={})))
    assert succeeded(r), r
    assert r["pods_double_bound"] == 0 and r["nodes_overcommitted"] == 0, r
    sd = r["scale_down"]
    assert sd["ranked"] and sd["removed"] == 3, r
    assert sd["empty_nodes_after"] >= max(1, sd["empty_nodes_kubernetes"]), r  # one node's three pods went
    assert r["settled"] and r["migrations_succeeded"] >= 2, r
    assert set(r["migrations"]) == {"Succeeded: replacement bound into the reservation"}, r
    assert r["evictions"] == r["migrations_succeeded"] and not r["evictions_refused"], r
    assert r["after"]["std_sum"] <= r["before"]["std_sum"] / 2, r
    assert r["availability_gap"] == 0 and r["jobs_unfinished"] == 0, r
    assert bool(r["failover"]) == kill_leader, r
    assert all(ready == desired for ready, desired in r["availability"].values()), r  # no replica lost
