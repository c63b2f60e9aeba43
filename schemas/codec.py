"""orjson codec for records, with validation that names the failing field and value.

Wire format: a message value is one record (a JSON object with `kind` and
`schema_version`) or a batch (a JSON array of such objects); the unit of Kafka traffic is a
batch, the unit of meaning one record. `decode_message` returns, per element, the record or
the `SchemaError` that rejected it, so one bad element of a batch goes to the dead-letter
topic while the others are processed.

Decoders are built once per record class from its type hints and cached: a fast one that
only agrees (see "the fast path") and a careful one that names what it refuses.
"""

from __future__ import annotations

import dataclasses
import operator
import re
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, Union

import orjson

from schemas.errors import SchemaError
from schemas.kube import effective_requests
from schemas.quantity import MILLI_RESOURCES, format_canonical, to_canonical
from schemas.records import (
    BY_KIND,
    SCHEMA_MAJOR,
    SCHEMA_VERSION,
    Pod,
    Record,
    ResourceList,
    replace,
)

Decoder = Callable[[Any, str], Any]


def _default(obj: Any) -> Any:
    if isinstance(obj, ResourceList):
        return {name: format_canonical(name, amount) for name, amount in obj.items()}
    raise TypeError(f"cannot encode {type(obj).__name__}")


_OPTS = orjson.OPT_PASSTHROUGH_SUBCLASS
# Fields that name a table key or part of one (a node, a decision key, a pod): the tables keep
# control characters for their own keys (`agents.adapters.tables`: entries, partition clocks).
KEY_FIELDS = frozenset({"node", "decision_key", "uid"})
_CONTROL = re.compile(r"[\x00-\x1f]")


def encode(record: Record) -> bytes:
    return orjson.dumps(record, default=_default, option=_OPTS)


def to_plain(record: Record) -> dict[str, Any]:
    """The record as plain JSON values (what `decode_object` reads back)."""
    plain: dict[str, Any] = orjson.loads(encode(record))
    return plain


def encode_batch(records: Iterable[Record], batched: bool = True) -> bytes:
    """A message of `records`; with `batched`, each run of `MIN_BATCH` or more records of one
    kind is written as one `Batch` (schema 1.1: "batches" below), else every record is its own."""
    items: list[Any] = list(records)
    if batched and len(items) >= MIN_BATCH:
        items = _batched(items)
    return orjson.dumps(items, default=_default, option=_OPTS)


# --- batches -------------------------------------------------------------------------------
#
# A run of records of one kind in a message is written as one element, {"kind": "Batch",
# "schema_version", "of": the kind, "shared": the fields whose value every member has,
# "members": [each member's other fields]}. A member is the record `{**shared, **member}` of
# kind `of`: readers see the same records, in the same order, as if each had been written on
# its own (`tests/unit/test_codec_batches.py`; equal, not byte for byte: 0.0 and -0.0 are merged,
# and equal maps take the first member's key order), and no two of them share a mutable value;
# a bad member is a dead letter naming `members[i].<field>` (or `shared.<field>`) while the
# others are read. A field is shared only when its values are equal and of one class, a map's
# values too (so 1 and True, which compare equal, are not merged); a field of a type that the
# reader does not convert exactly (nested records, maps of any values) only when every member
# has the same empty value.

BATCH_KIND = "Batch"
# The shortest run written as a batch: below it the columns' comparison costs more than the
# smaller message saves (measured: a run of 2 costs half as much again, one of 8 breaks even).
MIN_BATCH = 8


# How a field's values are compared when batched and converted when read (`_comparison`).
_OTHER, _EXACT, _EXACT_MAP = 0, 1, 2


def _comparison(tp: Any) -> int:
    """`_EXACT`: values of this type are equal only when they encode the same (given one
    class), `_EXACT_MAP` likewise for a map (its values' classes checked too, and a copy made
    for each member read), `_OTHER` for the rest (nested records, maps of any values)."""
    inner, _ = _optional(tp)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if inner is ResourceList or (origin is dict and args[1] in (str, int)):
        return _EXACT_MAP
    return _EXACT if inner in (str, int, float, bool) or (origin is tuple and args[0] is str) else _OTHER


_Columns = tuple[tuple[str, ...], tuple[int, ...], Callable[[Any], tuple[Any, ...]]]
_COLUMNS: dict[type, _Columns] = {}


def _columns(cls: type) -> _Columns:
    """A class's field names, how each is compared, and a getter of a record's values."""
    found = _COLUMNS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        names = tuple(f.name for _, f in _init_fields(cls) if f.name != "schema_version")
        getter = operator.attrgetter(*names)
        found = names, tuple(_comparison(hints[n]) for n in names), (
            getter if len(names) > 1 else lambda r: (getter(r),))
        _COLUMNS[cls] = found
    return found


def _batch(records: list[Any]) -> dict[str, Any]:
    cls = records[0].__class__
    names, exact, row = _columns(cls)
    shared: dict[str, Any] = {}
    own: list[int] = []
    count = len(records)
    rows = list(map(row, records))
    for index, column in enumerate(zip(*rows, strict=True)):
        first = column[0]
        if (column.count(first) == count and (exact[index] or not first)
                and len(set(map(type, column))) == 1
                and (exact[index] != _EXACT_MAP or len({v.__class__ for m in column for v in m.values()}) < 2)):
            shared[names[index]] = first
        else:
            own.append(index)
    own_names = [names[i] for i in own]
    if len(own) > 1:
        pick = operator.itemgetter(*own)
        members = [dict(zip(own_names, pick(values), strict=True)) for values in rows]
    else:
        members = [{own_names[0]: values[own[0]]} for values in rows] if own else [{} for _ in rows]
    return {"kind": BATCH_KIND, "schema_version": SCHEMA_VERSION, "of": cls.KIND, "shared": shared,
            "members": members}


def _batched(records: list[Any]) -> list[Any]:
    """Runs of one kind as batches, the rest as they are, in order."""
    out: list[Any] = []
    start = 0
    for end in range(1, len(records) + 1):
        if end == len(records) or records[end].__class__ is not records[start].__class__:
            if end - start >= MIN_BATCH:
                out.append(_batch(records[start:end]))
            else:
                out += records[start:end]
            start = end
    return out


# --- decoding -----------------------------------------------------------------------------


def _str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise SchemaError(path, value, "must be a string")
    return value


# The integers a record can carry: what JSON encoders write (orjson: signed or unsigned 64-bit).
# A larger number in the JSON is read as a float; taken as an integer it could never be written
# again (a worker that tried would fail on every retry of the same record).
INT_MIN, INT_MAX = -(2**63), 2**64 - 1


def _int(value: Any, path: str) -> int:
    whole = isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()
    if not whole:
        raise SchemaError(path, value, "must be an integer")
    if not INT_MIN <= value <= INT_MAX:
        raise SchemaError(path, value, "must be an integer within 64 bits")
    return value if isinstance(value, int) else int(value)


def _float(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(path, value, "must be a number")
    return float(value)


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise SchemaError(path, value, "must be true or false")
    return value


def _any(value: Any, path: str) -> Any:
    return value


def _resources(value: Any, path: str) -> ResourceList:
    if not isinstance(value, dict):
        raise SchemaError(path, value, "must be a map of resource name to quantity")
    out = ResourceList()
    for name, amount in value.items():
        if not isinstance(name, str) or not name:
            raise SchemaError(path, name, "resource names must be non-empty strings")
        # Fast path for the canonical spellings this codec writes ("1500m", "1073741824"); ASCII
        # digits only ("²".isdigit() holds, but int() refuses it).
        if isinstance(amount, str) and amount.isascii() and amount.isdigit() and len(amount) < 19:
            out[name] = int(amount) * 1000 if name in MILLI_RESOURCES else int(amount)
        elif name in MILLI_RESOURCES and isinstance(amount, str) and amount[-1:] == "m" and amount.isascii() \
                and amount[:-1].isdigit() and len(amount) < 19:
            out[name] = int(amount[:-1])
        else:
            out[name] = to_canonical(name, amount, f"{path}.{name}")
    return out


_SCALARS: dict[Any, Decoder] = {str: _str, int: _int, float: _float, bool: _bool, Any: _any}


def _optional(tp: Any) -> tuple[Any, bool]:
    """A field type without its `| None`, and whether it had one (other unions are refused)."""
    if typing.get_origin(tp) not in (Union, types.UnionType):
        return tp, False
    inner = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(inner) != 1:
        raise TypeError(f"unsupported union {tp}")
    return inner[0], True


def _keyed(cls: type) -> frozenset[str]:
    """The fields of `cls` that key a table: no control characters in them."""
    return KEY_FIELDS | ({"name"} if cls.__name__ in ("Node", "NodeDeleted") else frozenset())


def _decoder_for(tp: Any) -> Decoder:
    if tp in _SCALARS:
        return _SCALARS[tp]
    if tp is ResourceList:
        return _resources
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass_decoder(tp)
    inner, optional = _optional(tp)
    if optional:
        sub = _decoder_for(inner)
        return lambda v, p: None if v is None else sub(v, p)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:
        item = _decoder_for(args[0])

        def decode_tuple(value: Any, path: str) -> tuple[Any, ...]:
            if not isinstance(value, list):
                raise SchemaError(path, value, "must be a list")
            return tuple(item(v, f"{path}[{i}]") for i, v in enumerate(value))

        return decode_tuple
    if origin is dict:
        val = _decoder_for(args[1])

        def decode_dict(value: Any, path: str) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise SchemaError(path, value, "must be a map")
            return {_str(k, path): val(v, f"{path}.{k}") for k, v in value.items()}

        return decode_dict
    raise TypeError(f"unsupported field type {tp}")


_CACHE: dict[type, Decoder] = {}


def _dataclass_decoder(cls: type) -> Decoder:
    if cls in _CACHE:
        return _CACHE[cls]
    hints = typing.get_type_hints(cls)
    specs: list[tuple[str, Decoder, bool]] = []

    keyed = _keyed(cls)

    def decode_obj(value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise SchemaError(path or cls.__name__, value, f"must be an object ({cls.__name__})")
        kwargs: dict[str, Any] = {}
        for name, dec, required in specs:
            if name in value:
                sub = f"{path}.{name}" if path else name
                kwargs[name] = decoded = dec(value[name], sub)
                if name in keyed and isinstance(decoded, str) and _CONTROL.search(decoded):
                    raise SchemaError(sub, decoded, "must not contain control characters (it keys a table)")
            elif required:
                raise SchemaError(f"{path}.{name}" if path else name, None, "is required")
        return cls(**kwargs)

    _CACHE[cls] = decode_obj
    for f in dataclasses.fields(cls):
        if not f.init or f.name == "schema_version":
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        specs.append((f.name, _decoder_for(hints[f.name]), required))
    return decode_obj


# --- the fast path -------------------------------------------------------------------------
#
# The decoders above check one value at a time and name the failing field; they cost about
# 20-40 us a record, most of it formatting paths that are never shown and calling a closure
# per field. The fast decoders below are compiled once per record class: a field is checked
# in line (a string is exactly `str`, an integer exactly `int`, ...), nothing is named, and
# anything they do not take as it is (a wrong type, a missing required field, a quantity to
# parse, a control character in a key) raises `_Slow`, upon which `decode_object` decodes the
# value again with the decoders above, which return the same record or raise the error that
# names the field. So the fast path decides nothing on its own: it may only agree
# (`tests/unit/test_codec_fast_path.py` compares the two on random and mangled records).


class _Slow(Exception):
    """The fast decoder does not take this value as it is: decode it the careful way."""


_MISSING = object()
Converter = Callable[[Any], Any]


def _fast_int(value: Any) -> int:
    if value.__class__ is float and value.is_integer() and INT_MIN <= value <= INT_MAX:
        return int(value)
    raise _Slow


def _fast_float(value: Any) -> float:
    if value.__class__ is int:
        return float(value)
    raise _Slow


# (name, quantity as written) -> canonical amount: a cluster's requests repeat a few values.
_QUANTITIES: dict[tuple[str, str], int] = {}
_QUANTITIES_MAX = 65_536


def _fast_resources(value: Any) -> ResourceList:
    if value.__class__ is not dict:
        raise _Slow
    out = ResourceList()
    for name, amount in value.items():
        try:
            out[name] = _QUANTITIES[name, amount]
        except (KeyError, TypeError):
            out[name] = _fast_quantity(name, amount)
    return out


def _fast_quantity(name: Any, amount: Any) -> int:
    if name.__class__ is not str or amount.__class__ is not str:
        raise _Slow
    canonical = _resources({name: amount}, "")[name]
    if len(_QUANTITIES) < _QUANTITIES_MAX:
        _QUANTITIES[name, amount] = canonical
    return canonical


# How a field of each scalar type is checked in line, on the variable `v`.
_INLINE = {
    str: "if v.__class__ is not str: raise _Slow",
    int: "if v.__class__ is not int: v = _fast_int(v)",
    float: "if v.__class__ is not float: v = _fast_float(v)",
    bool: "if v.__class__ is not bool: raise _Slow",
    Any: "",
}


_INLINE_SCOPE: dict[str, Any] = {"_Slow": _Slow, "_fast_int": _fast_int, "_fast_float": _fast_float}


def _scalar_converter(check: str) -> Converter:
    """The in-line check of a scalar as a function (for items of tuples, values of maps)."""
    scope = dict(_INLINE_SCOPE)
    exec(f"def convert(v):\n    {check or 'pass'}\n    return v", scope)  # noqa: S102 - `_INLINE`'s source
    converter: Converter = scope["convert"]
    return converter


_FAST_SCALARS: dict[Any, Converter] = {tp: _scalar_converter(check) for tp, check in _INLINE.items()}


def _fast_converter(tp: Any) -> Converter:
    """A converter for a value of type `tp`."""
    if tp in _FAST_SCALARS:
        return _FAST_SCALARS[tp]
    if tp is ResourceList:
        return _fast_resources
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _fast_decoder(tp)
    inner, optional = _optional(tp)
    if optional:
        sub = _fast_converter(inner)
        return lambda v: None if v is None else sub(v)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple and args[0] in (str, Any):
        exact = args[0] is str

        def str_tuple(value: Any) -> tuple[Any, ...]:
            if value.__class__ is not list:
                raise _Slow
            if exact:
                for item in value:
                    if item.__class__ is not str:
                        raise _Slow
            return tuple(value)

        return str_tuple
    if origin is tuple:
        item_of = _fast_converter(args[0])

        def any_tuple(value: Any) -> tuple[Any, ...]:
            if value.__class__ is not list:
                raise _Slow
            return tuple([item_of(item) for item in value])

        return any_tuple
    if origin is dict and args[1] in (str, int, Any):
        kind = args[1]

        def flat_dict(value: Any) -> dict[str, Any]:
            if value.__class__ is not dict:
                raise _Slow
            for key, item in value.items():
                if key.__class__ is not str or (kind is not Any and item.__class__ is not kind):
                    raise _Slow
            return dict(value)  # as the careful decoder: the record shares nothing with its input

        return flat_dict
    raise TypeError(f"no fast decoder for {tp}")


_FAST: dict[type, Converter] = {}


def _absent(index: int, f: dataclasses.Field[Any], scope: dict[str, Any]) -> str:
    """The statement that gives `v` field `f`'s value when it is not written (or refuses)."""
    if f.default is not dataclasses.MISSING:
        scope[f"d{index}"] = f.default
        return f"v = d{index}"
    if f.default_factory is not dataclasses.MISSING:
        scope[f"d{index}"] = f.default_factory
        return f"v = d{index}()"
    return "raise _Slow"


def _convert(index: int, f: dataclasses.Field[Any], tp: Any, keyed: frozenset[str], scope: dict[str, Any],
             indent: str) -> list[str]:
    """Lines that check and convert `v`, a written value of field `f`, raising `_Slow` when it
    is not taken as it is."""
    inner, optional = _optional(tp)
    if inner in _INLINE:
        check = _INLINE[inner] or "pass"
    else:
        scope[f"c{index}"] = _fast_converter(inner)
        check = f"v = c{index}(v)"
    lines = []
    if optional:
        lines.append(f"{indent}if v is not None:")
        indent += "    "
    lines.append(f"{indent}{check}")
    if f.name in keyed and inner is str:
        lines.append(f"{indent}if control(v): raise _Slow")
    return lines


def _field_lines(index: int, f: dataclasses.Field[Any], tp: Any, keyed: frozenset[str], scope: dict[str, Any],
                 indent: str) -> list[str]:
    """Lines that leave field `f`'s value (from the dict read through `get`) in `v{index}`."""
    return [f"{indent}v = get({f.name!r}, M)", f"{indent}if v is M: {_absent(index, f, scope)}", f"{indent}else:",
            *_convert(index, f, tp, keyed, scope, indent + "    "), f"{indent}v{index} = v"]


def _init_fields(cls: type) -> list[tuple[int, dataclasses.Field[Any]]]:
    return [(index, f) for index, f in enumerate(f for f in dataclasses.fields(cls) if f.init)]


def _fast_decoder(cls: type) -> Converter:
    if cls in _FAST:
        return _FAST[cls]
    hints = typing.get_type_hints(cls)
    keyed = _keyed(cls)
    scope: dict[str, Any] = {**_INLINE_SCOPE, "M": _MISSING, "control": _CONTROL.search, "cls": cls}
    lines = ["def decode(value):", "    if value.__class__ is not dict: raise _Slow", "    get = value.get"]
    fields = _init_fields(cls)
    for index, f in fields:
        if f.name == "schema_version":
            scope[f"d{index}"] = f.default
            lines.append(f"    v{index} = d{index}")
        else:
            lines += _field_lines(index, f, hints[f.name], keyed, scope, "    ")
    lines.append(f"    return cls({', '.join(f'v{index}' for index, _ in fields)})")
    exec("\n".join(lines), scope)  # noqa: S102 - source built above from the class's own fields
    decoder: Converter = scope["decode"]
    _FAST[cls] = decoder
    return decoder


_FAST_BATCH: dict[type, Callable[[dict[str, Any], list[Any]], list[Any]]] = {}


def _copied(value: Any) -> Any:
    """A JSON value with nothing shared with `value` (a shared map or list, one per member)."""
    return orjson.loads(orjson.dumps(value))


def _fast_batch_decoder(cls: type) -> Callable[[dict[str, Any], list[Any]], list[Any]]:
    """Decodes a batch's members (None for one it does not take as it is), made once per
    class for any set of shared fields: a shared field of an exact type is converted once (a
    map copied per member), any other converted per member from the shared value as written;
    a member's own value goes over the shared one."""
    found = _FAST_BATCH.get(cls)
    if found is not None:
        return found
    hints = typing.get_type_hints(cls)
    keyed = _keyed(cls)
    scope: dict[str, Any] = {**_INLINE_SCOPE, "M": _MISSING, "control": _CONTROL.search, "cls": cls,
                             "SchemaError": SchemaError, "RL": ResourceList, "copied": _copied}
    head = ["def decode(shared, members):", "    get = shared.get"]
    body = []
    fields = _init_fields(cls)
    deep = "                    "
    for index, f in fields:
        tp = hints[f.name]
        if f.name == "schema_version":
            scope[f"d{index}"] = f.default
            body.append(f"            v{index} = d{index}")
            continue
        inner, optional = _optional(tp)
        body += [f"            v = get({f.name!r}, M)", "            if v is M:"]
        comparison = _comparison(tp)
        if comparison != _OTHER and not optional:
            head += [f"    v = get({f.name!r}, M)", "    if v is not M:",
                     *_convert(index, f, tp, keyed, scope, "        "), f"    s{index} = v"]
            copy = "" if comparison == _EXACT else "RL" if inner is ResourceList else "dict"
            body += [f"                v = s{index}", f"                if v is M: {_absent(index, f, scope)}"]
            if copy:
                body.append(f"                else: v = {copy}(v)")
        else:
            head.append(f"    r{index} = get({f.name!r}, M)")
            body += [f"                v = r{index}", f"                if v is M: {_absent(index, f, scope)}",
                     "                else:",
                     f"{deep}if (v.__class__ is dict or v.__class__ is list) and v: v = copied(v)  # each its own",
                     *_convert(index, f, tp, keyed, scope, deep)]
        body += ["            else:", *_convert(index, f, tp, keyed, scope, "                "),
                 f"            v{index} = v"]
    loop = ["    out = []", "    append = out.append", "    for value in members:",
            "        if value.__class__ is not dict:", "            append(None)", "            continue",
            "        get = value.get", "        try:"]
    tail = ["        except (_Slow, SchemaError):", "            append(None)", "            continue",
            f"        append(cls({', '.join(f'v{index}' for index, _ in fields)}))", "    return out"]
    exec("\n".join(head + loop + body + tail), scope)  # noqa: S102 - source built above from the class's own fields
    decoder: Callable[[dict[str, Any], list[Any]], list[Any]] = scope["decode"]
    _FAST_BATCH[cls] = decoder
    return decoder


def _decode_batch(value: dict[str, Any]) -> list[Record | SchemaError]:
    """A `Batch` element's members, each a record or the error naming its field."""
    check_version(value)
    of, shared, members = value.get("of"), value.get("shared", {}), value.get("members")
    if not isinstance(of, str) or of not in BY_KIND:
        raise SchemaError("of", of, f"unknown record kind (known: {', '.join(sorted(BY_KIND))})")
    if not isinstance(shared, dict):
        raise SchemaError("shared", shared, "must be a JSON object of the fields every member has")
    if not isinstance(members, list) or not members:
        raise SchemaError("members", members, "must be a non-empty JSON array of the members' own fields")
    cls = BY_KIND[of]
    try:
        fast: list[Any] = _fast_batch_decoder(cls)(shared, members)
    except (_Slow, SchemaError):  # a shared value not taken as it is: each member the careful way
        fast = [None] * len(members)
    out: list[Record | SchemaError] = []
    for index, (member, record) in enumerate(zip(members, fast, strict=True)):
        if record is None:
            try:
                if not isinstance(member, dict):
                    raise SchemaError("", member, "a member must be a JSON object")
                record = decode_object(_copied({**shared, **member, "kind": of,
                                                "schema_version": value.get("schema_version", SCHEMA_VERSION)}))
            except SchemaError as exc:
                top = re.split(r"[.\[]", exc.field, maxsplit=1)[0]
                mine = not top or not isinstance(member, dict) or top in member or top not in shared
                out.append(exc.under(f"members[{index}]" if mine else "shared"))
                continue
        out.append(_finished(record))
    return out


def check_version(value: Any) -> None:
    version = value.get("schema_version", SCHEMA_VERSION)
    if version == SCHEMA_VERSION:
        return
    if not isinstance(version, str):
        raise SchemaError("schema_version", version, "must be a string 'MAJOR.MINOR'")
    major = version.split(".", 1)[0]
    if not (major.isascii() and major.isdigit() and len(major) < 10):
        raise SchemaError("schema_version", version, "must look like 'MAJOR.MINOR'")
    if int(major) != SCHEMA_MAJOR:
        raise SchemaError("schema_version", version, f"unknown major version (this reader knows {SCHEMA_MAJOR})")


def decode_object(value: Any, expect: type[Record] | None = None) -> Record:
    """One JSON object (already parsed) to a record; `expect` restricts the kind."""
    if not isinstance(value, dict):
        raise SchemaError("", value, "a record must be a JSON object")
    kind = value.get("kind")
    if kind is None and expect is not None:
        kind = expect.KIND
    if not isinstance(kind, str) or kind not in BY_KIND:
        raise SchemaError("kind", kind, f"unknown record kind (known: {', '.join(sorted(BY_KIND))})")
    cls = BY_KIND[kind]
    if expect is not None and cls is not expect:
        raise SchemaError("kind", kind, f"expected {expect.KIND} here")
    check_version(value)
    record: Record
    try:
        record = _fast_decoder(cls)(value)
    except (_Slow, SchemaError):
        record = _dataclass_decoder(cls)(value, "")
    return _finished(record)


def _finished(record: Record) -> Record:
    """A decoded record as readers take it (a pod's requests are its containers' effective ones)."""
    if isinstance(record, Pod) and record.containers:
        record = replace(
            record, requests=effective_requests(record.containers, record.init_containers, record.overhead)
        )
    return record


def decode_message(data: bytes | None) -> list[Record | SchemaError]:
    """A message value to its records; each element is a record or the error rejecting it."""
    if data is None:
        return [SchemaError("", None, "empty message value")]
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return [SchemaError("", data[:80].decode("utf-8", "replace"), f"not JSON: {exc}")]
    items = value if isinstance(value, list) else [value]
    out: list[Record | SchemaError] = []
    for index, item in enumerate(items):
        try:
            if item.__class__ is dict and item.get("kind") == BATCH_KIND:
                batch = _decode_batch(item)
                out += [r.under(f"[{index}]") if isinstance(r, SchemaError) and isinstance(value, list) else r
                        for r in batch]
            else:
                out.append(decode_object(item))
        except SchemaError as exc:
            out.append(exc.under(f"[{index}]") if isinstance(value, list) else exc)
        except (ValueError, ArithmeticError, TypeError, RecursionError) as exc:  # a decoder's own fault:
            # still this element's dead letter, never the agent's crash on every restart
            error = SchemaError("", str(item)[:200], f"cannot be decoded ({type(exc).__name__}: {exc})")
            out.append(error.under(f"[{index}]") if isinstance(value, list) else error)
    return out


def decode(data: bytes) -> Record:
    """Exactly one record, or raise the error naming the field."""
    results = decode_message(data)
    if len(results) != 1:
        raise SchemaError("", len(results), "expected exactly one record")
    result = results[0]
    if isinstance(result, SchemaError):
        raise result
    return result
