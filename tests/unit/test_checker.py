"""The independent checker, table-driven: it must catch what it exists to catch."""

import json

import pytest

from perf.checker import (
    DevicePlacement,
    Placement,
    check,
    device_amounts,
    devices_overcommitted,
    partial_gangs,
)

ALLOC = {"n1": {"cpu": 1000, "pods": 110}, "n2": {"cpu": 1000, "pods": 2}}
REQ = {"a": {"cpu": 600}, "b": {"cpu": 600}, "c": {"cpu": 100}}


@pytest.mark.parametrize(
    ("bindings", "terminations", "double", "over"),
    [
        ([Placement(1, "a", "n1"), Placement(2, "c", "n1")], [], 0, 0),
        ([Placement(1, "a", "n1"), Placement(2, "b", "n1")], [], 0, 1),  # 1200m on 1000m
        ([Placement(1, "a", "n1"), Placement(3, "b", "n1")], [Placement(2, "a", "n1")], 0, 0),  # freed first
        ([Placement(1, "a", "n1"), Placement(2, "b", "n1")], [Placement(3, "a", "n1")], 0, 1),  # freed too late
        ([Placement(1, "a", "n1"), Placement(2, "a", "n2")], [], 1, 0),
        ([Placement(1, "a", "n1"), Placement(2, "a", "n1")], [], 0, 0),  # the same binding read twice
        ([Placement(1, "c", "n2"), Placement(2, "a", "n2"), Placement(3, "b", "n2")], [], 0, 1),  # pods cap too
        ([Placement(1, "c", "unknown-node")], [], 0, 1),  # a node nobody published has nothing
        # a pod deleted while its hold waited: its Binding and termination sent in one batch
        ([Placement(1, "a", "n1"), Placement(2, "b", "n1")], [Placement(1, "a", "n1")], 0, 0),
        ([Placement(1, "a", "n1"), Placement(2, "b", "n1")], [Placement(0.5, "a", "n1")], 0, 0),
    ],
    ids=["fits", "overcommit", "termination-frees", "termination-late", "double-bound", "duplicate-read",
         "pod-count", "unknown-node", "ended-with-its-binding", "ended-before-its-binding"],
)
def test_checker(bindings, terminations, double, over) -> None:
    result = check(ALLOC, REQ, bindings, terminations)
    assert (result.pods_double_bound, result.nodes_overcommitted) == (double, over)
    assert result.consistent == (double == 0 and over == 0)


def test_counts_bound_and_unschedulable() -> None:
    result = check(ALLOC, REQ, [Placement(1, "a", "n1")], unschedulable=["b", "a"])
    assert (result.pods_total, result.pods_bound, result.pods_unschedulable) == (3, 1, 1)


def test_counted_limits_the_counts_but_not_the_consistency_check() -> None:
    result = check(ALLOC, REQ, [Placement(1, "a", "n1"), Placement(2, "b", "n1")], counted=["a"])
    assert (result.pods_total, result.pods_bound, result.nodes_overcommitted) == (1, 1, 1)


GPU = "koordinator.sh/gpu-core"
RATIO = "koordinator.sh/gpu-memory-ratio"


def _gpu(minor: int, share: int) -> str:
    return json.dumps({"gpu": [{"minor": minor, "resources": {GPU: str(share), RATIO: str(share)}}]})


CAPACITY = {"n1": {"gpu/0/core": 100, "gpu/0/ratio": 100, "gpu/1/core": 100, "gpu/1/ratio": 100,
                   "rdma/0/vfs": 2}}


@pytest.mark.parametrize(
    ("placements", "terminations", "over"),
    [
        ([("a", _gpu(0, 60)), ("b", _gpu(1, 60))], [], []),
        ([("a", _gpu(0, 60)), ("b", _gpu(0, 60))], [], ["n1/gpu/0/core", "n1/gpu/0/ratio"]),  # totals fit, GPU 0 not
        ([("a", _gpu(0, 60)), ("b", _gpu(0, 60))], [Placement(1.5, "a", "n1")], []),  # a freed GPU 0 first
        ([("a", _gpu(0, 60)), ("a", _gpu(0, 60))], [], []),  # the same binding read twice
        ([("a", json.dumps({"rdma": [{"minor": 0, "resources": {"koordinator.sh/rdma": "2"}}]})),
          ("b", json.dumps({"rdma": [{"minor": 0, "resources": {"koordinator.sh/rdma": "1"}}]}))], [],
         ["n1/rdma/0/vfs"]),
        ([("a", ""), ("b", "")], [], []),  # no devices
        ([("a", _gpu(0, 60)), ("b", _gpu(0, 60))], [Placement(1.0, "a", "n1")], []),  # ended with its binding
    ],
    ids=["two-gpus", "one-gpu-twice", "freed-first", "read-twice", "rdma-vfs", "no-devices", "ended-with-binding"],
)
def test_devices_overcommitted(placements: list[tuple[str, str]], terminations: list[Placement],
                               over: list[str]) -> None:
    found = devices_overcommitted(
        CAPACITY, [DevicePlacement(float(i + 1), uid, "n1", device_amounts(a)) for i, (uid, a) in enumerate(placements)],
        terminations)
    assert sorted(found) == over


@pytest.mark.parametrize(
    ("bound", "partial"),
    [(set(), []), ({"g0", "g1"}, []), ({"g0"}, ["g"]), ({"g0", "g1", "g2"}, []), ({"x"}, [])],
    ids=["none", "min-available", "one-of-two", "all", "others"],
)
def test_partial_gangs(bound: set[str], partial: list[str]) -> None:
    assert partial_gangs({"g": (2, ["g0", "g1", "g2"])}, bound) == partial
