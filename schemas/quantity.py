"""Kubernetes resource quantities ("500m", "2Gi", "1.5", "1e3") to canonical integers, and Go
durations ("1h30m") to seconds.

Canonical units, used everywhere inside koordstream: CPU in millicores, everything else in
whole base units (bytes for memory and storage, devices as counts). Values are rounded up,
as Kubernetes does when it converts a quantity to milli-units. Negative and absurdly large
values are errors, never zeros.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

from schemas.errors import SchemaError

MILLI_RESOURCES = frozenset({"cpu"})
MAX_CANONICAL = 2**62

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")


MAX_QUANTITY_CHARS = 64  # far beyond any real quantity; keeps Decimal and int() from huge inputs


def parse_quantity(value: object, field: str) -> Decimal:
    """Parse a Kubernetes quantity into an exact decimal number of base units."""
    if isinstance(value, bool):
        raise SchemaError(field, value, "a quantity must be a string or a number")
    if isinstance(value, int):
        number = Decimal(value)
    elif isinstance(value, float):
        number = Decimal(repr(value))
    elif isinstance(value, str):
        if len(value) > MAX_QUANTITY_CHARS:
            raise SchemaError(field, value, f"a quantity is at most {MAX_QUANTITY_CHARS} characters")
        match = _QUANTITY.match(value.strip())
        if match is None:
            raise SchemaError(field, value, "not a Kubernetes quantity (e.g. '500m', '2Gi', '1.5')")
        digits, suffix = match.group(1), match.group(2) or ""
        try:
            number = Decimal(digits)
        except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
            raise SchemaError(field, value, "not a number") from exc
        if suffix in _BINARY:
            number *= _BINARY[suffix]
        elif suffix[:1] in ("e", "E"):
            exponent = int(suffix[1:])
            if abs(exponent) > 30:
                raise SchemaError(field, value, "exponent out of range")
            number = number.scaleb(exponent)
        else:
            number *= _DECIMAL[suffix]
    else:
        raise SchemaError(field, value, "a quantity must be a string or a number")
    if not number.is_finite():
        raise SchemaError(field, value, "a quantity must be finite")
    if number < 0:
        raise SchemaError(field, value, "a quantity must not be negative")
    return number


def to_canonical(resource: str, value: object, field: str) -> int:
    """A quantity of `resource` in canonical units (millicores for cpu, base units otherwise)."""
    number = parse_quantity(value, field)
    if resource in MILLI_RESOURCES:
        number *= 1000
    canonical = int(number.to_integral_value(rounding=ROUND_CEILING))
    if canonical > MAX_CANONICAL:
        raise SchemaError(field, value, "quantity is absurdly large")
    return canonical


def format_canonical(resource: str, amount: int) -> str:
    """The Kubernetes spelling of a canonical amount: '1500m' for cpu, '2147483648' otherwise."""
    if resource in MILLI_RESOURCES:
        return f"{amount // 1000}" if amount % 1000 == 0 else f"{amount}m"
    return str(amount)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str) -> float:
    """A Go duration (`600s`, `10m`, `1h30m`, `1.5h`) in seconds; raises ValueError."""
    pos, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text):
        raise ValueError(text)
    return total
