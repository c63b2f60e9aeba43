"""Versioned faust tables, so that a restore cannot resurrect a zombie's stale state.

Every value the agents write is wrapped as `{"gen": G, "seq": S, "state": ...}`: G is the
consumer-group generation under which the writer owned the partition, S counts the writes of
the key. A worker that lost its partitions but still finished a batch (a zombie) writes an
older generation; restoring from the changelog keeps, per key, the value with the highest
(G, S), so such a late write is dropped instead of replacing newer state (DESIGN.md, safety
rule 4, for restorers). `newest_first` is the pure rule; `VersionedTable` applies it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import faust
from faust.tables.table import Table

log = logging.getLogger("koordstream.tables")


def supersedes(incoming: Mapping[str, Any] | None, current: Mapping[str, Any] | None) -> bool:
    """True when `incoming` may replace `current` (deletes and first writes always may)."""
    if incoming is None or current is None:
        return True
    return (incoming["gen"], incoming["seq"]) >= (current["gen"], current["seq"])


class VersionedTable(Table[bytes, Any]):
    def apply_changelog_batch(self, batch: Iterable[Any]) -> None:
        newest: dict[Any, Any] = {}
        kept = []
        for event in batch:
            key, value = event.key, event.value
            current = newest[key] if key in newest else self.data.get(key)
            if supersedes(value, current):
                newest[key] = value
                kept.append(event)
            else:
                log.warning("restore of %s dropped a stale write of %r (%s < %s)", self.name, key,
                            (value["gen"], value["seq"]), (current and (current["gen"], current["seq"])))
        super().apply_changelog_batch(kept)


class VersionedState:
    """Read and write one agent's table; values are JSON states (see module docstring)."""

    def __init__(self, app: faust.App, name: str, partitions: int) -> None:
        self.app = app
        # Raw UTF-8 keys (not JSON-quoted ones), so the partitioner puts a key's changelog record
        # in the same partition number as its input records: they move together on a rebalance.
        self.table = VersionedTable(app, name=name, default=None, partitions=partitions, use_partitioner=True,
                                    key_type=bytes)
        app.tables.add(self.table)

    def raw(self, key: str) -> dict[str, Any] | None:
        value: dict[str, Any] | None = self.table.get(key.encode())
        return value

    def get(self, key: str) -> dict[str, Any] | None:
        wrapped = self.raw(key)
        return None if wrapped is None else wrapped["state"]  # type: ignore[no-any-return]

    def put(self, key: str, state: dict[str, Any]) -> None:
        previous = self.raw(key)
        self.table[key.encode()] = {"gen": self.app.consumer_generation_id, "seq": previous["seq"] + 1 if previous else 1,
                           "state": state}
