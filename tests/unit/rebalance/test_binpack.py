"""ScaleDownBinPack's rankers: table-driven cases, and as a property that ours empties at least
as many nodes as Kubernetes' default ranking and Koordinator's, from the same start."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.rebalance import binpack
from agents.rebalance.binpack import PROTECTED_COST, BinPackArgs, plan_scale_down
from agents.rebalance.view import ClusterView
from schemas.records import OwnerReference, Pod
from tests.unit.rebalance.conftest import NOW, nodes, replica

WEB = "default/ReplicaSet/web"


def spread() -> tuple[list[Any], list[Pod]]:
    """web: 1 pod alone on n0, 2 alone on n1, 3 on n2 beside another workload's pod, 2 on n3."""
    layout = {"n0": 1, "n1": 2, "n2": 3, "n3": 2}
    pods = [replica(f"{n}-{k}", n, creation_timestamp=float(k)) for n, c in layout.items() for k in range(c)]
    pods.append(replica("db-0", "n2", workload="db"))
    return nodes(4), pods


@pytest.mark.parametrize(("ranker", "empty", "victims"), [
    ("koordstream", 2, {"n0-0", "n1-0", "n1-1"}),
    ("kubernetes", 0, {"n2-2", "n2-1", "n2-0"}),
])
def test_rankers_pick_different_victims(ranker: str, empty: int, victims: set[str]) -> None:
    node_list, pods = spread()
    p = plan_scale_down(ClusterView.build(node_list, pods), WEB, 3, BinPackArgs(), now=NOW, ranker=ranker)
    assert set(p.victims) == victims
    assert (p.empty_nodes_before, p.empty_nodes_after) == (0, empty)
    assert sorted(p.costs.values()) == list(range(8))
    assert [p.costs[u] for u in p.order] == list(range(8))


def test_cheapest_nodes_are_taken_whole() -> None:
    layout = {"n0": 3, "n1": 1, "n2": 1, "n3": 1}
    pods = [replica(f"{n}-{k}", n) for n, c in layout.items() for k in range(c)]
    p = plan_scale_down(ClusterView.build(nodes(4), pods), WEB, 3, BinPackArgs(), now=NOW)
    assert set(p.victims) == {"n1-0", "n2-0", "n3-0"} and p.empty_nodes_after == 3


def test_koordinator_ranker_drains_where_the_workload_dominates() -> None:
    node_list, pods = spread()
    p = plan_scale_down(ClusterView.build(node_list, pods), WEB, 3, BinPackArgs(ranker="koordinator"), now=NOW)
    # n0, n1, n3 hold only web (score 0): lowest row first, larger then newer pods within.
    assert p.order[:3] == ("n0-0", "n1-1", "n1-0")


def test_protected_pods_never_go_and_cost_most() -> None:
    node_list, pods = spread()
    pods[0] = replica("n0-0", "n0", labels={"koordinator.sh/qosClass": "LSE"})
    p = plan_scale_down(ClusterView.build(node_list, pods), WEB, 8, BinPackArgs(), now=NOW)
    assert "n0-0" not in p.victims and p.costs["n0-0"] == PROTECTED_COST
    assert p.protected == {"n0-0": "protected QoS class"} and len(p.victims) == 7


def test_evict_directly_stops_at_its_limit() -> None:
    node_list, pods = spread()
    args = BinPackArgs.from_mapping({"strategy": "EvictDirectly", "maxPodsToEvict": 2})
    p = plan_scale_down(ClusterView.build(node_list, pods), WEB, 5, args, now=NOW)
    assert len(p.victims) == 2 and len(p.order) == 8


def test_a_scale_down_removes_at_least_one_pod() -> None:
    node_list, pods = spread()
    with pytest.raises(ValueError, match="replicas=0"):
        plan_scale_down(ClusterView.build(node_list, pods), WEB, 0, BinPackArgs(), now=NOW)


def test_daemonset_pods_do_not_block_a_drain() -> None:
    node_list, pods = spread()
    daemon = (OwnerReference(kind="DaemonSet", name="agent", uid="ds", controller=True),)
    pods += [replica(f"agent-{n.name}", n.name, owner_references=daemon) for n in node_list]
    p = plan_scale_down(ClusterView.build(node_list, pods), WEB, 3, BinPackArgs(), now=NOW)
    assert p.empty_nodes_after == 2


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Any], list[Pod], int]:
    count = draw(st.integers(1, 10))
    node_list = nodes(count, cpu=64000, memory=256 * 2**30)
    pods = []
    for k in range(draw(st.integers(1, 40))):
        node = f"n{draw(st.integers(0, count - 1))}"
        workload = draw(st.sampled_from(["web", "web", "web", "db"]))
        labels = {"koordinator.sh/qosClass": "LSE"} if draw(st.integers(0, 9)) == 0 else {}
        pods.append(replica(f"p{k}", node, workload=workload, cpu=draw(st.sampled_from([500, 1000, 2000])),
                            labels=labels, creation_timestamp=float(draw(st.integers(0, 100)))))
    return node_list, pods, draw(st.integers(1, 40))


@settings(max_examples=200, deadline=None)
@given(workloads())
def test_ours_empties_at_least_as_many_nodes(case: tuple[list[Any], list[Pod], int]) -> None:
    node_list, pods, remove = case
    view = ClusterView.build(node_list, pods)
    plans = {r: plan_scale_down(view, WEB, remove, BinPackArgs(), now=NOW, ranker=r) for r in binpack.RANKERS}
    movable = {u for u, c in plans["koordstream"].costs.items() if c != PROTECTED_COST}
    for p in plans.values():
        assert set(p.victims) <= movable and len(p.victims) == min(remove, len(movable))
        assert set(p.order) == movable
    ours = plans["koordstream"].empty_nodes_after
    assert ours >= plans["kubernetes"].empty_nodes_after
    assert ours >= plans["koordinator"].empty_nodes_after
