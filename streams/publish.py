"""`koordstream publish FILE --topic TOPIC`: JSON lines of records, or Kubernetes manifests
(a .yaml/.yml/.json file of Pods, Nodes, Koordinator Reservations or a List; agent-sandbox's
SandboxTemplates, SandboxWarmPools and SandboxClaims, which go to `sandbox`, each pool with its
template from the same file), validated before anything is sent. Reservations go to `pods`,
like pods. RuntimeClasses are refused: they are configuration that every scheduler worker
reads at start (`sandbox.runtimes`), not events.

This is where a user's manifest enters, as kubectl's does at the API server, which stamps
`metadata.creationTimestamp`: a Reservation without a creation time is stamped with the time
the file was read (`stamped`), so its ttl counts from its publication. Records from any other
producer that carry none are counted from when their owner first reads their claim
(`agents.state.owner`, `HoldEntry.seen`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import orjson
from aiokafka.errors import KafkaConnectionError

from schemas.agent_sandbox import resolve
from schemas.codec import decode_object
from schemas.errors import SchemaError
from schemas.kube import from_manifest, is_manifest, load_manifests
from schemas.records import Record, Reservation, RuntimeClass, SandboxBurst, SandboxClaim, replace
from streams.connection import check, connect
from streams.producer import RecordProducer
from streams.settings import Settings


def read_records(path: Path) -> list[Record]:
    """Every record of the file; a bad line raises ValueError naming line, field and value."""
    text = path.read_text()
    if path.suffix in (".yaml", ".yml") or (path.suffix == ".json" and text.lstrip().startswith("{")
                                            and "\n{" not in text.strip()):
        try:
            return load_manifests(text)
        except SchemaError as exc:
            raise ValueError(f"{path}: {exc}") from exc
    records: list[Record] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
            records.extend(from_manifest(obj) if is_manifest(obj) else [decode_object(obj)])
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON: {exc}") from exc
        except SchemaError as exc:
            raise ValueError(f"{path}:{number}: {exc}") from exc
    try:
        return resolve(records)
    except SchemaError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def stamped(records: list[Record], now: float) -> list[Record]:
    """The records, a Reservation without a creation time given `now` as its creation time (a
    SandboxClaim or SandboxBurst without one, as `created`)."""
    out: list[Record] = []
    for r in records:
        if isinstance(r, Reservation) and not r.creation_timestamp:
            r = replace(r, creation_timestamp=now)
        elif isinstance(r, (SandboxClaim, SandboxBurst)) and not r.created:
            r = replace(r, created=now)
        out.append(r)
    return out


async def publish_file(path: Path, topic: str, settings: Settings, raw: bool = False,
                       clock: Callable[[], float] = time.time) -> int:
    """Validate the whole file first (nothing is sent if a line is bad), then publish it."""
    lines = [line.encode() for line in path.read_text().splitlines() if line.strip()] if raw else []
    records = [] if raw else stamped(read_records(path), clock())
    configuration = [r.name for r in records if isinstance(r, RuntimeClass)]
    if configuration:
        raise ValueError(f"{path}: RuntimeClass {', '.join(configuration)}: runtime classes are not published; list "
                         "them in the file the setting sandbox.runtimes names (every scheduler worker reads it at "
                         "start)")
    conn = connect(settings.kafka)
    await check(conn)
    try:
        async with RecordProducer(conn, settings.kafka.partitions) as producer:
            for line in lines:
                await producer.send_raw(topic, line)
            await producer.flush(await producer.publish(topic, records))
    except KafkaConnectionError as exc:
        raise ValueError(f"cannot reach the broker at {settings.kafka.bootstrap}: {exc}") from exc
    return len(lines) + len(records)
