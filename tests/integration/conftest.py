"""One broker per test session (the embedded Tansu broker, and Kafka in a testcontainer when
a Docker engine is reachable), topics created once, and one worker process per broker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from schemas import topics
from schemas.records import NodeStateChange
from streams.broker import EmbeddedBroker, wait_ready
from streams.process import spawn_tied, stop
from streams.settings import load_settings
from streams.worker import prepare
from tests.builders import make_node
from tests.integration.harness import PARTITIONS, Harness


def docker_reachable() -> bool:
    """A Docker engine answers on DOCKER_HOST (unix or tcp), or on the default socket."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if host.startswith("unix://"):
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(1.0)
                s.connect(host[len("unix://"):])
        else:
            address = host.split("://", 1)[-1].rsplit(":", 1)
            socket.create_connection((address[0], int(address[1]) if len(address) > 1 else 2375), 1.0).close()
        return True
    except (OSError, ValueError):
        return False


BROKERS = ["embedded"] + (["kafka-container"] if docker_reachable() else [])


@pytest.fixture(scope="session", params=BROKERS)
def bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "embedded":
        broker = EmbeddedBroker()
        broker.start()
        try:
            yield broker.bootstrap
        finally:
            broker.stop()
    else:
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            yield kafka.get_bootstrap_server()


def worker_env(bootstrap: str) -> dict[str, str]:
    return {**os.environ, "KOORDSTREAM_KAFKA_BOOTSTRAP": bootstrap, "KOORDSTREAM_KAFKA_PARTITIONS": str(PARTITIONS)}


@pytest.fixture(scope="session")
def metrics_port() -> int:
    """A free port for the session worker's Prometheus endpoint."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="session")
async def worker(bootstrap: str, metrics_port: int) -> AsyncIterator[subprocess.Popen[bytes]]:
    """The agents, in one worker process, ready: its owners have reported a probe node."""
    await wait_ready(bootstrap)
    settings = load_settings(env=worker_env(bootstrap))
    await prepare(settings)
    env = {**worker_env(bootstrap), "KOORDSTREAM_WORKER_METRICS_PORT": str(metrics_port)}
    proc = spawn_tied([sys.executable, "-m", "cli.main", "worker"], env=env)
    try:
        async with Harness(bootstrap) as h:
            probe = make_node(f"probe-{uuid.uuid4().hex[:6]}")
            await h.publish(topics.NODES, [probe])
            await h.wait_for(NodeStateChange, lambda r: r.node == probe.name, timeout=120)
        yield proc
    finally:
        stop(proc, deadline_s=10)


@pytest.fixture
async def harness(bootstrap: str, worker: subprocess.Popen[bytes]) -> AsyncIterator[Harness]:
    assert worker.poll() is None, "the worker process died"
    async with Harness(bootstrap) as h:
        yield h


@pytest.fixture
def run_id() -> str:
    return uuid.uuid4().hex[:8]
