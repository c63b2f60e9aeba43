"""GPUs through the real broker and agents: shares of one GPU are packed onto concrete GPUs,
the owner holds them device by device, and the Binding says which GPU each pod got."""

from __future__ import annotations

import json

import pytest

from agents.state import devices
from schemas import topics
from schemas.records import (
    Binding,
    GpuDevice,
    Node,
    NodeStateChange,
    Pod,
    ResourceList,
    SchedulingFeedback,
)
from tests.integration.harness import Harness

pytestmark = pytest.mark.integration


async def test_gpu_shares_get_concrete_gpus_on_the_binding(harness: Harness, run_id: str) -> None:
    node = Node(name=f"gpu-{run_id}", allocatable=ResourceList({"cpu": 8000, "memory": 2**35, "nvidia.com/gpu": 2}),
                gpus=(GpuDevice(minor=0, model="A100"), GpuDevice(minor=1, model="A100")))
    await harness.publish(topics.NODES, [node])
    await harness.wait_for(NodeStateChange, lambda c: c.node == node.name)
    share = {"cpu": 100, devices.GPU_CORE: 50, devices.GPU_RATIO: 50}
    pods = [Pod(uid=f"share-{run_id}-{i}", name=f"share-{i}", requests=ResourceList(share)) for i in range(4)]
    await harness.publish(topics.PODS, pods)
    bindings = await harness.wait_for(Binding, lambda b: b.uid in {p.uid for p in pods}, count=4)
    per_gpu: dict[int, int] = {}
    for b in bindings:
        assert b.node == node.name
        [gpu] = json.loads(b.annotations[devices.DEVICE_ALLOCATED])["gpu"]
        per_gpu[gpu["minor"]] = per_gpu.get(gpu["minor"], 0) + int(gpu["resources"][devices.GPU_CORE])
    assert per_gpu == {0: 100, 1: 100}  # two shares on each GPU, none over its capacity
    extra = Pod(uid=f"share-{run_id}-extra", name="extra", requests=ResourceList(share))
    await harness.publish(topics.PODS, [extra])
    feedback = (await harness.wait_for(SchedulingFeedback, lambda f: f.uid == extra.uid))[0]  # one per attempt
    assert "Insufficient" in feedback.message
