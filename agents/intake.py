"""The edge of every agent: raw messages in, records or dead letters out.

A message that does not decode (not JSON, unknown major version, a missing or ill-typed field,
a bad quantity), or a record that breaks the protocol, becomes a `DeadLetter` envelope with the
error, the field, the value, the source topic, partition and offset, and the original bytes.
The rest of the batch goes on.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from agents.ports import Output, Problem
from schemas import topics
from schemas.codec import decode_message, encode
from schemas.errors import SchemaError
from schemas.records import DeadLetter, Record

log = logging.getLogger("koordstream.deadletter")


@dataclass(frozen=True, slots=True)
class RawMessage:
    value: bytes | None
    topic: str
    partition: int
    offset: int


@dataclass
class Intake:
    records: list[Record]
    sources: dict[int, RawMessage]  # id(record) -> the message it came in
    dead_letters: list[Output]

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


def intake(messages: Iterable[RawMessage], expect: tuple[type[Record], ...] | None = None) -> Intake:
    """Decode messages; records of a kind outside `expect` are dead letters too."""
    out = Intake([], {}, [])
    for msg in messages:
        for result in decode_message(msg.value):
            if isinstance(result, SchemaError):
                out.dead_letters.append(_letter(str(result), result.field, result.value, msg.topic,
                                                msg.partition, msg.offset, msg.value))
            elif expect is not None and not isinstance(result, expect):
                out.dead_letters.append(_letter(
                    f"kind: {result.KIND} does not belong on {msg.topic}", "kind", result.KIND,
                    msg.topic, msg.partition, msg.offset, msg.value,
                ))
            else:
                out.records.append(result)
                out.sources[id(result)] = msg
    return out
