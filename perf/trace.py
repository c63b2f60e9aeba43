"""Replay of the Alibaba GPU trace (cluster-trace-gpu-v2023) with GPU-placement policies:
`koordstream bench trace`.

The method is the one the trace's publishers used for the FGD paper (USENIX ATC '23, "Beware
of Fragmentation"): the nodes of the node list; the pods of the pod list ordered by name,
shuffled with the seed, then inflated with copies drawn at random until the GPU request
reaches `load` x the cluster's GPU capacity; pods placed one by one in that order, no pod ever
leaving; CPU, memory, GPUs (milli-GPU per GPU) and the allowed GPU models must fit; a pod that
fits nowhere fails. The GPU allocation ratio is read when the arrived GPU requests reach 100%
of capacity and at the end.

Policies (each scores the feasible nodes; the best wins, ties to the first node by name, as
the FGD simulator's scheduler breaks them (its kube-scheduler fork replaces the random choice
"for reproducibility"); a share of one GPU goes to the GPU the policy prefers, else to the
fullest GPU that fits; whole GPUs are the first free ones):
- FGD: fragmentation gradient descent. A node's fragmentation is measured against the
  workload's typical pods (every GPU request shape of the trace, with its frequency): for each typical pod, the node's idle milli-GPU that it could not use
  (all of it when the pod does not fit, else the GPUs too small for it). A pod goes (and a
  shared pod to the GPU) where the fragmentation grows least.
- BestFit: least free CPU and GPU left after placing, each normalized by the largest node.
- GpuPacking: shared GPUs first, then free GPUs of used nodes, then free nodes.
- GpuClustering: nodes already running only pods of the pod's GPU affinity first (every share
  of one GPU is one affinity; N whole GPUs another), then nodes running it among others, then
  idle nodes, then the rest; fuller nodes first within each.
- DotProduct (Tetris): the smallest dot product of the node's free and the pod's request
  vectors, normalized by the node's capacity.
- Random: any feasible node, uniformly (the simulator's RandomScore gives one random node
  the top score).

Node state is numpy arrays over nodes (`[nodes]`, `[nodes x GPUs]`); FGD evaluates every
candidate (node, GPU) at once as a `[candidates x typical pods x GPUs]` array.
"""

from __future__ import annotations

import csv
import random
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agents.scheduler.fragmentation import MILLI, TypicalPods, after_placing, fragmentation
from agents.scheduler.fragmentation import score as fgd_score

POLICIES = ("FGD", "BestFit", "GpuPacking", "GpuClustering", "DotProduct", "Random")
TYPICAL_SHARE = 1.0  # the trace's own pods, every shape, by frequency (the data README's method)


@dataclass(frozen=True, slots=True)
class TracePod:
    cpu: int  # milli
    memory: int  # MiB
    gpus: int  # GPUs
    milli: int  # milli-GPU per GPU (1000 for whole GPUs)
    models: frozenset[str]  # allowed GPU models (empty: any)

    @property
    def gpu_request(self) -> int:
        return self.gpus * self.milli

    @property
    def affinity(self) -> int:
        """GpuClustering's tag: 0 for every share of one GPU, else the number of whole GPUs."""
        return 0 if self.milli < MILLI else self.gpus


@dataclass
class Cluster:
    cpu: npt.NDArray[np.int64]
    memory: npt.NDArray[np.int64]
    gpu_left: npt.NDArray[np.int64]  # [nodes x GPUs], -1 where a node has fewer GPUs
    gpu_count: npt.NDArray[np.int64]
    model: list[str]
    cpu_cap: npt.NDArray[np.int64]
    # GpuClustering: which GPU affinities (`TracePod.affinity`) run on each node
    tags: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))
    tag_ids: dict[int, int] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)  # the node list's `sn` column

    def copy(self) -> Cluster:
        return Cluster(self.cpu.copy(), self.memory.copy(), self.gpu_left.copy(), self.gpu_count,
                       self.model, self.cpu_cap, np.zeros((len(self.model), 16), dtype=bool), names=self.names)

    def tag(self, row: int, affinity: int) -> None:
        column = self.tag_ids.setdefault(affinity, len(self.tag_ids))
        if column >= self.tags.shape[1]:
            self.tags = np.concatenate([self.tags, np.zeros_like(self.tags)], axis=1)
        self.tags[row, column] = True


def _int(path: str | Path, line: int, row: dict[str, str], column: str) -> int:
    """A non-negative integer cell, or a ValueError naming the file, line, column and value."""
    value = row.get(column)
    try:
        number = int(value or "")
    except ValueError:
        raise ValueError(f"{path}:{line}: {column}={value!r}: not an integer") from None
    if number < 0:
        raise ValueError(f"{path}:{line}: {column}={value!r}: cannot be negative")
    return number


def load_nodes(path: str | Path) -> Cluster:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: no nodes")
    for column in ("cpu_milli", "memory_mib", "gpu", "model"):
        if column not in rows[0]:
            raise ValueError(f"{path}: column {column!r} is missing")
    gpus = [_int(path, line, r, "gpu") for line, r in enumerate(rows, 2)]
    cpu = np.array([_int(path, line, r, "cpu_milli") for line, r in enumerate(rows, 2)], dtype=np.int64)
    memory = np.array([_int(path, line, r, "memory_mib") for line, r in enumerate(rows, 2)], dtype=np.int64)
    gpu_left = np.full((len(rows), max(gpus) or 1), -1, dtype=np.int64)
    for i, count in enumerate(gpus):
        gpu_left[i, :count] = MILLI
    return Cluster(cpu=cpu.copy(), memory=memory, gpu_left=gpu_left, gpu_count=np.array(gpus, dtype=np.int64),
                   model=[r["model"] for r in rows], cpu_cap=cpu,
                   names=[r.get("sn") or f"trace-node-{i:05d}" for i, r in enumerate(rows)])


def load_pods(path: str | Path, models: Sequence[str] | None = None) -> list[TracePod]:
    """The pods ordered by name. With `models` (the nodes' GPU models), a `gpu_spec` naming a
    model no node has is an error naming the line and value."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        for column in ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"):
            if column not in (reader.fieldnames or ()):
                raise ValueError(f"{path}: column {column!r} is missing")
        numbered = sorted(enumerate(reader, 2), key=lambda lr: lr[1]["name"])
    known = set(models) if models is not None else None
    out = []
    for line, r in numbered:
        gpus, milli = _int(path, line, r, "num_gpu"), _int(path, line, r, "gpu_milli")
        spec = frozenset(m for m in (r.get("gpu_spec") or "").strip().split("|") if m)
        if known is not None and spec - known:
            raise ValueError(f"{path}:{line}: gpu_spec={r.get('gpu_spec')!r}: no node has GPU model "
                             f"{', '.join(sorted(spec - known))} (models: {', '.join(sorted(known))})")
        out.append(TracePod(_int(path, line, r, "cpu_milli"), _int(path, line, r, "memory_mib"), gpus,
                            milli if gpus == 1 and 0 < milli < MILLI else (MILLI if gpus else 0), spec))
    return out


def workload(pods: Sequence[TracePod], capacity_milli: int, load: float, seed: int) -> list[TracePod]:
    """Shuffle with the seed, then append random copies while the GPU request stays within load."""
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    total = sum(p.gpu_request for p in order)
    limit = load * capacity_milli
    while True:
        extra = pods[rng.randrange(len(pods))]
        if total + extra.gpu_request > limit:
            return order
        order.append(extra)
        total += extra.gpu_request


def typical_pods(pods: Sequence[TracePod], models: Sequence[str], share: float = TYPICAL_SHARE) -> TypicalPods:
    """The most frequent GPU request shapes covering `share` of the GPU pods, by frequency.

    The FGD simulator's own default keeps the shapes covering 60%; the data's README (and our
    measurement: 89.8% vs 95.0% final allocation on seed 42) says the published results
    measure fragmentation against all of the trace's pods."""
    counts = Counter((p.cpu, p.milli, p.gpus, p.models) for p in pods if p.gpus)
    total = sum(counts.values())
    chosen, covered = [], 0
    for shape, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][:3], sorted(kv[0][3]))):
        chosen.append((shape, n))
        covered += n
        if covered >= share * total:
            break
    norm = sum(n for _, n in chosen)
    return TypicalPods(cpu=np.array([s[0] for s, _ in chosen]), milli=np.array([s[1] for s, _ in chosen]),
                   gpus=np.array([s[2] for s, _ in chosen]), freq=np.array([n / norm for _, n in chosen]),
                   access=np.array([[not s[3] or m in s[3] for m in models] for s, _ in chosen], dtype=bool))


class Replay:
    def __init__(self, cluster: Cluster, policy: str, typ: TypicalPods, seed: int) -> None:
        self.c = cluster.copy()
        self.policy = policy
        self.typ = typ
        self.rng = np.random.default_rng(seed)
        self.models = sorted(set(cluster.model))
        self.model_ids = np.array([self.models.index(m) for m in cluster.model], dtype=np.intp)
        self.max_cpu = int(cluster.cpu_cap.max())
        self.max_gpu = int(cluster.gpu_count.max()) * MILLI
        self.frag = fragmentation(self.c.cpu, self.c.gpu_left, self.model_ids, typ) if policy == "FGD" else None

    def feasible(self, p: TracePod) -> npt.NDArray[np.bool_]:
        c = self.c
        ok = (c.cpu >= p.cpu) & (c.memory >= p.memory)
        if p.gpus:
            ok &= (c.gpu_left >= p.milli).sum(axis=1) >= p.gpus
            if p.models:
                ok &= np.isin(self.model_ids, [i for i, m in enumerate(self.models) if m in p.models])
        return ok

    def _gpu_choice(self, row: int, p: TracePod) -> list[int]:
        left = self.c.gpu_left[row]
        if p.milli >= MILLI:
            return [int(g) for g in np.flatnonzero(left == MILLI)[: p.gpus]]
        fitting = np.flatnonzero(left >= p.milli)
        return [int(fitting[np.argmin(left[fitting])])]  # the fullest GPU that fits

    def place(self, p: TracePod) -> bool:
        rows = np.flatnonzero(self.feasible(p))
        if not rows.size:
            return False
        if self.policy == "FGD":
            row, gpus = self._fgd(p, rows)
        else:
            scores = self._score(p, rows)
            best = rows[scores == scores.max()]
            # Random: any feasible node. The others: ties to the first node by name, as the
            # FGD simulator's scheduler picks ("for reproducibility"); node names sort like rows.
            row = int(self.rng.choice(best)) if self.policy == "Random" else int(best[0])
            gpus = self._gpu_choice(row, p) if p.gpus else []
        c = self.c
        c.cpu[row] -= p.cpu
        c.memory[row] -= p.memory
        for g in gpus:
            c.gpu_left[row, g] -= p.milli
        if p.gpus:
            c.tag(row, p.affinity)
        if self.frag is not None:
            self.frag[row] = fragmentation(c.cpu[row:row + 1], c.gpu_left[row:row + 1],
                                           self.model_ids[row:row + 1], self.typ)[0]
        return True

    def _fgd(self, p: TracePod, rows: npt.NDArray[np.intp]) -> tuple[int, list[int]]:
        c = self.c
        assert self.frag is not None
        states, cand_gpus, gpu_left = after_placing(c.gpu_left[rows], p.gpus, p.milli)
        cand_rows = rows[states]
        new = fragmentation(c.cpu[cand_rows] - p.cpu, gpu_left, self.model_ids[cand_rows], self.typ)
        pick = int(np.argmax(fgd_score(self.frag[cand_rows], new)))  # ties: the first node, then its first GPU
        row = int(cand_rows[pick])
        gpus = [int(cand_gpus[pick])] if cand_gpus[pick] >= 0 else (self._gpu_choice(row, p) if p.gpus else [])
        return row, gpus

    def _score(self, p: TracePod, rows: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
        c = self.c
        left = np.where(c.gpu_left[rows] >= 0, c.gpu_left[rows], 0)
        total_left = left.sum(axis=1)
        if self.policy == "Random":
            return np.zeros(len(rows), dtype=np.int64)
        if self.policy == "BestFit":
            used = 0.5 * (c.cpu[rows] - p.cpu) / self.max_cpu + 0.5 * (total_left - p.gpu_request) / self.max_gpu
            best_fit: npt.NDArray[np.int64] = ((1.0 - used) * 100).astype(np.int64)
            return best_fit
        if self.policy == "DotProduct":
            cap_gpu = np.maximum(c.gpu_count[rows] * MILLI, 1)
            dot = (p.cpu / c.cpu_cap[rows]) * (c.cpu[rows] / c.cpu_cap[rows]) + \
                  (p.gpu_request / cap_gpu) * (total_left / cap_gpu)
            dot_product: npt.NDArray[np.int64] = ((1.0 - dot / 2) * 100).astype(np.int64)
            return dot_product
        if self.policy == "GpuClustering":
            if not p.gpus:
                return np.zeros(len(rows), dtype=np.int64)
            column = c.tag_ids.get(p.affinity)
            shapes = c.tags[rows].sum(axis=1)
            same = c.tags[rows, column] if column is not None else np.zeros(len(rows), dtype=bool)
            base = np.where(same, np.where(shapes == 1, 75, 50), np.where(shapes == 0, 25, 0))
            clustered: npt.NDArray[np.int64] = base + 25 * (self.max_gpu - total_left) // self.max_gpu
            return clustered
        if self.policy == "GpuPacking":
            if not p.gpus:
                return np.zeros(len(rows), dtype=np.int64)
            full_free = (left == MILLI).sum(axis=1)
            if p.milli >= MILLI:  # whole GPUs use free ones only
                used = np.full(len(rows), max(50 - p.gpus, 33), dtype=np.int64)
            else:  # a share goes to the fullest GPU that fits it
                fullest = np.where(left >= p.milli, left, MILLI + 1).min(axis=1)
                used = np.where(fullest == MILLI, 49, np.maximum(100 - (fullest * 100 // MILLI) // 10, 50))
            packed: npt.NDArray[np.int64] = np.where(full_free == c.gpu_count[rows],
                                                    np.maximum(33 - full_free, full_free), used)
            return packed
        raise ValueError(f"policy={self.policy!r}: must be one of {', '.join(POLICIES)}")


def run(cluster: Cluster, pods: Sequence[TracePod], policy: str, seed: int, load: float,
        typ: TypicalPods) -> dict[str, Any]:
    capacity = int(cluster.gpu_count.sum()) * MILLI
    order = workload(pods, capacity, load, seed)
    replay = Replay(cluster, policy, typ, seed)
    arrived, at_100, failed = 0, None, 0
    for p in order:
        if not replay.place(p):
            failed += 1
        arrived += p.gpu_request
        if at_100 is None and arrived >= capacity:
            at_100 = allocation(replay.c, capacity)
    final = allocation(replay.c, capacity)
    return {"policy": policy, "seed": seed, "gpu_allocation_pct": {"at_100": at_100 if at_100 is not None else final,
                                                                  "final": final},
            "pods": len(order), "pods_failed": failed}


def allocation(c: Cluster, capacity: int) -> float:
    left = int(np.where(c.gpu_left >= 0, c.gpu_left, 0).sum())
    return round(100.0 * (capacity - left) / capacity, 3)


def _one(job: tuple[str, str, int, str, int, float]) -> dict[str, Any]:
    nodes_csv, pods_csv, limit, policy, seed, load = job
    cluster = load_nodes(nodes_csv)
    pods = load_pods(pods_csv)[: limit or None]
    return run(cluster, pods, policy, seed, load, typical_pods(pods, sorted(set(cluster.model))))


def bench_trace(nodes_csv: str, pods_csv: str, load: float, seeds: Sequence[int], policies: Sequence[str],
                limit: int = 0, workers: int = 1) -> dict[str, Any]:
    """Every policy on every seed (in `workers` processes); the JSON of `koordstream bench trace`."""
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(f"--policy={policy!r}: must be one of {', '.join(POLICIES)} or all")
    load_pods(pods_csv, load_nodes(nodes_csv).model)  # fail early, naming the file, line and column
    jobs = [(nodes_csv, pods_csv, limit, policy, seed, load) for policy in policies for seed in seeds]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_one, jobs))
    else:
        results = [_one(job) for job in jobs]
    summary = {}
    for policy in policies:
        mine = [r for r in results if r["policy"] == policy]
        summary[policy] = {
            "at_100_mean": round(sum(r["gpu_allocation_pct"]["at_100"] for r in mine) / len(mine), 2),
            "final_mean": round(sum(r["gpu_allocation_pct"]["final"] for r in mine) / len(mine), 2),
            "pods_failed_mean": round(sum(r["pods_failed"] for r in mine) / len(mine), 1),
        }
    return {"nodes_csv": nodes_csv, "pods_csv": pods_csv, "load": load, "results": results, "summary": summary}


def parse_seeds(text: str) -> list[int]:
    """`42-51` or `1,2,5`."""
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            low, high = part.split("-", 1)
            out += list(range(int(low), int(high) + 1))
        elif part:
            out.append(int(part))
    if not out:
        raise ValueError(f"--seeds={text!r}: give a range like 42-51 or a list like 1,2,3")
    return out

