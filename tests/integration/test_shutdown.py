"""Shutdown: SIGINT/SIGTERM stop the worker and the embedded broker within 10 s and leave no
process behind; when the parent is killed outright, its broker and worker die with it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streams.process import stop

pytestmark = pytest.mark.integration


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def start_up() -> tuple[subprocess.Popen[str], int, int]:
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "up"], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "KOORDSTREAM_KAFKA_BOOTSTRAP": ""})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"broker_pid=(\d+) worker_pid=(\d+)", line)
    assert match, f"unexpected first line from `koordstream up`: {line!r}"
    return proc, int(match.group(1)), int(match.group(2))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_everything_within_10s(sig: signal.Signals) -> None:
    proc, broker_pid, worker_pid = start_up()
    try:
        time.sleep(3)  # let the worker get going (connect, join)
        assert alive(broker_pid) and alive(worker_pid)
        started = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=10)
        assert time.monotonic() - started < 10
        assert wait_gone([broker_pid, worker_pid], 1.0) == []
    finally:
        stop(proc, 1)  # type: ignore[arg-type]


def test_killing_the_parent_outright_takes_broker_and_worker_with_it() -> None:
    proc, broker_pid, worker_pid = start_up()
    time.sleep(1)
    proc.kill()
    proc.wait()
    assert wait_gone([broker_pid, worker_pid], 5.0) == []


def test_worker_alone_exits_on_sigterm_within_10s(bootstrap: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "worker", "--bootstrap", bootstrap],
                            env={**os.environ, "KOORDSTREAM_KAFKA_APP_ID": "shutdown-probe"},  # own group
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(4)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert time.monotonic() - started < 10


@pytest.mark.e2e  # 14 s of housekeeping: in `make e2e`, to keep `make test` within its 10 minutes
def test_a_worker_keeps_its_data_out_of_the_directory_it_started_from(bootstrap: str, tmp_path: Path) -> None:
    """faust's data folder (`<group>-data`) goes into `worker.state_dir`, or a temporary folder
    removed on exit; it used to land in whatever directory the worker was started from."""
    start, state = tmp_path / "start", tmp_path / "state"
    start.mkdir()
    env = {**os.environ, "KOORDSTREAM_KAFKA_APP_ID": "datadir-probe"}
    for extra in ({"KOORDSTREAM_WORKER_STATE_DIR": str(state)}, {}):
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "worker", "--bootstrap", bootstrap],
                                cwd=start, env={**env, **extra}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            time.sleep(4)
        finally:
            stop(proc, 10)  # type: ignore[arg-type]
        assert list(start.iterdir()) == []
    assert [p.name for p in state.iterdir()] == ["datadir-probe-data"]
