"""Running the agents: topics first, then one faust worker with every agent.

Before the app is built the worker decides whether its owners and deciders use transactions
(`kafka.transactions`; `auto` asks the broker for a producer id: Apache Kafka grants one, the
embedded Tansu refuses) and prints which mode runs.

The worker exits at the latest `worker.shutdown_deadline_s` after SIGTERM or SIGINT: a faust
worker sometimes did not exit on SIGTERM against the embedded broker, so a timer thread ends
the process if the orderly shutdown hangs. faust's data folder goes into `worker.state_dir`,
or a temporary folder of its own (`state_dir`), never the directory the worker started from.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import faust

from schemas.secret import Secret
from streams.admin import ensure_topics
from streams.app import (
    broker_accepts_transactions,
    build_app,
    guard_gaps,
    rebalancer_service,
    resolve_transactions,
    run_rebalancer,
)
from streams.catalogue import catalogue
from streams.connection import check, connect
from streams.metrics import registry_for, serve_metrics
from streams.process import GcPacer, spawn_tied, stop, tune_gc
from streams.producer import RecordProducer
from streams.settings import Settings


class DeadlineWorker(faust.Worker):  # type: ignore[misc]
    deadline_s: float = 4.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # faust's progress spinner sets the root logger to DEBUG so that every record spins
        # it; aiokafka then builds a debug LogRecord per message sent (about a tenth of the
        # state worker's CPU in a sandbox-burst profile). Workers run without a terminal.
        self.spinner = None

    def _arm_deadline(self) -> None:
        timer = threading.Timer(self.deadline_s, os._exit, args=(0,))
        timer.daemon = True
        timer.start()

    def _on_sigterm(self) -> None:
        self._arm_deadline()
        super()._on_sigterm()

    def _on_sigint(self) -> None:
        self._arm_deadline()
        super()._on_sigint()


async def prepare(settings: Settings) -> list[str]:
    """Log in to the broker as every client will (a refused login or an untrusted
    certificate stops here, naming the setting: `streams.connection.check`), and create every
    topic of the catalogue that is missing."""
    conn = connect(settings.kafka)
    await check(conn)
    specs = catalogue(settings.kafka.partitions, settings.kafka.app_id).values()
    return await ensure_topics(conn, specs)


async def prepare_worker(settings: Settings) -> bool:
    """Create missing topics, decide whether the stateful agents use transactions, and guard
    the process's consumers against offset gaps (`streams.gaps`) where the broker needs it."""
    await prepare(settings)
    k = settings.kafka
    asks = (k.transactions != "off" and "state" in settings.worker.roles) or k.contiguous_offsets == "auto"
    accepts = await broker_accepts_transactions(connect(k)) if asks else None  # one probe for both
    transactions = await resolve_transactions(settings, accepts)
    await guard_gaps(settings, accepts)
    return transactions


def run_worker(settings: Settings) -> None:
    tune_gc(settings.worker.gc_threshold)
    roles = set(settings.worker.roles)
    if roles == {"bridge"}:
        asyncio.run(prepare_worker(settings))
        asyncio.run(bridge_only(settings))
        return
    if "bridge" in roles:  # the bridge in a process of its own (it has no faust agent), tied to this one
        bridge = spawn_tied([sys.executable, "-m", "cli.main", "worker", "--roles", "bridge"],
                            env={**os.environ, **settings_env(settings)})
        try:
            run_worker(dataclasses.replace(settings, worker=dataclasses.replace(
                settings.worker, roles=tuple(r for r in settings.worker.roles if r != "bridge"))))
        finally:
            stop(bridge, settings.worker.shutdown_deadline_s)
        return
    if roles == {"rebalancer"}:
        asyncio.run(prepare_worker(settings))
        asyncio.run(rebalancer_only(settings))
        return
    transactions = asyncio.run(prepare_worker(settings))
    if "state" in settings.worker.roles:  # say which guarantee runs, whatever the log level
        mode = ("one transaction per input partition per batch (exactly-once within Kafka)" if transactions
                else "no transactions (replay-safe at-least-once)")
        print(f"koordstream worker: kafka.transactions={settings.kafka.transactions}: {mode}", file=sys.stderr,
              flush=True)
    with state_dir(settings) as datadir:
        app = build_app(settings, transactions, datadir)
        worker = DeadlineWorker(app, loglevel=settings.worker.loglevel, quiet=True, override_logging=True)
        worker.deadline_s = settings.worker.shutdown_deadline_s
        _silence_banner(worker)
        worker.execute_from_commandline()


def settings_env(settings: Settings) -> dict[str, str]:
    """`KOORDSTREAM_<SECTION>_<FIELD>` for every setting: a child process (the bridge a worker
    starts) gets exactly this process's settings, whatever file or arguments they came from (a
    secret as the variable the settings read it from)."""
    env = {}
    for section in dataclasses.fields(settings):
        values = getattr(settings, section.name)
        for f in dataclasses.fields(values):
            value = getattr(values, f.name)
            text = (value.reveal() if isinstance(value, Secret) else str(value).lower() if isinstance(value, bool)
                    else ",".join(value) if isinstance(value, tuple) else str(value))
            env[f"KOORDSTREAM_{section.name}_{f.name}".upper()] = text
    return env


def _logging(settings: Settings) -> None:
    levels = {"crit": logging.CRITICAL, "error": logging.ERROR, "warn": logging.WARNING, "info": logging.INFO,
              "debug": logging.DEBUG}
    logging.basicConfig(level=levels[settings.worker.loglevel], format="[%(asctime)s] [%(process)d] [%(levelname)s] "
                        "%(message)s")


async def bridge_only(settings: Settings) -> None:
    """A worker with only the bridge role (`streams.bridge.service`); SIGTERM / SIGINT stop it
    (its Lease released, so that another bridge takes over at once)."""
    from streams.bridge.service import run_bridge

    _logging(settings)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await run_bridge(settings, stopping)


async def rebalancer_only(settings: Settings) -> None:
    """A worker with only the rebalancer role: no faust app (it would consume nothing), the
    rebalancer's loop, its producer and its metrics endpoint; SIGTERM / SIGINT stop it."""
    _logging(settings)
    service = rebalancer_service(settings)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    conn = connect(settings.kafka)
    async with RecordProducer(conn, settings.kafka.partitions) as producer:
        tasks = [asyncio.create_task(run_rebalancer(settings, service, producer.outbox, conn))]
        if settings.worker.gc_freeze_s:  # (a task that ends would end the worker)
            tasks.append(asyncio.create_task(GcPacer(settings.worker.gc_freeze_s, settings.worker.gc_full_s).run()))
        if settings.worker.metrics_port:
            server = await serve_metrics(registry_for(rebalancer=service), settings.worker.metrics_port)
            tasks.append(asyncio.create_task(server.serve_forever()))
        stop = asyncio.create_task(stopping.wait())
        done, _ = await asyncio.wait([*tasks, stop], return_when=asyncio.FIRST_COMPLETED)
        for task in [*tasks, stop]:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for task in done - {stop}:
            task.result()  # a crash of the loop ends the worker with its error


@contextlib.contextmanager
def state_dir(settings: Settings) -> Iterator[Path]:
    """The worker's data folder: `worker.state_dir`, created if missing, or a fresh temporary
    one removed afterwards (a forced exit leaves it to the system's temporary-file cleanup)."""
    if settings.worker.state_dir:
        path = Path(settings.worker.state_dir).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix=f"koordstream-worker-{os.getpid()}-") as tmp:
        yield Path(tmp)


def _silence_banner(worker: Any) -> None:
    worker.say = lambda *a, **k: None
