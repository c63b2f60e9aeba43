"""`koordstream sandbox claim POOL` and `koordstream sandbox pools`: a warm pool's client.

`claim_sandbox` publishes one SandboxClaim (agent-sandbox's v1beta1 claim: a warm pool by
name, environment variables to inject, labels, a shutdown time) to `sandbox`, keyed by its
pool, and waits for the SandboxClaimStatus that answers it on `sandbox-status`. It reads the one
partition the answer lands on (a claim's statuses are keyed by its uid), with explicit assignment
and no consumer group, positioned at the end *before* the claim is sent, so the answer cannot
be missed and no group join delays it. A Pending answer (a sandbox still starting, or started
cold through the scheduler) is waited past until Ready; Ready and Refused end it. The latency
is from the claim's `created` (set just before it is produced) to when the answer was read
here.

`pool_statuses` reads `sandbox-status` whole (explicit assignment, from the beginning to the
end) and keeps the latest SandboxPoolStatus of each pool.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace

from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError

from schemas import topics
from schemas.codec import decode_message
from schemas.partitioner import partition_for
from schemas.records import EnvVar, SandboxClaim, SandboxClaimStatus, SandboxPoolStatus
from streams.connection import check, connect
from streams.producer import RecordProducer
from streams.reader import read_to_end
from streams.settings import Settings

READY, PENDING, REFUSED = "Ready", "Pending", "Refused"


@dataclass(frozen=True)
class ClaimAnswer:
    """What came back for a claim: its last status read (None: nothing in time), the latency
    in ms to that status, and whether the wait ran out before a final answer."""

    claim: SandboxClaim
    status: SandboxClaimStatus | None
    latency_ms: float
    timed_out: bool

    @property
    def ready(self) -> bool:
        return self.status is not None and self.status.phase == READY and not self.timed_out


def pairs(items: list[str], option: str) -> dict[str, str]:
    """`K=V` items as a map; raises ValueError naming the option and the item."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{option} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def make_claim(pool: str, namespace: str, name: str = "", env: dict[str, str] | None = None,
               labels: dict[str, str] | None = None, shutdown_after_s: float | None = None,
               now: float | None = None) -> SandboxClaim:
    """The claim to publish (a name made from the pool's when none is given, a fresh uid)."""
    uid = uuid.uuid4().hex
    at = time.time() if now is None else now
    return SandboxClaim(uid=uid, namespace=namespace, name=name or f"{pool}-{uid[:8]}", warm_pool=pool,
                        env=tuple(EnvVar(k, v) for k, v in (env or {}).items()), labels=dict(labels or {}),
                        shutdown_time=at + shutdown_after_s if shutdown_after_s is not None else None, created=at)


async def claim_sandbox(settings: Settings, claim: SandboxClaim, timeout_s: float = 30.0) -> ClaimAnswer:
    """Publish `claim` (its `created` set to the moment it is sent) and wait up to `timeout_s`
    for its Ready or Refused status."""
    k = settings.kafka
    conn = connect(k)
    await check(conn)
    tp = TopicPartition(topics.SANDBOX_STATUS, partition_for(claim.uid, k.partitions))
    consumer = conn.consumer(group_id=None, enable_auto_commit=False, fetch_max_wait_ms=k.fetch_max_wait_ms,
                             isolation_level="read_committed")
    try:
        await consumer.start()
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)  # fixed now: the answer comes after it
        async with RecordProducer(conn, k.partitions, linger_ms=0) as producer:  # one claim: nothing to wait for
            sent = replace(claim, created=time.time())
            await producer.flush(await producer.publish(topics.SANDBOX, [sent]))
        deadline = sent.created + timeout_s
        last: SandboxClaimStatus | None = None
        latency = 0.0
        while time.time() < deadline:
            batches = await consumer.getmany(tp, timeout_ms=int(min(200.0, max(1.0, (deadline - time.time()) * 1000))))
            for message in batches.get(tp, []):
                for r in decode_message(message.value):
                    if isinstance(r, SandboxClaimStatus) and r.uid == sent.uid:
                        last, latency = r, (time.time() - sent.created) * 1000.0
                        if r.phase in (READY, REFUSED):
                            return ClaimAnswer(sent, r, round(latency, 1), False)
        return ClaimAnswer(sent, last, round(latency, 1), True)
    except KafkaConnectionError as exc:
        raise ValueError(f"cannot reach the broker at {k.bootstrap}: {exc}") from exc
    finally:
        await consumer.stop()


async def pool_statuses(settings: Settings) -> list[SandboxPoolStatus]:
    """Every pool's latest status on `sandbox-status`, by namespace and name."""
    k = settings.kafka
    conn = connect(k)
    await check(conn)
    latest: dict[tuple[str, str], SandboxPoolStatus] = {}

    def seen(message: object) -> None:
        for r in decode_message(getattr(message, "value", b"")):
            if isinstance(r, SandboxPoolStatus):
                latest[(r.namespace, r.name)] = r

    try:
        await read_to_end(conn, [topics.SANDBOX_STATUS], k.partitions, seen)
    except KafkaConnectionError as exc:
        raise ValueError(f"cannot reach the broker at {k.bootstrap}: {exc}") from exc
    return [latest[key] for key in sorted(latest)]
