"""The result of a plugin call: a code and, when something failed, the reasons.

Codes (kube-scheduler's, with the same meaning):
- `SUCCESS`: the plugin ran and the pod may go on.
- `ERROR`: something broke inside the plugin or its input; the pod is not placed this cycle.
- `UNSCHEDULABLE`: the pod does not fit now; preemption or a cluster change may help.
- `UNSCHEDULABLE_AND_UNRESOLVABLE`: the pod cannot fit and preemption cannot help (a wrong
  node selector, a malformed affinity): it is parked until the pod or the cluster changes.
- `WAIT`: Permit only: the pod stays reserved until it is allowed, rejected or times out.
- `SKIP`: PreFilter / PreScore only: the plugin has nothing to do for this pod, and its
  Filter / Score are skipped for the cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Code(IntEnum):
    SUCCESS = 0
    ERROR = 1
    UNSCHEDULABLE = 2
    UNSCHEDULABLE_AND_UNRESOLVABLE = 3
    WAIT = 4
    SKIP = 5


@dataclass(frozen=True, slots=True)
class Status:
    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    plugin: str = ""
    timeout_s: float = 0.0  # WAIT only: how long Permit lets the pod wait

    @property
    def ok(self) -> bool:
        return self.code == Code.SUCCESS

    @property
    def rejected(self) -> bool:
        return self.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE, Code.ERROR)

    def message(self) -> str:
        return "; ".join(self.reasons) or self.code.name


SUCCESS = Status()
SKIP = Status(Code.SKIP)


def unschedulable(plugin: str, *reasons: str) -> Status:
    return Status(Code.UNSCHEDULABLE, reasons, plugin)


def unresolvable(plugin: str, *reasons: str) -> Status:
    return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reasons, plugin)


def error(plugin: str, *reasons: str) -> Status:
    return Status(Code.ERROR, reasons, plugin)


def wait(plugin: str, timeout_s: float, *reasons: str) -> Status:
    return Status(Code.WAIT, reasons, plugin, timeout_s)
