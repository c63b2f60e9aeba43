"""What every plugin's args share: the validation error, the unknown-field check, and the
empty args type."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas.errors import FieldError


class ArgsError(FieldError):
    """A plugin arg is wrong: names the field and the value."""


@dataclass(frozen=True)
class NoArgs:
    """For plugins that take no args."""

    def validate(self) -> None:
        return None


def reject_unknown(raw: Mapping[str, Any], known: Iterable[str], prefix: str = "") -> None:
    """Raise ArgsError when `raw` is not a mapping with string field names, or for its first
    field not in `known` (under `prefix`)."""
    if not isinstance(raw, Mapping):
        raise ArgsError(prefix.rstrip(".") or "args", raw, "must be a mapping of field names to values")
    for key in raw:
        if not isinstance(key, str):
            raise ArgsError(f"{prefix}{key}", raw[key], "a field name must be a string")
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ArgsError(f"{prefix}{unknown[0]}", raw[unknown[0]], "unknown field")
