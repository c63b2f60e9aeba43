"""What every plugin's args share: the validation error and the empty args type."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.errors import FieldError


class ArgsError(FieldError):
    """A plugin arg is wrong: names the field and the value."""


@dataclass(frozen=True)
class NoArgs:
    """For plugins that take no args."""

    def validate(self) -> None:
        return None
