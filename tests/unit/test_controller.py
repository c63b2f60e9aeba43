"""The perf harness's ReplicaSet-like workloads and Eviction API: replicas kept, replacements
for pods that go, Kubernetes' deletion order (doubled-up and newer first, pod-deletion-cost
honoured), PodDisruptionBudgets answered with 429, availability measured from outside."""

from __future__ import annotations

import pytest

from agents.rebalance.arbitration import Budget
from agents.rebalance.binpack import Replica, kubernetes_order
from agents.rebalance.selectors import LabelSelector
from perf.controller import TOO_MANY_REQUESTS, Workloads
from tests.builders import make_pod

KEY = "default/ReplicaSet/web"


def web(replicas: int, budgets: tuple[Budget, ...] = ()) -> tuple[Workloads, list[str]]:
    w = Workloads(budgets)
    pods = w.add("default", "web", make_pod("t", cpu=500, labels={"app": "web"}), replicas, now=0.0)
    return w, [p.uid for p in pods]


def test_pods_are_made_from_the_template_and_replaced_when_they_go() -> None:
    w, uids = web(3)
    assert uids == ["web-000000", "web-000001", "web-000002"]
    pod = w.workloads[KEY].members[uids[0]].pod
    assert pod.owner_references[0].kind == "ReplicaSet" and pod.labels == {"app": "web"} and not pod.node_name
    [again] = w.gone(uids[0], now=5.0)
    assert again.uid == "web-000003" and again.creation_timestamp == 5.0
    assert w.gone(uids[0], now=6.0) == [] and len(w.workloads[KEY].members) == 3


@pytest.mark.parametrize(("replicas", "order"), [
    ([Replica("a", "n1"), Replica("b", "")], ["b", "a"]),  # unassigned first
    ([Replica("a", "n1"), Replica("b", "n1", phase="Pending")], ["b", "a"]),
    ([Replica("a", "n1"), Replica("b", "n2", ready=False)], ["b", "a"]),
    ([Replica("a", "n1", cost=5), Replica("b", "n2", cost=1)], ["b", "a"]),  # lower cost first
    ([Replica("a", "n1"), Replica("b", "n2"), Replica("c", "n2")], ["b", "c", "a"]),  # doubled up first
    ([Replica("a", "n1", creation=1.0), Replica("b", "n2", creation=2.0)], ["b", "a"]),  # newer first
    ([Replica("a", "n1", cost=-1), Replica("b", "n2"), Replica("c", "n2")], ["a", "b", "c"]),  # cost beats rank
], ids=["unassigned", "pending", "not ready", "cost", "rank", "newer", "cost over rank"])
def test_kubernetes_order(replicas: list[Replica], order: list[str]) -> None:
    assert [replicas[i].uid for i in kubernetes_order(replicas)] == order


def test_scale_down_honours_deletion_costs() -> None:
    w, uids = web(4)
    for i, uid in enumerate(uids):
        w.bound(uid, f"n{i % 2}")
        w.ready(uid, now=1.0)
    [newer] = w.gone(uids[0], now=5.0)
    w.bound(newer.uid, "n0")
    w.ready(newer.uid, now=6.0)
    deleted, created = w.scale(KEY, 2, now=7.0)
    assert created == [] and deleted == [newer.uid, "web-000001"]  # no costs: the newest, then by uid
    w, uids = web(4)
    for i, uid in enumerate(uids):
        w.bound(uid, f"n{i}")
        w.ready(uid, now=1.0)
    w.set_costs({uids[0]: 0, uids[1]: 1, uids[2]: 2, uids[3]: 3})
    assert w.scale(KEY, 2, now=2.0)[0] == [uids[0], uids[1]]
    assert w.availability() == {KEY: (2, 2)}
    assert w.scale(KEY, 3, now=3.0)[1][0].uid == "web-000004"


def test_eviction_api_refuses_what_a_budget_forbids() -> None:
    budget = Budget("default", "web", LabelSelector({"app": "web"}), min_available=2)
    w, uids = web(3, (budget,))
    for uid in uids:
        w.bound(uid, "n0")
    refused = w.evict(uids[0], now=1.0)  # nothing ready yet: 0 healthy
    assert not refused.allowed and refused.reason == TOO_MANY_REQUESTS
    for uid in uids:
        w.ready(uid, now=1.0)
    ok = w.evict(uids[0], now=2.0)
    assert ok.allowed and [p.uid for p in ok.replacements] == ["web-000003"]
    assert w.evict(uids[1], now=3.0).reason == TOO_MANY_REQUESTS  # the replacement is not ready yet
    assert w.availability() == {KEY: (2, 3)}
    assert not w.evict("nope", now=3.0).allowed
