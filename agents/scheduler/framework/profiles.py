"""Scheduler profiles from YAML, modeled on kube-scheduler's KubeSchedulerConfiguration.

    percentageOfNodesToScore: 0          # default: adaptive (kube-scheduler's); per profile too
    profiles:
      - schedulerName: default-scheduler
        plugins:
          multiPoint: {enabled: [{name: X, weight: 2}], disabled: [{name: Y}]}
          score:      {enabled: [...], disabled: [{name: "*"}]}
          # queueSort, preFilter, filter, postFilter, preScore, reserve, permit, bind alike
        pluginConfig:
          - name: NodeResourcesFit
            args: {scoringStrategy: {type: MostAllocated}}

As in kube-scheduler, every profile starts from the default plugins (`DEFAULT_PLUGINS`, each
enabled at every extension point it implements); `disabled` removes defaults (`"*"`: all of
them) at one point or, under `multiPoint`, at every point; `enabled` adds plugins after the
defaults. A plugin has one instance per profile, whatever the number of points it serves.
Score weights come from `score` or `multiPoint`, else the plugin's default weight.

Anything wrong is refused with a `ProfileError` that names the profile, the plugin and the
field, before any pod is scheduled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from agents.scheduler.framework import interface as api
from agents.scheduler.framework.registry import DEFAULT_PLUGINS, REGISTRY, args_from_mapping
from agents.scheduler.framework.runtime import ADAPTIVE, ProfilePlugins
from agents.scheduler.plugins.args import ArgsError
from agents.scheduler.plugins.elasticquota import ElasticQuota
from agents.state.quotas import QuotaSpec, QuotaTree
from schemas.records import DEFAULT_SCHEDULER

# Extension point (YAML name) -> the protocol a plugin must implement to be enabled there.
POINTS: dict[str, type] = {
    "queueSort": api.QueueSortPlugin,
    "preFilter": api.PreFilterPlugin,
    "filter": api.FilterPlugin,
    "postFilter": api.PostFilterPlugin,
    "preScore": api.PreScorePlugin,
    "score": api.ScorePlugin,
    "reserve": api.ReservePlugin,
    "permit": api.PermitPlugin,
    "bind": api.BindPlugin,
}
TOP_LEVEL = frozenset({"apiVersion", "kind", "percentageOfNodesToScore", "profiles"})
PROFILE_FIELDS = frozenset({"schedulerName", "plugins", "pluginConfig", "percentageOfNodesToScore"})


class ProfileError(ValueError):
    """An invalid scheduler configuration: which profile, which plugin, which field, why."""

    def __init__(self, profile: str, plugin: str, field: str, value: Any, reason: str) -> None:
        where = f"profile {profile!r}" + (f", plugin {plugin!r}" if plugin else "")
        super().__init__(f"{where}: {field}={value!r}: {reason}")
        self.profile, self.plugin, self.field, self.value = profile, plugin, field, value


@dataclass(frozen=True)
class SchedulerConfig:
    profiles: tuple[ProfilePlugins, ...]
    queue_sort: api.QueueSortPlugin  # the one every profile uses

    def by_name(self) -> dict[str, ProfilePlugins]:
        return {p.name: p for p in self.profiles}


def quota_tree(config: SchedulerConfig | None) -> QuotaTree:
    """The elastic quotas of every profile's ElasticQuota plugin (where it is enabled), for
    the deciders' quota ledgers (`agents.state.quotas`). Profiles that define the same quota
    differently are refused: the ledger would not know which max to keep."""
    specs: list[QuotaSpec] = []
    for profile in config.profiles if config is not None else ():
        for plugin in profile.all():
            if isinstance(plugin, ElasticQuota):
                specs += plugin.args.quotas
    return QuotaTree(specs)


def load(text: str) -> SchedulerConfig:
    """Parse YAML text (a KubeSchedulerConfiguration-like document)."""
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ProfileError("", "", "<document>", "", f"not valid YAML: {exc}") from exc
    return from_mapping(raw)


def default_config(scheduler_names: tuple[str, ...] = (DEFAULT_SCHEDULER,),
                   percentage_of_nodes_to_score: int = ADAPTIVE) -> SchedulerConfig:
    return from_mapping({"percentageOfNodesToScore": percentage_of_nodes_to_score,
                         "profiles": [{"schedulerName": name} for name in scheduler_names]})


def from_mapping(raw: Any) -> SchedulerConfig:
    if not isinstance(raw, Mapping):
        raise ProfileError("", "", "<document>", raw, "must be a mapping")
    for key in raw:
        if key not in TOP_LEVEL:
            raise ProfileError("", "", key, raw[key], "unknown field")
    pct = _percentage(raw.get("percentageOfNodesToScore", ADAPTIVE), "", "percentageOfNodesToScore")
    profiles = raw.get("profiles")
    if not isinstance(profiles, list) or not profiles:
        raise ProfileError("", "", "profiles", profiles, "must be a non-empty list")
    built: list[ProfilePlugins] = []
    sorts: list[api.QueueSortPlugin] = []
    for i, entry in enumerate(profiles):
        profile, sort = _profile(entry, i, pct)
        if profile.name in {p.name for p in built}:
            raise ProfileError(profile.name, "", f"profiles[{i}].schedulerName", profile.name, "is used by two profiles")
        if sorts and sort.NAME != sorts[0].NAME:
            raise ProfileError(profile.name, sort.NAME, f"profiles[{i}].plugins.queueSort", sort.NAME,
                               f"every profile must use the same queueSort plugin ({sorts[0].NAME})")
        built.append(profile)
        sorts.append(sort)
    return SchedulerConfig(tuple(built), sorts[0])


def _percentage(value: Any, profile: str, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 100:
        raise ProfileError(profile, "", field, value, "must be an integer from 0 (adaptive) to 100")
    return value


def _plugin_set(raw: Any, profile: str, field: str) -> tuple[list[tuple[str, int | None]], set[str]]:
    if raw is None:
        return [], set()
    if not isinstance(raw, Mapping):
        raise ProfileError(profile, "", field, raw, "must be a mapping with enabled and disabled")
    enabled: list[tuple[str, int | None]] = []
    for j, item in enumerate(raw.get("enabled") or []):
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or name not in REGISTRY:
            raise ProfileError(profile, str(name), f"{field}.enabled[{j}].name", name,
                               f"unknown plugin (known: {', '.join(sorted(REGISTRY))})")
        weight = item.get("weight")
        if weight is not None and (not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100):
            raise ProfileError(profile, name, f"{field}.enabled[{j}].weight", weight, "must be an integer from 1 to 100")
        enabled.append((name, weight))
    disabled: set[str] = set()
    for j, item in enumerate(raw.get("disabled") or []):
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or (name != "*" and name not in REGISTRY):
            raise ProfileError(profile, str(name), f"{field}.disabled[{j}].name", name, "unknown plugin")
        disabled.add(name)
    return enabled, disabled


def _profile(entry: Any, i: int, default_pct: int) -> tuple[ProfilePlugins, api.QueueSortPlugin]:
    if not isinstance(entry, Mapping):
        raise ProfileError("", "", f"profiles[{i}]", entry, "must be a mapping")
    name = entry.get("schedulerName", DEFAULT_SCHEDULER)
    if not isinstance(name, str) or not name:
        raise ProfileError(str(name), "", f"profiles[{i}].schedulerName", name, "must be a non-empty string")
    for key in entry:
        if key not in PROFILE_FIELDS:
            raise ProfileError(name, "", f"profiles[{i}].{key}", entry[key], "unknown field")
    pct = _percentage(entry.get("percentageOfNodesToScore", default_pct), name, f"profiles[{i}].percentageOfNodesToScore")
    plugins_raw = entry.get("plugins") or {}
    if not isinstance(plugins_raw, Mapping):
        raise ProfileError(name, "", f"profiles[{i}].plugins", plugins_raw, "must be a mapping")
    for key in plugins_raw:
        if key != "multiPoint" and key not in POINTS:
            raise ProfileError(name, "", f"profiles[{i}].plugins.{key}", plugins_raw[key],
                               f"unknown extension point (known: multiPoint, {', '.join(POINTS)})")

    # One instance per plugin, with its args from pluginConfig.
    configs: dict[str, Any] = {}
    for j, item in enumerate(entry.get("pluginConfig") or []):
        plugin = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(plugin, str) or plugin not in REGISTRY:
            raise ProfileError(name, str(plugin), f"profiles[{i}].pluginConfig[{j}].name", plugin, "unknown plugin")
        try:
            configs[plugin] = args_from_mapping(REGISTRY[plugin].args_type, item.get("args"))
        except (ArgsError, TypeError) as exc:
            field = f"profiles[{i}].pluginConfig[{j}].args" + (f".{exc.field}" if isinstance(exc, ArgsError) else "")
            value = exc.value if isinstance(exc, ArgsError) else item.get("args")
            reason = exc.reason if isinstance(exc, ArgsError) else str(exc)
            raise ProfileError(name, plugin, field, value, reason) from exc
    instances: dict[str, Any] = {}

    def instance(plugin: str) -> Any:
        if plugin not in instances:
            reg = REGISTRY[plugin]
            instances[plugin] = reg.factory(configs.get(plugin) or reg.args_type())
        return instances[plugin]

    multi_enabled, multi_disabled = _plugin_set(plugins_raw.get("multiPoint"), name, f"profiles[{i}].plugins.multiPoint")
    weights = {plugin: w for plugin, w in DEFAULT_PLUGINS}
    weights.update({plugin: w for plugin, w in multi_enabled if w is not None})
    points: dict[str, list[Any]] = {}
    for point, protocol in POINTS.items():
        field = f"profiles[{i}].plugins.{point}"
        enabled, disabled = _plugin_set(plugins_raw.get(point), name, field)
        disabled |= multi_disabled
        chosen: list[str] = []
        if "*" not in disabled:
            chosen = [p for p, _ in DEFAULT_PLUGINS if p not in disabled and isinstance(instance(p), protocol)]
        chosen += [p for p, _ in multi_enabled if p not in chosen and isinstance(instance(p), protocol)]
        for j, (plugin, weight) in enumerate(enabled):
            if not isinstance(instance(plugin), protocol):
                raise ProfileError(name, plugin, f"{field}.enabled[{j}].name", plugin,
                                   f"does not implement the {point} extension point")
            if weight is not None:
                weights[plugin] = weight
            if plugin not in chosen:
                chosen.append(plugin)
        points[point] = [instance(p) for p in chosen]
    if len(points["queueSort"]) != 1:
        raise ProfileError(name, "", f"profiles[{i}].plugins.queueSort", [p.NAME for p in points["queueSort"]],
                           "exactly one queueSort plugin must be enabled")
    if not points["bind"]:
        raise ProfileError(name, "", f"profiles[{i}].plugins.bind", [], "at least one bind plugin must be enabled")
    for plugin in configs:
        if plugin not in instances or not any(instances[plugin] in group for group in points.values()):
            raise ProfileError(name, plugin, f"profiles[{i}].pluginConfig", plugin,
                               "is configured but not enabled at any extension point")
    profile = ProfilePlugins(
        name=name,
        pre_filter=tuple(points["preFilter"]),
        filter=tuple(points["filter"]),
        post_filter=tuple(points["postFilter"]),
        pre_score=tuple(points["preScore"]),
        score=tuple((p, max(weights.get(p.NAME) or 1, 1)) for p in points["score"]),
        reserve=tuple(points["reserve"]),
        permit=tuple(points["permit"]),
        bind=tuple(points["bind"]),
        percentage_of_nodes_to_score=pct,
    )
    return profile, points["queueSort"][0]
