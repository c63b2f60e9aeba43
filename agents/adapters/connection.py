"""How a Kafka client reaches the broker: the address and the security, in one value.

A `KafkaConnection` holds the bootstrap address, the security protocol (PLAINTEXT, SSL,
SASL_PLAINTEXT, SASL_SSL), the SASL mechanism and login (the password a
`schemas.secret.Secret`) and the TLS context. Every Kafka client of koordstream is made from
one: aiokafka consumers, producers and admin clients by `consumer()`, `producer()` and
`admin()`, which add the client's own options to `options()`; faust's app by
`faust_credentials()` (faust hands them to every aiokafka client it makes: its consumer, its
producer, its transactional producers). The password is revealed only into those arguments;
the connection's repr shows `***`.

aiokafka logs every request it sends at DEBUG, the SASL login's too: with PLAIN its bytes are
the password. A SASL connection therefore puts a filter on aiokafka's connection logger that
shows those requests without their bytes (`hide_sasl_tokens`).

`streams.connection.connect` builds the connection from the settings (the one rule from
`kafka.*` to a client); the adapters receive it from `streams.app`. A bare `host:port` string
where a connection is expected (`KafkaConnection.of`) is a PLAINTEXT connection, as tests and
the embedded broker use.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass, field
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from faust.types.auth import CredentialsT

from schemas.secret import Secret

AIOKAFKA_CONN_LOGGER = "aiokafka.conn"


SASL_AUTHENTICATE = 36  # the Kafka API key of SaslAuthenticate, whose request carries the login's bytes


def _sasl_login(arg: object) -> bool:
    return getattr(arg, "API_KEY", None) == SASL_AUTHENTICATE and hasattr(arg, "sasl_auth_bytes")


class _SaslTokensHidden(logging.Filter):
    """Shows a SASL authentication request among a record's arguments by its name only."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(_sasl_login(a) for a in args):
            record.args = tuple(f"<{type(a).__name__}: hidden>" if _sasl_login(a) else a for a in args)
        return True


def hide_sasl_tokens() -> None:
    """Put the filter on aiokafka's connection logger (once)."""
    logger = logging.getLogger(AIOKAFKA_CONN_LOGGER)
    if not any(isinstance(f, _SaslTokensHidden) for f in logger.filters):
        logger.addFilter(_SaslTokensHidden())


@dataclass(frozen=True)
class KafkaConnection:
    bootstrap: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: Secret = field(default_factory=Secret)
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False)
    record_batches: bool = True  # kafka.record_batches: what this connection's producers write

    @classmethod
    def of(cls, kafka: KafkaConnection | str) -> KafkaConnection:
        """`kafka` itself, or a PLAINTEXT connection to the address it is."""
        return kafka if isinstance(kafka, KafkaConnection) else cls(kafka)

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def security_options(self) -> dict[str, Any]:
        """aiokafka's security arguments (those of `aiokafka.conn.create_conn` too)."""
        options: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.ssl_context is not None:
            options["ssl_context"] = self.ssl_context
        if self.uses_sasl:
            hide_sasl_tokens()
            options.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username,
                           sasl_plain_password=self.sasl_password.reveal())
        return options

    def options(self) -> dict[str, Any]:
        """The arguments every aiokafka client gets: the address and the security."""
        return {"bootstrap_servers": self.bootstrap, **self.security_options()}

    def consumer(self, **options: Any) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(**self.options(), **options)

    def producer(self, **options: Any) -> AIOKafkaProducer:
        return AIOKafkaProducer(**self.options(), **options)

    def admin(self, **options: Any) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(**self.options(), **options)

    def faust_credentials(self) -> CredentialsT | None:
        """faust's `broker_credentials`: SASL (over TLS when there is a TLS context), TLS
        alone, or None for PLAINTEXT. faust turns them into the same aiokafka arguments as
        `security_options` (faust.transport.drivers.aiokafka.credentials_to_aiokafka_auth)."""
        if self.uses_sasl:
            hide_sasl_tokens()
            return faust.SASLCredentials(username=self.sasl_username, password=self.sasl_password.reveal(),
                                         ssl_context=self.ssl_context, mechanism=self.sasl_mechanism)
        if self.ssl_context is not None:
            return faust.SSLCredentials(self.ssl_context)
        return None

    def describe(self) -> str:
        """The address and how it is reached, for messages (never the password)."""
        if self.uses_sasl:
            return f"{self.bootstrap} ({self.security_protocol}, {self.sasl_mechanism} as {self.sasl_username!r})"
        return f"{self.bootstrap} ({self.security_protocol})"
