"""`kafka.transactions`: validated with the other settings, and resolved before the app is built
(`auto` asks the broker; `on` fails loudly on a broker without transactions)."""

from __future__ import annotations

import pytest

from streams import app as stream_app
from streams import transport, worker
from streams.connection import KafkaConnection
from streams.settings import SettingsError, load_settings


def test_the_setting_defaults_to_auto_and_takes_on_or_off() -> None:
    assert load_settings(env={}).kafka.transactions == "auto"
    assert load_settings(env={"KOORDSTREAM_KAFKA_TRANSACTIONS": "off"}).kafka.transactions == "off"
    with pytest.raises(SettingsError, match="kafka.transactions: must be auto, on or off, got 'maybe'"):
        load_settings(env={"KOORDSTREAM_KAFKA_TRANSACTIONS": "maybe"})


@pytest.mark.parametrize(("mode", "roles", "accepts", "expected"), [
    ("auto", "state", True, True), ("auto", "state", False, False), ("off", "state", True, False),
    ("on", "state", True, True), ("auto", "scheduler", True, False)])
async def test_resolving_the_mode(monkeypatch: pytest.MonkeyPatch, mode: str, roles: str, accepts: bool,
                                  expected: bool) -> None:
    async def probe(bootstrap: str, timeout_s: float = 15.0) -> bool:
        return accepts

    monkeypatch.setattr(stream_app, "broker_accepts_transactions", probe)
    settings = load_settings(env={"KOORDSTREAM_KAFKA_TRANSACTIONS": mode, "KOORDSTREAM_WORKER_ROLES": roles,
                                  "KOORDSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    assert await stream_app.resolve_transactions(settings) is expected


async def test_on_fails_on_a_broker_that_refuses_producer_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    async def probe(bootstrap: str, timeout_s: float = 15.0) -> bool:
        return False

    monkeypatch.setattr(stream_app, "broker_accepts_transactions", probe)
    settings = load_settings(env={"KOORDSTREAM_KAFKA_TRANSACTIONS": "on", "KOORDSTREAM_KAFKA_BOOTSTRAP": "b:1"})
    with pytest.raises(ValueError, match="refuses InitProducerId"):
        await stream_app.resolve_transactions(settings)


def test_a_transactional_app_reads_committed_and_leaves_offsets_to_the_transactions() -> None:
    settings = load_settings(env={"KOORDSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:1", "KOORDSTREAM_WORKER_ROLES": "state"})
    app = stream_app.build_app(settings, transactions=True)
    assert str(app.conf.broker[0]).startswith(f"{transport.COMMITTED_SCHEME}://")
    assert type(app.tables).__name__ == "TailTableManager" and app.tables.read_committed  # type: ignore[attr-defined]
    acks = {name: agent.channel.acks for name, agent in app.agents.items()}
    assert acks == {"koordstream.nodes": True, "koordstream.owners": False, "koordstream.deciders": False,
                    "koordstream.sandbox-outcomes": True, "koordstream.pools": False}
    plain = stream_app.build_app(settings, transactions=False)
    assert all(agent.channel.acks for agent in plain.agents.values())
    # Restores end at the changelog's last record read from the partition on every broker (Tansu
    # answers ListOffsets with the base offset of the last record batch plus one).
    assert type(plain.tables).__name__ == "TailTableManager" and not plain.tables.read_committed  # type: ignore[attr-defined]


async def test_a_worker_asks_the_broker_once_for_transactions_and_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    """`prepare_worker` probes once and hands the answer to both decisions."""
    asked: list[str] = []

    async def probe(kafka: KafkaConnection | str, timeout_s: float = 15.0) -> bool:
        asked.append(KafkaConnection.of(kafka).bootstrap)
        return True

    async def no_topics(settings: object) -> list[str]:
        return []

    monkeypatch.setattr(worker, "broker_accepts_transactions", probe)
    monkeypatch.setattr(worker, "prepare", no_topics)
    settings = load_settings(env={"KOORDSTREAM_WORKER_ROLES": "state", "KOORDSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    assert await worker.prepare_worker(settings) is True
    assert asked == ["127.0.0.1:1"]
    assert await stream_app.resolve_transactions(settings, accepts_transactions=False) is False  # told: not asked
    assert asked == ["127.0.0.1:1"]
