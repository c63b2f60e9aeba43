"""Allocation and fragmentation figures of a run, from what the harness saw on the topics.

Pure functions over the nodes' capacities, the pods' requests, each pod's first Binding and
the terminations the lifecycle published (numpy over nodes and events):

- allocation over time: per 1-second bucket from the first pod published, the share of the
  cluster's CPU, memory and GPU (koordinator.sh/gpu-core) held by bound, not yet terminated
  pods;
- the burst throughput: pods of bursts (pods the scenario sends at one instant) over the time
  while some burst was in flight;
- fragmentation at the end, per resource: the expected share of the cluster's free capacity
  that a pod drawn from the run's pods (among those asking for the resource, by frequency)
  could not use, because it sits on nodes with less free than the pod asks (node totals: the
  FGD paper's idea, without its per-GPU detail).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from agents.state.devices import GPU_CORE

RESOURCES = ("cpu", "memory", GPU_CORE)
SHORT = {"cpu": "cpu", "memory": "memory", GPU_CORE: "gpu"}


def allocation(capacity: Mapping[str, Mapping[str, int]], requests: Mapping[str, Mapping[str, int]],
               bound: Mapping[str, tuple[float, str]], terminated: Sequence[tuple[float, str]],
               t0: float) -> dict[str, object]:
    """`capacity`: node -> allocatable; `requests`: uid -> request; `bound`: uid -> (time, node)
    of its first Binding; `terminated`: (time, uid). Returns the series, the peak and final
    allocation percentages, and the end's fragmentation percentages."""
    nodes = sorted(capacity)
    index = {n: i for i, n in enumerate(nodes)}
    cap = np.array([[capacity[n].get(r, 0) for r in RESOURCES] for n in nodes], dtype=np.float64).reshape(-1, len(RESOURCES))
    total = cap.sum(axis=0)
    uids = [u for u in bound if bound[u][1] in index]
    req = np.array([[requests[u].get(r, 0) for r in RESOURCES] for u in uids], dtype=np.float64).reshape(-1, len(RESOURCES))
    start = np.array([bound[u][0] - t0 for u in uids], dtype=np.float64)
    where = np.array([index[bound[u][1]] for u in uids], dtype=np.intp)
    row = {u: i for i, u in enumerate(uids)}
    ended = [(t - t0, row[u]) for t, u in terminated if u in row]
    end_t = np.array([t for t, _ in ended], dtype=np.float64)
    end_i = np.array([i for _, i in ended], dtype=np.intp)
    horizon = int(np.floor(max(start.max(initial=0.0), end_t.max(initial=0.0)))) + 1  # seconds 0..last event
    held = np.zeros((horizon + 1, len(RESOURCES)))
    np.add.at(held, np.clip(np.floor(start).astype(np.intp), 0, horizon), req)
    np.subtract.at(held, np.clip(np.floor(end_t).astype(np.intp), 0, horizon), req[end_i])
    used_over_time = np.cumsum(held, axis=0)[:horizon]
    pct = np.divide(used_over_time * 100.0, total, out=np.zeros_like(used_over_time), where=total > 0)
    used = np.zeros_like(cap)
    alive = np.ones(len(uids), dtype=bool)
    alive[end_i] = False
    np.add.at(used, where[alive], req[alive])
    out: dict[str, object] = {
        "allocation_series_pct": {SHORT[r]: [round(float(v), 2) for v in pct[:, k]]
                                  for k, r in enumerate(RESOURCES) if total[k] > 0},
        "allocation_pct": {f"{SHORT[r]}_{what}": round(float(v), 2)
                           for k, r in enumerate(RESOURCES) if total[k] > 0
                           for what, v in (("peak", pct[:, k].max(initial=0.0)), ("final", pct[-1, k] if len(pct) else 0.0))},
        "fragmentation_pct": fragmentation(cap, used, np.array([[r.get(x, 0) for x in RESOURCES]
                                                                  for r in requests.values()], dtype=np.float64)),
    }
    return out


def fragmentation(cap: npt.NDArray[np.float64], used: npt.NDArray[np.float64],
                  requests: npt.NDArray[np.float64]) -> dict[str, float]:
    """Per resource the run's pods ask for: the mean over those pods of the share of free
    capacity on nodes whose free capacity is below the pod's request (nodes that have none of
    the resource are left out)."""
    free = np.clip(cap - used, 0.0, None)
    out = {}
    for k, r in enumerate(RESOURCES):
        asks = requests[requests[:, k] > 0, k] if len(requests) else np.zeros(0)
        node_free = np.sort(free[cap[:, k] > 0, k])
        total_free = node_free.sum()
        if not len(asks) or total_free <= 0:
            continue
        below = np.concatenate(([0.0], np.cumsum(node_free)))  # free on the i smallest nodes
        stranded = below[np.searchsorted(node_free, asks, side="left")]  # nodes with free < ask
        out[SHORT[r]] = round(float(stranded.mean() * 100.0 / total_free), 2)
    return out


def burst_throughput(offsets: Mapping[str, float], started: Mapping[str, float], done: Mapping[str, float],
                     at_least: int = 100) -> float | None:
    """Bursts are `at_least` or more pods with one offset (`offsets`: pod -> the scenario's send
    time) that all started (`started`: pod -> published or created) and are done (`done`: pod ->
    its binding). Their pods over the time while some burst was in flight (the union of each
    burst's first start -> last done): the run's pace between bursts is the scenario's, not the
    scheduler's. None without a burst."""
    by_offset: dict[float, list[str]] = {}
    for pod, offset in offsets.items():
        by_offset.setdefault(offset, []).append(pod)
    bursts = [pods for pods in by_offset.values()
              if len(pods) >= at_least and all(p in started and p in done for p in pods)]
    spans = sorted((min(started[p] for p in b), max(done[p] for p in b)) for b in bursts)
    busy, end = 0.0, float("-inf")
    for lo, hi in spans:
        busy += max(0.0, hi - max(lo, end))
        end = max(end, hi)
    return round(sum(len(b) for b in bursts) / busy, 1) if bursts and busy > 0 else None
