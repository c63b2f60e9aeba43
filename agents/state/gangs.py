"""Gangs as Koordinator declares them, read from a pod's annotations (or the PodGroup label).

`gang.scheduling.koordinator.sh/name` (or `pod-group.scheduling.sigs.k8s.io`) names the gang,
`.../min-available` how many members must be held before any is bound, `.../total-number`
how many members it has, `.../waiting-time` how long held members wait for the rest (a Go
duration such as `600s` or `10m`; default 600 s), `.../mode` Strict (default: one member's
failure releases the whole gang, which retries together) or NonStrict.

`gang_spec(annotations)` validates them and raises `GangError` naming the annotation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from schemas.errors import FieldError
from schemas.quantity import parse_duration
from schemas.records import (
    GANG_DEFAULT_WAITING_S,
    GANG_MIN_AVAILABLE_ANNOTATION,
    GANG_MODE_ANNOTATION,
    GANG_WAITING_TIME_ANNOTATION,
)

GANG_TOTAL_ANNOTATION = "gang.scheduling.koordinator.sh/total-number"
STRICT, NON_STRICT = "Strict", "NonStrict"


class GangError(FieldError):
    """Gang annotations that cannot be valid."""


@dataclass(frozen=True, slots=True)
class GangSpec:
    min_available: int  # 0: not a gang
    waiting_s: float = GANG_DEFAULT_WAITING_S
    strict: bool = True


NO_GANG = GangSpec(0)

Rank = tuple[int, str]


def rank(priority: int, key: str) -> Rank:
    """A gang's place in wound-wait (DESIGN.md, rule 6): smaller wins. One rank per gang,
    that every owner and scheduler replica computes the same from what they all see: higher
    priority first, then the gang's decision key (namespace/name). Never a member's own
    creation time: members of one gang are created at different times, and two gangs ranked
    by whichever member claims could each be told to yield to the other. The PodGroup's
    creation time would come between the two; there is no PodGroup record yet."""
    return (-priority, key)


def gang_spec(annotations: Mapping[str, str]) -> GangSpec:
    raw_min = annotations.get(GANG_MIN_AVAILABLE_ANNOTATION, "")
    if not raw_min:
        return NO_GANG
    field = f"metadata.annotations.{GANG_MIN_AVAILABLE_ANNOTATION}"
    if not raw_min.isdigit() or int(raw_min) < 1:
        raise GangError(field, raw_min, "must be a positive integer")
    minimum = int(raw_min)
    total = annotations.get(GANG_TOTAL_ANNOTATION, "")
    if total:
        if not total.isdigit():
            raise GangError(f"metadata.annotations.{GANG_TOTAL_ANNOTATION}", total, "must be a positive integer")
        if minimum > int(total):
            raise GangError(field, raw_min, f"exceeds the gang's total-number ({total})")
    waiting = annotations.get(GANG_WAITING_TIME_ANNOTATION, "")
    try:
        waiting_s = parse_duration(waiting) if waiting else GANG_DEFAULT_WAITING_S
    except ValueError:
        raise GangError(f"metadata.annotations.{GANG_WAITING_TIME_ANNOTATION}", waiting,
                        "must be a duration such as 600s or 10m") from None
    if waiting_s <= 0:
        raise GangError(f"metadata.annotations.{GANG_WAITING_TIME_ANNOTATION}", waiting, "must be positive")
    mode = annotations.get(GANG_MODE_ANNOTATION, STRICT)
    if mode not in (STRICT, NON_STRICT):
        raise GangError(f"metadata.annotations.{GANG_MODE_ANNOTATION}", mode, f"must be {STRICT} or {NON_STRICT}")
    return GangSpec(minimum, waiting_s, mode == STRICT)
