"""Split table values (`agents.adapters.tables`, "Split values"): the owners' changelog carries a
node's head and one record per hold and tombstone, a write produces what changed, and a
restore assembles what the writes made durable, whatever batches it reads them in, with a
zombie's stale entries dropped and the entries of a write that failed written again."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from typing import Any

import faust
import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agents.adapters.loop import Outcome
from agents.adapters.owners import OwnerCore
from agents.adapters.tables import PART, VersionedState
from agents.ports import Entries
from agents.state.owner import HELD, HoldEntry, NodeOwner, NodeState, OwnerResult
from schemas.codec import decode_message, encode
from schemas.errors import SchemaError
from schemas.records import Commit, NodeDeleted, PodTerminated, Record
from tests.builders import make_claim, make_node
from tests.unit import test_holds_tally as tally
from tests.unit.test_adapter_loop import FakeMessage, FakeProducer

SPLIT = ("holds", "tombstones")
PARTITION = 1


@dataclass
class ChangelogEvent:
    key: bytes
    value: Any
    message: FakeMessage


def table(split: tuple[str, ...] = SPLIT) -> tuple[VersionedState, FakeProducer]:
    app = faust.App(f"test-{id(object())}", store="memory://", broker="kafka://127.0.0.1:1")
    t = VersionedState(app, "node-state", 4, split=split)
    producer = FakeProducer()
    t.faust_producer = lambda: producer  # type: ignore[method-assign]
    return t, producer


def write(t: VersionedState) -> list[tuple[bytes, bytes | None]]:
    """One batch's changelog write; the records it produced."""
    producer: FakeProducer = t.faust_producer()
    before = len(producer.sent)
    asyncio.run(t.write_changelog(partitions=[PARTITION]))
    return [r for _, _, records in producer.sent[before:] for r in records]


def restore(log: list[tuple[bytes, bytes | None]], chunk: int = 1000, split: tuple[str, ...] = SPLIT) -> VersionedState:
    """A fresh table restored from `log`, read in batches of `chunk` records."""
    t, _ = table(split)
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
    # Its next write tombstones what left and writes every entry that stays (compaction will
    # remove the whole head once this write replaced it).
    restored.put("n1", node({"b/0/n1": {"uid": "b"}}, {"z": 2.0}), PARTITION, epoch=2)
    after = write(restored)
    assert sorted((k, v is None) for k, v in after) == [
        (b"n1", False), (b"n1\x1fholds\x1fa/0/n1", True), (b"n1\x1fholds\x1fb/0/n1", False),
        (b"n1\x1ftombstones\x1fz", False)]
    assert restore(legacy + after).get("n1") == node({"b/0/n1": {"uid": "b"}}, {"z": 2.0})


def test_a_node_written_with_its_record_in_the_head_restores_and_is_then_written_field_by_field() -> None:
    """The owners' Node record is a split field since 2026-12-04 (it was three quarters of every
    head); a head written before, with the record inside (or none yet), restores the same node,
    and the next write moves the record into entries."""
    split = OwnerCore.split
    state = NodeState("n1")
    NodeOwner().apply(state, [make_node("n1")], OwnerResult(), [0.0], 0.0)
    value = state.to_json()
    for record in (value["record"], None):
        legacy = [(b"n1", orjson.dumps({"epoch": 1, "seq": 1, "state": {**whole(value), "record": record}}))]
        restored = restore(legacy, split=split)
        assert NodeState.from_json(restored.get("n1")).record == record  # type: ignore[arg-type]
        restored.put("n1", NodeState.from_json(restored.get("n1")).to_json(), PARTITION, epoch=2)  # type: ignore[arg-type]
        after = write(restored)
        head = orjson.loads(after[0][1])["state"]  # type: ignore[arg-type]
        assert "record" not in head
        fields = {k.split(PART)[2].decode() for k, v in after if k.startswith(b"n1" + PART + b"record")}
        assert fields == set(record or {})
        assert NodeState.from_json(restore(legacy + after, split=split).get("n1")).record == record  # type: ignore[arg-type]


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


# -- found by an adversarial review (each failed before its fix) ------------------------------------

def reread(t: VersionedState, log: list[tuple[bytes, bytes | None]]) -> None:
    """faust's restore of a partition this worker kept across a rebalance: it reads the worker's
    own writes again, into the same table."""
    t.table.apply_changelog_batch([ChangelogEvent(k, None if v is None else orjson.loads(v),
                                                  FakeMessage(t.changelog, PARTITION, i, 1, v))  # type: ignore[arg-type]
                                   for i, (k, v) in enumerate(log)])


def test_a_kept_partition_keeps_the_state_of_its_dropped_batch_whole_and_its_replay_terminates() -> None:
    """The last batch (NodeDeleted) was dropped by a rebalance that kept the partition; the
    restore reads the worker's own earlier writes again. The node in memory stays as the
    dropped batch left it, whole (not its head beside the log's older holds), and the replay
    of the batch re-sends what it decided: the pod's termination."""
    core = OwnerCore()
    t, _ = table()

    def decide(records: list[Record], epoch: int) -> Outcome:
        out = Outcome()
        state = core.apply("n1", t.get("n1"), records, [0.0] * len(records), 0.0, out)
        assert state is not None
        t.put("n1", state, PARTITION, epoch)
        return out

    decide([make_node("n1"), make_claim("p1"), Commit(uid="p1", attempt=0, node="n1", decision_key="p1")], 1)
    log = write(t)
    t.settle(PARTITION, durable=True)
    decide([NodeDeleted(name="n1")], 1)
    t.discard(PARTITION)  # revoked before it left
    reread(t, log)
    core.prune(t.keys())
    out = decide([NodeDeleted(name="n1")], 2)
    assert any(isinstance(o.record, PodTerminated) for o in out.first)
    assert t.get("n1")["holds"]["p1/0/n1"]["status"] == "terminated"  # type: ignore[index]


def test_a_whole_state_head_is_written_entry_by_entry_before_compaction_can_remove_it() -> None:
    legacy = [(b"n1", orjson.dumps({"epoch": 1, "seq": 4, "state": node({"a": {"uid": "a"}, "b": {"uid": "b"}},
                                                                          {"z": 1.0})}))]
    t = restore(legacy)
    t.put("n1", node({"a": {"uid": "a", "status": "x"}, "b": {"uid": "b"}}, {"z": 1.0}), PARTITION, epoch=2)
    log = legacy + write(t)
    compacted = list({k: (k, v) for k, v in log}.values())  # the last record per key
    compacted = [r for r in compacted if r != legacy[0]]
    assert restore(compacted).get("n1") == t.get("n1")


def test_a_zombies_entries_and_entry_tombstones_lose_to_the_new_owners_head() -> None:
    state = node({"a": {"uid": "a", "status": "committed"}}, {"u": 50.0})
    old, _ = table()
    old.put("n1", state, PARTITION, epoch=1)
    log = write(old)
    old.settle(PARTITION, durable=True)
    new = restore(log)
    new.put("n1", {**state, "allocatable": {"cpu": 1}}, PARTITION, epoch=3)  # a and u unchanged: not written
    log += write(new)
    new.settle(PARTITION, durable=True)
    # The old owner, a zombie now, writes late: a changed, u forgotten.
    old.put("n1", node({"a": {"uid": "a", "status": "released"}}), PARTITION, epoch=1)
    log += write(old)
    assert restore(log).get("n1") == new.get("n1")


def test_what_a_table_counts_as_written_follows_its_entries() -> None:
    t, _ = table()
    for i in range(50):
        t.put("n1", node({f"h{i}": {"uid": f"h{i}"}}), PARTITION, epoch=1)
        write(t)
        t.settle(PARTITION, durable=True)
    assert len(t.sizes) == 2 and t.sized_keys() == 1  # the head and the one hold there is


def test_a_keys_records_stay_in_one_changelog_batch() -> None:
    t, producer = table()
    t.batch_bytes = 600
    t.put("n1", node({f"h{i}": {"uid": f"h{i}"} for i in range(3)}), PARTITION, epoch=1)
    t.put("n2", node({f"h{i}": {"uid": f"h{i}"} for i in range(3)}), PARTITION, epoch=1)
    write(t)
    batches = [[k.split(PART)[0] for k, _ in records] for _, _, records in producer.sent]
    assert batches == [[b"n1"] * 4, [b"n2"] * 4]


def test_a_node_name_with_a_control_character_is_refused_at_intake() -> None:
    [error] = decode_message(encode(make_claim("p1", "n1\x1fholds\x1fzz")))
    assert isinstance(error, SchemaError) and error.field == "node" and "control characters" in str(error)


# -- a write from what changed (`agents.ports.Entries`) -----------------------------------------

def whole(state: dict[str, Any]) -> dict[str, Any]:
    """The same value with its maps as plain dicts: a write of it compares every entry."""
    return {k: dict(v) if isinstance(v, Entries) else v for k, v in state.items()}


step = st.one_of(
    st.tuples(st.just("ops"), st.lists(tally.OP, min_size=1, max_size=4)),
    st.tuples(st.just("write"), st.booleans()),  # durable or not
    st.tuples(st.just("dropped"), st.none()),  # put, but its batch dropped (never written)
    st.tuples(st.just("reread"), st.none()),  # the worker's own durable log read again
    st.tuples(st.just("copy"), st.none()),  # the node copied (a simulated crash keeps a deep copy)
    st.tuples(st.just("delete"), st.none()),
    # tombstones buried, stamped, forgotten (through every way a map changes); the record replaced
    st.tuples(st.just("tombstones"), st.lists(st.tuples(st.sampled_from(["bury", "stamp", "stamp", "del", "pop",
                                                                         "update", "setdefault", "clear"]),
                                                        st.sampled_from(["t0", "t1"]), st.sampled_from([1.0, 2.0])),
                                              min_size=1, max_size=4)),
    st.tuples(st.just("record"), st.sampled_from([None, "a", "b"])),
    # another owner's durable write read into this table (a partition that moved and came back)
    st.tuples(st.just("foreign"), st.lists(st.sampled_from([f"h{i}" for i in range(6)]), max_size=4)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, min_size=1, max_size=25))
@example([("tombstones", [("bury", "t0", 0.0), ("bury", "t1", 0.0)]), ("write", True),
          ("tombstones", [("stamp", "t0", 5.0)]), ("write", True), ("tombstones", [("del", "t0", 0.0)]),
          ("write", True)])
@example([("record", "a"), ("write", True), ("record", "b"), ("write", True), ("write", True), ("record", None),
          ("write", True)])
def test_a_write_from_what_changed_produces_what_a_write_comparing_every_entry_produces(
        steps: list[tuple[str, Any]]) -> None:
    """A node's holds map says which holds changed since the map before it (`Entries`), and a
    write whose changelog last carried that map compares only those; so do its tombstones and
    its record. Through holds changed in every way the tally test knows, tombstones changed in
    every way a map changes, records replaced, writes durable or not, batches dropped, restores of the
    worker's own log, copies and deletions, it writes exactly the records of a table that
    compares every entry (each value given as plain dicts), and a restore of its durable log
    gives the last durable state."""
    nodes = [NodeState("n1"), NodeState("n2")]
    epoch = 1
    quick, full = table(OwnerCore.split)[0], table(OwnerCore.split)[0]
    log: list[tuple[bytes, bytes | None]] = []
    durable: dict[str, Any] = {}
    for seq, (kind, arg) in enumerate(steps):
        if kind == "ops":
            for op in arg:
                tally.apply(nodes, op)
        elif kind == "tombstones":
            tombstones = nodes[0].tombstones
            for op, uid, at in arg:
                if op == "bury":
                    nodes[0].bury(uid)
                elif op == "stamp":
                    tombstones[uid] = at
                elif op == "del" and uid in tombstones:
                    del tombstones[uid]
                elif op == "pop":
                    tombstones.pop(uid, None)
                elif op == "update":
                    tombstones.update({uid: at})
                elif op == "setdefault":
                    tombstones.setdefault(uid, at)
                elif op == "clear":
                    tombstones.clear()
        elif kind == "record":  # replaced whole, as the cores do (an equal record is another object)
            nodes[0].record = None if arg is None else {"name": "n1", "labels": {"zone": arg}, "uid": "u1"}
        elif kind in ("write", "dropped"):
            state = {**nodes[0].to_json(), "seq": seq}
            quick.put("n1", state, PARTITION, epoch=epoch)
            full.put("n1", whole(state), PARTITION, epoch=epoch)
            if kind == "dropped":
                quick.discard(PARTITION)
                full.discard(PARTITION)
                continue
            records = write(quick)
            assert sorted(records, key=lambda r: r[0]) == sorted(write(full), key=lambda r: r[0])
            quick.settle(PARTITION, durable=arg)
            full.settle(PARTITION, durable=arg)
            if arg:
                log += records
                durable["n1"] = whole(state)
        elif kind == "reread":
            reread(quick, log)
            reread(full, log)
        elif kind == "foreign":
            other = table(OwnerCore.split)[0]  # the other owner restored the log, then wrote the node
            reread(other, log)
            epoch += 1
            holds = {hid: HoldEntry(uid=hid, attempt=epoch, decision_key=hid, requests={}, priority=0,
                                    status=HELD).plain() for hid in arg}
            other.put("n1", {**NodeState("n1").to_json(), "holds": holds, "seq": seq}, PARTITION, epoch=epoch)
            records = write(other)
            log += records
            durable["n1"] = other.get("n1")
            reread(quick, records)
            reread(full, records)
            nodes[0] = NodeState.from_json(quick.get("n1"))  # decoded anew
            epoch += 1
            nodes[0] = copy.deepcopy(nodes[0])
        elif kind == "delete" and quick.raw("n1") is not None:
            quick.delete("n1", PARTITION)
            full.delete("n1", PARTITION)
            records = write(quick)
            assert sorted(records, key=lambda r: r[0]) == sorted(write(full), key=lambda r: r[0])
            quick.settle(PARTITION, durable=True)
            full.settle(PARTITION, durable=True)
            log += records
            durable["n1"] = None
    restored = restore(log, split=OwnerCore.split)
    if "n1" in durable:
        got = restored.get("n1")
        assert (got is None) if durable["n1"] is None else got == durable["n1"]


def test_a_shallow_copy_of_a_node_does_not_take_its_tombstones_changes() -> None:
    """A copy made by `copy.copy` or `dataclasses.replace` has tombstones of its own: what it
    writes does not clear what the original has still to write."""
    import dataclasses

    for make in (copy.copy, dataclasses.replace):
        quick = table(OwnerCore.split)[0]
        node = NodeState("n1")
        node.bury("a")
        quick.put("n1", node.to_json(), PARTITION, epoch=1)
        write(quick)
        quick.settle(PARTITION, durable=True)
        node.bury("b")
        make(node).to_json()
        quick.put("n1", node.to_json(), PARTITION, epoch=1)
        assert (b"n1\x1ftombstones\x1fb") in [k for k, _ in write(quick)]
