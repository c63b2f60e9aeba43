"""One cluster state and one nominator per worker, shared by every profile: memory measured
with tracemalloc (only what the state, caches and plugins allocate), and decisions made in
one profile seen by the others at once."""

from __future__ import annotations

import gc
import tracemalloc

from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.scheduler.framework.profiles import load
from agents.state.resources import ResourceSpace
from schemas.records import BoundPod, Claim, Node, Pod, ResourceList, Taint

PROFILES = """
profiles:
  - schedulerName: default-scheduler
  - schedulerName: packer
    pluginConfig:
      - name: NodeResourcesFit
        args: {scoringStrategy: {type: MostAllocated}}
  - schedulerName: batch
    plugins:
      score: {disabled: [{name: NodeResourcesBalancedAllocation}]}
"""


def cluster(nodes: int, pods: int) -> tuple[list[Node], dict[str, list[BoundPod]]]:
    alloc = ResourceList({"cpu": 64000, "memory": 256 * 2**30, "pods": 110})
    node_list = [Node(name=f"n{i:05d}", allocatable=alloc, labels={"zone": f"z{i % 3}", "host": f"n{i:05d}"},
                      taints=(Taint("spot", "1", "PreferNoSchedule"),) if i % 7 == 0 else ())
                 for i in range(nodes)]
    bound: dict[str, list[BoundPod]] = {}
    for j in range(pods):
        bound.setdefault(f"n{j % nodes:05d}", []).append(
            BoundPod(uid=f"b{j}", priority=j % 3, requests=ResourceList(cpu=100 + j % 900, memory=2**28)))
    return node_list, bound


NODES = 1000  # enough for the state's arrays to dominate; tracemalloc makes every node slow


def worker_allocations(profiles: int) -> int:
    """Bytes allocated from agents/ code for a worker's state, caches and plugins, after
    scheduling pods in each of its profiles (so that every cache is warm)."""
    names = ["default-scheduler", "packer", "batch"][:profiles]
    config = load(PROFILES)
    config = type(config)(tuple(p for p in config.profiles if p.name in names), config.queue_sort)
    nodes, bound = cluster(NODES, 4 * NODES)
    gc.collect()
    tracemalloc.start(25)
    before = tracemalloc.take_snapshot()
    space = ResourceSpace()
    core = SchedulerCore(space, ClusterState.from_records(space, nodes, bound), lambda: 0.0, config=config)
    for i in range(60):
        core.add(Pod(uid=f"p{i}", name=f"p{i}", scheduler_name=names[i % len(names)],
                     node_selector={"zone": "z1"} if i % 2 else {}, requests=ResourceList(cpu=500 + i, memory=2**29)))
    placed = [o for o in core.schedule(1000) if isinstance(o.record, Claim)]
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    assert len(placed) == 60
    only_ours = [tracemalloc.Filter(True, "*/agents/*", all_frames=True)]
    diff = after.filter_traces(only_ours).compare_to(before.filter_traces(only_ours), "filename")
    del core
    return sum(stat.size_diff for stat in diff)


def test_three_profiles_allocate_at_most_one_tenth_more_than_one() -> None:
    one = worker_allocations(1)
    three = worker_allocations(3)
    assert one > NODES * 8 * 3  # the arrays of the state itself are counted
    assert three <= 1.1 * one, f"1 profile: {one} B, 3 profiles: {three} B ({three / one:.3f}x)"


def test_a_decision_in_one_profile_is_seen_by_the_others_at_once() -> None:
    space = ResourceSpace()
    nodes = [Node(name="only", allocatable=ResourceList({"cpu": 1000, "memory": 2**30, "pods": 110}))]
    core = SchedulerCore(space, ClusterState.from_records(space, nodes), lambda: 0.0, config=load(PROFILES))
    core.add(Pod(uid="a", name="a", scheduler_name="packer", requests=ResourceList(cpu=1000)))
    core.add(Pod(uid="b", name="b", scheduler_name="batch", requests=ResourceList(cpu=1000)))
    outputs = core.schedule()
    assert [o.record.uid for o in outputs if isinstance(o.record, Claim)] == ["a"]
    assert core.frameworks["packer"].state is core.frameworks["batch"].state is core.state
    assert core.frameworks["packer"].state.nominator is core.frameworks["batch"].state.nominator
