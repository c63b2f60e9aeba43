"""The rebalancer's args: defaults as Koordinator's, and every bad value refused with its field."""

from __future__ import annotations

from typing import Any

import pytest

from agents.rebalance.arbitration import ArbitrationArgs
from agents.rebalance.binpack import BinPackArgs
from agents.rebalance.evictor import EvictorArgs
from agents.rebalance.fragmentation import FragmentationArgs
from agents.scheduler.plugins.args import ArgsError


def test_defaults_are_koordinators() -> None:
    f = FragmentationArgs.from_mapping({})
    assert (f.mode, f.resources, f.imbalance_threshold, f.min_improvement_threshold, f.node_fit) == (
        "global", ("cpu", "memory"), 0.15, 0.02, True)
    b = BinPackArgs.from_mapping({})
    assert (b.strategy, b.max_pods_to_evict, b.resources) == ("CalculateOnly", 0, ("cpu", "memory"))
    a = ArbitrationArgs.from_mapping({})
    assert (a.max_migrating_per_node, a.eviction_qps, a.eviction_burst) == (2, 10.0, 1)


def test_accepted_values() -> None:
    f = FragmentationArgs.from_mapping({
        "mode": "koordinator", "resources": ["cpu", "memory", "nvidia.com/gpu"], "imbalanceThreshold": 0.3,
        "nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
        "evictableNamespaces": {"exclude": ["kube-system"]}, "minPodAge": "90s", "moveInterval": "1h30m",
        "podSelectors": [{"name": "web", "selector": {"matchLabels": {"app": "web"}}}]})
    assert f.min_pod_age_s == 90 and f.move_interval_s == 5400
    assert f.node_selector is not None and f.node_selector.matches({"pool": "a"}) and not f.node_selector.matches({})
    assert not f.evictable_namespaces.allows("kube-system") and f.evictable_namespaces.allows("default")
    assert f.pod_selectors.admits({"app": "web"}) and not f.pod_selectors.admits({"app": "db"})
    b = BinPackArgs.from_mapping({"strategy": "EvictDirectly", "maxPodsToEvict": 5, "resourceWeights": {"cpu": 2}})
    assert b.resource_weights == {"cpu": 2.0}
    assert EvictorArgs.from_mapping({"priorityThreshold": {"value": 100}}).priority_threshold == 100


BAD: list[tuple[str, type, dict[str, Any], str]] = [
    ("unknown arg", FragmentationArgs, {"imbalanceThreshhold": 0.2}, "imbalanceThreshhold"),
    ("threshold above range", FragmentationArgs, {"imbalanceThreshold": 1.5}, "imbalanceThreshold"),
    ("threshold negative", FragmentationArgs, {"minImprovementThreshold": -0.1}, "minImprovementThreshold"),
    ("threshold nan", FragmentationArgs, {"imbalanceThreshold": float("nan")}, "imbalanceThreshold"),
    ("threshold a string", FragmentationArgs, {"imbalanceThreshold": "0.2"}, "imbalanceThreshold"),
    ("unknown mode", FragmentationArgs, {"mode": "greedy"}, "mode"),
    ("empty resources", FragmentationArgs, {"resources": []}, "resources"),
    ("repeated resource", FragmentationArgs, {"resources": ["cpu", "cpu"]}, "resources"),
    ("bad operator", FragmentationArgs,
     {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["b"]}]}},
     "nodeSelector.matchExpressions[0].operator"),
    ("In without values", FragmentationArgs,
     {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}, "nodeSelector.matchExpressions[0].values"),
    ("Exists with values", FragmentationArgs,
     {"podSelectors": [{"selector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}}]},
     "podSelectors[0].selector.matchExpressions[0].values"),
    ("include and exclude", FragmentationArgs, {"evictableNamespaces": {"include": ["a"], "exclude": ["b"]}},
     "evictableNamespaces"),
    ("bad duration", FragmentationArgs, {"minPodAge": "5 minutes"}, "minPodAge"),
    ("flag not a bool", FragmentationArgs, {"dryRun": "yes"}, "dryRun"),
    ("zero weight", BinPackArgs, {"resourceWeights": {"cpu": 0}}, "resourceWeights.cpu"),
    ("infinite weight", BinPackArgs, {"resourceWeights": {"memory": float("inf")}}, "resourceWeights.memory"),
    ("weight a string", BinPackArgs, {"resourceWeights": {"cpu": "1"}}, "resourceWeights.cpu"),
    ("EvictDirectly without a limit", BinPackArgs, {"strategy": "EvictDirectly"}, "maxPodsToEvict"),
    ("unknown strategy", BinPackArgs, {"strategy": "Evict"}, "strategy"),
    ("per node zero", ArbitrationArgs, {"maxMigratingPerNode": 0}, "maxMigratingPerNode"),
    ("percent above 100", ArbitrationArgs, {"maxUnavailablePerWorkload": "150%"}, "maxUnavailablePerWorkload"),
    ("not a percent", ArbitrationArgs, {"maxMigratingPerWorkload": "10"}, "maxMigratingPerWorkload"),
    ("rate zero", ArbitrationArgs, {"evictionQPS": 0}, "evictionQPS"),
    ("unknown evictor flag", EvictorArgs, {"evictBarePods": True}, "evictBarePods"),
    ("bad QoS class", EvictorArgs, {"protectedQoSClasses": ["GOLD"]}, "protectedQoSClasses"),
]


@pytest.mark.parametrize(("kind", "raw", "field"), [(k, r, f) for _, k, r, f in BAD], ids=[b[0] for b in BAD])
def test_bad_args_name_the_field(kind: Any, raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ArgsError) as err:
        kind.from_mapping(raw)
    assert err.value.field == field
    assert field in str(err.value)
