"""The bound pods' columns (`BoundColumns`), kept as reports bind pods and terminate them, hold
exactly what a pass over `ClusterState.bound` gives, whatever the order of the changes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.scheduler.cluster import ClusterState
from agents.state.resources import ResourceSpace
from schemas.records import BoundPod, HoldStatus, NodeStateChange, ResourceList, hold_id
from tests.builders import make_node

NODES = ("n0", "n1", "n2")

# (node index, uid index, priority, cpu, commit (True) or terminate (False)); a termination
# with node index 0 goes to n0, else to where the pod is bound
steps = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 11), st.integers(-5, 5), st.integers(1, 4000),
                           st.booleans()), max_size=60)


def rebuilt(state: ClusterState) -> dict[str, tuple[object, ...]]:
    """What the columns should hold, by uid, from the pods bound."""
    return {uid: (p.row, p.pod.priority, tuple(p.vector.tolist()), p.pod.quota, p.pod.sandbox, p.pod.warm_pool)
            for uid, p in state.bound.items()}


def columns(state: ClusterState) -> dict[str, tuple[object, ...]]:
    arrays = state.bound_arrays()
    n = len(arrays.pods)
    assert all(len(a) == n for a in (arrays.rows, arrays.priorities, arrays.vectors, arrays.quotas,
                                     arrays.sandboxes, arrays.pools))
    out = {}
    for i, placed in enumerate(arrays.pods):
        assert placed.pod.uid not in out, "a pod in two slots"
        out[placed.pod.uid] = (int(arrays.rows[i]), int(arrays.priorities[i]), tuple(arrays.vectors[i].tolist()),
                               arrays.quotas[i], bool(arrays.sandboxes[i]), arrays.pools[i])
    return out


@settings(max_examples=200, deadline=None)
@given(steps)
def test_columns_equal_a_pass_over_the_bound_pods(changes: list[tuple[int, int, int, int, bool]]) -> None:
    state = ClusterState(ResourceSpace())
    for name in NODES:
        state.add_node(make_node(name, cpu=100_000))
    seqs = dict.fromkeys(NODES, 0)
    for node_i, uid_i, priority, cpu, commit in changes:
        node, uid = NODES[node_i], f"p{uid_i}"
        if not commit and uid in state.bound and node_i:  # mostly from where it is bound
            node = state.names[state.bound[uid].row]
        seqs[node] += 1
        if commit:  # committed (again, after a replay, with other fields: its slot is replaced)
            pod = BoundPod(uid=uid, name=uid, priority=priority, requests=ResourceList(cpu=cpu),
                           quota=f"q{cpu % 3}", sandbox=cpu % 2 == 0, warm_pool=f"w{priority % 2}")
            change = NodeStateChange(node=node, seq=seqs[node], committed=(pod,),
                                     holds={hold_id(uid, 0, node): HoldStatus.COMMITTED})
        else:  # terminated: leaves only from the node it is bound on
            change = NodeStateChange(node=node, seq=seqs[node], holds={hold_id(uid, 0, node): HoldStatus.TERMINATED})
        state.apply(change)
        assert columns(state) == rebuilt(state)
    arrays = state.bound_arrays()
    assert np.array_equal(arrays.rows, np.array([state.bound[p.pod.uid].row for p in arrays.pods], dtype=np.intp))


def test_columns_grow_past_their_first_capacity() -> None:
    state = ClusterState(ResourceSpace())
    state.add_node(make_node("n0", cpu=10**9))
    pods = [BoundPod(uid=f"p{i}", name=f"p{i}", priority=i, requests=ResourceList(cpu=1)) for i in range(2500)]
    for pod in pods:
        state.add_bound(pod, "n0")
    arrays = state.bound_arrays()
    assert len(arrays.pods) == 2500 and sorted(arrays.priorities.tolist()) == list(range(2500))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 9), st.integers(0, 3)), max_size=50))
def test_columns_from_one_slot_and_what_was_read_stays_as_it_was(changes: list[tuple[bool, int, int]]) -> None:
    """From a capacity of one (every growth taken), the columns are the pods put and not
    removed; arrays read earlier stay what they were through later changes."""
    from agents.scheduler.cluster import BoundColumns, PodOnNode

    columns_ = BoundColumns(width=2, capacity=1)
    model: dict[str, tuple[int, int]] = {}
    read: list[tuple[object, dict[str, tuple[int, int]]]] = []
    for put, uid_i, row in changes:
        uid = f"p{uid_i}"
        if put:
            pod = BoundPod(uid=uid, name=uid, priority=row, requests=ResourceList(cpu=row + 1))
            columns_.put(PodOnNode(row, np.array([row + 1, 1], dtype=np.int64), pod))
            model[uid] = (row, row)
        else:
            columns_.remove(uid)
            model.pop(uid, None)
        arrays = columns_.arrays()
        assert {p.pod.uid: (int(r), int(q)) for p, r, q in zip(arrays.pods, arrays.rows, arrays.priorities,
                                                                strict=True)} == model
        read.append((arrays, dict(model)))
    for arrays, then in read:
        assert {p.pod.uid: (int(r), int(q)) for p, r, q in zip(arrays.pods, arrays.rows, arrays.priorities,  # type: ignore[attr-defined]
                                                                strict=True)} == then
