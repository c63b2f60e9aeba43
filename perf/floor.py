"""The protocol's floor: what the commit protocol's records alone cost, with no decision taken.

The no-op limit (`perf.noop`) moves each pod through one hop. The commit protocol (DESIGN.md)
asks more of every pod, whatever the scheduler decides: a Claim to the node's inbox, a Held
to the decider, a Commit acknowledged before the Binding, the Binding, a report per touched
node per batch for the commits (read by every scheduler replica; a batch that only held claims
reports with the node's next one, as the owners do),
and the owners' and the deciders' table writes, acknowledged before a batch's outputs. This
module moves the same pods through exactly those records and waits, on the same broker, with
the same client (aiokafka), codec, producer (`RecordProducer`) and micro-batch size as the
workers, in two processes as the workers run (a scheduler, and a state process with the
owners and deciders), and decides nothing: every claim is held, on nodes taken in turn.

It is cheaper than the workers on every count (raw aiokafka instead of faust, reports
without totals or committed pods, one table record per node and per pod, one acknowledgement
wave per kind of write), so its pods per second, over the no-op limit in the same run, bound
the ratio a run of the real workers can reach on that machine and broker.

`protocol_floor` runs it and returns pods per second from the first pod published to the last
Binding read back, and the CPU its two processes used per pod; `python -m perf.floor
scheduler|state ...` are those processes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.ports import Output, deliver
from perf.collector import Collector
from schemas.codec import decode_message
from schemas.records import Binding, Claim, Commit, Held, NodeStateChange, Pod
from streams.admin import ensure_topics
from streams.catalogue import TopicSpec
from streams.connection import KafkaConnection, connect
from streams.process import spawn_tied, stop, tune_gc
from streams.producer import RecordProducer
from streams.settings import WorkerSettings, load_settings

TOPICS = ("pods", "inbox", "holds", "state", "bindings", "owners", "deciders")


def topic_names(run: str) -> dict[str, str]:
    return {name: f"floor-{name}-{run}" for name in TOPICS}


class Floor(NamedTuple):
    pods_per_s: float  # 0.0 when it did not finish in time
    cpu_us_per_pod: float  # the two processes' CPU (user + system) over the pods


async def protocol_floor(kafka: KafkaConnection | str, partitions: int, pods: Sequence[Pod], nodes: int, batch: int = 1000,
                         timeout_s: float = 120.0, env: Mapping[str, str] | None = None) -> Floor:
    """Pods per second through the protocol's records with no decisions, and its CPU per pod.
    `env`: variables for the two processes beside this one's, e.g. the security settings they
    log in with (`streams.connection.child_env`)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # its processes' CPU counts once they are reaped
    run = uuid.uuid4().hex[:8]
    names = topic_names(run)
    conn = KafkaConnection.of(kafka)
    await ensure_topics(conn, [TopicSpec(n, "as the protocol's", partitions) for n in names.values()])
    args = ["--bootstrap", conn.bootstrap, "--run", run, "--partitions", str(partitions), "--nodes", str(max(nodes, 1)),
            "--batch", str(batch)]
    procs = [spawn_tied([sys.executable, "-m", "perf.floor", role, *args], stdout=subprocess.PIPE,
                        env={**os.environ, **(env or {})})
             for role in ("scheduler", "state")]
    collector = Collector(conn, [names["bindings"]], partitions)
    try:
        for proc in procs:  # each prints one line once its consumer and producer are up
            assert proc.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60.0)
            if line.strip() != b"ready":
                raise ChildProcessError(f"perf.floor: a process ended before it was ready (exit {proc.poll()})")
        await collector.start()
        async with RecordProducer(conn, partitions) as producer:
            start = time.perf_counter()
            await producer.flush(await producer.publish(names["pods"], pods))
            deadline = time.monotonic() + timeout_s
            bound: set[str] = set()  # the pods with a Binding (the topic holds Bindings only)
            read = 0
            elapsed = 0.0
            while len(bound) < len(pods):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    break
                await asyncio.sleep(0.01)
                new = collector.records[read:]
                read += len(new)
                bound.update(getattr(r, "uid", "") for _, _, r in new)
            else:
                elapsed = time.perf_counter() - start
    finally:
        await collector.stop()
        for proc in procs:
            stop(proc, deadline_s=2.0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    return Floor(round(len(pods) / elapsed, 1) if elapsed else 0.0, round(cpu_s / max(len(pods), 1) * 1e6, 1))


async def _consumer(kafka: KafkaConnection, topic_list: Sequence[str], partitions: int) -> AIOKafkaConsumer:
    consumer = kafka.consumer(group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                              fetch_max_wait_ms=20)
    await consumer.start()
    consumer.assign([TopicPartition(t, p) for t in topic_list for p in range(partitions)])
    return consumer


async def _scheduler(producer: RecordProducer, consumer: AIOKafkaConsumer, names: dict[str, str], nodes: int,
                     batch: int) -> None:
    """Each Pod becomes a Claim on the next node; the owners' reports are read and dropped."""
    placed = 0
    while True:
        claims: list[Output] = []
        for messages in (await consumer.getmany(timeout_ms=20, max_records=batch)).values():
            for m in messages:
                for r in decode_message(m.value):
                    if isinstance(r, Pod):
                        node = f"floor-node-{placed % nodes}"
                        placed += 1
                        claims.append(Output(names["inbox"], node, Claim(
                            uid=r.uid, attempt=0, node=node, decision_key=r.uid, requests=r.requests,
                            priority=r.priority, namespace=r.namespace, name=r.name,
                            creation_timestamp=r.creation_timestamp)))
        if claims:
            await producer.outbox.send(claims)


async def _state(producer: RecordProducer, consumer: AIOKafkaConsumer, names: dict[str, str], batch: int) -> None:
    """Owners and deciders without decisions: a Claim is held, a Held committed, a Commit
    applied; the tables' writes are acknowledged before the outputs, the Commits before the
    Bindings."""
    seq = 0
    unreported: dict[str, dict[str, str]] = {}  # a node's holds of batches that only held claims
    while True:
        reports: dict[str, dict[str, str]] = {}
        outputs: list[Output] = []
        accepted: list[Held] = []
        for messages in (await consumer.getmany(timeout_ms=20, max_records=batch)).values():
            for m in messages:
                for r in decode_message(m.value):
                    if isinstance(r, Claim):
                        reports.setdefault(r.node, {})[r.hold_id] = "held"
                        outputs.append(Output(names["holds"], r.decision_key, Held(
                            uid=r.uid, attempt=r.attempt, node=r.node, decision_key=r.decision_key,
                            namespace=r.namespace, name=r.name, scheduled_at=r.scheduled_at)))
                    elif isinstance(r, Commit):
                        reports.setdefault(r.node, {})[r.hold_id] = "committed"
                    elif isinstance(r, Held):
                        accepted.append(r)
                        outputs.append(Output(names["inbox"], r.node, Commit(
                            uid=r.uid, attempt=r.attempt, node=r.node, decision_key=r.decision_key)))
        if not outputs and not reports:
            continue
        seq += 1
        written = {node: NodeStateChange(node=node, seq=seq, holds=holds) for node, holds in reports.items()}
        changes = {}
        for node, holds in reports.items():
            if all(status == "held" for status in holds.values()):
                unreported.setdefault(node, {}).update(holds)
            else:
                changes[node] = NodeStateChange(node=node, seq=seq, holds={**unreported.pop(node, {}), **holds})
        await deliver(producer.outbox, [Output(names["owners"], n, c) for n, c in written.items()]
                     + [Output(names["deciders"], h.decision_key, h) for h in accepted])
        await deliver(producer.outbox, outputs + [Output(names["state"], n, c) for n, c in changes.items()])
        await deliver(producer.outbox, [Output(names["bindings"], h.uid, Binding(
            uid=h.uid, namespace=h.namespace, name=h.name, node=h.node, attempt=h.attempt,
            decision_key=h.decision_key)) for h in accepted])


async def _serve(role: str, kafka: KafkaConnection, run: str, partitions: int, nodes: int, batch: int) -> None:
    names = topic_names(run)
    inputs = [names["pods"], names["state"]] if role == "scheduler" else [names["inbox"], names["holds"]]
    consumer = await _consumer(kafka, inputs, partitions)
    try:
        async with RecordProducer(kafka, partitions) as producer:
            print("ready", flush=True)
            if role == "scheduler":
                await _scheduler(producer, consumer, names, nodes, batch)
            else:
                await _state(producer, consumer, names, batch)
    finally:
        await consumer.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m perf.floor", description=__doc__)
    p.add_argument("role", choices=("scheduler", "state"))
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--batch", type=int, default=1000)
    a = p.parse_args(argv)
    tune_gc(WorkerSettings().gc_threshold)  # as the workers collect
    # The security settings come from the environment, as a worker's do.
    kafka = connect(load_settings(kafka={"bootstrap": a.bootstrap}).kafka)
    asyncio.run(_serve(a.role, kafka, a.run, a.partitions, a.nodes, a.batch))


if __name__ == "__main__":
    main()
