"""The rebalancer's configuration: a YAML modeled on the descheduler's DeschedulerConfiguration
(v1alpha2), checked once on load; every error names the field and the value.

    deschedulingInterval: 60s            # how often a cycle runs
    maxNoOfPodsToEvictPerNode: 2         # per cycle, over every profile (optional)
    maxNoOfPodsToEvictPerNamespace: 10   # (optional)
    maxNoOfPodsToEvictTotal: 50          # (optional)
    profiles:
      - name: default
        plugins:
          balance: {enabled: [FragmentationAware, ScaleDownBinPack]}
        pluginConfig:
          - name: DefaultEvictor         # the DefaultEvictor protections (evictor.EvictorArgs)
            args: {evictLocalStoragePods: false}
          - name: MigrationController    # arbitration: Koordinator's limits, the eviction rate
            args: {maxMigratingPerNode: 2, evictionQPS: 10, evictionTTLMargin: 30s, defaultJobTTL: 5m}
          - name: FragmentationAware
            args: {mode: global, imbalanceThreshold: 0.15}
          - name: ScaleDownBinPack
            args: {strategy: CalculateOnly}

A plugin is enabled under `plugins.balance`; its args come from `pluginConfig` (defaults
otherwise). `DefaultEvictor` and `MigrationController` are always on. The global
`maxNoOfPodsToEvict...` limits tighten the arbitration's per-node, per-namespace and global
limits of every profile. No file: one profile with FragmentationAware (global) and
ScaleDownBinPack at their defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from agents.rebalance import binpack, fragmentation
from agents.rebalance.arbitration import ArbitrationArgs
from agents.rebalance.args import absent, duration_s, integer
from agents.rebalance.binpack import BinPackArgs
from agents.rebalance.evictor import EvictorArgs
from agents.rebalance.fragmentation import FragmentationArgs
from agents.scheduler.plugins.args import ArgsError, reject_unknown

EVICTOR = "DefaultEvictor"
MIGRATION = "MigrationController"
BALANCE_PLUGINS = (fragmentation.NAME, binpack.NAME)
ALWAYS_ON = (EVICTOR, MIGRATION)
TOP_LEVEL = {"apiVersion", "kind", "deschedulingInterval", "profiles", "maxNoOfPodsToEvictPerNode",
             "maxNoOfPodsToEvictPerNamespace", "maxNoOfPodsToEvictTotal"}


@dataclass(frozen=True)
class RebalanceProfile:
    name: str
    evictor: EvictorArgs = field(default_factory=EvictorArgs)
    arbitration: ArbitrationArgs = field(default_factory=ArbitrationArgs)
    fragmentation: FragmentationArgs | None = field(default_factory=FragmentationArgs)
    binpack: BinPackArgs | None = field(default_factory=BinPackArgs)


@dataclass(frozen=True)
class RebalancerConfig:
    interval_s: float = 60.0
    profiles: tuple[RebalanceProfile, ...] = (RebalanceProfile("default"),)


def load(text: str) -> RebalancerConfig:
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ArgsError("<document>", "", f"not valid YAML: {exc}") from exc
    return from_mapping(raw)


def _limit(raw: Mapping[str, Any], name: str) -> int | None:
    return integer(raw, name, "", None, 1)


def _tighter(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def from_mapping(raw: Any) -> RebalancerConfig:
    if not isinstance(raw, Mapping):
        raise ArgsError("<document>", raw, "must be a mapping")
    reject_unknown(raw, TOP_LEVEL)
    interval = duration_s(raw.get("deschedulingInterval", 60.0), "deschedulingInterval")
    if interval <= 0:
        raise ArgsError("deschedulingInterval", raw.get("deschedulingInterval"), "must be longer than 0")
    per_node, per_ns, total = (_limit(raw, n) for n in ("maxNoOfPodsToEvictPerNode", "maxNoOfPodsToEvictPerNamespace",
                                                        "maxNoOfPodsToEvictTotal"))
    entries = raw.get("profiles")
    if entries is None:
        entries = [{"name": "default", "plugins": {"balance": {"enabled": list(BALANCE_PLUGINS)}}}]
    if not isinstance(entries, list) or not entries:
        raise ArgsError("profiles", entries, "must be a non-empty list")
    profiles: list[RebalanceProfile] = []
    for i, entry in enumerate(entries):
        profile = _profile(entry, f"profiles[{i}].")
        if profile.name in {p.name for p in profiles}:
            raise ArgsError(f"profiles[{i}].name", profile.name, "is used by two profiles")
        a = profile.arbitration
        profiles.append(replace(profile, arbitration=replace(
            a, max_migrating_per_node=_tighter(a.max_migrating_per_node, per_node),
            max_migrating_per_namespace=_tighter(a.max_migrating_per_namespace, per_ns),
            max_migrating_globally=_tighter(a.max_migrating_globally, total))))
    return RebalancerConfig(interval, tuple(profiles))


def _profile(raw: Any, path: str) -> RebalanceProfile:
    if not isinstance(raw, Mapping):
        raise ArgsError(path.rstrip("."), raw, "must be {name, plugins, pluginConfig}")
    reject_unknown(raw, {"name", "plugins", "pluginConfig"}, path)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ArgsError(f"{path}name", name, "must be a non-empty string")
    enabled = _enabled(absent(raw.get("plugins"), {}), f"{path}plugins")
    args: dict[str, Mapping[str, Any]] = {}
    paths: dict[str, str] = {}  # plugin -> the path its args are reported under
    config = absent(raw.get("pluginConfig"), [])
    if not isinstance(config, list):
        raise ArgsError(f"{path}pluginConfig", config, "must be a list of {name, args}")
    for i, item in enumerate(config):
        where = f"{path}pluginConfig[{i}]"
        if not isinstance(item, Mapping):
            raise ArgsError(where, item, "must be {name, args}")
        reject_unknown(item, {"name", "args"}, f"{where}.")
        plugin = item.get("name")
        if plugin not in BALANCE_PLUGINS + ALWAYS_ON:
            raise ArgsError(f"{where}.name", plugin, f"unknown plugin (known: {', '.join(BALANCE_PLUGINS + ALWAYS_ON)})")
        if plugin in args:
            raise ArgsError(f"{where}.name", plugin, "configured twice")
        body = absent(item.get("args"), {})
        if not isinstance(body, Mapping):
            raise ArgsError(f"{where}.args", body, "must be a mapping")
        args[plugin] = body
        paths[plugin] = f"{where}.args."
    prefix = {p: paths.get(p, f"{path}pluginConfig.{p}.") for p in BALANCE_PLUGINS + ALWAYS_ON}
    return RebalanceProfile(
        name=name,
        evictor=EvictorArgs.from_mapping(args.get(EVICTOR, {}), prefix[EVICTOR]),
        arbitration=ArbitrationArgs.from_mapping(args.get(MIGRATION, {}), prefix[MIGRATION]),
        fragmentation=FragmentationArgs.from_mapping(args.get(fragmentation.NAME, {}), prefix[fragmentation.NAME])
        if fragmentation.NAME in enabled else None,
        binpack=BinPackArgs.from_mapping(args.get(binpack.NAME, {}), prefix[binpack.NAME])
        if binpack.NAME in enabled else None,
    )


def _enabled(raw: Any, path: str) -> set[str]:
    if not isinstance(raw, Mapping):
        raise ArgsError(path, raw, "must be {balance: {enabled: [...]}}")
    reject_unknown(raw, {"balance"}, f"{path}.")
    balance = absent(raw.get("balance"), {})
    if not isinstance(balance, Mapping):
        raise ArgsError(f"{path}.balance", balance, "must be {enabled: [...], disabled: [...]}")
    reject_unknown(balance, {"enabled", "disabled"}, f"{path}.balance.")
    out: set[str] = set()
    for key in ("enabled", "disabled"):
        items = absent(balance.get(key), [])
        if not isinstance(items, list):
            raise ArgsError(f"{path}.balance.{key}", items, "must be a list of plugin names")
        for j, item in enumerate(items):
            plugin = item.get("name") if isinstance(item, Mapping) else item
            if plugin not in BALANCE_PLUGINS:
                raise ArgsError(f"{path}.balance.{key}[{j}]", plugin,
                                f"unknown balance plugin (known: {', '.join(BALANCE_PLUGINS)})")
            if key == "enabled":
                out.add(plugin)
            else:
                out.discard(plugin)
    return out
