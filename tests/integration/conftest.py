"""One broker of each kind per test session, topics created once, and one worker process per
broker.

The kinds (`bootstrap`'s parameters): the embedded Tansu broker for every test; Apache Kafka
(`KafkaBroker`, one single-node KRaft JVM for the session, also given alone by the
`kafka_bootstrap` fixture) for the modules in KAFKA_MODULES and those marked
`pytest.mark.kafka`, the broker-protocol tests that matter most (running every module on both
would double the suite's time); and Kafka in a testcontainer when a Docker engine is
reachable. The other modules' Kafka variants are deselected. pytest groups the tests by
broker, so each broker and its worker start once.

A test that starts brokers of its own (crashes, broker restarts) takes `broker_factory`: it
is parametrized the same way and makes unstarted brokers of its kind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from schemas import topics
from schemas.records import NodeStateChange
from streams.broker import EmbeddedBroker, wait_ready
from streams.kafka_broker import KafkaBroker
from streams.kube_cluster import ControlPlane
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


BROKERS = ["embedded", "kafka"] + (["kafka-container"] if docker_reachable() else [])
# Modules whose broker-using tests also run on Apache Kafka (others opt in with pytest.mark.kafka).
KAFKA_MODULES = {"test_end_to_end", "test_restart", "test_bad_input", "test_cli", "test_outbox", "test_devices",
                 "test_gangs", "test_preemption", "test_reservations", "test_shutdown"}
# Kafka variants that cannot pass there, and why.
NOT_ON_KAFKA = {
    "test_bad_input.py::test_every_agent_dead_letters_garbage_and_keeps_going[kafka-nodes]":
        "sends a record without a key to the compacted nodes topic, which Apache Kafka refuses",
}
# Variants that run on one broker only, to keep `make test` within its 10 minutes: what they
# prove is faust's or the worker's doing, not the broker's, and the other variant proves it.
ONE_BROKER = {
    "test_restart.py::test_a_waiting_gang_times_out_after_its_partition_moves_to_a_running_worker[embedded]":
        "faust's recovery events (timers re-armed on a running worker); 40 s, the Kafka variant runs",
    "test_shutdown.py::test_a_worker_keeps_its_data_out_of_the_directory_it_started_from[kafka]":
        "where faust's data folder goes; the embedded variant runs",
}
# Variants that run in `make e2e` (CI runs it after `make test`), not in `make test`, to keep
# `make test` within its 10 minutes: the longest crash and takeover runs, whose other variant
# or a shorter sibling runs in `make test`.
E2E_ONLY = {
    "test_restart.py::test_a_waiting_gang_times_out_after_its_partition_moves_to_a_running_worker[kafka]":
        "42 s; the embedded variant is in ONE_BROKER",
    "test_restart.py::test_replacement_worker_recovers_committed_capacity[kafka]": "32 s",
    "test_restart.py::test_replacement_worker_recovers_committed_capacity[embedded]":
        "26 s; test_transactions.py's state worker killed mid-run and test_restore.py recover state in make test",
    "test_transactions.py::test_partitions_of_a_killed_state_worker_taken_over_by_a_running_one_lose_nothing":
        "40 s; test_a_state_worker_killed_mid_run_loses_nothing_and_duplicates_nothing runs",
    "test_sandbox_crash.py::test_a_state_worker_killed_mid_burst_answers_every_claim_once_and_refills_the_pool[kafka]":
        "25 s (transactions)",
    "test_sandbox_crash.py::test_a_state_worker_killed_mid_burst_answers_every_claim_once_and_refills_the_pool"
    "[embedded]": "29 s (recorded outputs re-sent); the pools' replays are driven in tests/unit/sandbox",
    "test_restart.py::test_pending_pods_survive_a_scheduler_restart[kafka]": "26 s",
    "test_restart.py::test_pending_pods_survive_a_scheduler_restart[embedded]":
        "28 s; test_a_restarted_scheduler_knows_the_running_pods_after_their_reports_expired restarts the scheduler",
    "test_cli.py::test_sandbox_claim_prints_the_sandbox_or_the_refusal_and_pools_lists_the_pools[kafka]":
        "31 s; the embedded variant runs",
    "test_gangs.py::test_a_partial_gang_is_released_when_its_waiting_time_runs_out[embedded]":
        "21 s; the Kafka variant runs, and tests/unit/test_gangs.py times gangs out in the deciders' core",
    "test_bridge_sandbox.py::test_the_bridge_killed_while_a_pool_fills_loses_no_sandbox_and_makes_none_twice"
    "[embedded]": "13 s; test_bridge_adversary.py kills a leading bridge mid-run in make test",
}
KAFKA_KINDS = {"kafka", "kafka-container"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kafka: runs on Apache Kafka too (the kafka variants of `bootstrap` and `broker_factory`), "
                   "or needs it (`make kafka`)")


def runs_on_kafka(item: pytest.Item) -> bool:
    module = item.module.__name__.rsplit(".", 1)[-1] if isinstance(item, pytest.Function) else ""
    if f"{module}.py::{item.name}" in NOT_ON_KAFKA:
        return False
    return module in KAFKA_MODULES or item.get_closest_marker("kafka") is not None


def node_name(item: pytest.Item) -> str:
    return f"{item.module.__name__.rsplit('.', 1)[-1]}.py::{item.name}" if isinstance(item, pytest.Function) else ""


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the Kafka variants of the modules that run on the embedded broker only, and
    the variants of `ONE_BROKER`; mark those of `E2E_ONLY` e2e."""
    for item in items:
        if node_name(item) in E2E_ONLY:
            item.add_marker(pytest.mark.e2e)
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        kinds = {callspec.params.get(name) for name in ("bootstrap", "broker_factory")} if callspec else set()
        one_broker = node_name(item) in ONE_BROKER
        (dropped if one_broker or (kinds & KAFKA_KINDS and not runs_on_kafka(item)) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
async def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """Apache Kafka, one single-node KRaft broker for the session, ready; its log in a temp dir."""
    broker = KafkaBroker(log_dir=tmp_path_factory.mktemp("kafka"))
    broker.start()
    try:
        await broker.ready()
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session", params=BROKERS)
def bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "embedded":
        broker = EmbeddedBroker()
        broker.start()
        try:
            yield broker.bootstrap
        finally:
            broker.stop()
    elif request.param == "kafka":
        yield request.getfixturevalue("kafka_bootstrap")
    else:
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            yield kafka.get_bootstrap_server()


@pytest.fixture(params=["embedded", "kafka"])
def broker_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], EmbeddedBroker | KafkaBroker]:
    """Makes unstarted brokers of this test's kind (`async with broker_factory() as broker:`);
    a Kafka broker's log goes in the test's tmp_path, kept across its kill() and restart()."""
    made = 0

    def make() -> EmbeddedBroker | KafkaBroker:
        nonlocal made
        made += 1
        return EmbeddedBroker() if request.param == "embedded" else KafkaBroker(log_dir=tmp_path / f"kafka-{made}")

    return make


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


# -- the Kubernetes control plane and the bridge (tests/integration/test_bridge.py) --------------

BRIDGE_ENV = {  # short enough for tests: takeovers within seconds, a refused eviction reported after 3 s
    "KOORDSTREAM_BRIDGE_EVICTION_RETRY_S": "3", "KOORDSTREAM_BRIDGE_LEASE_DURATION_S": "4",
    "KOORDSTREAM_BRIDGE_RENEW_DEADLINE_S": "3", "KOORDSTREAM_BRIDGE_RETRY_S": "0.5",
    "KOORDSTREAM_WORKER_LOGLEVEL": "info",
}


RBAC = Path(__file__).resolve().parents[2] / "infra" / "k8s" / "rbac.yaml"


@pytest.fixture(scope="session")
async def control_plane(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ControlPlane]:
    """etcd, kube-apiserver and Kwok (`make k8s`), one for the session, with RBAC authorization
    and the bridge's least-privilege manifests (infra/k8s/rbac.yaml) applied: the bridge runs
    as its service account (`bridge_kubeconfig`), the tests as the admin."""
    async with ControlPlane(tmp_path_factory.mktemp("k8s"), rbac=True) as cp:
        await cp.apply_file(RBAC)
        yield cp


@pytest.fixture(scope="session")
async def bridge_kubeconfig(control_plane: ControlPlane) -> Path:
    return await control_plane.service_account_kubeconfig("koordstream-system", "koordstream-bridge",
                                                          control_plane.folder / "bridge.kubeconfig")


class BridgeProcess:
    """A `koordstream worker --roles bridge` against the control plane, which a test may kill
    (-9) and start again; its log in the session's temporary folder."""

    def __init__(self, bootstrap: str, kubeconfig: Path, log: Path, **env: str) -> None:
        self.env = {**worker_env(bootstrap), **BRIDGE_ENV, "KOORDSTREAM_BRIDGE_KUBECONFIG": str(kubeconfig), **env}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = spawn_tied([sys.executable, "-m", "cli.main", "worker", "--roles", "bridge"], env=self.env,
                                   stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, deadline_s=10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture(scope="session")
async def bridge(bootstrap: str, worker: subprocess.Popen[bytes], bridge_kubeconfig: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[BridgeProcess]:
    """The bridge, as its service account (RBAC: infra/k8s/rbac.yaml)."""
    process = BridgeProcess(bootstrap, bridge_kubeconfig, tmp_path_factory.mktemp("bridge") / "bridge.log")
    process.start()
    try:
        yield process
    finally:
        process.stop()
