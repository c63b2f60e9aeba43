"""NodeAffinity (PreFilter, Filter, PreScore, Score): `nodeSelector` and node affinity.

Filter: the node matches every `nodeSelector` entry and, when the pod has required node
affinity, at least one of its `nodeSelectorTerms` (each term: all of its `matchExpressions` on
labels and `matchFields` on `metadata.name`). Operators In, NotIn, Exists, DoesNotExist, Gt,
Lt, with Kubernetes' meaning (NotIn and DoesNotExist match a node without the label).
Score: the sum of the weights of the preferred terms the node matches, normalized to 0-100.

The pod's affinity is parsed once (PreFilter) into a hashable form; a malformed one (unknown
operator, In without values, Gt with a non-integer, a weight outside 1-100, ...) rejects the
pod as unresolvable with the field path and value. Matching is vectorized over factorized
label columns (`ClusterState.label_column`), never a loop over nodes.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from agents.scheduler.cluster import ClusterEvent, ClusterState
from agents.scheduler.framework import status
from agents.scheduler.framework.interface import UNSIGNABLE, CycleState, Mask, PodInfo, Rows, Scores
from agents.scheduler.framework.scoring import normalize
from agents.scheduler.framework.status import Status
from agents.scheduler.plugins.args import ArgsError, reject_unknown
from schemas.errors import FieldError

NAME = "NodeAffinity"
REASON = "node(s) didn't match Pod's node affinity/selector"
OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


class AffinityError(FieldError):
    """A node affinity that cannot be valid."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]
    on_name: bool = False  # matchFields on metadata.name


Term = tuple[Requirement, ...]


@dataclass(frozen=True, slots=True)
class ParsedAffinity:
    selector: tuple[tuple[str, str], ...]
    required: tuple[Term, ...] | None  # None: no required node affinity
    preferred: tuple[tuple[int, Term], ...]

    @property
    def empty(self) -> bool:
        return not self.selector and self.required is None and not self.preferred


def _requirement(raw: Any, path: str, on_name: bool) -> Requirement:
    if not isinstance(raw, Mapping):
        raise AffinityError(path, raw, "must be an object with key, operator and values")
    key, op, values = raw.get("key"), raw.get("operator"), raw.get("values") or []
    if not isinstance(key, str) or not key:
        raise AffinityError(f"{path}.key", key, "must be a non-empty string")
    if op not in OPERATORS:
        raise AffinityError(f"{path}.operator", op, f"must be one of {sorted(OPERATORS)}")
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise AffinityError(f"{path}.values", values, "must be a list of strings")
    if op in ("In", "NotIn") and not values:
        raise AffinityError(f"{path}.values", values, f"{op} needs at least one value")
    if op in ("Exists", "DoesNotExist") and values:
        raise AffinityError(f"{path}.values", values, f"{op} takes no values")
    if op in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
        raise AffinityError(f"{path}.values", values, f"{op} needs exactly one integer value")
    if on_name and (key != "metadata.name" or op not in ("In", "NotIn")):
        raise AffinityError(f"{path}.key", key, "matchFields supports only metadata.name with In or NotIn")
    return Requirement(key, op, tuple(values), on_name)


def _term(raw: Any, path: str) -> Term:
    if not isinstance(raw, Mapping):
        raise AffinityError(path, raw, "must be an object")
    reqs = [_requirement(r, f"{path}.matchExpressions[{i}]", False) for i, r in enumerate(raw.get("matchExpressions") or [])]
    reqs += [_requirement(r, f"{path}.matchFields[{i}]", True) for i, r in enumerate(raw.get("matchFields") or [])]
    return tuple(reqs)


def parse(node_selector: Mapping[str, str], affinity: Mapping[str, Any]) -> ParsedAffinity:
    """Raises AffinityError naming the field path and value."""
    node_affinity = affinity.get("nodeAffinity") or {}
    if not isinstance(node_affinity, Mapping):
        raise AffinityError("affinity.nodeAffinity", node_affinity, "must be an object")
    required: tuple[Term, ...] | None = None
    base = "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    req = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if req is not None:
        terms = req.get("nodeSelectorTerms") if isinstance(req, Mapping) else None
        if not isinstance(terms, list) or not terms:
            raise AffinityError(f"{base}.nodeSelectorTerms", terms, "must be a non-empty list")
        required = tuple(_term(t, f"{base}.nodeSelectorTerms[{i}]") for i, t in enumerate(terms))
    preferred: list[tuple[int, Term]] = []
    base = "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    prefs = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    if not isinstance(prefs, list):
        raise AffinityError(base, prefs, "must be a list")
    for i, p in enumerate(prefs):
        weight = p.get("weight") if isinstance(p, Mapping) else None
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
            raise AffinityError(f"{base}[{i}].weight", weight, "must be an integer from 1 to 100")
        preferred.append((weight, _term(p.get("preference") or {}, f"{base}[{i}].preference")))
    selector = tuple(sorted(node_selector.items()))
    return ParsedAffinity(selector, required, tuple(preferred))


def _requirement_mask(req: Requirement, state: ClusterState) -> npt.NDArray[np.bool_]:
    column = state.name_column() if req.on_name else state.label_column(req.key)
    if req.operator == "In":
        return column.matches(req.values)
    if req.operator == "NotIn":
        return ~column.matches(req.values)
    if req.operator == "Exists":
        return column.codes >= 0
    if req.operator == "DoesNotExist":
        return column.codes < 0
    bound = int(req.values[0])
    parsed = np.array([int(v) if v.lstrip("-").isdigit() else 0 for v in column.vocabulary], dtype=np.int64)
    numeric = np.array([v.lstrip("-").isdigit() for v in column.vocabulary], dtype=bool)
    has = column.codes >= 0
    codes = np.where(has, column.codes, 0)
    if not len(parsed):
        return np.zeros(column.codes.shape, dtype=bool)
    cmp = parsed[codes] > bound if req.operator == "Gt" else parsed[codes] < bound
    return has & numeric[codes] & cmp  # type: ignore[no-any-return]


def _term_mask(term: Term, state: ClusterState) -> npt.NDArray[np.bool_]:
    if not term:
        return np.zeros(state.size, dtype=bool)  # an empty term matches no node
    mask = np.ones(state.size, dtype=bool)
    for req in term:
        mask &= _requirement_mask(req, state)
    return mask


NONE = ParsedAffinity((), None, ())


def _parsed(pod: PodInfo) -> ParsedAffinity | AffinityError:
    cached = pod.derived.get(NAME)
    if cached is None and not pod.pod.node_selector and not pod.pod.affinity:
        cached = pod.derived[NAME] = NONE
    if cached is None:
        try:
            cached = parse(pod.pod.node_selector, pod.pod.affinity)
        except AffinityError as exc:
            cached = exc
        pod.derived[NAME] = cached
    return cached  # type: ignore[no-any-return]


@dataclass(frozen=True)
class NodeAffinityArgs:
    """`addedAffinity`: node affinity every pod of the profile must also satisfy."""

    added_affinity: Mapping[str, Any] | None = None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> NodeAffinityArgs:
        reject_unknown(raw, {"addedAffinity"})
        return cls(added_affinity=raw.get("addedAffinity"))

    def validate(self) -> None:
        if self.added_affinity is not None:
            try:
                parse({}, {"nodeAffinity": self.added_affinity})
            except AffinityError as exc:
                raise ArgsError("addedAffinity", self.added_affinity, str(exc)) from exc


class NodeAffinity:
    NAME: ClassVar[str] = NAME
    DYNAMIC: ClassVar[bool] = False
    NORMALIZES: ClassVar[bool] = True
    EVENTS: ClassVar[ClusterEvent] = ClusterEvent.NODE_ADDED | ClusterEvent.NODE_CHANGED

    def __init__(self, args: NodeAffinityArgs | None = None) -> None:
        added = (args or NodeAffinityArgs()).added_affinity
        self.added = parse({}, {"nodeAffinity": added}) if added else None

    def sign(self, pod: PodInfo) -> Hashable:
        parsed = _parsed(pod)
        return UNSIGNABLE if isinstance(parsed, AffinityError) else parsed

    def pre_filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Status:
        parsed = _parsed(pod)
        if isinstance(parsed, AffinityError):
            return status.unresolvable(NAME, f"malformed affinity: {parsed}")
        if parsed.selector == () and parsed.required is None and self.added is None:
            return status.SKIP
        mask = np.ones(state.size, dtype=bool)
        for key, value in parsed.selector:
            mask &= state.label_column(key).matches((value,))
        for required in (parsed.required, self.added.required if self.added else None):
            if required is not None:
                any_term = np.zeros(state.size, dtype=bool)
                for term in required:
                    any_term |= _term_mask(term, state)
                mask &= any_term
        cycle.write(NAME, mask)
        return status.SUCCESS

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Mask:
        mask: Mask = cycle.read(NAME)
        return mask[rows]  # type: ignore[no-any-return]

    def explain(self, cycle: CycleState, pod: PodInfo, state: ClusterState, failed: Mask) -> dict[str, int]:
        return {REASON: int(failed.sum())}

    def pre_score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Mask) -> Status:
        parsed = _parsed(pod)
        if isinstance(parsed, AffinityError) or not parsed.preferred:
            return status.SKIP
        total = np.zeros(state.size, dtype=np.int64)
        for weight, term in parsed.preferred:
            total += weight * _term_mask(term, state)
        cycle.write(NAME + "/score", total)
        return status.SUCCESS

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Scores:
        total: Scores = cycle.read(NAME + "/score")
        return total[rows]  # type: ignore[no-any-return]

    def normalize(self, cycle: CycleState, raw: Scores, feasible: Mask) -> Scores:
        return normalize(raw, feasible)
