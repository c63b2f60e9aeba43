"""Nodes through the lifecycle's Node stages: a node registers not ready (Ready False, the
not-ready taint), node-initialize makes it Ready and the harness publishes it without the
taint; a heartbeat that changes nothing is not published again."""

from __future__ import annotations

from typing import Any, cast

from perf.kwok import Lifecycle, load_stages
from perf.run import NOT_READY, _LifecycleLoop, not_ready
from schemas.records import Node, NodeCondition, ResourceList, Taint
from tests.unit.test_scenario import ROOT


def test_node_initialize_makes_a_registered_node_ready_and_untainted() -> None:
    stages = load_stages([ROOT / "infra/kwok/node-initialize.yaml", ROOT / "infra/kwok/node-heartbeat.yaml"])
    life = Lifecycle(stages, seed=1)
    dedicated = Taint("dedicated", "gpu", "NoSchedule")
    node = not_ready(Node(name="n1", allocatable=ResourceList(cpu=1000), taints=(dedicated,)))
    assert node.taints == (dedicated, NOT_READY) and node.conditions == (NodeCondition("Ready", "False"),)
    loop = _LifecycleLoop(cast(Any, None), cast(Any, None), life, {}, [node], t0=0.0)
    [t] = life.due(0.0)
    assert (t.kind, t.stage) == ("Node", "node-initialize")
    [ready] = loop._node_changed("n1")
    assert isinstance(ready, Node) and ready.taints == (dedicated,)
    assert NodeCondition("Ready", "True") in ready.conditions
    beats = life.due(60.0)  # heartbeats renew Ready: nothing the scheduler reads changed
    assert beats and {b.stage for b in beats} == {"node-heartbeat"} and loop._node_changed("n1") == []
