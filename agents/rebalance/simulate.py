"""The real scheduling core, run over the rebalancer's view to ask where a moved pod could go.

`Simulator` builds the library scheduler (`agents.scheduler.library.Scheduler`: the same
`SchedulerCore`, profiles and plugins the scheduler agents run) from the view's nodes and
bound pods, and answers `evaluate(pod)`: every node's filter verdict and score for the pod,
as if it were pending now. Pods with equal scheduling signatures get equal answers (the
core's own equivalence rule), so one evaluation serves each class until the state changes.

`place(pod, row)` assumes the pod on its planned destination (and asks the filters again
about that one node when the caller needs only feasibility, as the global planner does, so
that a cycle's cost does not grow with moves x classes x nodes). Nothing is ever taken away in
this state: a planned eviction's capacity is not credited until it has happened, so every
planned destination has room whatever order the moves run in.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from agents.rebalance.view import ClusterView
from agents.scheduler import koordinator
from agents.scheduler.framework.interface import PodInfo
from agents.scheduler.framework.profiles import SchedulerConfig
from agents.scheduler.framework.runtime import Evaluation, Framework
from agents.scheduler.library import Scheduler
from agents.state import cpus, devices
from schemas.records import Pod

DEVICES = "device or CPU-set claims (not simulated yet)"
NO_PROFILE = "no such scheduler profile"


def unsimulated(pod: Pod) -> str:
    """Why the simulator cannot place `pod` faithfully ("" when it can). The view knows each
    pod's request, not which GPUs, RDMA functions or CPUs it holds, so a destination for a pod
    that claims devices or bound CPUs could not be checked device by device."""
    requests = devices.with_gpu_totals(pod.requests)
    if devices.gpu_request(requests) is not None or devices.rdma_request(requests):
        return DEVICES
    try:
        qos = koordinator.qos_class(pod)
        bound = cpus.pod_cpu_request(qos, pod)
    except ValueError:
        return DEVICES
    return DEVICES if bound is not None else ""


class Simulator:
    def __init__(self, view: ClusterView, config: SchedulerConfig | None = None) -> None:
        extra = tuple(view.space.names)
        self.library = Scheduler(view.nodes, view.pods, profiles=config, resources=extra)
        if self.library.state.names != [n.name for n in view.nodes]:
            raise ValueError("nodes: names must be unique")
        self.view = view
        self._cache: dict[Hashable, tuple[Evaluation, PodInfo, Framework]] = {}
        self.evaluations = 0

    def schedules(self, pod: Pod) -> bool:
        """A profile schedules the pod (its schedulerName is one of them)."""
        return pod.scheduler_name in self.library.core.frameworks

    def key(self, pod: Pod) -> Hashable | None:
        """The pod's equivalence class for `evaluate` (its uid when it has none); None when
        no profile schedules it."""
        core = self.library.core
        fw = core.frameworks.get(pod.scheduler_name)
        if fw is None:
            return None
        signature = fw.signature(core.pod_info(pod))
        return (pod.scheduler_name, signature) if signature is not None else ("uid", pod.uid)

    def evaluate(self, pod: Pod, key: Hashable | None = None) -> Evaluation:
        key = self.key(pod) if key is None else key
        if key is None:
            raise ValueError(f"schedulerName={pod.scheduler_name!r}: {NO_PROFILE}")
        cached = self._cache.get(key)
        if cached is None:
            core = self.library.core
            info = core.pod_info(pod)
            fw = core.frameworks[pod.scheduler_name]
            cached = self._cache[key] = (fw.evaluate(info, partial=False), info, fw)
            self.evaluations += 1
        return cached[0]

    def place(self, pod: Pod, row: int, *, feasibility_only: bool = False) -> None:
        """The pod's replacement is planned on `row`: count it there from now on. The cached
        evaluations are dropped; with `feasibility_only` (a caller that reads only which
        nodes are feasible) they are kept, and only `row`'s verdict is asked again of the
        profile's filters: a filter judges each node on its own, and more load on a node never
        makes it feasible."""
        core = self.library.core
        state = self.library.state
        state.assume(f"rebalance/{pod.uid}", row, core.pod_info(pod).request)
        if not feasibility_only:
            self._cache.clear()
            return
        rows = np.array([row], dtype=np.intp)
        for ev, info, fw in self._cache.values():
            if ev.feasible[row]:
                ev.feasible[row] = all(bool(flt.filter(ev.cycle, info, state, rows)[0]) for flt in fw.profile.filter
                                       if flt.NAME not in ev.cycle.skip_filter)
                ev.total = None  # scores are stale now: a caller asking for them must not use them
