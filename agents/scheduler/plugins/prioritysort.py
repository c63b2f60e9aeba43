"""PrioritySort (QueueSort): higher priority first, then earlier arrival in the queue."""

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
        return (-pod.priority, pod.arrival)
