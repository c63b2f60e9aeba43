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
  summed over the plugins of each extension point.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from agents.scheduler.core import SchedulerCore


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


def registry_for(core: SchedulerCore) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SchedulerMetrics(core))
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
