"""The errors of the edge: a record that cannot be accepted (`SchemaError`), and a value a pod
or a configuration states that cannot be used (`FieldError`); both name the field and value."""

from __future__ import annotations

from typing import Any


class SchemaError(ValueError):
    """A field of an incoming record is missing, ill-typed or out of range.

    `field` is a dotted path into the record (``requests.cpu``, ``containers[0].name``) and
    `value` the offending value (truncated when printed), so an operator reading the
    dead-letter topic knows exactly what to fix.
    """

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        shown = repr(value)
        if len(shown) > 200:
            shown = shown[:200] + "..."
        super().__init__(f"{field}: {reason} (value: {shown})")

    def under(self, prefix: str) -> SchemaError:
        """The same error with its field path placed under `prefix`."""
        field = f"{prefix}.{self.field}" if self.field and not self.field.startswith("[") else f"{prefix}{self.field}"
        return SchemaError(field, self.value, self.reason)


class FieldError(ValueError):
    """A value that decodes but cannot be used (a share of 150 of one GPU, a malformed
    affinity, a quota with min above max): `field=value: reason`."""

    def __init__(self, field: str, value: Any, reason: str) -> None:
        super().__init__(f"{field}={value!r}: {reason}")
        self.field = field
        self.value = value
        self.reason = reason
