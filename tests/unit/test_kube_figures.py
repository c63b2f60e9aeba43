"""The figures of a perf run on real Kwok, from what the API server and the machine say
(`perf.kube_figures`), and the Stage resources a control plane gets (`stage_set`): table-driven,
no cluster."""

from __future__ import annotations

from typing import Any

import pytest

from perf import kube_figures as kf
from streams.kube_cluster import stage_set


def pod(created: str, scheduled: str | None, node: str = "n1", status: str = "True") -> dict[str, Any]:
    conditions = [{"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-07T00:00:09Z"}]
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", "status": status, "lastTransitionTime": scheduled})
    return {"metadata": {"creationTimestamp": created}, "spec": {"nodeName": node} if node else {},
            "status": {"conditions": conditions}}


@pytest.mark.parametrize(("pods", "expected"), [
    ([pod("2026-12-07T00:00:01Z", "2026-12-07T00:00:01Z")], [0.0]),
    ([pod("2026-12-07T00:00:01Z", "2026-12-07T00:00:03Z")], [2000.0]),
    ([pod("2026-12-07T23:59:59Z", "2026-12-08T00:00:00Z")], [1000.0]),
    ([pod("2026-12-07T00:00:01Z", None)], []),
    ([pod("2026-12-07T00:00:01Z", "2026-12-07T00:00:04Z", status="False")], []),
    ([pod("2026-12-07T00:00:01Z", "2026-12-07T00:00:04Z", node="")], []),
    ([pod("2026-12-07T00:00:01Z", "2026-12-07T00:00:02Z"), pod("2026-12-07T00:00:01Z", "2026-12-07T00:00:05Z")],
     [1000.0, 4000.0]),
], ids=["same-second", "two-seconds", "across-midnight", "no-condition", "unschedulable", "not-bound", "two-pods"])
def test_apiserver_latency_is_creation_to_pod_scheduled_in_whole_seconds(pods: list[dict[str, Any]],
                                                                       expected: list[float]) -> None:
    assert kf.apiserver_latencies_ms(pods) == expected


@pytest.mark.parametrize(("first", "bound", "keys", "expected"), [
    ({"a": 10.0}, {"a": 10.25}, None, [250.0]),
    ({"a": 10.0, "b": 11.0}, {"a": 10.5}, None, [500.0]),
    ({"a": 10.0, "b": 11.0}, {"a": 10.5, "b": 11.001}, ["b"], [pytest.approx(1.0)]),
    ({}, {"a": 10.5}, None, []),
], ids=["one", "one-still-pending", "chosen-keys", "bound-never-seen-first"])
def test_watch_latency_is_first_event_to_the_node_name(first: dict[str, float], bound: dict[str, float],
                                                       keys: list[str] | None, expected: list[float]) -> None:
    assert kf.watch_latencies_ms(first, bound, keys) == expected


@pytest.mark.parametrize(("times", "t0", "expected"), [
    ([], 0.0, []),
    ([0.1, 0.9, 1.0, 3.5], 0.0, [2, 1, 0, 1]),
    ([9.0, 10.2], 10.0, [2]),  # earlier than t0: the first bucket
], ids=["none", "buckets", "before-t0"])
def test_per_second(times: list[float], t0: float, expected: list[int]) -> None:
    assert kf.per_second(times, t0) == expected


METRICS = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 120
apiserver_request_total{code="409",component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 5
apiserver_request_total{code="201",component="apiserver",group="",resource="pods",scope="namespace",subresource="binding",verb="POST",version="v1"} 100
apiserver_request_total{code="200",component="apiserver",group="",resource="nodes",scope="resource",subresource="status",verb="PATCH",version="v1"} 40
apiserver_request_total{code="0",component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 3
# HELP apiserver_request_duration_seconds [STABLE] Response latency distribution.
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1",le="0.005"} 100
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1",le="+Inf"} 125
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 1.25
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 125
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 600
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 2
"""


def test_counters_read_a_prometheus_exposition_by_labels() -> None:
    total = kf.counters(METRICS, "apiserver_request_total")
    assert len(total) == 5 and sum(total.values()) == 268
    posts = {kf.request_key(labels): v for labels, v in total.items() if dict(labels)["code"] == "201"}
    assert posts == {"POST pods": 120, "POST pods/binding": 100}
    assert kf.counters(METRICS, "apiserver_request_duration_seconds_count")
    assert kf.counters(METRICS, "no_such_metric") == {}
    assert kf.counters("", "apiserver_request_total") == {}


def scrape(scale: float) -> dict[kf.Labels, float]:
    return {labels: value * scale for labels, value in kf.counters(METRICS, "apiserver_request_total").items()}


@pytest.mark.parametrize(("before", "after", "seconds", "expected"), [
    ({}, scrape(1), 10.0, {"POST pods": 12.5, "POST pods/binding": 10.0, "PATCH nodes/status": 4.0, "WATCH pods": 0.3}),
    (scrape(1), scrape(2), 5.0, {"POST pods": 25.0, "POST pods/binding": 20.0, "PATCH nodes/status": 8.0,
                                 "WATCH pods": 0.6}),
    (scrape(1), scrape(1), 5.0, {}),
    ({}, scrape(1), 0.0, {}),
    ({}, scrape(1), 100.0, {"POST pods": 1.2, "POST pods/binding": 1.0, "PATCH nodes/status": 0.4}),
], ids=["from-nothing", "doubled", "nothing-new", "no-time", "rare-ones-left-out"])
def test_request_rates_by_verb_and_resource(before: dict[kf.Labels, float], after: dict[kf.Labels, float],
                                            seconds: float, expected: dict[str, float]) -> None:
    rates = kf.request_rates(before, after, seconds)
    assert rates == expected
    assert list(rates.values()) == sorted(rates.values(), reverse=True)


def test_request_means_leave_watches_out() -> None:
    sums = kf.counters(METRICS, "apiserver_request_duration_seconds_sum")
    counts = kf.counters(METRICS, "apiserver_request_duration_seconds_count")
    assert kf.request_means_ms(({}, sums), ({}, counts)) == {"POST pods": 10.0}
    assert kf.request_means_ms((sums, sums), (counts, counts)) == {}


CPU = {"cpu": 4000, "memory": 8, "pods": 3}


@pytest.mark.parametrize(("on_node", "finished", "expected"), [
    ({"a": "n1", "b": "n1"}, (), {}),
    ({"a": "n1", "b": "n1", "c": "n1"}, (), {"n1": "cpu: 6000 > 4000"}),
    ({"a": "n1", "b": "n1", "c": "n1"}, ("c",), {}),
    ({"a": "n1", "x": "n1", "y": "n1", "z": "n1"}, (), {"n1": "pods: 4 > 3"}),
    ({"a": "n2"}, (), {"n2": "cpu: 2000 > 0"}),
], ids=["fits", "cpu-over", "finished-pods-free", "pods-count", "unknown-node"])
def test_final_overcommit_from_the_api_servers_list(on_node: dict[str, str], finished: tuple[str, ...],
                                                    expected: dict[str, str]) -> None:
    requests = {"a": {"cpu": 2000, "memory": 1}, "b": {"cpu": 2000, "memory": 1}, "c": {"cpu": 2000, "memory": 1}}
    assert kf.final_overcommit({"n1": CPU}, requests, on_node, finished) == expected


@pytest.mark.parametrize(("cpu", "wall", "machine", "limit", "bound", "busy"), [
    ({"kube-apiserver": 60.0, "etcd": 20.0, "state": 20.0, "scheduler": 30.0, "bridge": 25.0, "harness": 25.0},
     100.0, None, "kube-apiserver + etcd", True, 90.0),
    ({"kube-apiserver": 10.0, "etcd": 5.0, "scheduler": 30.0, "harness": 5.0}, 100.0, None, "workers", False, 25.0),
    ({"kube-apiserver": 10.0, "scheduler": 30.0}, 100.0, 190.0, "workers", True, 95.0),
    ({"kube-apiserver": 10.0}, 10.0, 500.0, "kube-apiserver + etcd", True, 100.0),
], ids=["apiserver-bound", "idle-machine", "busy-with-other-work", "busy-capped"])
def test_the_limiting_component(cpu: dict[str, float], wall: float, machine: float | None, limit: str, bound: bool,
                                busy: float) -> None:
    out = kf.limiting_component(cpu, wall, 2, machine)
    assert out["limit"] == limit and out["busy_pct"] == busy
    assert out["note"].startswith("CPU-bound" if bound else "not CPU-bound")
    assert list(out["cores"])[0] == limit
    assert ("others_cores" in out) == (machine is not None)


def test_no_wall_time_names_no_limit() -> None:
    assert kf.limiting_component({"bridge": 1.0}, 0.0, 2)["limit"] == ""


def stage(name: str, kind: str = "Pod") -> dict[str, Any]:
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name},
            "spec": {"resourceRef": {"apiGroup": "v1", "kind": kind}}}


@pytest.mark.parametrize(("stock", "extra", "expected"), [
    (["pod-ready", "pod-complete"], [], ["pod-ready", "pod-complete"]),
    (["pod-ready", "pod-complete"], ["pod-ready"], ["pod-complete", "pod-ready"]),
    (["node-initialize"], ["node-heartbeat"], ["node-initialize", "node-heartbeat"]),
    ([], ["pod-ready"], ["pod-ready"]),
], ids=["stock-only", "replaced-by-name", "added", "extra-only"])
def test_a_scenarios_stages_replace_the_stock_ones_of_their_name(stock: list[str], extra: list[str],
                                                               expected: list[str]) -> None:
    out = stage_set([stage(n) for n in stock], [{**stage(n), "mine": True} for n in extra])
    assert [d["metadata"]["name"] for d in out] == expected
    assert all(d.get("mine") for d in out if d["metadata"]["name"] in extra)
