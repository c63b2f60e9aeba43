"""A deleted pod's deletion reaches the decider that decided it (DESIGN.md, rules 5 and 7), also
at a scheduler replica that restarted or took the pod's partition over: one that re-reads the
pod only once it is bound (or a later version whose labels changed), or reads its deletion and
nothing before it. Gang pods are the case that matters: their decider is the gang's, and a
deletion record carries no gang annotation (the harnesses publish deletions that way)."""

from __future__ import annotations

import asyncio
import dataclasses

from agents.scheduler.agent import SchedulerService
from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.state.owner import COMMITTED, TERMINATED, NodeOwner
from agents.state.resources import ResourceSpace
from schemas import topics
from schemas.codec import decode_message, encode
from schemas.records import BoundPod, NodeStateChange, Pod, PodDeleted, ResourceList
from streams.catalogue import partition_for
from tests.builders import make_node
from tests.pipeline import Cluster
from tests.unit.test_scheduler_edges import FakeOutbox, N, raw, until

GANG = "gang.scheduling.koordinator.sh/"


def member(uid: str, **changes: object) -> Pod:
    pod = Pod(uid=uid, name=uid, namespace="default", requests=ResourceList(cpu=1000),
              annotations={GANG + "name": "train", GANG + "min-available": "2"})
    return dataclasses.replace(pod, **changes)  # type: ignore[arg-type]


def bound_gang() -> Cluster:
    """Gang `default/train` (a, b) bound on n1, by the pipeline's first scheduler replica."""
    cluster = Cluster(make_node("n1", cpu=4000))
    cluster.add(member("a"))
    cluster.add(member("b"))
    cluster.settle()
    assert cluster.bindings == {"a": "n1", "b": "n1"} and cluster.used("n1")["cpu"] == 2000
    return cluster


def restarted(cluster: Cluster) -> SchedulerCore:
    """A new replica in place of the first (a restart, or the partition's new owner): it starts
    from the owners' reports of the nodes as they are now, reads nothing else yet."""
    space = cluster.core.space
    core = SchedulerCore(space, ClusterState(space), lambda: cluster.now)
    core.apply_state_changes([NodeOwner.current(s) for s in cluster.nodes.values()], current=True)
    cluster.cores[0] = cluster.core = core
    return core


def statuses(cluster: Cluster) -> dict[str, str]:
    return {hid: str(h.status) for hid, h in cluster.nodes["n1"].holds.items()}


def test_a_bound_gang_pod_re_read_after_a_restart_and_deleted_frees_its_capacity() -> None:
    """Issue 28, item 1: `add` returned early for a bound pod before recording its decision key,
    so the deletion (no gang annotation) went to decider `a`: no PodTerminated, the hold stayed
    committed, and the node showed 2000m used for 1000m of pods, for ever."""
    cluster = bound_gang()
    core = restarted(cluster)
    assert core.add(member("a")) == []  # re-read from `pods`: bound, nothing to place
    out = core.delete(PodDeleted(uid="a", name="a"))  # as the harnesses publish it
    assert [(o.topic, o.key) for o in out] == [(topics.HOLDS, "default/train")]
    cluster.route(out)
    assert statuses(cluster) == {"a/0/n1": TERMINATED, "b/0/n1": COMMITTED}
    assert cluster.used("n1")["cpu"] == 1000
    assert "a" not in core.decision_keys  # and the deleted pod left the replica's maps


def test_a_deletion_with_no_pod_record_before_it_at_the_replica_takes_the_key_from_the_owners_reports() -> None:
    """The replica read from a committed offset past the bound pod's records (or the pod was
    forwarded to it): the owners' report of the committed hold carries the claim's decision key."""
    cluster = bound_gang()
    core = restarted(cluster)
    out = core.delete(PodDeleted(uid="a", name="a"))
    assert [(o.topic, o.key) for o in out] == [(topics.HOLDS, "default/train")]
    cluster.route(out)
    assert statuses(cluster)["a/0/n1"] == TERMINATED and cluster.used("n1")["cpu"] == 1000


def test_the_key_the_pod_was_decided_under_wins_over_a_later_versions_labels() -> None:
    """A live pod's labels can change: after a restart the first version this replica reads may
    be one without the gang annotation; the committed hold's key is the one its decider has."""
    cluster = bound_gang()
    core = restarted(cluster)
    core.add(member("a", annotations={}, node_name="n1"))
    cluster.route(core.delete(PodDeleted(uid="a", name="a")))
    assert statuses(cluster)["a/0/n1"] == TERMINATED


def test_a_bound_pod_first_read_with_its_node_name_keeps_its_first_versions_key() -> None:
    """Rule 5 at a replica whose state-changes feed is behind: the pod's bound version read
    first fixes the key, a later version without the annotation does not move it."""
    space = ResourceSpace()
    core = SchedulerCore(space, ClusterState(space), lambda: 0.0)
    core.add(member("a", node_name="n1"))
    core.add(member("a", annotations={}, node_name="n1"))
    [out] = core.delete(PodDeleted(uid="a", name="a"))
    assert out.key == "default/train" and core.decision_keys == {} and core._gang_members == {}


def test_the_committed_pods_decision_key_travels_in_the_report_and_old_reports_still_decode() -> None:
    cluster = bound_gang()
    report = NodeOwner.current(cluster.nodes["n1"])
    assert {p.uid: p.decision_key for p in report.committed} == {"a": "default/train", "b": "default/train"}
    old = encode(dataclasses.replace(report, committed=(BoundPod(uid="a"),))).replace(b',"decision_key":""', b"")
    [decoded] = decode_message(old)
    assert isinstance(decoded, NodeStateChange) and decoded.committed[0].decision_key == ""


async def test_a_deletion_read_before_the_replica_caught_up_waits_for_the_owners_reports() -> None:
    """A restarted replica reads `pods` while its state-changes feed is still catching up: a
    deletion of a pod it knows nothing of waits until the reports can say whose it is, and no
    input offset is committed past it meanwhile."""
    cluster = bound_gang()
    space = cluster.core.space
    core = SchedulerCore(space, ClusterState(space), lambda: cluster.now)
    outbox = FakeOutbox()
    service = SchedulerService(core, outbox, lambda: cluster.now, 100, partitions=N)
    service.commit_inputs = True
    home = partition_for("a", N)
    service.on_partitions_assigned({home})
    await service.on_inputs([raw(PodDeleted(uid="a", name="a"), home, offset=7)])
    assert [o for o in outbox.outputs() if o.topic == topics.HOLDS] == []
    assert service.commit_points() == {}
    service.on_current_state([NodeOwner.current(s) for s in cluster.nodes.values()])
    service.mark_replica_ready()
    loop = asyncio.ensure_future(service.run())
    try:
        await until(lambda: any(o.topic == topics.HOLDS for o in outbox.outputs()))
    finally:
        loop.cancel()
    [sent] = [o for o in outbox.outputs() if o.topic == topics.HOLDS]
    assert sent.key == "default/train"
    assert service.commit_points() == {(topics.PODS, home): 8}
    cluster.route([sent])
    assert statuses(cluster)["a/0/n1"] == TERMINATED

