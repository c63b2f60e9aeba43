"""How fragmented a cluster is, the figures the planners are judged by.

- Imbalance: each node's std of requested / allocatable over the objective's resources
  (`ClusterView.std`); the cluster's is their sum, and their max.
- Stranded capacity: the share of the free capacity that the workload's own pods, taken as a
  distribution of requests, could not use, measured as the FGD paper measures GPU
  fragmentation: for each typical request t (the distinct requests of the given pods,
  weighted by how many pods have it), a node's whole free capacity is stranded for t when t
  does not fit there at all, and none of it when t fits. Each resource is normalised by the
  cluster's allocatable of it, so cpu and memory weigh alike; the share is the
  frequency-weighted stranded sum over the free sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agents.rebalance.view import ClusterView

TYPICAL_LIMIT = 64  # the most frequent requests kept as the distribution


@dataclass(frozen=True)
class Objective:
    std_sum: float
    std_max: float
    stranded_pct: float

    def as_dict(self) -> dict[str, float]:
        return {"std_sum": round(self.std_sum, 6), "std_max": round(self.std_max, 6),
                "stranded_pct": round(self.stranded_pct, 4)}


def typical_requests(vectors: npt.NDArray[np.int64], columns: npt.NDArray[np.intp]
                     ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """The distinct requests over `columns` (the most frequent `TYPICAL_LIMIT`) and their
    frequencies (summing to 1)."""
    sub = vectors[:, columns]
    sub = sub[(sub > 0).any(axis=1)]
    if not len(sub):
        return np.zeros((0, len(columns)), dtype=np.int64), np.zeros(0)
    kinds, counts = np.unique(sub, axis=0, return_counts=True)
    order = np.argsort(-counts, kind="stable")[:TYPICAL_LIMIT]
    kinds, counts = kinds[order], counts[order]
    return kinds, counts / counts.sum()


def stranded_pct(free: npt.NDArray[np.int64], allocatable: npt.NDArray[np.int64],
                 kinds: npt.NDArray[np.int64], freq: npt.NDArray[np.float64]) -> float:
    """Percent of the free capacity (over the given columns) the typical requests cannot use."""
    free = np.maximum(free, 0)
    scale = allocatable.sum(axis=0).astype(np.float64)
    scale[scale == 0] = 1.0
    total = float((free / scale).sum())
    if total <= 0 or not len(kinds):
        return 0.0
    fits = ((free[:, None, :] >= kinds[None, :, :]) | (kinds[None, :, :] == 0)).all(axis=2)  # [nodes x kinds]
    per_node = (free / scale).sum(axis=1)
    stranded = ((~fits * per_node[:, None]).sum(axis=0) * freq).sum()
    return float(100.0 * stranded / total)


def measure(view: ClusterView, columns: npt.NDArray[np.intp], requested: npt.NDArray[np.int64] | None = None,
            typical: tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]] | None = None) -> Objective:
    """The cluster's objective for `requested` (the view's own by default)."""
    req = view.requested if requested is None else requested
    std = view.std(columns, req)
    kinds, freq = typical if typical is not None else typical_requests(view.vectors, columns)
    free = (view.allocatable - req)[:, columns]
    return Objective(float(std.sum()), float(std.max(initial=0.0)),
                     stranded_pct(free, view.allocatable[:, columns], kinds, freq))
