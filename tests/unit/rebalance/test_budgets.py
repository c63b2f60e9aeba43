"""PodDisruptionBudgets on every eviction path of the rebalancer service, counted as the
Eviction API counts them (issue 28, item 4): healthy = Running on a node that exists, not
evicted already; pending pods are expected and unhealthy; disruptionsAllowed = healthy -
desiredHealthy; each eviction of a batch takes one away. The three sequences of the issue,
through the service's real paths (scale-down EvictDirectly, FragmentationAware moves and
their evictions)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agents.rebalance import config
from agents.rebalance.arbitration import ArbitrationArgs, Arbitrator, Budget
from agents.rebalance.rebalancer import Rebalancer
from agents.rebalance.selectors import LabelSelector
from agents.rebalance.service import RebalancerService
from schemas.records import (
    Binding,
    EvictionCommand,
    MigrationJob,
    Node,
    NodeDeleted,
    Pod,
    PodDisruptionBudget,
    Record,
    ScaleDownEvent,
)
from tests.builders import make_node
from tests.unit.rebalance.conftest import NOW, replica
from tests.unit.rebalance.test_service import MOVES, available, service

EVICT_DIRECTLY = ("profiles: [{name: p, plugins: {balance: {enabled: [ScaleDownBinPack]}}, "
                  "pluginConfig: [{name: ScaleDownBinPack, args: {strategy: EvictDirectly, maxPodsToEvict: 5}}]}]")


def bound(pods: list[Pod]) -> list[Record]:
    """The pods as the service reads them: the Pod without its node, then its Binding."""
    return [*[replace(p, node_name="") for p in pods],
            *[Binding(uid=p.uid, namespace=p.namespace, name=p.name, node=p.node_name, attempt=0, decision_key=p.uid)
              for p in pods if p.node_name]]


def web(count: int, node_count: int = 5) -> tuple[RebalancerService, list[float], list[Node], list[Pod]]:
    now = [NOW]
    svc = RebalancerService(Rebalancer(config.load(EVICT_DIRECTLY)), lambda: now[0], leading=True)
    node_list = [make_node(f"n{i}", cpu=8000) for i in range(node_count)]
    pods = [replica(f"w{i}", f"n{i % node_count}", labels={"app": "web"}) for i in range(count)]
    svc.on_records([*node_list, *bound(pods)])
    return svc, now, node_list, pods


def pdb(min_available: str = "", max_unavailable: str = "", selector: dict[str, object] | None = None
        ) -> PodDisruptionBudget:
    return PodDisruptionBudget(uid="default/web", name="web", selector={"matchLabels": {"app": "web"}}
                               if selector is None else selector, min_available=min_available,
                               max_unavailable=max_unavailable)


def evictions(svc: RebalancerService, now: list[float], rounds: int = 10) -> list[str]:
    sent: list[str] = []
    for _ in range(rounds):
        sent += [o.record.uid for o in svc.actuate(now[0]) if isinstance(o.record, EvictionCommand)]
        now[0] += 0.1  # one token per round
    return sent


def test_a_scale_down_evicting_directly_keeps_min_available() -> None:
    """5 Running, minAvailable 4, EvictDirectly scale-down by 3: one eviction, 4 healthy left
    (EvictDirectly ignored every budget: 3 evictions, 2 healthy left). The other victims wait
    for their budget until their ttl."""
    svc, now, _, _ = web(5)
    svc.on_records([pdb(min_available="4")])
    _, problems = svc.scale_down(ScaleDownEvent(workload="ReplicaSet/web", replicas=3), now[0])
    assert not problems and len(svc.jobs) == 3
    assert len(evictions(svc, now)) == 1
    svc.tick(now[0] + 301)
    assert not svc.jobs  # the two refused ones end at their ttl, nothing evicted


def test_each_eviction_of_a_batch_takes_one_away() -> None:
    """A burst that lets several evictions out in one `actuate`: minAvailable 3 of 5 lets two."""
    svc, now, _, _ = web(5)
    svc.bucket = replace(svc.bucket, burst=5)
    svc.on_records([pdb(min_available="3")])
    svc.scale_down(ScaleDownEvent(workload="ReplicaSet/web", replicas=5), now[0])
    sent = [o.record.uid for o in svc.actuate(now[0]) if isinstance(o.record, EvictionCommand)]
    assert len(sent) == 2 and evictions(svc, now) == []


def test_a_pending_replica_is_expected_and_not_healthy() -> None:
    """3 Running + 1 Pending, maxUnavailable 1: expected 4, desired 3, healthy 3, so no
    disruption is allowed (the pending pod was not counted: one more eviction went)."""
    svc, now, _, _ = web(3)
    svc.on_records([pdb(max_unavailable="1"), replace(replica("w3", ""), labels={"app": "web"}, phase="Pending")])
    svc.scale_down(ScaleDownEvent(workload="ReplicaSet/web", replicas=1), now[0])
    assert len(svc.jobs) == 1 and evictions(svc, now) == []


def test_pods_bound_to_a_deleted_node_are_not_healthy() -> None:
    """5 Running, 2 of them on node n4, which is deleted; minAvailable 3: healthy 3, desired
    3, nothing may go (the two on n4 counted as healthy: the eviction went)."""
    svc, now, _, _ = web(3, node_count=3)
    svc.on_records([make_node("n4", cpu=8000),
                    *bound([replica(f"x{i}", "n4", labels={"app": "web"}) for i in range(2)])])
    svc.on_records([NodeDeleted(name="n4"), pdb(min_available="3")])
    svc.scale_down(ScaleDownEvent(workload="ReplicaSet/web", replicas=1), now[0])
    assert svc.jobs and evictions(svc, now) == []
    svc.on_records([pdb(min_available="2")])  # 3 healthy, 2 desired: one may go
    assert len(evictions(svc, now)) == 1


def lopsided_with_budget(*extra: Record, max_unavailable: str = "1") -> tuple[RebalancerService, list[float]]:
    svc, now = service(MOVES)
    svc.on_records([*extra, pdb(max_unavailable=max_unavailable, selector={})])  # every pod of the namespace
    return svc, now


def test_moves_count_pending_pods_and_pods_on_deleted_nodes() -> None:
    """FragmentationAware over the lopsided cluster (12 pods), one budget over every pod with
    maxUnavailable 1: one move is planned. A pending pod, or a pod on a node since deleted,
    makes 13 expected and 12 healthy: none is."""
    svc, now = lopsided_with_budget()
    assert len([o for o in svc.cycle(now[0]) if isinstance(o.record, MigrationJob)]) == 1
    pending, _ = lopsided_with_budget(replica("p0", "", phase="Pending"))
    assert [o for o in pending.cycle(now[0]) if isinstance(o.record, MigrationJob)] == []
    gone, _ = lopsided_with_budget(make_node("n9"), *bound([replica("p0", "n9")]), NodeDeleted(name="n9"))
    assert [o for o in gone.cycle(now[0]) if isinstance(o.record, MigrationJob)] == []


@pytest.mark.parametrize("later", ["pending", "node deleted"])
def test_a_planned_move_is_not_evicted_once_the_budget_is_spent(later: str) -> None:
    """13 pods, maxUnavailable 1: one move is planned. Then a pending pod arrives (14
    expected, 13 healthy), or the node of a covered pod (a single replica, never moved) goes
    (13 expected, 12 healthy): its eviction is refused when its reservation is Available."""
    svc, now = lopsided_with_budget(make_node("n9"), *bound([replica("p0", "n9", workload="solo")]))
    [job] = [o.record for o in svc.cycle(now[0]) if isinstance(o.record, MigrationJob)]
    svc.on_records([replica("p1", "", phase="Pending")] if later == "pending" else [NodeDeleted(name="n9")])
    svc.on_records([available(job)])
    assert evictions(svc, now, 3) == []


def test_an_unhealthy_pod_goes_only_while_the_budget_is_met() -> None:
    """The Eviction API's IfHealthyBudget: a pod that is not healthy may be evicted while
    healthy >= desired (no disruption taken), not when the budget is already broken."""
    pods = [replica(f"w{i}", f"n{i}", labels={"app": "web"}) for i in range(4)]
    pods[3] = replace(pods[3], phase="Pending")
    budget = Budget("default", "web", LabelSelector({"app": "web"}), min_available=3)
    a = Arbitrator.over(ArbitrationArgs(max_unavailable_per_workload="50%"), pods, [budget])
    assert a.budget_refusal(pods[3]) == "" and a.budget_refusal(pods[0]) != ""
    broken = Budget("default", "web", LabelSelector({"app": "web"}), min_available=4)
    a = Arbitrator.over(ArbitrationArgs(), pods, [broken])
    assert a.budget_refusal(pods[3]) != ""


@pytest.mark.parametrize(("min_available", "max_unavailable", "expected", "desired"), [
    (None, "25%", 5, 3),  # 25% of 5 = 1.25, rounded up to 2 unavailable
    ("25%", None, 5, 2),  # 1.25 rounded up
    (None, 7, 5, 0),  # never below 0
    (3, None, 5, 3)])
def test_desired_healthy_rounds_percentages_up(min_available: object, max_unavailable: object, expected: int,
                                               desired: int) -> None:
    b = Budget("default", "web", LabelSelector({}), min_available, max_unavailable)  # type: ignore[arg-type]
    assert b.desired(expected) == desired
