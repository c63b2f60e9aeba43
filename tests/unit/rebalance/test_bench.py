"""`koordstream bench rebalance` at a small size: both planners from the same start, the
rankers from the same start, and the JSON the command writes."""

from __future__ import annotations

from itertools import pairwise

from perf.rebalance_bench import ImbalanceWorkload, ScaleDownWorkload, run


def test_small_bench_compares_the_planners_and_rankers() -> None:
    result = run(ImbalanceWorkload(nodes=20, max_cycles=30), ScaleDownWorkload(nodes=20, replicas=100, db_pods=8))
    planners = result["imbalance"]["planners"]
    for p in planners.values():
        assert p["std_sum_after"] < p["std_sum_before"] and p["evictions"] > 0
        steps = p["by_cycle"]
        assert all(a["std_sum"] >= b["std_sum"] and a["evictions"] < b["evictions"] for a, b in pairwise(steps))
    assert planners["global"]["std_sum_after"] <= planners["koordinator"]["std_sum_after"]
    rankers = result["scale_down"]["rankers"]
    assert {r["evictions"] for r in rankers.values()} == {50}
    assert rankers["koordstream"]["empty_nodes"] >= max(rankers["kubernetes"]["empty_nodes"],
                                                        rankers["koordinator"]["empty_nodes"])
    assert set(result["imbalance"]["goals"]) == {"global_cuts_std_sum_in_half", "global_reaches_koordinator_cut",
                                                 "with_no_more_evictions"}
