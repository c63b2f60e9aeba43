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


RUNC_SANDBOX = """
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: runc-sandbox, annotations: {koordstream.io/qos-classes: "LS,BE", koordstream.io/default-qos-class: BE}}
handler: runc
overhead: {podFixed: {cpu: 50m}}
"""


def test_sandbox_runtimes_come_from_the_file_the_settings_name(tmp_path: Path) -> None:
    from streams.settings import runtime_table

    assert "kata-qemu" in runtime_table(load_settings(env={})).names  # the shipped ones, by default
    runtimes = tmp_path / "runtimes.yaml"
    runtimes.write_text(RUNC_SANDBOX)
    table = runtime_table(load_settings(env={"KOORDSTREAM_SANDBOX_RUNTIMES": str(runtimes)}))
    assert {"runc-sandbox", "gvisor"} <= set(table.names)
    only = runtime_table(load_settings(env={"KOORDSTREAM_SANDBOX_RUNTIMES": str(runtimes),
                                            "KOORDSTREAM_SANDBOX_DEFAULT_RUNTIMES": "false"}))
    assert only.names == ["runc-sandbox"]


def test_a_workers_scheduler_admits_pods_through_the_runtimes_of_its_settings(tmp_path: Path) -> None:
    from schemas.records import Pod, ResourceList
    from streams.app import build_core

    runtimes = tmp_path / "runtimes.yaml"
    runtimes.write_text(RUNC_SANDBOX)
    core = build_core(load_settings(env={"KOORDSTREAM_SANDBOX_RUNTIMES": str(runtimes)}))
    admitted = core.runtimes.admit(Pod(uid="p", name="p", runtime_class_name="runc-sandbox",
                                       requests=ResourceList(cpu=100)))
    assert admitted.requests == {"cpu": 150} and admitted.labels["koordinator.sh/qosClass"] == "BE"


@pytest.mark.parametrize(("text", "message"), [
    (None, "sandbox.runtimes: cannot read"),
    (RUNC_SANDBOX.replace("cpu: 50m", "cpu: -50m"), "sandbox.runtimes: .*runtimes.yaml: overhead.podFixed.cpu: a "
                                                    "quantity must not be negative"),
    (RUNC_SANDBOX.replace("handler: runc", "handler: ''"), "sandbox.runtimes: .*: handler: must name the CRI handler"),
], ids=["missing-file", "negative-overhead", "empty-handler"])
def test_a_bad_runtimes_file_stops_the_start_naming_the_setting_and_the_field(
        tmp_path: Path, text: str | None, message: str) -> None:
    runtimes = tmp_path / "runtimes.yaml"
    if text is not None:
        runtimes.write_text(text)
    with pytest.raises(SettingsError, match=message):
        load_settings(env={"KOORDSTREAM_SANDBOX_RUNTIMES": str(runtimes)})


def test_publishing_a_runtime_class_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    import asyncio

    from streams.publish import publish_file

    manifest = tmp_path / "runtimes.yaml"
    manifest.write_text(RUNC_SANDBOX)
    settings = load_settings(env={"KOORDSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:1"})  # nothing listens: never reached
    with pytest.raises(ValueError, match="RuntimeClass runc-sandbox: runtime classes are not published; list them "
                                         "in the file the setting sandbox.runtimes names"):
        asyncio.run(publish_file(manifest, "pods", settings))


# Kafka security (issue 29): the fields agree with kafka.security_protocol, files they name are
# there, and a secret never shows in a message, a repr or a dump.

PASSWORD = "s3cret-Pa55word"


def security_case(tmp_path: Path, text: str, env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """The settings file and environment of a case, `{ca}`, `{pw}`, `{empty}` and `{missing}`
    standing for a CA file, a password file, an empty file and a path with no file."""
    (tmp_path / "ca.pem").write_text("not read by validation\n")
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    (tmp_path / "empty").write_text("")
    names = {"ca": tmp_path / "ca.pem", "pw": tmp_path / "pw", "empty": tmp_path / "empty",
             "missing": tmp_path / "missing"}

    def filled(value: str) -> str:
        for name, path in names.items():
            value = value.replace("{" + name + "}", str(path))
        return value

    f = tmp_path / "k.yaml"
    f.write_text(filled(text))
    return f, {k: filled(v) for k, v in env.items()}


SASL = {"KOORDSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KOORDSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KOORDSTREAM_KAFKA_SASL_USERNAME": "alice", "KOORDSTREAM_KAFKA_SASL_PASSWORD": PASSWORD,
        "KOORDSTREAM_KAFKA_SSL_CAFILE": "{ca}"}


@pytest.mark.parametrize(("text", "env", "message"), [
    ("kafka: {security_protocol: TLS}\n", {}, "kafka.security_protocol: must be PLAINTEXT, SSL, SASL_PLAINTEXT or "
                                              "SASL_SSL, got 'TLS'"),
    ("", {**SASL, "KOORDSTREAM_KAFKA_SASL_MECHANISM": ""}, "kafka.sasl_mechanism: kafka.security_protocol=SASL_SSL "
                                                          "needs one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, got ''"),
    ("", {**SASL, "KOORDSTREAM_KAFKA_SASL_MECHANISM": "GSSAPI"}, "kafka.sasl_mechanism: .* got 'GSSAPI'"),
    ("", {**SASL, "KOORDSTREAM_KAFKA_SASL_USERNAME": ""}, "kafka.sasl_username: kafka.security_protocol=SASL_SSL "
                                                          "needs a user name"),
    ("", {**SASL, "KOORDSTREAM_KAFKA_SASL_PASSWORD": ""}, "kafka.sasl_password_file: kafka.security_protocol="
                                                          "SASL_SSL needs a password: .*KOORDSTREAM_KAFKA_SASL_PASSWORD"),
    ("kafka: {sasl_password_file: '{pw}'}\n", SASL, "kafka.sasl_password, kafka.sasl_password_file: both are set"),
    ("kafka: {sasl_password_file: '{missing}'}\n", {**SASL, "KOORDSTREAM_KAFKA_SASL_PASSWORD": ""},
     "kafka.sasl_password_file: cannot read '.*missing': No such file or directory"),
    ("kafka: {sasl_password_file: '{empty}'}\n", {**SASL, "KOORDSTREAM_KAFKA_SASL_PASSWORD": ""},
     "kafka.sasl_password_file: '.*empty' is empty"),
    ("", {**SASL, "KOORDSTREAM_KAFKA_SSL_CAFILE": ""}, "kafka.ssl_cafile: kafka.security_protocol=SASL_SSL needs "
                                                       "the CA certificates .* or 'system' for the system's trust store"),
    ("", {**SASL, "KOORDSTREAM_KAFKA_SSL_CAFILE": "{missing}"}, "kafka.ssl_cafile: no such file: '.*missing'"),
    ("kafka: {ssl_keyfile: '{ca}'}\n", SASL, "kafka.ssl_keyfile: is set .* without kafka.ssl_certfile"),
    ("", {**SASL, "KOORDSTREAM_KAFKA_SSL_KEY_PASSWORD": "x"}, "kafka.ssl_key_password: a key passphrase is set "
                                                              "without kafka.ssl_certfile"),
    ("kafka: {ssl_certfile: '{missing}'}\n", SASL, "kafka.ssl_certfile: no such file"),
    ("", {**SASL, "KOORDSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"},
     "kafka.ssl_cafile: is set, but kafka.security_protocol=SASL_PLAINTEXT does not use TLS"),
    ("kafka: {sasl_username: alice}\n", {}, "kafka.sasl_username: is set, but kafka.security_protocol=PLAINTEXT logs "
                                            "in without SASL"),
    ("kafka: {security_protocol: SSL, sasl_mechanism: PLAIN, ssl_cafile: system}\n", {},
     "kafka.sasl_mechanism: is set, but kafka.security_protocol=SSL"),
    ("kafka: {sasl_password: hunter2}\n", {}, "k.yaml: kafka.sasl_password is written in the settings file: give it "
                                              "in the environment \\(KOORDSTREAM_KAFKA_SASL_PASSWORD\\) or in a file "
                                              "of its own \\(kafka.sasl_password_file\\), or set "
                                              "kafka.inline_secrets: true"),
    ("kafka: {ssl_key_password: hunter2}\n", {}, "kafka.ssl_key_password is written in the settings file"),
], ids=["unknown-protocol", "sasl-without-mechanism", "unsupported-mechanism", "sasl-without-user",
        "sasl-without-password", "password-given-twice", "password-file-missing", "password-file-empty",
        "tls-without-ca", "ca-file-missing", "key-without-certificate", "key-passphrase-without-certificate",
        "certificate-missing", "tls-file-without-tls", "sasl-field-without-sasl", "mechanism-with-ssl-only",
        "password-inline-in-the-file", "key-passphrase-inline-in-the-file"])
def test_bad_kafka_security_names_the_field(tmp_path: Path, text: str, env: dict[str, str], message: str) -> None:
    f, env = security_case(tmp_path, text, env)
    with pytest.raises(SettingsError, match=message) as refused:
        load_settings(f, env=env)
    assert PASSWORD not in str(refused.value) and "hunter2" not in str(refused.value)


@pytest.mark.parametrize(("text", "env"), [
    ("", {}),
    ("kafka: {security_protocol: SSL, ssl_cafile: system}\n", {}),
    ("kafka: {security_protocol: SSL, ssl_cafile: '{ca}', ssl_check_hostname: false}\n", {}),
    ("kafka: {security_protocol: SASL_PLAINTEXT, sasl_mechanism: SCRAM-SHA-256, sasl_username: bob, "
     "sasl_password_file: '{pw}'}\n", {}),
    ("", SASL),
    ("kafka: {security_protocol: SASL_PLAINTEXT, sasl_mechanism: PLAIN, sasl_username: bob, inline_secrets: true, "
     "sasl_password: " + PASSWORD + "}\n", {}),
], ids=["plaintext", "tls-with-the-system-store", "tls-without-hostname-check", "scram-password-from-a-file",
        "scram-over-tls-from-the-environment", "password-inline-when-the-file-insists"])
def test_good_kafka_security_loads(tmp_path: Path, text: str, env: dict[str, str]) -> None:
    f, env = security_case(tmp_path, text, env)
    k = load_settings(f, env=env).kafka
    assert k.sasl_secret().reveal() in ("", PASSWORD)  # a password file's line end is dropped


def test_a_secret_never_shows_in_a_repr_a_dump_or_a_message(tmp_path: Path) -> None:
    from schemas.secret import Secret
    from streams.settings import dump

    secret = Secret(PASSWORD)
    assert PASSWORD not in f"{secret!r} {secret} {secret:>20} {[secret]}" and secret.reveal() == PASSWORD
    assert (repr(Secret()), str(Secret()), bool(Secret()), bool(secret)) == ("Secret('')", "", False, True)
    assert secret == Secret(PASSWORD) and secret != Secret("other") and len({secret, Secret(PASSWORD)}) == 1
    f, env = security_case(tmp_path, "", {**SASL, "KOORDSTREAM_KAFKA_SSL_KEY_PASSWORD": PASSWORD,
                                          "KOORDSTREAM_KAFKA_SSL_CERTFILE": "{ca}"})
    settings = load_settings(f, env=env)
    assert settings.kafka.sasl_password.reveal() == PASSWORD
    assert PASSWORD not in repr(settings) and PASSWORD not in str(dump(settings))
    assert dump(settings)["kafka"]["sasl_password"] == "***"
    assert dump(load_settings(env={}))["kafka"]["sasl_password"] == ""


def test_koordstream_config_prints_the_settings_with_secrets_masked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from cli.main import main

    f, env = security_case(tmp_path, "", SASL)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["config", "--bootstrap", "kafka:9093"]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)["kafka"]
    assert (printed["bootstrap"], printed["security_protocol"], printed["sasl_username"]) == (
        "kafka:9093", "SASL_SSL", "alice")
    assert printed["sasl_password"] == "***" and PASSWORD not in out
