"""The scheduler worker's Prometheus endpoint, scraped over HTTP while it schedules."""

from __future__ import annotations

import asyncio

import pytest

from schemas import topics
from schemas.records import Binding, NodeStateChange, SchedulingFeedback
from tests.builders import make_node, make_pod
from tests.integration.harness import Harness

pytestmark = pytest.mark.integration


async def scrape(port: int, path: str = "/metrics") -> tuple[str, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = (await reader.read()).decode()
    writer.close()
    head, _, body = raw.partition("\r\n\r\n")
    return head.split("\r\n", 1)[0], body


def value(body: str, prefix: str) -> float:
    [line] = [x for x in body.splitlines() if x.startswith(prefix)]
    return float(line.rsplit(" ", 1)[1])


async def test_metrics_count_attempts_and_plugin_time(harness: Harness, metrics_port: int, run_id: str) -> None:
    node = make_node(f"metrics-{run_id}", cpu=2000)
    await harness.publish(topics.NODES, [node])
    await harness.wait_for(NodeStateChange, lambda c: c.node == node.name)
    _, before = await scrape(metrics_port)
    fits, too_big = make_pod(f"m-fits-{run_id}", cpu=100), make_pod(f"m-big-{run_id}", cpu=10**9)
    profile = fits.scheduler_name
    scheduled = f'scheduler_schedule_attempts_total{{profile="{profile}",result="scheduled"}}'
    unschedulable = f'scheduler_schedule_attempts_total{{profile="{profile}",result="unschedulable"}}'
    start = {k: value(before, k) if k in before else 0.0 for k in (scheduled, unschedulable)}
    await harness.publish(topics.PODS, [fits, too_big])
    await harness.wait_for(Binding, lambda b: b.uid == fits.uid)
    await harness.wait_for(SchedulingFeedback, lambda f: f.uid == too_big.uid)
    status, body = await scrape(metrics_port)
    assert status == "HTTP/1.1 200 OK"
    assert value(body, scheduled) >= start[scheduled] + 1
    assert value(body, unschedulable) >= start[unschedulable] + 1
    fit = f'scheduler_plugin_execution_duration_seconds_count{{extension_point="Filter",plugin="NodeResourcesFit",profile="{profile}"}}'
    assert value(body, fit) > 0
    assert f'scheduler_framework_extension_point_duration_seconds_sum{{extension_point="Filter",profile="{profile}"}}' in body
    assert 'scheduler_pending_pods{queue="unschedulable"}' in body
    status, _ = await scrape(metrics_port, "/other")
    assert status == "HTTP/1.1 404 Not Found"
