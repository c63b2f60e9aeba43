"""The selectors of the rebalancer's args, checked once on load: Kubernetes label selectors
(`matchLabels`, `matchExpressions` with In / NotIn / Exists / DoesNotExist), the descheduler's
`evictableNamespaces` (include or exclude, not both) and Koordinator's `podSelectors` (a list
of named label selectors, any of which admits a pod).

Matching a label selector is the one function reservations use too
(`agents.state.reservations.selector_matches`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.rebalance.args import absent
from agents.scheduler.plugins.args import ArgsError, reject_unknown
from agents.state.reservations import selector_matches

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class LabelSelector:
    match_labels: dict[str, str] = field(default_factory=dict)
    match_expressions: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_mapping(cls, raw: Any, path: str) -> LabelSelector:
        if not isinstance(raw, Mapping):
            raise ArgsError(path, raw, "must be a label selector {matchLabels, matchExpressions}")
        reject_unknown(raw, {"matchLabels", "matchExpressions"}, f"{path}.")
        labels = absent(raw.get("matchLabels"), {})
        if not isinstance(labels, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise ArgsError(f"{path}.matchLabels", labels, "must map label keys to string values")
        exprs = absent(raw.get("matchExpressions"), [])
        if not isinstance(exprs, Sequence) or isinstance(exprs, str):
            raise ArgsError(f"{path}.matchExpressions", exprs, "must be a list")
        parsed = []
        for i, expr in enumerate(exprs):
            where = f"{path}.matchExpressions[{i}]"
            if not isinstance(expr, Mapping):
                raise ArgsError(where, expr, "must be {key, operator, values}")
            reject_unknown(expr, {"key", "operator", "values"}, f"{where}.")
            key, op, values = expr.get("key"), expr.get("operator"), absent(expr.get("values"), [])
            if not isinstance(key, str) or not key:
                raise ArgsError(f"{where}.key", key, "must be a non-empty string")
            if op not in OPERATORS:
                raise ArgsError(f"{where}.operator", op, f"must be one of {', '.join(OPERATORS)}")
            if not isinstance(values, Sequence) or isinstance(values, str) or not all(isinstance(v, str) for v in values):
                raise ArgsError(f"{where}.values", values, "must be a list of strings")
            if op in ("In", "NotIn") and not values:
                raise ArgsError(f"{where}.values", values, f"operator {op} needs at least one value")
            if op in ("Exists", "DoesNotExist") and values:
                raise ArgsError(f"{where}.values", values, f"operator {op} takes no values")
            parsed.append({"key": key, "operator": op, "values": tuple(values)})
        return cls(dict(labels), tuple(parsed))

    def matches(self, labels: Mapping[str, str]) -> bool:
        return selector_matches(self.match_labels, self.match_expressions, labels)


@dataclass(frozen=True)
class Namespaces:
    """`evictableNamespaces`: only `include`d namespaces, or every one but the `exclude`d."""

    include: frozenset[str] = frozenset()
    exclude: frozenset[str] = frozenset()

    @classmethod
    def from_mapping(cls, raw: Any, path: str) -> Namespaces:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ArgsError(path, raw, "must be {include: [...]} or {exclude: [...]}")
        reject_unknown(raw, {"include", "exclude"}, f"{path}.")
        if raw.get("include") and raw.get("exclude"):
            raise ArgsError(path, raw, "include and exclude cannot both be set")
        sets = {}
        for name in ("include", "exclude"):
            values = absent(raw.get(name), [])
            if not isinstance(values, Sequence) or isinstance(values, str) or not all(isinstance(v, str) and v for v in values):
                raise ArgsError(f"{path}.{name}", values, "must be a list of namespace names")
            sets[name] = frozenset(values)
        return cls(sets["include"], sets["exclude"])

    def allows(self, namespace: str) -> bool:
        if self.include:
            return namespace in self.include
        return namespace not in self.exclude


@dataclass(frozen=True)
class PodSelectors:
    """Koordinator's `podSelectors`: [{name, selector}]; none admits every pod."""

    selectors: tuple[tuple[str, LabelSelector], ...] = ()

    @classmethod
    def from_list(cls, raw: Any, path: str) -> PodSelectors:
        if raw is None:
            return cls()
        if not isinstance(raw, Sequence) or isinstance(raw, str):
            raise ArgsError(path, raw, "must be a list of {name, selector}")
        out = []
        for i, item in enumerate(raw):
            where = f"{path}[{i}]"
            if not isinstance(item, Mapping):
                raise ArgsError(where, item, "must be {name, selector}")
            reject_unknown(item, {"name", "selector"}, f"{where}.")
            name = item.get("name", "")
            if not isinstance(name, str):
                raise ArgsError(f"{where}.name", name, "must be a string")
            out.append((name, LabelSelector.from_mapping(absent(item.get("selector"), {}), f"{where}.selector")))
        return cls(tuple(out))

    def admits(self, labels: Mapping[str, str]) -> bool:
        return not self.selectors or any(s.matches(labels) for _, s in self.selectors)
