"""Who may be evicted (the DefaultEvictor protections) and when a move may start (arbitration,
PodDisruptionBudgets, the eviction rate)."""

from __future__ import annotations

from typing import Any

import pytest

from agents.rebalance import arbitration as arb
from agents.rebalance import evictor as ev
from agents.rebalance.arbitration import ArbitrationArgs, Arbitrator, Budget, TokenBucket
from agents.rebalance.evictor import EvictorArgs
from agents.rebalance.selectors import LabelSelector
from schemas.kube import pod_from_manifest
from schemas.records import OwnerReference
from tests.unit.rebalance.conftest import NOW, replica

DAEMON = (OwnerReference(kind="DaemonSet", name="agent", uid="ds", controller=True),)

PROTECTED: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("a plain replica may go", {}, {}, ""),
    ("mirror pod", {"annotations": {ev.MIRROR_ANNOTATION: "x"}}, {}, ev.MIRROR),
    ("terminating", {"deletion_timestamp": 5.0}, {}, ev.TERMINATING),
    ("DaemonSet pod", {"owner_references": DAEMON}, {}, ev.DAEMONSET),
    ("DaemonSet pod allowed", {"owner_references": DAEMON}, {"evictDaemonSetPods": True}, ""),
    ("bare pod", {"owner_references": ()}, {}, ev.BARE),
    ("failed bare pod allowed", {"owner_references": (), "phase": "Failed"}, {"evictFailedBarePods": True}, ""),
    ("system-critical priority", {"priority": 2_000_000_000}, {}, ev.CRITICAL),
    ("system-critical class", {"priority_class_name": "system-node-critical"}, {}, ev.CRITICAL),
    ("system-critical allowed", {"priority": 2_000_000_000}, {"evictSystemCriticalPods": True}, ""),
    ("LSE QoS", {"labels": {"koordinator.sh/qosClass": "LSE"}}, {}, ev.QOS),
    ("SYSTEM QoS", {"qos_class": "SYSTEM"}, {}, ev.QOS),
    ("LS QoS may go", {"qos_class": "LS"}, {}, ""),
    ("emptyDir", {"volume_kinds": ("emptyDir",)}, {}, ev.LOCAL),
    ("hostPath allowed", {"volume_kinds": ("hostPath",)}, {"evictLocalStoragePods": True}, ""),
    ("PVC ignored", {"volume_kinds": ("persistentVolumeClaim",)}, {"ignorePvcPods": True}, ev.PVC),
    ("PVC by default", {"volume_kinds": ("persistentVolumeClaim",)}, {}, ""),
    ("priority threshold", {"priority": 100}, {"priorityThreshold": {"value": 100}}, ev.PRIORITY),
    ("young", {"creation_timestamp": NOW - 10}, {"minPodAge": "1m"}, ev.YOUNG),
]


@pytest.mark.parametrize(("pod_kw", "raw", "reason"), [p[1:] for p in PROTECTED], ids=[p[0] for p in PROTECTED])
def test_evictor_protections(pod_kw: dict[str, Any], raw: dict[str, Any], reason: str) -> None:
    pod = replica("p", "n0", **pod_kw)
    assert EvictorArgs.from_mapping(raw).refusal(pod, NOW) == reason


def test_volume_kinds_come_from_the_manifest() -> None:
    pod = pod_from_manifest({"metadata": {"name": "p"}, "spec": {"volumes": [
        {"name": "a", "emptyDir": {}}, {"name": "b", "persistentVolumeClaim": {"claimName": "c"}},
        {"name": "c", "emptyDir": {}}]}})
    assert pod.volume_kinds == ("emptyDir", "persistentVolumeClaim")


@pytest.mark.parametrize(("replicas", "limit"), [(1, 1), (3, 1), (4, 2), (10, 2), (11, 1), (20, 2), (100, 10)])
def test_default_max_unavailable(replicas: int, limit: int) -> None:
    assert arb.default_max_unavailable(replicas) == limit


def test_limits_per_node_workload_and_single_replica() -> None:
    pods = [replica(f"w{i}", f"n{i % 2}") for i in range(6)] + [replica("solo", "n0", workload="solo")]
    a = Arbitrator.over(ArbitrationArgs(max_migrating_per_node=1), pods)
    assert a.refusal(pods[-1], "n0") == arb.SINGLE_REPLICA
    assert a.refusal(replica("bare", "n0", owner_references=()), "n0") == arb.NO_WORKLOAD
    a.admit(pods[0], "n0")
    assert a.refusal(pods[2], "n0") == arb.PER_NODE
    assert a.refusal(pods[1], "n1") == ""
    a.admit(pods[1], "n1")  # 6 replicas: 2 may be unavailable
    assert a.refusal(pods[3], "n2") == arb.PER_WORKLOAD
    a.finish(pods[0], "n0")
    assert a.refusal(pods[2], "n0") == ""


def test_namespace_and_global_limits() -> None:
    pods = [replica(f"a{i}", f"n{i}", workload="a") for i in range(20)] + [
        replica(f"b{i}", f"n{i}", workload="b", namespace="other") for i in range(20)]
    a = Arbitrator.over(ArbitrationArgs(max_migrating_per_namespace=1, max_migrating_globally=2), pods)
    a.admit(pods[0], "n0")
    assert a.refusal(pods[1], "n1") == arb.PER_NAMESPACE
    a.admit(pods[20], "n0")
    assert a.refusal(pods[25], "n5") == arb.PER_NAMESPACE
    a = Arbitrator.over(ArbitrationArgs(max_migrating_globally=1), pods)
    a.admit(pods[0], "n0")
    assert a.refusal(pods[25], "n5") == arb.GLOBALLY


@pytest.mark.parametrize(("min_available", "max_unavailable", "healthy", "allowed"), [
    (4, None, 5, 1), (5, None, 5, 0), ("80%", None, 5, 1), ("90%", None, 5, 0),
    (None, 1, 5, 1), (None, 1, 4, 0), (None, "40%", 5, 2), (None, None, 5, 0)])
def test_budget_allowed(min_available: Any, max_unavailable: Any, healthy: int, allowed: int) -> None:
    b = Budget("default", "pdb", LabelSelector({"app": "web"}), min_available, max_unavailable)
    assert b.allowed(5, healthy) == allowed


def test_budget_refuses_what_would_break_it() -> None:
    pods = [replica(f"w{i}", f"n{i}", labels={"app": "web"}) for i in range(12)]
    budget = Budget("default", "pdb", LabelSelector({"app": "web"}), min_available=11)
    a = Arbitrator.over(ArbitrationArgs(max_unavailable_per_workload="50%"), pods, [budget])
    assert a.refusal(pods[0], "n0") == ""
    a.admit(pods[0], "n0")
    assert a.refusal(pods[1], "n1") == arb.PDB
    other = Budget("other", "pdb", LabelSelector({"app": "web"}), min_available=100)
    assert not other.covers(pods[0])


def test_token_bucket_on_an_injected_clock() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=10.0, burst=1, clock=lambda: now[0])
    assert bucket.take() and not bucket.take()
    assert bucket.wait_s() == pytest.approx(0.1)
    now[0] = 0.05
    assert not bucket.take()
    now[0] = 0.1
    assert bucket.take()
    now[0] = 10.0  # a long pause still gives only the burst
    assert bucket.take() and not bucket.take()
