"""The scheduler service: the pods/requeue agent's work and the scheduling loop (its faust
registration is `agents.adapters.scheduler`).

The agent only decodes and enqueues (pods, deletions, requeues); the loop places ready pods
in micro-batches whenever the queue has work, and wakes on new pods, on cluster events from
the replica feed, and when a backoff expires. `SchedulerService.on_state_changes` is called
by the replica feed in `streams` (it reads every `state-changes` partition, no group).

Profiling: about once a second while it schedules, the loop publishes on `profiling` one
ProfilingSample per (profile, plugin, extension point) with the time spent there since the
last ones (the frameworks' own timings; nothing is sampled when nothing ran), and one
AttemptsSample per (profile, result) with the scheduling attempts made since (for scheduled,
how many of those pods were placed as members of an equivalence class: `SchedulerCore.batched`).

The edges (DESIGN.md, safety rules 4 and 11):

- Partitions. Several replicas share `pods` / `requeue` in one consumer group (co-partitioned:
  a pod's Requeue is keyed by its uid, like the pod). `on_partitions_revoked` stops placing
  the pods of a partition at once (`SchedulerCore.revoke`) and drops messages of it that were
  fetched before; `on_partitions_assigned` takes the whole new assignment (and revokes what it
  no longer names). A partition (re)assigned is read from the offset committed for it
  ("Input offsets" below), like after a restart. `agents.adapters.scheduler.register`
  connects both to faust's rebalance signals.
- Acknowledgements. The loop does not wait for a batch's acks before placing the next one,
  but at most `max_in_flight` batches are unacknowledged at once; each batch is sent per
  destination partition, and the claims of a destination whose send failed go back to the
  queue (`SchedulerCore.unclaim`): without it a pod would stay claimed with no claim anywhere.
  What an input batch produces (deletions for the deciders, forwards, feedback) is acknowledged
  before the batch counts as handled; a send that fails keeps it in `to_forward`, sent again
  first (by the next batch, or the loop within `retry_s`), and no input offset is committed
  meanwhile: the core has forgotten a deleted pod, so nothing else would send its deletion.
- Deletions (DESIGN.md, rules 5 and 7) go to the key the pod was decided under
  (`SchedulerCore.known_key`: the owners' reports carry it for committed pods). One read
  before the replica caught up with the reports, of a pod this replica knows nothing of (its
  records before the committed offset, or forwarded), waits in `deferred` until it did.
- Outstanding claims (`scheduling.max_outstanding_claims`, `room_for_claims`): counted until
  decided (`SchedulerCore.claims_out`), held ones included.
- Fencing. Requeues carry their decider's origin (source, epoch); an `EpochFence` per input
  partition drops a zombie decider's (an older epoch after a newer one, in that partition's
  log order, so a partition read again from its start is fenced afresh).
- Any producer's partitioner. A Pod, Reservation or PodDeleted read on a partition other than
  its uid's murmur2 partition (librdkafka's default partitioner is not murmur2) is forwarded
  to its own partition of `pods` and not scheduled here: the replica that owns that partition
  schedules it and gets its Requeues. The forward is acknowledged before the batch counts as
  handled. While the partition is held (below), a Pod or Reservation is forwarded only once the
  partition is caught up, and not when its deletion came meanwhile: a re-read from the first
  record would otherwise send home pods deleted long ago.
- The catch-up gate (`hold`, `catch_up`, `reread`): a `pods` partition read from its first
  record places none of its pods until read to where it ended when assigned, and as far as
  any earlier pass (docs/architecture.md, "How long state is kept").
- Claims are stamped with the wall time their cycle began (`Claim.scheduled_at`).
- Input offsets (`commit_points`; committed with `scheduling.commit_input_offsets`, on
  by default). Per partition of `pods` / `requeue`, the replica commits
  the offset before which no record is needed any more: the first record of every pod it
  still tracks (queued, claimed and not yet bound, waiting), else how far it read and handled
  (forwards acknowledged). A replica that takes the partition over, or a restarted one, reads
  from there: what is live, not the partition's history. Nothing is committed for a held
  partition, or while forwards wait. Bound pods come from the replica's state, deleted and
  finally refused ones are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Iterable, Sequence

from agents.intake import EpochFence, RawMessage, intake
from agents.ports import Clock, Outbox, Output, deliver
from agents.scheduler.core import FAILED, SchedulerCore
from schemas import topics
from schemas.partitioner import partition_for
from schemas.records import (
    AttemptsSample,
    Claim,
    NodeStateChange,
    Pod,
    PodDeleted,
    ProfilingSample,
    Record,
    Requeue,
    Reservation,
    replace,
)

PROFILING_EVERY_S = 1.0
RETRY_S = 1.0  # a failed send of outputs that must not be lost is tried again this soon
MAX_IN_FLIGHT = 4  # batches sent and not yet acknowledged
log = logging.getLogger("koordstream.scheduler")


def stamped(outputs: list[Output], started: float) -> list[Output]:
    """The cycle's claims with the wall time it began (`Claim.scheduled_at`)."""
    return [Output(o.topic, o.key, replace(o.record, scheduled_at=started)) if isinstance(o.record, Claim) else o
            for o in outputs]


class SchedulerService:
    def __init__(self, core: SchedulerCore, outbox: Outbox, clock: Clock, batch_size: int, *,
                 partitions: int | None = None, max_in_flight: int = MAX_IN_FLIGHT, wall: Clock = time.time,
                 linger_s: float = 0.0, max_claims: int = 0) -> None:
        self.core = core
        self.outbox = outbox
        self.clock = clock
        self.wall = wall  # stamps claims (`Claim.scheduled_at`): compared with log times elsewhere
        self.batch_size = batch_size
        self.linger_s = linger_s  # `scheduling.cycle_linger_s`: see `run`
        self.max_claims = max_claims  # `scheduling.max_outstanding_claims`: see `room_for_claims`
        # Partitions of `pods` / `requeue`: records read elsewhere than their uid's partition are
        # forwarded home. None (no re-keying) until known: `register` sets it from the config.
        self.partitions = partitions
        self.max_in_flight = max_in_flight
        self.owned: set[int] = set()  # the last assignment reported
        self.revoked: set[int] = set()  # revoked and not assigned again: their messages are stale
        self.input_fences: dict[int, EpochFence] = {}  # per input partition: zombie deciders' requeues
        # The catch-up gate (`hold`): per held partition of `pods`, the offset it must be read
        # to (None: not known yet), how far this pass has read it, and the furthest read in
        # this assignment (a pass read again from the first record must get that far too).
        self.catch_up_to: dict[int, int | None] = {}
        self.read_to: dict[int, int] = {}
        self.seen_to: dict[int, int] = {}
        self.gated = False  # `hold` was used: a Requeue of a pod not tracked is kept only while held
        # Pods and reservations read on a held partition that belong elsewhere: forwarded once
        # the partition is caught up, unless their deletion came meanwhile (then only that).
        self.pending_forwards: dict[int, dict[str, Record]] = {}
        # Outputs waiting to be sent, in order: held-back forwards, and what input batches
        # produced whose send failed (a deletion among them: the core forgot its pod already).
        self.to_forward: list[Output] = []
        self.forwarding = 0  # sends of `to_forward` not yet acknowledged
        self._flushing = asyncio.Lock()  # one send of `to_forward` at a time: a failed one goes back first
        self.retry_s = RETRY_S  # how soon the loop tries a failed send of `to_forward` again
        # Deletions read before the replica caught up (`replica_ready`) of pods it knows nothing
        # of: the owners' reports may name their decider (`SchedulerCore.known_key`).
        self.deferred: list[PodDeleted] = []
        self.forwarded = 0  # records forwarded to their own partition
        self.failed_sends = 0  # destinations whose send the broker did not acknowledge
        self.throttled = 0  # cycles skipped at the outstanding-claims limit
        self._in_flight: set[asyncio.Task[None]] = set()
        self._profiled: dict[tuple[str, str, str], int] = {}  # (profile, plugin, point) -> ns sent
        self._attempts_sent: dict[tuple[str, str], int] = {}  # (profile, result) -> attempts sent
        self._batched_sent: dict[str, int] = {}  # profile -> batched placements sent
        self._profiled_at = 0.0
        self.wake = asyncio.Event()
        self.replica_ready = asyncio.Event()  # set once the replica caught up with history
        # Per `state-changes` partition: drops reports a zombie owner published. One fence per
        # partition, never one for the feed: an owner's reports reach every partition (keyed by
        # node), so across partitions a report of an older epoch read after a newer one is no
        # zombie's.
        self.fences: dict[int, EpochFence] = {}
        # Per (topic, partition) of the inputs (`commit_points`): the offset of the first
        # record of each pod read there, and how far the records read were handled; kept only
        # when the offsets are committed (`commit_inputs`: `commit_points` prunes them).
        self.commit_inputs = False
        self.needed: dict[tuple[str, int], dict[str, int]] = {}
        self.handled_to: dict[tuple[str, int], int] = {}

    def mark_replica_ready(self) -> None:
        """The feed has read `state-changes` up to where it stood at start-up."""
        self.replica_ready.set()
        self.wake.set()

    def on_current_state(self, reports: Iterable[NodeStateChange], epochs: dict[int, int] | None = None) -> None:
        """The nodes as they are now (one report each, from the owners' changelog), read before
        the reports that follow them. `epochs`: per partition, the newest epoch of the owners
        whose writes the changelog holds: their reports' fences start there, so that a zombie
        owner's report is dropped as it would be after the whole history."""
        self.core.apply_state_changes(reports, current=True)
        for partition, epoch in (epochs or {}).items():
            fence = self.fences.setdefault(partition, EpochFence())
            source = f"{topics.NODE_INBOX}/{partition}"
            fence.newest[source] = max(fence.newest.get(source, epoch), epoch)
        self.wake.set()

    async def on_state_changes(self, messages: Iterable[RawMessage]) -> None:
        by_partition: dict[int, list[RawMessage]] = {}
        for m in messages:
            by_partition.setdefault(m.partition, []).append(m)
        dead_letters = []
        for partition, batch in by_partition.items():
            got = intake(batch, expect=(NodeStateChange,), fence=self.fences.setdefault(partition, EpochFence()))
            self.core.apply_state_changes(r for r in got.records if isinstance(r, NodeStateChange))
            dead_letters += got.dead_letters
        if dead_letters:
            await deliver(self.outbox, dead_letters)
        self.wake.set()

    def on_partitions_revoked(self, partitions: Iterable[int]) -> None:
        """These partitions of `pods` / `requeue` are no longer this replica's: stop placing
        their pods now, and ignore their messages until they are assigned again."""
        gone = set(partitions)
        if not gone:
            return
        self.revoked |= gone
        self.owned -= gone
        for partition in gone:
            for topic in (topics.PODS, topics.REQUEUE):
                self.needed.pop((topic, partition), None)
                self.handled_to.pop((topic, partition), None)
            self.catch_up_to.pop(partition, None)
            self.read_to.pop(partition, None)
            self.seen_to.pop(partition, None)
            self.pending_forwards.pop(partition, None)
            self.reread(partition)  # from the start if it comes back
        left = self.core.revoke(gone)
        log.info("partitions %s revoked: %d pods left the queue", sorted(gone), left)
        self.wake.set()

    def on_partitions_assigned(self, partitions: Iterable[int]) -> None:
        """The whole assignment of `pods` / `requeue` partitions after a rebalance; partitions
        of the previous one that it does not name are revoked."""
        now = set(partitions)
        self.on_partitions_revoked(self.owned - now)
        self.owned = now
        self.revoked -= now

    def reread(self, partition: int, topic: str | None = None) -> None:
        """A partition of `pods` / `requeue` is read again from its first record: its input
        fence starts afresh (an older epoch read after a newer one is no zombie's then). A
        gated `pods` partition's pods wait again until this pass has read as far as any pass
        before it, and as far as the end it had when assigned, once that is known."""
        self.input_fences.pop(partition, None)
        if topic not in (None, topics.PODS):
            return
        if partition in self.catch_up_to:  # not caught up yet: its end, if known
            known = self.catch_up_to[partition]
        elif partition in self.seen_to:  # caught up before: as far again
            known = self.seen_to[partition]
        else:
            return
        self.hold([partition])
        if known is not None:
            self.catch_up(partition, known)

    def hold(self, partitions: Iterable[int]) -> None:
        """Place no pod of these `pods` partitions until `catch_up` says how far to read and
        they are read that far (`SchedulerCore.hold`)."""
        partitions = list(partitions)
        self.gated = True
        for partition in partitions:
            self.catch_up_to.setdefault(partition, None)
            self.read_to[partition] = 0
        self.core.hold(partitions)

    def catch_up(self, partition: int, offset: int, start: int = 0) -> None:
        """A held partition is placed once read up to `offset` (the end it had when assigned).
        `start`: the group's committed offset, where its reading begins (what lies before it is
        not needed: `commit_points`); a partition committed to its end is caught up at once,
        not when its next record comes."""
        if partition not in self.catch_up_to:
            return  # revoked meanwhile, or released
        self.read_to[partition] = max(self.read_to.get(partition, 0), start)
        self.catch_up_to[partition] = max(self.catch_up_to[partition] or 0, offset, self.seen_to.get(partition, 0))
        self._release_caught_up(partition)

    def _forward(self, partition: int, record: Record) -> list[Output]:
        """A record read on a partition other than its uid's, for its home (murmur2). While the
        partition is held, a pod is kept back: read again from the first record, the partition
        still holds pods forwarded long ago and deleted since, and the home replica would place
        one again (its decider may have forgotten it)."""
        self.forwarded += 1
        uid: str = record.uid  # type: ignore[attr-defined]
        if partition in self.catch_up_to:
            pending = self.pending_forwards.setdefault(partition, {})
            if not isinstance(record, PodDeleted):
                pending[uid] = record
                return []
            pending.pop(uid, None)
        return [Output(topics.PODS, uid, record)]

    def _release_caught_up(self, partition: int) -> None:
        if self.to_forward or self.forwarding:
            return  # once the deletions read are delivered (`flush_forwards` releases it then)
        target = self.catch_up_to.get(partition)
        if target is not None and self.read_to.get(partition, 0) >= target:
            del self.catch_up_to[partition]
            self.to_forward += [Output(topics.PODS, uid, r) for uid, r in self.pending_forwards.pop(partition, {}).items()]
            released = self.core.release(partition, self.home)
            log.info("pods/%s read up to offset %s: %d pods held until then are placed now", partition, target, released)
            self.wake.set()

    def home(self, uid: str) -> int | None:
        """The partition of `pods` / `requeue` that a uid belongs to (None: not known here)."""
        return partition_for(uid, self.partitions) if self.partitions else None

    async def on_inputs(self, messages: Iterable[RawMessage]) -> None:
        by_partition: dict[int, list[RawMessage]] = {}
        for msg in messages:
            if msg.partition not in self.revoked:  # else fetched before its partition was revoked
                by_partition.setdefault(msg.partition, []).append(msg)
        outputs: list[Output] = []
        if self.deferred and self.replica_ready.is_set():  # read before this batch
            outputs += self.take_deferred()
        for partition, batch in by_partition.items():
            fence = self.input_fences.setdefault(partition, EpochFence())
            got = intake(batch, expect=(Pod, PodDeleted, Requeue, Reservation), fence=fence)
            outputs += got.dead_letters
            for record in got.records:
                src = got.sources[id(record)]
                if self.commit_inputs and isinstance(record, (Requeue, Pod, Reservation)) \
                        and self.home(record.uid) in (None, partition):
                    needed = self.needed.setdefault((src.topic, partition), {})
                    needed[record.uid] = min(needed.get(record.uid, src.offset), src.offset)
                if isinstance(record, Requeue):
                    self.core.requeue(record, partition=partition if self.gated else None)
                elif not isinstance(record, (Pod, Reservation, PodDeleted)):
                    continue
                elif self.home(record.uid) not in (None, partition):
                    outputs += self._forward(partition, record)
                elif isinstance(record, Pod):
                    outputs += self.core.add(record, partition=partition)
                elif isinstance(record, Reservation):
                    outputs += self.core.add_reservation(record, partition=partition)
                elif self.deferred or (not self.replica_ready.is_set() and not record.decision_key
                                       and self.core.known_key(record.uid) is None):
                    self.deferred.append(record)  # in order behind those deferred already
                else:
                    outputs += self.core.delete(record)
            read = [m.offset + 1 for m in batch if m.topic == topics.PODS]
            if read:
                self.read_to[partition] = max(self.read_to.get(partition, 0), *read)
                self.seen_to[partition] = max(self.seen_to.get(partition, 0), self.read_to[partition])
        # Forwards included, acknowledged before we go on; a caught-up partition is released
        # only after (the deletions read were delivered). What fails waits in `to_forward`: the
        # core has forgotten the deleted pods, nothing else would send their deletions again.
        self.to_forward += outputs
        await self.send_waiting()
        handled = by_partition.items() if self.commit_inputs else ()  # decoded, tracked, forwarded
        for partition, batch in handled:
            for m in batch:
                key = (m.topic, partition)
                self.handled_to[key] = max(self.handled_to.get(key, 0), m.offset + 1)
        self.wake.set()

    def commit_points(self) -> dict[tuple[str, int], int]:
        """Per (topic, partition) owned and not held: the offset before which this replica needs
        no record any more (module docstring, "Input offsets"). Empty while outputs wait to be
        sent or deletions wait for the replica (`to_forward`, `deferred`)."""
        if self.to_forward or self.forwarding or self.deferred:
            return {}
        tracked = {uid for uid, t in self.core.pods.items() if t.state != FAILED}
        live = {topics.PODS: tracked, topics.REQUEUE: tracked | self.core.requeued.keys()}
        out = {}
        for key, handled in self.handled_to.items():
            partition = key[1]
            if partition not in self.owned or partition in self.revoked or partition in self.catch_up_to:
                continue
            needed = self.needed.get(key, {})
            for uid in [u for u in needed if u not in live[key[0]]]:
                del needed[uid]
            out[key] = min(min(needed.values(), default=handled), handled)
        return out

    async def flush_forwards(self) -> None:
        """Send what waits in `to_forward` (forwards held back until their partitions were
        caught up, outputs whose send failed), then release the partitions caught up meanwhile
        and send what they held back. It all counts as waiting (`commit_points`) until
        acknowledged, and waits again if the send failed (the error is raised)."""
        async with self._flushing:
            while True:
                if self.to_forward:
                    forwards, self.to_forward = self.to_forward, []
                    self.forwarding += 1
                    try:
                        await deliver(self.outbox, forwards)
                    except BaseException:
                        self.to_forward = forwards + self.to_forward
                        raise
                    finally:
                        self.forwarding -= 1
                for partition in list(self.catch_up_to):
                    self._release_caught_up(partition)
                if not self.to_forward:
                    return

    async def send_waiting(self) -> bool:
        """`flush_forwards`; a send that fails is logged and its outputs wait for the next try
        (the next batch, or the loop within `retry_s`). True when nothing waits."""
        try:
            await self.flush_forwards()
        except Exception as exc:  # noqa: BLE001 - kept, tried again
            self.failed_sends += 1
            log.warning("send of %d outputs failed (%r): they wait and are sent again", len(self.to_forward), exc)
            return False
        return True

    def take_deferred(self) -> list[Output]:
        """The deletions deferred until the replica caught up, forwarded now (in read order)."""
        deferred, self.deferred = self.deferred, []
        return [o for d in deferred for o in self.core.delete(d)]

    def profiling_samples(self) -> list[Output]:
        """What each plugin spent per extension point, and the attempts made, since the last samples."""
        out = []
        for name, fw in self.core.frameworks.items():
            for (plugin, point), ns in fw.timings.items():
                key = (name, plugin, point)
                delta = ns - self._profiled.get(key, 0)
                if delta > 0:
                    self._profiled[key] = ns
                    out.append(Output(topics.PROFILING, plugin, ProfilingSample(
                        profile=name, plugin=plugin, extension_point=point, duration_ns=delta)))
        for (profile, result), count in self.core.attempts.items():
            delta = count - self._attempts_sent.get((profile, result), 0)
            if delta > 0:
                self._attempts_sent[profile, result] = count
                batched = 0
                if result == "scheduled":
                    batched = self.core.batched[profile] - self._batched_sent.get(profile, 0)
                    self._batched_sent[profile] = self.core.batched[profile]
                out.append(Output(topics.PROFILING, profile, AttemptsSample(profile=profile, result=result, count=delta,
                                                                            batched=batched)))
        return out

    async def run(self) -> None:
        """The scheduling loop; runs until cancelled.

        It starts placing pods only once the replica has caught up with the state-changes
        history, so a restarted worker does not place pods on a cluster it has not read yet.
        """
        await self.replica_ready.wait()
        try:
            while True:
                if self.linger_s and 0 < self.core.pending < self.batch_size:
                    # A cycle costs mostly per equivalence class, not per pod: let the intake
                    # gather more pods first (it runs on this event loop meanwhile).
                    await asyncio.sleep(self.linger_s)
                await self._room()  # before placing: a revocation meanwhile still counts
                self.to_forward += self.take_deferred()
                await self.send_waiting()
                self.wake.clear()
                room = self.room_for_claims()
                if room <= 0:  # overloaded downstream: wait for outcomes (they wake the loop)
                    self.throttled += 1
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), self.retry_s if self.to_forward else None)
                    continue
                started = self.wall()
                outputs = stamped(self.core.schedule(room), started)
                if outputs and self.clock() - self._profiled_at >= PROFILING_EVERY_S:
                    self._profiled_at = self.clock()
                    outputs += self.profiling_samples()
                if outputs:
                    await self.dispatch(outputs)
                    await asyncio.sleep(0)
                    continue
                samples = self.profiling_samples()  # idle: what the last busy stretch spent
                if samples:
                    self._profiled_at = self.clock()
                    await self.dispatch(samples)
                wakeup = self.core.next_wakeup()
                timeout = None if wakeup is None else max(0.0, wakeup - self.clock())
                if self.to_forward:  # a send failed: try again soon, even if nothing else comes
                    timeout = self.retry_s if timeout is None else min(timeout, self.retry_s)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout)
        finally:
            for task in self._in_flight:
                task.cancel()

    def room_for_claims(self) -> int:
        """Pods the next cycle may place: the batch size, less what the outstanding-claims
        limit leaves. A claim is outstanding until it is decided (`SchedulerCore.claims_out`),
        not only until its owner reports it: a held claim waits for its decider, and it is
        deciders that are slow under overload."""
        if not self.max_claims:
            return self.batch_size
        return min(self.batch_size, self.max_claims - len(self.core.claims_out))

    async def dispatch(self, outputs: Sequence[Output]) -> None:
        """Send a batch, one send per destination partition, and watch its acks in the
        background; waits first while `max_in_flight` batches are unacknowledged."""
        await self._room()
        sent: list[tuple[list[Output], list[Awaitable[object]]]] = []
        for group in self._destinations(outputs):
            try:
                sent.append((group, await self.outbox.send(group)))
            except Exception as exc:  # refused before it left (e.g. the producer is stopping)
                self._send_failed(group, exc)
        task = asyncio.ensure_future(self._settle(sent))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _room(self) -> None:
        """Wait while `max_in_flight` batches are unacknowledged."""
        while len(self._in_flight) >= self.max_in_flight:
            await asyncio.wait(self._in_flight, return_when=asyncio.FIRST_COMPLETED)

    def _destinations(self, outputs: Sequence[Output]) -> list[list[Output]]:
        """Outputs by (topic, partition), in order within each, so that an ack that fails names
        the claims it carried (every topic has `partitions` partitions); one group when the
        partition count is not known."""
        if not self.partitions:
            return [list(outputs)]
        groups: dict[tuple[str, int], list[Output]] = {}
        for out in outputs:
            groups.setdefault((out.topic, partition_for(out.key, self.partitions)), []).append(out)
        return list(groups.values())

    async def _settle(self, sent: list[tuple[list[Output], list[Awaitable[object]]]]) -> None:
        for group, acks in sent:
            error: BaseException | None = None
            for ack in acks:
                try:
                    await ack
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # we are stopping
                    error = error or ConnectionError("send cancelled before the broker acknowledged")
                except Exception as exc:
                    error = error or exc
            if error is not None:
                self._send_failed(group, error)

    def _send_failed(self, group: Sequence[Output], error: BaseException) -> None:
        self.failed_sends += 1
        failed = [o.record for o in group if isinstance(o.record, Claim)]
        log.warning("send of %d outputs to %s failed (%s): %d claims go back to the queue", len(group),
                    group[0].topic if group else "?", error, len(failed))
        if failed:
            self.core.unclaim(failed)
            self.wake.set()
