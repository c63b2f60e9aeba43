"""Reservations (Koordinator's `scheduling.koordinator.sh/v1alpha1` Reservation): the rules the
node owners and the schedulers share.

A reservation is scheduled like a pod from its template; once its node's owner commits it,
it holds its request on the node. Pods its owners match may consume it:

- **Aligned** (and Default, which Koordinator implements the same way): the pod takes what it
  can from the reservation's remainder and the rest from the node's free capacity.
- **Restricted**: for every resource the reservation holds, the pod's request must fit in the
  remainder; resources the reservation does not hold come from the node.

What a pod takes from the reservation is `consumed = min(request, remaining)` per resource the
reservation holds. The node's `used` counts each pod's full request plus each available
reservation's remainder, so a pod that consumes a reservation adds `request - consumed` to the
node. When the pod ends, its part goes back to the reservation (if still available). An
allocate-once reservation ends (Succeeded) when its first pod commits; an expired one ends
(Failed); either way its remainder stops being held.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas.errors import FieldError
from schemas.records import RESERVATION_POLICIES, Pod, Reservation, ReservationOwner

RESTRICTED = "Restricted"
AVAILABLE, SUCCEEDED, FAILED = "Available", "Succeeded", "Failed"
DELETED = "Deleted"  # the owners' mark of a reservation deleted while available (no event: it is gone)
REASON_EXPIRED, REASON_NODE_DELETED = "Expired", "NodeDeleted"
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def validate(r: Reservation) -> None:
    """Raise FieldError naming the first field that makes `r` unusable."""
    if not r.owners:
        raise FieldError("owners", [], "a reservation needs at least one owner (object, controller or labelSelector)")
    for i, owner in enumerate(r.owners):
        ways = [bool(owner.object_uid or owner.object_name), bool(owner.controller_uid or owner.controller_name),
                bool(owner.match_labels or owner.match_expressions)]
        if sum(ways) != 1:
            raise FieldError(f"owners[{i}]", owner, "an owner is exactly one of object, controller or labelSelector")
        for j, expr in enumerate(owner.match_expressions):
            operator = expr.get("operator")
            if operator not in SELECTOR_OPERATORS:
                raise FieldError(f"owners[{i}].labelSelector.matchExpressions[{j}].operator", operator,
                                 f"must be one of {list(SELECTOR_OPERATORS)}")
            if not expr.get("key"):
                raise FieldError(f"owners[{i}].labelSelector.matchExpressions[{j}].key", expr.get("key"), "is required")
            if operator in ("In", "NotIn") and not expr.get("values"):
                raise FieldError(f"owners[{i}].labelSelector.matchExpressions[{j}].values", expr.get("values"),
                                 f"{operator} needs at least one value")
    if r.allocate_policy not in RESERVATION_POLICIES:
        raise FieldError("allocatePolicy", r.allocate_policy, f"must be one of {[p for p in RESERVATION_POLICIES if p]}")
    if r.ttl_s is not None and r.expires is not None:
        raise FieldError("ttl", r.ttl_s, "ttl and expires cannot both be set")
    if r.ttl_s is not None and r.ttl_s < 0:
        raise FieldError("ttl", r.ttl_s, "cannot be negative")
    if not any(amount > 0 for name, amount in r.requests.items() if name != "pods"):
        raise FieldError("template.spec.containers[*].resources.requests", dict(r.requests),
                         "a reservation must reserve some resource")


def owner_matches(owner: ReservationOwner, pod: Pod) -> bool:
    if owner.object_uid or owner.object_name:
        if owner.object_uid:
            return owner.object_uid == pod.uid
        return owner.object_name == pod.name and (owner.object_namespace or pod.namespace) == pod.namespace
    if owner.controller_uid or owner.controller_name:
        for ref in pod.owner_references:
            if not ref.controller:
                continue
            if owner.controller_uid:
                if ref.uid == owner.controller_uid:
                    return True
            elif (ref.name == owner.controller_name and (not owner.controller_kind or ref.kind == owner.controller_kind)
                  and (owner.controller_namespace or pod.namespace) == pod.namespace):
                return True
        return False
    return selector_matches(owner.match_labels, owner.match_expressions, pod.labels)


def selector_matches(match_labels: Mapping[str, str], expressions: tuple[dict[str, Any], ...],
                     labels: Mapping[str, str]) -> bool:
    """A Kubernetes label selector: every matchLabels pair and every expression hold."""
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for expr in expressions:
        key, operator, values = expr.get("key", ""), expr.get("operator"), expr.get("values") or ()
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def matches(r: Reservation, pod: Pod) -> bool:
    """Any of the reservation's owners matches the pod (and the pod is not a reservation)."""
    return any(owner_matches(owner, pod) for owner in r.owners)


def consumed(request: Mapping[str, int], remaining: Mapping[str, int]) -> dict[str, int]:
    """What a pod takes from a reservation's remainder: min(request, remaining) per resource."""
    out = {}
    for name, amount in request.items():
        take = min(amount, remaining.get(name, 0))
        if take > 0:
            out[name] = take
    return out


def restricted_shortfall(request: Mapping[str, int], held: Mapping[str, int], remaining: Mapping[str, int]) -> str:
    """Under Restricted: the first resource the reservation holds whose remainder cannot cover
    the pod's request ("" when every one can). `pods` is left out: the reservation's own pod
    slot goes to its first consumer, later ones take theirs from the node."""
    for name, amount in request.items():
        if name != "pods" and amount > 0 and held.get(name, 0) > 0 and amount > remaining.get(name, 0):
            return name
    return ""
