"""The codec's fast path may only agree with the careful decoders: on random records of every
kind, and on the same records mangled (a field dropped, or replaced by any JSON), it returns
what the careful decoder returns, or leaves the value to it. And the quick `__init__` every
record class gets builds what the dataclass's own `__init__` builds."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Any, Union

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

import schemas.records as records_module
from agents import ports
from schemas import codec
from schemas.errors import SchemaError
from schemas.records import RECORD_TYPES, ResourceList

TEXT = st.text(max_size=6) | st.sampled_from(["a", "n1", "x\x01y", "1", "ns/p"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
RESOURCES = st.dictionaries(st.sampled_from(["cpu", "memory", "pods", "nvidia.com/gpu"]),
                            st.integers(0, 2**40), max_size=3).map(ResourceList)


def of_type(tp: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of a record field's type, nested records included (two levels down)."""
    scalars: dict[Any, st.SearchStrategy[Any]] = {
        str: TEXT, int: st.integers(-(2**40), 2**40), float: st.floats(-1e9, 1e9, allow_nan=False) | st.integers(0, 9).map(float),
        bool: st.booleans(), Any: JSON,
    }
    if tp in scalars:
        return scalars[tp]
    if tp is ResourceList:
        return RESOURCES
    if dataclasses.is_dataclass(tp):
        return record_of(tp, depth + 1)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        inner = next(a for a in args if a is not type(None))
        return st.none() | (of_type(inner, depth) if depth < 2 else st.nothing())
    if origin is tuple:
        return st.lists(of_type(args[0], depth), max_size=2 if depth < 2 else 0).map(tuple)
    if origin is dict:
        return st.dictionaries(TEXT, of_type(args[1], depth), max_size=2)
    raise TypeError(tp)


def record_of(cls: type, depth: int = 0) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: of_type(hints[f.name], depth) for f in dataclasses.fields(cls) if f.init}
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


def careful(cls: type, value: Any) -> Any:
    try:
        return codec._dataclass_decoder(cls)(value, "")
    except SchemaError as exc:
        return (exc.field, repr(exc.value), exc.reason)


@settings(max_examples=400)
@given(st.sampled_from(RECORD_TYPES).flatmap(lambda cls: st.tuples(st.just(cls), record_of(cls))),
       st.data())
def test_the_fast_path_returns_what_the_careful_decoder_returns_or_leaves_it_to_it(case: Any, data: Any) -> None:
    cls, record = case
    plain = codec.to_plain(record)
    name = data.draw(st.sampled_from(sorted(plain)))
    how = data.draw(st.sampled_from(["as is", "dropped", "replaced"]))
    if how == "dropped":
        del plain[name]
    elif how == "replaced":
        plain[name] = data.draw(JSON)
    value = orjson.loads(orjson.dumps(plain))
    expected = careful(cls, value)
    try:
        quick = codec._fast_decoder(cls)(value)
    except (codec._Slow, SchemaError):
        quick = None
    if quick is not None:
        assert quick == expected and codec.encode(quick) == codec.encode(expected)
    if how == "as is" and isinstance(expected, cls):  # (a key may hold a control character)
        assert expected == record and quick == record  # a record as the codec writes it takes the fast path


def test_a_quick_init_builds_what_the_dataclass_init_builds() -> None:
    classes = [v for v in vars(records_module).values()
               if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == records_module.__name__]
    assert len(classes) > len(RECORD_TYPES)
    classes += [ports.Origin, ports.Output]
    for cls in classes:
        assert inspect.signature(cls.__init__) == inspect.signature(cls.__dataclass_init__), cls
        required = {f.name: f"{f.name}-value" for f in dataclasses.fields(cls)
                    if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        quick, slow = cls(**required), cls.__new__(cls)
        cls.__dataclass_init__(slow, **required)
        assert quick == slow and repr(quick) == repr(slow)
        twin = cls(**required)
        for f in dataclasses.fields(cls):  # a default from a factory is made afresh for each record
            if f.default_factory is not dataclasses.MISSING:
                assert getattr(twin, f.name) is not getattr(quick, f.name) or getattr(quick, f.name) == ()


@settings(max_examples=300)
@given(st.sampled_from(RECORD_TYPES).flatmap(lambda cls: st.tuples(record_of(cls), record_of(cls))), st.data())
def test_records_replace_builds_what_dataclasses_replace_builds(pair: Any, data: Any) -> None:
    record, other = pair
    names = [f.name for f in dataclasses.fields(record) if f.init]
    changed = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    changes = {name: getattr(other, name) for name in changed}
    mine, theirs = records_module.replace(record, **changes), dataclasses.replace(record, **changes)
    assert mine == theirs and type(mine) is type(theirs)
    assert all(getattr(mine, f.name) is getattr(theirs, f.name) for f in dataclasses.fields(record) if f.init)
    assert mine.schema_version == theirs.schema_version and mine.kind == theirs.kind


def test_records_replace_refuses_what_dataclasses_replace_refuses() -> None:
    pod = records_module.Pod(uid="u", name="n", namespace="ns")
    for bad, error in (({"kind": "Node"}, ValueError), ({"nope": 1}, TypeError)):
        try:
            records_module.replace(pod, **bad)
        except error as exc:
            try:
                dataclasses.replace(pod, **bad)
            except error as theirs:
                assert str(exc) == str(theirs)
        else:
            raise AssertionError(f"replace accepted {bad}")
    settings_like = ports.AgentConfig(partitions=3)
    assert records_module.replace(settings_like, partitions=4) == dataclasses.replace(settings_like, partitions=4)


@settings(max_examples=200)
@given(record_of(records_module.Claim), st.sampled_from(["", "held", "rejected"]), st.booleans())
def test_carry_made_once_per_class_carries_what_the_generic_carry_does(claim: Any, status: str, soft: bool) -> None:
    from agents.state.owner import HoldEntry

    given_hold = {"requests": dict(claim.requests), "status": status, "reason": "", "soft": soft}
    hold = records_module.carry(HoldEntry, claim, **given_hold)
    assert hold == records_module._carry_slowly(HoldEntry, claim, given_hold)
    assert hold.devices is not claim.devices and isinstance(hold.devices, list)  # the target's kind, a copy
    held = records_module.carry(records_module.Held, hold, node="n1")
    assert held == records_module._carry_slowly(records_module.Held, hold, {"node": "n1"})
    hold.node = "n0"  # an attribute of the instance's own, neither a field nor its class's: carried too
    assert records_module.carry(records_module.Held, hold) == records_module._carry_slowly(records_module.Held, hold, {})
    del hold.__dict__["priority"]  # an attribute its class declares, missing on an instance: the generic way
    assert records_module.carry(records_module.Held, hold, node="n1") == records_module._carry_slowly(
        records_module.Held, hold, {"node": "n1"})
