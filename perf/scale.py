"""`koordstream perf model RUN.json`: what more cores would give, from a profiled run's CPU per
pod by stage (`perf run --profile`), not from a run on them.

The model: a pod costs the state workers `w` us of CPU, all of it partitioned (owners by node,
deciders by decision key: a partition's work is one worker's), and the scheduler replicas
`s_part + s_all` us: `s_part` (intake, cycle, claims out, the client) is paid by the one replica
that owns the pod, `s_all` (the owners' reports decoded and applied, "reports") by every
replica, as each keeps a replica of the whole cluster. With `r` replicas and `s` state workers,
each on a core of its own, and `p` partitions (neither role can use more processes than
partitions):

    pods/s <= 1e6 / (s_part / r + s_all)     (a replica's core: its share, and every report)
    pods/s <= s * 1e6 / w                     (the state workers' cores)

The best split of `c` cores between the roles is searched; the broker's cores are counted
apart (`b` us a pod, from the run's `broker_cpu_s`: a Kafka cluster grows by brokers). What it
leaves out: the event loop's latency (a worker's batches wait behind each other), broker
partitions' own limits, rebalances, and the harness. The ceiling as replicas grow is
`1e6 / s_all`: the reports every replica applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EVERY_REPLICA = ("reports",)  # the scheduler's stages that every replica pays for every pod


@dataclass(frozen=True)
class Costs:
    """Microseconds of CPU per pod: the state workers', the scheduler's owning replica's, every
    replica's, and the broker's."""

    state: float
    scheduler_own: float
    scheduler_every: float
    broker: float


@dataclass(frozen=True)
class Point:
    cores: int
    partitions: int
    schedulers: int
    state_workers: int
    pods_per_s: float
    broker_cores: float


class ModelError(ValueError):
    pass


def costs(run: dict[str, Any]) -> Costs:
    """The per-pod costs a `perf run --profile` result measured (split layout, one process of each
    role); raises ModelError naming what is missing."""
    profile, cpu = run.get("profile"), run.get("worker_cpu_s") or {}
    if not profile or "state" not in profile or "scheduler" not in profile:
        raise ModelError("profile: the run has no profile of both roles (run it with --profile DIR, split layout)")
    if set(cpu) != {"state", "scheduler"}:
        raise ModelError(f"worker_cpu_s: one state worker and one scheduler expected, got {sorted(cpu)}")
    pods = max(int(run.get("pods_total") or 0), 1)
    stages = profile["scheduler"]["stages"]
    busy = sum(n for stage, n in stages.items() if stage != "idle")
    every_share = sum(stages.get(stage, 0) for stage in EVERY_REPLICA) / busy if busy else 0.0
    scheduler = cpu["scheduler"] / pods * 1e6
    return Costs(state=cpu["state"] / pods * 1e6, scheduler_own=scheduler * (1 - every_share),
                 scheduler_every=scheduler * every_share, broker=float(run.get("broker_cpu_s") or 0.0) / pods * 1e6)


def rate(c: Costs, schedulers: int, state_workers: int) -> float:
    """Pods a second `schedulers` replicas and `state_workers` workers keep up with, a core each."""
    replica = 1e6 / (c.scheduler_own / schedulers + c.scheduler_every)
    return min(replica, state_workers * 1e6 / c.state)


def best(c: Costs, cores: int, partitions: int) -> Point:
    """The split of `cores` between the roles (each at least one, at most `partitions`) with the
    most pods a second."""
    splits = [(r, cores - r) for r in range(1, cores) if r <= partitions and cores - r <= partitions]
    if not splits:
        raise ModelError(f"cores={cores}, partitions={partitions}: no split gives each role a core and a partition")
    r, s = max(splits, key=lambda split: rate(c, *split))
    pods = rate(c, r, s)
    return Point(cores, partitions, r, s, round(pods, 1), round(pods * c.broker / 1e6, 2))


def model(run: dict[str, Any], cores: list[int], partitions: int = 0) -> dict[str, Any]:
    """Per core count, the best split and its pods a second (`partitions` 0: as many as cores)."""
    c = costs(run)
    return {"scenario": run.get("scenario", ""),
            "costs_us_per_pod": {"state": round(c.state, 1), "scheduler_own": round(c.scheduler_own, 1),
                                 "scheduler_every_replica": round(c.scheduler_every, 1), "broker": round(c.broker, 1)},
            "ceiling_pods_per_s": round(1e6 / c.scheduler_every, 1) if c.scheduler_every else None,
            "points": [vars(best(c, n, partitions or n)) for n in cores]}
