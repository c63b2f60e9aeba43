"""Apache Kafka as a single KRaft node (broker and controller in one JVM) on free loopback ports.

The jars come from `make kafka` (infra/kafka/install.sh: Maven Central into
.cache/kafka/<version>/libs, or the folder named by KOORDSTREAM_KAFKA_LIBS); Java 17 or later
runs them. The node's data, its settings and its own log live in a folder the caller owns (a
temporary one by default, removed by `close()`): `log_dir/data` is the Kafka log, formatted
once with Kafka's StorageTool, `log_dir/logs/server.log` what the broker says (warnings and
worse), `log_dir/logs/stdout.log` what the JVM prints.

Same interface as `streams.broker.EmbeddedBroker` (`start`, `stop`, `pid`, `bootstrap`, an
async context manager), plus `kill()` (SIGKILL, as a crash) and `restart()` on the same ports
and log, for crash tests. The JVM is tied to this process (it dies with it) and stopped on a
clean exit. Unlike the embedded broker it has idempotent and transactional producers, log
compaction and retention, and keeps its log across its own restart.

Secured (`security="SASL_PLAINTEXT"`, `"SASL_SSL"` or `"SSL"`): the client listener at
`bootstrap` speaks that protocol, while the broker's own traffic (inter-broker, controller)
stays PLAINTEXT on other loopback ports. SASL logins are SCRAM (SHA-512 by default) for the
`users` given (name -> password; one made up when none are): their credentials are written
into the metadata log when the folder is formatted (StorageTool `--add-scram`, as salt,
iterations and salted password computed here, so no password reaches a command line or a log).
TLS uses a CA and a server certificate (for `localhost` and `127.0.0.1`) generated with
`cryptography` on first start into `log_dir/tls` (`ca_file` is the CA clients trust), served
as PEM files (`ssl.keystore.type=PEM`). `connection(user)` and `client_env(user)` give a client
what it needs to log in, through the same rule as every koordstream client
(`streams.connection.connect`). The default stays a PLAINTEXT listener alone.

Measured on the 2-core development machine (Kafka 4.4.0, Java 17, the JVM options below, the
machine shared): 2.0-3.9 s, median 2.4 s, from process start to answering metadata requests
(plus about 1 s for formatting a new log folder); 4.1-5.1 s from a restart after SIGKILL to
ready; about 167 MB resident when idle, 185 MB after taking 100,000 records. A secured node
costs about the same: measured side by side on the shared machine, SASL_SSL 4.9-5.1 s to ready
(certificates, SCRAM users and formatting included), SASL_PLAINTEXT 4.7 s, PLAINTEXT 3.8-4.7 s.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType

from schemas.secret import Secret
from streams.broker import free_port, wait_ready
from streams.connection import KafkaConnection, child_env, connect
from streams.process import spawn_tied, stop
from streams.settings import KafkaSettings

KAFKA_VERSION = "4.4.0"  # = infra/kafka/pom.xml's kafka.version (checked by tests/unit/test_infra.py)
ROOT = Path(__file__).resolve().parents[1]
LIBS_ENV = "KOORDSTREAM_KAFKA_LIBS"

# Small heap, serial GC and the C1 compiler only: start-up measured 2.4-2.9 s against 2.6-4.8 s
# with the default G1 and C2 (the C2 compiler threads compete with the agents for two cores),
# resident memory 169 MB against 215 MB; a test or demo broker never runs long enough for C2
# to pay off.
JVM_OPTS: tuple[str, ...] = (
    "-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true", "-Dfile.encoding=UTF-8",
)

# A single node: every internal topic with one replica, no wait before the first rebalance,
# no auto-created topics (koordstream creates each with its partition count), and a log
# cleaner that looks for work each second, so compaction of the compacted topics (whose
# segments roll after `TopicSpec.segment_ms`) happens within a run.
SINGLE_NODE: dict[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "group.initial.rebalance.delay.ms": "0",
    # After a SIGKILL the restarted node's broker half cannot register until its controller
    # half has fenced the dead incarnation, when the session times out: 9 s by default,
    # measured 12.9 s from restart to ready; with 2 s about 4 s.
    "broker.session.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "500",
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    "log.cleaner.enable": "true",
    "log.cleaner.threads": "1",
    "log.cleaner.backoff.ms": "1000",
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
    "log.segment.delete.delay.ms": "1000",
    "log.retention.check.interval.ms": "10000",
    "file.delete.delay.ms": "1000",
    "num.network.threads": "2",
    "num.io.threads": "4",
    "num.recovery.threads.per.data.dir": "2",
}

LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {logs}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
logger.cleaner.name = org.apache.kafka.storage.internals.log.LogCleaner
logger.cleaner.level = INFO
logger.fencing.name = org.apache.kafka.controller.ReplicationControlManager
logger.fencing.level = INFO
"""


SECURITY = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SCRAM = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
SCRAM_ITERATIONS = 4096  # Kafka's least for SCRAM-SHA-512


class KafkaNotInstalled(RuntimeError):
    """The broker's jars are not where they should be."""


def kafka_libs() -> Path:
    """The folder of the broker's jars; raises KafkaNotInstalled, saying how to fetch them."""
    libs = Path(os.environ.get(LIBS_ENV) or ROOT / ".cache" / "kafka" / KAFKA_VERSION / "libs")
    if not (libs / ".complete").is_file() and not any(libs.glob("kafka_2.13-*.jar")):
        raise KafkaNotInstalled(
            f"Apache Kafka {KAFKA_VERSION} is not installed in {libs}: run `make kafka` "
            f"(or infra/kafka/install.sh; needs Maven, and Java 17+ to run the broker)"
        )
    return libs


def java_bin() -> str:
    """`$JAVA_HOME/bin/java`, else `java` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise KafkaNotInstalled("Apache Kafka needs Java 17 or later: no `java` on the PATH or in JAVA_HOME")
    return found


def cluster_id() -> str:
    """A random Kafka cluster id: 16 bytes, URL-safe base64 without padding, not starting with '-'."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def scram_credential(mechanism: str, name: str, password: str, iterations: int = SCRAM_ITERATIONS) -> str:
    """StorageTool's `--add-scram` argument for a user, with the salted password computed
    here (RFC 5802: PBKDF2 with the mechanism's hash) instead of the password itself."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac(SCRAM[mechanism], password.encode(), salt, iterations)
    b64 = base64.b64encode
    return (f"{mechanism}=[name={name},iterations={iterations},salt=\"{b64(salt).decode()}\","
            f"saltedpassword=\"{b64(salted).decode()}\"]")


def write_tls_files(folder: Path) -> None:
    """A CA (`ca.pem`) and a server certificate signed by it for `localhost` and `127.0.0.1`,
    with its key, in one PEM file (`server.pem`) as Kafka's PEM key store reads it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
                    signer: ec.EllipticCurvePrivateKey, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=30))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "koordstream test CA")])
    ca_cert = certificate("koordstream test CA", ca_key, ca_name, ca_key, ca=True)
    server_cert = certificate("localhost", server_key, ca_name, ca_key, ca=False)
    pem = serialization.Encoding.PEM
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    key = server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    server = folder / "server.pem"
    server.touch(mode=0o600)
    server.write_bytes(key + server_cert.public_bytes(pem) + ca_cert.public_bytes(pem))


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class KafkaBroker:
    """`async with KafkaBroker() as broker:` -> `broker.bootstrap` is ready to use.

    `log_dir`: the folder for the node's log, settings and output (created if missing; kept
    across `stop()`, `kill()` and `restart()`; a temporary folder removed by `close()` when
    not given). `settings` override or add broker settings (server.properties keys).
    `security`: the client listener's protocol (module docstring); `users` the SCRAM logins
    (`mechanism`) of a SASL listener, set when its folder is formatted.
    """

    def __init__(self, log_dir: str | Path | None = None, port: int | None = None,
                 controller_port: int | None = None, settings: Mapping[str, str] | None = None,
                 jvm_opts: Sequence[str] = JVM_OPTS, security: str = "PLAINTEXT",
                 users: Mapping[str, str] | None = None, mechanism: str = "SCRAM-SHA-512") -> None:
        if security not in SECURITY:
            raise ValueError(f"security={security!r}: choose one of {', '.join(SECURITY)}")
        if mechanism not in SCRAM:
            raise ValueError(f"mechanism={mechanism!r}: choose one of {', '.join(SCRAM)}")
        self.security = security
        self.mechanism = mechanism
        sasl = security in ("SASL_PLAINTEXT", "SASL_SSL")
        self.users = dict(users or ({"koordstream": secrets.token_urlsafe(18)} if sasl else {}))
        if sasl and not self.users:
            raise ValueError(f"security={security}: give at least one user")
        bad = [name for name in self.users if not name or any(c in name for c in ",=[]\"")]
        if bad:
            raise ValueError(f"users: a SCRAM user name cannot be empty or hold , = [ ] \", got {bad[0]!r}")
        self.libs = kafka_libs()
        self._owns_dir = log_dir is None
        self.log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="koordstream-kafka-"))
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        # The broker's own listener (inter-broker) when clients get a secured one.
        self.internal_port = 0
        while security != "PLAINTEXT" and self.internal_port in (0, self.port, self.controller_port):
            self.internal_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.settings = dict(settings or {})
        self.jvm_opts = list(jvm_opts)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.log_dir / "data"

    @property
    def logs_dir(self) -> Path:
        return self.log_dir / "logs"

    @property
    def tls_dir(self) -> Path:
        return self.log_dir / "tls"

    @property
    def ca_file(self) -> Path:
        """The CA that signed the broker's certificate (a TLS listener's clients trust it)."""
        return self.tls_dir / "ca.pem"

    @property
    def sasl(self) -> bool:
        return self.security in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def tls(self) -> bool:
        return self.security in ("SSL", "SASL_SSL")

    def client_settings(self, user: str | None = None, password: str | None = None) -> KafkaSettings:
        """The kafka settings of a client of this broker, logged in as `user` (the first of
        `users` by default) with `password` (the user's own by default)."""
        k = KafkaSettings(bootstrap=self.bootstrap, security_protocol=self.security)
        if self.sasl:
            name = user or next(iter(self.users))
            k = replace(k, sasl_mechanism=self.mechanism, sasl_username=name,
                        sasl_password=Secret(self.users.get(name, "") if password is None else password))
        if self.tls:
            k = replace(k, ssl_cafile=str(self.ca_file))
        return k

    def connection(self, user: str | None = None, password: str | None = None) -> KafkaConnection:
        """A client's connection to this broker (`client_settings`)."""
        return connect(self.client_settings(user, password))

    def client_env(self, user: str | None = None, password: str | None = None) -> dict[str, str]:
        """`KOORDSTREAM_KAFKA_*` variables that make a worker a client of this broker."""
        return child_env(self.client_settings(user, password))

    def _listeners(self) -> dict[str, str]:
        if self.security == "PLAINTEXT":
            return {
                "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name": "PLAINTEXT",
            }
        out = {
            "listeners": f"CLIENT://127.0.0.1:{self.port},INTERNAL://127.0.0.1:{self.internal_port},"
                         f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"CLIENT://127.0.0.1:{self.port},INTERNAL://127.0.0.1:{self.internal_port}",
            "listener.security.protocol.map": f"CLIENT:{self.security},INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "INTERNAL",
        }
        if self.sasl:
            mech = self.mechanism.lower()
            out["listener.name.client.sasl.enabled.mechanisms"] = self.mechanism
            out[f"listener.name.client.{mech}.sasl.jaas.config"] = \
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        if self.tls:
            out["listener.name.client.ssl.keystore.type"] = "PEM"
            out["listener.name.client.ssl.keystore.location"] = str(self.tls_dir / "server.pem")
            out["listener.name.client.ssl.client.auth"] = "none"
        return out

    def server_properties(self) -> dict[str, str]:
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            **self._listeners(),
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(self.data_dir),
            **SINGLE_NODE,
            **self.settings,
        }

    def _java(self, main: str, *args: str) -> list[str]:
        return [java_bin(), *self.jvm_opts,
                f"-Dlog4j2.configurationFile={self.log_dir / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={self.logs_dir}",
                "-cp", f"{self.libs}/*", main, *args]

    def _write_config(self) -> Path:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / "log4j2.properties").write_text(LOG4J2.format(logs=self.logs_dir))
        config = self.log_dir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.server_properties().items()))
        return config

    def _format(self, config: Path) -> None:
        """Format the log folder with Kafka's StorageTool (once: a formatted folder is kept)."""
        if (self.data_dir / "meta.properties").is_file():
            return
        scram = [arg for name, password in self.users.items()
                 for arg in ("--add-scram", scram_credential(self.mechanism, name, password))]
        done = subprocess.run(self._java("kafka.tools.StorageTool", "format", "--cluster-id", cluster_id(),
                                         "--config", str(config), "--ignore-formatted", *scram),
                              capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"formatting the Kafka log in {self.data_dir} failed "
                               f"(exit {done.returncode}): {done.stdout}{done.stderr}")

    def start(self) -> None:
        """Write the settings, format the log folder if new, start the JVM (not waiting for it)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"the Kafka broker at {self.bootstrap} is running already (pid {self.proc.pid})")
        if self.tls and not (self.tls_dir / "server.pem").is_file():
            write_tls_files(self.tls_dir)
        config = self._write_config()
        self._format(config)
        with open(self.logs_dir / "stdout.log", "ab") as out:
            self.proc = spawn_tied(self._java("kafka.Kafka", str(config)),
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def ready(self, timeout_s: float = 60.0) -> None:
        """Wait until the broker answers metadata requests; fails early, with its output, if the
        JVM exits. Polls the port first, so the Kafka client logs no connection errors."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"the Kafka broker exited (code {code}) before it was ready:\n"
                                   f"{_tail(self.logs_dir / 'stdout.log')}\n{_tail(self.logs_dir / 'server.log')}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the Kafka broker at {self.bootstrap} did not listen within {timeout_s}s") from None
                await asyncio.sleep(0.05)
        await wait_ready(self.connection() if self.security != "PLAINTEXT" else self.bootstrap,
                         max(1.0, deadline - time.monotonic()))

    def stop(self, deadline_s: float = 15.0) -> None:
        """SIGTERM (a controlled shutdown, measured well under a second), SIGKILL after
        `deadline_s`. The log folder is kept."""
        if self.proc is not None:
            stop(self.proc, deadline_s=deadline_s)

    def kill(self) -> None:
        """SIGKILL, as a crash: the next start recovers the log."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        """Stop the broker if it runs, and start it again on the same ports and log folder
        (await `ready()` after it)."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop, and remove the log folder if it is a temporary one this broker made."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    async def __aenter__(self) -> KafkaBroker:
        self.start()
        try:
            await self.ready()
        except BaseException:
            self.close()
            raise
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
