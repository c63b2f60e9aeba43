"""GPUs as devices: request parsing and validation, GPU choice, the DeviceShare plugin, owners
checking claimed GPUs, the device-allocated annotation, Unreserve in every profile, and the
nominator keeping a preemptor's GPUs from lower-priority pods (DESIGN.md's motivating bug)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.scheduler.framework.profiles import load
from agents.state import devices
from agents.state.devices import GpuAllocation, GpuRequest, RdmaAllocation
from agents.state.ledger import Decider, Decision, LedgerState
from agents.state.owner import NodeOwner, NodeState, OwnerResult
from agents.state.resources import ResourceSpace
from schemas.records import (
    BoundPod,
    Claim,
    EvictionCommand,
    GpuDevice,
    Held,
    Node,
    NodeStateChange,
    Nomination,
    Pod,
    RdmaDevice,
    Rejected,
    Requeue,
    ResourceList,
    SchedulingFeedback,
)

GI = 2**30
CORE, RATIO, MEM, SHARED = devices.GPU_CORE, devices.GPU_RATIO, devices.GPU_MEMORY, devices.GPU_SHARED


@pytest.mark.parametrize(("requests", "expected"), [
    ({}, None),
    ({"cpu": 1000}, None),
    ({"nvidia.com/gpu": 2}, GpuRequest(2, 100, 100)),
    ({CORE: 50, RATIO: 50}, GpuRequest(1, 50, 50)),
    ({CORE: 200, RATIO: 200}, GpuRequest(2, 100, 100)),
    ({CORE: 300}, GpuRequest(3, 100, 100)),
    ({SHARED: 2, CORE: 50, RATIO: 25}, GpuRequest(2, 50, 25)),
    ({MEM: 8 * GI}, GpuRequest(1, 0, 0, 8 * GI)),
], ids=["none", "cpu-only", "nvidia", "share", "whole-core-and-ratio", "whole-core", "gpu-shared", "memory"])
def test_gpu_requests(requests: dict[str, int], expected: GpuRequest | None) -> None:
    assert devices.gpu_request(requests) == expected


@pytest.mark.parametrize(("requests", "field"), [
    ({CORE: 150}, f"requests.{CORE}"),
    ({CORE: 200, RATIO: 300}, f"requests.{RATIO}"),
    ({"nvidia.com/gpu": 1, CORE: 50}, "requests.nvidia.com/gpu"),
    ({SHARED: 2, CORE: 150}, f"requests.{CORE}"),
    ({SHARED: 2}, f"requests.{SHARED}"),
    ({CORE: 200, MEM: GI}, f"requests.{MEM}"),
], ids=["share-150", "core-ratio-disagree", "nvidia-and-core", "shared-over-100", "shared-alone", "whole-and-memory"])
def test_invalid_gpu_requests_name_the_field(requests: dict[str, int], field: str) -> None:
    with pytest.raises(devices.DeviceError) as err:
        devices.gpu_request(requests)
    assert err.value.field == field


def test_choose_packs_shares_and_takes_whole_gpus_in_order() -> None:
    minors, memory = [0, 1, 2, 3], [16 * GI] * 4
    free_core, free_ratio = [100, 30, 60, 100], [100, 30, 60, 100]
    assert devices.choose(GpuRequest(1, 50, 50), minors, free_core, free_ratio, memory) == [GpuAllocation(2, 50, 50)]
    assert devices.choose(GpuRequest(2, 100, 100), minors, free_core, free_ratio, memory) == [
        GpuAllocation(0, 100, 100), GpuAllocation(3, 100, 100)]
    assert devices.choose(GpuRequest(3, 100, 100), minors, free_core, free_ratio, memory) is None
    # 4 GiB of a 16 GiB GPU is a memory-ratio of 25
    assert devices.choose(GpuRequest(1, 0, 0, 4 * GI), minors, free_core, free_ratio, memory) == [GpuAllocation(1, 0, 25)]


def gpu_node(name: str, gpus: int = 2, cpu: int = 32000, **kw: object) -> Node:
    return Node(name=name, allocatable=ResourceList({"cpu": cpu, "memory": 256 * GI, "nvidia.com/gpu": gpus}),
                gpus=tuple(GpuDevice(minor=i, model="A100", memory=40 * GI) for i in range(gpus)), **kw)  # type: ignore[arg-type]


def share(uid: str, core: int, **kw: object) -> Pod:
    return Pod(uid=uid, name=uid, requests=ResourceList({"cpu": 100, CORE: core, RATIO: core}), **kw)  # type: ignore[arg-type]


def whole(uid: str, count: int, **kw: object) -> Pod:
    return Pod(uid=uid, name=uid, requests=ResourceList({"cpu": 100, "nvidia.com/gpu": count}), **kw)  # type: ignore[arg-type]


PROFILES = load("profiles: [{schedulerName: default-scheduler}, {schedulerName: other}]")


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def core_of(*nodes: Node, clock: Clock | None = None) -> SchedulerCore:
    space = ResourceSpace()
    return SchedulerCore(space, ClusterState.from_records(space, nodes), clock or Clock(), config=PROFILES)


def claims(outputs: list) -> list[Claim]:  # type: ignore[type-arg]
    return [o.record for o in outputs if isinstance(o.record, Claim)]


def test_shares_are_packed_onto_concrete_gpus_and_claimed() -> None:
    core = core_of(gpu_node("g", gpus=2))
    for i in range(3):
        core.add(share(f"s{i}", 50))
    got = claims(core.schedule())
    assert [c.devices for c in got] == [("gpu/0/50/50",), ("gpu/0/50/50",), ("gpu/1/50/50",)]
    assert [c.requests[CORE] for c in got] == [50, 50, 50]  # totals travel too
    core.add(share("s3", 60))
    assert claims(core.schedule()) == []  # GPU 1 has 50 left: no room for 60


def test_a_rejected_claim_gives_its_gpu_back_in_every_profile() -> None:
    clock = Clock()
    core = core_of(gpu_node("g", gpus=1), clock=clock)
    core.add(whole("a", 1))
    [a] = claims(core.schedule())
    core.add(whole("b", 1, scheduler_name="other", priority=9900))
    assert claims(core.schedule()) == []  # the other profile sees GPU 0 taken at once
    assert core.state.gpus.free_row(0)[1] == [0]
    core.requeue(Requeue(uid="a", attempt=1, decision_key="a"))  # the owner rejected a's claim
    assert core.state.gpus.free_row(0)[1] == [100]  # Unreserve gave GPU 0 back, for every profile
    core.queue.on_event(core.state.apply(NodeStateChange(
        node="g", seq=2, allocatable=ResourceList({"nvidia.com/gpu": 1, CORE: 100, RATIO: 100, "cpu": 32000}),
        holds={a.hold_id: "rejected"})))
    clock.now += 10  # past b's backoff
    got = claims(core.schedule())
    assert [(c.uid, c.devices) for c in got] == [("b", ("gpu/0/100/100",))]


def test_a_preemptors_gpus_and_vfs_stay_its_own_in_every_profile() -> None:
    """A node with 8 GPUs and 8 RDMA VFs busy with low-priority pods: a high-priority pod
    needing all of them preempts and is nominated; a lower-priority pod of another profile
    arriving next does not get those GPUs or VFs; the preemptor binds there once the victims
    are gone."""
    one = {"cpu": 100, "nvidia.com/gpu": 1, devices.RDMA: 1}
    victims = [BoundPod(uid=f"v{i}", name=f"v{i}", priority=1, requests=ResourceList(one)) for i in range(8)]
    space = ResourceSpace()
    state = ClusterState.from_records(space, [rdma_node("g8")])
    for i, v in enumerate(victims):
        state.add_bound(v, "g8", [GpuAllocation(i, 100, 100)], [RdmaAllocation(0, 1)])
    core = SchedulerCore(space, state, lambda: 1000.0, config=PROFILES)
    core.add(Pod(uid="boss", name="boss", priority=100,
                 requests=ResourceList({"cpu": 100, "nvidia.com/gpu": 8, devices.RDMA: 8})))
    outputs = core.schedule()
    [nomination] = [o.record for o in outputs if isinstance(o.record, Nomination)]
    assert nomination.node == "g8" and nomination.requests["nvidia.com/gpu"] == 8
    assert nomination.devices == tuple(f"gpu/{i}/100/100" for i in range(8)) + ("rdma/0/8",)  # promised
    assert nomination.requests[devices.RDMA] == 8
    assert {o.record.uid for o in outputs if isinstance(o.record, EvictionCommand)} == {v.uid for v in victims}
    # The victims are gone (the owner reports them terminated, its devices idle, the nomination on).
    allocatable = ResourceList({"cpu": 64000, "memory": 512 * GI, "nvidia.com/gpu": 8, CORE: 800, RATIO: 800,
                                devices.RDMA: 8, "pods": 110})
    core.apply_state_changes([NodeStateChange(node="g8", seq=5, allocatable=allocatable,
                                              holds={f"v{i}/0/g8": "terminated" for i in range(8)},
                                              nominations=(nomination,))])
    core.add(Pod(uid="small", name="small", priority=50, scheduler_name="other", requests=ResourceList(one)))
    core.queue.clock = lambda: 2000.0  # past every backoff
    got = claims(core.schedule())
    assert [(c.uid, c.nominated_node) for c in got] == [("boss", "g8")]
    assert got[0].devices == tuple(f"gpu/{i}/100/100" for i in range(8)) + ("rdma/0/8",)


def test_a_preemptor_is_promised_concrete_gpus_not_only_totals() -> None:
    """GPU 0 runs a low-priority victim (100), GPU 1 a high-priority pod (50). A high-priority
    share of 60 preempts the victim and is promised GPU 0. A pod of 90 arriving next fits the
    node by totals (150 free - 60 promised) but not device by device: GPU 0 keeps 60 for the
    preemptor, so 40 + 50 is no room for 90. By totals alone it would take GPU 0, and the
    preemptor would fit nowhere."""
    space = ResourceSpace()
    state = ClusterState.from_records(space, [gpu_node("g")])
    state.add_bound(BoundPod(uid="victim", name="victim", priority=1, requests=ResourceList({CORE: 100, RATIO: 100})),
                    "g", [GpuAllocation(0, 100, 100)])
    state.add_bound(BoundPod(uid="keeper", name="keeper", priority=100, requests=ResourceList({CORE: 50, RATIO: 50})),
                    "g", [GpuAllocation(1, 50, 50)])
    core = SchedulerCore(space, state, lambda: 1000.0, config=PROFILES)
    core.add(share("boss", 60, priority=100))
    [nomination] = [o.record for o in core.schedule() if isinstance(o.record, Nomination)]
    assert nomination.devices == ("gpu/0/60/60",)
    # The victim is gone: the owner reports it terminated, GPU 0 idle, the nomination on. Another
    # scheduler replica (which knows the nomination only from that report) gets "big" first.
    allocatable = ResourceList({"cpu": 32000, "memory": 256 * GI, "nvidia.com/gpu": 2, CORE: 200, RATIO: 200,
                                "pods": 110})
    report = NodeStateChange(
        node="g", seq=5, allocatable=allocatable, used=ResourceList({"cpu": 100, CORE: 50, RATIO: 50, "pods": 1}),
        holds={"victim/0/g": "terminated"}, nominations=(nomination,),
        device_usage={"gpu/1/core": 50, "gpu/1/ratio": 50})
    other = SchedulerCore(space, ClusterState.from_records(space, [gpu_node("g")]), lambda: 1000.0, config=PROFILES)
    other.apply_state_changes([report])
    other.add(share("big", 90, priority=50, scheduler_name="other"))
    assert claims(other.schedule()) == []
    core.apply_state_changes([report])
    core.queue.clock = lambda: 2000.0  # past every backoff
    got = claims(core.schedule())
    assert [(c.uid, c.devices) for c in got] == [("boss", ("gpu/0/60/60",))]
    # The owner keeps promised GPUs too: a claim on GPU 0 beyond the promise is refused.
    owner, node = NodeOwner(), NodeState("g")
    owner.apply(node, [gpu_node("g"), nomination], OwnerResult())
    result = OwnerResult()
    owner.apply(node, [owner_claim("big", 0, 90), owner_claim("small", 0, 40)], result)
    verdicts = {r.uid: getattr(r, "reason", "held") for r in (o.record for o in result.outputs)
                if isinstance(r, (Held, Rejected))}
    assert verdicts == {"big": "Insufficient gpu 0", "small": "held"}


def test_bad_gpu_request_is_final_feedback() -> None:
    core = core_of(gpu_node("g"))
    outputs = core.add(share("odd", 150))
    outputs += core.schedule()
    [feedback] = [o.record for o in outputs if isinstance(o.record, SchedulingFeedback)]
    assert feedback.final and f"requests.{CORE}=150" in feedback.message


def test_gpu_memory_beyond_every_gpu_is_feedback_naming_the_field() -> None:
    core = core_of(gpu_node("g"))
    core.add(Pod(uid="huge", name="huge", requests=ResourceList({"cpu": 100, MEM: 4096 * GI})))
    core.add(Pod(uid="fits", name="fits", requests=ResourceList({"cpu": 100, MEM: GI})))
    outputs = core.schedule()
    [feedback] = [o.record for o in outputs if isinstance(o.record, SchedulingFeedback)]
    assert feedback.uid == "huge" and f"requests.{MEM}={4096 * GI}" in feedback.message
    assert "largest" in feedback.message and not feedback.final  # a bigger GPU may join
    assert [c.uid for c in claims(outputs)] == ["fits"]


def owner_claim(uid: str, minor: int, amount: int, attempt: int = 0) -> Claim:
    return Claim(uid=uid, attempt=attempt, node="g", decision_key=uid,
                 requests=ResourceList({"cpu": 100, CORE: amount, RATIO: amount, "pods": 1}),
                 devices=(GpuAllocation(minor, amount, amount).encode(),))


def test_owners_check_claimed_gpus_device_by_device() -> None:
    state, owner = NodeState("g"), NodeOwner()
    owner.apply(state, [gpu_node("g", gpus=2)], OwnerResult())
    result = OwnerResult()
    owner.apply(state, [owner_claim("a", 0, 60), owner_claim("b", 0, 60), owner_claim("c", 1, 60),
                        owner_claim("d", 7, 10)], result)
    verdicts = {(r.uid, type(r).__name__, getattr(r, "reason", "")) for r in (o.record for o in result.outputs)
                if isinstance(r, (Held, Rejected))}
    # b fits by totals (120 of 200 core) but not on GPU 0; GPU 7 does not exist
    assert verdicts == {("a", "Held", ""), ("b", "Rejected", "Insufficient gpu 0"), ("c", "Held", ""),
                        ("d", "Rejected", "gpu 7 does not exist on the node")}
    [change] = [o.record for o in result.outputs if isinstance(o.record, NodeStateChange)]
    assert change.device_usage == {"gpu/0/core": 60, "gpu/0/ratio": 60, "gpu/1/core": 60, "gpu/1/ratio": 60}
    held = [o.record for o in result.outputs if isinstance(o.record, Held) and o.record.uid == "a"]
    assert held[0].devices == ("gpu/0/60/60",)


def test_the_binding_carries_the_device_allocated_annotation() -> None:
    held = Held(uid="a", attempt=0, node="g", decision_key="a", name="a", devices=("gpu/3/50/50",))
    decision = Decision()
    Decider().apply(LedgerState("a"), [held], decision)
    [binding] = [o.record for o in decision.after_commit]
    assert json.loads(binding.annotations[devices.DEVICE_ALLOCATED]) == {
        "gpu": [{"minor": 3, "resources": {CORE: "50", RATIO: "50"}}]}


def rdma_node(name: str) -> Node:
    return Node(name=name, allocatable=ResourceList({"cpu": 64000, "memory": 512 * GI, "nvidia.com/gpu": 8}),
                gpus=tuple(GpuDevice(minor=i) for i in range(8)), rdma=(RdmaDevice(name="mlx5_0", minor=0, vfs=8),))


def test_rdma_comes_with_gpus_and_takes_virtual_functions() -> None:
    with pytest.raises(devices.DeviceError) as err:
        devices.rdma_request({devices.RDMA: 2})
    assert err.value.field == f"requests.{devices.RDMA}"
    assert devices.choose_vfs(3, [0, 1], [2, 4]) == [RdmaAllocation(0, 2), RdmaAllocation(1, 1)]
    assert devices.choose_vfs(7, [0, 1], [2, 4]) is None
    core = core_of(rdma_node("r"))
    core.add(Pod(uid="big", name="big", requests=ResourceList({"cpu": 100, "nvidia.com/gpu": 7, devices.RDMA: 7})))
    core.add(Pod(uid="two", name="two", requests=ResourceList({"cpu": 100, "nvidia.com/gpu": 1, devices.RDMA: 2})))
    core.add(Pod(uid="one", name="one", requests=ResourceList({"cpu": 100, "nvidia.com/gpu": 1, devices.RDMA: 1})))
    got = {c.uid: c.devices for c in claims(core.schedule())}
    assert got == {"big": tuple(f"gpu/{i}/100/100" for i in range(7)) + ("rdma/0/7",),
                   "one": ("gpu/7/100/100", "rdma/0/1")}  # "two" needs 2 VFs, 1 is left


def test_owners_check_virtual_functions_and_the_binding_names_them() -> None:
    state, owner = NodeState("g"), NodeOwner()
    two_nics = replace(rdma_node("g"), rdma=(RdmaDevice(name="mlx5_0", minor=0, vfs=4),
                                             RdmaDevice(name="mlx5_1", minor=1, vfs=4)))
    owner.apply(state, [two_nics], OwnerResult())
    result = OwnerResult()
    # b fits by totals (6 of 8 VFs) but not on NIC 0, which a already holds 4 of
    claims_ = [Claim(uid=uid, attempt=0, node="g", decision_key=uid,
                     requests=ResourceList({"cpu": 100, "nvidia.com/gpu": 1, CORE: 100, RATIO: 100, devices.RDMA: vfs}),
                     devices=(f"gpu/{gpu}/100/100", f"rdma/0/{vfs}")) for uid, gpu, vfs in (("a", 0, 4), ("b", 1, 2))]
    owner.apply(state, claims_, result)
    verdicts = {r.uid: getattr(r, "reason", "held") for r in (o.record for o in result.outputs)
                if isinstance(r, (Held, Rejected))}
    assert verdicts == {"a": "held", "b": "Insufficient rdma 0"}
    [held] = [o.record for o in result.outputs if isinstance(o.record, Held)]
    decision = Decision()
    Decider().apply(LedgerState("a"), [held], decision)
    [binding] = [o.record for o in decision.after_commit]
    assert json.loads(binding.annotations[devices.DEVICE_ALLOCATED])["rdma"] == [
        {"minor": 0, "resources": {devices.RDMA: "4"}}]
