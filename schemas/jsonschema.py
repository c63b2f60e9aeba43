"""JSON Schema (draft 2020-12) of every record, for producers outside the project.

Generated from the records' type hints, so it cannot drift from the decoder. Resource maps
are Kubernetes quantities (string or number). `write_schemas(dir)` writes one file per kind.

Each schema also says where the kind travels (`ROUTES`): `x-koordstream-topic` and
`x-koordstream-key` (the field whose value is the message key there) for the topic a
producer or outside reader meets it on, `x-koordstream-routes` for every topic it travels on,
and `x-koordstream-partitioner`, the partitioner rule (`schemas.partitioner`). A kind that is
configuration rather than an event (`CONFIGURED`) travels on no topic: `x-koordstream-config`
names the setting whose file holds it.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Union

from schemas import topics
from schemas.records import RECORD_TYPES, SCHEMA_MAJOR, Record, ResourceList

_QUANTITY = {"type": ["string", "number"], "description": "Kubernetes quantity, e.g. '500m', '2Gi', '1.5'"}

# Per record kind: (topic, the field whose value is the message key on it); the first is the
# topic producers and outside readers meet the kind on, the others are the agents' own hops.
ROUTES: dict[str, tuple[tuple[str, str], ...]] = {
    "Pod": ((topics.PODS, "uid"),),
    "PodDeleted": ((topics.PODS, "uid"), (topics.HOLDS, "decision_key")),
    "Reservation": ((topics.PODS, "uid"),),
    "Node": ((topics.NODES, "name"), (topics.NODE_INBOX, "name")),
    "NodeDeleted": ((topics.NODES, "name"), (topics.NODE_INBOX, "name")),
    "ScaleDownEvent": ((topics.SCALE_DOWN, "workload"),),
    "Binding": ((topics.BINDINGS, "uid"),),
    "SchedulingFeedback": ((topics.FEEDBACK, "uid"),),
    "EvictionCommand": ((topics.EVICTIONS, "uid"),),
    "EvictionRefused": ((topics.EVICTIONS, "uid"),),
    "ReservationEvent": ((topics.RESERVATIONS, "uid"),),
    "MigrationJob": ((topics.MIGRATIONS, "uid"),),
    "PodDisruptionBudget": ((topics.DISRUPTION_BUDGETS, "uid"),),
    "DeadLetter": ((topics.DEAD_LETTER, "topic"),),
    "Requeue": ((topics.REQUEUE, "uid"),),
    "Claim": ((topics.NODE_INBOX, "node"),),
    "Commit": ((topics.NODE_INBOX, "node"),),
    "Release": ((topics.NODE_INBOX, "node"),),
    "PodTerminated": ((topics.NODE_INBOX, "node"), (topics.HOLDS, "decision_key")),
    "Nomination": ((topics.NODE_INBOX, "node"),),
    "NominationCleared": ((topics.NODE_INBOX, "node"),),
    "NominationLapsed": ((topics.NODE_INBOX, "node"),),
    "ReservationExpired": ((topics.NODE_INBOX, "node"),),
    "Held": ((topics.HOLDS, "decision_key"),),
    "Rejected": ((topics.HOLDS, "decision_key"),),
    "GangTimeout": ((topics.HOLDS, "decision_key"),),
    "Yield": ((topics.HOLDS, "decision_key"),),
    "QuotaAsk": ((topics.HOLDS, "decision_key"),),
    "QuotaGranted": ((topics.HOLDS, "decision_key"),),
    "QuotaDenied": ((topics.HOLDS, "decision_key"),),
    "QuotaReturn": ((topics.HOLDS, "decision_key"),),
    "SandboxWarmPool": ((topics.SANDBOX, "name"),),
    "SandboxWarmPoolDeleted": ((topics.SANDBOX, "name"),),
    "SandboxClaim": ((topics.SANDBOX, "warm_pool"),),
    "SandboxClaimDeleted": ((topics.SANDBOX, "warm_pool"),),
    "SandboxBurst": ((topics.SANDBOX, "warm_pool"),),
    "SandboxTick": ((topics.SANDBOX, "name"),),
    "SandboxClaimStatus": ((topics.SANDBOX_STATUS, "uid"),),
    "SandboxPoolStatus": ((topics.SANDBOX_STATUS, "name"),),
    "NodeStateChange": ((topics.STATE_CHANGES, "node"),),
    "ProfilingSample": ((topics.PROFILING, "plugin"),),
    "AttemptsSample": ((topics.PROFILING, "profile"),),
}
# Kinds read from a file a setting names, by every worker at start, never from a topic.
CONFIGURED: dict[str, str] = {"RuntimeClass": "sandbox.runtimes"}
PARTITIONER = (
    "The message key is the UTF-8 value of the record's x-koordstream-key field; the partition is "
    "murmur2(key) & 0x7fffffff modulo the topic's partition count: Kafka's default partitioner (the Java "
    "client's, aiokafka's; librdkafka / confluent-kafka: set partitioner=murmur2_random). A message value is "
    "one record or a JSON array of records (a batch) that all belong to that partition; a batch whose records "
    "have different keys has a null message key."
)


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
    routes = ROUTES.get(cls.KIND, ())
    if routes:
        schema["x-koordstream-topic"], schema["x-koordstream-key"] = routes[0]
        schema["x-koordstream-routes"] = [{"topic": t, "key": k} for t, k in routes]
        schema["x-koordstream-partitioner"] = PARTITIONER
    if cls.KIND in CONFIGURED:
        schema["x-koordstream-config"] = CONFIGURED[cls.KIND]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": cls.KIND,
            "description": (cls.__doc__ or "").strip(), **schema}


def batch_schema() -> dict[str, Any]:
    """A `Batch` element of a message (schema 1.1): one record of kind `of` per member, its
    fields those of `shared` and then the member's own (`schemas.codec`, "batches")."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Batch",
            "description": (batch_schema.__doc__ or "").strip(), "type": "object",
            "properties": {
                "kind": {"const": "Batch"},
                "schema_version": {"type": "string", "pattern": f"^{SCHEMA_MAJOR}\\.[1-9][0-9]*$"},
                "of": {"enum": sorted(cls.KIND for cls in RECORD_TYPES)},
                "shared": {"type": "object", "description": "fields every member has"},
                "members": {"type": "array", "items": {"type": "object"}, "minItems": 1,
                            "description": "each member's own fields"},
            },
            "required": ["kind", "of", "members"]}


def write_schemas(directory: str | Path) -> list[Path]:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    schemas = [(cls.KIND, record_schema(cls)) for cls in RECORD_TYPES] + [("Batch", batch_schema())]
    for kind, schema in schemas:
        path = out / f"{kind}.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
