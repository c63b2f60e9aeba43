"""The rebalancer through the real broker and workers (`perf.rebalance_run`; the quick variants
of `perf.rebalance_scenarios` in `make e2e`): a worker with only
the rebalancer role leads, ranks a scale-down so that the controller drains a whole node, and
evens out a lopsided cluster by ReservationFirst moves, each replacement bound into its
reservation, with no replica lost and no workload below its allowed unavailability; nothing
bound twice, no node over-committed. A killed leader's successor resumes its jobs."""

from __future__ import annotations

import asyncio

import pytest

from agents.rebalance import migration as mg
from perf import rebalance_scenarios as rs
from perf.rebalance_run import MoveRunConfig, run_moves, succeeded
from streams.settings import load_settings


@pytest.mark.parametrize(("broker", "kill_leader"), [
    # In `make e2e`: about 25 s and 80 s; the quick planner and ranker runs below go through the
    # broker in `make test`.
    pytest.param("tansu", False, marks=pytest.mark.e2e),
    pytest.param("kafka", True, marks=pytest.mark.e2e),
])
def test_a_lopsided_cluster_is_evened_out_by_reservation_first_moves(broker: str, kill_leader: bool) -> None:
    """On Apache Kafka two rebalancer workers run and the leader is killed (-9) once the first
    moves began: the other takes over, and the jobs in flight end as they would have."""
    cfg = MoveRunConfig(broker=broker, rebalancers=2 if kill_leader else 1, kill_leader=kill_leader)
    assert cfg.moves_timeout_s > cfg.job_ttl_s + cfg.quiet_s  # a move may wait for its ttl: settled after it
    r = asyncio.run(run_moves(cfg, load_settings(env={})))
    assert succeeded(r), r
    assert r["pods_double_bound"] == 0 and r["nodes_overcommitted"] == 0, r
    sd = r["scale_down"]
    assert sd["ranked"] and sd["removed"] == 3, r
    assert sd["empty_nodes_after"] >= max(1, sd["empty_nodes_kubernetes"]), r  # one node's three pods went
    assert r["settled"] and r["migrations_succeeded"] >= 2, r
    # A replacement may be bound into another move of its workload's reservation: that move
    # ends Aborted (nothing evicted) and the one whose pod went waits for its own reservation
    # to be consumed, or for its ttl (migration.py: a job decides from its own reservation),
    # `job_ttl_s` here, so the moves settle within `moves_timeout_s` whenever that happens.
    # The reservation's ttl is the job's, from the same instant: which of the two the rebalancer
    # reads first (its own tick, or the owner's Expired event) names the end, TTL or EXPIRED.
    waited = {f"Aborted: {mg.TTL}", f"Aborted: {mg.EXPIRED}"}
    ends = {f"Succeeded: {mg.DONE}", f"Aborted: {mg.CONSUMED_EARLY}", *waited}
    assert set(r["migrations"]) <= ends and f"Succeeded: {mg.DONE}" in r["migrations"], r
    assert set(r["evicted_jobs_ended"]) <= {f"Succeeded: {mg.DONE}", *waited}, r
    assert r["evicted_jobs_ended"].get(f"Succeeded: {mg.DONE}", 0) == r["migrations_succeeded"], r
    assert not r["evictions_refused"], r
    # A new leader sends again an eviction it cannot see yet on `evictions`.
    assert r["evictions"] >= r["jobs_evicted"] if kill_leader else r["evictions"] == r["jobs_evicted"], r
    assert r["after"]["std_sum"] <= r["before"]["std_sum"] / 2, r
    assert r["availability_gap"] == 0 and r["jobs_unfinished"] == 0, r
    assert bool(r["failover"]) == kill_leader, r
    assert r["lowest_ready"]["rebalance/ReplicaSet/mem"] >= 8, r  # its PodDisruptionBudget: one of 9 down at most
    assert all(ready == desired for ready, desired in r["availability"].values()), r  # no replica lost


PLANNER_FIELDS = {"std_sum_before", "std_sum_after", "std_max_after", "stranded_pct_before", "stranded_pct_after",
                  "evictions", "migrations_succeeded", "migrations_aborted", "availability_gap"}


@pytest.mark.e2e
def test_the_quick_rebalance_imbalance_compares_the_planners_through_the_broker() -> None:
    r = asyncio.run(rs.run_imbalance(rs.ImbalanceRun.preset("tansu", quick=True), load_settings(env={})))
    assert r["pods_double_bound"] == 0 and r["nodes_overcommitted"] == 0, r
    assert set(r["planners"]) == {"koordinator", "global"}
    for p in r["planners"].values():
        assert set(p) >= PLANNER_FIELDS and p["finished"] and p["availability_gap"] == 0, p
        assert p["evictions"] >= p["migrations_succeeded"] > 0 and p["std_sum_after"] < p["std_sum_before"], p
    g = r["planners"]["global"]
    assert g["std_sum_after"] <= g["std_sum_before"] / 2, g


@pytest.mark.e2e
def test_the_quick_scale_down_binpack_compares_the_rankers_through_the_broker() -> None:
    r = asyncio.run(rs.run_scale_down(rs.ScaleDownRun.preset("tansu", quick=True), load_settings(env={})))
    assert r["pods_double_bound"] == 0 and r["nodes_overcommitted"] == 0, r
    assert set(r["rankers"]) == {"kubernetes", "koordinator", "koordstream"}
    assert all({"empty_nodes", "stranded_pct", "evictions"} <= set(x) and x["evictions"] == 50 and x["ranked"]
               for x in r["rankers"].values()), r
    ours, default = r["rankers"]["koordstream"]["empty_nodes"], r["rankers"]["kubernetes"]["empty_nodes"]
    assert ours >= max(1, 2 * default), r
