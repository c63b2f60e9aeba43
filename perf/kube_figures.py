"""The figures of a perf run on real Kwok that come from the API server and the machine: pure
functions over what was read (pod objects, `/metrics` text, CPU seconds), so that they are
tested without a cluster.

- `apiserver_latencies_ms`: each bound pod's `metadata.creationTimestamp` to the
  `lastTransitionTime` of its `PodScheduled=True` condition, both written by the API server
  (the binding subresource sets the condition) in RFC 3339 with whole seconds: a latency is a
  whole number of seconds, so the percentiles are too (1 s resolution either way).
- `watch_latencies_ms`: the harness's own watch, local receive times: a pod's first event to the
  event where `spec.nodeName` appears (millisecond resolution, the watch's delivery included).
- `counters` reads a Prometheus text exposition (the API server's `/metrics`); `request_rates`
  turns two scrapes of `apiserver_request_total` into requests a second by verb and resource
  (`POST pods`, `POST pods/binding`, `PATCH nodes/status`), `request_means_ms` two scrapes of
  `apiserver_request_duration_seconds` into the mean latency of each.
- `final_overcommit`: from the API server's final list, the nodes whose unfinished pods
  request more than their allocatable.
- `limiting_component`: CPU seconds per component over the wall time as cores, the machine's
  busy share, and which component used the most.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]
FINISHED = ("Succeeded", "Failed")


def rfc3339_s(text: str) -> float:
    """An RFC 3339 time as the API server writes it ("2026-12-07T23:10:01Z") in epoch seconds."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def scheduled_at(pod: Mapping[str, Any]) -> str:
    """The `lastTransitionTime` of the pod's `PodScheduled=True` condition ("" when it has none)."""
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            return str(c.get("lastTransitionTime") or "")
    return ""


def apiserver_latencies_ms(pods: Iterable[Mapping[str, Any]]) -> list[float]:
    """Creation to `PodScheduled=True`, per bound pod that has both timestamps (ms, whole seconds)."""
    out = []
    for pod in pods:
        created = (pod.get("metadata") or {}).get("creationTimestamp")
        scheduled = scheduled_at(pod)
        if created and scheduled and (pod.get("spec") or {}).get("nodeName"):
            out.append((rfc3339_s(scheduled) - rfc3339_s(str(created))) * 1000.0)
    return out


def watch_latencies_ms(first_seen: Mapping[str, float], bound_at: Mapping[str, float],
                       keys: Iterable[str] | None = None) -> list[float]:
    """Per pod (of `keys`, else every pod bound) the time from its first watch event to the
    one that showed its node, in ms."""
    chosen = bound_at if keys is None else keys
    return [(bound_at[k] - first_seen[k]) * 1000.0 for k in chosen if k in bound_at and k in first_seen]


def per_second(times: Iterable[float], t0: float) -> list[int]:
    """How many of `times` fall in each 1-second bucket from `t0` (earlier ones in the first)."""
    counts: list[int] = []
    for t in times:
        i = max(0, int(t - t0))
        if i >= len(counts):
            counts.extend([0] * (i + 1 - len(counts)))
        counts[i] += 1
    return counts


def counters(text: str, name: str) -> dict[Labels, float]:
    """The samples of metric `name` (a counter's `_total`, or a histogram's `_sum` / `_count`)
    in a Prometheus text exposition, by their labels (sorted)."""
    out: dict[Labels, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = out.get(tuple(sorted(sample.labels.items())), 0.0) + \
                    float(sample.value)
    return out


def request_key(labels: Labels) -> str:
    """`VERB resource[/subresource]`, as the API server labels a request."""
    d = dict(labels)
    resource = d.get("resource", "") + (f"/{d['subresource']}" if d.get("subresource") else "")
    return f"{d.get('verb', '')} {resource}".strip()


def _deltas(before: Mapping[Labels, float], after: Mapping[Labels, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in after.items():
        delta = value - before.get(labels, 0.0)
        if delta > 0:
            key = request_key(labels)
            out[key] = out.get(key, 0.0) + delta
    return out


def request_rates(before: Mapping[Labels, float], after: Mapping[Labels, float], seconds: float) -> dict[str, float]:
    """Requests a second by `VERB resource[/subresource]` between two scrapes of
    `apiserver_request_total` (every response code together), most frequent first; those that
    round to 0.0 a second (a watch opened once) left out."""
    if seconds <= 0:
        return {}
    rates = {k: r for k, v in _deltas(before, after).items() if (r := round(v / seconds, 1)) > 0}
    return dict(sorted(rates.items(), key=lambda kv: (-kv[1], kv[0])))


def request_means_ms(sums: tuple[Mapping[Labels, float], Mapping[Labels, float]],
                     counts: tuple[Mapping[Labels, float], Mapping[Labels, float]]) -> dict[str, float]:
    """The mean latency (ms) by `VERB resource[/subresource]` between two scrapes of a
    histogram's `_sum` and `_count` (watches left out: they last as long as they are open)."""
    total, n = _deltas(*sums), _deltas(*counts)
    return {k: round(total.get(k, 0.0) / n[k] * 1000.0, 2) for k in sorted(n, key=lambda k: -n[k])
            if n[k] > 0 and not k.startswith("WATCH")}


def final_overcommit(allocatable: Mapping[str, Mapping[str, int]],
                     requests: Mapping[str, Mapping[str, int]], on_node: Mapping[str, str],
                     finished: Iterable[str] = (), max_pods: int = 110) -> dict[str, str]:
    """Nodes whose pods (`on_node`: pod -> node, as the API server lists them; `finished` pods
    left out) request more than the node's allocatable, as node -> the first resource over;
    each pod counts one of `pods` (`max_pods` when the node does not say)."""
    done = set(finished)
    used: dict[str, dict[str, int]] = {}
    for pod, node in on_node.items():
        if pod in done:
            continue
        u = used.setdefault(node, {})
        for name, amount in requests.get(pod, {}).items():
            if name != "pods":
                u[name] = u.get(name, 0) + amount
        u["pods"] = u.get("pods", 0) + 1
    out: dict[str, str] = {}
    for node, u in sorted(used.items()):
        limit = {"pods": max_pods, **allocatable.get(node, {})}
        for name, amount in sorted(u.items()):
            if amount > limit.get(name, 0):
                out[node] = f"{name}: {amount} > {limit.get(name, 0)}"
                break
    return out


# The components whose CPU a run measures, grouped as the verdict names them.
GROUPS = {"kube-apiserver": "kube-apiserver + etcd", "etcd": "kube-apiserver + etcd", "kwok": "kwok",
          "state": "workers", "scheduler": "workers", "worker": "workers", "bridge": "bridge", "broker": "broker",
          "harness": "harness"}


def limiting_component(cpu_s: Mapping[str, float], wall_s: float, cores: int,
                       machine_busy_s: float | None = None) -> dict[str, Any]:
    """CPU seconds per component over `wall_s` as cores used, by group (`GROUPS`; others by
    their own name); the machine's busy share (from `machine_busy_s`, every process on it,
    else ours); and the group that used the most, with a sentence saying whether the machine's
    CPU ran out (80% busy or more: that group is the limit) or not (then waiting, not CPU,
    held the run back)."""
    if wall_s <= 0:
        return {"cores": {}, "busy_pct": 0.0, "limit": "", "note": "no wall time"}
    groups: dict[str, float] = {}
    for name, seconds in cpu_s.items():
        group = GROUPS.get(name, name)
        groups[group] = groups.get(group, 0.0) + seconds
    used = {g: round(s / wall_s, 2) for g, s in sorted(groups.items(), key=lambda kv: -kv[1])}
    ours = sum(groups.values())
    busy = machine_busy_s if machine_busy_s is not None else ours
    busy_pct = round(min(100.0, busy / (cores * wall_s) * 100.0), 1)
    top = next(iter(used), "")
    share = round(groups.get(top, 0.0) / ours * 100.0, 1) if ours > 0 else 0.0
    if busy_pct >= 80.0:
        note = (f"CPU-bound: the machine's {cores} cores were {busy_pct}% busy; {top} used the most "
                f"({used.get(top, 0.0)} cores, {share}% of the run's CPU)")
    else:
        note = (f"not CPU-bound: the machine's {cores} cores were {busy_pct}% busy; {top} used the most "
                f"({used.get(top, 0.0)} cores, {share}% of the run's CPU)")
    out: dict[str, Any] = {"cores": used, "busy_pct": busy_pct, "limit": top, "note": note}
    if machine_busy_s is not None:
        out["others_cores"] = round(max(0.0, machine_busy_s - ours) / wall_s, 2)
    return out
