"""JSON Schema (draft 2020-12) of every record, for producers outside the project.

Generated from the records' type hints, so it cannot drift from the decoder. Resource maps
are Kubernetes quantities (string or number). `write_schemas(dir)` writes one file per kind.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Union

from schemas.records import RECORD_TYPES, SCHEMA_MAJOR, Record, ResourceList

_QUANTITY = {"type": ["string", "number"], "description": "Kubernetes quantity, e.g. '500m', '2Gi', '1.5'"}


def _schema(tp: Any) -> dict[str, Any]:
    simple = {str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"},
              bool: {"type": "boolean"}, Any: {}}
    if tp in simple:
        return simple[tp]
    if tp is ResourceList:
        return {"type": "object", "additionalProperties": _QUANTITY}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _object(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return {"anyOf": [_schema(inner[0]), {"type": "null"}]}
    if origin is tuple:
        return {"type": "array", "items": _schema(args[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(args[1])}
    raise TypeError(f"no JSON Schema for {tp}")


def _object(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    props: dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(cls):
        props[f.name] = _schema(hints[f.name])
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    return {"type": "object", "properties": props, "required": required}


def record_schema(cls: type[Record]) -> dict[str, Any]:
    schema = _object(cls)
    schema["properties"]["kind"] = {"const": cls.KIND}
    schema["properties"]["schema_version"] = {
        "type": "string", "pattern": f"^{SCHEMA_MAJOR}\\.[0-9]+$",
        "description": "MAJOR.MINOR; unknown fields are ignored within a major version",
    }
    schema["required"] = sorted(set(schema["required"]) | {"kind"})
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": cls.KIND,
            "description": (cls.__doc__ or "").strip(), **schema}


def write_schemas(directory: str | Path) -> list[Path]:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for cls in RECORD_TYPES:
        path = out / f"{cls.KIND}.schema.json"
        path.write_text(json.dumps(record_schema(cls), indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
