"""PrioritySort (QueueSort): higher priority first, then earlier arrival in the queue.

Members of a gang sort together, at the arrival of the gang's first member, so that two gangs
arriving interleaved are placed one after the other rather than each holding part of the
capacity the other needs (Koordinator's Coscheduling sorts by gang the same way)."""

from __future__ import annotations

from typing import Any, ClassVar

from agents.scheduler.framework.interface import PodInfo
from agents.scheduler.plugins.args import NoArgs

NAME = "PrioritySort"


class PrioritySort:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def sort_key(self, pod: PodInfo) -> tuple[Any, ...]:
        return (-pod.priority, pod.group_arrival or pod.arrival, pod.arrival)
