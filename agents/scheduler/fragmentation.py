"""GPU fragmentation as the FGD paper measures it (USENIX ATC '23, "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent"), over numpy arrays.

A node's fragmentation is measured against the workload's typical pods, each with its
popularity (a frequency; they sum to 1): for a typical pod that the node cannot host at all
(too little CPU, too few GPUs with room for its per-GPU share, or a GPU model it does not
accept), all of the node's idle GPU is fragment; for one it can host, the idle GPU on GPUs too
small for its share is. The node's fragmentation is the popularity-weighted sum, in milli-GPU.
FGD places a pod (and a share of one GPU on the GPU) where the fragmentation grows least; its
score is the simulator's `sigmoid((before - after) / 1000) x 100`, truncated.

Both the trace replay (`perf/trace.py`) and the scheduler's FGD plugin compute it here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MILLI = 1000  # milli-GPU in one GPU


@dataclass(frozen=True)
class TypicalPods:
    cpu: npt.NDArray[np.int64]  # millicores
    milli: npt.NDArray[np.int64]  # per GPU (1000 for whole GPUs)
    gpus: npt.NDArray[np.int64]
    freq: npt.NDArray[np.float64]  # popularity, summing to 1
    access: npt.NDArray[np.bool_]  # [typical pods x GPU models]: which models each accepts


def fragmentation(cpu_left: npt.NDArray[np.int64], gpu_left: npt.NDArray[np.int64], model_ids: npt.NDArray[np.intp],
                  typ: TypicalPods) -> npt.NDArray[np.float64]:
    """The fragmentation of each state (rows of `gpu_left`, milli-GPU left per GPU, -1 where
    the node has no such GPU), in milli-GPU."""
    present = gpu_left >= 0
    left = np.where(present, gpu_left, 0)
    total = left.sum(axis=1)
    fits_gpu = left[:, None, :] >= typ.milli[None, :, None]  # [states x typical x GPUs]
    can_host = (fits_gpu & present[:, None, :]).sum(axis=2) >= typ.gpus[None, :]
    usable = can_host & (cpu_left[:, None] >= typ.cpu[None, :]) & typ.access[:, model_ids].T
    small = np.where(~fits_gpu, left[:, None, :], 0).sum(axis=2)
    frag = np.where(usable, small, total[:, None])
    out: npt.NDArray[np.float64] = frag @ typ.freq
    return out


def score(before: npt.NDArray[np.float64], after: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """FGD's score of each move: the sigmoid of the fragmentation it removes, 0..100."""
    out: npt.NDArray[np.int64] = (100.0 / (1.0 + np.exp(-(before - after) / 1000.0))).astype(np.int64)
    return out


def after_placing(gpu_left: npt.NDArray[np.int64], gpus: int, milli: int
                  ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], npt.NDArray[np.int64]]:
    """Every way to place a pod of `gpus` x `milli` on the given states: a share of one GPU on
    any GPU with room (one candidate per GPU), whole GPUs on the first free ones (one per
    state, which must have that many). Returns (state index, GPU index or -1, GPU left
    afterwards) per candidate."""
    if gpus == 1 and milli < MILLI:
        states, columns = np.nonzero(gpu_left >= milli)
        left = gpu_left[states].copy()
        left[np.arange(len(states)), columns] -= milli
        return states, columns, left
    left = gpu_left.copy()
    if gpus:
        free = left == MILLI
        left -= (free & (np.cumsum(free, axis=1) <= gpus)) * milli
    states = np.arange(len(left))
    return states, np.full(len(left), -1, dtype=np.intp), left
