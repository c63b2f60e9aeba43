"""TaintToleration, NodeUnschedulable, NodeAffinity (nodeSelector and node affinity) and
PrioritySort, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from agents.scheduler.framework.status import Code
from agents.scheduler.plugins.nodeaffinity import (
    AffinityError,
    NodeAffinity,
    NodeAffinityArgs,
    parse,
)
from agents.scheduler.plugins.nodeunschedulable import NodeUnschedulable
from agents.scheduler.plugins.prioritysort import PrioritySort
from agents.scheduler.plugins.tainttoleration import TaintToleration, tolerates_one
from schemas.records import Taint, Toleration
from tests.builders import make_node, make_pod
from tests.unit.scheduler.conftest import info, prepared, run_filter, run_score, state_of

NO_SCHEDULE = Taint("dedicated", "gpu", "NoSchedule")


@pytest.mark.parametrize(("toleration", "taint", "expected"), [
    (Toleration("dedicated", "Equal", "gpu", "NoSchedule"), NO_SCHEDULE, True),
    (Toleration("dedicated", "Equal", "cpu", "NoSchedule"), NO_SCHEDULE, False),
    (Toleration("dedicated", "Exists", "", ""), NO_SCHEDULE, True),
    (Toleration("", "Exists", "", ""), NO_SCHEDULE, True),
    (Toleration("dedicated", "Equal", "gpu", "NoExecute"), NO_SCHEDULE, False),
    (Toleration("other", "Exists", "", "NoSchedule"), NO_SCHEDULE, False),
    (Toleration("dedicated", "Gt", "gpu", ""), NO_SCHEDULE, False),
], ids=["equal", "wrong-value", "exists", "wildcard", "wrong-effect", "wrong-key", "bad-operator"])
def test_toleration_matching(toleration: Toleration, taint: Taint, expected: bool) -> None:
    assert tolerates_one(toleration, taint) is expected


def test_taint_filter_and_prefer_no_schedule_score() -> None:
    state = state_of(
        make_node("plain"),
        make_node("tainted", taints=(NO_SCHEDULE,)),
        make_node("soft", taints=(Taint("spot", "true", "PreferNoSchedule"),)),
        make_node("softer", taints=(Taint("spot", "true", "PreferNoSchedule"), Taint("old", "1", "PreferNoSchedule"))),
    )
    pod = make_pod("p")
    assert run_filter(TaintToleration(), pod, state) == [True, False, True, True]
    assert run_score(TaintToleration(), pod, state) == [100, 100, 50, 0]  # reverse-normalized counts 0, 0, 1, 2
    tolerant = make_pod("q", tolerations=(Toleration("", "Exists"),))
    assert run_filter(TaintToleration(), tolerant, state) == [True, True, True, True]
    assert run_score(TaintToleration(), tolerant, state) is None  # nothing to prefer: skipped


def test_node_unschedulable() -> None:
    state = state_of(make_node("a"), make_node("b", unschedulable=True))
    assert run_filter(NodeUnschedulable(), make_pod("p"), state) == [True, False]
    tolerant = make_pod("q", tolerations=(Toleration("node.kubernetes.io/unschedulable", "Exists", "", "NoSchedule"),))
    assert run_filter(NodeUnschedulable(), tolerant, state) == [True, True]


NODES = [
    make_node("a", labels={"zone": "z1", "gpu": "a100", "cores": "64"}),
    make_node("b", labels={"zone": "z2", "cores": "16"}),
    make_node("c", labels={"zone": "z3"}),
]


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)} if values else {"key": key, "operator": op}


def required(*terms: list[dict[str, Any]], fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    built = [{"matchExpressions": t} for t in terms]
    if fields:
        built.append({"matchFields": fields})
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": built}}}


@pytest.mark.parametrize(("selector", "affinity", "expected"), [
    ({}, {}, [True, True, True]),
    ({"zone": "z1"}, {}, [True, False, False]),
    ({}, required([expr("zone", "In", "z1", "z2")]), [True, True, False]),
    ({}, required([expr("zone", "NotIn", "z1")]), [False, True, True]),
    ({}, required([expr("gpu", "Exists")]), [True, False, False]),
    ({}, required([expr("gpu", "DoesNotExist")]), [False, True, True]),
    ({}, required([expr("cores", "Gt", "32")]), [True, False, False]),
    ({}, required([expr("cores", "Lt", "32")]), [False, True, False]),
    ({}, required([expr("zone", "In", "z1")], [expr("zone", "In", "z3")]), [True, False, True]),
    ({}, required([expr("zone", "In", "z1"), expr("gpu", "DoesNotExist")]), [False, False, False]),
    ({}, required(fields=[expr("metadata.name", "In", "b")]), [False, True, False]),
    ({"zone": "z2"}, required([expr("cores", "Exists")]), [False, True, False]),
], ids=["none", "selector", "in", "notin-missing-matches", "exists", "doesnotexist", "gt", "lt",
        "terms-are-ored", "expressions-are-anded", "match-fields", "selector-and-affinity"])
def test_node_affinity_filter(selector: dict[str, str], affinity: dict[str, Any], expected: list[bool]) -> None:
    assert run_filter(NodeAffinity(), make_pod("p", node_selector=selector, affinity=affinity), state_of(*NODES)) == expected


def test_node_affinity_preferred_score_is_normalized() -> None:
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [expr("zone", "In", "z1")]}},
        {"weight": 30, "preference": {"matchExpressions": [expr("cores", "Exists")]}},
    ]}}
    assert run_score(NodeAffinity(), make_pod("p", affinity=affinity), state_of(*NODES)) == [100, 75, 0]
    assert run_score(NodeAffinity(), make_pod("p"), state_of(*NODES)) is None


def test_added_affinity_applies_to_every_pod() -> None:
    plugin = NodeAffinity(NodeAffinityArgs(added_affinity=required([expr("zone", "In", "z2")])["nodeAffinity"]))
    assert run_filter(plugin, make_pod("p"), state_of(*NODES)) == [False, True, False]


@pytest.mark.parametrize(("affinity", "field"), [
    (required([expr("zone", "Near", "z1")]), ".matchExpressions[0].operator"),
    (required([expr("zone", "In")]), ".matchExpressions[0].values"),
    (required([expr("zone", "Exists", "z1")]), ".matchExpressions[0].values"),
    (required([expr("cores", "Gt", "many")]), ".matchExpressions[0].values"),
    (required(fields=[expr("metadata.uid", "In", "x")]), ".matchFields[0].key"),
    ({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}, ".nodeSelectorTerms"),
    ({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {}}]}},
     "preferredDuringSchedulingIgnoredDuringExecution[0].weight"),
    ({"nodeAffinity": "zone=z1"}, "affinity.nodeAffinity"),
], ids=["operator", "in-without-values", "exists-with-values", "gt-not-integer", "match-fields-key", "no-terms",
        "weight", "not-an-object"])
def test_malformed_affinity_is_unresolvable_and_names_the_field(affinity: dict[str, Any], field: str) -> None:
    with pytest.raises(AffinityError) as err:
        parse({}, affinity)
    assert field in err.value.field
    pod = info(make_pod("p", affinity=affinity))
    state = state_of(*NODES)
    status = NodeAffinity().pre_filter(prepared(NodeAffinity(), pod, state), pod, state)
    assert status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE and field in status.message()


def test_priority_sort_orders_by_priority_then_arrival_with_gangs_together() -> None:
    pods = [info(make_pod(f"p{i}", priority=prio)) for i, prio in enumerate([0, 10, 10, 5, 10])]
    for i, p in enumerate(pods):
        p.arrival = i
    pods[4].group_arrival = 1  # p4 belongs to p1's gang
    assert [p.uid for p in sorted(pods, key=PrioritySort().sort_key)] == ["p1", "p4", "p2", "p3", "p0"]
