"""Split table values (`agents.adapters.tables`, "Split values"): the owners' changelog carries a
node's head and one record per hold and tombstone, a write produces what changed, and a
restore assembles what the writes made durable, whatever batches it reads them in, with a
zombie's stale entries dropped and the entries of a write that failed written again."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import faust
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.adapters.tables import PART, VersionedState
from tests.unit.test_adapter_loop import FakeMessage, FakeProducer

SPLIT = ("holds", "tombstones")
PARTITION = 1


@dataclass
class ChangelogEvent:
    key: bytes
    value: Any
    message: FakeMessage


def table() -> tuple[VersionedState, FakeProducer]:
    app = faust.App(f"test-{id(object())}", store="memory://", broker="kafka://127.0.0.1:1")
    t = VersionedState(app, "node-state", 4, split=SPLIT)
    producer = FakeProducer()
    t.faust_producer = lambda: producer  # type: ignore[method-assign]
    return t, producer


def write(t: VersionedState) -> list[tuple[bytes, bytes | None]]:
    """One batch's changelog write; the records it produced."""
    producer: FakeProducer = t.faust_producer()
    before = len(producer.sent)
    asyncio.run(t.write_changelog(partitions=[PARTITION]))
    return [r for _, _, records in producer.sent[before:] for r in records]


def restore(log: list[tuple[bytes, bytes | None]], chunk: int = 1000) -> VersionedState:
    """A fresh table restored from `log`, read in batches of `chunk` records."""
    t, _ = table()
    events = [ChangelogEvent(k, None if v is None else orjson.loads(v),
                             FakeMessage(t.changelog, PARTITION, i, 1, v))  # type: ignore[arg-type]
              for i, (k, v) in enumerate(log)]
    for i in range(0, len(events), chunk):
        t.table.apply_changelog_batch(events[i:i + chunk])
    return t


def node(holds: dict[str, dict[str, Any]], tombstones: dict[str, float] | None = None, seq: int = 0) -> dict[str, Any]:
    return {"name": "n1", "seq": seq, "holds": holds, "tombstones": tombstones or {}, "reservations": {}}


def test_a_write_carries_the_head_and_only_the_entries_that_changed() -> None:
    t, _ = table()
    a, b = {"uid": "a", "status": "held"}, {"uid": "b", "status": "held"}
    t.put("n1", node({"a/0/n1": a, "b/0/n1": b}), PARTITION, epoch=1)
    first = write(t)
    assert [k for k, _ in first] == [b"n1", b"n1\x1fholds\x1fa/0/n1", b"n1\x1fholds\x1fb/0/n1"]
    assert "holds" not in orjson.loads(first[0][1])["state"]  # type: ignore[arg-type]
    t.settle(PARTITION, durable=True)

    # b committed, a released and forgotten, c held, a tombstone: the head, b, c, a's tombstone.
    t.put("n1", node({"b/0/n1": {**b, "status": "committed"}, "c/0/n1": {"uid": "c", "status": "held"}},
                     {"a": 7.0}), PARTITION, epoch=1)
    second = write(t)
    assert [(k, v is None) for k, v in second] == [
        (b"n1", False), (b"n1\x1fholds\x1fb/0/n1", False), (b"n1\x1fholds\x1fc/0/n1", False),
        (b"n1\x1fholds\x1fa/0/n1", True), (b"n1\x1ftombstones\x1fa", False)]
    t.settle(PARTITION, durable=True)

    # A write of an equal state (a replay) carries the head alone.
    t.put("n1", node({"b/0/n1": {**b, "status": "committed"}, "c/0/n1": {"uid": "c", "status": "held"}},
                     {"a": 7.0}), PARTITION, epoch=1)
    assert [k for k, _ in write(t)] == [b"n1"]
    assert restore(first + second).get("n1") == t.get("n1")


def test_a_deleted_key_leaves_tombstones_for_its_head_and_every_entry() -> None:
    t, _ = table()
    t.put("n1", node({"a/0/n1": {"uid": "a"}}, {"z": 1.0}), PARTITION, epoch=1)
    log = write(t)
    t.settle(PARTITION, durable=True)
    t.delete("n1", PARTITION)
    gone = write(t)
    assert sorted(gone) == sorted([(b"n1", None), (b"n1\x1fholds\x1fa/0/n1", None), (b"n1\x1ftombstones\x1fz", None)])
    assert restore(log + gone).get("n1") is None
    assert restore(log + gone).table.parts == {}


def test_a_write_that_did_not_become_durable_is_written_again_by_the_replay() -> None:
    t, _ = table()
    t.put("n1", node({"a/0/n1": {"uid": "a", "status": "held"}}), PARTITION, epoch=1)
    log = write(t)
    t.settle(PARTITION, durable=True)
    committed = node({"a/0/n1": {"uid": "a", "status": "committed"}})
    t.put("n1", committed, PARTITION, epoch=1)
    write(t)  # its transaction aborts: none of it reaches the log
    t.settle(PARTITION, durable=False)
    t.put("n1", committed, PARTITION, epoch=1)  # the replay decides the same again
    again = write(t)
    assert [k for k, _ in again] == [b"n1", b"n1\x1fholds\x1fa/0/n1"]
    t.settle(PARTITION, durable=True)
    assert restore(log + again).get("n1") == committed


def test_a_zombies_stale_entry_does_not_win_the_restore_and_a_whole_state_head_still_restores() -> None:
    t, _ = table()
    t.put("n1", node({"a/0/n1": {"uid": "a", "status": "committed"}}), PARTITION, epoch=3)
    log = write(t)
    zombie = (b"n1" + PART + b"holds" + PART + b"a/0/n1",
              orjson.dumps({"epoch": 2, "seq": 9, "state": {"uid": "a", "status": "held"}}))
    assert restore(log + [zombie]).get("n1") == t.get("n1")

    # Written before values were split: one record with every hold in it.
    whole = node({"a/0/n1": {"uid": "a"}, "b/0/n1": {"uid": "b"}}, {"z": 2.0})
    legacy = [(b"n1", orjson.dumps({"epoch": 1, "seq": 4, "state": whole}))]
    restored = restore(legacy)
    assert restored.get("n1") == whole
    # Its next write tombstones what left, as if it had been written entry by entry.
    restored.put("n1", node({"b/0/n1": {"uid": "b"}}, {"z": 2.0}), PARTITION, epoch=2)
    after = write(restored)
    assert [(k, v is None) for k, v in after] == [(b"n1", False), (b"n1\x1fholds\x1fa/0/n1", True)]
    assert restore(legacy + after).get("n1") == node({"b/0/n1": {"uid": "b"}}, {"z": 2.0})


entries = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["held", "committed", "released"]),
                          max_size=4)
steps = st.lists(st.tuples(st.sampled_from(["n1", "n2"]), st.one_of(st.none(), st.tuples(entries, entries)),
                           st.booleans()), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(steps=steps, chunk=st.integers(1, 7))
def test_a_restore_assembles_exactly_what_the_durable_writes_left(
        steps: list[tuple[str, tuple[dict[str, str], dict[str, str]] | None, bool]], chunk: int) -> None:
    """Puts and deletions of two keys, each write durable or not (an aborted transaction: its
    records never reach the log, and what it changed is given back): the log's restore, read in
    batches of any size, equals the last durable state of every key."""
    t, _ = table()
    log: list[tuple[bytes, bytes | None]] = []
    durable: dict[str, dict[str, Any] | None] = {}
    for seq, (key, change, ok) in enumerate(steps):
        if change is None:
            if t.raw(key) is None:
                continue
            t.delete(key, PARTITION)
            state = None
        else:
            holds, tombs = change
            state = node({h: {"uid": h, "status": s} for h, s in holds.items()},
                         {u: float(len(s)) for u, s in tombs.items()}, seq)
            t.put(key, state, PARTITION, epoch=1)
        records = write(t)
        t.settle(PARTITION, durable=ok)
        if ok:
            log += records
            durable[key] = state
    restored = restore(log, chunk)
    for key, state in durable.items():
        assert restored.get(key) == state
