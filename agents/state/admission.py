"""The admission rule: does a claim fit on a node, next to the holds and nominations there.

A node admits a claim when, for every resource the claim requests (amount > 0),

    room = free - promised + reserved + yieldable >= amount

- `free`: allocatable less what the node's pods take (committed and held claims, the scheduler's
  assumed ones, what each available reservation still keeps for its consumers);
- `promised`: the claims of the *other* pods nominated on the node with equal or higher
  priority (`counts_against`: a preemptor is not blocked by its own nomination, nor by those
  it outranks; DESIGN.md, safety rule 8);
- `reserved`: what the reservation the claim consumes still keeps for it;
- `yieldable`: for a gang member, what lower-ranked gangs hold there without being accepted
  (their owner asks them to yield: wound-wait).

Two callers, one rule: the node owners decide a claim with it (`NodeOwner._refusal` through
`shortfall`: `room` per requested resource on Python ints, from the node's state), and the
scheduler's NodeResourcesFit filters every node at once with it (`room` and `admits` on rows x
resource columns, from its replica; `copies` for an equivalence class). Which nominations count
is `counts_against`, on both sides, also for the devices a nomination names.
`tests/unit/test_admission.py` checks that an owner and a scheduler replica fed the owner's
reports agree on random nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar, overload

import numpy as np
import numpy.typing as npt

Amounts = npt.NDArray[np.int64]
A = TypeVar("A", int, npt.NDArray[np.int64])  # amounts: arrays (rows x resources), or one Python int


@overload
def counts_against(priority: int, uid: str, claim_priority: int, claim_uid: str) -> bool: ...
@overload
def counts_against(priority: npt.NDArray[np.int64], uid: npt.NDArray[np.object_],
                   claim_priority: int, claim_uid: str) -> npt.NDArray[np.bool_]: ...
def counts_against(priority: Any, uid: Any, claim_priority: int, claim_uid: str) -> Any:
    """Whether a nomination (its pod's priority and uid, or arrays of them) takes its claim
    from a node for the claim of another pod: it is another pod's, with equal or higher
    priority."""
    return (priority >= claim_priority) & (uid != claim_uid)


def room(free: A, promised: A | None = None, reserved: A | None = None, yieldable: A | None = None) -> A:
    """What a claim may take on each row: free - promised + reserved + yieldable (absent
    terms are zero)."""
    out = free
    if promised is not None:
        out = out - promised
    if reserved is not None:
        out = out + reserved
    if yieldable is not None:
        out = out + yieldable
    return out


def admits(room: Amounts, request: Amounts, columns: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_]:
    """Per row: room >= request in every requested column (`columns`: where request > 0).

    Column by column: numpy reduces a short second axis (`.all(axis=1)` over 2-9 columns)
    several times slower than it compares a few whole columns."""
    if not len(columns):
        return np.ones(len(room), dtype=bool)
    first = int(columns[0])
    out: npt.NDArray[np.bool_] = room[:, first] >= request[first]
    for col in columns[1:].tolist():
        out &= room[:, col] >= request[col]
    return out


def copies(room: list[int], request: list[int], columns: list[int], limit: int) -> int:
    """How many copies of the claim one row admits, one after another (at most `limit`):
    the one-row, Python-int form of `admits`, for placing an equivalence class in bulk."""
    count = limit
    for c in columns:  # every requested column is positive
        count = min(count, max(room[c], -1) // request[c])
    return max(count, 0)


def copies_rows(room: Amounts, request: Amounts, columns: npt.NDArray[np.intp], limit: int) -> Amounts:
    """`copies` for many rows at once (rows x resources): per row, how many copies of the
    claim it admits one after another, at most `limit`."""
    count: Amounts = np.full(len(room), limit, dtype=np.int64)
    for c in columns.tolist():  # every requested column is positive
        np.minimum(count, np.maximum(room[:, c], -1) // request[c], out=count)
    np.maximum(count, 0, out=count)
    return count


def shortfall(allocatable: Mapping[str, int], used: Mapping[str, int], request: Mapping[str, int],
              promised: Iterable[Mapping[str, int]] = (), reserved: Mapping[str, int] | None = None) -> str:
    """The owner's form: the first requested resource (in the request's order) the node cannot
    give the claim, or "" when it admits it: `room` per resource, on Python ints (a claim
    names a few resources; numpy's per-call cost would be most of it)."""
    promised = list(promised)
    for name, amount in request.items():
        if amount <= 0:
            continue
        taken = sum(p.get(name, 0) for p in promised) if promised else None
        kept = reserved.get(name, 0) if reserved else None
        if room(allocatable.get(name, 0) - used.get(name, 0), taken, kept) < amount:
            return name
    return ""
