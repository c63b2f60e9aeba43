"""What every plugin's args share: the validation error and the empty args type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ArgsError(ValueError):
    """A plugin arg is wrong: names the field and the value."""

    def __init__(self, field: str, value: Any, reason: str) -> None:
        super().__init__(f"{field}={value!r}: {reason}")
        self.field = field
        self.value = value
        self.reason = reason


@dataclass(frozen=True)
class NoArgs:
    """For plugins that take no args."""

    def validate(self) -> None:
        return None
