"""Versioned faust tables whose changelog the agents write themselves.

Every value the agents write is wrapped as `{"epoch": E, "seq": S, "state": ...}`. E is the
writer's epoch for the key's partition in the assignment the batch was *fetched* in: the larger
of that consumer-group generation and one more than the highest epoch restored for the
partition, so epochs grow with every new owner even if the group's generations start over.
S grows with every write of the worker (so with every write of a key, and a key written again
after its deletion goes on past its older writes). The same epoch stamps the batch's outputs,
so readers can drop a zombie's records (`agents.intake.EpochFence`).

Restore. `supersedes` is the rule a restore applies per key: keep the value with the highest
(E, S). What it protects against depends on the broker (docs/architecture.md, "What is
guaranteed on which broker"):
- Tansu keeps every record (no compaction): a zombie's late, lower-epoch write is in the log
  beside the newer ones, and the rule drops it.
- Apache Kafka compacts the changelog and keeps only the *last* record per key whatever its
  epoch, so the rule alone cannot stop a zombie's late write that survives compaction. There
  the changelog is written in the batch's transaction (`agents.adapters.transactions`): a
  zombie's producer is fenced before the new owner restores, its open transaction is aborted,
  and the restore reads committed records only, so no zombie write can exist to survive
  compaction. The rule stays (it is harmless when epochs only grow).

Writes skip faust's per-key changelog path (a FutureMessage and a trip through faust's producer
buffer per write, with stdlib JSON: about a quarter of the state worker's CPU in a
sandbox-burst profile). `put` changes the table in memory and remembers the key;
`write_changelog` then produces each key's last value of the batch straight to the changelog
partition of its input (orjson, raw key: what faust's restore reads back; record batches per
partition) with the producer it is given (faust's, or a partition's transactional one).

Split values. A table may name fields of its values that are maps (`split`: the owners'
`holds` and `tombstones`): each entry of such a map is a changelog record of its own, keyed
`<key>\x1f<field>\x1f<entry>`, and the key's own record carries the rest (its head). A write
then produces the head and only the entries that changed since the key was last written (by
identity, else equality, with what the changelog holds: `ChangelogImage.parts`), and a
tombstone for each entry that left, so that a batch writes in proportion to what it changed,
not to what the node holds; compaction keeps one record per entry. The records of one key's
write (its head, then its entries) go in one producer batch. A restore (`ChangelogImage`)
applies `supersedes` per head; an entry takes the verdict of the head read before it (a
zombie's entries fall with its stale head), else the rule per entry; then each key is
assembled from its head and entries, unless this worker wrote it since. A head that carries
a split field (written before values were split) replaces that field's entries, and the next
write writes them all anew (`Unwritten`). What the changelog holds of the entries is changed
when a write is produced, and given back if its batch does not become durable (`settle`).

Rebalances: the table tells its listeners when partitions are assigned (before any restore
starts, so a transactional producer can fence its predecessor first) and when a restore
completed (after every rebalance, not only the first: faust sets its own recovery-completed
event once and never clears it). On completion the table forgets the keys of partitions it no
longer owns, those written by the agents included (faust's memory store only tracks restored
keys), and suspends faust's flow control until faust has seeked the input partitions (see
`on_recovery_completed`: without it, messages fetched during the seek were lost).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

import faust
import orjson
from faust.tables.table import Table

from agents.ports import Entries

log = logging.getLogger("koordstream.tables")

AssignedHook = Callable[[set[Any], set[Any], int], Awaitable[None]]  # (assigned, revoked, generation)
RestoredHook = Callable[[set[int]], Awaitable[None]]  # the partitions restored and owned now


def supersedes(incoming: Mapping[str, Any] | None, current: Mapping[str, Any] | None) -> bool:
    """True when `incoming` may replace `current` (deletes and first writes always may)."""
    if incoming is None or current is None:
        return True
    return (incoming["epoch"], incoming["seq"]) >= (current["epoch"], current["seq"])


class UnreadableState(ValueError):
    """A table value this version cannot read: written by an incompatible version, or corrupt."""


S = TypeVar("S")


def read_state(table: str, key: str, raw: dict[str, Any], decode: Callable[[dict[str, Any]], S]) -> S:
    """`decode(raw)`, or an `UnreadableState` that names the table, the key and the field. The
    loop then stops the worker without acknowledging the batch (README, "Upgrading")."""
    try:
        return decode(raw)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UnreadableState(
            f"{table}: the stored state of {key!r} cannot be read ({type(exc).__name__}: {exc}); it was "
            "written by an incompatible koordstream version or is corrupt. Nothing was acknowledged. "
            "See README, 'Upgrading', for how to start the tables afresh."
        ) from exc


def cached_state(cache: Mapping[str, tuple[Mapping[str, Any], S]], table: str, key: str,
                 stored: dict[str, Any] | None, decode: Callable[[dict[str, Any]], S], new: Callable[[str], S]) -> S:
    """The state of `key` for a core that keeps its decoded states (`cache`: key -> (the table
    value it last returned, that value's state)): the cached one while the table still holds the
    very value it came from (a restore puts other objects there), else decoded anew, or `new`."""
    cached = cache.get(key)
    if cached is not None and stored is not None and cached[0] is stored:
        return cached[1]
    return read_state(table, key, stored, decode) if stored else new(key)


PART = b"\x1f"  # between a key, a split field and an entry: the changelog key of one entry
RECORD_OVERHEAD = 64  # bytes a record adds to a batch beyond its key and value, at most (about)
CLOCK_PREFIX = b"\x00clock/"  # the key of a partition's log clock (`VersionedState.clock`)
ChangelogRecord = tuple[bytes, Any, int]  # a changelog record as a restore reads it: key, value (decoded JSON), partition


class ChangelogImage:
    """What a changelog holds, as a restore reads it: the rule `supersedes` per key and per
    entry of a split field, and each key assembled from its head and entries (module
    docstring), over a key -> wrapped value map. Pure: faust's restore of a table
    (`VersionedTable`) and a scheduler replica's start (`streams.app`) both read through it."""

    def __init__(self, name: str, split: tuple[str, ...] = (), data: Any = None) -> None:
        self.name = name
        self.split = split  # the fields written entry by entry
        self.data: Any = {} if data is None else data  # key -> wrapped value (faust's store, for a table)
        self.restored_epochs: dict[int, int] = {}  # partition -> the highest epoch a restore applied
        self.partition_of: dict[bytes, int] = {}  # key -> its partition (restored or written)
        # key -> split field -> entry -> (epoch, seq, value): what the changelog holds of them,
        # as restored and as written by this worker since.
        self.parts: dict[bytes, dict[str, dict[str, tuple[int, int, Any]]]] = {}
        self.restored: set[bytes] = set()  # keys whose value in `data` a restore set (not a write since)
        # key -> split field -> the `Entries.token` of the map whose entries `parts` holds, as
        # this worker's last write of the key left them; dropped by anything else that changes
        # the key's `parts` (a restore, a write given back), so that the next write compares all.
        self.synced: dict[bytes, dict[str, object]] = {}
        self.verdicts: dict[bytes, bool] = {}  # key -> whether the last head read of it applied

    def entry_of(self, raw_key: bytes) -> tuple[bytes, str, str] | None:
        """(key, field, entry) when `raw_key` is an entry's changelog key, else None."""
        if not self.split or PART not in raw_key:
            return None
        parts = raw_key.split(PART, 2)
        if len(parts) != 3 or parts[1].decode() not in self.split:
            return None
        return parts[0], parts[1].decode(), parts[2].decode()

    def read(self, records: Sequence[ChangelogRecord]) -> tuple[list[int], set[bytes]]:
        """Judge records in log order: the positions of the keys' own records that apply (the
        caller stores them in `data`, in order), and the keys to `assemble` after that."""
        restored = self.restored_epochs
        newest: dict[bytes, Any] = {}
        kept = []
        assemble: set[bytes] = set()
        synced = self.synced
        for i, (key, value, partition) in enumerate(records):
            entry = self.entry_of(key)
            if entry is not None:
                synced.pop(entry[0], None)
                self._apply_entry(key, entry, value, partition, assemble)
                continue
            synced.pop(key, None)
            current = newest[key] if key in newest else self.data.get(key)
            applies = supersedes(value, current)
            if self.split:
                self.verdicts[key] = applies
            if applies:
                newest[key] = value
                kept.append(i)
                if value is not None:
                    self.partition_of[key] = partition
                    restored[partition] = max(restored.get(partition, -1), value["epoch"])
                    if self.split:
                        self._apply_whole(key, value)
                        self.restored.add(key)
                        assemble.add(key)
                else:  # forgotten (`VersionedState.delete`)
                    self.partition_of.pop(key, None)
                    self.parts.pop(key, None)
                    self.restored.discard(key)
            elif value["epoch"] == current["epoch"]:
                # This worker's own earlier write, read again: faust resumes the restore of a
                # partition kept across a rebalance from where its last restore ended.
                log.debug("restore of %s skipped an earlier write of %r (epoch %s, seq %s < %s)", self.name, key,
                          value["epoch"], value["seq"], current["seq"])
            else:
                log.warning("restore of %s dropped a stale write of %r (epoch %s, seq %s; kept epoch %s, seq %s)",
                            self.name, key, value["epoch"], value["seq"], current["epoch"], current["seq"])
        return kept, assemble

    def apply(self, records: Sequence[ChangelogRecord]) -> None:
        """`read`, store and assemble: a restore into `data` without faust."""
        kept, assemble = self.read(records)
        for i in kept:
            key, value, _ = records[i]
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value
        self.assemble(assemble)

    def _apply_entry(self, raw_key: bytes, entry_of: tuple[bytes, str, str], value: dict[str, Any] | None,
                     partition: int, assemble: set[bytes]) -> None:
        """One entry of a split field, restored. An entry is written right after its key's head,
        so it takes that head's verdict: dropped with a stale head (a zombie's write, or this
        worker's own earlier one read again). Otherwise the rule per entry (a tombstone carries
        no epoch: it applies)."""
        key, name, entry = entry_of
        if self.verdicts.get(key) is False:
            log.debug("restore of %s skipped %r: its head did not apply", self.name, raw_key)
            return
        assemble.add(key)
        if value is None:
            self.parts.get(key, {}).get(name, {}).pop(entry, None)
            return
        entries = self.parts.setdefault(key, {}).setdefault(name, {})
        current = entries.get(entry)
        if current is None or (value["epoch"], value["seq"]) >= current[:2]:
            entries[entry] = (value["epoch"], value["seq"], value["state"])
            self.restored_epochs[partition] = max(self.restored_epochs.get(partition, -1), value["epoch"])
        elif value["epoch"] != current[0]:
            log.warning("restore of %s dropped a stale write of %r (epoch %s, seq %s; kept epoch %s, seq %s)",
                        self.name, raw_key, value["epoch"], value["seq"], current[0], current[1])

    def _apply_whole(self, key: bytes, value: dict[str, Any]) -> None:
        """A head that carries split fields whole (written before values were split): they are
        what the changelog holds of those fields, inside a head that compaction removes once a
        split write replaced it, so the first split write writes every entry anew (`Unwritten`).
        A field written as a list (the owners' tombstones before they had times, as commit
        22e8b29 wrote them) is a map of its items to 0.0 (no time: what `NodeState.from_json`
        makes of such a list), and a field written as null an empty map."""
        state = value["state"]
        for name in self.split:
            if name in state:
                whole = state[name]
                entries = dict.fromkeys(whole, 0.0) if isinstance(whole, list) else (whole or {})
                self.parts.setdefault(key, {})[name] = {
                    entry: (value["epoch"], value["seq"], Unwritten(v)) for entry, v in entries.items()}

    def assemble(self, keys: Iterable[bytes]) -> None:
        """Each key's value as the restore has it: its head with its entries. Only keys whose
        value a restore set: a value written since (a partition kept across a rebalance, its
        last batch not durable) stays whole in memory, ahead of the log, and its replay re-sends
        what that batch decided; the entries read go to `parts` alone."""
        for key in keys:
            wrapped = self.data.get(key)
            if wrapped is None or key not in self.restored:
                continue  # deleted (its entries' tombstones follow the head's), or written since
            entries = self.parts.get(key, {})
            state = {k: v for k, v in wrapped["state"].items() if k not in self.split}
            for name in self.split:
                state[name] = {entry: v.value if isinstance(v, Unwritten) else v
                               for entry, (_, _, v) in entries.get(name, {}).items()}
            self.data[key] = {**wrapped, "state": state}

    def forget(self, key: bytes) -> None:
        """The key left with its partition."""
        self.data.pop(key, None)
        self.parts.pop(key, None)
        self.synced.pop(key, None)
        self.partition_of.pop(key, None)
        self.restored.discard(key)
        self.verdicts.pop(key, None)


_ABSENT: Any = object()  # an entry no longer in its map


class Unwritten:
    """An entry restored from a whole-state head: equal to nothing, so written at the next write."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


class VersionedTable(Table[bytes, Any]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.assigned_hooks: list[AssignedHook] = []
        self.restored_hooks: list[RestoredHook] = []
        super().__init__(*args, **kwargs)
        self.image = ChangelogImage(self.name, data=self.data)
        self.restored_epochs = self.image.restored_epochs
        self.partition_of = self.image.partition_of
        self.parts = self.image.parts

    def apply_changelog_batch(self, batch: Iterable[Any]) -> None:
        events = list(batch)
        kept, assemble = self.image.read([(e.key, e.value, e.message.partition) for e in events])
        super().apply_changelog_batch([events[i] for i in kept])
        self.image.assemble(assemble)

    async def on_rebalance(self, assigned: set[Any], revoked: set[Any], newly_assigned: set[Any],
                           generation_id: int = 0) -> None:
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
        for hook in self.assigned_hooks:
            await hook(assigned, revoked, generation_id)

    async def on_recovery_completed(self, active_tps: set[Any], standby_tps: set[Any]) -> None:
        await super().on_recovery_completed(active_tps, standby_tps)
        active = {tp.partition for tp in active_tps}
        for key in [key for key, partition in self.partition_of.items() if partition not in active]:
            self.image.forget(key)
        for hook in self.restored_hooks:
            await hook(active)
        # faust now resumes the stream partitions, then seeks them to their committed offsets,
        # then resumes flow control, which clears every stream queue. Messages fetched between
        # the resume and the seek would reach a queue only to be cleared, while faust's read
        # offset moved past them, so it drops them when the seek fetches them again: lost.
        # Suspended flow control holds them at the door instead (faust's conductor waits for it),
        # and they go in after the clearing; the loop skips what then arrives twice.
        self.app.flow_control.suspend()




class VersionedState:
    """Read and write one agent's table; values are JSON states (see module docstring).

    Besides the cores' keys, each partition has one key of the loop's own, `\x00clock/<p>`:
    the newest log time decided from that partition and the offset after the last record it
    covers (`clock`, `decided`, `advance`), written with the run's states, so that a record
    replayed after a crash is judged at least as late as anything that was decided before it,
    and a record decided already at that clock (docs/architecture.md, "How time enters")."""

    def __init__(self, app: faust.App, name: str, partitions: int, split: tuple[str, ...] = (),
                 batch_bytes: int = 3 * 2**18) -> None:
        self.app = app
        self.batch_bytes = batch_bytes  # a changelog batch is closed before it would pass this (estimated)
        # Raw UTF-8 keys (not JSON-quoted ones), so the partitioner puts a key's changelog record
        # in the same partition number as its input records: they move together on a rebalance.
        self.table = VersionedTable(app, name=name, default=None, partitions=partitions, use_partitioner=True,
                                    key_type=bytes)
        self.table.image.split = split
        app.tables.add(self.table)
        self._dirty: dict[int, dict[bytes, None]] = {}  # partition -> keys put or deleted since the last write
        self._deleted: dict[int, set[bytes]] = {}  # partition -> keys deleted since the last write
        # partition -> how to give back what its last write changed in `ChangelogImage.parts` (`settle`)
        self._undo: dict[int, list[tuple[bytes, str | None, str, Any]]] = {}
        self._written: dict[int, list[bytes]] = {}  # partition -> the keys its last write wrote (`settle`)
        self._seq = 0  # the seq of the last write (`put`)
        # What this worker wrote to the changelog: per key the size of its last value, and the
        # totals written (the soak benchmark's figures, `streams.metrics`).
        self.sizes: dict[bytes, int] = {}
        self.written_bytes = 0
        self.written_records = 0
        self.deleted_keys = 0

    def on_assigned(self, hook: AssignedHook) -> None:
        """`hook(assigned, revoked, generation)` runs on every assignment, before the restore."""
        self.table.assigned_hooks.append(hook)

    def on_restored(self, hook: RestoredHook) -> None:
        """`hook(partitions)` runs after every restore, with the partitions owned now."""
        self.table.restored_hooks.append(hook)

    def raw(self, key: str) -> dict[str, Any] | None:
        value: dict[str, Any] | None = self.table.data.get(key.encode())  # the store: no __missing__
        return value

    def get(self, key: str) -> dict[str, Any] | None:
        wrapped = self.raw(key)
        return None if wrapped is None else wrapped["state"]  # type: ignore[no-any-return]

    def states(self, partitions: Collection[int] | None = None) -> list[tuple[str, dict[str, Any]]]:
        """Every (key, state) this worker holds, of `partitions` (default: all it holds); not
        the partitions' clocks."""
        partition_of = self.table.partition_of
        return [(key.decode(), value["state"]) for key, value in list(self.table.data.items())
                if value and not key.startswith(CLOCK_PREFIX)
                and (partitions is None or partition_of.get(key) in partitions)]

    def keys(self) -> set[str]:
        return {key.decode() for key in self.table.data if not key.startswith(CLOCK_PREFIX)}

    def clock(self, partition: int) -> float:
        """The newest log time decided from `partition` (0: none), as restored or advanced."""
        value = self.table.data.get(CLOCK_PREFIX + str(partition).encode())
        return float(value["state"]["now"]) if value else 0.0

    def decided(self, partition: int) -> int:
        """The offset after the last record of `partition` that the clock covers (0: unknown,
        also for a clock written before it was recorded): a record below it was decided, and
        what it decided is in the table."""
        value = self.table.data.get(CLOCK_PREFIX + str(partition).encode())
        return int(value["state"].get("next", 0)) if value else 0

    def advance(self, partition: int, now: float, epoch: int, next_offset: int = 0) -> None:
        """Move the partition's clock to `now` and what it covers to `next_offset` (neither
        back), written with the run's states."""
        clock, decided = self.clock(partition), self.decided(partition)
        if now > clock or next_offset > decided:
            self.put((CLOCK_PREFIX + str(partition).encode()).decode(),
                     {"now": max(now, clock), "next": max(next_offset, decided)}, partition, epoch)

    def epoch(self, partition: int, generation: int) -> int:
        """The epoch of what is decided from `partition`'s records fetched in `generation`."""
        restored = self.table.restored_epochs.get(partition, -1)
        return max(int(generation), restored + 1)

    def put(self, key: str, state: dict[str, Any], partition: int, epoch: int) -> None:
        """Change the table in memory; `write_changelog` makes it durable."""
        previous = self.raw(key)
        raw_key = key.encode()
        # One counter for every key: a key written again after its deletion still goes past
        # its older writes in a restore (a deletion whose batch was lost leaves them in the log).
        self._seq = max(self._seq, previous["seq"] if previous else 0) + 1
        self.table.data[raw_key] = {"epoch": epoch, "seq": self._seq, "state": state}
        self.table.image.restored.discard(raw_key)
        self.table.partition_of[raw_key] = partition
        self._dirty.setdefault(partition, {})[raw_key] = None

    def delete(self, key: str, partition: int) -> None:
        """Forget a key in memory; `write_changelog` writes its tombstone (a null value, which
        compaction removes in the end, and a restore applies as a deletion)."""
        raw_key = key.encode()
        self.table.data.pop(raw_key, None)
        self.table.partition_of.pop(raw_key, None)
        self.sizes.pop(raw_key, None)
        self.deleted_keys += 1
        self._dirty.setdefault(partition, {})[raw_key] = None
        self._deleted.setdefault(partition, set()).add(raw_key)

    def stored_bytes(self) -> int:
        """The bytes of the values this worker holds, as last written here (keys restored and
        not written since are not counted; keys gone with their partition are dropped)."""
        data = self.table.data
        for key in [k for k in self.sizes if k.split(PART, 1)[0] not in data]:
            del self.sizes[key]
        return sum(self.sizes.values())

    def sized_keys(self) -> int:
        """How many keys `stored_bytes` covers (a split key's entries count with it)."""
        return len({k.split(PART, 1)[0] for k in self.sizes})

    def discard(self, partition: int) -> None:
        """Forget the keys put for `partition` since its last write (its batch is dropped; the
        values stay in memory until the next restore, see docs: a replay re-sends them)."""
        self._dirty.pop(partition, None)
        self._deleted.pop(partition, None)

    def settle(self, partition: int, durable: bool) -> None:
        """The batch last written for `partition` became durable, or did not: then what its
        write changed in `table.parts` is given back, so that the replay writes it again."""
        undo = self._undo.pop(partition, [])
        written = self._written.pop(partition, [])
        if durable:
            return
        for key in written:
            self.table.image.synced.pop(key, None)
        parts = self.table.parts
        for key, name, entry, previous in reversed(undo):
            if name is None:  # the key was deleted: all of its entries come back
                parts[key] = previous
                continue
            entries = parts.setdefault(key, {}).setdefault(name, {})
            if previous is None:
                entries.pop(entry, None)
            else:
                entries[entry] = previous

    @property
    def changelog(self) -> str:
        name: str = self.table.changelog_topic.get_topic_name()
        return name

    def faust_producer(self) -> Any:
        """faust's own aiokafka producer (not on ProducerT)."""
        return cast(Any, self.app.producer)._ensure_producer()

    async def write_changelog(self, producer: Any = None, partitions: Iterable[int] | None = None) -> list[Awaitable[object]]:
        """Produce every key put since the last call (its last value) for `partitions` (default:
        all), as record batches per partition (aiokafka's batch API: a message per key, without
        a send call per key); the returned awaitables resolve when the broker acknowledged."""
        producer = producer if producer is not None else self.faust_producer()
        topic = self.changelog
        chosen = list(self._dirty) if partitions is None else [p for p in partitions if p in self._dirty]
        data = self.table.data
        acks: list[Awaitable[object]] = []
        for partition in chosen:
            keys = self._dirty.pop(partition)
            deleted = self._deleted.pop(partition, set())
            undo = self._undo[partition] = []
            self._written[partition] = list(keys)
            batch, filled = producer.create_batch(), 0  # `filled`: the batch's bytes, as estimated
            for key in keys:
                wrapped = data.get(key)
                if wrapped is None and key not in deleted:
                    continue  # forgotten by a restore meanwhile (the partition moved)
                records = self._records(key, wrapped, undo)
                size = sum(len(k) + len(v or b"") + RECORD_OVERHEAD for k, v in records)
                if filled and filled + size > self.batch_bytes:
                    # A key's records go in one batch (a broker appends a batch whole), so a
                    # crash cannot leave its new head beside its old entries.
                    acks.append(await producer.send_batch(batch, topic, partition=partition))
                    batch, filled = producer.create_batch(), 0
                filled += size
                for record_key, value in records:
                    if value is not None:
                        self.sizes[record_key] = len(value)
                        self.written_bytes += len(value)
                    else:
                        self.sizes.pop(record_key, None)
                    self.written_records += 1
                    if batch.append(key=record_key, value=value, timestamp=None) is None:  # full: send, start another
                        if batch.record_count():
                            acks.append(await producer.send_batch(batch, topic, partition=partition))
                            batch, filled = producer.create_batch(), 0
                        if batch.append(key=record_key, value=value, timestamp=None) is None:  # larger than a batch
                            acks.append(await producer.send(topic, value, key=record_key, partition=partition))
            if batch.record_count():
                acks.append(await producer.send_batch(batch, topic, partition=partition))
        return acks

    def _records(self, key: bytes, wrapped: dict[str, Any] | None,
                 undo: list[tuple[bytes, str | None, str, Any]]) -> list[tuple[bytes, bytes | None]]:
        """The changelog records of one key's write: its value, or its head and the entries of
        its split fields that changed (module docstring); a deletion's tombstones."""
        split = self.table.image.split
        if not split:
            return [(key, None if wrapped is None else orjson.dumps(wrapped))]
        parts, synced = self.table.parts, self.table.image.synced
        if wrapped is None:  # deleted: the head's tombstone and every entry's
            fields = parts.pop(key, {})
            synced.pop(key, None)
            undo.append((key, None, "", fields))
            gone: list[tuple[bytes, bytes | None]] = [(key, None)]
            return gone + [(key + PART + name.encode() + PART + entry.encode(), None)
                           for name, entries in fields.items() for entry in entries]
        epoch, seq, state = wrapped["epoch"], wrapped["seq"], wrapped["state"]
        out: list[tuple[bytes, bytes | None]] = [
            (key, orjson.dumps({"epoch": epoch, "seq": seq, "state": {k: v for k, v in state.items() if k not in split}}))]
        fields = parts.setdefault(key, {})
        last = synced.pop(key, None) or {}
        tokens: dict[str, object] = {}
        for name in split:
            entries = fields.setdefault(name, {})
            current: dict[str, Any] = state.get(name) or {}
            prefix = key + PART + name.encode() + PART
            if isinstance(current, Entries):
                tokens[name] = current.token
                if current.after is not None and last.get(name) is current.after:
                    # `entries` are the map `after` (this worker wrote it last), and the entries
                    # not in `changed` are the same objects in both: only those can differ.
                    for entry in current.changed:
                        value = current.get(entry, _ABSENT)
                        self._entry(key, name, entry, value, entries, epoch, seq, prefix, undo, out)
                    continue
            for entry, value in current.items():
                self._entry(key, name, entry, value, entries, epoch, seq, prefix, undo, out)
            for entry in [e for e in entries if e not in current]:
                self._entry(key, name, entry, _ABSENT, entries, epoch, seq, prefix, undo, out)
        if tokens:
            synced[key] = tokens
        return out

    @staticmethod
    def _entry(key: bytes, name: str, entry: str, value: Any, entries: dict[str, tuple[int, int, Any]], epoch: int,
               seq: int, prefix: bytes, undo: list[tuple[bytes, str | None, str, Any]],
               out: list[tuple[bytes, bytes | None]]) -> None:
        """One entry of a split field against what the changelog holds of it: written if it
        changed (by identity, else equality), a tombstone if it left (`value` is `_ABSENT`)."""
        held = entries.get(entry)
        if value is _ABSENT:
            if held is not None:
                undo.append((key, name, entry, entries.pop(entry)))
                out.append((prefix + entry.encode(), None))
            return
        if held is not None and (held[2] is value or held[2] == value):
            return
        undo.append((key, name, entry, held))
        entries[entry] = (epoch, seq, value)
        out.append((prefix + entry.encode(), orjson.dumps({"epoch": epoch, "seq": seq, "state": value})))
