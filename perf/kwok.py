"""A Kwok-compatible lifecycle: Kwok `Stage` files (`kwok.x-k8s.io/v1alpha1`) applied to the
pods and nodes of a run (DESIGN.md: no Kwok binary can run here, so the harness carries one).

What a Stage says, and what is honoured:
- `resourceRef` (`apiGroup: v1`, `kind: Pod | Node`): which objects it applies to.
- `selector`: `matchLabels`, `matchAnnotations`, and `matchExpressions` whose keys are jq
  expressions over the object (a subset of jq: `.a.b`, `.a["k"]`, `.[]`, `|`, and
  `select(<path> == / != <literal>)`), with the operators In, NotIn, Exists, DoesNotExist (In
  holds when any value the expression yields is in `values`).
- `weight`: when several stages match an object, one is drawn with probability proportional
  to its weight (a weight of 0 counts as 1 when all are 0, as in Kwok).
- `delay`: `durationMilliseconds` (or `durationFrom.expressionFrom`: a Go duration string, or
  a timestamp meaning "until then"), `jitterDurationMilliseconds` (or `jitterDurationFrom`):
  the delay is drawn uniformly between the two; a jitter below the duration is used alone.
- `next`: `statusTemplate` (read for what it sets: `phase`, `podIP`, `hostIP` and the
  `conditions` with their type and status; Go template actions are not run), `patches` (of
  the status root, read the same way), `finalizers` (add / remove / empty), `event`, `delete`.
  The next stage is always planned as soon as one is applied, so `immediateNextStage` is
  accepted and has nothing more to do.

`Lifecycle` is pure: objects go in (`upsert`), time passes on an injected clock, and `due(now)`
applies every transition that is due and returns what happened (`Transition`s); a speed-up
factor divides every delay. The harness turns transitions into records (a pod that finished or
was deleted frees its node's resources).

Bad files are refused before a run with the file, the field and the value (`StageError`).
"""

from __future__ import annotations

import heapq
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from schemas.quantity import parse_duration

KINDS = ("Pod", "Node")
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class StageError(ValueError):
    def __init__(self, source: str, field: str, value: Any, reason: str) -> None:
        super().__init__(f"{source}: {field}={value!r}: {reason}")
        self.source, self.field, self.value = source, field, value


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
class Status:
    """What a statusTemplate or status patch sets, as far as the harness reads it."""

    phase: str = ""
    pod_ip: bool = False
    host_ip: bool = False
    conditions: tuple[tuple[str, str], ...] = ()  # (type, status)


@dataclass(frozen=True)
class Stage:
    name: str
    kind: str
    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_annotations: Mapping[str, str] = field(default_factory=dict)
    requirements: tuple[Requirement, ...] = ()
    weight: int = 0
    duration_ms: int = 0
    duration_from: Jq | None = None
    jitter_ms: int | None = None
    jitter_from: Jq | None = None
    status: Status | None = None
    finalizers_add: tuple[str, ...] = ()
    finalizers_remove: tuple[str, ...] = ()
    finalizers_empty: bool = False
    event: Mapping[str, str] = field(default_factory=dict)
    delete: bool = False

    @property
    def instant(self) -> bool:
        return (not self.duration_ms and self.duration_from is None and not self.jitter_ms
                and self.jitter_from is None)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        return (all(labels.get(k) == v for k, v in self.match_labels.items())
                and all(annotations.get(k) == v for k, v in self.match_annotations.items())
                and all(r.holds(obj) for r in self.requirements))

    def delay_s(self, obj: Mapping[str, Any], now: float, rng: random.Random) -> float:
        duration = _duration(self.duration_from, obj, now, self.duration_ms / 1000)
        if self.jitter_ms is None and self.jitter_from is None:
            return duration
        jitter = _duration(self.jitter_from, obj, now, (self.jitter_ms or 0) / 1000)
        return jitter if jitter < duration else rng.uniform(duration, jitter)


def _duration(expr: Jq | None, obj: Mapping[str, Any], now: float, default: float) -> float:
    if expr is None:
        return default
    for value in expr.values(obj):
        text = str(value)
        try:
            return max(0.0, parse_duration(text))
        except ValueError:
            pass
        try:
            return max(0.0, datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() - now)
        except ValueError:
            pass
    return default


_KNOWN = {
    "": {"apiVersion", "kind", "metadata", "spec"},
    "spec": {"resourceRef", "selector", "weight", "weightFrom", "delay", "next", "immediateNextStage"},
    "spec.resourceRef": {"apiGroup", "kind"},
    "spec.selector": {"matchLabels", "matchAnnotations", "matchExpressions"},
    "spec.delay": {"durationMilliseconds", "durationFrom", "jitterDurationMilliseconds", "jitterDurationFrom"},
    "spec.next": {"statusTemplate", "patches", "finalizers", "event", "delete"},
    "spec.next.finalizers": {"add", "remove", "empty"},
    "spec.next.event": {"type", "reason", "message"},
}


def _check_fields(source: str, where: str, raw: Any) -> None:
    if not isinstance(raw, Mapping):
        raise StageError(source, where or "<document>", raw, "must be a mapping")
    known = _KNOWN.get(where)
    if known is None:
        return
    for key in raw:
        if key not in known:
            raise StageError(source, f"{where}.{key}" if where else str(key), raw[key], "unknown field")


def _jq(source: str, field: str, text: Any) -> Jq:
    if not isinstance(text, str):
        raise StageError(source, field, text, "must be a jq expression string")
    try:
        return compile_jq(text)
    except ValueError as exc:
        raise StageError(source, field, text, f"not a supported jq expression: {exc}") from None


def _int(source: str, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StageError(source, field, value, "must be a non-negative integer")
    return value


_ASSIGN = re.compile(r"^\s*(-\s+)?([A-Za-z]+):\s*(.*?)\s*$")


def read_status(text: str) -> Status:
    """What a statusTemplate sets: Go template actions are dropped, then the phase, IPs and
    conditions are read from what is left."""
    phase, pod_ip, host_ip = "", False, False
    conditions: list[tuple[str, str]] = []
    current: dict[str, str] = {}
    in_conditions = False
    for line in re.sub(r"\{\{.*?\}\}", "X", text).splitlines():
        m = _ASSIGN.match(line)
        if not m:
            continue
        dash, key, value = m.groups()
        value = value.strip("'\"")
        indent = len(line) - len(line.lstrip())
        if indent == 0 and not dash:
            if current:
                conditions.append((current.get("type", ""), current.get("status", "")))
                current = {}
            in_conditions = key == "conditions"
            phase = value if key == "phase" else phase
            pod_ip |= key == "podIP"
            host_ip |= key == "hostIP"
        elif in_conditions:
            if dash and current:
                conditions.append((current.get("type", ""), current.get("status", "")))
                current = {}
            current[key] = value
    if current:
        conditions.append((current.get("type", ""), current.get("status", "")))
    return Status(phase, pod_ip, host_ip, tuple(c for c in conditions if c[0]))


def parse_stage(raw: Any, source: str) -> Stage:
    """One Stage document; raises StageError naming the file, field and value."""
    _check_fields(source, "", raw)
    if raw.get("apiVersion") != "kwok.x-k8s.io/v1alpha1" or raw.get("kind") != "Stage":
        raise StageError(source, "apiVersion/kind", f"{raw.get('apiVersion')}/{raw.get('kind')}",
                         "expected kwok.x-k8s.io/v1alpha1 Stage")
    name = str((raw.get("metadata") or {}).get("name") or "")
    if not name:
        raise StageError(source, "metadata.name", name, "is required")
    where = f"{source} (stage {name})"
    spec = raw.get("spec") or {}
    _check_fields(where, "spec", spec)
    ref = spec.get("resourceRef") or {}
    _check_fields(where, "spec.resourceRef", ref)
    kind = ref.get("kind")
    if kind not in KINDS or ref.get("apiGroup", "v1") not in ("v1", ""):
        raise StageError(where, "spec.resourceRef.kind", kind, f"must be one of {list(KINDS)} (apiGroup v1)")
    selector = spec.get("selector") or {}
    _check_fields(where, "spec.selector", selector)
    requirements = []
    for i, expr in enumerate(selector.get("matchExpressions") or []):
        field_ = f"spec.selector.matchExpressions[{i}]"
        if not isinstance(expr, Mapping):
            raise StageError(where, field_, expr, "must be a mapping with key, operator and values")
        operator = expr.get("operator")
        if operator not in OPERATORS:
            raise StageError(where, f"{field_}.operator", operator, f"must be one of {list(OPERATORS)}")
        values = tuple(str(v) for v in expr.get("values") or ())
        if operator in ("In", "NotIn") and not values:
            raise StageError(where, f"{field_}.values", expr.get("values"), f"{operator} needs values")
        requirements.append(Requirement(_jq(where, f"{field_}.key", expr.get("key")), operator, values))
    delay = spec.get("delay") or {}
    _check_fields(where, "spec.delay", delay)

    def source_expr(key: str) -> Jq | None:
        raw_from = delay.get(key)
        if raw_from is None:
            return None
        if not isinstance(raw_from, Mapping) or set(raw_from) != {"expressionFrom"}:
            raise StageError(where, f"spec.delay.{key}", raw_from, "must be {expressionFrom: <jq expression>}")
        return _jq(where, f"spec.delay.{key}.expressionFrom", raw_from["expressionFrom"])

    nxt = spec.get("next") or {}
    _check_fields(where, "spec.next", nxt)
    status = read_status(nxt["statusTemplate"]) if isinstance(nxt.get("statusTemplate"), str) else None
    for j, patch in enumerate(nxt.get("patches") or []):
        if not isinstance(patch, Mapping) or not isinstance(patch.get("template", ""), str):
            raise StageError(where, f"spec.next.patches[{j}]", patch, "must be a mapping with a template")
        if patch.get("root", "status") == "status":
            status = read_status(patch.get("template", ""))
    finalizers = nxt.get("finalizers") or {}
    _check_fields(where, "spec.next.finalizers", finalizers)
    event = nxt.get("event") or {}
    _check_fields(where, "spec.next.event", event)
    jitter = delay.get("jitterDurationMilliseconds")
    return Stage(
        name=name, kind=str(kind),
        match_labels={str(k): str(v) for k, v in (selector.get("matchLabels") or {}).items()},
        match_annotations={str(k): str(v) for k, v in (selector.get("matchAnnotations") or {}).items()},
        requirements=tuple(requirements),
        weight=_int(where, "spec.weight", spec.get("weight", 0)),
        duration_ms=_int(where, "spec.delay.durationMilliseconds", delay.get("durationMilliseconds", 0)),
        duration_from=source_expr("durationFrom"),
        jitter_ms=None if jitter is None else _int(where, "spec.delay.jitterDurationMilliseconds", jitter),
        jitter_from=source_expr("jitterDurationFrom"),
        status=status,
        finalizers_add=tuple(str(f.get("value")) for f in finalizers.get("add") or ()),
        finalizers_remove=tuple(str(f.get("value")) for f in finalizers.get("remove") or ()),
        finalizers_empty=bool(finalizers.get("empty", False)),
        event={str(k): str(v) for k, v in event.items()},
        delete=bool(nxt.get("delete", False)),
    )


def load_stages(paths: Iterable[str | Path]) -> list[Stage]:
    """Every Stage of the given files (multi-document YAML), validated before any run."""
    out = []
    for path in paths:
        text = Path(path).read_text()
        try:
            docs = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise StageError(str(path), "<document>", "", f"not YAML: {exc}") from None
        for n, doc in enumerate(d for d in docs if d is not None):
            out.append(parse_stage(doc, f"{path}#{n}" if len(docs) > 1 else str(path)))
    return out


# --- the lifecycle ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    """One stage applied to one object at `at` (clock seconds)."""

    kind: str
    key: str
    stage: str
    at: float
    phase: str  # the object's phase afterwards ("" for none)
    deleted: bool
    event: Mapping[str, str]


class Lifecycle:
    """Objects move through the stages that match them (see the module docstring)."""

    def __init__(self, stages: Sequence[Stage], *, speedup: float = 1.0, seed: int = 0) -> None:
        if speedup <= 0:
            raise ValueError(f"speedup={speedup!r}: must be positive")
        self.stages = {kind: [s for s in stages if s.kind == kind] for kind in KINDS}
        self.speedup = speedup
        self.rng = random.Random(seed)
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self._heap: list[tuple[float, int, str, str, int]] = []  # (due, seq, kind, key, version)
        self._version: dict[tuple[str, str], int] = {}
        self._seq = 0
        self._stage_of: dict[tuple[str, str, int], Stage] = {}
        self._instant_done: dict[tuple[str, str], set[str]] = {}

    def __len__(self) -> int:
        return len(self.objects)

    def upsert(self, kind: str, key: str, obj: dict[str, Any], now: float) -> None:
        """A new or changed object: it waits for the next stage that matches it."""
        self.objects[(kind, key)] = obj
        self._instant_done.pop((kind, key), None)
        self._plan(kind, key, now)

    def forget(self, kind: str, key: str) -> None:
        self.objects.pop((kind, key), None)
        self._instant_done.pop((kind, key), None)
        self._version[(kind, key)] = self._version.get((kind, key), 0) + 1

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def _plan(self, kind: str, key: str, now: float) -> None:
        version = self._version.get((kind, key), 0) + 1
        self._version[(kind, key)] = version
        obj = self.objects.get((kind, key))
        if obj is None:
            return
        # Stages without delay apply once until the object changes from outside; otherwise two
        # of them that keep matching would apply forever (delayed ones repeat, like heartbeats).
        done = self._instant_done.get((kind, key), set())
        matching = [s for s in self.stages.get(kind, ()) if s.matches(obj) and s.name not in done]
        if not matching:
            return
        weights = [s.weight for s in matching]
        stage = self.rng.choices(matching, weights=weights)[0] if any(weights) else matching[0]
        due = now + stage.delay_s(obj, now, self.rng) / self.speedup
        self._seq += 1
        self._stage_of[(kind, key, version)] = stage
        heapq.heappush(self._heap, (due, self._seq, kind, key, version))

    def due(self, now: float) -> list[Transition]:
        """Apply every transition due by `now`, in time order; returns them."""
        out: list[Transition] = []
        while self._heap and self._heap[0][0] <= now:
            at, _, kind, key, version = heapq.heappop(self._heap)
            stage = self._stage_of.pop((kind, key, version), None)
            obj = self.objects.get((kind, key))
            if stage is None or obj is None or self._version.get((kind, key)) != version or not stage.matches(obj):
                continue  # superseded by a change, or no longer selected
            out.append(self._apply(kind, key, obj, stage, at))
            if not out[-1].deleted:
                if stage.instant:
                    self._instant_done.setdefault((kind, key), set()).add(stage.name)
                self._plan(kind, key, at)  # planned at once (immediateNextStage or not)
        return out

    def _apply(self, kind: str, key: str, obj: dict[str, Any], stage: Stage, at: float) -> Transition:
        meta = obj.setdefault("metadata", {})
        status = obj.setdefault("status", {})
        if stage.status is not None:
            if stage.status.phase:
                status["phase"] = stage.status.phase
            if stage.status.pod_ip:
                status.setdefault("podIP", "10.0.0.1")
            if stage.status.host_ip:
                status.setdefault("hostIP", "10.0.0.2")
            if stage.status.conditions:
                status["conditions"] = [{"type": t, "status": s} for t, s in stage.status.conditions]
        finalizers = list(meta.get("finalizers") or [])
        if stage.finalizers_empty:
            finalizers = []
        finalizers = [f for f in finalizers if f not in stage.finalizers_remove] + \
                     [f for f in stage.finalizers_add if f not in finalizers]
        if finalizers:
            meta["finalizers"] = finalizers
        else:
            meta.pop("finalizers", None)
        if stage.delete:
            self.forget(kind, key)
        return Transition(kind, key, stage.name, at, str(status.get("phase", "")), stage.delete, dict(stage.event))
