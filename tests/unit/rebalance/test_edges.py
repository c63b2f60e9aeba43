"""Edges an adversarial review found (2026-12-03), pinned: device claims, several profiles and
migrations in flight, duplicate uids, resources the args do not name, foreign schedulers,
replicas already down, finished pods, and configuration values that were accepted wrongly."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import yaml

from agents.rebalance import arbitration as arb
from agents.rebalance import config, evictor
from agents.rebalance.arbitration import ArbitrationArgs
from agents.rebalance.fragmentation import FragmentationArgs, plan_moves
from agents.rebalance.rebalancer import Rebalancer
from agents.rebalance.simulate import DEVICES, NO_PROFILE
from agents.rebalance.view import ClusterView
from agents.scheduler.plugins.args import ArgsError
from schemas.records import GpuDevice, OwnerReference, ResourceList
from tests.builders import GI, make_node
from tests.unit.rebalance.conftest import NOW, planning, replica
from tests.unit.rebalance.test_fragmentation import lopsided, plan

TWO_PROFILES = """
profiles:
  - name: a
    plugins: {balance: {enabled: [FragmentationAware]}}
    pluginConfig:
      - {name: FragmentationAware, args: {minPodAge: 0, moveInterval: 0}}
      - {name: MigrationController, args: {maxMigratingPerNode: 5, maxUnavailablePerWorkload: 2}}
  - name: b
    plugins: {balance: {enabled: [FragmentationAware]}}
    pluginConfig:
      - {name: FragmentationAware, args: {minPodAge: 0, moveInterval: 0}}
      - {name: MigrationController, args: {maxMigratingPerNode: 5, maxUnavailablePerWorkload: 2}}
"""


def test_pods_with_device_claims_are_not_moved() -> None:
    gpus = (GpuDevice(0), GpuDevice(1))
    node_list = [make_node(f"n{i}", cpu=8000, memory=32 * GI, gpus=gpus) for i in range(2)]
    share = {"koordinator.sh/gpu-core": 60, "koordinator.sh/gpu-memory-ratio": 60}
    pods = [replace(replica(f"g{k}", "n0", cpu=2000), requests=ResourceList({"cpu": 2000, "memory": GI, **share}))
            for k in range(2)]
    for mode in ("global", "koordinator"):
        p = plan(node_list, pods, mode=mode)
        assert p.moves == () and p.skipped[DEVICES] == 2


def test_profiles_share_arrivals_and_never_move_a_pod_twice() -> None:
    """n1 has room for one 2-cpu pod: two profiles must not both send one there."""
    node_list = [make_node("n0", cpu=8000, memory=32 * GI), make_node("n1", cpu=8000, memory=32 * GI)]
    pods = [replica(f"c{k}", "n0", workload="c", cpu=2000) for k in range(3)]
    pods += [replica("m0", "n1", workload="m", cpu=5500, memory=30 * GI), replica("m1", "n1", workload="m", cpu=0, memory=0)]
    plans = Rebalancer(config.load(TWO_PROFILES)).cycle(node_list, pods, now=NOW)
    moves = [m for p in plans for m in p.moves.moves]
    assert len([m for m in moves if m.destination == "n1"]) == 1
    assert len({m.uid for m in moves}) == len(moves)


def test_migrations_in_flight_are_not_planned_again_and_their_arrivals_count() -> None:
    node_list, pods = lopsided()
    running = [(pods[0], "n0", "n2")]
    plans = Rebalancer(config.load(TWO_PROFILES)).cycle(node_list, pods, now=NOW, in_flight=running)
    moves = [m for p in plans for m in p.moves.moves]
    assert pods[0].uid not in {m.uid for m in moves}
    assert plans[0].moves.skipped["a migration of it is in flight or planned"] == 1


@pytest.mark.parametrize(("nodes_kw", "pods_kw", "message"), [
    ({}, {"dup": True}, "uid 'c00' appears twice"),
    ({"dup": True}, {}, "name 'n0' appears twice"),
    ({}, {"negative": True}, "requests.cpu=-1"),
])
def test_views_refuse_what_cannot_be_planned(nodes_kw: dict[str, Any], pods_kw: dict[str, Any], message: str) -> None:
    node_list, pods = lopsided()
    if nodes_kw.get("dup"):
        node_list = [*node_list, node_list[0]]
    if pods_kw.get("dup"):
        pods = [*pods, pods[0]]
    if pods_kw.get("negative"):
        pods = [replace(pods[0], requests=ResourceList({"cpu": -1})), *pods[1:]]
    with pytest.raises(ValueError, match=message):
        ClusterView.build(node_list, pods)


def test_resources_beyond_the_objectives_and_foreign_schedulers() -> None:
    node_list, pods = lopsided()
    pods[0] = replace(pods[0], requests=ResourceList({"cpu": 2000, "memory": GI, "example.com/fpga": 1}))
    pods[1] = replace(pods[1], scheduler_name="someone-else")
    for mode in ("global", "koordinator"):
        p = plan(node_list, pods, ArbitrationArgs(max_unavailable_per_workload=3), mode=mode)
        assert pods[1].uid not in {m.uid for m in p.moves}
        if mode == "global":
            assert p.skipped[NO_PROFILE] == 1


def test_replicas_already_down_count_against_max_unavailable() -> None:
    node_list, pods = lopsided()
    pods = [replace(p, phase="Pending") if p.uid in ("c01", "c02") else p for p in pods]  # 2 of 6 cpu replicas down
    p = plan(node_list, pods, mode="global")  # 6 replicas: 2 may be unavailable
    assert not [m for m in p.moves if m.workload.endswith("/cpu")]
    view, _, a = planning(node_list, pods, ArbitrationArgs(max_unavailable_per_workload="100%"))
    assert a.refusal(pods[3], "n1") == arb.UNAVAILABLE  # a limit of every replica protects nothing


def test_finished_pods_are_neither_load_nor_movable() -> None:
    node_list, pods = lopsided()
    done = [replace(p, phase="Succeeded") if p.uid.startswith("c") else p for p in pods]
    view = ClusterView.build(node_list, done)
    assert len(view.pods) == 6 and not view.requested[:2].any()


def test_evictor_reads_any_daemonset_owner_and_the_qos_label_first() -> None:
    two = (OwnerReference(kind="ReplicaSet", name="r", uid="r", controller=True),
           OwnerReference(kind="DaemonSet", name="d", uid="d"))
    assert evictor.EvictorArgs().refusal(replica("p", "n0", owner_references=two), NOW) == evictor.DAEMONSET
    lse = replica("p", "n0", qos_class="LS", labels={"koordinator.sh/qosClass": "LSE"})
    assert evictor.EvictorArgs().refusal(lse, NOW) == evictor.QOS
    bad = replica("p", "n0", labels={"koordinator.sh/qosClass": "GOLD"})
    assert evictor.EvictorArgs().refusal(bad, NOW) == evictor.BAD_QOS


BAD: list[tuple[str, Any, str]] = [
    ("a field name that is not a string", {1: "a", "profiles": None}, "1"),
    ("args not a mapping", {"profiles": [{"name": "a", "plugins": {"balance": {"enabled": ["FragmentationAware"]}},
                                          "pluginConfig": [{"name": "FragmentationAware", "args": []}]}]},
     "profiles[0].pluginConfig[0].args"),
    ("plugins a list", {"profiles": [{"name": "a", "plugins": []}]}, "profiles[0].plugins"),
    ("pluginConfig false", {"profiles": [{"name": "a", "pluginConfig": False}]}, "profiles[0].pluginConfig"),
    ("selector a list", {"profiles": [{"name": "a", "plugins": {"balance": {"enabled": ["FragmentationAware"]}},
                                       "pluginConfig": [{"name": "FragmentationAware",
                                                         "args": {"podSelectors": [{"name": "x", "selector": []}]}}]}]},
     "profiles[0].pluginConfig[0].args.podSelectors[0].selector"),
    ("a percentage with a fraction", {"profiles": [{"name": "a", "pluginConfig": [
        {"name": "MigrationController", "args": {"maxUnavailablePerWorkload": "10.5%"}}]}]},
     "profiles[0].pluginConfig[0].args.maxUnavailablePerWorkload"),
    ("a resource name with a space", {"profiles": [{"name": "a", "plugins": {"balance": {"enabled": ["FragmentationAware"]}},
                                                    "pluginConfig": [{"name": "FragmentationAware",
                                                                      "args": {"resources": ["cpu ", "memory"]}}]}]},
     "profiles[0].pluginConfig[0].args.resources[0]"),
    ("a weight for a resource not counted", {"profiles": [{"name": "a", "plugins": {"balance": {"enabled": ["ScaleDownBinPack"]}},
                                                           "pluginConfig": [{"name": "ScaleDownBinPack",
                                                                             "args": {"resourceWeights": {"gpu": 1}}}]}]},
     "profiles[0].pluginConfig[0].args.resourceWeights.gpu"),
    ("an int past int32", {"profiles": [{"name": "a", "plugins": {"balance": {"enabled": ["FragmentationAware"]}},
                                         "pluginConfig": [{"name": "FragmentationAware",
                                                           "args": {"maxMovesPerCycle": 10**28}}]}]},
     "profiles[0].pluginConfig[0].args.maxMovesPerCycle"),
    ("an interval of ages", {"deschedulingInterval": "99999999h"}, "deschedulingInterval"),
]


@pytest.mark.parametrize(("raw", "field"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_config_values_refused(raw: Any, field: str) -> None:
    with pytest.raises(ArgsError) as err:
        config.load(yaml.safe_dump(raw))
    assert err.value.field == field


@pytest.mark.parametrize("raw", [None, [], "abc", 5, [1]])
def test_args_that_are_not_mappings(raw: Any) -> None:
    for kind in (FragmentationArgs, ArbitrationArgs, evictor.EvictorArgs):
        with pytest.raises(ArgsError):
            kind.from_mapping(raw)


def test_plan_moves_over_a_view_with_every_pod_protected() -> None:
    node_list, pods = lopsided()
    view, sim, a = planning(node_list, [replace(p, owner_references=()) for p in pods])
    assert plan_moves(view, FragmentationArgs(min_pod_age_s=0), sim, a, now=NOW).moves == ()
