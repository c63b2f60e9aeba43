"""The scheduler's edges: partitions revoked from a replica, claims whose send fails, zombie
deciders' requeues, pods a producer put on a partition other than murmur2's (DESIGN.md, safety
rules 4 and 11), and what producers are told (the JSON Schemas' topic and key, the README)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest

from agents.intake import RawMessage
from agents.ports import Origin, Output
from agents.scheduler.agent import SchedulerService
from agents.scheduler.core import SchedulerCore
from agents.state.owner import NodeOwner, NodeState, OwnerResult
from schemas import topics
from schemas.codec import encode_batch
from schemas.records import (
    RECORD_TYPES,
    Claim,
    Commit,
    NodeDeleted,
    NodeStateChange,
    PodDeleted,
    Record,
    Requeue,
    Reservation,
    ReservationOwner,
    ResourceList,
)
from streams.catalogue import catalogue, partition_for
from tests.builders import make_claim, make_node, make_pod
from tests.unit.test_scheduler_core import FakeClock, claims, make_core

ROOT = Path(__file__).resolve().parents[2]
N = 4  # partitions of every topic in these tests


def raw(record: Record, partition: int, topic: str = topics.PODS, origin: Origin | None = None,
        offset: int = 0) -> RawMessage:
    return RawMessage(encode_batch([record]), topic, partition, offset, origin)


def uid_at(partition: int, prefix: str = "pod") -> str:
    """A uid whose murmur2 partition (of N) is `partition`."""
    return next(f"{prefix}-{i}" for i in range(1000) if partition_for(f"{prefix}-{i}", N) == partition)


class FakeOutbox:
    """Our Outbox protocol (agents.ports), in memory: one ack future per send call, resolved at
    once unless `hold` is set; a send holding a Claim of a uid in `fail_once` fails (once)."""

    def __init__(self, *, hold: bool = False, fail_once: Sequence[str] = ()) -> None:
        self.sent: list[list[Output]] = []
        self.acks: list[asyncio.Future[object]] = []
        self.hold = hold
        self.fail_once = set(fail_once)

    async def send(self, outputs: Sequence[Output]) -> list[Awaitable[object]]:
        self.sent.append(list(outputs))
        ack: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        failing = {o.record.uid for o in outputs if isinstance(o.record, Claim)} & self.fail_once
        if failing:
            self.fail_once -= failing
            ack.set_exception(ConnectionError("the broker did not acknowledge"))
        elif not self.hold:
            ack.set_result(None)
        self.acks.append(ack)
        return [ack]

    def release(self) -> None:
        for ack in self.acks:
            if not ack.done():
                ack.set_result(None)

    def outputs(self) -> list[Output]:
        return [o for batch in self.sent for o in batch]

    def claims(self, uid: str | None = None) -> list[Claim]:
        return [o.record for o in self.outputs() if isinstance(o.record, Claim) and uid in (None, o.record.uid)]


async def until(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out waiting for the condition")
        await asyncio.sleep(0.005)


def service_with(core: SchedulerCore, outbox: FakeOutbox, clock: FakeClock, batch_size: int = 100) -> SchedulerService:
    service = SchedulerService(core, outbox, clock, batch_size)
    service.partitions = N  # what `register` sets from the AgentConfig
    service.commit_inputs = True  # and this with `scheduling.commit_input_offsets`
    return service


def owner_report(node: str, *records: Record) -> list[NodeStateChange]:
    """What the node's owner publishes after applying `records` (node record first)."""
    state, result = NodeState(node), OwnerResult()
    NodeOwner().apply(state, [make_node(node, cpu=4000), *records], result)
    return [o.record for o in result.outputs if isinstance(o.record, NodeStateChange)]


# -- 1. a revoked partition's pods stop being placed at once -------------------------------------


def test_revoke_drops_the_partitions_pods_and_a_claim_out_stays_assumed_until_its_outcome() -> None:
    core, _ = make_core(make_node("a", cpu=4000))
    core.add(make_pod("out", cpu=1000), partition=1)
    [claim] = claims(core.schedule())
    core.add(make_pod("queued", cpu=1000), partition=1)
    core.add(make_pod("parked", cpu=9000), partition=1)  # fits nowhere: waits for an event
    core.add(make_pod("mine", cpu=1000), partition=0)
    assert core.revoke({1}) == 3
    assert set(core.pods) == {"mine"} and "queued" not in core.queue and "parked" not in core.queue
    assert int(core.state.assumed[0][0]) == 1000  # the claim is out: still assumed here
    assert [c.uid for c in claims(core.schedule())] == ["mine"]
    core.apply_state_changes([NodeStateChange(node="a", seq=5, allocatable=ResourceList(cpu=4000),
                                              used=ResourceList(cpu=1000), holds={"mine/0/a": "held"})])
    core.requeue(Requeue(uid="out", attempt=1, decision_key="out"))  # a straggler: not ours any more
    assert int(core.state.assumed[0][0]) == 1000 and "out" not in core.pods
    core.apply_state_changes([NodeStateChange(node="a", seq=6, allocatable=ResourceList(cpu=4000),
                                              used=ResourceList(cpu=1000), holds={claim.hold_id: "rejected"})])
    assert int(core.state.assumed[0][0]) == 0  # the outcome ended the assumption
    assert core.schedule() == []


@pytest.mark.parametrize("outcome", ["held", "committed", "released", "rejected"])
def test_any_reported_outcome_of_a_revoked_claim_ends_its_assumption(outcome: str) -> None:
    core, _ = make_core(make_node("a", cpu=4000))
    core.add(make_pod("p", cpu=1000), partition=2)
    [claim] = claims(core.schedule())
    core.revoke([2])
    core.apply_state_changes([NodeStateChange(node="a", seq=9, allocatable=ResourceList(cpu=4000),
                                              holds={claim.hold_id: outcome})])
    assert core.state.assumptions == {} and int(core.state.assumed[0][0]) == 0


def test_revoke_gives_back_what_a_pod_waiting_in_permit_reserved() -> None:
    core, _ = make_core(make_node("a", cpu=4000))
    core.add(make_pod("w", cpu=1000), partition=3)
    tracked = core.pods["w"]
    info = tracked.info
    fw = core.frameworks[info.profile]
    core.queue.remove("w")
    row = core.state.index["a"]
    core.state.assume("w/0/a", row, info.request)  # what Reserve did before Permit said wait
    from agents.scheduler.framework.interface import CycleState
    from agents.scheduler.framework.runtime import Waiting

    fw.waiting["w"] = Waiting(info, row, CycleState(), 1e9)
    tracked.state, tracked.row, tracked.profile = "waiting", row, info.profile
    core.revoke([3])
    assert "w" not in fw.waiting and core.state.assumptions == {} and "w" not in core.pods


async def test_the_service_drops_a_revoked_partitions_pods_and_its_late_messages() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    mine, theirs = uid_at(0), uid_at(1)
    service.on_partitions_assigned({0, 1})
    await service.on_inputs([raw(make_pod(mine), 0), raw(make_pod(theirs), 1)])
    service.on_partitions_revoked({1})
    assert set(core.pods) == {mine}
    late = uid_at(1, "late")
    await service.on_inputs([raw(make_pod(late), 1)])  # fetched before the revocation
    assert late not in core.pods
    assert [c.uid for c in claims(core.schedule())] == [mine]
    service.on_partitions_assigned({0, 1})  # back again: read from the start, like a restart
    await service.on_inputs([raw(make_pod(theirs), 1), raw(make_pod(late), 1, offset=1)])
    assert {theirs, late} <= set(core.pods)


async def test_a_new_assignment_revokes_what_it_no_longer_names() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    service.on_partitions_assigned({0, 1, 2})
    await service.on_inputs([raw(make_pod(uid_at(p)), p) for p in (0, 1, 2)])
    service.on_partitions_assigned({0})  # a rebalance that only reported the new assignment
    assert set(core.pods) == {uid_at(0)}


async def test_faust_rebalance_signals_reach_the_service() -> None:
    import faust
    from faust.types import TP

    from agents.adapters.positions import CommittedStart
    from agents.adapters.scheduler import register
    from agents.ports import AgentConfig

    core, clock = make_core(make_node("a", cpu=4000))
    service = SchedulerService(core, FakeOutbox(), clock, 100)
    app = faust.App("edges-test", broker="kafka://127.0.0.1:1", store="memory://", web_enabled=False)
    inputs = app.topic(topics.PODS, topics.REQUEUE, key_type=bytes, value_type=bytes, partitions=N)
    register(app, inputs, service, AgentConfig(partitions=N), CommittedStart("127.0.0.1:1", None, False))
    assert service.partitions == N
    await app.on_partitions_assigned.send({TP(topics.PODS, 0), TP(topics.REQUEUE, 0), TP(topics.PODS, 1),
                                           TP(topics.REQUEUE, 1), TP(topics.NODES, 3)})
    await service.on_inputs([raw(make_pod(uid_at(0)), 0), raw(make_pod(uid_at(1)), 1)])
    assert len(core.pods) == 2
    await app.on_partitions_revoked.send({TP(topics.PODS, 1), TP(topics.REQUEUE, 1), TP(topics.NODES, 0)})
    assert set(core.pods) == {uid_at(0)}


# -- 1b. a partition read from its first record is placed once read to where it stood -----------


async def test_a_held_partition_places_nothing_until_read_to_its_end_and_a_pod_deleted_further_on_never() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    service.on_partitions_assigned({0})
    service.hold([0])
    old, live = uid_at(0, "old"), uid_at(0, "live")
    await service.on_inputs([raw(make_pod(old), 0, offset=0), raw(make_pod(live), 0, offset=1)])
    service.catch_up(0, 3)  # where the partition ended when assigned
    assert claims(core.schedule()) == []  # read to offset 2 of 3: held
    await service.on_inputs([raw(PodDeleted(uid=old), 0, offset=2)])  # the deletion, further on
    assert [c.uid for c in claims(core.schedule())] == [live]


async def test_a_held_partition_is_released_when_its_end_is_learned_after_it_was_read() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    service.on_partitions_assigned({0})
    service.hold([0])
    await service.on_inputs([raw(make_pod(uid_at(0)), 0, offset=4)])
    assert claims(core.schedule()) == []
    service.catch_up(0, 5)
    assert [c.uid for c in claims(core.schedule())] == [uid_at(0)]


async def test_a_held_partition_committed_to_its_end_is_caught_up_at_once() -> None:
    """With `scheduling.commit_input_offsets` a partition may be committed to its end: nothing
    is left to read, so it must not wait for its next record (a requeued pod of it would wait
    with it)."""
    core, clock = make_core(make_node("a", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    service.on_partitions_assigned({0, 1})
    service.hold([0, 1])
    service.catch_up(0, 7, start=7)  # committed at its end
    service.catch_up(1, 7, start=3)  # records from 3 on still to read
    assert 0 not in service.catch_up_to and 1 in service.catch_up_to
    await service.on_inputs([raw(make_pod(uid_at(0)), 0, offset=7)])
    assert [c.uid for c in claims(core.schedule())] == [uid_at(0)]


async def test_a_partition_read_again_from_its_first_record_waits_until_read_as_far_as_before() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    service.on_partitions_assigned({0})
    service.hold([0])
    service.catch_up(0, 0)  # empty when assigned: placed as pods come
    pod, gone = uid_at(0, "p"), uid_at(0, "gone")
    await service.on_inputs([raw(make_pod(gone), 0, offset=0), raw(make_pod(pod), 0, offset=1),
                             raw(PodDeleted(uid=gone), 0, offset=2)])
    service.reread(0)  # the start check sought it back to its first record
    await service.on_inputs([raw(make_pod(gone), 0, offset=0), raw(make_pod(pod), 0, offset=1)])
    assert claims(core.schedule()) == []  # `gone` is queued again until its deletion is read again
    await service.on_inputs([raw(PodDeleted(uid=gone), 0, offset=2)])
    assert [c.uid for c in claims(core.schedule())] == [pod]


async def test_a_reread_before_the_end_is_known_keeps_the_partition_held() -> None:
    """Adversarial review (R1): a re-read from the first record while the end was not known
    yet released the partition at once."""
    core, clock = make_core(make_node("a", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    service.on_partitions_assigned({0})
    service.hold([0])
    service.reread(0, topics.PODS)
    assert 0 in service.catch_up_to
    old = uid_at(0, "old")
    await service.on_inputs([raw(make_pod(old), 0, offset=0)])
    service.catch_up(0, 100)
    assert claims(core.schedule()) == []
    service.reread(0, topics.REQUEUE)  # a requeue partition read again: the pods partition is not
    await service.on_inputs([raw(PodDeleted(uid=old), 0, offset=99)])
    assert 0 not in service.catch_up_to and old not in core.pods


async def test_a_held_partition_forwards_its_strays_only_once_caught_up_and_not_those_deleted_meanwhile() -> None:
    """Adversarial review (R2): a replica that took a partition over forwarded, on its re-read
    from the first record, pods forwarded and deleted long ago; their home replica placed them
    again."""
    core, clock = make_core(make_node("a", cpu=4000))
    outbox = FakeOutbox()
    service = service_with(core, outbox, clock)
    service.on_partitions_assigned({0})
    service.hold([0])
    gone, live = uid_at(1, "gone"), uid_at(1, "live")
    await service.on_inputs([raw(make_pod(gone), 0, offset=0), raw(make_pod(live), 0, offset=1),
                             raw(PodDeleted(uid=gone), 0, offset=2)])
    forwarded = [(type(o.record).__name__, o.record.uid) for o in outbox.outputs() if o.topic == topics.PODS]
    assert forwarded == [("PodDeleted", gone)]  # the deletion at once; the pods wait
    service.catch_up(0, 3)
    await service.flush_forwards()
    forwarded = [(type(o.record).__name__, o.record.uid) for o in outbox.outputs() if o.topic == topics.PODS]
    assert forwarded == [("PodDeleted", gone), ("Pod", live)]


async def test_a_requeue_of_a_pod_not_tracked_is_kept_only_while_its_partition_is_held() -> None:
    """Adversarial review (R9): a Requeue of a pod deleted long ago stayed in the replica for
    ever."""
    core, clock = make_core(make_node("a", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    service.on_partitions_assigned({0})
    service.hold([0])
    early, late = uid_at(0, "early"), uid_at(0, "late")
    await service.on_inputs([raw(Requeue(uid=early, attempt=2, decision_key=early, reason="x"), 0,
                                 topic=topics.REQUEUE)])
    assert set(core.requeued) == {early}  # its pod may still be read
    service.catch_up(0, 0)  # read as far as it stood: the pod never came, and never will
    assert set(core.requeued) == set()
    await service.on_inputs([raw(Requeue(uid=late, attempt=2, decision_key=late, reason="x"), 0,
                                 topic=topics.REQUEUE)])
    assert set(core.requeued) == set()


def test_pods_of_other_partitions_are_placed_while_one_is_held() -> None:
    core, _ = make_core(make_node("a", cpu=4000))
    core.hold([1])
    core.add(make_pod(uid_at(0)), partition=0)
    core.add(make_pod(uid_at(1)), partition=1)
    assert [c.uid for c in claims(core.schedule())] == [uid_at(0)]
    assert core.release(1) == 1
    assert [c.uid for c in claims(core.schedule())] == [uid_at(1)]


# -- 2. claims wait for the broker's acknowledgement ----------------------------------------------


async def test_a_claim_whose_send_fails_goes_back_to_the_queue_and_is_claimed_again() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    outbox = FakeOutbox(fail_once=["p"])
    service = service_with(core, outbox, clock)
    service.mark_replica_ready()
    loop = asyncio.create_task(service.run())
    try:
        await service.on_inputs([raw(make_pod("p", cpu=1000), partition_for("p", N))])
        await until(lambda: len(outbox.claims("p")) == 1 and core.pods["p"].state == "queued")
        assert core.state.assumptions == {}  # no claim anywhere: nothing assumed
        clock.now += 5  # past its backoff
        service.wake.set()
        await until(lambda: len(outbox.claims("p")) == 2)
    finally:
        loop.cancel()
    first, second = outbox.claims("p")
    assert second.attempt == first.attempt  # the decider never saw the first
    assert core.pods["p"].state == "claimed" and list(core.state.assumptions) == [second.hold_id]


async def test_batches_in_flight_are_bounded_and_placing_goes_on_while_acks_are_pending() -> None:
    core, clock = make_core(make_node("a", cpu=64000))
    outbox = FakeOutbox(hold=True)
    service = service_with(core, outbox, clock, batch_size=1)
    service.max_in_flight = 2
    service.mark_replica_ready()
    loop = asyncio.create_task(service.run())
    try:
        uids = [uid_at(0, f"b{i}") for i in range(5)]
        await service.on_inputs([raw(make_pod(u, cpu=100), 0) for u in uids])
        await until(lambda: len(outbox.claims()) == 2)  # two batches out before any ack
        await asyncio.sleep(0.05)
        assert len(outbox.claims()) == 2
        outbox.release()  # both acknowledged: two more batches, and no more
        await until(lambda: len(outbox.claims()) == 4)
        await asyncio.sleep(0.05)
        assert len(outbox.claims()) == 4
        outbox.release()
        await until(lambda: len(outbox.claims()) == 5)
    finally:
        loop.cancel()


async def test_a_send_refused_before_it_left_puts_its_claims_back_too() -> None:
    core, clock = make_core(make_node("a", cpu=4000))

    class Refusing(FakeOutbox):
        async def send(self, outputs: Sequence[Output]) -> list[Awaitable[object]]:
            if any(isinstance(o.record, Claim) for o in outputs) and not self.sent:
                self.sent.append(list(outputs))
                raise ConnectionError("the producer is closed")
            return await super().send(outputs)

    outbox = Refusing()
    service = service_with(core, outbox, clock)
    core.add(make_pod("p", cpu=1000), partition=partition_for("p", N))
    await service.dispatch(core.schedule())
    assert core.pods["p"].state == "queued" and core.state.assumptions == {} and service.failed_sends == 1
    clock.now += 5
    await service.dispatch(core.schedule())
    assert len(outbox.claims("p")) == 2


def test_a_failed_claim_of_a_pod_no_longer_tracked_is_forgotten() -> None:
    core, _ = make_core(make_node("a", cpu=4000))
    core.add(make_pod("p", cpu=1000), partition=1)
    [claim] = claims(core.schedule())
    core.revoke([1])
    assert core.state.assumptions
    core.unclaim([claim])  # its send failed: no owner will ever report it
    assert core.state.assumptions == {} and "p" not in core.pods


def test_a_failed_send_of_an_older_claim_leaves_a_newer_one_alone() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    core.add(make_pod("p", cpu=1000))
    [old] = claims(core.schedule())
    core.requeue(Requeue(uid="p", attempt=1, decision_key="p"))
    clock.now += 5
    [new] = claims(core.schedule())
    core.unclaim([old])
    assert core.pods["p"].state == "claimed" and list(core.state.assumptions) == [new.hold_id]


# -- 3. the pods/requeue intake is fenced ------------------------------------------------------------


async def test_a_zombie_deciders_requeue_is_dropped() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    home = partition_for("p", N)
    await service.on_inputs([raw(make_pod("p", cpu=1000), home)])
    [first] = claims(core.schedule())
    decider = "holds/2"
    await service.on_inputs([raw(Requeue(uid="p", attempt=1, decision_key="p"), home, topics.REQUEUE,
                                 Origin(decider, 5), offset=1)])
    assert core.pods["p"].state == "queued" and core.pods["p"].info.attempt == 1
    clock.now += 5
    [second] = claims(core.schedule())
    assert second.attempt == 1
    # The decider's previous incarnation (epoch 4), still running, requeues the pod again.
    await service.on_inputs([raw(Requeue(uid="p", attempt=2, decision_key="p"), home, topics.REQUEUE,
                                 Origin(decider, 4), offset=2)])
    assert core.pods["p"].state == "claimed" and core.pods["p"].info.attempt == 1
    assert list(core.state.assumptions) == [second.hold_id]


async def test_a_partition_read_again_from_the_start_is_fenced_afresh() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    home = partition_for("p", N)
    log = [raw(make_pod("p", cpu=1000), home),
           raw(Requeue(uid="p", attempt=1, decision_key="p"), home, topics.REQUEUE, Origin("holds/2", 4), 1),
           raw(Requeue(uid="p", attempt=2, decision_key="p"), home, topics.REQUEUE, Origin("holds/2", 5), 2)]
    service.on_partitions_assigned({home})
    await service.on_inputs(log)
    assert core.pods["p"].info.attempt == 2
    service.on_partitions_revoked({home})
    service.on_partitions_assigned({home})
    await service.on_inputs(log[:2])  # the replay: epoch 4's record is no zombie's
    assert core.pods["p"].info.attempt == 1


async def test_the_replica_fences_each_state_changes_partition_on_its_own() -> None:
    """An owner's reports reach every `state-changes` partition (keyed by node): a report of
    epoch 4 on one partition, read after one of epoch 5 on another, is no zombie's; one of
    epoch 4 after epoch 5 on the same partition is."""
    core, clock = make_core(make_node("x", cpu=4000), make_node("y", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    owner = "node-inbox/1"
    [report_y] = owner_report("y", make_claim("q", "y", cpu=1000))
    [report_x] = owner_report("x", make_claim("p", "x", cpu=1000))
    await service.on_state_changes([raw(report_y, 2, topics.STATE_CHANGES, Origin(owner, 5))])
    await service.on_state_changes([raw(report_x, 0, topics.STATE_CHANGES, Origin(owner, 4))])
    assert core.state.used[core.state.index["x"]].tolist() == core.state.used[core.state.index["y"]].tolist()
    assert core.state.used[core.state.index["x"]].any(), "a report of an older epoch on another partition was dropped"
    [zombie] = owner_report("y", make_claim("q", "y", cpu=1000), make_claim("r", "y", cpu=2000))
    await service.on_state_changes([raw(zombie, 2, topics.STATE_CHANGES, Origin(owner, 4))])
    assert core.state.used[core.state.index["y"]].tolist() == core.state.used[core.state.index["x"]].tolist()


# -- 4. any producer's partitioner ------------------------------------------------------------------


async def test_records_on_a_partition_that_is_not_their_keys_are_forwarded_home_not_scheduled() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    outbox = FakeOutbox()
    service = service_with(core, outbox, clock)
    pod = make_pod(uid_at(1, "stray"), cpu=1000)
    gone = PodDeleted(uid=uid_at(2, "gone"))
    booking = Reservation(uid=uid_at(3, "rsv"), name="r", owners=(ReservationOwner(object_name="x"),),
                          requests=ResourceList(cpu=100))
    await service.on_inputs([raw(pod, 0), raw(gone, 0, offset=1), raw(booking, 0, offset=2)])
    assert [(o.topic, o.key, o.record) for o in outbox.outputs()] == [
        (topics.PODS, pod.uid, pod), (topics.PODS, gone.uid, gone), (topics.PODS, booking.uid, booking)]
    assert core.pods == {} and core.schedule() == []
    await service.on_inputs([raw(pod, 1)])  # the forwarded copy, on its own partition
    assert [c.uid for c in claims(core.schedule())] == [pod.uid]


async def test_a_forward_is_acknowledged_before_the_batch_counts_as_handled() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    outbox = FakeOutbox(hold=True)
    service = service_with(core, outbox, clock)
    handling = asyncio.create_task(service.on_inputs([raw(make_pod(uid_at(1)), 0)]))
    await asyncio.sleep(0.02)
    assert not handling.done() and len(outbox.sent) == 1
    outbox.release()
    await asyncio.wait_for(handling, 1)


class Bus:
    """`pods` and `requeue` between scheduler replicas: each output routed by murmur2 to the
    replica that owns its partition, as Kafka and the consumer group would."""

    def __init__(self) -> None:
        self.owners: dict[int, SchedulerService] = {}
        self.queued: list[Output] = []
        self.claims: list[Claim] = []
        self.offset = 0

    def outbox(self) -> FakeOutbox:
        bus = self

        class Routed(FakeOutbox):
            async def send(self, outputs: Sequence[Output]) -> list[Awaitable[object]]:
                bus.queued += outputs
                return await super().send(outputs)

        return Routed()

    async def pump(self) -> None:
        while self.queued:
            out = self.queued.pop(0)
            if out.topic in (topics.PODS, topics.REQUEUE):
                self.offset += 1
                p = partition_for(out.key, N)
                await self.owners[p].on_inputs([raw(out.record, p, out.topic, offset=self.offset)])

    async def schedule(self) -> None:
        for service in set(self.owners.values()):
            outputs = service.core.schedule()
            self.claims += claims(outputs)
            self.queued += outputs
        await self.pump()


async def test_two_replicas_a_pod_on_the_wrong_partition_is_placed_by_its_owner_and_its_requeue_finds_it() -> None:
    bus = Bus()
    a_core, clock = make_core(make_node("a", cpu=4000))
    b_core, _ = make_core(make_node("a", cpu=4000))
    b_core.clock = clock
    a, b = service_with(a_core, bus.outbox(), clock), service_with(b_core, bus.outbox(), clock)
    bus.owners = {0: a, 1: a, 2: b, 3: b}
    uid = uid_at(0, "lost")
    # A librdkafka producer (consistent_random) put the pod on partition 2, which B owns.
    await b.on_inputs([raw(make_pod(uid, cpu=1000), 2)])
    await bus.pump()
    await bus.schedule()
    [claim] = bus.claims
    assert uid in a_core.pods and uid not in b_core.pods
    # The owner rejects the claim; the decider requeues the pod, keyed by its uid.
    bus.queued.append(Output(topics.REQUEUE, uid, Requeue(uid=uid, attempt=claim.attempt + 1, decision_key=uid)))
    await bus.pump()
    clock.now += 5
    await bus.schedule()
    assert [c.attempt for c in bus.claims] == [0, 1]


# -- 5. what producers are told ---------------------------------------------------------------------


def test_every_record_schema_names_its_topics_keys_and_the_partitioner() -> None:
    from schemas.jsonschema import CONFIGURED, record_schema
    from streams.producer import key_of
    from streams.settings import Settings

    specs = catalogue(N)
    for cls in RECORD_TYPES:
        schema = record_schema(cls)
        if cls.KIND in CONFIGURED:  # configuration: read from the file a setting names, on no topic
            section, name = schema["x-koordstream-config"].split(".")
            assert hasattr(getattr(Settings(), section), name) and "x-koordstream-routes" not in schema, cls.KIND
            continue
        routes = schema["x-koordstream-routes"]
        assert routes and schema["x-koordstream-topic"] == routes[0]["topic"], cls.KIND
        assert schema["x-koordstream-key"] == routes[0]["key"]
        assert "murmur2" in schema["x-koordstream-partitioner"]
        for route in routes:
            assert route["topic"] in specs, (cls.KIND, route)
            assert route["key"] in schema["properties"], (cls.KIND, route)
        json.dumps(schema)
    # The keys the annotations name are the ones the project's producer routes by.
    pod = make_pod("u1", namespace="ns", annotations={"gang.scheduling.koordinator.sh/name": "g"})
    samples: list[Record] = [pod, PodDeleted(uid="u1"), make_node("n1"),
                             Requeue(uid="u1", attempt=1, decision_key="ns/g")]
    for record in samples:
        route = record_schema(type(record))["x-koordstream-routes"][0]
        assert key_of(route["topic"], record) == getattr(record, route["key"]), record.KIND


def test_the_readme_tells_producers_topics_keys_partitioner_batches_and_headers() -> None:
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Producing to koordstream\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no 'Producing to koordstream' section"
    body = section.group(1)
    for topic in (topics.NODES, topics.PODS, topics.SCALE_DOWN, topics.BINDINGS, topics.FEEDBACK,
                  topics.RESERVATIONS, topics.EVICTIONS, topics.DEAD_LETTER):
        assert re.search(rf"^\| `{re.escape(topic)}` \|", body, re.M), topic
    for needed in ("murmur2_random", "consistent_random", "koordstream-origin", "koordstream-epoch",
                   "decode_message", "uid", "x-koordstream-topic"):
        assert needed in body, needed


# -- input offsets: what a replica no longer needs of pods / requeue ----------------------------------


async def test_the_commit_point_stays_at_the_first_record_of_a_pod_still_tracked_and_moves_once_it_is_bound() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    service.on_partitions_assigned({0})
    first, second, gone = uid_at(0, "first"), uid_at(0, "second"), uid_at(0, "gone")
    await service.on_inputs([raw(make_pod(gone), 0, offset=3), raw(make_pod(first), 0, offset=4),
                             raw(make_pod(first, cpu=600), 0, offset=5),  # an update: the first record counts
                             raw(make_pod(second, cpu=9000), 0, offset=6),  # fits nowhere: stays queued
                             raw(PodDeleted(uid=gone), 0, offset=7)])
    assert service.commit_points() == {(topics.PODS, 0): 4}
    [claim] = claims(core.schedule())
    assert claim.uid == first and service.commit_points() == {(topics.PODS, 0): 4}  # claimed, not bound
    core.apply_state_changes(owner_report("a", claim, Commit(uid=first, attempt=0, node="a", decision_key=first)))
    assert service.commit_points() == {(topics.PODS, 0): 6}  # bound: only `second` is needed
    await service.on_inputs([raw(PodDeleted(uid=second), 0, offset=8)])
    assert service.commit_points() == {(topics.PODS, 0): 9}  # nothing tracked: as far as read


async def test_the_commit_point_of_requeue_keeps_the_requeues_of_pods_still_tracked() -> None:
    core, clock = make_core(make_node("a", cpu=1000))
    service = service_with(core, FakeOutbox(), clock)
    service.on_partitions_assigned({0})
    uid = uid_at(0)
    await service.on_inputs([raw(make_pod(uid, cpu=500), 0, offset=0)])
    [claim] = claims(core.schedule())
    await service.on_inputs([raw(Requeue(uid=uid, attempt=1, decision_key=uid, reason="rejected"), 0,
                                 topic=topics.REQUEUE, offset=2)])
    assert service.commit_points() == {(topics.PODS, 0): 0, (topics.REQUEUE, 0): 2}
    await service.on_inputs([raw(PodDeleted(uid=uid), 0, offset=1)])
    assert service.commit_points() == {(topics.PODS, 0): 2, (topics.REQUEUE, 0): 3}


async def test_nothing_is_committed_for_a_held_partition_a_revoked_one_or_while_forwards_wait() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    service.on_partitions_assigned({0, 1})
    service.hold([1])
    await service.on_inputs([raw(make_pod(uid_at(0), cpu=9000), 0, offset=0), raw(make_pod(uid_at(1)), 1, offset=0),
                             raw(make_pod(uid_at(2, "stray")), 1, offset=1)])  # read on 1, belongs to 2
    assert service.commit_points() == {(topics.PODS, 0): 0}
    service.catch_up(1, 2)  # caught up: the stray is forwarded once the forwards are flushed
    service.to_forward.append(Output(topics.PODS, "x", make_pod("x")))
    assert service.commit_points() == {}
    await service.flush_forwards()
    assert service.commit_points() == {(topics.PODS, 0): 0, (topics.PODS, 1): 0}
    service.on_partitions_assigned({1})
    assert service.commit_points() == {(topics.PODS, 1): 0}


async def test_without_committed_offsets_nothing_of_the_inputs_is_kept() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    service = SchedulerService(core, FakeOutbox(), clock, 100)
    service.partitions = N
    service.on_partitions_assigned({0})
    await service.on_inputs([raw(make_pod(uid_at(0, f"p{i}")), 0, offset=i) for i in range(5)])
    assert service.needed == {} and service.handled_to == {}


async def test_a_pod_finally_refused_does_not_hold_the_commit_point_back() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    service.on_partitions_assigned({0})
    await service.on_inputs([raw(make_pod(uid_at(0), scheduler_name="nobody"), 0, offset=0)])
    assert service.commit_points() == {(topics.PODS, 0): 1}


# found by an adversarial review (each failed before its fix)

async def test_a_requeue_kept_while_held_for_a_pod_deleted_meanwhile_leaves_at_release() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    service = service_with(core, FakeOutbox(), clock)
    service.on_partitions_assigned({0})
    service.hold([0])
    p = uid_at(0, "p")
    await service.on_inputs([raw(make_pod(p), 0, offset=0), raw(PodDeleted(uid=p), 0, offset=1)])
    await service.on_inputs([raw(Requeue(uid=p, attempt=1, decision_key=p), 0, topics.REQUEUE, offset=0)])
    service.catch_up(0, 2)
    assert p not in core.requeued
    assert service.commit_points() == {(topics.PODS, 0): 2, (topics.REQUEUE, 0): 1}


async def test_a_forward_is_not_committed_past_until_acknowledged_and_waits_again_if_refused() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    outbox = FakeOutbox(hold=True)
    service = service_with(core, outbox, clock)
    service.on_partitions_assigned({1})
    service.hold([1])
    stray = uid_at(2, "stray")  # belongs to partition 2, written on 1 by another partitioner
    await service.on_inputs([raw(make_pod(stray), 1, offset=0)])
    service.catch_up(1, 1)
    flush = asyncio.ensure_future(service.flush_forwards())
    await asyncio.sleep(0)  # sent, not acknowledged
    assert service.commit_points() == {}
    outbox.acks[-1].set_exception(ConnectionError("not acknowledged"))
    with pytest.raises(ConnectionError):
        await flush
    assert service.commit_points() == {} and [o.record.uid for o in service.to_forward] == [stray]  # type: ignore[attr-defined]


async def test_a_replica_started_from_the_changelog_fences_a_zombie_owners_later_report() -> None:
    state, result = NodeState("a"), OwnerResult()
    NodeOwner().apply(state, [make_node("a", cpu=4000)], result)
    NodeOwner().apply(state, [NodeDeleted(name="a")], result)  # by the owner of epoch 2
    zombie_state, zombie_result = NodeState("a"), OwnerResult()
    NodeOwner().apply(zombie_state, [make_node("a", cpu=4000)], zombie_result)  # the old owner, epoch 1
    [late] = [o.record for o in zombie_result.outputs if isinstance(o.record, NodeStateChange)]
    core, clock = make_core()
    service = service_with(core, FakeOutbox(), clock)
    service.on_current_state([NodeOwner.current(state)], {0: 2})
    await service.on_state_changes([raw(late, 0, topics.STATE_CHANGES, Origin(f"{topics.NODE_INBOX}/0", 1))])
    assert not core.state.present[core.state.index["a"]]


# -- the outstanding-claims limit ------------------------------------------------------------------


async def test_the_loop_places_nothing_past_the_outstanding_claims_limit_until_outcomes_come_back() -> None:
    """`scheduling.max_outstanding_claims`: an overloaded pipeline queues pods in the replica
    instead of piling up holds that grow too old to be accepted."""
    core, clock = make_core(make_node("a", cpu=4000))
    outbox = FakeOutbox()
    service = SchedulerService(core, outbox, clock, 100, max_claims=2)
    service.replica_ready.set()
    for i in range(5):
        core.add(make_pod(f"p{i}", cpu=500))
    loop = asyncio.ensure_future(service.run())
    try:
        await until(lambda: len(outbox.claims()) == 2)
        await until(lambda: service.throttled > 0)
        await asyncio.sleep(0.05)
        assert len(outbox.claims()) == 2 and core.queue and len(core.state.assumptions) == 2
        first = outbox.claims()[0]
        commit = Commit(uid=first.uid, attempt=first.attempt, node="a", decision_key=first.uid)
        await service.on_state_changes([raw(r, 0, topics.STATE_CHANGES) for r in owner_report("a", first, commit)])
        await until(lambda: len(outbox.claims()) == 3)
        await asyncio.sleep(0.05)
        assert len(outbox.claims()) == 3 and len(core.state.assumptions) == 2
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
    assert SchedulerService(core, outbox, clock, 100).room_for_claims() == 100  # 0: no limit


async def test_claims_held_and_waiting_for_their_decider_count_as_outstanding() -> None:
    """Issue 28 (suspected, confirmed): an assumption ends on any reported status, Held too, so
    with a limit of 2 the replica kept placing while its claims sat held: six were out. A claim
    stays outstanding until it is decided (committed, released, rejected) or requeued."""
    core, clock = make_core(make_node("a", cpu=4000))
    outbox = FakeOutbox()
    service = SchedulerService(core, outbox, clock, 100, max_claims=2)
    service.replica_ready.set()
    for i in range(6):
        core.add(make_pod(f"p{i}", cpu=500))
    loop = asyncio.ensure_future(service.run())
    try:
        for _ in range(3):  # each round: the owner holds what is out; nobody decides it
            await until(lambda: len(outbox.claims()) >= 2)
            held = owner_report("a", *outbox.claims())
            await service.on_state_changes([raw(r, 0, topics.STATE_CHANGES) for r in held])
            await asyncio.sleep(0.02)
        assert len(outbox.claims()) == 2 and core.state.assumptions == {}
        first, second = outbox.claims()
        decided = owner_report("a", first, second, Commit(uid=first.uid, attempt=0, node="a", decision_key=first.uid))
        await service.on_state_changes([raw(r, 0, topics.STATE_CHANGES) for r in decided])
        await until(lambda: len(outbox.claims()) == 3)
        core.requeue(Requeue(uid=second.uid, attempt=1, decision_key=second.uid))  # released and requeued
        service.wake.set()
        await until(lambda: len(outbox.claims()) == 4)
        await asyncio.sleep(0.02)
        assert len(outbox.claims()) == 4 and len(core.claims_out) == 2
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop


class FailingDeletions(FakeOutbox):
    """The broker does not acknowledge the first `failures` sends that carry a PodDeleted."""

    def __init__(self, failures: int = 1) -> None:
        super().__init__()
        self.failures = failures

    async def send(self, outputs: Sequence[Output]) -> list[Awaitable[object]]:
        if self.failures and any(isinstance(o.record, PodDeleted) for o in outputs):
            self.failures -= 1
            self.sent.append(list(outputs))
            ack: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            ack.set_exception(ConnectionError("the broker did not acknowledge"))
            self.acks.append(ack)
            return [ack]
        return await super().send(outputs)

    def deletions(self) -> list[str]:
        """The uids of the deletions sent and acknowledged, in order."""
        return [o.record.uid for batch, ack in zip(self.sent, self.acks, strict=True) if ack.exception() is None
                for o in batch if isinstance(o.record, PodDeleted)]


async def test_a_deletion_whose_send_fails_is_sent_again_and_no_offset_is_committed_past_it_meanwhile() -> None:
    """Issue 28 (suspected, confirmed): the core forgot the pod before the deletion was
    delivered; the send failed, and nothing sent it again while later records went on."""
    core, clock = make_core(make_node("a", cpu=4000))
    outbox = FailingDeletions()
    service = service_with(core, outbox, clock)
    service.on_partitions_assigned({0})
    p, q = uid_at(0, "p"), uid_at(0, "q")
    await service.on_inputs([raw(make_pod(p), 0, offset=0)])
    await service.on_inputs([raw(PodDeleted(uid=p), 0, offset=1)])  # not acknowledged: kept, no error
    assert p not in core.pods and outbox.deletions() == [] and service.commit_points() == {}
    await service.on_inputs([raw(make_pod(q, cpu=9000), 0, offset=2)])
    assert outbox.deletions() == [p]  # sent again first, before what came after it
    assert service.commit_points() == {(topics.PODS, 0): 2}


async def test_a_deletion_whose_send_failed_is_sent_again_by_the_loop_when_nothing_else_comes() -> None:
    core, clock = make_core(make_node("a", cpu=4000))
    outbox = FailingDeletions(failures=2)
    service = service_with(core, outbox, clock)
    service.on_partitions_assigned({0})
    service.retry_s = 0.01
    p = uid_at(0, "p")
    await service.on_inputs([raw(make_pod(p, cpu=9000), 0, offset=0), raw(PodDeleted(uid=p), 0, offset=1)])
    service.mark_replica_ready()
    loop = asyncio.ensure_future(service.run())
    try:
        await until(lambda: outbox.deletions() == [p])  # the loop's first try fails too
    finally:
        loop.cancel()
    assert service.failed_sends == 2 and service.commit_points() == {(topics.PODS, 0): 2}
