"""Records written as batches (schema 1.1) read back as the same records, in the same order,
as when each is written on its own; a bad member or shared value is a dead letter naming
`members[i].<field>` or `shared.<field>` while the other members are read; and a message
written by a 1.0 writer (no batches) is still read."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.codec import BATCH_KIND, MIN_BATCH, decode_message, encode_batch
from schemas.errors import SchemaError
from schemas.records import RECORD_TYPES, Claim, Commit, Held, ResourceList
from tests.unit.test_codec_fast_path import JSON, record_of


def _claim(i: int, **changes: Any) -> Claim:
    return Claim(uid=f"p{i}", attempt=1, node=f"n{i % 3}", decision_key=f"p{i}",
                 requests=ResourceList({"cpu": 250, "memory": 2**29}), namespace="sb", **changes)


def _runs(cls_and_count: list[tuple[type, int]]) -> st.SearchStrategy[list[Any]]:
    return st.tuples(*[st.lists(record_of(cls), min_size=n, max_size=n) for cls, n in cls_and_count]).map(
        lambda parts: [r for part in parts for r in part])


# Runs of one kind (what batches), alternating kinds, and records that share most fields.
MESSAGES = st.one_of(
    st.sampled_from(RECORD_TYPES).flatmap(lambda cls: st.lists(record_of(cls), min_size=1, max_size=MIN_BATCH + 3)),
    st.lists(st.sampled_from(RECORD_TYPES), min_size=1, max_size=3).flatmap(
        lambda kinds: _runs([(cls, MIN_BATCH) for cls in kinds])),
    st.lists(st.integers(0, 9), min_size=MIN_BATCH, max_size=MIN_BATCH + 4).flatmap(lambda ids: st.builds(
        lambda extra: [_claim(i, priority=extra if i % 2 else 0) for i in ids], st.integers(0, 2))),
)


@settings(max_examples=400)
@given(MESSAGES)
def test_a_batched_message_reads_as_the_records_written_one_by_one(records: list[Any]) -> None:
    one_by_one = decode_message(encode_batch(records, batched=False))
    batched = decode_message(encode_batch(records))
    assert [_plain(r) for r in batched] == [_plain(r) for r in one_by_one]


def _plain(result: Any) -> Any:
    """A record, or an error as its reason, value and field (without where in the message it was)."""
    if isinstance(result, SchemaError):
        return "error", result.reason, repr(result.value), result.field.split("]")[-1].lstrip(".").removeprefix("shared.")
    return result


def test_runs_of_one_kind_become_batches_with_their_common_fields_shared() -> None:
    records = [_claim(i) for i in range(MIN_BATCH)] + [Commit(uid="p0", attempt=1, node="n0", decision_key="p0")] + [
        _claim(i) for i in range(MIN_BATCH, 2 * MIN_BATCH)]
    items = orjson.loads(encode_batch(records))
    assert [item["kind"] for item in items] == [BATCH_KIND, "Commit", BATCH_KIND]
    first = items[0]
    assert first["of"] == "Claim" and first["schema_version"] == "1.1"
    assert first["shared"]["requests"] == {"cpu": "250m", "memory": "536870912"}
    assert first["shared"]["namespace"] == "sb" and "uid" not in first["shared"]
    assert [m["uid"] for m in first["members"]] == [f"p{i}" for i in range(MIN_BATCH)]
    assert decode_message(encode_batch(records)) == records


def test_equal_values_of_different_classes_are_not_merged() -> None:
    records = [_claim(i) for i in range(MIN_BATCH - 1)] + [dataclasses.replace(_claim(9), gang_strict=1)]  # type: ignore[arg-type]
    items = orjson.loads(encode_batch(records))
    assert "gang_strict" not in items[0]["shared"] and "namespace" in items[0]["shared"]
    batched, one_by_one = decode_message(encode_batch(records)), decode_message(encode_batch(records, batched=False))
    assert [_plain(r) for r in batched] == [_plain(r) for r in one_by_one]
    assert isinstance(batched[-1], SchemaError) and batched[-1].field == f"[0].members[{MIN_BATCH - 1}].gang_strict"


def test_a_bad_member_is_named_and_the_others_are_read() -> None:
    records = [_claim(i) for i in range(MIN_BATCH)]
    items = orjson.loads(encode_batch(records))
    items[0]["members"][1]["attempt"] = "two"
    out = decode_message(orjson.dumps(items))
    assert out[0] == records[0] and out[2] == records[2]
    error = out[1]
    assert isinstance(error, SchemaError) and error.field == "[0].members[1].attempt" and error.value == "two"


def test_a_bad_shared_value_fails_every_member_naming_the_shared_field() -> None:
    items = orjson.loads(encode_batch([_claim(i) for i in range(MIN_BATCH)]))
    items[0]["shared"]["requests"] = {"cpu": "lots"}
    out = decode_message(orjson.dumps(items))
    assert len(out) == MIN_BATCH
    assert all(isinstance(e, SchemaError) and e.field == "[0].shared.requests.cpu" for e in out)


def test_a_member_that_sets_a_shared_field_keeps_its_own_value() -> None:
    items = orjson.loads(encode_batch([_claim(i) for i in range(MIN_BATCH)]))
    items[0]["members"][1]["namespace"] = "other"
    out = decode_message(orjson.dumps(items))
    assert [r.namespace for r in out] == ["sb", "other"] + ["sb"] * (MIN_BATCH - 2)


@settings(max_examples=200)
@given(st.dictionaries(st.sampled_from(["of", "shared", "members", "schema_version"]), JSON, min_size=1))
def test_a_malformed_batch_is_an_error_never_an_exception(mangled: dict[str, Any]) -> None:
    base = orjson.loads(encode_batch([_claim(i) for i in range(MIN_BATCH)]))[0]
    out = decode_message(orjson.dumps({**base, **mangled}))
    assert all(isinstance(r, (Claim, SchemaError)) for r in out)


def test_a_batch_names_what_is_wrong_with_it() -> None:
    base = orjson.loads(encode_batch([_claim(i) for i in range(MIN_BATCH)]))[0]
    for change, field in (({"of": "Nope"}, "of"), ({"members": {}}, "members"), ({"shared": []}, "shared"),
                          ({"schema_version": "2.0"}, "schema_version")):
        out = decode_message(orjson.dumps({**base, **change}))
        assert len(out) == 1 and isinstance(out[0], SchemaError) and out[0].field == field, (change, out)
    out = decode_message(orjson.dumps({**base, "members": [7, base["members"][1]]}))
    assert isinstance(out[0], SchemaError) and out[0].field == "members[0]" and isinstance(out[1], Claim)


def test_the_batch_json_schema_accepts_what_the_codec_writes() -> None:
    import jsonschema

    from schemas.jsonschema import batch_schema

    item = orjson.loads(encode_batch([_claim(i) for i in range(MIN_BATCH)]))[0]
    jsonschema.validate(item, batch_schema())
    for bad in ({"of": "Nope"}, {"members": {}}, {"schema_version": "1.0"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**item, **bad}, batch_schema())


def test_a_run_shorter_than_min_batch_is_written_record_by_record() -> None:
    items = orjson.loads(encode_batch([_claim(i) for i in range(MIN_BATCH - 1)]))
    assert [item["kind"] for item in items] == ["Claim"] * (MIN_BATCH - 1)


def test_a_message_of_plain_records_is_read_as_before() -> None:
    records = [_claim(1), Held(uid="p1", attempt=1, node="n1", decision_key="p1")]
    plain = [{**orjson.loads(encode_batch([r], batched=False))[0], "schema_version": "1.0"} for r in records]
    assert decode_message(orjson.dumps(plain)) == records


def _mutables(value: Any, found: dict[int, Any]) -> dict[int, Any]:
    """Every mutable object reachable from a decoded record (maps and lists, in nested records too)."""
    if isinstance(value, (dict, list)):
        found[id(value)] = value
        for item in value.values() if isinstance(value, dict) else value:
            _mutables(item, found)
    elif isinstance(value, tuple):
        for item in value:
            _mutables(item, found)
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            _mutables(getattr(value, f.name), found)
    return found


@settings(max_examples=200)
@given(MESSAGES)
def test_records_read_from_a_batch_share_no_mutable_value(records: list[Any]) -> None:
    decoded = [r for r in decode_message(encode_batch(records)) if not isinstance(r, SchemaError)]
    seen: dict[int, int] = {}
    for index, record in enumerate(decoded):
        for key in _mutables(record, {}):
            assert seen.setdefault(key, index) == index, f"records {seen[key]} and {index} share a mutable value"


def test_a_crafted_batch_sharing_nested_maps_gives_each_member_its_own() -> None:
    a, b = decode_message(orjson.dumps({"kind": BATCH_KIND, "of": "Pod", "shared": {"name": "p", "affinity": {"t": [1]}},
                                        "members": [{"uid": "a"}, {"uid": "b"}]}))
    assert a.affinity == b.affinity == {"t": [1]}  # type: ignore[union-attr]
    assert a.affinity["t"] is not b.affinity["t"]  # type: ignore[union-attr]


def test_a_map_whose_values_differ_in_class_is_not_merged() -> None:
    records = [_claim(i) for i in range(MIN_BATCH - 1)] + [
        dataclasses.replace(_claim(9), requests=ResourceList({"cpu": True, "memory": 2**29}))]
    items = orjson.loads(encode_batch(records))
    assert "requests" not in items[0]["shared"]


def test_an_empty_batch_is_an_error_not_nothing() -> None:
    out = decode_message(b'[{"kind": "Batch", "of": "Claim", "members": []}]')
    assert len(out) == 1 and isinstance(out[0], SchemaError) and out[0].field == "[0].members"


def test_absurd_numbers_are_errors_never_exceptions() -> None:
    version = b'[{"kind":"Batch","schema_version":"' + b"1" * 4400 + b'.0","of":"Commit","members":[{}]}]'
    exponent = b'[{"kind":"Batch","of":"Claim","shared":{"requests":{"cpu":"1e' + b"1" * 4400 + b'"}},"members":[{"uid":"u","attempt":1,"node":"n","decision_key":"u"}]}]'
    nines = b'{"kind":"Pod","uid":"u","name":"n","requests":{"memory":"' + b"9" * 100_000 + b'"}}'
    for message, field in ((version, "[0].schema_version"), (exponent, "[0].shared.requests.cpu"),
                           (nines, "requests.memory")):
        out = decode_message(message)
        assert len(out) == 1 and isinstance(out[0], SchemaError) and out[0].field == field, out


def test_a_failed_batch_puts_the_message_on_its_first_dead_letter_only() -> None:
    import base64

    from agents.intake import RawMessage, intake

    items = orjson.loads(encode_batch([_claim(i) for i in range(MIN_BATCH)]))
    items[0]["shared"]["requests"] = {"cpu": "lots"}
    raw = orjson.dumps(items)
    out = intake([RawMessage(raw, "node-inbox", 2, 41)])
    assert out.records == [] and len(out.dead_letters) == MIN_BATCH
    letters = [o.record for o in out.dead_letters]
    assert base64.b64decode(letters[0].original) == raw  # type: ignore[attr-defined]
    assert all(letter.original == "" and letter.offset == 41 for letter in letters[1:])  # type: ignore[attr-defined]
