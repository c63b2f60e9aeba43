"""The rebalancer through the real broker and workers (`perf.rebalance_run`): a worker with only
the rebalancer role leads, ranks a scale-down so that the controller drains a whole node, and
evens out a lopsided cluster by ReservationFirst moves, each replacement bound into its
reservation, with no replica lost and no workload below its allowed unavailability; nothing
bound twice, no node over-committed."""

from __future__ import annotations

import asyncio

import pytest

from perf.rebalance_run import MoveRunConfig, run_moves, succeeded
from streams.settings import load_settings


@pytest.mark.parametrize("broker", ["tansu", "kafka"])
def test_a_lopsided_cluster_is_evened_out_by_reservation_first_moves(broker: str) -> None:
    r = asyncio.run(run_moves(MoveRunConfig(broker=broker), load_settings(env={})))
    assert succeeded(r), r
    assert r["pods_double_bound"] == 0 and r["nodes_overcommitted"] == 0, r
    sd = r["scale_down"]
    assert sd["ranked"] and sd["removed"] == 3, r
    assert sd["empty_nodes_after"] >= max(1, sd["empty_nodes_kubernetes"]), r  # one node's three pods went
    assert r["settled"] and r["migrations_succeeded"] >= 2, r
    assert set(r["migrations"]) == {"Succeeded: replacement bound into the reservation"}, r
    assert r["evictions"] == r["migrations_succeeded"] and not r["evictions_refused"], r
    assert r["after"]["std_sum"] <= r["before"]["std_sum"] / 2, r
    assert r["availability_gap"] == 0, r
    assert all(ready == desired for ready, desired in r["availability"].values()), r  # no replica lost
