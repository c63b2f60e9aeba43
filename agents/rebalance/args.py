"""What the rebalancer's args share: checked numbers, flags, durations and resource lists,
each refused with an `ArgsError` that names the field and the value."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from agents.scheduler.plugins.args import ArgsError
from schemas.quantity import parse_duration

DEFAULT_OBJECTIVE = ("cpu", "memory")


def duration_s(raw: Any, path: str) -> float:
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
    if not math.isfinite(value) or value < 0:
        raise ArgsError(path, raw, "must be a finite duration >= 0")
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
    if (not isinstance(raw, list) or not raw or not all(isinstance(r, str) and r for r in raw)
            or len(set(raw)) != len(raw)):
        raise ArgsError(path, raw, "must be a non-empty list of distinct resource names")
    return tuple(raw)
