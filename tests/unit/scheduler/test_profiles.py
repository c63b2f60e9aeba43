"""Profiles from YAML: defaults, enabling and disabling per extension point, weights, plugin
args, and errors that name the profile, the plugin and the field."""

from __future__ import annotations

import pytest

from agents.scheduler.framework.profiles import ProfileError, default_config, load
from agents.scheduler.plugins.noderesources.fit import MOST_ALLOCATED


def names(plugins: tuple[object, ...]) -> list[str]:
    return [p.NAME for p in plugins]  # type: ignore[attr-defined]


def test_default_profile_has_kube_schedulers_defaults() -> None:
    [p] = default_config().profiles
    assert p.name == "default-scheduler" and p.percentage_of_nodes_to_score == 0  # adaptive
    assert names(p.filter) == ["NodeUnschedulable", "NodeAffinity", "TaintToleration", "NodeResourcesFit", "DeviceShare",
                               "NodeNUMAResource"]
    assert names(p.reserve) == ["DeviceShare", "ElasticQuota", "NodeNUMAResource", "Reservation"]
    assert [(s.NAME, w) for s, w in p.score] == [("NodeAffinity", 2), ("TaintToleration", 3), ("NodeResourcesFit", 1),
                                                 ("NodeResourcesBalancedAllocation", 1), ("Reservation", 1000)]
    assert names(p.post_filter) == ["DefaultPreemption"] and names(p.bind) == ["DefaultBinder"]


def test_disable_enable_weights_and_args() -> None:
    config = load("""
percentageOfNodesToScore: 50
profiles:
  - schedulerName: default-scheduler
  - schedulerName: packer
    percentageOfNodesToScore: 100
    plugins:
      score:
        disabled: [{name: "*"}]
        enabled: [{name: NodeResourcesFit, weight: 5}]
      postFilter:
        disabled: [{name: DefaultPreemption}]
    pluginConfig:
      - name: NodeResourcesFit
        args: {scoringStrategy: {type: MostAllocated, resources: [{name: cpu, weight: 2}]}}
""")
    default, packer = config.profiles
    assert default.percentage_of_nodes_to_score == 50 and packer.percentage_of_nodes_to_score == 100
    assert [(s.NAME, w) for s, w in packer.score] == [("NodeResourcesFit", 5)]
    assert packer.post_filter == ()
    fit = next(p for p in packer.filter if p.NAME == "NodeResourcesFit")
    assert fit is packer.score[0][0]  # one instance per profile, whatever the points
    assert fit.args.strategy == MOST_ALLOCATED and fit.args.resources[0].weight == 2  # type: ignore[attr-defined]
    assert fit is not next(p for p in default.filter if p.NAME == "NodeResourcesFit")


def test_multi_point_disable_removes_a_plugin_everywhere() -> None:
    [p] = load("""
profiles:
  - schedulerName: s
    plugins: {multiPoint: {disabled: [{name: TaintToleration}]}}
""").profiles
    assert "TaintToleration" not in names(p.filter) + [s.NAME for s, _ in p.score] + names(p.pre_score)


@pytest.mark.parametrize(("text", "profile", "plugin", "field"), [
    ("profiles: []", "", "", "profiles"),
    ("profiles: [{schedulerName: a}, {schedulerName: a}]", "a", "", "profiles[1].schedulerName"),
    ("profiles: [{schedulerName: a, colour: red}]", "a", "", "profiles[0].colour"),
    ("profiles: [{schedulerName: a, plugins: {score: {enabled: [{name: Magic}]}}}]", "a", "Magic",
     "profiles[0].plugins.score.enabled[0].name"),
    ("profiles: [{schedulerName: a, plugins: {score: {enabled: [{name: NodeUnschedulable}]}}}]", "a",
     "NodeUnschedulable", "profiles[0].plugins.score.enabled[0].name"),
    ("profiles: [{schedulerName: a, plugins: {score: {enabled: [{name: NodeResourcesFit, weight: 0}]}}}]", "a",
     "NodeResourcesFit", "profiles[0].plugins.score.enabled[0].weight"),
    ("profiles: [{schedulerName: a, plugins: {prescore: {}}}]", "a", "", "profiles[0].plugins.prescore"),
    ("profiles: [{schedulerName: a, pluginConfig: [{name: NodeResourcesFit, args: {scoringStrategy: "
     "{type: Random}}}]}]", "a", "NodeResourcesFit", "profiles[0].pluginConfig[0].args.scoringStrategy.type"),
    ("profiles: [{schedulerName: a, pluginConfig: [{name: DefaultPreemption, args: "
     "{minCandidateNodesPercentage: 140}}]}]", "a", "DefaultPreemption",
     "profiles[0].pluginConfig[0].args.minCandidateNodesPercentage"),
    ("profiles: [{schedulerName: a, pluginConfig: [{name: NodeAffinity, args: {addedAffinity: "
     "{requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: []}}}}]}]", "a", "NodeAffinity",
     "profiles[0].pluginConfig[0].args.addedAffinity"),
    ("profiles: [{schedulerName: a, plugins: {bind: {disabled: [{name: '*'}]}}}]", "a", "",
     "profiles[0].plugins.bind"),
    ("profiles: [{schedulerName: a, percentageOfNodesToScore: 101}]", "a", "", "profiles[0].percentageOfNodesToScore"),
    ("profiles: [{schedulerName: a, plugins: {multiPoint: {disabled: [{name: DefaultPreemption}]}}, "
     "pluginConfig: [{name: DefaultPreemption, args: {}}]}]", "a", "DefaultPreemption", "profiles[0].pluginConfig"),
], ids=["no-profiles", "duplicate-name", "unknown-profile-field", "unknown-plugin", "wrong-point", "weight",
        "unknown-point", "fit-args", "preemption-args", "affinity-args", "no-binder", "percentage",
        "config-for-disabled"])
def test_invalid_config_names_profile_plugin_and_field(text: str, profile: str, plugin: str, field: str) -> None:
    with pytest.raises(ProfileError) as err:
        load(text)
    assert (err.value.profile, err.value.plugin, err.value.field) == (profile, plugin, field)
    assert field in str(err.value)
