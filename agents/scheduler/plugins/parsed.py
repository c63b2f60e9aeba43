"""The shape of plugins driven by one thing parsed from the pod (a device request, a CPU
binding): parsed once per pod, part of its signature, checked in PreFilter.

A subclass says how to parse (`parse`: the request, None when the pod asks for nothing, or a
raised `FieldError` naming the field); this base caches the result on the pod, signs with it
(a pod that cannot be parsed is `UNSIGNABLE`), and in PreFilter rejects such a pod as
unresolvable, skips the plugin for a pod that asks for nothing, and leaves the request in the
cycle under the plugin's name for Filter and Reserve.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import ClassVar

from agents.scheduler.cluster import ClusterState
from agents.scheduler.framework import status
from agents.scheduler.framework.interface import UNSIGNABLE, CycleState, PodInfo
from agents.scheduler.framework.status import Status
from schemas.errors import FieldError


class ParsedPlugin(ABC):
    NAME: ClassVar[str]

    @abstractmethod
    def parse(self, pod: PodInfo) -> Hashable | None:
        """The pod's request for this plugin, None when it has none; raises FieldError."""

    def parsed(self, pod: PodInfo) -> Hashable | None | FieldError:
        cached = pod.derived.get(self.NAME, False)
        if cached is False:
            try:
                cached = self.parse(pod)
            except FieldError as exc:
                cached = exc
            pod.derived[self.NAME] = cached
        return cached  # type: ignore[no-any-return]

    def sign(self, pod: PodInfo) -> Hashable:
        request = self.parsed(pod)
        return UNSIGNABLE if isinstance(request, FieldError) else request

    def pre_filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Status:
        request = self.parsed(pod)
        if isinstance(request, FieldError):
            return status.unresolvable(self.NAME, str(request))
        if request is None:
            return status.SKIP
        cycle.write(self.NAME, request)
        return status.SUCCESS
