"""Apache Kafka with a secured client listener (`KafkaBroker(security=...)`): a worker that logs
in with SCRAM-SHA-512 over TLS schedules pods end to end, its password read from a file; a
wrong password and an untrusted certificate are refused with messages that name the settings
and hold no secret; no log of the worker or the broker holds the password; a SASL_PLAINTEXT
listener serves the producer API and the readers. One SASL_SSL broker and one worker for the
module, a SASL_PLAINTEXT broker for its own test."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from perf.checker import Placement, check
from perf.workload import make_nodes, make_pods
from schemas import topics
from schemas.records import Binding, NodeStateChange
from streams.connection import KafkaAccessRefused, connect
from streams.connection import check as check_login
from streams.kafka_broker import KafkaBroker, write_tls_files
from streams.process import spawn_tied, stop
from streams.reader import read_to_end
from streams.settings import load_settings
from streams.worker import prepare
from tests.integration.harness import PARTITIONS, Harness

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

USER = "scheduler"
PASSWORD = f"pw-{secrets.token_hex(12)}"  # distinctive, so that a log holding it is found
WRONG = f"wrong-{secrets.token_hex(12)}"
WORKER = [sys.executable, "-m", "cli.main", "worker"]


@pytest.fixture(scope="module")
async def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[KafkaBroker]:
    async with KafkaBroker(log_dir=tmp_path_factory.mktemp("kafka-sasl-ssl"), security="SASL_SSL",
                           users={USER: PASSWORD}) as broker:
        yield broker


@pytest.fixture(scope="module")
def worker_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("secured-worker") / "worker.log"


def worker_env(broker: KafkaBroker, password_file: Path) -> dict[str, str]:
    """A worker of `broker`, its password in a file; it logs everything (aiokafka's requests
    too, the SASL logins among them), so that a password in any line would be found."""
    return {**os.environ, **broker.client_env(USER), "KOORDSTREAM_KAFKA_SASL_PASSWORD": "",
            "KOORDSTREAM_KAFKA_SASL_PASSWORD_FILE": str(password_file),
            "KOORDSTREAM_KAFKA_PARTITIONS": str(PARTITIONS), "KOORDSTREAM_WORKER_LOGLEVEL": "debug"}


@pytest.fixture(scope="module")
async def secured_harness(secured: KafkaBroker, worker_log: Path) -> AsyncIterator[Harness]:
    """The topics, created by this process through the secured listener; a worker logged in
    with SCRAM over TLS, ready (its owners reported a probe node); a harness logged in too."""
    password_file = worker_log.parent / "kafka-password"
    password_file.touch(mode=0o600)
    password_file.write_text(PASSWORD + "\n")
    env = worker_env(secured, password_file)
    await prepare(load_settings(env=env))
    with open(worker_log, "wb") as out:
        proc = spawn_tied(WORKER, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        async with Harness(secured.connection(USER)) as h:
            probe = make_nodes(1, prefix="secured-probe")
            await h.publish(topics.NODES, probe)
            await h.wait_for(NodeStateChange, lambda r: r.node == probe[0].name, timeout=90)
            assert proc.poll() is None, worker_log.read_text()[-3000:]
            yield h
    finally:
        stop(proc, deadline_s=10)


async def test_a_worker_logged_in_with_scram_over_tls_schedules_pods(secured_harness: Harness) -> None:
    h = secured_harness
    nodes = make_nodes(4, prefix="sec", pods=20)
    pods = make_pods(40, prefix="sec", seed=3)
    await h.publish(topics.NODES, nodes)
    names = {n.name for n in nodes}
    await h.wait_for(NodeStateChange, lambda r: r.node in names, count=len(nodes))
    await h.publish(topics.PODS, pods)
    uids = {p.uid for p in pods}
    await h.wait_for(Binding, lambda b: b.uid in uids, count=len(pods))
    bindings = h.seen(Binding, lambda b: b.uid in uids)
    result = check(h.allocatable(), {p.uid: p.requests for p in pods},
                   [Placement(i, b.uid, b.node) for i, b in enumerate(bindings)])
    assert result.pods_bound == len(pods) and result.consistent, result.overcommitted


async def test_a_wrong_password_is_refused_with_a_clear_message_that_does_not_hold_it(
        secured: KafkaBroker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(KafkaAccessRefused) as refused:
        await check_login(secured.connection(USER, WRONG))
    message = str(refused.value)
    assert f"refused the login of kafka.sasl_username={USER!r} with SCRAM-SHA-512" in message
    assert "SaslAuthenticationFailed" in message and "kafka.sasl_password_file" in message
    assert WRONG not in message and WRONG not in repr(refused.value) and WRONG not in caplog.text

    # A worker given it stops before it starts anything, saying the same.
    env = {**os.environ, **secured.client_env(USER, WRONG), "KOORDSTREAM_KAFKA_PARTITIONS": str(PARTITIONS)}
    done = await asyncio.to_thread(subprocess.run, WORKER, env=env, capture_output=True, text=True, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert f"refused the login of kafka.sasl_username={USER!r}" in " ".join(output.split())
    assert WRONG not in output and PASSWORD not in output


async def test_an_untrusted_broker_certificate_is_refused_clearly(secured: KafkaBroker, tmp_path: Path) -> None:
    write_tls_files(tmp_path)  # another CA, which did not sign the broker's certificate
    settings = replace(secured.client_settings(USER), ssl_cafile=str(tmp_path / "ca.pem"))
    with pytest.raises(KafkaAccessRefused, match=r"is not trusted \(.+\): check kafka.ssl_cafile"):
        await check_login(connect(settings))


async def test_no_log_of_the_worker_or_the_broker_holds_the_password(
        secured_harness: Harness, secured: KafkaBroker, worker_log: Path) -> None:
    text = worker_log.read_text(errors="replace")
    # What is searched: the worker logged in (aiokafka says so at info) and ran its
    # transactional producers, every request logged.
    assert f"Authenticated as {USER} via SCRAM-SHA-512" in text
    assert "kafka.transactions=auto: one transaction per input partition" in text
    assert "Request to 127.0.0.1" in text
    for log in (worker_log, *secured.logs_dir.iterdir()):
        assert PASSWORD not in log.read_text(errors="replace"), log
    assert PASSWORD not in (secured.log_dir / "server.properties").read_text()


async def test_a_sasl_plaintext_listener_serves_the_producer_api_and_the_readers(tmp_path: Path) -> None:
    started = time.monotonic()
    async with KafkaBroker(log_dir=tmp_path / "kafka", security="SASL_PLAINTEXT", users={USER: PASSWORD}) as broker:
        kafka = broker.connection(USER)
        assert kafka.security_protocol == "SASL_PLAINTEXT" and kafka.ssl_context is None
        settings = load_settings(env={**broker.client_env(USER), "KOORDSTREAM_KAFKA_PARTITIONS": str(PARTITIONS)})
        await prepare(settings)
        async with Harness(kafka) as h:
            nodes = make_nodes(3, prefix="plain")
            await h.publish(topics.NODES, nodes)
        count, _ = await read_to_end(kafka, [topics.NODES], PARTITIONS)
        assert count == 3
        with pytest.raises(KafkaAccessRefused, match="refused the login"):
            await check_login(broker.connection(USER, WRONG))
    assert time.monotonic() - started < 60
