"""The edge of every agent: raw messages in, records or dead letters out.

A message that does not decode (not JSON, unknown major version, a missing or ill-typed field,
a bad quantity), or a record that breaks the protocol, becomes a `DeadLetter` envelope with the
error, the field, the value, the source topic, partition and offset, and the original bytes.
The rest of the batch goes on. Messages a zombie produced (an older epoch of an origin
than one already seen) are dropped by an `EpochFence`.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from agents.ports import Origin, Output, Problem
from agents.state import devices
from schemas import topics
from schemas.codec import decode_message, encode
from schemas.errors import SchemaError
from schemas.records import DeadLetter, Record

log = logging.getLogger("koordstream.deadletter")


ORIGIN_HEADER = "koordstream-origin"
EPOCH_HEADER = "koordstream-epoch"


@dataclass(frozen=True, slots=True)
class RawMessage:
    value: bytes | None
    topic: str
    partition: int
    offset: int
    origin: Origin | None = None  # the producer's, from the headers
    timestamp: float = 0.0  # the record's time in the log (s; 0: unknown)


def origin_headers(origin: Origin) -> list[tuple[str, bytes]]:
    return [(ORIGIN_HEADER, origin.source.encode()), (EPOCH_HEADER, str(origin.epoch).encode())]


def origin_from_headers(headers: Iterable[tuple[str, bytes]] | Mapping[str, bytes] | None) -> Origin | None:
    """The producer's origin, or None for a message without (or with malformed) headers."""
    if not headers:
        return None
    found = dict(headers.items() if isinstance(headers, Mapping) else headers)
    source, epoch = found.get(ORIGIN_HEADER), found.get(EPOCH_HEADER)
    try:
        return Origin(source.decode(), int(epoch)) if source and epoch else None
    except ValueError:
        return None


class EpochFence:
    """Drops records that a zombie produced (DESIGN.md, safety rule 4).

    Per origin (an input partition of some deciding agent), the newest epoch seen so far (see
    `agents.adapters.tables`); a record from an older epoch of the same origin was produced by a
    worker that had already lost that partition, and the new owner re-sends whatever it
    should have sent.
    """

    def __init__(self) -> None:
        self.newest: dict[str, int] = {}
        self.dropped = 0

    def admit(self, origin: Origin | None) -> bool:
        if origin is None:
            return True
        newest = self.newest.get(origin.source)
        if newest is not None and origin.epoch < newest:
            self.dropped += 1
            log.warning("dropped a record of %s epoch %s (newest %s): a zombie's", origin.source,
                        origin.epoch, newest)
            return False
        self.newest[origin.source] = origin.epoch
        return True


@dataclass
class Intake:
    records: list[Record]
    sources: dict[int, RawMessage]  # id(record) -> the message it came in
    dead_letters: list[Output]

    def grouped(self, key: Callable[[Record], str]) -> dict[str, list[Record]]:
        """The records grouped by `key` (a node, a decision key), each group in input order."""
        groups: dict[str, list[Record]] = {}
        for record in self.records:
            groups.setdefault(key(record), []).append(record)
        return groups

    def log_times(self, records: Iterable[Record]) -> list[float]:
        """Each record's time in the log (its message's timestamp; 0 when unknown)."""
        sources = self.sources
        return [src.timestamp if (src := sources.get(id(r))) is not None else 0.0 for r in records]

    def problem_letters(self, problems: Iterable[Problem]) -> list[Output]:
        letters = []
        for p in problems:
            src = self.sources.get(id(p.record))
            letters.append(_letter(
                p.error, p.field, p.value, src.topic if src else "", src.partition if src else -1,
                src.offset if src else -1, encode(p.record),
            ))
        return letters


def _letter(error: str, field: str, value: object, topic: str, partition: int, offset: int, original: bytes | None) -> Output:
    log.warning("dead letter from %s[%s]@%s: %s", topic, partition, offset, error)
    return Output(topics.DEAD_LETTER, topic or "unknown", DeadLetter(
        error=error, field=field, value=str(value)[:1000], topic=topic, partition=partition, offset=offset,
        original=base64.b64encode(original or b"").decode("ascii"),
    ))


def _bad_device(record: Record) -> tuple[str, str, str] | None:
    """A record's `devices` entry that does not parse (field, value, why): the owners and
    deciders parse them, so one must not reach them."""
    claimed = getattr(record, "devices", ())
    found = devices.malformed(claimed) if claimed else None
    if found is None:
        return None
    index, error = found
    return f"devices[{index}]", claimed[index], error


def intake(messages: Iterable[RawMessage], expect: tuple[type[Record], ...] | None = None,
           fence: EpochFence | None = None) -> Intake:
    """Decode messages; records of a kind outside `expect` are dead letters too; messages the
    fence does not admit are dropped."""
    out = Intake([], {}, [])
    for msg in messages:
        if fence is not None and not fence.admit(msg.origin):
            continue
        letters = len(out.dead_letters)
        for result in decode_message(msg.value):
            # The message's bytes go on its first letter only (`DeadLetter.original`).
            original = msg.value if len(out.dead_letters) == letters else None
            if isinstance(result, SchemaError):
                out.dead_letters.append(_letter(str(result), result.field, result.value, msg.topic,
                                                msg.partition, msg.offset, original))
            elif expect is not None and not isinstance(result, expect):
                out.dead_letters.append(_letter(
                    f"kind: {result.KIND} does not belong on {msg.topic}", "kind", result.KIND,
                    msg.topic, msg.partition, msg.offset, original,
                ))
            elif (bad := _bad_device(result)) is not None:
                field, value, error = bad
                out.dead_letters.append(_letter(f"{field}: {error} (value: {value!r})", field, value,
                                                msg.topic, msg.partition, msg.offset, original))
            else:
                out.records.append(result)
                out.sources[id(result)] = msg
    return out
