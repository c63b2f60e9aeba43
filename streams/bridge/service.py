"""The bridge process (`koordstream bridge`, or the `bridge` role of a worker).

One bridge leads at a time (`lease.LeaderElection`); every record it publishes carries its
origin (`bridge`, with the time it took the Lease as the epoch), so that readers drop
what a deposed leader still writes. The leader:

0. reads back what the bridges published before (the records of that origin on `pods`, `nodes`,
   `disruption-budgets` and `sandbox`) into the `Mirror` (`Mirror.seed`), so that the first
   lists publish only what changed, and the deletions that happened while no bridge ran; and
   what `pods` says of the pools' sandbox pods (`sandboxes.SandboxPods`);
1. lists and then watches, in this order (each listed whole before the next starts, so that
   a node is first published knowing every pod that runs on it, and a pool before its
   claims): PodGroups, Koordinator Reservations, agent-sandbox's SandboxTemplates,
   SandboxWarmPools and SandboxClaims where their CRDs are installed, pods, nodes,
   PodDisruptionBudgets and ReplicaSets (`reflector.Reflector`); each batch of events goes through the `Mirror` and
   its records are published (acknowledged before the next batch); once all are listed, the
   pods koordstream's owners hold committed that the API server no longer has (deleted while
   no bridge led) are deleted and terminated (`Mirror.vanished`);
2. then consumes, each in a consumer group of its own so that a slow eviction never holds up a
   Binding, with `read_committed` (a decider's Binding counts only once its transaction
   committed): `bindings`; `evictions`; `feedback`, `reservations` and `pods` (for the
   rebalancer's deletion costs); `pods` again for the sandbox pods (created and deleted in the
   API server as their pools publish them); and `sandbox-status` (the claims' answers, written
   into their status). Only what concerns objects of the API server's (the pods the mirror
   holds, the pods of its pools, its claims) is carried out: pods that other producers publish
   straight onto the topics are not the bridge's to bind or evict. A sandbox pod's Binding
   creates the pod first when it is not there yet (its creation may be behind, on its own
   consumer), unless `pods` says it was deleted, or bound and since gone: then it is refused,
   never made again. Each batch is carried out (`actuator.Actuator`: calls in
   parallel within the client's rate limit and concurrency), what it reports is published and
   acknowledged, and only then are the batch's offsets committed. A bridge killed in between
   carries the batch out again: a Binding already done is recognised (same node, same hold
   id), an eviction of a pod gone is done, feedback is written again.

A failure of any part ends the term with its error: its Lease is released, and the bridge
campaigns again after a back-off; the next term lists everything afresh.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from agents.adapters.connection import KafkaConnection
from agents.intake import RawMessage, intake, origin_from_headers
from agents.ports import Origin, Output
from agents.rebalance.binpack import DELETION_COST
from agents.sandbox.templates import UID_MARK, is_pod_uid, pool_of
from agents.scheduler.core import SCHEDULER_NAMES
from agents.scheduler.framework import profiles as scheduler_profiles
from schemas import topics
from schemas.codec import decode_message
from schemas.errors import SchemaError
from schemas.records import (
    DEFAULT_SCHEDULER,
    Binding,
    EvictionCommand,
    EvictionRefused,
    Pod,
    PodDeleted,
    ReservationEvent,
    SandboxClaimDeleted,
    SandboxClaimStatus,
    SandboxPoolStatus,
    SchedulingFeedback,
)
from streams.bridge import sandboxes
from streams.bridge.actuator import Actuator
from streams.bridge.lease import LeaderElection
from streams.bridge.mirror import NODE, PDB, POD, PODGROUP, REPLICASET, RESERVATION, Mirror
from streams.bridge.reflector import Reflector
from streams.bridge.sandboxes import (
    CLAIM,
    TEMPLATE,
    WARMPOOL,
    SandboxPods,
    metadata_patch,
    pod_manifest,
    sandbox_uid,
)
from streams.catalogue import TABLE_NODE_STATE
from streams.connection import connect
from streams.kubeapi import KubeApi, KubeError, Limits
from streams.producer import RecordProducer
from streams.reader import read_to_end
from streams.settings import Settings

log = logging.getLogger("koordstream.bridge")

# (kind, apiVersion, list path); in the order they are listed.
WATCHED: tuple[tuple[str, str, str], ...] = (
    (PODGROUP, "scheduling.sigs.k8s.io/v1alpha1", "/apis/scheduling.sigs.k8s.io/v1alpha1/podgroups"),
    (RESERVATION, "scheduling.koordinator.sh/v1alpha1", "/apis/scheduling.koordinator.sh/v1alpha1/reservations"),
    (TEMPLATE, sandboxes.API_VERSION, f"/apis/{sandboxes.API_VERSION}/sandboxtemplates"),
    (WARMPOOL, sandboxes.API_VERSION, f"/apis/{sandboxes.API_VERSION}/sandboxwarmpools"),
    (CLAIM, sandboxes.API_VERSION, f"/apis/{sandboxes.API_VERSION}/sandboxclaims"),
    (POD, "v1", "/api/v1/pods"),
    (NODE, "v1", "/api/v1/nodes"),
    (PDB, "policy/v1", "/apis/policy/v1/poddisruptionbudgets"),
    (REPLICASET, "apps/v1", "/apis/apps/v1/replicasets"),
)
OPTIONAL = (PODGROUP, RESERVATION, TEMPLATE, WARMPOOL, CLAIM)  # CRDs: watched where installed
ORIGIN = "bridge"  # the origin of every record a bridge publishes (its epoch: when its leader took the Lease)
SANDBOX_WAIT_S = 120.0  # how long a sandbox pod's Binding waits for the pod's record on `pods`


def profile_names(path: str) -> frozenset[str]:
    """The schedulerNames of the profiles file at `path` (empty: the built-in profiles)."""
    if path:
        return frozenset(p.name for p in scheduler_profiles.load(Path(path).read_text()).profiles)
    return frozenset(SCHEDULER_NAMES)


def scheduler_names(settings: Settings) -> frozenset[str]:
    """The pods the bridge hands to koordstream: `bridge.scheduler_names`, or every profile of
    `scheduling.profiles` (the built-in ones without one) but `default-scheduler`, which
    kube-scheduler serves in a real cluster."""
    if settings.bridge.scheduler_names:
        return frozenset(settings.bridge.scheduler_names)
    return profile_names(settings.scheduling.profiles) - {DEFAULT_SCHEDULER}


def identity(settings: Settings) -> str:
    return settings.bridge.identity or f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class Bridge:
    """See the module docstring."""

    settings: Settings
    api: KubeApi
    profiles: frozenset[str]
    mirror: Mirror = field(init=False)
    actuator: Actuator = field(init=False)
    sandbox_pods: SandboxPods = field(default_factory=SandboxPods)
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # listed everything, consuming
    election: LeaderElection | None = None

    def __post_init__(self) -> None:
        self.mirror = Mirror(self.profiles)
        b = self.settings.bridge
        self.actuator = Actuator(self.api, instance=identity(self.settings), eviction_retry_s=b.eviction_retry_s,
                                 events=b.events, live_annotations=self._live_annotations, is_bound=self._is_bound,
                                 api_uid=lambda uid: self.mirror.api_uid(uid), pod_ips=self._pod_ips)

    def _pod_ips(self, uid: str) -> tuple[str, ...]:
        seen = self.mirror.pods.get(uid)
        return seen.ips if seen is not None else ()

    def _live_annotations(self, uid: str) -> dict[str, str] | None:
        seen = self.mirror.pods.get(uid)
        return dict(seen.record.annotations) if seen is not None and seen.record is not None else None

    def _is_bound(self, uid: str) -> bool:
        seen = self.mirror.pods.get(uid)
        return seen is not None and bool(seen.node)

    async def run(self) -> None:
        """Campaign for the Lease and lead while holding it. A term that fails (the broker
        unreachable for longer than a produce or a commit waits, a call the actuator does not
        retry) ends with its Lease released, and the bridge campaigns again after a back-off
        (doubling from 1 s to 30 s; 1 s again after a term that lasted a minute): its next
        term lists everything afresh, and `Mirror.vanished` finds what was deleted meanwhile.
        (It ended the process: a worker starts its bridge's process once, so a broker
        unreachable for 40 s left the cluster with no bridge.)"""
        b = self.settings.bridge
        backoff = 1.0
        while True:
            self.election = election = LeaderElection(self.api, identity(self.settings), namespace=b.lease_namespace,
                                      name=b.lease_name, duration_s=b.lease_duration_s,
                                      renew_deadline_s=b.renew_deadline_s, retry_s=b.retry_s)
            started = time.monotonic()
            try:
                await election.run(self.lead)
            except Exception as exc:  # noqa: BLE001 - any failure of a term: the next one starts afresh
                if time.monotonic() - started > 60:
                    backoff = 1.0
                log.error("the bridge's term failed (%s: %s); campaigning again in %.0f s", type(exc).__name__, exc,
                          backoff, exc_info=exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def lead(self) -> None:
        k = self.settings.kafka
        self.mirror = Mirror(self.profiles)  # every term starts from what was published and a full list
        self.sandbox_pods = SandboxPods()
        self.ready.clear()
        origin = Origin(ORIGIN, self.election.epoch if self.election is not None else 0)
        await read_back(connect(k), k.partitions, self.mirror, self.sandbox_pods)
        async with RecordProducer(connect(k), k.partitions) as producer:
            publish = self._publisher(producer, origin)
            tasks: list[asyncio.Task[None]] = []
            try:
                for kind, api_version, path in WATCHED:
                    if kind in OPTIONAL and not await self._served(api_version, kind):
                        log.info("%s (%s) is not served here: not watched", kind, api_version)
                        continue
                    if kind == PODGROUP:  # its members wait for it (Mirror._missing_group)
                        self.mirror.podgroups_watched = True
                    reflector = Reflector(
                        self.api, path, on_list=self._on_list(kind, publish), on_events=self._on_events(kind, publish),
                        timeout_s=self.settings.bridge.watch_timeout_s)
                    tasks.append(asyncio.create_task(reflector.run(), name=f"reflect {kind}"))
                    await _first_of(reflector.synced.wait(), tasks)
                await self._vanished(publish)
                tasks += [
                    asyncio.create_task(self._consume("bindings", [topics.BINDINGS], self._bindings, publish)),
                    asyncio.create_task(self._consume("evictions", [topics.EVICTIONS], self._evictions, publish)),
                    asyncio.create_task(self._consume("status", [topics.FEEDBACK, topics.RESERVATIONS, topics.PODS],
                                                      self._status, publish)),
                    asyncio.create_task(self._consume("sandbox-pods", [topics.PODS], self._sandbox_pods, publish)),
                    asyncio.create_task(self._consume("sandbox-status", [topics.SANDBOX_STATUS], self._claims,
                                                      publish)),
                ]
                self.ready.set()
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    task.result()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _vanished(self, publish: Callable[[list[Output]], Awaitable[None]]) -> None:
        """What was deleted while no bridge led (`Mirror.vanished`), from the owners' nodes as
        they are now (their changelog, read whole as a starting scheduler replica reads it)."""
        from agents.adapters.owners import current_reports  # (faust's side: only here)
        from agents.adapters.tables import ChangelogRecord, UnreadableState

        k = self.settings.kafka
        records: list[ChangelogRecord] = []

        def seen(m: Any) -> None:
            records.append((m.key, None if m.value is None else orjson.loads(m.value), m.partition))

        await read_to_end(connect(k), [f"{k.app_id}-{TABLE_NODE_STATE}-changelog"], k.partitions, seen)
        try:  # (in a thread: the Lease's renewals share this event loop)
            reports, _ = await asyncio.to_thread(current_reports, records)
        except UnreadableState as exc:
            log.error("the owners' changelog cannot be read (%s): pods deleted while no bridge led are not looked "
                      "for", exc)
            return
        out = self.mirror.vanished(reports, self.sandbox_pods.to_come)
        if out:
            log.info("%d pods bound by koordstream were deleted while no bridge led: deleted and terminated now",
                     len(out) // 2)
        await publish(out)

    async def _served(self, api_version: str, kind: str) -> bool:
        try:
            listing = await self.api.request("GET", f"/apis/{api_version}")
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.get("kind") == kind for r in listing.get("resources", ()))

    # -- in ------------------------------------------------------------------------------------

    def _publisher(self, producer: RecordProducer, origin: Origin) -> Callable[[list[Output]], Awaitable[None]]:
        async def publish(outputs: list[Output]) -> None:
            if outputs:
                futures = await producer.outbox.send([Output(o.topic, o.key, o.record, origin) for o in outputs])
                await producer.flush(futures)
                for o in outputs:
                    if isinstance(o.record, (PodDeleted, SandboxClaimDeleted)):
                        self.actuator.forget(o.record.uid)  # (what it wrote about a pod or claim gone)
                    if isinstance(o.record, PodDeleted):
                        self.sandbox_pods.deleted(o.record.uid)  # (never made again)
        return publish

    def _on_list(self, kind: str, publish: Callable[[list[Output]], Awaitable[None]]
                 ) -> Callable[[list[dict[str, Any]]], Awaitable[None]]:
        async def on_list(items: list[dict[str, Any]]) -> None:
            out: list[Output] = []
            for part in self.mirror.relisting(kind, items):  # the Lease's renewals run in between
                out += part
                await asyncio.sleep(0)
            await publish(out + self.mirror.flush_nodes())
        return on_list

    def _on_events(self, kind: str, publish: Callable[[list[Output]], Awaitable[None]]
                   ) -> Callable[[list[tuple[str, dict[str, Any]]]], Awaitable[None]]:
        async def on_events(events: list[tuple[str, dict[str, Any]]]) -> None:
            out: list[Output] = []
            sandboxes = set()
            for event, obj in events:
                out += self.mirror.apply(kind, event, obj)
                if kind == POD and event != "DELETED" and (uid := sandbox_uid(obj.get("metadata") or {})):
                    sandboxes.add(uid)
            await publish(out + self.mirror.flush_nodes())
            # (a pod created before its claim's metadata came; a pod's IPs, known once it runs)
            await asyncio.gather(*self._sandbox_metadata(sandboxes),
                                 *(self.actuator.sandbox_ips(u) for u in sandboxes if u in self.actuator.answers))
        return on_events

    # -- out -----------------------------------------------------------------------------------

    async def _bindings(self, messages: list[RawMessage]) -> list[Output]:
        got = intake(messages, expect=(Binding,))
        # (A reservation's Binding is not of a pod the mirror holds: its phase and node reach the
        # Reservation's status from its owner's ReservationEvents.)
        calls = []
        for b in got.records:
            if not isinstance(b, Binding):
                continue
            if b.uid in self.mirror.pods:
                calls.append(self.actuator.bind(b))
            elif is_pod_uid(b.uid) and self.mirror.sandboxes.pool_live(pool_of(b.uid) or ""):
                calls.append(self._bind_sandbox(b))
        results = await asyncio.gather(*calls)
        return [o for r in results for o in r] + got.dead_letters

    async def _bind_sandbox(self, b: Binding) -> list[Output]:
        """A Binding of a pool's sandbox pod that the mirror has not seen in the API server:
        the pod is created first (see the module docstring), unless it may not be."""
        seen = await self.sandbox_pods.wait(b.uid, SANDBOX_WAIT_S)
        if b.uid in self.mirror.pods:  # (seen meanwhile)
            return await self.actuator.bind(b)
        if seen is None or not seen.creatable() or seen.pod is None:
            why = "no record of the sandbox pod" if seen is None or seen.pod is None else "the sandbox pod is gone"
            return self.actuator.refused(b, why)
        api_uid = await self._create_sandbox(seen.pod)
        if not api_uid:
            return self.actuator.refused(b, "the sandbox pod cannot be created")
        return await self.actuator.bind(b, api_uid=api_uid)

    async def _create_sandbox(self, pod: Pod) -> str:
        """Create a sandbox pod from its template's spec; its uid in the API server, else "". Not
        a pod of another scheduler (a template without koordstream's `schedulerName`): koordstream's
        scheduler refuses it (the pool hears why), and in the API server another would bind it
        behind its pool's back."""
        spec = self.mirror.sandboxes.spec_for(pod)
        if spec is None or pod.scheduler_name not in self.profiles:
            log.warning("sandbox pod %s/%s not created: %s", pod.namespace, pod.name,
                        "no pod spec of its template is known" if spec is None else
                        f"its scheduler {pod.scheduler_name!r} is none of koordstream's")
            return ""
        return await self.actuator.create_sandbox(pod.uid, pod_manifest(pod, spec))

    async def _evictions(self, messages: list[RawMessage]) -> list[Output]:
        got = intake(messages, expect=(EvictionCommand, EvictionRefused))
        commands = [e for e in got.records if isinstance(e, EvictionCommand) and e.uid in self.mirror.pods]
        results = await asyncio.gather(*(self.actuator.evict(e) for e in commands))
        return [o for r in results for o in r] + got.dead_letters

    async def _status(self, messages: list[RawMessage]) -> list[Output]:
        # Not decoded: the bridge's own records on `pods` (its origin; most of what that topic
        # carries). Dead letters: the agents that own these topics send them.
        got = intake(m for m in messages if m.origin is None or m.origin.source != ORIGIN)
        calls = []
        last_feedback: dict[str, SchedulingFeedback] = {}
        for r in got.records:
            if isinstance(r, SchedulingFeedback):
                if r.uid in self.mirror.pods:  # (pods of the API server's only)
                    last_feedback[r.uid] = r  # of several in one batch, the last says it
            elif isinstance(r, ReservationEvent):
                calls.append(self.actuator.reservation(r))
            elif isinstance(r, Pod) and r.node_name and DELETION_COST in r.annotations:
                calls.append(self.actuator.deletion_cost(r))
        calls += [self.actuator.feedback(f) for f in last_feedback.values()]
        await asyncio.gather(*calls)
        return []

    async def _sandbox_pods(self, messages: list[RawMessage]) -> list[Output]:
        """The pools' sandbox pods on `pods`: each created in the API server when its pool
        publishes it, deleted when its pool deletes it (of the API server's pools, or pods the
        mirror holds), what happened last to each in the batch only."""
        touched: set[str] = set()
        for m in messages:
            if m.value is None or UID_MARK not in m.value:
                continue
            by_bridge = m.origin is not None and m.origin.source == ORIGIN
            for i, record in enumerate(decode_message(m.value)):
                if isinstance(record, (Pod, PodDeleted)) and is_pod_uid(record.uid):
                    self.sandbox_pods.read(record, by_bridge, m.offset, i)  # (read before: by the read-back)
                    touched.add(record.uid)
        calls: list[Awaitable[object]] = []
        for uid in touched:  # what `pods` says of it now, whatever record was read
            seen, wanted = self.mirror.pods.get(uid), self.sandbox_pods.pods[uid]
            live = self.mirror.sandboxes.pool_live(pool_of(uid) or "")
            if wanted.deleted and (seen is not None or live):
                calls.append(self.actuator.delete_sandbox(uid, wanted.namespace, wanted.name,
                                                          seen.api_uid if seen is not None else ""))
            elif seen is None and live and wanted.creatable() and wanted.pod is not None:
                calls.append(self._create_sandbox(wanted.pod))
        calls += self._sandbox_metadata(touched)
        await asyncio.gather(*calls)
        return []

    def _sandbox_metadata(self, uids: Iterable[str]) -> list[Awaitable[object]]:
        """Writes of what the pool's record of each sandbox pod has and the pod in the API server
        lacks of labels and annotations (its claim's: see `sandboxes.metadata_patch`)."""
        calls: list[Awaitable[object]] = []
        for uid in uids:
            wanted, seen = self.sandbox_pods.pods.get(uid), self.mirror.pods.get(uid)
            if wanted is None or wanted.pod is None or wanted.deleted or seen is None or seen.live is None:
                continue
            patch = metadata_patch(wanted.pod, seen.live)
            if patch is not None:
                calls.append(self.actuator.sandbox_metadata(wanted.pod, seen.api_uid, patch))
        return calls

    async def _claims(self, messages: list[RawMessage]) -> list[Output]:
        """The pools' answers to the API server's claims, written into them, and the pools'
        depth into the API server's pools (the last of each claim and pool in the batch)."""
        last: dict[str, SandboxClaimStatus] = {}
        depth: dict[tuple[str, str], SandboxPoolStatus] = {}
        for r in intake(messages).records:
            if isinstance(r, SandboxClaimStatus) and self.mirror.sandboxes.claim_live(r.uid):
                last[r.uid] = r
            elif isinstance(r, SandboxPoolStatus):
                depth[(r.namespace, r.name)] = r
        pools = [(s, uid) for s in depth.values() if (uid := self.mirror.sandboxes.pool_uid(s.namespace, s.name))]
        await asyncio.gather(*(self.actuator.claim_status(s) for s in last.values()),
                             *(self.actuator.pool_status(s, uid) for s, uid in pools))
        return []

    async def _consume(self, name: str, topic_names: Sequence[str],
                       handle: Callable[[list[RawMessage]], Awaitable[list[Output]]],
                       publish: Callable[[list[Output]], Awaitable[None]]) -> None:
        k = self.settings.kafka
        consumer = connect(k).consumer(
            group_id=f"{k.app_id}-bridge-{name}",
            enable_auto_commit=False, auto_offset_reset="earliest", isolation_level="read_committed",
            session_timeout_ms=int(k.session_timeout_s * 1000), rebalance_timeout_ms=int(k.rebalance_timeout_s * 1000),
            fetch_max_wait_ms=k.fetch_max_wait_ms, max_poll_records=self.settings.scheduling.batch_size)
        consumer.subscribe(list(topic_names))
        await consumer.start()
        try:
            while True:
                batches = await consumer.getmany(timeout_ms=500, max_records=self.settings.scheduling.batch_size)
                if not batches:
                    continue
                messages = [RawMessage(m.value, m.topic, m.partition, m.offset, origin_from_headers(m.headers),
                                       m.timestamp / 1000) for msgs in batches.values() for m in msgs]
                await publish(await handle(messages))
                await consumer.commit({tp: msgs[-1].offset + 1 for tp, msgs in batches.items() if msgs})
        finally:
            await consumer.stop()


async def read_back(kafka: KafkaConnection, partitions: int, mirror: Mirror,
                    sandbox_pods: SandboxPods | None = None) -> int:
    """Seed `mirror` with the records a bridge published (its origin) on `pods`, `nodes`,
    `disruption-budgets` and `sandbox`, in log order per key, and `sandbox_pods` with every
    record of a sandbox pod on `pods`; how many records were seeded."""
    seen = 0

    def one(message: Any) -> None:
        nonlocal seen
        origin = origin_from_headers(message.headers)
        ours = origin is not None and origin.source == ORIGIN
        sandbox = sandbox_pods is not None and message.topic == topics.PODS and UID_MARK in (message.value or b"")
        if not ours and not sandbox:
            return
        for i, record in enumerate(decode_message(message.value)):
            if isinstance(record, SchemaError):
                continue
            if sandbox and sandbox_pods is not None:
                sandbox_pods.read(record, ours, message.offset, i)
            if ours:
                mirror.seed(record)
                seen += 1

    await read_to_end(kafka, [topics.PODS, topics.NODES, topics.DISRUPTION_BUDGETS, topics.SANDBOX], partitions, one)
    return seen


async def _first_of(wait: Awaitable[Any], tasks: list[asyncio.Task[None]]) -> None:
    """Wait for `wait`, unless a task fails first (its error is raised)."""
    waiter = asyncio.ensure_future(wait)
    done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if waiter not in done:
        waiter.cancel()
        for task in done:
            task.result()
        raise RuntimeError("a watch ended before its list was read")


async def run_bridge(settings: Settings, stopping: asyncio.Event | None = None) -> None:
    """The bridge until `stopping` is set (or it fails)."""
    b = settings.bridge
    api = await KubeApi.connect(b.kubeconfig, b.context, Limits(qps=b.qps, burst=b.burst, concurrency=b.concurrency))
    bridge = Bridge(settings, api, scheduler_names(settings))
    log.info("bridge %s: pods of %s, API server %s", identity(settings), ", ".join(sorted(bridge.profiles)),
             api.server)
    try:
        runner = asyncio.create_task(bridge.run())
        waits = [runner] + ([asyncio.create_task(stopping.wait())] if stopping is not None else [])
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if runner in done:
            runner.result()
    finally:
        await api.close()

