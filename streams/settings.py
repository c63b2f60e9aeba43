"""One root settings object, built from grouped sections, validated once at start-up.

Sources, later wins: defaults, an optional YAML file (sections as top-level keys), then
environment variables `KOORDSTREAM_<SECTION>_<FIELD>` (e.g. `KOORDSTREAM_KAFKA_BOOTSTRAP`).
Errors name the source, the field and the value, and say what is expected.

Secrets (`kafka.sasl_password`, `kafka.ssl_key_password`) are `schemas.secret.Secret`s: a
dump, a repr or an error shows `***`, never the value. They come from the environment or from
a file of their own (`kafka.sasl_password_file`, `kafka.ssl_key_password_file`); written in
the settings file itself they are refused unless that file also sets
`kafka.inline_secrets: true`. `streams.connection` turns the kafka section into what every
Kafka client is given.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agents.sandbox.runtimes import DEFAULT_RUNTIMES, RuntimeTable, load_runtimes
from schemas.secret import Secret


class SettingsError(ValueError):
    pass


ROLES = ("scheduler", "state", "rebalancer", "bridge")
TRANSACTIONS = ("auto", "on", "off")  # also the choices of kafka.contiguous_offsets
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SYSTEM_CA = "system"  # kafka.ssl_cafile: trust the system's certificate store
SECRET_FIELDS = ("sasl_password", "ssl_key_password")  # of the kafka section


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap: str = ""
    """host:port of a Kafka-protocol broker; empty starts the embedded Tansu broker."""
    app_id: str = "koordstream"
    """Consumer-group and table prefix of the agents."""
    partitions: int = 4
    """Partitions of every topic (fixed at creation; co-partitioned topics must agree)."""
    rebalance_timeout_s: float = 10.0
    """Group rebalance timeout."""
    session_timeout_s: float = 6.0
    """Consumer session timeout. The embedded broker answers a group's first join after half
    of it (measured: 15 s at 30 s, 3 s at 6 s); 6 s is the least a real Kafka accepts by
    default (group.min.session.timeout.ms). Heartbeats run beside the agents' batches."""
    fetch_max_wait_ms: int = 20
    """Longest a consumer fetch waits for data (the embedded broker always waits this long)."""
    transactions: str = "auto"
    """Owners and deciders process each micro-batch as one Kafka transaction per input
    partition (outputs, changelog writes and input offsets together): `on`, `off`, or `auto`
    (on when the broker accepts InitProducerId, as Apache Kafka does; the embedded Tansu
    broker refuses it)."""
    contiguous_offsets: str = "auto"
    """Consumers stop at a gap in a partition's offsets and fetch it again until its records
    appear (`streams.gaps`): the embedded Tansu broker can serve a later write before an
    earlier one to the same partition is visible, and a consumer would read past it for good.
    `on`, `off`, or `auto` (on when the broker refuses InitProducerId, as Tansu does: without
    transactions or compaction every offset holds a record, so a gap is a write in flight)."""
    record_batches: bool = True
    """Write each run of records of one kind in a message as one `Batch` record (schema 1.1:
    the fields every member shares once, then each member's own), which workers and readers
    before 1.1 do not know. Off while any of them still reads the topics (README, "Upgrading")."""
    gap_wait_s: float = 5.0
    """How long a consumer waits for a gap's records before it reads past them (a warning
    names them); measured on Tansu, gaps filled within 30 ms."""
    security_protocol: str = "PLAINTEXT"
    """How every client talks to the broker: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT (a SASL
    login without TLS) or SASL_SSL (a SASL login over TLS)."""
    sasl_mechanism: str = ""
    """The SASL mechanism of SASL_PLAINTEXT and SASL_SSL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."""
    sasl_username: str = ""
    """The SASL user name."""
    sasl_password: Secret = Secret()
    """The SASL password, best from the environment (KOORDSTREAM_KAFKA_SASL_PASSWORD); in the
    settings file only with `inline_secrets`. Never printed."""
    sasl_password_file: str = ""
    """A file whose content is the SASL password (one trailing newline is dropped); instead of
    `sasl_password`."""
    ssl_cafile: str = ""
    """The PEM file of the CA certificates that signed the broker's certificate (SSL and
    SASL_SSL), or `system` for the system's trust store."""
    ssl_certfile: str = ""
    """The client's certificate (PEM) for brokers that authenticate clients by TLS; it may
    hold the private key too."""
    ssl_keyfile: str = ""
    """The client certificate's private key (PEM), when not in `ssl_certfile`."""
    ssl_key_password: Secret = Secret()
    """The passphrase of an encrypted client key, best from the environment
    (KOORDSTREAM_KAFKA_SSL_KEY_PASSWORD); in the settings file only with `inline_secrets`."""
    ssl_key_password_file: str = ""
    """A file whose content is the client key's passphrase; instead of `ssl_key_password`."""
    ssl_check_hostname: bool = True
    """Check that the broker's certificate names the host in `bootstrap` (turn off only for
    brokers reached by an address their certificate does not name)."""
    inline_secrets: bool = False
    """Accept `sasl_password` and `ssl_key_password` written in the settings file itself."""

    def sasl_secret(self) -> Secret:
        """The SASL password, from `sasl_password` or `sasl_password_file`."""
        return _secret(self.sasl_password, self.sasl_password_file, "kafka.sasl_password_file")

    def ssl_key_secret(self) -> Secret | None:
        """The client key's passphrase, from `ssl_key_password` or `ssl_key_password_file`;
        None when neither is set."""
        secret = _secret(self.ssl_key_password, self.ssl_key_password_file, "kafka.ssl_key_password_file")
        return secret or None

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")


@dataclass(frozen=True)
class SchedulingSettings:
    batch_size: int = 1000
    """Most records an agent takes from its stream in one micro-batch."""
    batch_within_s: float = 0.01
    """Longest an agent waits to fill a micro-batch."""
    cycle_linger_s: float = 0.05
    """When fewer than `batch_size` pods are queued, the scheduling loop waits this long before
    a cycle, so that the intake gathers more: a cycle's cost is mostly per equivalence class,
    not per pod (in-process, mixed-100k's pods cost 1.3 ms each placed 20 at a time, 0.3 ms
    500 at a time). 0: a cycle as soon as a pod is ready."""
    backoff_initial_s: float = 0.01
    """First retry delay of a requeued pod; doubles per attempt."""
    backoff_max_s: float = 1.0
    """Longest retry delay of a requeued pod."""
    resources: tuple[str, ...] = ()
    """Extra extended resource names the scheduler indexes, beyond the built-in ones."""
    profiles: str = ""
    """Path of a KubeSchedulerConfiguration-like YAML with the scheduler profiles; empty: the
    default plugins under the names `default-scheduler` and `koordstream`. The state role reads
    it too: the deciders keep a ledger per elastic quota tree of its ElasticQuota args and
    commit a pod with a quota only within every max (`agents.state.quotas`)."""
    unschedulable_flush_s: float = 30.0
    """A pod that fits nowhere is retried after this long even without a cluster event."""
    equivalence_batching: bool = True
    """Place consecutive pods with equal scheduling signatures as one class."""
    gather_classes: bool = True
    """Within one micro-batch of ready pods, bring pods with equal signatures (so of equal
    priority) together at the place of the first of them before placing, so that one class
    serves them all; off: only pods that are already consecutive in the queue batch."""
    max_outstanding_claims: int = 10_000
    """Claims a scheduler replica has out and not yet decided (held ones included), at
    most: past it the loop places nothing until outcomes come back, so that an overloaded
    pipeline queues pods here instead of piling up holds that grow too old to be accepted
    (a claim older than half of `worker.state_retention_s` is refused and placed again). 0:
    no limit."""
    nomination_ttl_s: float = 300.0
    """A preemption's nomination (capacity promised to the preemptor on a node, counted
    against lower-priority claims there) lapses this long after its owner recorded it, unless
    its pod was bound, deleted or nominated again before: a preemptor that is never bound, or a
    late copy of a cleared Nomination, does not keep the capacity promised for ever. Longer than
    the victims' graceful termination and the preemptor's retry."""
    commit_input_offsets: bool = True
    """Commit the offsets of `pods` / `requeue` before which the scheduler needs no record, so
    that a restarted or new replica reads what is pending, not the history. Off: every restart
    reads both topics from their start (O(history))."""


@dataclass(frozen=True)
class WorkerSettings:
    roles: tuple[str, ...] = ("scheduler", "state")
    """Agents this worker runs: `scheduler` (queue, placement, replica), `state` (node owners
    and deciders, with their tables) and `rebalancer` (fragmentation-aware moves and scale-down
    ranks; one worker of those that run it leads). Run them apart to use more cores."""
    loglevel: str = "warn"
    """faust log level: crit, error, warn, info or debug."""
    gc_threshold: int = 50_000
    """Allocations between two young-generation collections of Python's cyclic GC (Python's
    default is 700). Scheduling allocates a few short-lived records per pod; at the default the
    collector took a fifth of the scheduler's time in `koordstream bench basic --identical`.
    0 keeps Python's default."""
    gc_freeze_s: float = 1.0
    """Every this many seconds, what the worker's objects survived so far leaves the garbage
    collector's sight (`gc.freeze`: its passes then see only what is newer, instead of walking
    the tables' millions of objects, 1.35 s for a full pass in mixed-100k); see
    `streams.process.GcPacer`. 0: Python's own pacing."""
    gc_full_s: float = 3600.0
    """With `gc_freeze_s`: every this many seconds, one full collection over everything (frees
    the garbage cycles formed while frozen; it pauses the worker as long as a full pass does).
    0: never."""
    metrics_port: int = 0
    """Port of the worker's Prometheus endpoint (`GET /metrics`: kube-scheduler's metric names for
    the scheduler role, the stateful agents' loops and the rebalancer's; see streams/metrics.py);
    0: no endpoint."""
    state_dir: str = ""
    """Folder for the worker's faust data (faust's `<group>-data` goes inside it). Empty: a new
    folder under the system's temporary directory, removed when the worker exits, so workers
    started from any directory, several on one host, never share one. The tables live in
    memory and in their changelogs: nothing there is needed after a restart. Give each worker
    of a host its own folder when you set it."""
    state_retention_s: float = 600.0
    """How long owners and deciders keep what a finished pod leaves (a released, rejected or
    terminated hold, a tombstone, a deleted pod's decisions), in log time. Claims older than
    half of it are refused (docs/architecture.md, "How long state is kept"). It must be far
    longer than a consumer session, a restore and the producers' delivery timeout, and longer
    than twice the clock difference between hosts."""
    max_clock_skew_s: float = 0.0
    """How far ahead of a state worker's clock a record's log time is believed: a record stamped
    further ahead (a producer whose clock runs ahead) is judged at that bound, with a warning
    (docs/architecture.md, "How time enters"). 0: a tenth of `state_retention_s` (60 s at the
    default). At most a quarter of `state_retention_s`: claims are refused at half of it."""
    shutdown_deadline_s: float = 4.0
    """After SIGTERM/SIGINT the worker process exits at the latest after this long.

    faust's consumer thread does not finish stopping against the embedded broker; by then the
    agents have stopped and every output is acknowledged, so what a forced exit loses is at
    most an offset commit, and the replay that follows re-sends, never re-decides."""


    def clock_skew_s(self) -> float:
        """`max_clock_skew_s`, its default resolved."""
        return self.max_clock_skew_s or self.state_retention_s / 10


@dataclass(frozen=True)
class RebalancerSettings:
    config: str = ""
    """Path of a DeschedulerConfiguration-like YAML (`deschedulingInterval`, profiles with
    FragmentationAware / ScaleDownBinPack and their args; docs/rebalancer.md); empty: one
    profile with both plugins (FragmentationAware in its `global` mode, ScaleDownBinPack), every
    60 s."""
    tick_s: float = 0.2
    """How often the leader looks at its jobs (ttl, evictions to send) between cycles."""


@dataclass(frozen=True)
class BridgeSettings:
    kubeconfig: str = ""
    """The kubeconfig the bridge talks to the API server with; empty: `$KUBECONFIG`, else
    `~/.kube/config`; `in-cluster`: the pod's service account."""
    context: str = ""
    """The kubeconfig context; empty: its current context."""
    scheduler_names: tuple[str, ...] = ()
    """Pods whose `schedulerName` is one of these are scheduled by koordstream; empty: every
    profile of `scheduling.profiles` (without one, `koordstream`) but `default-scheduler`."""
    qps: float = 200.0
    """Requests a second to the API server, on average (client-go's --kube-api-qps); 0: no limit."""
    burst: int = 400
    """Requests the bridge may send at once above `qps` (client-go's --kube-api-burst)."""
    concurrency: int = 64
    """API requests in flight at most (bindings, evictions, status writes together)."""
    lease_namespace: str = "kube-system"
    """Namespace of the Lease the bridges elect their leader with."""
    lease_name: str = "koordstream-bridge"
    """Name of that Lease."""
    lease_duration_s: float = 15.0
    """How long a leader's Lease holds without renewal before another bridge may take it."""
    renew_deadline_s: float = 10.0
    """A leader that could not renew its Lease for this long stops leading (less than
    `lease_duration_s`, so it stops before another may take over)."""
    retry_s: float = 2.0
    """How often a leader renews, and a candidate tries, the Lease."""
    eviction_retry_s: float = 60.0
    """How long an eviction refused with 429 (a PodDisruptionBudget) is tried again before it
    is reported refused (`EvictionRefused`), which ends the rebalancer's job."""
    events: bool = True
    """Write a FailedScheduling Event for each new reason a pod cannot be scheduled."""
    watch_timeout_s: int = 300
    """How long one watch request lasts before it is renewed (from the last resourceVersion)."""
    identity: str = ""
    """This bridge's name in the Lease; empty: host name and process id."""


@dataclass(frozen=True)
class SandboxSettings:
    runtimes: str = ""
    """Path of a YAML (or JSON) file of `node.k8s.io/v1` RuntimeClass manifests, each with its
    Koordinator QoS rule in the annotations `koordstream.io/qos-classes` (allowed, comma-separated)
    and `koordstream.io/default-qos-class`; they add to the shipped runtimes (gvisor, kata-qemu,
    kata-fc, kata-clh, wasmtime, spin) and replace one of the same name. Every scheduler worker
    reads it at start (`agents.sandbox.runtimes`). Empty: the shipped runtimes only."""
    default_runtimes: bool = True
    """Start from the shipped runtimes; false: only those of `runtimes`."""
    pools: str = ""
    """Path of a YAML file of agent-sandbox manifests (SandboxTemplates and the
    SandboxWarmPools that use them) that `koordstream up` publishes to `sandbox` once the topics
    exist; a pool published again is an update. Empty: none."""


@dataclass(frozen=True)
class Settings:
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    scheduling: SchedulingSettings = field(default_factory=SchedulingSettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    rebalancer: RebalancerSettings = field(default_factory=RebalancerSettings)
    bridge: BridgeSettings = field(default_factory=BridgeSettings)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)

    def validate(self) -> Settings:
        if self.kafka.partitions < 1:
            raise SettingsError(f"kafka.partitions: must be at least 1, got {self.kafka.partitions}")
        if self.kafka.transactions not in TRANSACTIONS:
            raise SettingsError(f"kafka.transactions: must be auto, on or off, got {self.kafka.transactions!r}")
        if self.kafka.contiguous_offsets not in TRANSACTIONS:
            raise SettingsError(f"kafka.contiguous_offsets: must be auto, on or off, "
                                f"got {self.kafka.contiguous_offsets!r}")
        if not 0 < self.kafka.gap_wait_s <= 600:
            raise SettingsError(f"kafka.gap_wait_s: must be from 0 to 600 seconds (more than 0), "
                                f"got {self.kafka.gap_wait_s}")
        _validate_security(self.kafka)
        if self.scheduling.batch_size < 1:
            raise SettingsError(f"scheduling.batch_size: must be at least 1, got {self.scheduling.batch_size}")
        if self.scheduling.max_outstanding_claims < 0:
            raise SettingsError(f"scheduling.max_outstanding_claims: must be 0 (no limit) or more, "
                                f"got {self.scheduling.max_outstanding_claims}")
        if not 0 <= self.scheduling.cycle_linger_s <= 1:
            raise SettingsError(f"scheduling.cycle_linger_s: must be from 0 to 1 second, got {self.scheduling.cycle_linger_s}")
        if not self.scheduling.nomination_ttl_s > 0:
            raise SettingsError(f"scheduling.nomination_ttl_s: must be a positive number of seconds, "
                                f"got {self.scheduling.nomination_ttl_s}")
        b = self.bridge
        if b.qps < 0 or b.burst < 1 or b.concurrency < 1:
            raise SettingsError(f"bridge.qps, bridge.burst, bridge.concurrency: must be 0 or more, at least 1 and at "
                                f"least 1, got {b.qps}, {b.burst}, {b.concurrency}")
        if not 0 < b.retry_s < b.renew_deadline_s < b.lease_duration_s:
            raise SettingsError(f"bridge.retry_s < bridge.renew_deadline_s < bridge.lease_duration_s: must hold (a "
                                f"leader stops before another may take over), got {b.retry_s}, {b.renew_deadline_s}, "
                                f"{b.lease_duration_s}")
        if b.eviction_retry_s < 0 or b.watch_timeout_s < 1:
            raise SettingsError(f"bridge.eviction_retry_s, bridge.watch_timeout_s: must be 0 or more and at least 1, "
                                f"got {b.eviction_retry_s}, {b.watch_timeout_s}")
        if not self.worker.state_retention_s > 0:
            raise SettingsError(f"worker.state_retention_s: must be a positive number of seconds, "
                                f"got {self.worker.state_retention_s}")
        skew = self.worker.max_clock_skew_s
        if not 0 <= skew <= self.worker.state_retention_s / 4:
            raise SettingsError(f"worker.max_clock_skew_s: must be 0 (a tenth of worker.state_retention_s) or a "
                                f"positive number of seconds up to a quarter of worker.state_retention_s "
                                f"({self.worker.state_retention_s / 4:g}), got {skew}")
        unknown = set(self.worker.roles) - set(ROLES)
        if unknown or not self.worker.roles:
            raise SettingsError(f"worker.roles: choose from {', '.join(ROLES)}, got {list(self.worker.roles)!r}")
        if not 0.01 <= self.rebalancer.tick_s <= 60:
            raise SettingsError(f"rebalancer.tick_s: must be from 0.01 to 60 seconds, got {self.rebalancer.tick_s}")
        freeze, full = self.worker.gc_freeze_s, self.worker.gc_full_s
        if not (freeze == 0 or 0.1 <= freeze <= 3600) or not (full == 0 or 1 <= full <= 30 * 86400):
            raise SettingsError(f"worker.gc_freeze_s, worker.gc_full_s: must be 0 (off) or from 0.1 to 3600 "
                                f"seconds, and 0 (never) or from 1 second to 30 days, got {freeze}, {full}")
        if not 0 <= self.worker.metrics_port <= 65535:
            raise SettingsError(f"worker.metrics_port: must be a port number (0: off), got {self.worker.metrics_port}")
        if self.worker.loglevel not in ("crit", "error", "warn", "info", "debug"):
            raise SettingsError(f"worker.loglevel: must be crit, error, warn, info or debug, got {self.worker.loglevel!r}")
        runtime_table(self)  # a runtimes file that cannot be read or used stops the start here
        return self


def runtime_table(settings: Settings) -> RuntimeTable:
    """The runtime classes every scheduler worker admits pods through (`sandbox.runtimes`,
    `sandbox.default_runtimes`); raises SettingsError naming the file, field and value."""
    s = settings.sandbox
    if not s.runtimes:
        return RuntimeTable(DEFAULT_RUNTIMES if s.default_runtimes else ())
    try:
        text = Path(s.runtimes).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"sandbox.runtimes: cannot read {s.runtimes!r}: {exc}") from None
    try:
        return load_runtimes(text, defaults=s.default_runtimes)
    except ValueError as exc:
        raise SettingsError(f"sandbox.runtimes: {s.runtimes}: {exc}") from None


def dump(settings: Settings) -> dict[str, dict[str, Any]]:
    """The settings as plain data, section by section (`koordstream config`): secrets as `***`
    (empty when unset), tuples as lists."""
    out: dict[str, dict[str, Any]] = {}
    for section in dataclasses.fields(settings):
        values = getattr(settings, section.name)
        out[section.name] = {}
        for f in dataclasses.fields(values):
            value = getattr(values, f.name)
            out[section.name][f.name] = str(value) if isinstance(value, Secret) else \
                list(value) if isinstance(value, tuple) else value
    return out


def _secret(inline: Secret, path: str, field_name: str) -> Secret:
    if not path:
        return inline
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"{field_name}: cannot read {path!r}: {exc.strerror or type(exc).__name__}") from None
    except UnicodeDecodeError:
        raise SettingsError(f"{field_name}: {path!r} is not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r")  # the line end an editor or `echo` adds
    return Secret(text)


def _readable(field_name: str, path: str) -> None:
    if not Path(path).expanduser().is_file():
        raise SettingsError(f"{field_name}: no such file: {path!r}")


def _validate_security(k: KafkaSettings) -> None:
    """The security fields agree with `kafka.security_protocol`; files they name are there."""
    protocol = k.security_protocol
    if protocol not in SECURITY_PROTOCOLS:
        raise SettingsError(f"kafka.security_protocol: must be {', '.join(SECURITY_PROTOCOLS[:-1])} or "
                            f"{SECURITY_PROTOCOLS[-1]}, got {protocol!r}")
    sasl_set = [name for name in ("sasl_mechanism", "sasl_username", "sasl_password", "sasl_password_file")
                if getattr(k, name)]
    if sasl_set and not k.uses_sasl:
        raise SettingsError(f"kafka.{sasl_set[0]}: is set, but kafka.security_protocol={protocol} logs in without "
                            "SASL: use SASL_PLAINTEXT or SASL_SSL, or remove it")
    if k.uses_sasl:
        if k.sasl_mechanism not in SASL_MECHANISMS:
            raise SettingsError(f"kafka.sasl_mechanism: kafka.security_protocol={protocol} needs one of "
                                f"{', '.join(SASL_MECHANISMS)}, got {k.sasl_mechanism!r}")
        if not k.sasl_username:
            raise SettingsError(f"kafka.sasl_username: kafka.security_protocol={protocol} needs a user name")
        if k.sasl_password and k.sasl_password_file:
            raise SettingsError("kafka.sasl_password, kafka.sasl_password_file: both are set; give the password "
                                "one way")
        if not k.sasl_password and not k.sasl_password_file:
            raise SettingsError(f"kafka.sasl_password_file: kafka.security_protocol={protocol} needs a password: "
                                "a file that holds it (kafka.sasl_password_file), or the environment variable "
                                "KOORDSTREAM_KAFKA_SASL_PASSWORD")
        if not k.sasl_secret():
            raise SettingsError(f"kafka.sasl_password_file: {k.sasl_password_file!r} is empty")
    tls_set = [name for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_key_password",
                                 "ssl_key_password_file") if getattr(k, name)]
    if tls_set and not k.uses_tls:
        raise SettingsError(f"kafka.{tls_set[0]}: is set, but kafka.security_protocol={protocol} does not use TLS: "
                            "use SSL or SASL_SSL, or remove it")
    if not k.uses_tls:
        return
    if not k.ssl_cafile:
        raise SettingsError(f"kafka.ssl_cafile: kafka.security_protocol={protocol} needs the CA certificates that "
                            f"signed the broker's certificate (a PEM file), or {SYSTEM_CA!r} for the system's "
                            "trust store")
    if k.ssl_cafile != SYSTEM_CA:
        _readable("kafka.ssl_cafile", k.ssl_cafile)
    if k.ssl_keyfile and not k.ssl_certfile:
        raise SettingsError(f"kafka.ssl_keyfile: is set ({k.ssl_keyfile!r}) without kafka.ssl_certfile, the "
                            "client certificate it belongs to")
    if (k.ssl_key_password or k.ssl_key_password_file) and not k.ssl_certfile:
        raise SettingsError("kafka.ssl_key_password: a key passphrase is set without kafka.ssl_certfile, the "
                            "client certificate whose key it opens")
    if k.ssl_key_password and k.ssl_key_password_file:
        raise SettingsError("kafka.ssl_key_password, kafka.ssl_key_password_file: both are set; give the "
                            "passphrase one way")
    for name in ("ssl_certfile", "ssl_keyfile", "ssl_key_password_file"):
        if getattr(k, name):
            _readable(f"kafka.{name}", getattr(k, name))


def _coerce(section: str, name: str, current: Any, raw: Any, source: str) -> Any:
    if isinstance(current, Secret):  # never part of a message: it cannot be wrong anyway
        return raw if isinstance(raw, Secret) else Secret(str(raw))
    try:
        if isinstance(current, bool):
            if isinstance(raw, str):
                if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError(raw)
                return raw.lower() in ("1", "true", "yes")
            return bool(raw)
        if isinstance(current, tuple):
            return tuple(raw.split(",")) if isinstance(raw, str) else tuple(raw)
        return type(current)(raw)
    except (TypeError, ValueError) as exc:
        raise SettingsError(
            f"{source}: {section}.{name} = {raw!r} is not a valid {type(current).__name__}"
        ) from exc


def _apply(settings: Settings, overrides: Mapping[str, Mapping[str, Any]], source: str) -> Settings:
    sections: dict[str, Any] = {}
    for section_name, values in overrides.items():
        section = getattr(settings, section_name, None)
        if section is None or not dataclasses.is_dataclass(section):
            known = ", ".join(f.name for f in dataclasses.fields(settings))
            raise SettingsError(f"{source}: unknown section {section_name!r} (known: {known})")
        if not isinstance(values, Mapping):
            raise SettingsError(f"{source}: section {section_name!r} must be a mapping")
        changes = {}
        names = {f.name for f in dataclasses.fields(section)}
        for name, raw in values.items():
            if name not in names:
                raise SettingsError(f"{source}: unknown field {section_name}.{name} (known: {', '.join(sorted(names))})")
            changes[name] = _coerce(section_name, name, getattr(section, name), raw, source)
        sections[section_name] = dataclasses.replace(section, **changes)  # type: ignore[type-var]
    return dataclasses.replace(settings, **sections)


def load_settings(path: str | Path | None = None, env: Mapping[str, str] | None = None,
                  **overrides: Mapping[str, Any]) -> Settings:
    settings = Settings()
    inline: list[str] = []
    if path:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(raw, dict):
            raise SettingsError(f"{path}: the settings file must be a mapping of sections")
        settings = _apply(settings, raw, str(path))
        kafka = raw.get("kafka")
        inline = [name for name in SECRET_FIELDS if isinstance(kafka, Mapping) and kafka.get(name)]
    env = os.environ if env is None else env
    from_env: dict[str, dict[str, str]] = {}
    for f in dataclasses.fields(settings):
        for g in dataclasses.fields(getattr(settings, f.name)):
            value = env.get(f"KOORDSTREAM_{f.name}_{g.name}".upper())
            if value is not None:
                from_env.setdefault(f.name, {})[g.name] = value
    settings = _apply(settings, from_env, "environment")
    settings = _apply(settings, {k: v for k, v in overrides.items() if v}, "arguments")
    if inline and not settings.kafka.inline_secrets:
        name = inline[0]
        raise SettingsError(f"{path}: kafka.{name} is written in the settings file: give it in the environment "
                            f"(KOORDSTREAM_KAFKA_{name.upper()}) or in a file of its own (kafka.{name}_file), or "
                            "set kafka.inline_secrets: true to keep it there")
    return settings.validate()
