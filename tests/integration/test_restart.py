"""A worker killed outright is replaced by a new one that recovers the owners' and deciders'
tables from their changelogs: capacity committed before the crash stays committed, so the
cluster is not over-committed afterwards, and no pod is bound twice. The replacement also
re-reads pods whose offsets the first worker had not committed yet; they are already bound,
and must neither be bound again nor hold capacity the new pods need. A zombie's late write to
the changelog (an older generation) must not win the restore."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.errors import KafkaError

from agents.adapters.tables import PART
from agents.adapters.transactions import transactional_id
from perf.checker import Placement, check
from schemas import topics
from schemas.records import (
    Binding,
    GangTimeout,
    Held,
    Node,
    NodeStateChange,
    Pod,
    Rejected,
    Release,
    ResourceList,
    SchedulingFeedback,
)
from streams.broker import EmbeddedBroker
from streams.catalogue import TABLE_NODE_STATE, partition_for
from streams.kafka_broker import KafkaBroker
from streams.process import spawn_tied, stop
from streams.reader import read_to_end
from streams.settings import load_settings
from streams.worker import prepare
from tests.integration.harness import PARTITIONS, Harness

pytestmark = pytest.mark.integration
WORKER = [sys.executable, "-m", "cli.main", "worker"]
GANG = "gang.scheduling.koordinator.sh/"


Broker = EmbeddedBroker | KafkaBroker


async def worker_env(broker: Broker, **extra: str) -> dict[str, str]:
    """The environment of a worker on `broker`, its topics created."""
    env = {**os.environ, "KOORDSTREAM_KAFKA_BOOTSTRAP": broker.bootstrap,
           "KOORDSTREAM_KAFKA_PARTITIONS": str(PARTITIONS), **extra}
    await prepare(load_settings(env=env))
    return env


def progress(h: Harness) -> str:
    """Records seen per topic and kind: for diagnosing a replacement worker that does not resume."""
    kinds: dict[str, int] = {}
    for _, topic, record in h.collector.records:
        key = f"{topic}/{record.KIND}"
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))


async def bound_before(h: Harness, nodes: int, pods: int) -> tuple[list[Node], list[Pod]]:
    """`nodes` nodes of 4 CPUs and `pods` pods of one CPU named before-<i>, all bound."""
    made = [Node(name=f"r{i}", allocatable=ResourceList(cpu=4000, memory=2**34)) for i in range(nodes)]
    await h.publish(topics.NODES, made)
    await h.wait_for(NodeStateChange, lambda c: True, count=nodes, timeout=90)
    before = [Pod(uid=f"before-{i}", name=f"b{i}", requests=ResourceList(cpu=1000)) for i in range(pods)]
    await h.publish(topics.PODS, before)
    await h.wait_for(Binding, lambda b: b.uid.startswith("before-"), count=pods)
    return made, before


async def test_replacement_worker_recovers_committed_capacity(broker_factory: Callable[[], Broker]) -> None:
    async with broker_factory() as broker:
        env = await worker_env(broker)
        first = spawn_tied(WORKER, env=env)
        second = None
        try:
            async with Harness(broker.bootstrap) as h:
                nodes, before = await bound_before(h, 4, 12)

                # A zombie's late write: an older epoch, a high sequence number, and a state
                # in which r0 does not exist. (First let the worker's own changelog writes reach
                # the broker.)
                await asyncio.sleep(2.0)
                stale = {"epoch": -1, "seq": 10**6, "state": {
                    "name": "r0", "exists": False, "allocatable": {}, "unschedulable": False, "holds": {},
                    "nominations": {}, "tombstones": [], "seq": 10**6}}
                changelog = f"koordstream-{TABLE_NODE_STATE}-changelog"
                r0 = partition_for("r0", PARTITIONS)
                zombie = None
                if isinstance(broker, KafkaBroker):
                    # With transactions a zombie writes with the owners' transactional producer
                    # of r0's partition; the replacement's start fences it, so its write never
                    # commits (Kafka's compaction keeps the last record per key whatever its
                    # epoch, so the restore's (epoch, seq) rule could not drop it).
                    zombie = AIOKafkaProducer(bootstrap_servers=broker.bootstrap,
                                              transactional_id=transactional_id("koordstream", "owners",
                                                                                topics.NODE_INBOX, r0))
                else:
                    # Without transactions (Tansu keeps every record) the replacement's restore
                    # must drop it.
                    await h.producer.send_raw(changelog, orjson.dumps(stale), key=b"r0", partition=r0)
                first.send_signal(signal.SIGKILL)
                first.wait()
                if zombie is not None:
                    await zombie.start()
                second = spawn_tied(WORKER, env=env)

                after = [Pod(uid=f"after-{i}", name=f"a{i}", requests=ResourceList(cpu=1000)) for i in range(8)]
                await h.publish(topics.PODS, after)
                try:
                    await h.wait_for(Binding, lambda b: b.uid.startswith("after-"), count=4, timeout=60)
                except AssertionError as exc:  # this has failed now and then: say how far it got
                    raise AssertionError(f"{exc}; what reached the topics: {progress(h)}") from None
                if zombie is not None:  # the replacement runs: its producers fenced the zombie
                    with pytest.raises(KafkaError):
                        async with zombie.transaction():
                            await zombie.send(changelog, orjson.dumps(stale), key=b"r0", partition=r0)
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(zombie.stop(), 5)
                # The replacement re-reads every pod; until the owners report the commits its
                # predecessor's last batch made, it may claim a bound pod again (the decider
                # releases that claim) and briefly see less room. So wait for the end state:
                # four other pods told there is no room, and not bound.
                def unplaced(f: SchedulingFeedback) -> bool:
                    return f.uid.startswith("after-") and not h.seen(Binding, lambda b: b.uid == f.uid)

                deadline = asyncio.get_running_loop().time() + 30
                while len({f.uid for f in h.seen(SchedulingFeedback, unplaced)}) < 4:
                    assert asyncio.get_running_loop().time() < deadline, "no end state within 30 s"
                    await asyncio.sleep(0.1)

                bindings = h.seen(Binding)
                result = check({n.name: n.allocatable for n in nodes}, {p.uid: p.requests for p in before + after},
                               [Placement(i, b.uid, b.node) for i, b in enumerate(bindings)])
                assert result.pods_double_bound == 0 and result.nodes_overcommitted == 0, result.overcommitted
                assert result.pods_bound == 16  # 12 before the crash, and the 4 that still fit

                # Both owners wrote a node's holds one record each (the head carries none), so
                # what the replacement restored was assembled from them.
                records: list[tuple[bytes, dict | None]] = []
                await read_to_end(broker.bootstrap, [changelog], PARTITIONS,
                               lambda m: records.append((m.key, None if m.value is None else orjson.loads(m.value))))
                holds = {k.split(PART)[2].decode() for k, v in records if PART + b"holds" + PART in k and v}
                assert {f"{p.uid}/0/" for p in before} <= {h[:h.rindex("/") + 1] for h in holds}
                assert not [k for k, v in records if PART not in k and v and v["epoch"] >= 0 and "holds" in v["state"]]
        finally:
            for proc in (first, second):
                if proc is not None:
                    stop(proc, 5)


async def test_pending_pods_survive_a_scheduler_restart(broker_factory: Callable[[], Broker]) -> None:
    """A pod that fits nowhere waits in the scheduler's queue; the worker is killed; its
    replacement rebuilds the queue from the pods topic and places the pod once a node fits;
    with the input offsets committed (`scheduling.commit_input_offsets`), from where the pod is."""
    async with broker_factory() as broker:
        env = await worker_env(broker, KOORDSTREAM_SCHEDULING_COMMIT_INPUT_OFFSETS="true")
        first = spawn_tied(WORKER, env=env)
        second = None
        try:
            async with Harness(broker.bootstrap) as h:
                await h.publish(topics.NODES, [Node(name="small", allocatable=ResourceList(cpu=1000, memory=2**32))])
                await h.wait_for(NodeStateChange, lambda c: c.node == "small", timeout=90)
                fits = Pod(uid="fits", name="fits", requests=ResourceList(cpu=500))
                waits = Pod(uid="waits", name="waits", requests=ResourceList(cpu=3000))
                await h.publish(topics.PODS, [fits, waits])
                await h.wait_for(Binding, lambda b: b.uid == "fits")
                await h.wait_for(SchedulingFeedback, lambda f: f.uid == "waits")
                await asyncio.sleep(2.5)  # past the worker's offset commit interval
                # The scheduler committed what it no longer needs: all of the partitions of
                # `pods` but that of the pod still waiting, whose record it needs again.
                consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="koordstream",
                                            enable_auto_commit=False)
                await consumer.start()
                try:
                    tps = [TopicPartition(topics.PODS, p) for p in range(PARTITIONS)]
                    ends = await consumer.end_offsets(tps)
                    committed = {tp: await consumer.committed(tp) for tp in tps if ends[tp]}
                finally:
                    await consumer.stop()
                waiting = TopicPartition(topics.PODS, partition_for("waits", PARTITIONS))
                assert committed[waiting] is not None and committed[waiting] < ends[waiting]
                assert all(committed[tp] == ends[tp] for tp in committed if tp != waiting), (committed, ends)
                first.send_signal(signal.SIGKILL)
                first.wait()
                second = spawn_tied(WORKER, env=env)
                await h.publish(topics.NODES, [Node(name="large", allocatable=ResourceList(cpu=4000, memory=2**32))])
                try:
                    [binding] = await h.wait_for(Binding, lambda b: b.uid == "waits", timeout=90)
                except AssertionError as exc:  # this has failed now and then: say how far it got
                    raise AssertionError(f"{exc}; what reached the topics: {progress(h)}") from None
                assert binding.node == "large"
                await asyncio.sleep(1.0)
                assert len(h.seen(Binding, lambda b: b.uid == "fits")) == 1  # not bound again
        finally:
            for proc in (first, second):
                if proc is not None:
                    stop(proc, 5)


async def test_a_restarted_scheduler_knows_the_running_pods_after_their_reports_expired(tmp_path: Path) -> None:
    """Pods bound long ago run on; the worker is killed, and every report of `state-changes`
    is deleted (as retention would in time). The replacement's replica starts from the
    owners' changelog: it knows the nodes and what runs there, so it leaves the bound pods
    alone and places new ones only where they fit, none refused by an owner. (Read from
    `state-changes` alone, it would know no node at all.) Apache Kafka: DeleteRecords."""
    async with KafkaBroker(log_dir=tmp_path / "kafka") as broker:
        env = await worker_env(broker)
        first = spawn_tied(WORKER, env=env)
        second = None
        try:
            async with Harness(broker.bootstrap) as h:
                await bound_before(h, 2, 6)
                await asyncio.sleep(2.5)  # the last reports are written
                first.send_signal(signal.SIGKILL)
                first.wait()

                admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
                await admin.start()
                try:
                    tps = [TopicPartition(topics.STATE_CHANGES, p) for p in range(PARTITIONS)]
                    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
                    await consumer.start()
                    try:
                        ends = await consumer.end_offsets(tps)
                    finally:
                        await consumer.stop()
                    await admin.delete_records({tp: RecordsToDelete(before_offset=ends[tp]) for tp in tps})
                finally:
                    await admin.close()
                h.collector.records.clear()

                second = spawn_tied(WORKER, env=env)
                after = [Pod(uid=f"after-{i}", name=f"a{i}", requests=ResourceList(cpu=1000)) for i in range(4)]
                await h.publish(topics.PODS, after)
                try:
                    await h.wait_for(Binding, lambda b: b.uid.startswith("after-"), count=2, timeout=90)
                    await h.wait_for(SchedulingFeedback, lambda f: f.uid.startswith("after-"), count=2, timeout=30)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; what reached the topics: {progress(h)}") from None
                await asyncio.sleep(2.0)
                assert len(h.seen(Binding, lambda b: b.uid.startswith("after-"))) == 2
                assert not h.seen(Binding, lambda b: b.uid.startswith("before-"))  # not bound again
                assert not h.seen(Rejected)  # it claimed nothing an owner had to refuse
        finally:
            for proc in (first, second):
                if proc is not None:
                    stop(proc, 5)


def gang_in_partition(partition: int, run: str) -> str:
    """A gang name whose decision key (`default/<name>`) lands in `holds` partition `partition`."""
    for i in range(10_000):
        name = f"g{partition}-{run}-{i}"
        if partition_for(f"default/{name}", PARTITIONS) == partition:
            return name
    raise AssertionError("no gang name found")


async def wait_for_log(path: Path, pattern: str, timeout: float) -> re.Match[str]:
    """The first line of a worker's log matching `pattern`, waiting up to `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        for line in path.read_text(errors="replace").splitlines():
            found = re.search(pattern, line)
            if found:
                return found
        assert asyncio.get_running_loop().time() < deadline, f"no {pattern!r} in {path} within {timeout}s"
        await asyncio.sleep(0.2)


async def test_a_waiting_gang_times_out_after_its_partition_moves_to_a_running_worker(
        broker_factory: Callable[[], Broker], tmp_path: Path) -> None:
    """Two state workers share the deciders' partitions; a gang that cannot complete waits on
    each `holds` partition; the second worker leaves before any waiting time runs out, and its
    partitions move to the first one, which was already running: it must re-arm their timers
    (faust's recovery-completed event is set once and never cleared)."""
    async with broker_factory() as broker:
        env = await worker_env(broker, KOORDSTREAM_WORKER_LOGLEVEL="info")
        logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("scheduler", "a", "b")}
        procs: dict[str, subprocess.Popen[bytes]] = {}

        def start(name: str, roles: str) -> None:
            procs[name] = spawn_tied(WORKER, env={**env, "KOORDSTREAM_WORKER_ROLES": roles},
                                     stdout=logs[name], stderr=subprocess.STDOUT)

        try:
            start("scheduler", "scheduler")
            start("a", "state")
            async with Harness(broker.bootstrap) as h:
                node = Node(name="wide", allocatable=ResourceList(cpu=64_000, memory=2**36))
                await h.publish(topics.NODES, [node])
                await h.wait_for(NodeStateChange, lambda c: c.node == "wide", timeout=90)
                start("b", "state")
                found = await wait_for_log(tmp_path / "b.log", r"deciders: generation \d+, partitions \[(\d[^\]]*)\]", 90)
                moved = {int(p) for p in found.group(1).split(",")}
                # Let both workers finish restoring before the gangs arrive.
                await wait_for_log(tmp_path / "a.log", r"deciders: generation \d+, partitions \[(?!0, 1, 2, 3\])", 60)
                await asyncio.sleep(3.0)

                run = uuid.uuid4().hex[:6]
                names = {p: gang_in_partition(p, run) for p in range(PARTITIONS)}
                pods = []
                for name in names.values():
                    gang = {GANG + "name": name, GANG + "min-available": "3", GANG + "waiting-time": "15s"}
                    pods += [Pod(uid=f"{name}-{i}", name=f"{name}-{i}", annotations=gang,
                                 requests=ResourceList(cpu=100)) for i in range(2)]  # two of three members
                await h.publish(topics.PODS, pods)
                keys = {f"default/{name}" for name in names.values()}
                await h.wait_for(Held, lambda r: r.decision_key in keys, count=2 * PARTITIONS, timeout=60)
                for p in moved:  # b decided the gangs of its partitions and armed their timers
                    await wait_for_log(tmp_path / "b.log", rf"deciders: \d+ timers asked for by holds/{p}\b", 30)

                stop(procs.pop("b"), 10)  # leaves the group: its partitions go to a, already running
                await wait_for_log(tmp_path / "a.log", r"deciders: generation \d+, partitions \[0, 1, 2, 3\]", 60)
                deadline = asyncio.get_running_loop().time() + 60
                while {t.decision_key for t in h.seen(GangTimeout, topic=topics.HOLDS)} & keys != keys:
                    timed_out = {t.decision_key for t in h.seen(GangTimeout, topic=topics.HOLDS)} & keys
                    assert asyncio.get_running_loop().time() < deadline, f"timed out: {timed_out} of {keys}"
                    await asyncio.sleep(0.1)
                moved_keys = {f"default/{names[p]}" for p in moved}
                released = await h.wait_for(Release, lambda r: r.decision_key in moved_keys
                                            and "waiting time" in r.reason, count=2 * len(moved),
                                            topic=topics.NODE_INBOX, timeout=30)
                assert {r.uid.rsplit("-", 1)[0] for r in released} == {names[p] for p in moved}
                assert h.seen(Binding, lambda b: b.uid.rsplit("-", 1)[0] in names.values()) == []
        finally:
            for proc in procs.values():
                stop(proc, 5)
            for f in logs.values():
                f.close()
