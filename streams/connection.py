"""The one rule from the settings to a Kafka client: `connect(settings.kafka)`.

It turns the kafka section into a `KafkaConnection` (`agents.adapters.connection`): the
bootstrap address, `kafka.security_protocol`, the SASL mechanism and login (the password read
from `kafka.sasl_password`, which the environment gives, or from `kafka.sasl_password_file`,
and kept a `Secret`), and for SSL and SASL_SSL a TLS context made by aiokafka's
`create_ssl_context` from `kafka.ssl_cafile` (or the system's trust store), the client
certificate and key (their passphrase handed over as a function, never a string in a
message) and `kafka.ssl_check_hostname`. Everything that talks to the broker takes that
connection: the workers' faust app (`faust_credentials`) and the adapters' own clients
(`streams.app`), topic creation, the producer API, the readers, the perf harness's collectors
and the `koordstream` commands.

`check(connection)` opens one connection to the broker and logs in the way the clients will,
so that a refused login or an untrusted certificate stops a worker or a command with a
message that names the setting to change, instead of aiokafka's "Unable to bootstrap" after
its retries. A broker not reachable yet is not its business (the clients wait for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    IllegalSaslStateError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.helpers import create_ssl_context

from agents.adapters.connection import KafkaConnection
from schemas.secret import Secret
from streams.settings import SYSTEM_CA, KafkaSettings, SettingsError

__all__ = ["KafkaAccessRefused", "KafkaConnection", "check", "child_env", "connect", "own_broker"]

# The kafka fields that say how a client logs in (all but `inline_secrets`, which only rules
# the settings file).
SECURITY_FIELDS = tuple(f.name for f in dataclasses.fields(KafkaSettings)
                        if f.name.startswith(("security_", "sasl_", "ssl_")))

REFUSED_LOGIN = (SaslAuthenticationFailed, AuthenticationFailedError, IllegalSaslStateError,
                 UnsupportedSaslMechanismError)


class KafkaAccessRefused(RuntimeError):
    """The broker refused this client's login or TLS handshake; the message names the
    settings to look at and never holds a secret."""


def connect(k: KafkaSettings) -> KafkaConnection:
    """The connection the kafka settings describe (validated already, by `load_settings`)."""
    sasl: dict[str, Any] = dict(sasl_mechanism=k.sasl_mechanism, sasl_username=k.sasl_username,
                                sasl_password=k.sasl_secret()) if k.uses_sasl else {}
    return KafkaConnection(k.bootstrap, k.security_protocol, ssl_context=tls_context(k) if k.uses_tls else None,
                           record_batches=k.record_batches, **sasl)


def child_env(k: KafkaSettings) -> dict[str, str]:
    """The `KOORDSTREAM_KAFKA_*` variables that give a child process (a worker that the perf
    harness or a test starts) the bootstrap and every security field of `k`, so that none it
    inherits from this process's environment disagrees. A password travels as the variable the
    settings read it from: an environment is how a process is given one, not a log."""
    env = {"KOORDSTREAM_KAFKA_BOOTSTRAP": k.bootstrap}
    for name in SECURITY_FIELDS:
        value = getattr(k, name)
        text = value.reveal() if isinstance(value, Secret) else str(value).lower() if isinstance(value, bool) \
            else str(value)
        env[f"KOORDSTREAM_KAFKA_{name.upper()}"] = text
    return env


def own_broker(k: KafkaSettings, bootstrap: str) -> KafkaSettings:
    """`k` for a broker this process started itself: at `bootstrap`, PLAINTEXT, no
    credentials (whatever the settings said about the user's broker)."""
    defaults = KafkaSettings()
    return dataclasses.replace(k, bootstrap=bootstrap, **{name: getattr(defaults, name) for name in SECURITY_FIELDS})


def tls_context(k: KafkaSettings) -> ssl.SSLContext:
    """The client's TLS context: the broker's CA (or the system's store), the client
    certificate if any, hostname checking as `kafka.ssl_check_hostname` says."""
    key_secret = k.ssl_key_secret()
    try:
        context: ssl.SSLContext = create_ssl_context(cafile=None if k.ssl_cafile == SYSTEM_CA else k.ssl_cafile,
                                     certfile=k.ssl_certfile or None, keyfile=k.ssl_keyfile or None,
                                     password=key_secret.reveal if key_secret is not None else None)
    except (ssl.SSLError, OSError) as exc:
        fields = ", ".join(f"kafka.{name}={getattr(k, name)!r}" for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
                           if getattr(k, name))
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or type(exc).__name__
        raise SettingsError(f"{fields}: cannot load the TLS files ({reason}); a client key's passphrase comes "
                            "from kafka.ssl_key_password_file or KOORDSTREAM_KAFKA_SSL_KEY_PASSWORD") from None
    # aiokafka turns hostname checking on; a broker reached by an address its certificate
    # does not name is still verified against the CA when it is off.
    context.check_hostname = k.ssl_check_hostname
    return context


def _hosts(bootstrap: str) -> list[tuple[str, int]]:
    hosts = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        if host and port.isdigit():
            hosts.append((host.strip("[]"), int(port)))
    return hosts


async def check(kafka: KafkaConnection | str, timeout_s: float = 10.0) -> None:
    """Log in to the first broker of the bootstrap list that answers, as the clients will;
    raise KafkaAccessRefused when the broker refuses the login or the TLS handshake fails.
    Nothing to check for PLAINTEXT; a broker that does not answer is left to the clients."""
    conn = KafkaConnection.of(kafka)
    if conn.security_protocol == "PLAINTEXT":
        return
    for host, port in _hosts(conn.bootstrap):
        try:
            client = await asyncio.wait_for(
                create_conn(host, port, request_timeout_ms=int(timeout_s * 1000), **conn.security_options()),
                timeout_s)
        except REFUSED_LOGIN as exc:
            raise KafkaAccessRefused(
                f"the broker at {host}:{port} refused the login of kafka.sasl_username={conn.sasl_username!r} "
                f"with {conn.sasl_mechanism} ({type(exc).__name__}: {exc}): check the password "
                "(kafka.sasl_password_file, or KOORDSTREAM_KAFKA_SASL_PASSWORD), the user name and "
                "kafka.sasl_mechanism") from None
        except ssl.SSLCertVerificationError as exc:
            raise KafkaAccessRefused(
                f"the certificate of the broker at {host}:{port} is not trusted ({exc.verify_message}): check "
                "kafka.ssl_cafile (the CA that signed it), and kafka.ssl_check_hostname when the certificate "
                "names another host") from None
        except ssl.SSLError as exc:
            raise KafkaAccessRefused(
                f"the TLS handshake with the broker at {host}:{port} failed ({exc.reason or exc}): does the "
                f"listener speak kafka.security_protocol={conn.security_protocol}?") from None
        except (OSError, TimeoutError, KafkaError):
            continue  # not reachable (yet): the clients retry on their own
        with contextlib.suppress(Exception):
            client.close()
        return
