import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.codec import decode, decode_message, encode, encode_batch
from schemas.errors import SchemaError
from schemas.records import (
    RECORD_TYPES,
    Binding,
    Claim,
    HoldId,
    Nomination,
    Pod,
    ResourceList,
    hold_id,
)
from tests.builders import make_claim, make_node, make_pod


def test_round_trips_every_kind_of_record() -> None:
    pod = make_pod(labels={"a": "b"}, priority=7)
    for record in (pod, make_node(), make_claim(),
                   Binding(uid="u", namespace="ns", name="n", node="n1", attempt=0, decision_key="u")):
        assert decode(encode(record)) == record


def test_batch_message_decodes_each_record_and_reports_bad_ones_by_index() -> None:
    good = orjson.loads(encode(make_pod("ok")))
    bad = {**good, "uid": 5}
    results = decode_message(orjson.dumps([good, bad]))
    assert isinstance(results[0], Pod)
    assert isinstance(results[1], SchemaError)
    assert results[1].field == "[1].uid" and results[1].value == 5


@pytest.mark.parametrize(
    ("raw", "field", "value"),
    [
        (b"not json", "", "not json"),
        (b'{"kind": "Pod", "uid": "u", "name": "n", "schema_version": "2.0"}', "schema_version", "2.0"),
        (b'{"kind": "Pod", "name": "n"}', "uid", None),
        (b'{"kind": "Pod", "uid": "u", "name": "n", "priority": "high"}', "priority", "high"),
        (b'{"kind": "Pod", "uid": "u", "name": "n", "requests": {"cpu": "lots"}}', "requests.cpu", "lots"),
        (b'{"kind": "Pod", "uid": "u", "name": "n", "requests": {"memory": "-1Gi"}}', "requests.memory", "-1Gi"),
        (b'{"kind": "Spaceship"}', "kind", "Spaceship"),
        # read as a float by the JSON parser: taken as an integer, it could never be encoded again
        (b'{"kind": "Pod", "uid": "u", "name": "n", "priority": 18446744073709551616}', "priority", 2.0**64),
    ],
    ids=["not-json", "major-version", "missing-field", "ill-typed", "unparsable-quantity", "negative", "kind",
         "beyond-64-bits"],
)
def test_bad_input_names_field_and_value(raw: bytes, field: str, value: object) -> None:
    [result] = decode_message(raw)
    assert isinstance(result, SchemaError)
    assert result.field == field
    assert result.value == value


def test_unknown_fields_and_minor_versions_are_accepted() -> None:
    raw = orjson.loads(encode(make_pod()))
    raw.update({"schema_version": "1.7", "from_the_future": {"x": 1}})
    assert decode(orjson.dumps(raw)) == make_pod()


def test_claims_and_nominations_written_with_the_numa_cells_field_still_decode() -> None:
    """`numa_cells` was dropped (nothing set or read it: the cells travel in the cpuset on
    `devices`); records written before still decode, the field ignored."""
    for record in (Claim(uid="u", attempt=0, node="n", decision_key="u", requests=ResourceList(cpu=100)),
                   Nomination(uid="u", node="n", priority=1, requests=ResourceList(cpu=100))):
        raw = orjson.loads(encode(record))
        raw["numa_cells"] = [0, 1]
        assert decode(orjson.dumps(raw)) == record


def test_pod_with_containers_gets_its_effective_request_computed() -> None:
    raw = {"kind": "Pod", "uid": "u", "name": "n",
           "containers": [{"name": "a", "requests": {"cpu": "250m"}}, {"name": "b", "requests": {"cpu": "250m"}}],
           "init_containers": [{"name": "i", "requests": {"cpu": "1"}}]}
    assert decode(orjson.dumps(raw)).requests == {"cpu": 1000}  # type: ignore[attr-defined]


def test_every_record_type_has_a_kind_and_version() -> None:
    for cls in RECORD_TYPES:
        assert cls.KIND


@given(st.dictionaries(st.sampled_from(["cpu", "memory", "pods", "example.com/foo"]),
                       st.integers(min_value=0, max_value=2**50)),
       st.integers(min_value=0, max_value=10**6))
def test_claims_round_trip_exactly(requests: dict[str, int], attempt: int) -> None:
    claim = Claim(uid="u", attempt=attempt, node="n", decision_key="u", requests=ResourceList(requests))
    assert decode(encode(claim)) == claim
    assert decode_message(encode_batch([claim, claim])) == [claim, claim]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(st.binary(max_size=200))
def test_decoding_arbitrary_bytes_never_raises(data: bytes) -> None:
    for result in decode_message(data):
        assert isinstance(result, (SchemaError, *RECORD_TYPES))


@given(st.sampled_from(["Pod", "Node", "Claim", "Held", "Binding", "NodeStateChange"]),
       st.dictionaries(st.sampled_from(["uid", "name", "node", "attempt", "requests", "allocatable", "labels",
                                        "containers", "priority", "decision_key", "holds", "seq"]), JSON))
def test_decoding_arbitrary_objects_never_raises(kind: str, fields: dict) -> None:
    for result in decode_message(orjson.dumps({"kind": kind, **fields})):
        assert isinstance(result, (SchemaError, *RECORD_TYPES))


def test_a_hold_id_parses_back_into_its_parts_even_when_the_uid_has_a_slash() -> None:
    assert HoldId.parse(hold_id("ns/pod-1", 3, "node-a")) == HoldId("ns/pod-1", 3, "node-a")
    assert HoldId.parse(make_claim("u", cpu=100).hold_id).uid == "u"


def test_feedback_hints_round_trip_and_feedback_written_before_them_still_decodes() -> None:
    from schemas.records import Alternative, RuntimeClass, SchedulingFeedback, Toleration

    hinted = SchedulingFeedback(
        uid="u", namespace="ns", name="n", attempt=1, message="0/2 nodes are available: 2 Insufficient cpu",
        reasons={"Insufficient cpu": 2}, reason="InsufficientResources", next_step="ShrinkRequest", retry_after_s=15.0,
        alternatives=(Alternative("SmallerRequest", "ask for 50%", {"requests.cpu": "500m"}),
                      Alternative("Wait", "wait about 15s")))
    runtime = RuntimeClass(name="kata-qemu", handler="kata-qemu", overhead=ResourceList(cpu=250),
                           tolerations=(Toleration(key="k", operator="Exists"),), qos_classes=("LS",),
                           default_qos_class="LS")
    for record in (hinted, runtime):
        assert decode(encode(record)) == record
        assert decode_message(encode_batch([record, record])) == [record, record]  # (the fast path too)
    old = orjson.loads(encode(hinted))
    for name in ("reason", "next_step", "retry_after_s", "alternatives"):
        del old[name]
    assert decode(orjson.dumps(old)) == SchedulingFeedback(uid="u", namespace="ns", name="n", attempt=1,
                                                           message=hinted.message, reasons=hinted.reasons)
    bad = {**orjson.loads(encode(hinted)), "alternatives": [{"kind": "Wait"}]}
    with pytest.raises(SchemaError) as err:
        decode(orjson.dumps(bad))
    assert err.value.field == "alternatives[0].description"


def test_the_json_schemas_of_hinted_feedback_and_runtime_classes_accept_what_the_codec_writes() -> None:
    import jsonschema

    from schemas.jsonschema import record_schema
    from schemas.records import Alternative, RuntimeClass, SchedulingFeedback

    hinted = SchedulingFeedback(uid="u", namespace="ns", name="n", attempt=0, message="m", reason="NoMatchingNode",
                                next_step="ChangeRuntimeClass", alternatives=(
                                    Alternative("RuntimeClass", "run it in gvisor", {"spec.runtimeClassName": "gvisor"}),))
    runtime = RuntimeClass(name="gvisor", handler="runsc", overhead=ResourceList(memory=2**20))
    for record in (hinted, runtime):
        schema = record_schema(type(record))
        jsonschema.validate(orjson.loads(encode(record)), schema)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**orjson.loads(encode(record)), "name": 5}, schema)
    assert record_schema(RuntimeClass)["x-koordstream-config"] == "sandbox.runtimes"
