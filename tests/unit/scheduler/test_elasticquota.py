"""ElasticQuota: config validation, runtime quota (min, borrowing by shared weight, max, the
tree), admission, and preemption only inside a quota."""

from __future__ import annotations

from typing import Any

import pytest

from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.scheduler.framework.profiles import load
from agents.scheduler.plugins.args import ArgsError
from agents.scheduler.plugins.elasticquota import ElasticQuota, ElasticQuotaArgs
from agents.state.resources import ResourceSpace
from schemas.records import BoundPod, Claim, EvictionCommand, Pod, ResourceList, SchedulingFeedback
from tests.builders import make_node

QUOTA = "quota.scheduling.koordinator.sh/name"


def quotas(*items: dict[str, Any]) -> ElasticQuota:
    args = ElasticQuotaArgs.from_mapping({"quotas": list(items)})
    args.validate()
    return ElasticQuota(args)


@pytest.mark.parametrize(("items", "field"), [
    ([{"name": "a", "min": {"cpu": "4"}, "max": {"cpu": "2"}}], "quotas[0].min.cpu"),
    ([{"name": "a", "parent": "nobody"}], "quotas[0].parent"),
    ([{"name": "a"}, {"name": "a"}], "quotas[0].name"),
    ([{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}], "quotas[0].parent"),
    ([{"name": "a", "max": {"cpu": "lots"}}], "quotas[0].max.cpu"),
    ([{"name": "a", "colour": "red"}], "quotas[0].colour"),
], ids=["min-over-max", "unknown-parent", "duplicate", "cycle", "bad-quantity", "unknown-field"])
def test_invalid_quotas_name_the_field(items: list[dict[str, Any]], field: str) -> None:
    with pytest.raises(ArgsError) as err:
        quotas(*items)
    assert err.value.field == field


def state_with(cpu: int, used: dict[str, int]) -> ClusterState:
    space = ResourceSpace()
    state = ClusterState.from_records(space, [make_node("n", cpu=cpu, memory=2**40, pods=1000)])
    for i, (name, amount) in enumerate(used.items()):
        state.add_bound(BoundPod(uid=f"u{i}", requests=ResourceList(cpu=amount, pods=1), quota=name), "n")
    return state


@pytest.mark.parametrize(("used", "expected"), [
    ({"a": 10000, "b": 2000}, {"a": 10000, "b": 2000}),  # b leaves 2 of its min unused: a borrows
    ({"a": 10000, "b": 8000}, {"a": 6000, "b": 6000}),  # both want more: split the rest by weight
    ({"a": 3000, "b": 3000}, {"a": 3000, "b": 3000}),  # under min: what they use
], ids=["borrow", "share", "under-min"])
def test_runtime_quota(used: dict[str, int], expected: dict[str, int]) -> None:
    plugin = quotas({"name": "a", "min": {"cpu": "4"}, "max": {"cpu": "10"}},
                    {"name": "b", "min": {"cpu": "4"}, "max": {"cpu": "10"}})
    state = state_with(12000, used)
    runtime, _ = plugin.runtime(state, {})
    cpu = state.space.index["cpu"]
    assert {name: int(v[cpu]) for name, v in runtime.items()} == expected


CONFIG = """
profiles:
  - schedulerName: default-scheduler
    pluginConfig:
      - name: ElasticQuota
        args:
          quotas:
            - {name: team, max: {cpu: "3"}}
            - {name: a, parent: team, max: {cpu: "2"}}
            - {name: b, parent: team, min: {cpu: "1"}}
"""


def pod(uid: str, quota: str, cpu: int = 1000, priority: int = 0) -> Pod:
    return Pod(uid=uid, name=uid, labels={QUOTA: quota} if quota else {}, priority=priority,
               requests=ResourceList(cpu=cpu))


def test_admission_along_the_tree_and_final_feedback_for_an_unknown_quota() -> None:
    space = ResourceSpace()
    state = ClusterState.from_records(space, [make_node("n", cpu=16000)])
    core = SchedulerCore(space, state, lambda: 0.0, config=load(CONFIG))
    outputs = []
    for p in (pod("a1", "a"), pod("a2", "a"), pod("a3", "a"), pod("b1", "b"), pod("b2", "b"), pod("free", ""),
              pod("x", "nope")):
        outputs += core.add(p)
    outputs += core.schedule()
    bound = sorted(o.record.uid for o in outputs if isinstance(o.record, Claim))
    assert bound == ["a1", "a2", "b1", "free"]  # a stops at its max of 2; team at 3 stops b2
    feedback = {o.record.uid: o.record for o in outputs if isinstance(o.record, SchedulingFeedback)}
    assert "quota 'a' exceeded: cpu" in feedback["a3"].message and not feedback["a3"].final
    assert "quota 'team' exceeded: cpu" in feedback["b2"].message
    assert feedback["x"].final and "no such quota" in feedback["x"].message


def test_preemption_stays_inside_the_quota() -> None:
    config = """
profiles:
  - schedulerName: default-scheduler
    pluginConfig:
      - name: ElasticQuota
        args: {quotas: [{name: a}, {name: b}]}
"""
    space = ResourceSpace()
    state = ClusterState.from_records(space, [make_node("n", cpu=2000)], {"n": [
        BoundPod(uid="other", name="other", priority=1, requests=ResourceList(cpu=1000, pods=1), quota="b"),
        BoundPod(uid="mine", name="mine", priority=1, requests=ResourceList(cpu=1000, pods=1), quota="a")]})
    core = SchedulerCore(space, state, lambda: 0.0, config=load(config))
    core.add(pod("boss", "a", cpu=1000, priority=100))
    core.add(pod("boss2", "a", cpu=2000, priority=100))
    evicted = {o.record.uid for o in core.schedule() if isinstance(o.record, EvictionCommand)}
    assert evicted == {"mine"}  # never the pod of quota b, though that would make room too
