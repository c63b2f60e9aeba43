"""FGD (PreScore, Score): fragmentation gradient descent for pods that ask for GPUs (USENIX
ATC '23, "Beware of Fragmentation"; the math is in `agents.scheduler.fragmentation`).

The typical pods, against which fragmentation is measured, come from the plugin's args
(`typicalPods: [{cpu, gpus, gpuCore, weight}]`: CPU as a quantity, whole GPUs or one GPU's
`gpuCore` percent, and a popularity weight); without them the plugin learns them from the GPU
pods it scores, each shape (cpu, GPUs, core per GPU) weighted by how often it came. GPU models
are not told apart: every typical pod may use every GPU.

PreScore, for a pod with GPUs, over the feasible nodes: each node's fragmentation now, and
after placing the pod (a share of one GPU on each GPU whose free core and memory-ratio take
it, whole GPUs on the first free ones); a node's score is its best move's, and the GPU of that
move is left for DeviceShare's Reserve (`deviceshare.PREFERRED`), so the share goes where the
fragmentation grows least. Ties go to the first node and its first GPU, as in the FGD
simulator. Pods without GPUs skip it (score 0 everywhere), so they still batch into
equivalence classes; pods with GPUs do not (each placement moves the next one's scores).

Not in the default profile: enable it in a profile for GPU workloads, e.g.
`score: {enabled: [{name: FGD, weight: 100}]}` (see `perf/profiles/fgd.yaml`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from agents.scheduler import fragmentation as frag
from agents.scheduler.cluster import ClusterEvent, ClusterState
from agents.scheduler.framework import status
from agents.scheduler.framework.interface import UNSIGNABLE, CycleState, Mask, PodInfo, Rows, Scores
from agents.scheduler.framework.status import Status
from agents.scheduler.plugins import deviceshare
from agents.scheduler.plugins.args import ArgsError, reject_unknown
from agents.state import devices
from schemas.errors import SchemaError
from schemas.quantity import to_canonical

NAME = "FGD"
Shape = tuple[int, int, int]  # (cpu millicores, GPUs, core per GPU)
GPU_KEYS = frozenset({devices.NVIDIA_GPU, devices.GPU_CORE, devices.GPU_RATIO, devices.GPU_MEMORY, devices.GPU_SHARED})


@dataclass(frozen=True)
class FGDArgs:
    typical: tuple[tuple[Shape, float], ...] = ()  # empty: learn from the pods scored

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> FGDArgs:
        reject_unknown(raw, {"typicalPods"})
        items = raw.get("typicalPods") or []
        if not isinstance(items, Sequence) or isinstance(items, str):
            raise ArgsError("typicalPods", items, "must be a list of {cpu, gpus, gpuCore, weight}")
        typical = []
        for i, item in enumerate(items):
            field = f"typicalPods[{i}]"
            if not isinstance(item, Mapping):
                raise ArgsError(field, item, "must be an object with cpu, gpus, gpuCore and weight")
            reject_unknown(item, {"cpu", "gpus", "gpuCore", "weight"}, f"{field}.")
            try:
                cpu = to_canonical("cpu", item.get("cpu", 0), f"{field}.cpu")
            except SchemaError as exc:
                raise ArgsError(exc.field, exc.value, exc.reason) from exc
            gpus, core, weight = item.get("gpus", 1), item.get("gpuCore", devices.WHOLE), item.get("weight", 1)
            typical.append(((cpu, gpus, core), weight))
        return cls(typical=tuple(typical))

    def validate(self) -> None:
        for i, ((_, gpus, core), weight) in enumerate(self.typical):
            field = f"typicalPods[{i}]"
            if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
                raise ArgsError(f"{field}.gpus", gpus, "must be a positive integer")
            if not isinstance(core, int) or isinstance(core, bool) or not 1 <= core <= devices.WHOLE:
                raise ArgsError(f"{field}.gpuCore", core, "must be an integer from 1 to 100 (percent of one GPU)")
            if core < devices.WHOLE and gpus != 1:
                raise ArgsError(f"{field}.gpuCore", core, "a share of a GPU comes one GPU at a time (gpus: 1)")
            if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight <= 0:
                raise ArgsError(f"{field}.weight", weight, "must be a positive number")


def typical_pods(shapes: Mapping[Shape, float]) -> frag.TypicalPods:
    """Shapes with their weights as FGD's typical pods (milli-GPU; every GPU model accepted)."""
    items = sorted(shapes.items())
    total = sum(w for _, w in items)
    return frag.TypicalPods(
        cpu=np.array([s[0] for s, _ in items], dtype=np.int64),
        milli=np.array([s[2] * frag.MILLI // devices.WHOLE for s, _ in items], dtype=np.int64),
        gpus=np.array([s[1] for s, _ in items], dtype=np.int64),
        freq=np.array([w / total for _, w in items], dtype=np.float64),
        access=np.ones((len(items), 1), dtype=bool),
    )


class FGD:
    NAME: ClassVar[str] = NAME
    DYNAMIC: ClassVar[bool] = False  # GPU pods never batch (UNSIGNABLE); the others score 0
    NORMALIZES: ClassVar[bool] = False
    EVENTS: ClassVar[ClusterEvent] = ClusterEvent.ANY

    def __init__(self, args: FGDArgs | None = None) -> None:
        self.args = args or FGDArgs()
        self.learned: Counter[Shape] = Counter()
        self._typical = typical_pods(dict(self.args.typical)) if self.args.typical else None

    def sign(self, pod: PodInfo) -> Hashable:
        return UNSIGNABLE if GPU_KEYS & pod.pod.requests.keys() else ()

    def typical(self, req: devices.GpuRequest, cpu: int) -> frag.TypicalPods:
        """The configured typical pods, else those learned so far (this pod counted)."""
        if self._typical is not None:
            return self._typical
        self.learned[(cpu, req.count, req.core)] += 1
        return typical_pods(self.learned)

    def pre_score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Mask) -> Status:
        try:
            req = devices.gpu_request(pod.pod.requests)
        except ValueError:
            req = None  # DeviceShare's PreFilter has rejected such a pod already
        if req is None:
            return status.SKIP
        cpu_col = state.space.index["cpu"]
        typ = self.typical(req, int(pod.request[cpu_col]))
        rows = np.flatnonzero(feasible)
        n, table = state.size, state.gpus
        present = table.minor[:n][rows] >= 0
        gpu_left = np.where(present, table.free_core()[:n][rows] * (frag.MILLI // devices.WHOLE), -1)
        cpu_left = state.free[rows, cpu_col]
        model = np.zeros(len(rows), dtype=np.intp)
        before = frag.fragmentation(cpu_left, gpu_left, model, typ)
        milli = req.core * frag.MILLI // devices.WHOLE
        states, columns, after_left = frag.after_placing(gpu_left, req.count, milli)
        if req.count == 1 and req.shared:  # the GPU must take the share's memory-ratio too
            need = deviceshare.ratio_needed(req, table.memory[:n][rows][states, columns])
            ok = table.free_ratio()[:n][rows][states, columns] >= need
            states, columns, after_left = states[ok], columns[ok], after_left[ok]
        after = frag.fragmentation(cpu_left[states] - int(pod.request[cpu_col]), after_left, model[states], typ)
        moves = frag.score(before[states], after)
        scores = np.zeros(n, dtype=np.int64)
        # Per node its best move: the first of the highest (candidates come node by node, GPU by GPU).
        order = np.lexsort((np.arange(len(moves)), -moves, states))
        best = order[np.r_[True, states[order][1:] != states[order][:-1]]] if len(order) else order
        best_rows = rows[states[best]]
        scores[best_rows] = moves[best]
        shares = columns[best] >= 0
        preferred = dict(zip(best_rows[shares].tolist(),
                             table.minor[best_rows[shares], columns[best][shares]].tolist(), strict=True))
        cycle.write(NAME, scores)
        if preferred:
            cycle.write(deviceshare.PREFERRED, preferred)
        return status.SUCCESS

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, rows: Rows) -> Scores:
        scores = cycle.read(NAME)
        if scores is None:
            out: Scores = np.zeros(state.size, dtype=np.int64)[rows]
            return out
        return scores[rows]  # type: ignore[no-any-return]

    def normalize(self, cycle: CycleState, raw: Scores, feasible: Mask) -> Scores:
        return raw
