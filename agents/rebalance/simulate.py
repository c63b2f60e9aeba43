"""The real scheduling core, run over the rebalancer's view to ask where a moved pod could go.

`Simulator` builds the library scheduler (`agents.scheduler.library.Scheduler`: the same
`SchedulerCore`, profiles and plugins the scheduler agents run) from the view's nodes and
bound pods, and answers `evaluate(pod)`: every node's filter verdict and score for the pod,
as if it were pending now. Pods with equal scheduling signatures get equal answers (the
core's own equivalence rule), so one evaluation serves each class until the state changes.

`place(pod, row)` assumes the pod on its planned destination. Nothing is ever taken away in
this state: a planned eviction's capacity is not credited until it has happened, so every
planned destination has room whatever order the moves run in.
"""

from __future__ import annotations

from collections.abc import Hashable

from agents.rebalance.view import ClusterView
from agents.scheduler.framework.profiles import SchedulerConfig
from agents.scheduler.framework.runtime import Evaluation
from agents.scheduler.library import Scheduler
from schemas.records import Pod


class Simulator:
    def __init__(self, view: ClusterView, config: SchedulerConfig | None = None) -> None:
        extra = tuple(view.space.names)
        self.library = Scheduler(view.nodes, view.pods, profiles=config, resources=extra)
        if self.library.state.names != [n.name for n in view.nodes]:
            raise ValueError("nodes: names must be unique")
        self.view = view
        self._cache: dict[Hashable, Evaluation] = {}
        self.evaluations = 0

    def key(self, pod: Pod) -> Hashable:
        """The pod's equivalence class for `evaluate` (its uid when it has none)."""
        core = self.library.core
        fw = core.frameworks.get(pod.scheduler_name)
        if fw is None:
            raise ValueError(f"schedulerName={pod.scheduler_name!r}: no such profile (profiles: {', '.join(core.frameworks)})")
        signature = fw.signature(core.pod_info(pod))
        return (pod.scheduler_name, signature) if signature is not None else ("uid", pod.uid)

    def evaluate(self, pod: Pod, key: Hashable | None = None) -> Evaluation:
        key = self.key(pod) if key is None else key
        ev = self._cache.get(key)
        if ev is None:
            ev = self._cache[key] = self.library.core.explain(pod)
            self.evaluations += 1
        return ev

    def place(self, pod: Pod, row: int) -> None:
        """The pod's replacement is planned on `row`: count it there from now on."""
        core = self.library.core
        self.library.state.assume(f"rebalance/{pod.uid}", row, core.pod_info(pod).request)
        self._cache.clear()
