"""The one plugin registry: plugin name -> (factory, args type). No import-time magic.

A factory takes the plugin's validated args and returns the plugin. Every args type is a frozen
dataclass with defaults, built from the profile's `pluginConfig` by `args_from_mapping` and
checked by its `validate()`, which raises `ArgsError` naming the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agents.scheduler.plugins import (
    defaultbinder,
    defaultpreemption,
    deviceshare,
    elasticquota,
    fgd,
    nodeaffinity,
    nodenumaresource,
    noderesources,
    nodeunschedulable,
    prioritysort,
    reservation,
    tainttoleration,
)
from agents.scheduler.plugins.args import NoArgs, reject_unknown


@dataclass(frozen=True)
class Registration:
    factory: Callable[[Any], object]
    args_type: type[Any]


REGISTRY: dict[str, Registration] = {
    prioritysort.NAME: Registration(prioritysort.PrioritySort, NoArgs),
    nodeunschedulable.NAME: Registration(nodeunschedulable.NodeUnschedulable, NoArgs),
    tainttoleration.NAME: Registration(tainttoleration.TaintToleration, NoArgs),
    nodeaffinity.NAME: Registration(nodeaffinity.NodeAffinity, nodeaffinity.NodeAffinityArgs),
    noderesources.FIT_NAME: Registration(noderesources.Fit, noderesources.FitArgs),
    noderesources.BALANCED_NAME: Registration(noderesources.BalancedAllocation, noderesources.BalancedAllocationArgs),
    defaultpreemption.NAME: Registration(defaultpreemption.DefaultPreemption, defaultpreemption.PreemptionArgs),
    defaultbinder.NAME: Registration(defaultbinder.DefaultBinder, NoArgs),
    deviceshare.NAME: Registration(deviceshare.DeviceShare, NoArgs),
    elasticquota.NAME: Registration(elasticquota.ElasticQuota, elasticquota.ElasticQuotaArgs),
    nodenumaresource.NAME: Registration(nodenumaresource.NodeNUMAResource, NoArgs),
    reservation.NAME: Registration(reservation.Reservation, NoArgs),
    fgd.NAME: Registration(fgd.FGD, fgd.FGDArgs),
}


# The default plugins of every profile, in order, with their default score weights
# (kube-scheduler's, then Koordinator's).
DEFAULT_PLUGINS: tuple[tuple[str, int], ...] = (
    (prioritysort.NAME, 0),
    (nodeunschedulable.NAME, 0),
    (nodeaffinity.NAME, 2),
    (tainttoleration.NAME, 3),
    (noderesources.FIT_NAME, 1),
    (noderesources.BALANCED_NAME, 1),
    (deviceshare.NAME, 0),
    (elasticquota.NAME, 0),
    (nodenumaresource.NAME, 0),
    (reservation.NAME, reservation.DEFAULT_WEIGHT),
    (defaultpreemption.NAME, 0),
    (defaultbinder.NAME, 0),
)


def args_from_mapping(args_type: type[Any], raw: Mapping[str, Any] | None) -> Any:
    """Build and validate a plugin's args from YAML; unknown fields are errors."""
    raw = dict(raw or {})
    convert = getattr(args_type, "from_mapping", None)  # YAML names differ: it checks them itself
    if convert is None:
        reject_unknown(raw, {f.name for f in dataclasses.fields(args_type)})
    args = convert(raw) if convert is not None else args_type(**raw)
    args.validate()
    return args
