"""Safety of the commit protocol under interleavings (hypothesis), with the real cores.

The model: every node owner and every decider consumes its own input log (a list standing in
for a Kafka partition) one record at a time. It may persist its state and offset (a table
write plus an offset commit) at any point (the table ahead of the offset), commit its offset once its outputs are
acknowledged, and crash at any point: its state goes back to the last persisted snapshot and
it replays its log from the committed offset, re-sending
outputs that were already appended (no transactions). Outputs reach the broker only when
flushed, possibly in part; a crash loses what was not flushed, while the table write may
already be persisted. On top: duplicated deliveries, a second
claim for the same pod on another node, claims after the pod was bound, deletions while held,
and terminations racing commits. Pods c and d form a gang (min-available 2, one decider for
both); its timers fire as records at any time, and once everything else is drained for every
round still waiting (as the deciders' agent re-arms them). After the run every log is drained.

Invariants: no pod bound to two nodes; no node over-committed at any moment, both in the
owners' own accounting and as recomputed by the independent checker from the Bindings and
terminations; no capacity leaked (no hold left `held` once everything is delivered); and no
Commit ever reached a hold that was not held.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agents.ports import Output
from agents.state.ledger import Decider, Decision, LedgerState
from agents.state.owner import HELD, NodeOwner, NodeState, OwnerResult
from perf.checker import Placement, check
from schemas import topics
from schemas.records import (
    Binding,
    Claim,
    GangTimeout,
    PodDeleted,
    PodTerminated,
    Requeue,
    ResourceList,
)
from tests.builders import make_node
from tests.logs import Actor

NODES = ["n0", "n1", "n2"]
PODS = ["a", "b", "c", "d"]
CPU = {"a": 600, "b": 500, "c": 400, "d": 700}
ALLOC = 1000
GANG = "ns/g"
KEY = {"a": "a", "b": "b", "c": GANG, "d": GANG}  # a pod's decision key: c and d are one gang
GANG_MIN = {"c": 2, "d": 2}
KEYS = ["a", "b", GANG]


class World:
    def __init__(self) -> None:
        self.owners = {n: Actor(state=NodeState(n)) for n in NODES}
        self.deciders = {k: Actor(state=LedgerState(k)) for k in KEYS}
        for n, owner in self.owners.items():
            owner.log.append(make_node(n, cpu=ALLOC))
            owner.commit()
        for decider in self.deciders.values():
            decider.commit()
        self.attempt = dict.fromkeys(PODS, 0)
        self.bindings: list[Binding] = []
        self.events: list[tuple[int, str, str, str]] = []  # (time, bind/free, uid, node)
        self.problems: list[str] = []
        self.clock = 0

    def route(self, outputs: list[Output]) -> None:
        for out in outputs:
            r = out.record
            if out.topic == topics.NODE_INBOX:
                self.owners[out.key].log.append(r)
            elif out.topic == topics.HOLDS:
                self.deciders[out.key].log.append(r)
            elif out.topic == topics.REQUEUE:
                assert isinstance(r, Requeue)
                self.attempt[r.uid] = max(self.attempt[r.uid], r.attempt)
            elif out.topic == topics.BINDINGS:
                assert isinstance(r, Binding)
                self.bindings.append(r)
                self.events.append((self.tick(), "bind", r.uid, r.node))

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def step_owner(self, node: str) -> None:
        actor = self.owners[node]
        record = actor.take()
        if record is None:
            return
        result = OwnerResult()
        state = actor.state
        assert isinstance(state, NodeState)
        NodeOwner().apply(state, [record], result)
        self.problems += [p.error for p in result.problems]
        if isinstance(record, PodTerminated):
            self.events.append((self.tick(), "free", record.uid, node))
        used = state.used().get("cpu", 0)
        assert used <= ALLOC, f"{node} over-committed in the owner's own accounting: {used}"
        actor.outgoing += result.outputs

    def step_decider(self, key: str) -> None:
        actor = self.deciders[key]
        record = actor.take()
        if record is None:
            return
        decision = Decision()
        state = actor.state
        assert isinstance(state, LedgerState)
        Decider().apply(state, [record], decision, batch=actor.batch())
        self.problems += [p.error for p in decision.problems]
        actor.outgoing += decision.first + decision.after_commit  # the Commit is on the broker first

    def flush(self, actor: Actor, count: int) -> None:
        """The broker acknowledges the first `count` outputs of `actor`, in order."""
        sent, actor.outgoing = actor.outgoing[:count], actor.outgoing[count:]
        self.route(sent)

    def claim(self, uid: str, node: str) -> None:
        self.owners[node].log.append(Claim(uid=uid, attempt=self.attempt[uid], node=node, decision_key=KEY[uid],
                                           requests=ResourceList(cpu=CPU[uid], pods=1), gang_min=GANG_MIN.get(uid, 0)))

    def fire_timers(self) -> bool:
        """Every gang still waiting gets its round's timeout (the agent re-arms timers for every
        waiting gang of its table); whether one was due."""
        due = False
        for key, actor in self.deciders.items():
            state = actor.state
            assert isinstance(state, LedgerState)
            if state.waiting and state.timer_s:
                actor.log.append(GangTimeout(decision_key=key, round=state.round))
                due = True
        return due

    def drain(self) -> None:
        actors = [*self.owners.values(), *self.deciders.values()]
        while True:
            while any(a.pos < len(a.log) or a.outgoing for a in actors):
                for n in NODES:
                    self.step_owner(n)
                for k in KEYS:
                    self.step_decider(k)
                for a in actors:
                    self.flush(a, len(a.outgoing))
            if not self.fire_timers():
                return


ACTIONS = st.tuples(
    st.sampled_from(["owner", "decider", "flush", "claim", "persist", "commit", "crash", "duplicate", "delete", "terminate",
                     "timeout"]),
    st.integers(0, 99), st.integers(0, 99),
)


# A decider records a Release, its table is persisted, it crashes before the Release is
# acknowledged, and replays the Held: only re-sending the recorded Release frees the hold.
CRASH_AFTER_PERSIST = [
    ("claim", 0, 0), ("owner", 0, 1), ("owner", 0, 1), ("decider", 1, 0),
    ("claim", 1, 0), ("owner", 1, 1), ("owner", 1, 1), ("decider", 0, 0),
    ("persist", 3, 0), ("crash", 3, 0),
]

# A gang member is held and waits; the decider commits its offset. The second member completes
# the gang, the table is persisted and the decider crashes before any output is acknowledged:
# only the second Held is replayed, and it must re-send the first member's Commit too.
GANG_CRASH = [
    ("claim", 0, 2), ("owner", 0, 1), ("owner", 0, 1), ("decider", 0, 2), ("commit", 5, 0),
    ("claim", 1, 3), ("owner", 1, 1), ("owner", 1, 1), ("decider", 0, 3), ("persist", 5, 0), ("crash", 5, 0),
]
# A waiting gang member is deleted; the decider persists and crashes before its Release is out.
GANG_DELETE_CRASH = [
    ("claim", 0, 2), ("owner", 0, 1), ("owner", 0, 1), ("decider", 0, 2), ("commit", 5, 0),
    ("delete", 0, 2), ("decider", 0, 2), ("persist", 5, 0), ("crash", 5, 0),
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ACTIONS, min_size=1, max_size=120))
@example(CRASH_AFTER_PERSIST)
@example(GANG_CRASH)
@example(GANG_DELETE_CRASH)
def test_no_double_binding_no_overcommit_no_leak(actions: list[tuple[str, int, int]]) -> None:
    world = World()
    for action, i, j in actions:
        node, pod = NODES[i % len(NODES)], PODS[j % len(PODS)]
        actors = [*world.owners.values(), *world.deciders.values()]
        if action == "owner":
            world.step_owner(node)
            if j % 2:  # often acknowledged at once, sometimes left in flight
                world.flush(world.owners[node], 99)
        elif action == "decider":
            world.step_decider(KEY[pod])
            if i % 2:
                world.flush(world.deciders[KEY[pod]], 99)
        elif action == "flush":  # a partial flush: some outputs acknowledged, the rest still in flight
            world.flush(actors[(i + j) % len(actors)], i % 4)
        elif action == "claim":  # also: a second claim on another node, a claim after binding
            world.claim(pod, node)
        elif action == "persist":  # the table may be ahead of the committed offset
            actors[(i + j) % len(actors)].persist_state()
        elif action == "commit":
            actors[(i + j) % len(actors)].commit()
        elif action == "crash":  # restart and replay from the last persisted offset
            actors[(i + j) % len(actors)].crash()
        elif action == "duplicate":  # at-least-once: a record delivered again
            actor = actors[(i + j) % len(actors)]
            if actor.log:
                actor.log.append(actor.log[i % len(actor.log)])
        elif action == "delete":  # deletion, possibly while held
            world.deciders[KEY[pod]].log.append(PodDeleted(uid=pod, decision_key=KEY[pod]))
        elif action == "terminate":  # the cluster reports a bound pod gone, racing the pipeline
            bound = [b for b in world.bindings if b.uid == pod]
            if bound:
                world.owners[bound[0].node].log.append(PodTerminated(uid=pod, node=bound[0].node))
        elif action == "timeout":  # a gang timer fires, for this round or a stale or future one
            world.deciders[GANG].log.append(GangTimeout(decision_key=GANG, round=i % 3))
    world.drain()

    nodes_of = {}
    for b in world.bindings:
        nodes_of.setdefault(b.uid, set()).add(b.node)
    assert all(len(n) == 1 for n in nodes_of.values()), f"pod bound twice: {nodes_of}"
    assert world.problems == [], world.problems
    for owner in world.owners.values():
        state = owner.state
        assert isinstance(state, NodeState)
        leaked = [hid for hid, h in state.holds.items() if h.status == HELD]
        assert leaked == [], f"holds never decided: {leaked}"
    result = check(
        allocatable={n: {"cpu": ALLOC, "pods": 110} for n in NODES},
        requests={p: {"cpu": CPU[p]} for p in PODS},
        bindings=[Placement(t, u, n) for t, kind, u, n in world.events if kind == "bind"],
        terminations=[Placement(t, u, n) for t, kind, u, n in world.events if kind == "free"],
    )
    assert result.pods_double_bound == 0 and result.nodes_overcommitted == 0, result.overcommitted
