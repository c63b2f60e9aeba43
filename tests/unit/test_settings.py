from pathlib import Path

import pytest

from streams.settings import SettingsError, load_settings


def test_defaults_file_then_environment(tmp_path: Path) -> None:
    f = tmp_path / "k.yaml"
    f.write_text("kafka: {partitions: 8, bootstrap: 'a:1'}\nscheduling: {batch_size: 64}\n")
    s = load_settings(f, env={"KOORDSTREAM_KAFKA_BOOTSTRAP": "b:2"})
    assert (s.kafka.partitions, s.kafka.bootstrap, s.scheduling.batch_size) == (8, "b:2", 64)


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("kafka: {partitionz: 3}\n", {}, "unknown field kafka.partitionz"),
        ("kafcka: {}\n", {}, "unknown section 'kafcka'"),
        ("", {"KOORDSTREAM_KAFKA_PARTITIONS": "many"}, "kafka.partitions = 'many'"),
        ("kafka: {partitions: 0}\n", {}, "kafka.partitions: must be at least 1"),
        ("worker: {loglevel: loud}\n", {}, "worker.loglevel"),
        ("worker: {gc_freeze_s: -1}\n", {}, "worker.gc_freeze_s, worker.gc_full_s: must be 0 (off) or from 0.1 "
                                              "to 3600 seconds, and 0 (never) or from 1 second to 30 days, got -1"),
        ("", {"KOORDSTREAM_WORKER_GC_FREEZE_S": "nan"}, "got nan"),
        ("worker: {max_clock_skew_s: 400}\n", {}, "worker.max_clock_skew_s: must be 0 (a tenth of "
                                                  "worker.state_retention_s) or a positive number of seconds up to a "
                                                  "quarter of worker.state_retention_s (150), got 400"),
    ],
    ids=["unknown-field", "unknown-section", "bad-env-value", "out-of-range", "bad-choice", "negative-gc-pace", "nan-gc-pace",
         "clock-skew-past-the-retention"],
)
def test_bad_settings_name_the_field(tmp_path: Path, text: str, env: dict[str, str], message: str) -> None:
    f = tmp_path / "k.yaml"
    f.write_text(text)
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_settings(f, env=env)


def test_the_clock_skew_defaults_to_a_tenth_of_the_retention() -> None:
    assert load_settings(env={}).worker.clock_skew_s() == 60.0
    assert load_settings(env={"KOORDSTREAM_WORKER_STATE_RETENTION_S": "3"}).worker.clock_skew_s() == 0.3
    assert load_settings(env={"KOORDSTREAM_WORKER_MAX_CLOCK_SKEW_S": "5"}).worker.clock_skew_s() == 5.0


def test_roles_choose_the_consumer_group() -> None:
    from streams.app import group_id

    assert group_id(load_settings(env={})) == "koordstream"
    assert group_id(load_settings(env={"KOORDSTREAM_WORKER_ROLES": "scheduler"})) == "koordstream-scheduler"
    assert group_id(load_settings(env={"KOORDSTREAM_WORKER_ROLES": "state"})) == "koordstream"
    with pytest.raises(SettingsError, match="worker.roles"):
        load_settings(env={"KOORDSTREAM_WORKER_ROLES": "scheduler,owner"})


def test_scheduler_profiles_come_from_the_file_the_settings_name(tmp_path) -> None:  # noqa: ANN001
    import pytest

    from agents.scheduler.framework.profiles import ProfileError
    from streams.app import build_core
    from streams.settings import load_settings

    good = tmp_path / "profiles.yaml"
    good.write_text("profiles: [{schedulerName: alpha}, {schedulerName: beta}]\n")
    core = build_core(load_settings(env={"KOORDSTREAM_SCHEDULING_PROFILES": str(good)}))
    assert list(core.frameworks) == ["alpha", "beta"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("profiles: [{schedulerName: alpha, plugins: {score: {enabled: [{name: Nope}]}}}]\n")
    with pytest.raises(ProfileError, match="profile 'alpha', plugin 'Nope'"):
        build_core(load_settings(env={"KOORDSTREAM_SCHEDULING_PROFILES": str(bad)}))
