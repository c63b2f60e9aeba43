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
    """Raise ArgsError for the first field of `raw` not in `known` (under `prefix`)."""
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ArgsError(f"{prefix}{unknown[0]}", raw[unknown[0]], "unknown field")
