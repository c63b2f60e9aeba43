"""Micro-batches from a faust stream, as raw messages with their source coordinates."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import faust

from agents.intake import RawMessage, origin_from_headers
from agents.ports import AgentConfig


async def micro_batches(stream: faust.StreamT[Any], config: AgentConfig) -> AsyncIterator[list[RawMessage]]:
    """Up to `batch_size` events, or what arrived within `batch_within_s`, per batch."""
    events_stream: Any = stream  # take_events is on faust.Stream, not on the StreamT protocol
    async for events in events_stream.take_events(config.batch_size, within=config.batch_within_s):
        yield [RawMessage(e.value, e.message.topic, e.message.partition, e.message.offset,
                          origin_from_headers(e.message.headers)) for e in events]
