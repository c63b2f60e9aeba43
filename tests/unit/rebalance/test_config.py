"""The rebalancer's DeschedulerConfiguration-like YAML, one cycle over every profile, and
`koordstream rebalance plan` (a dry run over manifests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.rebalance import config
from agents.rebalance.rebalancer import Rebalancer, dry_run, from_manifests
from agents.scheduler.plugins.args import ArgsError
from cli.main import main
from schemas.records import ScaleDownEvent
from tests.unit.rebalance.conftest import NOW, nodes, replica

DATA = Path(__file__).parent / "data"

FULL = """
deschedulingInterval: 2m
maxNoOfPodsToEvictPerNode: 1
maxNoOfPodsToEvictTotal: 5
profiles:
  - name: main
    plugins:
      balance: {enabled: [FragmentationAware]}
    pluginConfig:
      - name: FragmentationAware
        args: {mode: koordinator, imbalanceThreshold: 0.2}
      - name: MigrationController
        args: {maxMigratingPerNode: 3, maxMigratingGlobally: 10, evictionTTLMargin: 45s, defaultJobTTL: 10m}
      - name: DefaultEvictor
        args: {evictLocalStoragePods: true}
"""


def test_defaults_and_a_full_file() -> None:
    default = config.from_mapping({})
    assert default.interval_s == 60 and [p.name for p in default.profiles] == ["default"]
    assert default.profiles[0].fragmentation is not None and default.profiles[0].binpack is not None
    c = config.load(FULL)
    [p] = c.profiles
    assert c.interval_s == 120 and p.binpack is None and p.fragmentation is not None
    assert p.fragmentation.mode == "koordinator" and p.fragmentation.imbalance_threshold == 0.2
    assert p.evictor.evict_local_storage_pods
    # The global per-cycle limits tighten the arbitration's.
    assert (p.arbitration.max_migrating_per_node, p.arbitration.max_migrating_globally) == (1, 5)
    assert p.arbitration.eviction_ttl_margin_s == 45 and default.profiles[0].arbitration.eviction_ttl_margin_s == 30
    assert p.arbitration.job_ttl_s == 600 and default.profiles[0].arbitration.job_ttl_s == 300


BAD: list[tuple[str, Any, str]] = [
    ("unknown top-level field", {"deschedulingIntervall": "1m"}, "deschedulingIntervall"),
    ("bad interval", {"deschedulingInterval": "soon"}, "deschedulingInterval"),
    ("zero limit", {"maxNoOfPodsToEvictTotal": 0}, "maxNoOfPodsToEvictTotal"),
    ("unknown plugin enabled", {"profiles": [{"name": "a", "plugins": {"balance": {"enabled": ["LowNodeLoad"]}}}]},
     "profiles[0].plugins.balance.enabled[0]"),
    ("unknown plugin configured", {"profiles": [{"name": "a", "pluginConfig": [{"name": "Foo"}]}]},
     "profiles[0].pluginConfig[0].name"),
    ("unknown arg", {"profiles": [{"name": "a", "plugins": {"balance": {"enabled": ["FragmentationAware"]}},
                                   "pluginConfig": [{"name": "FragmentationAware", "args": {"treshold": 1}}]}]},
     "profiles[0].pluginConfig[0].args.treshold"),
    ("threshold out of range", {"profiles": [{"name": "a", "plugins": {"balance": {"enabled": ["FragmentationAware"]}},
                                              "pluginConfig": [{"name": "FragmentationAware",
                                                                "args": {"imbalanceThreshold": 2}}]}]},
     "profiles[0].pluginConfig[0].args.imbalanceThreshold"),
    ("bad weight", {"profiles": [{"name": "a", "plugins": {"balance": {"enabled": ["ScaleDownBinPack"]}},
                                  "pluginConfig": [{"name": "DefaultEvictor"}, {"name": "ScaleDownBinPack",
                                                    "args": {"resourceWeights": {"cpu": -1}}}]}]},
     "profiles[0].pluginConfig[1].args.resourceWeights.cpu"),
    ("ttl margin not shorter than the ttl", {"profiles": [{"name": "a", "pluginConfig": [
        {"name": "MigrationController", "args": {"evictionTTLMargin": "5m"}}]}]},
     "profiles[0].pluginConfig[0].args.evictionTTLMargin"),
    ("ttl margin not a duration", {"profiles": [{"name": "a", "pluginConfig": [
        {"name": "MigrationController", "args": {"evictionTTLMargin": "soon"}}]}]},
     "profiles[0].pluginConfig[0].args.evictionTTLMargin"),
    ("job ttl not longer than the default margin", {"profiles": [{"name": "a", "pluginConfig": [
        {"name": "MigrationController", "args": {"defaultJobTTL": "20s"}}]}]},
     "profiles[0].pluginConfig[0].args.defaultJobTTL"),
    ("ttl margin not shorter than a job ttl set", {"profiles": [{"name": "a", "pluginConfig": [
        {"name": "MigrationController", "args": {"defaultJobTTL": "1m", "evictionTTLMargin": "1m"}}]}]},
     "profiles[0].pluginConfig[0].args.evictionTTLMargin"),
    ("job ttl zero", {"profiles": [{"name": "a", "pluginConfig": [
        {"name": "MigrationController", "args": {"defaultJobTTL": 0}}]}]},
     "profiles[0].pluginConfig[0].args.defaultJobTTL"),
    ("job ttl not a duration", {"profiles": [{"name": "a", "pluginConfig": [
        {"name": "MigrationController", "args": {"defaultJobTTL": "later"}}]}]},
     "profiles[0].pluginConfig[0].args.defaultJobTTL"),
    ("two profiles, one name", {"profiles": [{"name": "a"}, {"name": "a"}]}, "profiles[1].name"),
    ("profile without a name", {"profiles": [{}]}, "profiles[0].name"),
]


@pytest.mark.parametrize(("raw", "field"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config_names_the_field(raw: Any, field: str) -> None:
    with pytest.raises(ArgsError) as err:
        config.load(yaml.safe_dump(raw))
    assert err.value.field == field


def test_profiles_in_turn_do_not_plan_a_pod_twice() -> None:
    two = config.from_mapping({"profiles": [
        {"name": p, "plugins": {"balance": {"enabled": ["FragmentationAware"]}},
         "pluginConfig": [{"name": "FragmentationAware", "args": {"minPodAge": 0}},
                          {"name": "MigrationController", "args": {"maxUnavailablePerWorkload": 5,
                                                                   "maxMigratingPerNode": 6}}]}
        for p in ("first", "second")]})
    pods = [replica(f"c{n}{k}", f"n{n}", workload="cpu", cpu=2000) for n in (0, 1) for k in range(3)]
    pods += [replica(f"m{n}{k}", f"n{n}", workload="mem", cpu=250, memory=8 * 2**30) for n in (2, 3) for k in range(3)]
    plans = Rebalancer(two).cycle(nodes(4), pods, now=NOW)
    moved = [m.uid for p in plans for m in p.moves.moves]
    assert plans[0].moves.moves and len(moved) == len(set(moved))


def test_dry_run_over_manifests() -> None:
    nodes, pods, budgets = from_manifests((DATA / "lopsided.yaml").read_text())
    lines, result = dry_run(nodes, pods, budgets=budgets, now=NOW * 1e6,
                            scale_downs=[ScaleDownEvent(workload="ReplicaSet/cpu", namespace="default", replicas=2)])
    moves = result["profiles"]["default"]["moves"]  # type: ignore[index]
    assert moves["after"]["std_sum"] < moves["before"]["std_sum"] and moves["moves"]
    [down] = result["profiles"]["default"]["scale_downs"]  # type: ignore[index]
    assert down["victims"] == ["u0", "u1"] and down["costs"] == {"u0": 0, "u1": 1, "u2": 2}
    assert any("ScaleDownBinPack" in line for line in lines)
    # A PodDisruptionBudget in the manifests that allows no disruption: nothing moves.
    text = (DATA / "lopsided.yaml").read_text() + ("\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\n"
                                                   "metadata: {name: all}\nspec: {maxUnavailable: 0, selector: {}}\n")
    nodes, pods, budgets = from_manifests(text)
    _, held = dry_run(nodes, pods, budgets=budgets, now=NOW * 1e6)
    assert len(budgets) == 1 and not held["profiles"]["default"]["moves"]["moves"]  # type: ignore[index]


def test_the_command_prints_and_writes_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    cfg = tmp_path / "rebalancer.yaml"
    cfg.write_text(FULL)
    assert main(["rebalance", "plan", "--state", str(DATA / "lopsided.yaml"), "--rebalancer", str(cfg),
                 "--now", "2e9", "--json", str(out)]) == 0
    assert "FragmentationAware (koordinator)" in capsys.readouterr().out
    assert json.loads(out.read_text())["profiles"]["main"]["moves"]["mode"] == "koordinator"
    assert main(["rebalance", "plan", "--state", str(DATA / "lopsided.yaml"), "--scale-down", "default/nope=2"]) == 2
    assert main(["rebalance", "plan", "--state", str(DATA / "lopsided.yaml"), "--scale-down", "cpu=two"]) == 2
    cfg.write_text("profiles: [{name: a, pluginConfig: [{name: Foo}]}]")
    assert main(["rebalance", "plan", "--state", str(DATA / "lopsided.yaml"), "--rebalancer", str(cfg)]) == 2
