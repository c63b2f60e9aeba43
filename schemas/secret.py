"""A value that must never be printed: a password or a key's passphrase.

`Secret` holds a string and gives it out only through `reveal()`. Its repr, str and format
show `***` (an empty secret shows as empty), so a settings object that holds one can be
logged, dumped, compared or put in an exception message without the value leaving the
process. The settings carry the Kafka credentials as secrets (`streams.settings`), and the
one place that turns them into client arguments reveals them there and nowhere else
(`streams.connection`).
"""

from __future__ import annotations

import hmac

MASK = "***"


class Secret:
    __slots__ = ("_value",)

    def __init__(self, value: str = "") -> None:
        self._value = str(value)

    def reveal(self) -> str:
        """The value itself: hand it to the client that needs it, never to a log or a message."""
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __repr__(self) -> str:
        return f"Secret({MASK!r})" if self._value else "Secret('')"

    def __str__(self) -> str:
        return MASK if self._value else ""

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __reduce__(self) -> tuple[type[Secret], tuple[str]]:
        # Pickling keeps the value (a settings object handed to a child process still works);
        # pickled bytes are not a log.
        return Secret, (self._value,)
