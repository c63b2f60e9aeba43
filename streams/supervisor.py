"""`koordstream up`: embedded broker (unless a bootstrap is given), topics, one worker process.

The supervisor owns the children: both are tied to it (they die if it is killed outright), and
on SIGINT/SIGTERM it stops the worker (SIGTERM, then SIGKILL after the deadline) and then the
broker, so nothing is left behind. With `sandbox.pools` it publishes the warm pools of that
file (with their templates) once the topics exist, before the worker starts; a file that does
not convert stops it before anything starts, naming the field.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

from schemas import topics
from streams.broker import EmbeddedBroker, wait_ready
from streams.connection import child_env, connect, own_broker
from streams.process import spawn_tied, stop
from streams.publish import publish_file
from streams.settings import Settings
from streams.worker import prepare


def run_up(settings: Settings, config_path: str | None = None) -> int:
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    broker = None
    if not settings.kafka.bootstrap:  # the embedded broker, PLAINTEXT whatever the settings say
        broker = EmbeddedBroker()
        broker.start()
        settings = replace(settings, kafka=own_broker(settings.kafka, broker.bootstrap))
    bootstrap = settings.kafka.bootstrap
    worker = None
    try:
        asyncio.run(wait_ready(connect(settings.kafka)))
        asyncio.run(prepare(settings))
        try:
            pools = asyncio.run(publish_file(Path(settings.sandbox.pools), topics.SANDBOX, settings)) \
                if settings.sandbox.pools else 0
        except (OSError, ValueError) as exc:
            print(f"koordstream up: sandbox.pools: {exc}", file=sys.stderr, flush=True)
            return 2
        env = {**os.environ, **child_env(settings.kafka)}
        cmd = [sys.executable, "-m", "cli.main", "worker", "--roles", ",".join(settings.worker.roles)]
        cmd += ["--config", config_path] if config_path else []
        worker = spawn_tied(cmd, env=env)
        broker_pid = broker.pid if broker else "external"
        print(f"koordstream up: bootstrap={bootstrap} broker_pid={broker_pid} worker_pid={worker.pid}"
              f"{f' sandbox_records={pools}' if settings.sandbox.pools else ''}", flush=True)
        while not stopping.is_set() and worker.poll() is None:
            stopping.wait(0.2)
        return 0 if stopping.is_set() else (worker.returncode or 1)
    finally:
        if worker is not None:
            stop(worker, deadline_s=settings.worker.shutdown_deadline_s + 1.0)
        if broker is not None:
            broker.stop()
