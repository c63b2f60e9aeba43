"""What the rebalancer's args share: checked numbers, flags, durations and resource lists,
each refused with an `ArgsError` that names the field and the value."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from agents.scheduler.plugins.args import ArgsError
from schemas.quantity import parse_duration

DEFAULT_OBJECTIVE = ("cpu", "memory")
INT32_MAX = 2**31 - 1
LONGEST_S = 30 * 86400.0  # a duration past this is a typo, not a setting
JOB_TTL_S = 300.0  # a migration job's ttl, and its reservation's (Koordinator's default, 5 min)
_RESOURCE_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def absent(value: Any, default: Any) -> Any:
    """`value`, or `default` when the field is left out (None): a present value of the wrong
    type (`[]` for a mapping, `false` for a list) is the caller's to refuse, never a default."""
    return default if value is None else value


def integer(raw: Mapping[str, Any], name: str, path: str, default: int | None, low: int, high: int = INT32_MAX) -> int | None:
    """An integer field within [low, high] (Kubernetes' int32 by default), or `default`."""
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ArgsError(f"{path}{name}", value, f"must be an integer from {low} to {high}")
    return value


def duration_s(raw: Any, path: str, longest: float = LONGEST_S) -> float:
    """Seconds from a number or a Go duration ("90s", "5m", "1h30m")."""
    if isinstance(raw, bool):
        raise ArgsError(path, raw, "must be a duration (\"5m\") or seconds")
    if isinstance(raw, int | float):
        value = float(raw)
    else:
        try:
            value = parse_duration(raw) if isinstance(raw, str) else math.nan
        except ValueError:
            value = math.nan
        if math.isnan(value):
            raise ArgsError(path, raw, "must be a duration (\"5m\", \"1h30m\") or seconds")
    if not math.isfinite(value) or not 0 <= value <= longest:
        raise ArgsError(path, raw, f"must be a duration from 0 to {longest / 86400:g} days")
    return value


def fraction(raw: Mapping[str, Any], name: str, default: float, path: str) -> float:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value < 1:
        raise ArgsError(f"{path}{name}", value, "must be a number from 0 up to (not including) 1")
    return float(value)


def flag(raw: Mapping[str, Any], name: str, default: bool, path: str) -> bool:
    value = raw.get(name, default)
    if not isinstance(value, bool):
        raise ArgsError(f"{path}{name}", value, "must be true or false")
    return value


def resources_from(raw: Any, path: str, default: tuple[str, ...] = DEFAULT_OBJECTIVE) -> tuple[str, ...]:
    if raw is None:
        return default
    if not isinstance(raw, list) or not raw or len(set(map(str, raw))) != len(raw):
        raise ArgsError(path, raw, "must be a non-empty list of distinct resource names")
    for i, name in enumerate(raw):
        if not isinstance(name, str) or not _RESOURCE_NAME.fullmatch(name):
            raise ArgsError(f"{path}[{i}]", name, "not a resource name (such as cpu, memory, nvidia.com/gpu)")
    return tuple(raw)
