"""Workload scenarios: the shipped ones read and generate what they say (pools, the mix by
share, gangs as runs, reservations ahead of their pods, bursts, the quick variant); bad files
are refused before a run with the file, the field and the value."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.state import devices
from perf import scenario
from perf.kwok import load_stages
from schemas.records import GANG_NAME_ANNOTATION, Pod, Reservation

ROOT = Path(__file__).parents[2]
SHIPPED = sorted((ROOT / "perf" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_scenarios_read_and_their_stage_files_load(path: Path) -> None:
    s = scenario.load(path)
    assert s.name == path.stem
    load_stages(ROOT / stage for stage in s.stages)
    quick = s.quick()
    assert sum(p.count for p in quick.pools) < sum(p.count for p in s.pools)
    records = scenario.arrivals(quick)
    assert 0 < len(records) <= quick.quick_pods * 1.5 + 100
    assert [at for at, _ in records] == sorted(at for at, _ in records)


def test_mixed_generates_the_mix_gangs_gpus_and_reservations() -> None:
    s = scenario.load(ROOT / "perf" / "scenarios" / "mixed-100k.yaml")
    s = s.quick()
    nodes = scenario.nodes(s)
    assert Counter(n.labels["pool"] for n in nodes) == {"cpu": 90, "gpu": 10}
    assert all(len(n.gpus) == 8 and n.allocatable[devices.NVIDIA_GPU] == 8 for n in nodes if n.labels["pool"] == "gpu")
    assert all(len(n.numa) == 2 and len(n.numa[0].cpus) == 32 for n in nodes if n.labels["pool"] == "cpu")
    records = scenario.arrivals(s)
    pods = [r for _, r in records if isinstance(r, Pod)]
    reservations = [r for _, r in records if isinstance(r, Reservation)]
    templates = Counter(p.labels["template"] for p in pods)
    assert 0.40 < templates["web"] / len(pods) < 0.50  # share 45 of 100
    gangs = Counter(p.annotations[GANG_NAME_ANNOTATION] for p in pods if GANG_NAME_ANNOTATION in p.annotations)
    assert all(count == 4 for count in gangs.values())
    assert all(p.requests[devices.GPU_CORE] == 50 for p in pods if p.labels["template"] == "infer")
    uids = [r.uid for _, r in records]
    for r in reservations:  # each reservation is published before the pod it is for
        owner = r.owners[0].object_uid
        assert uids.index(r.uid) < uids.index(owner)
    assert max(at for at, _ in records) == pytest.approx((len(pods) - 4) / s.rate, abs=0.01)


def test_generation_is_deterministic() -> None:
    s = scenario.load(ROOT / "perf" / "scenarios" / "basic.yaml").quick()
    assert scenario.arrivals(s) == scenario.arrivals(s)


BASE: dict[str, Any] = {
    "name": "t", "nodes": [{"pool": "a", "count": 2, "allocatable": {"cpu": "8", "memory": "16Gi"}}],
    "pods": {"total": 10, "mix": [{"name": "x", "share": 1, "requests": {"cpu": "1", "memory": "1Gi"}}]},
}


@pytest.mark.parametrize(("change", "field"), [
    ({"colour": "red"}, "colour"),
    ({"nodes": [{"pool": "a", "count": 0, "allocatable": {"cpu": "8", "memory": "1Gi"}}]}, "nodes[0].count"),
    ({"nodes": [{"pool": "a", "count": 1, "allocatable": {"memory": "1Gi"}}]}, "nodes[0].allocatable.cpu"),
    ({"nodes": [{"pool": "a", "count": 1, "allocatable": {"cpu": "6", "memory": "1Gi"}, "numa": {"cells": 4}}]},
     "nodes[0].numa.cells"),
    ({"nodes": [{"pool": "a", "count": 1, "allocatable": {"cpu": "lots", "memory": "1Gi"}}]},
     "nodes[0].allocatable.cpu"),
    ({"pods": {"total": 10, "mix": [{"name": "x", "requests": {"cpu": "64"}}]}}, "pods.mix[x]"),
    ({"pods": {"total": 10, "mix": [{"name": "x", "requests": {"cpu": "1"}, "gpu": {"share": 150}}]}},
     "pods.mix[0].gpu.share"),
    ({"pods": {"total": 10, "mix": [{"name": "x", "requests": {"cpu": "1"}, "qos": "Gold"}]}}, "pods.mix[0].qos"),
    ({"pods": {"total": 10, "mix": [{"name": "x", "requests": {"cpu": "1"}}],
               "arrival": {"bursts": [{"at": "1s", "template": "y", "count": 5}]}}}, "pods.arrival.bursts[0].template"),
    ({"pods": {"total": 3, "mix": [{"name": "x", "requests": {"cpu": "1"}, "gang": {"size": 4}}]}},
     "pods.mix[x].gang.size"),
])
def test_a_bad_scenario_names_the_file_the_field_and_the_value(tmp_path: Path, change: dict[str, Any],
                                                               field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**BASE, **change}))
    with pytest.raises(scenario.ScenarioError) as exc:
        scenario.load(path)
    assert exc.value.field == field and str(exc.value).startswith(str(path))
