"""The one rule from `kafka.*` to a client (`streams.connection.connect`): aiokafka's arguments and
faust's credentials for each security protocol, the TLS context, the environment a child
worker is given, and that no secret reaches a repr or a log. No broker: the clients are only
made (tests/integration/test_kafka_security.py logs in to a real one)."""

from __future__ import annotations

import ast
import datetime
import logging
import ssl
from dataclasses import replace
from pathlib import Path

import faust
import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from agents.adapters.connection import KafkaConnection, hide_sasl_tokens
from schemas.secret import Secret
from streams.connection import child_env, connect, own_broker
from streams.kafka_broker import write_tls_files
from streams.settings import KafkaSettings, SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cret-Pa55word"
PASSPHRASE = "key-Pa55phrase"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, and a client certificate with its key encrypted under PASSPHRASE."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = tmp_path_factory.mktemp("tls")
    write_tls_files(folder)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "client")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    (folder / "client.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "client.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(PASSPHRASE.encode())))
    (folder / "passphrase").write_text(PASSPHRASE + "\n")
    return folder


def sasl(protocol: str = "SASL_PLAINTEXT", **changes: object) -> KafkaSettings:
    k = KafkaSettings(bootstrap="b:9093", security_protocol=protocol, sasl_mechanism="SCRAM-SHA-512",
                      sasl_username="alice", sasl_password=Secret(PASSWORD))
    return replace(k, **changes)  # type: ignore[arg-type]


def test_plaintext_is_the_address_alone() -> None:
    conn = connect(KafkaSettings(bootstrap="b:9092"))
    assert conn == KafkaConnection("b:9092") == KafkaConnection.of("b:9092")
    assert conn.options() == {"bootstrap_servers": "b:9092", "security_protocol": "PLAINTEXT"}
    assert conn.faust_credentials() is None


def test_sasl_gives_aiokafka_the_login_and_faust_the_same_through_its_credentials() -> None:
    conn = connect(sasl())
    assert conn.options() == {"bootstrap_servers": "b:9093", "security_protocol": "SASL_PLAINTEXT",
                              "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "alice",
                              "sasl_plain_password": PASSWORD}
    credentials = conn.faust_credentials()
    assert isinstance(credentials, faust.SASLCredentials)
    # What faust hands its aiokafka clients is what ours get.
    assert dict(credentials_to_aiokafka_auth(credentials)) == {**conn.security_options(), "ssl_context": None}
    assert PASSWORD not in repr(conn) and PASSWORD not in repr(credentials)
    assert conn.describe() == "b:9093 (SASL_PLAINTEXT, SCRAM-SHA-512 as 'alice')"


def test_sasl_ssl_verifies_the_broker_against_the_ca_and_its_name(tls: Path) -> None:
    conn = connect(sasl("SASL_SSL", ssl_cafile=str(tls / "ca.pem")))
    context = conn.ssl_context
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert conn.options()["ssl_context"] is context and conn.options()["security_protocol"] == "SASL_SSL"
    credentials = conn.faust_credentials()
    assert dict(credentials_to_aiokafka_auth(credentials)) == conn.security_options()
    unchecked = connect(sasl("SASL_SSL", ssl_cafile=str(tls / "ca.pem"), ssl_check_hostname=False)).ssl_context
    assert unchecked is not None and not unchecked.check_hostname and unchecked.verify_mode == ssl.CERT_REQUIRED


def test_ssl_with_a_client_certificate_whose_key_is_encrypted(tls: Path) -> None:
    k = KafkaSettings(bootstrap="b:9094", security_protocol="SSL", ssl_cafile=str(tls / "ca.pem"),
                      ssl_certfile=str(tls / "client.pem"), ssl_keyfile=str(tls / "client.key"),
                      ssl_key_password_file=str(tls / "passphrase"))
    conn = connect(k)
    assert conn.security_options() == {"security_protocol": "SSL", "ssl_context": conn.ssl_context}
    assert isinstance(conn.faust_credentials(), faust.SSLCredentials)
    with pytest.raises(SettingsError, match="kafka.ssl_cafile=.*kafka.ssl_keyfile=.*cannot load the TLS files") as bad:
        connect(replace(k, ssl_key_password_file="", ssl_key_password=Secret("not-" + PASSPHRASE)))
    assert PASSPHRASE not in str(bad.value)


def test_the_system_trust_store(tls: Path) -> None:
    context = connect(KafkaSettings(bootstrap="b:9094", security_protocol="SSL", ssl_cafile="system")).ssl_context
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED


def test_a_child_worker_is_given_the_same_login_and_a_broker_of_our_own_none(tls: Path) -> None:
    k = sasl("SASL_SSL", ssl_cafile=str(tls / "ca.pem"), ssl_check_hostname=False)
    again = load_settings(env={**child_env(k), "KOORDSTREAM_KAFKA_PARTITIONS": "4"}).kafka
    assert again == k
    own = own_broker(k, "127.0.0.1:1")
    assert own == replace(KafkaSettings(), bootstrap="127.0.0.1:1")
    assert load_settings(env=child_env(own)).kafka == own


def test_the_app_gives_faust_the_credentials_and_no_log_or_repr_holds_the_password(
        tls: Path, caplog: pytest.LogCaptureFixture) -> None:
    from streams.app import build_app

    caplog.set_level(logging.DEBUG)
    settings = replace(load_settings(env={"KOORDSTREAM_WORKER_ROLES": "state"}),
                       kafka=sasl("SASL_SSL", ssl_cafile=str(tls / "ca.pem")))
    app = build_app(settings, transactions=True)
    credentials = app.conf.broker_credentials
    assert isinstance(credentials, faust.SASLCredentials) and credentials.username == "alice"
    assert app.tables.kafka.sasl_username == "alice"  # type: ignore[attr-defined]  # the restores' tails
    producer_auth = app.producer._settings_auth()
    assert producer_auth["sasl_plain_password"] == PASSWORD and producer_auth["security_protocol"] == "SASL_SSL"
    assert PASSWORD not in caplog.text
    assert PASSWORD not in repr(settings) and PASSWORD not in repr(app.conf.broker_credentials)


def test_aiokafka_debug_lines_of_a_sasl_login_do_not_show_its_bytes(caplog: pytest.LogCaptureFixture) -> None:
    from aiokafka.protocol.admin import SaslAuthenticateRequest_v1

    hide_sasl_tokens()
    caplog.set_level(logging.DEBUG)
    # What aiokafka logs for each request (aiokafka.conn.AIOKafkaConnection.send); PLAIN's bytes.
    request = SaslAuthenticateRequest_v1(f"\0alice\0alice\0{PASSWORD}".encode())
    logging.getLogger("aiokafka.conn").debug("Request to %s:%d %d: %s", "b", 9093, 3, request)
    assert "Request to b:9093 3: <SaslAuthenticateRequest_v1: hidden>" in caplog.text
    assert PASSWORD not in caplog.text


def test_every_kafka_client_is_made_by_the_connection() -> None:
    """One rule, one place: no module but `agents.adapters.connection` calls aiokafka's client
    constructors or names `bootstrap_servers`."""
    clients = {"AIOKafkaConsumer", "AIOKafkaProducer", "AIOKafkaAdminClient", "AIOKafkaClient"}
    found = []
    for package in ("schemas", "agents", "streams", "perf", "cli"):
        for path in (ROOT / package).rglob("*.py"):
            if path == ROOT / "agents" / "adapters" / "connection.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                    if name in clients or any(k.arg == "bootstrap_servers" for k in node.keywords):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


async def test_record_batches_reach_every_producer_of_the_connection() -> None:
    """`kafka.record_batches` (README, "Upgrading"): off while readers of schema 1.0 remain."""
    from streams.producer import RecordProducer

    on = connect(load_settings(env={}).kafka)
    off = connect(load_settings(env={"KOORDSTREAM_KAFKA_RECORD_BATCHES": "false"}).kafka)
    assert on.record_batches and not off.record_batches
    assert KafkaConnection.of("localhost:9092").record_batches  # a bare address: the default
    producers = [RecordProducer(on, 4), RecordProducer(off, 4)]  # never started: no broker needed
    assert [p.outbox.batched for p in producers] == [True, False]
    for p in producers:
        await p._producer.stop()
