"""The scheduler worker's Prometheus endpoint, under kube-scheduler's metric names.

`worker.metrics_port` (0: off) serves `GET /metrics` in the Prometheus text format from the
worker's own event loop (no thread: the scheduler's counters are read between two of its
batches). What is exported, read from the scheduler core at each scrape:

- `scheduler_schedule_attempts_total{result, profile}`: attempts by result (scheduled,
  unschedulable, error), as kube-scheduler counts them;
- `scheduler_pending_pods{queue}`: pods in the active, backoff and unschedulable queues;
- `scheduler_plugin_execution_duration_seconds{plugin, extension_point, profile}`: the time
  and the number of calls per plugin and extension point. kube-scheduler exports a histogram
  under this name; ours is a summary with its `_sum` and `_count` only: a call here covers a
  whole equivalence class or a whole node axis, so per-call buckets would not compare;
- `scheduler_framework_extension_point_duration_seconds{extension_point, profile}`: the same
  summed over the plugins of each extension point;
- `koordstream_replica_map_entries{map}`: what the scheduler replica keeps, map by map (pods
  tracked, decision keys, bound uids, requeues read ahead of their pods, gangs, assumptions,
  pods held until their partition is read, the starts of bound sandboxes the sandbox feedback
  learns lifetimes from).

A worker with the state role serves, on its own `worker.metrics_port`, what the owners and
deciders keep and write (the soak benchmark reads them, `perf/soak.py`):

- `koordstream_table_keys{table}`, `koordstream_table_entries{table}` (sandboxes at the pools, holds at the owners,
  pods at the deciders), `koordstream_table_bytes{table}` and `koordstream_table_sized_keys`
  (the values as last written by this worker, and how many keys that covers);
- `koordstream_changelog_bytes_total{table}`, `koordstream_changelog_records_total{table}`,
  `koordstream_table_deleted_keys_total{table}`;
- `koordstream_batches_total{agent}` and `koordstream_swept_keys_total{agent}` (keys applied
  with no records because they had something to forget);
- `koordstream_future_records_total{agent}`: records stamped further ahead of the worker's
  clock than `worker.max_clock_skew_s`, judged at that bound (a producer's clock runs ahead).

and what its warm pools keep (`agents.adapters.sandbox`), per pool (`namespace/name`) held here:

- `koordstream_sandbox_pool_sandboxes{pool, state}`: ready (the pool's depth), starting, claimed;
- `koordstream_sandbox_claims_total{pool, path}`: claims decided since the pool was created,
  by how (warm: a ready sandbox adopted at once; starting; cold; refused), and
  `koordstream_sandbox_warm_hit_ratio{pool}` (warm / all);
- `koordstream_sandbox_claim_latency_seconds{pool}`: a histogram of the claims this worker
  answered Ready, from the claim's publication to the log time of what decided it.

A worker with the rebalancer role serves what its rebalancer did (on the leader; a follower
counts nothing):

- `koordstream_rebalancer_leading` (1 on the leader);
- `koordstream_rebalancer_evictions_total{reason}` (FragmentationAware moves, ScaleDownBinPack
  victims);
- `koordstream_rebalancer_migrations_total{phase, reason}`: jobs finished (Succeeded, Aborted,
  Failed) and why; `koordstream_rebalancer_migrations_in_flight`;
- `koordstream_rebalancer_objective{profile, measure, when}`: the cluster objective (`std_sum`,
  `std_max`, `stranded_pct`) at each profile's last cycle (`now`) and as that cycle planned it
  (`planned`).

Every worker serves `koordstream_process_cpu_seconds_total` and
`koordstream_process_resident_bytes`, and where its consumers wait at offset gaps
(`streams.gaps`) `koordstream_offset_gaps_total{outcome=held|filled|accepted}`.
"""

from __future__ import annotations

import asyncio
import os
import resource
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from agents.adapters.loop import StatefulLoop
from agents.adapters.sandbox import LATENCY_BUCKETS, SandboxCore
from agents.rebalance.service import RebalancerService
from agents.scheduler.core import SchedulerCore
from streams import gaps


class ProcessMetrics(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from _process()


def _process() -> Iterator[Metric]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = CounterMetricFamily("koordstream_process_cpu_seconds", "CPU time of this worker process (user + system).")
    cpu.add_metric([], usage.ru_utime + usage.ru_stime)
    yield cpu
    rss = GaugeMetricFamily("koordstream_process_resident_bytes", "Resident memory of this worker process.")
    try:
        with open("/proc/self/statm") as f:
            rss.add_metric([], int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except OSError:
        rss.add_metric([], usage.ru_maxrss * 1024)
    yield rss
    guard = gaps.installed()
    if guard is not None:
        found = CounterMetricFamily("koordstream_offset_gaps", "Fetches this process's consumers stopped at an offset "
                                    "gap (held), gaps whose records came (filled), gaps read past after "
                                    "kafka.gap_wait_s (accepted).", labels=["outcome"])
        for outcome, count in (("held", guard.held), ("filled", guard.filled), ("accepted", guard.accepted)):
            found.add_metric([outcome], count)
        yield found


class SchedulerMetrics(Collector):
    def __init__(self, core: SchedulerCore) -> None:
        self.core = core

    def collect(self) -> Iterator[Metric]:
        attempts = CounterMetricFamily("scheduler_schedule_attempts", "Number of attempts to schedule pods, by the "
                                       "result.", labels=["result", "profile"])
        for (profile, result), count in sorted(self.core.attempts.items()):
            attempts.add_metric([result, profile], count)
        yield attempts
        pending = GaugeMetricFamily("scheduler_pending_pods", "Number of pending pods, by the queue type.",
                                    labels=["queue"])
        for queue, count in sorted(self.core.queue.counts().items()):
            pending.add_metric([queue], count)
        yield pending
        plugins = SummaryMetricFamily("scheduler_plugin_execution_duration_seconds", "Duration for running a plugin "
                                      "at a specific extension point.", labels=["plugin", "extension_point", "profile"])
        points = SummaryMetricFamily("scheduler_framework_extension_point_duration_seconds", "Latency for running all "
                                     "plugins of a specific extension point.", labels=["extension_point", "profile"])
        for name, fw in sorted(self.core.frameworks.items()):
            per_point: dict[str, list[int]] = defaultdict(lambda: [0, 0])
            for (plugin, point), ns in sorted(dict(fw.timings).items()):
                calls = fw.calls.get((plugin, point), 0)
                plugins.add_metric([plugin, point, name], count_value=calls, sum_value=ns / 1e9)
                per_point[point][0] += calls
                per_point[point][1] += ns
            for point, (calls, ns) in sorted(per_point.items()):
                points.add_metric([point, name], count_value=calls, sum_value=ns / 1e9)
        yield plugins
        yield points
        maps = GaugeMetricFamily("koordstream_replica_map_entries", "Entries the scheduler replica keeps, by map.",
                                 labels=["map"])
        for name, count in sorted(self.core.map_sizes().items()):
            maps.add_metric([name], count)
        yield maps


class StateMetrics(Collector):
    """What the owners' and deciders' loops keep and write (see the module docstring)."""

    def __init__(self, loops: list[StatefulLoop]) -> None:
        self.loops = loops

    def collect(self) -> Iterator[Metric]:
        def family(kind: type[Any], name: str, text: str, label: str) -> Any:
            return kind(name, text, labels=[label])

        keys = family(GaugeMetricFamily, "koordstream_table_keys", "Keys in the table held here.", "table")
        entries = family(GaugeMetricFamily, "koordstream_table_entries",
                         "Holds (owners), pods (deciders) or sandboxes (pools) in the table held here.", "table")
        stored = family(GaugeMetricFamily, "koordstream_table_bytes",
                        "Bytes of the table's values as last written here.", "table")
        sized = family(GaugeMetricFamily, "koordstream_table_sized_keys",
                       "Keys that koordstream_table_bytes covers.", "table")
        written = family(CounterMetricFamily, "koordstream_changelog_bytes", "Changelog bytes written.", "table")
        records = family(CounterMetricFamily, "koordstream_changelog_records", "Changelog records written.", "table")
        deleted = family(CounterMetricFamily, "koordstream_table_deleted_keys", "Keys forgotten (tombstones).", "table")
        batches = family(CounterMetricFamily, "koordstream_batches", "Micro-batches processed.", "agent")
        swept = family(CounterMetricFamily, "koordstream_swept_keys", "Keys applied with no records.", "agent")
        future = family(CounterMetricFamily, "koordstream_future_records", "Records stamped further ahead of the "
                        "worker's clock than worker.max_clock_skew_s, judged at that bound.", "agent")
        for loop in self.loops:
            table = loop.table
            name = table.table.name
            states = [state for _, state in table.states()]
            keys.add_metric([name], len(states))
            entries.add_metric([name], sum(len(st.get("holds") or st.get("pods") or st.get("sandboxes") or ())
                                             for st in states))
            stored.add_metric([name], table.stored_bytes())
            sized.add_metric([name], table.sized_keys())
            written.add_metric([name], table.written_bytes)
            records.add_metric([name], table.written_records)
            deleted.add_metric([name], table.deleted_keys)
            batches.add_metric([loop.name], loop.batches)
            swept.add_metric([loop.name], loop.swept)
            future.add_metric([loop.name], loop.future)
        yield from (keys, entries, stored, sized, written, records, deleted, batches, swept, future)


class SandboxMetrics(Collector):
    """The warm pools' depth, decisions and claim latency (see the module docstring)."""

    def __init__(self, loop: StatefulLoop, core: SandboxCore) -> None:
        self.loop, self.core = loop, core

    def collect(self) -> Iterator[Metric]:
        held = GaugeMetricFamily("koordstream_sandbox_pool_sandboxes", "A pool's sandboxes by state.",
                                 labels=["pool", "state"])
        claims = CounterMetricFamily("koordstream_sandbox_claims", "Claims decided, by path.", labels=["pool", "path"])
        ratio = GaugeMetricFamily("koordstream_sandbox_warm_hit_ratio", "Claims that adopted a ready sandbox at once, "
                                  "of all decided.", labels=["pool"])
        for key, raw in self.loop.table.states():
            states = [str(s.get("state")) for s in (raw.get("sandboxes") or {}).values()]
            for state in ("ready", "starting", "claimed"):
                held.add_metric([key, state], states.count(state))
            stats = raw.get("stats") or {}
            for path, stat in (("warm", "warm_hits"), ("starting", "starting_hits"), ("cold", "cold"),
                               ("refused", "refused")):
                claims.add_metric([key, path], int(stats.get(stat, 0)))
            if stats.get("claims"):
                ratio.add_metric([key], int(stats.get("warm_hits", 0)) / int(stats["claims"]))
        latency = HistogramMetricFamily("koordstream_sandbox_claim_latency_seconds",
                                        "Claims answered Ready here: publication to decision.", labels=["pool"])
        for key, (counts, total) in self.core.latency.items():
            cumulative, buckets = 0, []
            for bound, count in zip([*map(str, LATENCY_BUCKETS), "+Inf"], counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            latency.add_metric([key], buckets, total)
        yield from (held, claims, ratio, latency)


class RebalancerMetrics(Collector):
    def __init__(self, service: RebalancerService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        s = self.service
        leading = GaugeMetricFamily("koordstream_rebalancer_leading", "1 when this worker's rebalancer leads.")
        leading.add_metric([], 1.0 if s.leading else 0.0)
        evictions = CounterMetricFamily("koordstream_rebalancer_evictions", "Evictions sent, by reason.",
                                        labels=["reason"])
        for reason, count in sorted(s.evictions.items()):
            evictions.add_metric([reason], count)
        finished = CounterMetricFamily("koordstream_rebalancer_migrations", "Migration jobs finished, by phase "
                                       "and reason.", labels=["phase", "reason"])
        for (phase, reason), count in sorted(s.finished.items()):
            finished.add_metric([phase, reason], count)
        running = GaugeMetricFamily("koordstream_rebalancer_migrations_in_flight", "Migration jobs not finished.")
        running.add_metric([], len(s.active))
        objective = GaugeMetricFamily("koordstream_rebalancer_objective", "The cluster objective at a profile's "
                                      "last cycle (now) and as it planned it (planned).",
                                      labels=["profile", "measure", "when"])
        for profile, pair in sorted(s.objective.items()):
            for when, measured in zip(("now", "planned"), pair, strict=True):
                for measure, value in measured.as_dict().items():
                    objective.add_metric([profile, measure, when], value)
        yield from (leading, evictions, finished, running, objective)


def registry_for(core: SchedulerCore | None = None, loops: list[StatefulLoop] | None = None,
                 rebalancer: RebalancerService | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    if core is not None:
        registry.register(SchedulerMetrics(core))
    if loops:
        registry.register(StateMetrics(loops))
        for loop in loops:
            if isinstance(loop.core, SandboxCore):
                registry.register(SandboxMetrics(loop, loop.core))
    if rebalancer is not None:
        registry.register(RebalancerMetrics(rebalancer))
    registry.register(ProcessMetrics())
    return registry


async def serve_metrics(registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> asyncio.Server:
    """Serve `GET /metrics` on host:port (any other path: 404). One request per connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = (await reader.readline()).split()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # headers
            path = request[1].split(b"?", 1)[0] if len(request) > 1 else b""
            if request[:1] == [b"GET"] and path == b"/metrics":
                status, kind, body = b"200 OK", CONTENT_TYPE_LATEST.encode(), generate_latest(registry)
            else:
                status, kind, body = b"404 Not Found", b"text/plain", b"only GET /metrics is served here\n"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind + b"\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
