"""NodeResourcesFit and NodeResourcesBalancedAllocation (kube-scheduler's `noderesources`)."""

from agents.scheduler.plugins.noderesources.balanced_allocation import (
    NAME as BALANCED_NAME,
)
from agents.scheduler.plugins.noderesources.balanced_allocation import (
    BalancedAllocation,
    BalancedAllocationArgs,
)
from agents.scheduler.plugins.noderesources.fit import NAME as FIT_NAME
from agents.scheduler.plugins.noderesources.fit import Fit, FitArgs

__all__ = ["BALANCED_NAME", "FIT_NAME", "BalancedAllocation", "BalancedAllocationArgs", "Fit", "FitArgs"]
