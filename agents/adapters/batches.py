"""Micro-batches from a faust stream, as raw messages with their source coordinates.

The stateful agents get each micro-batch split into `Fetched` runs: the messages of one input
partition that were fetched in one consumer-group generation (faust stamps every message with
the generation current when it was fetched). The loop processes a run only if this worker
still owns its partition in that generation, and stamps what it decides with that
generation's epoch, never the one current when it flushes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import faust

from agents.intake import RawMessage, origin_from_headers
from agents.ports import AgentConfig


@dataclass
class Fetched:
    """Messages of one input partition, fetched in one consumer-group generation, in order."""

    topic: str
    partition: int
    generation: int
    messages: list[RawMessage] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)  # the faust events (see `withhold_acks`)

    @property
    def first_offset(self) -> int:
        return self.messages[0].offset

    @property
    def next_offset(self) -> int:
        """The offset to commit once this run is processed: the one after its last message."""
        return self.messages[-1].offset + 1

    def withhold_acks(self) -> None:
        """Keep faust from ever committing these messages' offsets (the run is dropped; whoever
        owns the partition next reads them again). faust acknowledges a take() batch after
        the loop body; a message already marked acknowledged is skipped by its consumer."""
        for event in self.events:
            event.message.acked = True


def to_raw(event: Any) -> RawMessage:
    m = event.message
    return RawMessage(event.value, m.topic, m.partition, m.offset, origin_from_headers(m.headers),
                      float(m.timestamp or 0.0))


def split(events: Sequence[Any]) -> list[Fetched]:
    """Runs by (topic, partition, generation), each in arrival order."""
    runs: dict[tuple[str, int, int], Fetched] = {}
    for event in events:
        m = event.message
        generation = int(m.generation_id) if m.generation_id is not None else -1
        run = runs.get((m.topic, m.partition, generation))
        if run is None:
            run = runs[(m.topic, m.partition, generation)] = Fetched(m.topic, m.partition, generation)
        run.messages.append(to_raw(event))
        run.events.append(event)
    return list(runs.values())


async def micro_batch_events(stream: faust.StreamT[Any], config: AgentConfig) -> AsyncIterator[list[Any]]:
    """Up to `batch_size` events, or what arrived within `batch_within_s`, per batch."""
    events_stream: Any = stream  # take_events is on faust.Stream, not on the StreamT protocol
    async for events in events_stream.take_events(config.batch_size, within=config.batch_within_s):
        yield list(events)


async def micro_batches(stream: faust.StreamT[Any], config: AgentConfig) -> AsyncIterator[list[RawMessage]]:
    """The stateless agents' batches: raw messages in arrival order."""
    async for events in micro_batch_events(stream, config):
        yield [to_raw(e) for e in events]


async def fetched_batches(stream: faust.StreamT[Any], config: AgentConfig) -> AsyncIterator[list[Fetched]]:
    """The stateful agents' batches, split into runs (see `Fetched`)."""
    async for events in micro_batch_events(stream, config):
        yield split(events)
