"""What a decision core hands back to its agent: records addressed to logical topics.

The cores never produce; they return `Output`s (topic, key, record) and `Problem`s (inputs that
break a protocol rule, for the dead-letter topic). `streams` routes them by the catalogue's
partitioner rule and writes each output's `Origin` into the message headers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from schemas.records import Record, quick_init

if TYPE_CHECKING:
    from agents.state.quotas import QuotaSpec


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a decision came from: its input partition ("node-inbox/3") and the deciding agent's
    epoch for that partition (see `agents.adapters.tables`; DESIGN.md, safety rule 4)."""

    source: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Output:
    topic: str
    key: str
    record: Record
    origin: Origin | None = None  # set on the outputs of owners and deciders


quick_init(Origin)  # built for every output of the stateful agents
quick_init(Output)


def stamp(outputs: list[Output], start: int, origin: Origin) -> None:
    """Stamp the outputs from index `start` on with the origin they were decided from."""
    outputs[start:] = [Output(o.topic, o.key, o.record, origin) for o in outputs[start:]]


@dataclass(frozen=True, slots=True)
class Problem:
    """An input that is well-formed but violates the protocol (e.g. Commit of a hold not held)."""

    field: str
    value: str
    error: str
    record: Record


class Entries(dict[str, Any]):
    """A map-valued field of a table value (a split field, `agents.adapters.tables`) that says
    what changed since the value it follows: `token` names this map, `after` the map it was
    made from (None: none known), and every entry not in `changed` is in both maps or in
    neither, as the same object. A table whose changelog last carried the map `after` then
    writes only the entries in `changed`."""

    __slots__ = ("token", "after", "changed")

    def __init__(self, items: dict[str, Any], after: object | None = None, changed: Sequence[str] = ()) -> None:
        super().__init__(items)
        self.token = object()
        self.after = after
        self.changed = tuple(changed)


class Outbox(Protocol):
    """Sends outputs grouped per destination partition; the awaitables resolve on broker ack."""

    async def send(self, outputs: Sequence[Output]) -> list[Awaitable[object]]: ...


async def deliver(outbox: Outbox, outputs: Sequence[Output]) -> None:
    """Send and wait until the broker acknowledged every output.

    Agents deliver a batch's outputs before the batch ends, so an input offset is only
    committed once what it caused is on the broker (replays then re-send, never lose).
    """
    for ack in await outbox.send(outputs):
        await ack


class Clock(Protocol):
    def __call__(self) -> float: ...


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """What every agent needs to know of its deployment, handed in by `streams`."""

    partitions: int
    batch_size: int = 1000
    batch_within_s: float = 0.01
    table_name: str = ""
    retention_s: float = 600.0  # owners and deciders: see agents.state.retention
    max_clock_skew_s: float = 60.0  # owners and deciders: see agents.state.retention.judged_at
    nomination_ttl_s: float = 300.0  # owners: a nomination lapses this long after it was made
    commit_inputs: bool = True  # the scheduler: commit what it no longer needs of its inputs
    quotas: tuple[QuotaSpec, ...] = ()  # deciders: the profiles' elastic quotas, whose ledgers they keep
