"""A Kwok-compatible lifecycle: Kwok `Stage` files (`kwok.x-k8s.io/v1alpha1`) applied to the
objects of a run in-process, reproducing what Kwok v0.8's controllers do with them. Kwok's own
stock Stage files load unchanged (`stock_stages_dir()`, fetched by `make kwok-stages`) and are
checked against Kwok's testdata (tests/unit/test_kwok_stock.py).

A Stage, and what is honoured:
- `resourceRef` (`apiGroup`, `kind`: any kind; the lifecycle keys stages by kind). A Stage
  without a `selector` never applies (as in Kwok).
- `selector`: `matchLabels`, `matchAnnotations`, and `matchExpressions`: jq ones (`key`,
  `operator`, `values`, or `jq: {...}`; a subset of jq: `.a.b`, `.a["k"]`, `.[]`, `|`,
  `select(<path> == / != <literal>)`; operators In, NotIn, Exists, DoesNotExist) and CEL ones
  (`cel: {expression}`, `perf.cel`'s subset). A CEL error (a missing field) means no stage for
  the object, as Kwok logs and skips it.
- `weight` / `weightFrom`: among the stages that match, one is drawn by weight as Kwok's
  `Lifecycle.Match` does (all weights 0: uniformly).
- `delay`: `durationMilliseconds` / `durationFrom`, `jitterDurationMilliseconds` /
  `jitterDurationFrom` (jq expressions giving a Go duration, or a timestamp meaning "until
  then"); the delay is drawn uniformly between the two; a jitter at or below the duration is
  used alone (Kwok's `Stage.Delay`).
- `steps` (each: `event`, `finalizers` add / remove / empty, `delete`, `patch` with `template`,
  `root`, `type` json / merge / strategic, `subresource`, and `apply` of another object), and
  the older `next` (`event`, `finalizers`, `patches`, or `statusTemplate` as a patch of the
  status, `delete`), turned into steps as Kwok converts them. Templates are Go templates
  rendered for real (`perf.gotemplate`) with Kwok's functions (`perf.kwok_render`), over the
  object as the stage found it; the output is YAML, the patch its JSON under `root`.
- Patches apply as the API server applies Kwok's: a patch without `type` is a strategic merge
  patch on Pods and Nodes (Kwok's typed controllers; conditions merge by type) and a merge
  patch on other kinds; finalizer changes are JSON patches; a delete removes the object, or
  only marks it deleted while finalizers remain (`perf.kubepatch`). An `apply` creates the
  named object in the lifecycle (with the status the API server gives a new one: Pending for
  volumes and claims), or patches it.
- What happens next is Kwok's controller loop: an object that a stage changed is matched again
  at once (`immediateNextStage` changes nothing here), one that it left unchanged waits for a
  change from outside (`upsert`), as Kwok skips a patch that changes nothing and only sees
  objects again when the API server reports them changed.

`Lifecycle` is pure: objects go in (`upsert`), time passes on an injected clock (`due(now)`
applies every transition that is due and returns them as `Transition`s; a speed-up divides every
delay), and the cluster side of the template functions (Kwok's node IP, name and port, pod
address pools, the time `Now` returns) is `perf.kwok_render.KwokCluster`, configured by
`KwokConfig` (`epoch`: the Unix time of the clock's 0). No wall clock is read.

Bad files are refused before a run with the file, the field and the value (`StageError`), a
template's parse error with its position; a template that fails while rendering raises
`LifecycleError` naming the stage, the object and the template's position.
"""

from __future__ import annotations

import heapq
import os
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from perf import kubepatch
from perf.cel import CelError, Program, compile_cel
from perf.gotemplate import Func, Template, TemplateError, parse, parse_go_number
from perf.kwok_render import KwokCluster, KwokConfig, kwok_funcs, load_yaml, render_json

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
ROOT = Path(__file__).resolve().parents[1]
TYPED_KINDS = ("Pod", "Node")  # Kwok's typed controllers: strategic merge patches by default
CREATED_STATUS = {"PersistentVolume": {"phase": "Pending"}, "PersistentVolumeClaim": {"phase": "Pending"}}
CLUSTER_SCOPED = ("Node", "PersistentVolume", "Namespace", "StorageClass", "Stage", "ClusterRole",
                  "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass")


class StageError(ValueError):
    def __init__(self, source: str, field: str, value: Any, reason: str) -> None:
        super().__init__(f"{source}: {field}={value!r}: {reason}")
        self.source, self.field, self.value = source, field, value


class LifecycleError(ValueError):
    """A stage that cannot be applied to an object (a template failing on its data, a patch
    the object refuses, stages that keep changing an object at one instant)."""


def kwok_version() -> str:
    """KWOK_VERSION of infra/k8s/versions.env: the Kwok whose stock stages are the reference."""
    text = (ROOT / "infra" / "k8s" / "versions.env").read_text()
    m = re.search(r"^KWOK_VERSION=(\S+)$", text, re.M)
    if m is None:
        raise ValueError("infra/k8s/versions.env: no KWOK_VERSION")
    return m.group(1)


def stock_stages_dir() -> Path:
    """Kwok's stock Stage files (its kustomize/stage tree, testdata included), as
    `make kwok-stages` fetches them into .cache/kwok/<version>/stage (or $KOORDSTREAM_KWOK_DIR)."""
    base = Path(os.environ.get("KOORDSTREAM_KWOK_DIR") or ROOT / ".cache" / "kwok" / kwok_version())
    if not (base / ".complete").is_file() or not (base / "stage").is_dir():
        raise FileNotFoundError(f"Kwok's stock Stage files are not in {base}: run `make kwok-stages` "
                                "(infra/k8s/kwok-stages.sh) to fetch them")
    return base / "stage"


# --- a jq subset -------------------------------------------------------------------------------

_TOKEN = re.compile(r'\s*(\.\[\]|\[\]|\.\["(?:[^"\\]|\\.)*"\]|\["(?:[^"\\]|\\.)*"\]|\.[A-Za-z_][\w-]*|\||select\s*\(|\)'
                    r'|==|!=|"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|true|false|null|\.)')


@dataclass(frozen=True)
class Jq:
    """A compiled expression: pipe-separated stages of path steps or `select(...)` filters."""

    text: str
    stages: tuple[tuple[Any, ...], ...]

    def __post_init__(self) -> None:
        # One path of keys (most selectors: `.spec.nodeName`) yields at most one value: it is
        # looked up directly (the harness evaluates selectors about ten times per pod).
        simple = (self.stages[0][1] if len(self.stages) == 1 and self.stages[0][0] == "path"
                  and ITERATE not in self.stages[0][1] else None)
        object.__setattr__(self, "_keys", simple)

    def values(self, obj: Any) -> list[Any]:
        """Every value the expression yields on `obj` (jq's stream), nulls left out."""
        keys: tuple[str, ...] | None = self.__dict__["_keys"]
        if keys is not None:
            for key in keys:
                if not isinstance(obj, dict):
                    return []
                obj = obj.get(key)
            return [] if obj is None else [obj]
        stream: list[Any] = [obj]
        for stage in self.stages:
            if stage[0] == "select":
                _, path, op, literal = stage
                stream = [v for v in stream if any((x == literal) == (op == "==") for x in _walk(v, path) or [None])]
            else:
                stream = [x for v in stream for x in _walk(v, stage[1])]
        return [v for v in stream if v is not None]


def _walk(value: Any, path: tuple[Any, ...]) -> list[Any]:
    out = [value]
    for step in path:
        nxt: list[Any] = []
        for v in out:
            if step is ITERATE:
                if isinstance(v, list):
                    nxt += v
                elif isinstance(v, dict):
                    nxt += list(v.values())
            elif isinstance(v, dict):
                nxt.append(v.get(step))
            else:
                nxt.append(None)
        out = nxt
    return out


ITERATE = object()


def compile_jq(text: str) -> Jq:
    """Compile the subset; raises ValueError with what it could not read."""
    tokens, pos = [], 0
    stripped = text.strip()
    while pos < len(stripped):
        m = _TOKEN.match(stripped, pos)
        if not m or m.end() == pos:
            raise ValueError(f"cannot read {stripped[pos:]!r}")
        tokens.append(m.group(1))
        pos = m.end()
    stages: list[tuple[Any, ...]] = []
    i = 0

    def path() -> tuple[Any, ...]:
        nonlocal i
        steps: list[Any] = []
        while i < len(tokens) and tokens[i] not in ("|", ")", "==", "!="):
            t = tokens[i]
            if t in (".[]", "[]"):
                steps.append(ITERATE)
            elif t.startswith(".[\"") or t.startswith("[\""):
                steps.append(t[t.index('"') + 1:-2].replace('\\"', '"'))
            elif t.startswith("."):
                if t != ".":
                    steps.append(t[1:])
            else:
                raise ValueError(f"unexpected {t!r}")
            i += 1
        return tuple(steps)

    while i < len(tokens):
        if tokens[i].startswith("select"):
            i += 1
            p = path()
            if i >= len(tokens) or tokens[i] not in ("==", "!="):
                raise ValueError("select needs == or != and a literal")
            op = tokens[i]
            i += 1
            if i >= len(tokens):
                raise ValueError("select needs a literal")
            literal = yaml.safe_load(tokens[i])
            i += 1
            if i >= len(tokens) or tokens[i] != ")":
                raise ValueError("select is not closed")
            i += 1
            stages.append(("select", p, op, literal))
        elif tokens[i] == "|":
            i += 1
            continue
        else:
            if not tokens[i].startswith(".") and not tokens[i].startswith("["):
                raise ValueError(f"unexpected {tokens[i]!r}")
            stages.append(("path", path()))
        if i < len(tokens) and tokens[i] not in ("|",):
            raise ValueError(f"unexpected {tokens[i]!r}")
    if not stages:
        raise ValueError("empty expression")
    return Jq(text, tuple(stages))


# --- stages ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """A jq match expression (Kwok's `expression.Requirement`)."""

    key: Jq
    operator: str
    values: tuple[str, ...]

    def holds(self, obj: Any) -> bool:
        found = [_text(v) for v in self.key.values(obj)]
        if self.operator == "Exists":
            return bool(found)
        if self.operator == "DoesNotExist":
            return not found
        hit = any(v in self.values for v in found)
        return hit if self.operator == "In" else not hit


def _text(value: Any) -> str:
    """A value as jq prints it for comparison with a selector's string values."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else str(value)


@dataclass(frozen=True)
class Finalizers:
    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    empty: bool = False


@dataclass(frozen=True)
class PatchStep:
    """A patch of the object: the rendered template, under `root`, of `type` (None: Kwok's
    default for the kind)."""

    template: Template
    root: str = ""
    type: str | None = None
    subresource: str = ""


@dataclass(frozen=True)
class ApplyStep:
    """Another object created or patched: the rendered template is the whole object."""

    template: Template
    type: str | None = None
    subresource: str = ""


@dataclass(frozen=True)
class Step:
    event: Mapping[str, str] | None = None
    finalizers: Finalizers | None = None
    delete: bool = False
    patch: PatchStep | None = None
    apply: ApplyStep | None = None


@dataclass(frozen=True)
class Effect:
    """What applying a stage does, step by step, as Kwok's `DoSteps` hands it to its
    controller: an event, a patch (its MIME type, subresource and JSON data), an object applied,
    or the deletion."""

    kind: str  # event | patch | apply | delete
    type: str = ""
    subresource: str = ""
    data: Any = None
    event: Mapping[str, str] = field(default_factory=dict)


_PATCH_TYPES = {"json": kubepatch.JSON_PATCH, "merge": kubepatch.MERGE_PATCH,
                "strategic": kubepatch.STRATEGIC_MERGE_PATCH}
_APPLY_TYPES = {"merge": kubepatch.MERGE_PATCH, "strategic": kubepatch.STRATEGIC_MERGE_PATCH,
                "apply": kubepatch.APPLY_PATCH}
_NS = 1_000_000_000


@dataclass(frozen=True)
class Stage:
    name: str
    kind: str
    api_group: str = "v1"
    selected: bool = True  # a Stage without a selector never applies (Kwok's NewStage)
    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_annotations: Mapping[str, str] = field(default_factory=dict)
    requirements: tuple[Requirement, ...] = ()
    conditions: tuple[Program, ...] = ()  # CEL expressions
    weight: int = 0
    weight_from: Jq | None = None
    delayed: bool = False  # the Stage has a `delay`
    duration_ms: int = 0
    duration_from: Jq | None = None
    jitter_ms: int | None = None
    jitter_from: Jq | None = None
    steps: tuple[Step, ...] = ()
    immediate_next: bool = False
    source: str = ""

    @property
    def delete(self) -> bool:
        return any(s.delete for s in self.steps)

    @property
    def event(self) -> Mapping[str, str]:
        return next((s.event for s in self.steps if s.event is not None), {})

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether the stage selects `obj`; CelError when a CEL expression fails on it."""
        if not self.selected:
            return False
        meta = obj.get("metadata") or {}
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        return (all(labels.get(k) == v for k, v in self.match_labels.items())
                and all(annotations.get(k) == v for k, v in self.match_annotations.items())
                and all(r.holds(obj) for r in self.requirements)
                and all(p.matches(obj) for p in self.conditions))

    def weight_of(self, obj: Any) -> int | None:
        """Kwok's weight for `obj` (None: unreadable, which Kwok counts apart)."""
        if self.weight_from is None:
            return self.weight
        values = self.weight_from.values(obj)
        if not values:
            return self.weight
        value = values[0]
        if isinstance(value, str):
            parsed = parse_go_number(value) if value else None
            return int(parsed[0]) if parsed and parsed[1] and -2**63 <= parsed[0] < 2**63 else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
        return self.weight

    def delay_range_ns(self, obj: Any, now: float) -> list[int] | None:
        """Kwok's DelayRangePossible at Unix time `now`: [delay], [duration, jitter], or None
        for no delay."""
        if not self.delayed:
            return None
        duration = _duration_ns(self.duration_from, obj, now, self.duration_ms * 1_000_000)
        if duration is None:
            return None
        if self.jitter_ms is None and self.jitter_from is None:
            return [duration]
        jitter = _duration_ns(self.jitter_from, obj, now,
                              None if self.jitter_ms is None else self.jitter_ms * 1_000_000)
        if jitter is None:
            return [duration]
        return [jitter] if jitter <= duration else [duration, jitter]

    def delay_s(self, obj: Any, now: float, rng: random.Random) -> float:
        """Kwok's Delay: a draw in [duration, jitter) (0 without a delay), in seconds."""
        span = self.delay_range_ns(obj, now)
        if span is None:
            return 0.0
        if len(span) == 1:
            return max(0, span[0]) / _NS
        return (span[0] + rng.randrange(span[1] - span[0])) / _NS

    def effects(self, obj: Mapping[str, Any], funcs: Mapping[str, Func], typed: bool) -> list[Effect]:
        """Kwok's DoSteps on `obj` as the stage found it: every template renders over that
        object; `typed` (Kwok's Pod and Node controllers) makes untyped patches strategic.
        ValueError (TemplateError, PatchError) when a step cannot be computed."""
        out: list[Effect] = []
        deleted = False
        finalizers = list((obj.get("metadata") or {}).get("finalizers") or ())
        for step in self.steps:
            if step.event is not None:
                out.append(Effect("event", event=dict(step.event)))
            if deleted:
                continue
            if step.finalizers is not None:
                ops = _finalizer_ops(finalizers, step.finalizers)
                if ops:
                    out.append(Effect("patch", kubepatch.JSON_PATCH, data=ops))
            if step.delete:
                deleted = True
                out.append(Effect("delete"))
                continue
            if step.patch is not None:
                out.append(_patch_effect(step.patch, obj, funcs, typed))
            if step.apply is not None:
                data = render_json(step.apply.template, obj, funcs)
                kind = _APPLY_TYPES[step.apply.type or "apply"]
                out.append(Effect("apply", kind, step.apply.subresource, data))
        return out


def _patch_effect(patch: PatchStep, obj: Mapping[str, Any], funcs: Mapping[str, Func], typed: bool) -> Effect:
    data = render_json(patch.template, obj, funcs)
    if patch.type == "json":
        if not isinstance(data, list):
            raise ValueError(f"{patch.template.name}: a json patch renders a list of operations, not {data!r}")
        if patch.root:
            data = [{**op, "path": f"/{patch.root}{op.get('path', '')}"} if isinstance(op, Mapping) else op
                    for op in data]
        return Effect("patch", kubepatch.JSON_PATCH, patch.subresource, data)
    kind = _PATCH_TYPES[patch.type] if patch.type else (
        kubepatch.STRATEGIC_MERGE_PATCH if typed else kubepatch.MERGE_PATCH)
    return Effect("patch", kind, patch.subresource, {patch.root: data} if patch.root else data)


def _finalizer_ops(current: list[str], change: Finalizers) -> list[dict[str, Any]]:
    """Kwok's finalizersModify: JSON patch operations on metadata.finalizers."""
    ops: list[dict[str, Any]] = []
    empty = change.empty
    if not empty and change.remove:
        removed = [{"op": "remove", "path": f"/metadata/finalizers/{i}"}
                   for i in range(len(current) - 1, -1, -1) if current[i] in change.remove]
        if len(removed) == len(current):
            empty = True
        else:
            ops += removed
    if not empty:
        if change.add:
            ops += _finalizers_add(current, change.add)
    else:
        if current:
            ops.append({"op": "remove", "path": "/metadata/finalizers"})
        if change.add:
            ops += _finalizers_add([], change.add)
    return ops


def _finalizers_add(current: list[str], add: tuple[str, ...]) -> list[dict[str, Any]]:
    if current:
        return [{"op": "add", "path": "/metadata/finalizers/-", "value": f} for f in add if f not in current]
    return [{"op": "add", "path": "/metadata/finalizers", "value": list(add)}]


_DURATION = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": _NS, "m": 60 * _NS,
            "h": 3600 * _NS}


def go_duration_ns(text: str) -> int:
    """Go's time.ParseDuration, in nanoseconds; ValueError when malformed."""
    body = text[1:] if text[:1] in "+-" else text
    sign = -1 if text[:1] == "-" else 1
    if body == "0":
        return 0
    if not body:
        raise ValueError(f"time: invalid duration {text!r}")
    total, pos = 0, 0
    while pos < len(body):
        m = _DURATION.match(body, pos)
        if m is None or m.group(1) in ("", "."):
            raise ValueError(f"time: invalid duration {text!r}")
        whole, _, frac = m.group(1).partition(".")
        unit = _UNIT_NS[m.group(2)]
        total += int(whole or 0) * unit + (int(frac) * unit // 10 ** len(frac) if frac else 0)
        pos = m.end()
    return sign * total


def _duration_ns(expr: Jq | None, obj: Any, now: float, default: int | None) -> int | None:
    """Kwok's durationFrom: the first value of `expr`, a timestamp (time until then) or a Go
    duration; the default when there is none or it reads as neither; None for "" (no value)."""
    if expr is None:
        return default
    values = expr.values(obj)
    if not values:
        return default
    value = values[0]
    if isinstance(value, str):
        if value == "":
            return None
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
            if when.tzinfo is not None and "T" in value:
                return round((when.timestamp() - now) * _NS)
        except ValueError:
            pass
        try:
            return go_duration_ns(value)
        except ValueError:
            pass
    return default


# --- reading Stage files -----------------------------------------------------------------------

_KNOWN = {
    "": {"apiVersion", "kind", "metadata", "spec", "status"},
    "spec": {"resourceRef", "selector", "weight", "weightFrom", "delay", "next", "immediateNextStage", "steps"},
    "spec.resourceRef": {"apiGroup", "kind"},
    "spec.selector": {"matchLabels", "matchAnnotations", "matchExpressions"},
    "match": {"key", "operator", "values", "jq", "cel"},
    "jq": {"key", "operator", "values"},
    "cel": {"expression"},
    "from": {"expressionFrom", "jq", "cel"},
    "spec.delay": {"durationMilliseconds", "durationFrom", "jitterDurationMilliseconds", "jitterDurationFrom"},
    "spec.next": {"statusTemplate", "statusSubresource", "statusPatchAs", "patches", "finalizers", "event",
                  "delete"},
    "step": {"patch", "event", "finalizers", "delete", "apply"},
    "patch": {"subresource", "root", "template", "type", "impersonation"},
    "apply": {"template", "subresource", "type", "impersonation"},
    "finalizers": {"add", "remove", "empty"},
    "event": {"type", "reason", "message"},
}


class _Reader:
    """Reads one Stage document, naming the file, the stage and the field in every error."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, value: Any, reason: str) -> StageError:
        return StageError(self.source, where, value, reason)

    def mapping(self, where: str, raw: Any, known: str | None = None) -> Mapping[str, Any]:
        if raw is None:
            return {}
        if not isinstance(raw, Mapping):
            raise self.fail(where or "<document>", raw, "must be a mapping")
        for key in raw:
            if known is not None and key not in _KNOWN[known]:
                raise self.fail(f"{where}.{key}" if where else str(key), raw[key], "unknown field")
        return raw

    def integer(self, where: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(where, value, "must be a non-negative integer")
        return value

    def jq(self, where: str, text: Any) -> Jq:
        if not isinstance(text, str):
            raise self.fail(where, text, "must be a jq expression string")
        try:
            return compile_jq(text)
        except ValueError as exc:
            raise self.fail(where, text, f"not a supported jq expression: {exc}") from None

    def cel(self, where: str, text: Any) -> Program:
        try:
            return compile_cel(text)
        except CelError as exc:
            raise self.fail(where, text, f"not a supported CEL expression: {exc}") from None

    def value_from(self, where: str, raw: Any) -> Jq | None:
        if raw is None:
            return None
        raw = self.mapping(where, raw, "from")
        if "cel" in raw:
            raise self.fail(f"{where}.cel", raw["cel"], "CEL in durations and weights is not supported (use jq)")
        if "jq" in raw:
            return self.jq(f"{where}.jq.expression", self.mapping(f"{where}.jq", raw["jq"]).get("expression"))
        if "expressionFrom" not in raw:
            raise self.fail(where, raw, "needs expressionFrom or jq")
        return self.jq(f"{where}.expressionFrom", raw["expressionFrom"])

    def template(self, where: str, text: Any, kind: str) -> Template:
        if not isinstance(text, str):
            raise self.fail(where, text, "must be a Go template string")
        try:
            return parse(text.strip(), f"{self.source} {where}", _default_funcs(kind))
        except TemplateError as exc:
            raise self.fail(where, f"{exc.action}", f"line {exc.line} column {exc.col}: {exc.message}") from None

    def finalizers(self, where: str, raw: Any) -> Finalizers:
        raw = self.mapping(where, raw, "finalizers")

        def values(key: str) -> tuple[str, ...]:
            items = raw.get(key) or []
            if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
                raise self.fail(f"{where}.{key}", items, "must be a list of {value: <finalizer>}")
            return tuple(str(i.get("value", "")) for i in items)

        return Finalizers(values("add"), values("remove"), bool(raw.get("empty", False)))

    def event(self, where: str, raw: Any) -> Mapping[str, str]:
        raw = self.mapping(where, raw, "event")
        return {str(k): str(v) for k, v in raw.items()}

    def patch(self, where: str, raw: Any, kind: str) -> PatchStep:
        raw = self.mapping(where, raw, "patch")
        ptype = raw.get("type")
        if ptype is not None and ptype not in _PATCH_TYPES:
            raise self.fail(f"{where}.type", ptype, f"must be one of {sorted(_PATCH_TYPES)}")
        return PatchStep(self.template(f"{where}.template", raw.get("template", ""), kind), str(raw.get("root", "")),
                         ptype, str(raw.get("subresource", "")))

    def apply(self, where: str, raw: Any, kind: str) -> ApplyStep:
        raw = self.mapping(where, raw, "apply")
        atype = raw.get("type")
        if atype is not None and atype not in _APPLY_TYPES:
            raise self.fail(f"{where}.type", atype, f"must be one of {sorted(_APPLY_TYPES)}")
        return ApplyStep(self.template(f"{where}.template", raw.get("template", ""), kind), atype,
                         str(raw.get("subresource", "")))

    def steps(self, spec: Mapping[str, Any], kind: str) -> tuple[Step, ...]:
        raw_steps = spec.get("steps")
        if raw_steps:
            if not isinstance(raw_steps, list):
                raise self.fail("spec.steps", raw_steps, "must be a list")
            out = []
            for i, raw in enumerate(raw_steps):
                where = f"spec.steps[{i}]"
                raw = self.mapping(where, raw, "step")
                out.append(Step(
                    event=self.event(f"{where}.event", raw["event"]) if raw.get("event") is not None else None,
                    finalizers=self.finalizers(f"{where}.finalizers", raw["finalizers"])
                    if raw.get("finalizers") is not None else None,
                    delete=bool(raw.get("delete", False)),
                    patch=self.patch(f"{where}.patch", raw["patch"], kind) if raw.get("patch") is not None else None,
                    apply=self.apply(f"{where}.apply", raw["apply"], kind) if raw.get("apply") is not None else None))
            return tuple(out)
        nxt = self.mapping("spec.next", spec.get("next"), "spec.next")
        steps: list[Step] = []  # Kwok's conversion of `next` into steps
        if nxt.get("event") is not None:
            steps.append(Step(event=self.event("spec.next.event", nxt["event"])))
        if nxt.get("finalizers") is not None:
            steps.append(Step(finalizers=self.finalizers("spec.next.finalizers", nxt["finalizers"])))
        patches = nxt.get("patches") or []
        if not isinstance(patches, list):
            raise self.fail("spec.next.patches", patches, "must be a list")
        if patches:
            steps += [Step(patch=self.patch(f"spec.next.patches[{j}]", p, kind)) for j, p in enumerate(patches)]
        elif nxt.get("statusTemplate"):
            template = self.template("spec.next.statusTemplate", nxt["statusTemplate"], kind)
            steps.append(Step(patch=PatchStep(template, "status", None, str(nxt.get("statusSubresource") or "status"))))
        if nxt.get("delete"):
            steps.append(Step(delete=True))
        return tuple(steps)


_DEFAULT_FUNCS: dict[str, dict[str, Func]] = {}


def _default_funcs(kind: str) -> dict[str, Func]:
    """Kwok's functions for `kind` on a default cluster: a template is parsed (and checked) with
    them; the lifecycle runs it with its own cluster's."""
    if kind not in _DEFAULT_FUNCS:
        _DEFAULT_FUNCS[kind] = kwok_funcs(kind, KwokCluster())
    return _DEFAULT_FUNCS[kind]


def parse_stage(raw: Any, source: str) -> Stage:
    """One Stage document; raises StageError naming the file, field and value."""
    r = _Reader(source)
    raw = r.mapping("", raw, "")
    if raw.get("apiVersion") != "kwok.x-k8s.io/v1alpha1" or raw.get("kind") != "Stage":
        raise r.fail("apiVersion/kind", f"{raw.get('apiVersion')}/{raw.get('kind')}",
                     "expected kwok.x-k8s.io/v1alpha1 Stage")
    name = str((raw.get("metadata") or {}).get("name") or "")
    if not name:
        raise r.fail("metadata.name", name, "is required")
    r = _Reader(f"{source} (stage {name})")
    spec = r.mapping("spec", raw.get("spec"), "spec")
    ref = r.mapping("spec.resourceRef", spec.get("resourceRef"), "spec.resourceRef")
    kind = ref.get("kind")
    if not isinstance(kind, str) or not kind:
        raise r.fail("spec.resourceRef.kind", kind, "is required (the kind of object the stage applies to)")
    selector = spec.get("selector")
    sel = r.mapping("spec.selector", selector, "spec.selector")
    requirements, conditions = [], []
    expressions = sel.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise r.fail("spec.selector.matchExpressions", expressions, "must be a list")
    for i, expr in enumerate(expressions):
        where = f"spec.selector.matchExpressions[{i}]"
        if not isinstance(expr, Mapping):
            raise r.fail(where, expr, "must be a mapping with key, operator and values (or jq, or cel)")
        r.mapping(where, expr, "match")
        if expr.get("cel") is not None:
            cel = r.mapping(f"{where}.cel", expr["cel"], "cel")
            conditions.append(r.cel(f"{where}.cel.expression", cel.get("expression")))
            continue
        jq = r.mapping(f"{where}.jq", expr["jq"], "jq") if expr.get("jq") is not None else expr
        where = f"{where}.jq" if expr.get("jq") is not None else where
        operator = jq.get("operator")
        if operator not in OPERATORS:
            raise r.fail(f"{where}.operator", operator, f"must be one of {list(OPERATORS)}")
        values = tuple(str(v) for v in jq.get("values") or ())
        if operator in ("In", "NotIn") and not values:
            raise r.fail(f"{where}.values", jq.get("values"), f"{operator} needs values")
        if operator in ("Exists", "DoesNotExist") and values:
            raise r.fail(f"{where}.values", jq.get("values"), f"{operator} takes no values")
        requirements.append(Requirement(r.jq(f"{where}.key", jq.get("key")), operator, values))
    delay = r.mapping("spec.delay", spec.get("delay"), "spec.delay")
    jitter = delay.get("jitterDurationMilliseconds")
    return Stage(
        name=name, kind=kind, api_group=str(ref.get("apiGroup") or "v1"), selected=selector is not None,
        match_labels={str(k): str(v) for k, v in (sel.get("matchLabels") or {}).items()},
        match_annotations={str(k): str(v) for k, v in (sel.get("matchAnnotations") or {}).items()},
        requirements=tuple(requirements), conditions=tuple(conditions),
        weight=r.integer("spec.weight", spec.get("weight", 0)),
        weight_from=r.value_from("spec.weightFrom", spec.get("weightFrom")),
        delayed=spec.get("delay") is not None,
        duration_ms=r.integer("spec.delay.durationMilliseconds", delay.get("durationMilliseconds", 0)),
        duration_from=r.value_from("spec.delay.durationFrom", delay.get("durationFrom")),
        jitter_ms=None if jitter is None else r.integer("spec.delay.jitterDurationMilliseconds", jitter),
        jitter_from=r.value_from("spec.delay.jitterDurationFrom", delay.get("jitterDurationFrom")),
        steps=r.steps(spec, kind),
        immediate_next=bool(spec.get("immediateNextStage", False)),
        source=source,
    )


def load_stages(paths: Iterable[str | Path]) -> list[Stage]:
    """Every Stage of the given files (multi-document YAML), validated before any run; other
    kinds of documents in them (a StorageClass beside Kwok's volume stages) are skipped, as
    Kwok's loader keeps only the kinds it knows."""
    out = []
    for path in paths:
        text = Path(path).read_text()
        try:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as exc:
            raise StageError(str(path), "<document>", "", f"not YAML: {exc}") from None
        for n, doc in enumerate(docs):
            source = f"{path}#{n}" if len(docs) > 1 else str(path)
            if isinstance(doc, Mapping) and doc.get("apiVersion") != "kwok.x-k8s.io/v1alpha1" \
                    and doc.get("kind") not in (None, "Stage"):
                continue
            out.append(parse_stage(doc, source))
    return out


def load_object(text: str) -> Any:
    """A Kubernetes object from YAML, read as Kwok reads it (go-yaml v2's rules)."""
    return load_yaml(text)


# --- the lifecycle ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    """One stage applied to one object at `at` (clock seconds)."""

    kind: str
    key: str
    stage: str
    at: float
    phase: str  # the object's phase afterwards ("" for none)
    deleted: bool  # the object is gone
    event: Mapping[str, str]  # the stage's first event ({} for none)
    events: tuple[Mapping[str, str], ...] = ()
    changed: bool = True  # the stage changed the object


def choose(stages: Sequence[Stage], obj: Any, rng: random.Random) -> Stage | None:
    """Kwok's Lifecycle.Match: one of the matching stages, drawn by weight; all weights 0 (or
    unreadable): uniformly."""
    if not stages:
        return None
    if len(stages) == 1:
        return stages[0]
    weights = [s.weight_of(obj) for s in stages]
    readable = [(s, w) for s, w in zip(stages, weights, strict=True) if w is not None]
    if not readable:
        return stages[rng.randrange(len(stages))]
    total = sum(w for _, w in readable)
    if total == 0:
        return readable[rng.randrange(len(readable))][0]
    off = rng.randrange(total)
    for s, w in readable:
        if w <= 0:
            continue
        off -= w
        if off < 0:
            return s
    return stages[-1]


def all_possible(stages: Sequence[Stage], obj: Any) -> list[Stage]:
    """Kwok's Lifecycle.ListAllPossible: every matching stage that Match could draw."""
    if len(stages) <= 1:
        return list(stages)
    weights = [s.weight_of(obj) for s in stages]
    if all(w is None for w in weights):
        return list(stages)
    if sum(w or 0 for w in weights) == 0:
        return [s for s, w in zip(stages, weights, strict=True) if w is not None]
    return [s for s, w in zip(stages, weights, strict=True) if w is not None and w > 0]


_LOOP_LIMIT = 100  # changes of one object at one instant before the stages are called a loop


class Lifecycle:
    """Objects move through the stages that match them (see the module docstring)."""

    def __init__(self, stages: Sequence[Stage], *, speedup: float = 1.0, seed: int = 0,
                 config: KwokConfig | None = None) -> None:
        if speedup <= 0:
            raise ValueError(f"speedup={speedup!r}: must be positive")
        config = config or KwokConfig()
        config.validate()
        self.stages: dict[str, list[Stage]] = {}
        for s in stages:
            self.stages.setdefault(s.kind, []).append(s)
        self.speedup = speedup
        self.rng = random.Random(seed)
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.cluster = KwokCluster(config, node=self._node)
        self._funcs = {kind: kwok_funcs(kind, self.cluster) for kind in self.stages}
        self._nodes: dict[str, str] = {}  # node name -> key
        self._heap: list[tuple[float, int, str, str, int]] = []  # (due, seq, kind, key, version)
        self._version: dict[tuple[str, str], int] = {}
        self._seq = 0
        self._stage_of: dict[tuple[str, str, int], Stage] = {}

    def __len__(self) -> int:
        return len(self.objects)

    def set_epoch(self, epoch: float) -> None:
        """The Unix time of the clock's 0 (what `Now` renders and timestamps are read against)."""
        self.cluster.config = replace(self.cluster.config, epoch=epoch)

    def _node(self, name: str) -> Mapping[str, Any] | None:
        key = self._nodes.get(name)
        return None if key is None else self.objects.get(("Node", key))

    def upsert(self, kind: str, key: str, obj: dict[str, Any], now: float) -> None:
        """A new or changed object: it waits for the next stage that matches it."""
        self.objects[(kind, key)] = obj
        if kind == "Node":
            self._nodes[str((obj.get("metadata") or {}).get("name") or key)] = key
        self._plan(kind, key, now)

    def forget(self, kind: str, key: str) -> None:
        obj = self.objects.pop((kind, key), None)
        if obj is not None and kind == "Pod":
            self.cluster.recycle_pod_ips(obj)
        if kind == "Node":
            name = str(((obj or {}).get("metadata") or {}).get("name") or key)
            if self._nodes.get(name) == key:
                del self._nodes[name]
        self._version[(kind, key)] = self._version.get((kind, key), 0) + 1

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def _plan(self, kind: str, key: str, now: float) -> None:
        version = self._version.get((kind, key), 0) + 1
        self._version[(kind, key)] = version
        obj = self.objects.get((kind, key))
        if obj is None:
            return
        try:
            matching = [s for s in self.stages.get(kind, ()) if s.matches(obj)]
        except CelError:
            return  # Kwok logs the failed match and leaves the object alone
        stage = choose(matching, obj, self.rng)
        if stage is None:
            return
        wall = self.cluster.config.epoch + now
        due = now + stage.delay_s(obj, wall, self.rng) / self.speedup
        self._seq += 1
        self._stage_of[(kind, key, version)] = stage
        heapq.heappush(self._heap, (due, self._seq, kind, key, version))

    def due(self, now: float) -> list[Transition]:
        """Apply every transition due by `now`, in time order; returns them."""
        out: list[Transition] = []
        changes: dict[tuple[str, str, float], int] = {}
        while self._heap and self._heap[0][0] <= now:
            at, _, kind, key, version = heapq.heappop(self._heap)
            stage = self._stage_of.pop((kind, key, version), None)
            obj = self.objects.get((kind, key))
            if stage is None or obj is None or self._version.get((kind, key)) != version:
                continue  # superseded by a change, or gone
            t = self._apply(kind, key, obj, stage, at)
            out.append(t)
            if t.changed and not t.deleted:
                n = changes[(kind, key, at)] = changes.get((kind, key, at), 0) + 1
                if n > _LOOP_LIMIT:
                    raise LifecycleError(f"{kind} {key}: its stages changed it {n} times at {at} s "
                                         f"(last {stage.name!r}, {stage.source}): a loop in the stage files")
                self._plan(kind, key, at)  # Kwok sees the change and matches the object again
        return out

    def _apply(self, kind: str, key: str, obj: dict[str, Any], stage: Stage, at: float) -> Transition:
        self.cluster.now = at
        try:
            effects = stage.effects(obj, self._funcs[kind], kind in TYPED_KINDS)
        except ValueError as exc:
            raise LifecycleError(f"{stage.source} (stage {stage.name}) on {kind} {key}: {exc}") from None
        state: Any = obj
        events: list[Mapping[str, str]] = []
        delete = False
        for effect in effects:
            if effect.kind == "event":
                events.append(effect.event)
            elif effect.kind == "delete":
                delete = True
            elif effect.kind == "apply":
                self._apply_object(effect, obj, at)
            else:
                if kind == "Pod":
                    self.cluster.mark_pod_ips(obj)
                try:
                    state = kubepatch.apply_patch(state, effect.data, effect.type, kind)
                except kubepatch.PatchError as exc:
                    raise LifecycleError(f"{stage.source} (stage {stage.name}) on {kind} {key}: {exc}") from None
        if not isinstance(state, dict):
            raise LifecycleError(f"{stage.source} (stage {stage.name}) on {kind} {key}: a patch left {state!r}")
        gone = False
        if delete:
            meta = state.get("metadata") or {}
            if meta.get("finalizers"):  # the API server only marks it; the finalizers' owners remove it
                if not meta.get("deletionTimestamp"):
                    stamp = datetime.fromtimestamp(self.cluster.config.epoch + at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                    state = {**state, "metadata": {**meta, "deletionTimestamp": stamp}}
            else:
                gone = True
        changed = gone or state != obj
        if changed and state is not obj:
            obj.clear()
            obj.update(state)
        if gone:
            self.forget(kind, key)
        phase = str((obj.get("status") or {}).get("phase", "") or "")
        return Transition(kind, key, stage.name, at, phase, gone, events[0] if events else {}, tuple(events), changed)

    def _apply_object(self, effect: Effect, source: Mapping[str, Any], at: float) -> None:
        """Kwok's ApplyResource: create the rendered object, or patch it when it exists (a
        subresource is only ever patched)."""
        data = effect.data
        if not isinstance(data, Mapping) or not data.get("kind") or not data.get("apiVersion"):
            raise LifecycleError(f"an applied template must give apiVersion and kind: {data!r}")
        kind = str(data["kind"])
        meta = dict(data.get("metadata") or {})
        namespace = meta.get("namespace") or ((source.get("metadata") or {}).get("namespace")
                                              if kind not in CLUSTER_SCOPED else None)
        if namespace:
            meta["namespace"] = namespace
        name = str(meta.get("name") or "")
        key = f"{namespace}/{name}" if namespace else name
        current = self.objects.get((kind, key))
        obj = {**data, "metadata": meta}
        if current is None:
            if effect.subresource:
                raise LifecycleError(f"{kind} {key} does not exist: its {effect.subresource} cannot be applied")
            if kind in CREATED_STATUS and not obj.get("status"):
                obj["status"] = dict(CREATED_STATUS[kind])  # as the API server creates one
            self.upsert(kind, key, obj, at)
            return
        patched = kubepatch.apply_patch(current, obj, effect.type, kind)
        if patched != current:
            current.clear()
            current.update(patched)
            self.upsert(kind, key, current, at)
