"""`NodeState.used` comes from the sum its holds keep as they change (`owner.Holds`), and so
do `device_usage` and whether a gang member is held: after any sequence of what can happen to
a node's holds (added, replaced, removed in every way a dict allows, their status, requests,
reservation, devices or gang size assigned, other fields assigned, a hold copied, or put into
a second node or under a second hold id), each equals what a pass over the holds gives, on
every node involved (and `used` on a copy restored from its table value). The same for the
holds of the table value (`NodeState.to_json`), made from what changed since the last one."""

from __future__ import annotations

import copy
import pickle
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from agents.state import devices
from agents.state.owner import (
    COMMITTED,
    HELD,
    REJECTED,
    RELEASED,
    TERMINATED,
    HoldEntry,
    Holds,
    NodeState,
)

STATUSES = [HELD, COMMITTED, RELEASED, REJECTED, TERMINATED]
REQUESTS = st.dictionaries(st.sampled_from(["cpu", "memory", "pods", "nvidia.com/gpu"]), st.integers(0, 5000),
                           max_size=3)
DEVICES = st.sampled_from([[], [], ["gpu/0/50/50"], ["gpu/1/100/100"], ["gpu/0/25/50", "rdma/0/1"],
                           ["cpuset/0/0,1,2,3/2048"], ["cpuset/0/2,3,4,5"], ["cpuset/1/8,9"]])
HOLD = st.builds(lambda uid, requests, status, reserving, claimed, gang_min: HoldEntry(
    uid=uid, attempt=1, decision_key=uid, requests=requests, priority=0, status=status,
    reserving={"uid": uid} if reserving else None, devices=claimed, gang_min=gang_min),
    st.sampled_from("abcdef"), REQUESTS, st.sampled_from(STATUSES), st.booleans(), DEVICES, st.integers(0, 3))
HIDS = st.sampled_from([f"h{i}" for i in range(6)])
OP = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 1), HIDS, HOLD),
    st.tuples(st.just("del"), st.integers(0, 1), HIDS, st.sampled_from(["del", "pop", "popitem", "clear"])),
    st.tuples(st.just("set"), st.integers(0, 1), HIDS, st.one_of(
        st.tuples(st.just("status"), st.sampled_from(STATUSES)),
        st.tuples(st.just("requests"), REQUESTS),
        st.tuples(st.just("reserving"), st.sampled_from([None, {"uid": "r"}])),
        st.tuples(st.just("devices"), DEVICES),
        st.tuples(st.just("gang_min"), st.integers(0, 3)),
        st.tuples(st.just("reason"), st.just("x")))),
    st.tuples(st.just("share"), st.integers(0, 1), HIDS, HIDS),  # into the other node, or under another id
    st.tuples(st.just("copy"), st.integers(0, 1), HIDS, st.sampled_from(STATUSES)),
    st.tuples(st.just("bulk"), st.integers(0, 1), HIDS, HOLD),  # update / setdefault / |=
)


def apply(nodes: list[NodeState], op: tuple[Any, ...]) -> None:
    kind, n, hid, arg = op
    holds = nodes[n].holds
    if kind == "put":
        holds[hid] = arg
    elif kind == "del" and holds:
        if arg == "del" and hid in holds:
            del holds[hid]
        elif arg == "pop":
            holds.pop(hid, None)
        elif arg == "popitem":
            holds.popitem()
        elif arg == "clear":
            holds.clear()
    elif kind == "set" and hid in holds:
        setattr(holds[hid], *arg)
    elif kind == "share" and hid in holds:
        other = nodes[1 - n].holds if hid != arg else holds
        other[arg if hid != arg else hid + "'"] = holds[hid]
    elif kind == "copy" and hid in holds:
        twin = copy.copy(holds[hid])
        twin.status = arg  # a copy is no member: nothing changes for the node
    elif kind == "bulk":
        holds.update({hid: arg})
        holds.setdefault(hid + "*", arg) if hid.endswith("0") else None
        holds |= {}


def a_hold(uid: str = "a", cpu: int = 500, status: str = HELD) -> HoldEntry:
    return HoldEntry(uid=uid, attempt=1, decision_key=uid, requests={"cpu": cpu}, priority=0, status=status)


A = a_hold()  # (the examples below change it: a hold met again in a later example is one moved between nodes)


@settings(max_examples=400, deadline=None)
@given(st.lists(OP, max_size=30))
@example([("put", 0, "h0", A), ("share", 0, "h0", "h1"), ("set", 0, "h0", ("status", RELEASED))])  # two nodes
@example([("put", 0, "h0", A), ("share", 0, "h0", "h0"), ("set", 0, "h0", ("requests", {"cpu": 1}))])  # two ids
@example([("put", 0, "h0", A), ("copy", 0, "h0", RELEASED)])
@example([("put", 0, "h0", A), ("set", 0, "h0", ("reserving", {"uid": "r"})), ("set", 0, "h0", ("reserving", None))])
def test_the_kept_sum_is_the_sum_afresh(ops: list[tuple[Any, ...]]) -> None:
    nodes = [NodeState("n0"), NodeState("n1")]
    for op in ops:
        apply(nodes, op)
        for node in nodes:
            assert isinstance(node.holds, Holds)
            assert node.used() == node.count_used(), op
            if op[0] != "share":  # (a table value made only now and then: whatever changed between)
                assert NodeState.from_json(node.to_json()).used() == node.count_used()
            usage: dict[str, int] = {}
            for hold in node.holds.values():
                if hold.status in (HELD, COMMITTED):
                    devices.add_usage(usage, hold.devices)
            assert node.device_usage() == usage, op
            for hid in node.holds:  # less one hold, as a claim asks again for its own
                usage = {}
                for other, hold in node.holds.items():
                    if hold.status in (HELD, COMMITTED) and other != hid:
                        devices.add_usage(usage, hold.devices)
                assert node.device_usage(frozenset({hid})) == usage, op
            value = node.to_json()["holds"]
            assert list(value.items()) == [(hid, hold.plain()) for hid, hold in node.holds.items()], op
            gang = any(h.status == HELD and h.gang_min > 1 for h in node.holds.values())
            assert node.gang_held() == gang or not node.holds.tracked and node.gang_held(), op


def test_copies_and_pickles_tally_their_own_holds() -> None:
    """A copied or unpickled node or hold is in no `Holds` but its own (`tests/logs.py`
    deep-copies the owners' states at each simulated crash): its sums are right and kept."""
    node = NodeState("n0")
    node.holds.update({"a": a_hold(), "b": a_hold("b", 200, COMMITTED)})
    for twin in (copy.deepcopy(node), pickle.loads(pickle.dumps(node))):
        assert twin.holds.tracked and twin.used() == twin.count_used() == {"cpu": 700}
        twin.holds["a"].status = RELEASED
        assert twin.used() == twin.count_used() == {"cpu": 200}
        assert node.used() == node.count_used() == {"cpu": 700}  # the original is untouched
    node.to_json()
    del node.holds["b"]  # removed after a table value was made, then copied: the copy's value lacks it too
    for twin in (copy.deepcopy(node), pickle.loads(pickle.dumps(node))):
        assert list(twin.to_json()["holds"]) == ["a"] == list(node.to_json()["holds"])
    node.holds["b"] = a_hold("b", 200, COMMITTED)
    for hold in (copy.copy(node.holds["a"]), copy.deepcopy(node.holds["a"]), pickle.loads(pickle.dumps(node.holds["a"]))):
        hold.status = RELEASED  # no member of the original
        assert node.holds.tracked and node.used() == node.count_used() == {"cpu": 700}


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({"uid": st.text(max_size=4), "attempt": st.integers(0, 9), "decision_key": st.text(max_size=4),
                              "requests": st.dictionaries(st.sampled_from(["cpu", "memory"]), st.integers(0, 99)),
                              "priority": st.integers(-9, 9), "status": st.sampled_from([HELD, RELEASED])},
                             optional={"reason": st.text(max_size=3), "devices": st.lists(st.text(max_size=3), max_size=2),
                                       "consumed": st.dictionaries(st.just("cpu"), st.integers(0, 9)),
                                       "reserving": st.none() | st.just({"uid": "r"}), "created": st.floats(0, 9),
                                       "yields": st.dictionaries(st.text(max_size=2), st.lists(st.text(max_size=2))),
                                       "sandbox": st.booleans(), "warm_pool": st.text(max_size=3)}))
def test_the_quick_init_builds_what_the_dataclass_init_builds(kwargs: dict[str, Any]) -> None:
    quick = HoldEntry(**kwargs)
    careful = object.__new__(HoldEntry)
    HoldEntry.__dataclass_init__(careful, **kwargs)  # type: ignore[attr-defined]
    assert list(quick.__dict__.items()) == list(careful.__dict__.items())  # the same keys, in the same order
    assert quick.plain() == careful.plain() and list(quick.plain()) == list(careful.plain())
    import inspect

    dataclass_init = inspect.signature(HoldEntry.__dataclass_init__)  # type: ignore[attr-defined]
    assert inspect.signature(HoldEntry) == dataclass_init.replace(parameters=list(dataclass_init.parameters.values())[1:])
    bare = {k: v for k, v in kwargs.items() if k not in ("devices", "consumed", "yields")}
    one, other = HoldEntry(**bare), HoldEntry(**bare)
    assert one.devices is not other.devices and one.consumed is not other.consumed  # a factory per hold
