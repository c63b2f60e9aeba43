"""Helpers for the framework and plugin tests: a state from nodes, a PodInfo from a pod, and
each extension point run the way the runtime runs it."""

from __future__ import annotations

from typing import Any

import numpy as np

from agents.scheduler.cluster import ClusterState
from agents.scheduler.framework.interface import ALL, CycleState, PodInfo
from agents.scheduler.framework.status import Code
from agents.state.devices import with_gpu_totals
from agents.state.resources import ResourceSpace
from schemas.records import BoundPod, Node, Pod, decision_key

SPACE = ResourceSpace()


def state_of(*nodes: Node, bound: dict[str, list[BoundPod]] | None = None) -> ClusterState:
    return ClusterState.from_records(SPACE, nodes, bound)


def info(pod: Pod) -> PodInfo:
    """The pod as the framework sees it, with its own priority (no Koordinator defaults)."""
    request = SPACE.pod_request(with_gpu_totals(pod.requests))
    return PodInfo(pod, request, np.flatnonzero(request),
                   decision_key(pod.namespace, pod.labels, pod.annotations, pod.uid), profile=pod.scheduler_name,
                   priority=pod.priority, qos=pod.qos_class)


def prepared(plugin: Any, pod: PodInfo, state: ClusterState) -> CycleState:
    cycle = CycleState()
    if hasattr(plugin, "pre_filter"):
        status = plugin.pre_filter(cycle, pod, state)
        if status.code == Code.SKIP:
            cycle.skip_filter.add(plugin.NAME)
    return cycle


def run_filter(plugin: Any, pod: Pod, state: ClusterState) -> list[bool]:
    p = info(pod)
    cycle = prepared(plugin, p, state)
    if plugin.NAME in cycle.skip_filter:
        return [True] * state.size
    return [bool(x) for x in plugin.filter(cycle, p, state, ALL)]


def run_score(plugin: Any, pod: Pod, state: ClusterState) -> list[int] | None:
    """Normalized scores over every node, or None when PreScore skips the plugin."""
    p = info(pod)
    cycle = prepared(plugin, p, state)
    feasible = state.schedulable_rows().copy()
    if hasattr(plugin, "pre_score") and plugin.pre_score(cycle, p, state, feasible).code == Code.SKIP:
        return None
    raw = plugin.score(cycle, p, state, ALL)
    if plugin.NORMALIZES:
        raw = plugin.normalize(cycle, raw, feasible)
    return [int(x) for x in raw]
