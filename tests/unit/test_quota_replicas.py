"""Elastic quota max with several scheduler replicas, a restarted replica, a held gang (issue 28, item 2).

A replica counts a quota's bound pods and its own claims: held claims of another replica (or
of itself before a restart, or of a gang waiting for its members) are invisible to it, so the
pre-filter alone let 4000m commit against a 2000m max. The quota's ledger at the deciders
(`agents.state.quotas`) is asked before every commit: these drive the real cores (scheduler
replicas, node owners, deciders, the ledger) with the records held back where the race needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agents.ports import Output, Problem
from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.scheduler.framework.profiles import load, quota_tree
from agents.state.ledger import Decider, Decision, LedgerState
from agents.state.owner import COMMITTED, NodeOwner, NodeState, OwnerResult
from agents.state.quotas import QuotaLedger, QuotaLedgerState, is_quota_key
from agents.state.resources import ResourceSpace
from schemas import topics
from schemas.records import (
    GANG_MIN_AVAILABLE_ANNOTATION,
    GANG_NAME_ANNOTATION,
    QUOTA_LABEL,
    Binding,
    Held,
    Pod,
    PodDeleted,
    QuotaDenied,
    Requeue,
    ResourceList,
)
from tests.builders import make_node

CONFIG = """
profiles:
  - schedulerName: default-scheduler
    pluginConfig:
      - name: ElasticQuota
        args:
          quotas:
            - {name: team, max: {cpu: "3"}}
            - {name: q, parent: team, max: {cpu: "2"}}
"""
MAX_Q = 2000


def pod(uid: str, cpu: int = 1000, quota: str = "q", gang: str = "", gang_min: int = 2) -> Pod:
    annotations = {GANG_NAME_ANNOTATION: gang, GANG_MIN_AVAILABLE_ANNOTATION: str(gang_min)} if gang else {}
    return Pod(uid=uid, name=uid, labels={QUOTA_LABEL: quota} if quota else {}, annotations=annotations,
               requests=ResourceList(cpu=cpu))


class Net:
    """Scheduler replicas, owners, deciders and quota ledgers wired by topic; `pump` delivers
    what is out, except the records `hold` keeps back (a lagging partition)."""

    def __init__(self, replicas: int = 2) -> None:
        self.now = 0.0
        self.space = ResourceSpace()
        self.config = load(CONFIG)
        self.cores = [self.new_core() for _ in range(replicas)]
        self.owner, self.decider = NodeOwner(), Decider(quotas=quota_tree(self.config))
        self.ledger = QuotaLedger(self.decider.quotas)
        self.nodes: dict[str, NodeState] = {}
        self.ledgers: dict[str, LedgerState] = {}
        self.quota_ledgers: dict[str, QuotaLedgerState] = {}
        self.replica_of: dict[str, int] = {}
        self.bindings: dict[str, str] = {}
        self.requeued: list[Requeue] = []
        self.denials: list[QuotaDenied] = []
        self.problems: list[Problem] = []
        self.out: list[Output] = []
        self.kept: list[Output] = []
        self.peak = 0  # the most cpu quota q's committed pods took at any time (owners' accounting)
        self.route(self._owner("n0", [make_node("n0", cpu=8000)]))
        self.pump()

    def new_core(self) -> SchedulerCore:
        return SchedulerCore(self.space, ClusterState(self.space), lambda: self.now, config=self.config)

    def _owner(self, node: str, records: list[Any]) -> list[Output]:
        result = OwnerResult()
        self.owner.apply(self.nodes.setdefault(node, NodeState(node)), records, result)
        return result.outputs

    def committed(self, quota: str = "q") -> int:
        return sum(h.requests.get("cpu", 0) for n in self.nodes.values() for h in n.holds.values()
                   if h.status == COMMITTED and h.quota == quota)

    def route(self, outputs: list[Output]) -> None:
        self.out += outputs

    def pump(self, hold: Callable[[Output], bool] = lambda o: False) -> None:
        while self.out:
            o = self.out.pop(0)
            if hold(o):
                self.kept.append(o)
                continue
            r = o.record
            if o.topic == topics.NODE_INBOX:
                self.route(self._owner(o.key, [r]))
                self.peak = max(self.peak, self.committed())
            elif o.topic == topics.HOLDS and is_quota_key(o.key):
                state = self.quota_ledgers.setdefault(o.key, QuotaLedgerState(o.key))
                self.ledger.apply(state, [r], self.out, self.problems)
            elif o.topic == topics.HOLDS:
                if isinstance(r, QuotaDenied):
                    self.denials.append(r)
                d = Decision()
                self.decider.apply(self.ledgers.setdefault(o.key, LedgerState(o.key)), [r], d)
                self.problems += d.problems
                self.route(d.first + d.after_commit)
            elif o.topic == topics.STATE_CHANGES:
                for core in self.cores:
                    core.apply_state_changes([r])
            elif o.topic == topics.REQUEUE:
                self.requeued.append(r)
                self.cores[self.replica_of.get(r.uid, 0)].requeue(r)
            elif o.topic == topics.BINDINGS:
                assert isinstance(r, Binding)
                # A Held delivered again (a claim re-sent by a restarted replica) re-sends its
                # acceptance: the same Binding, which consumers take once.
                assert self.bindings.setdefault(r.uid, r.node) == r.node, f"{r.uid} bound to two nodes"

    def release_kept(self) -> None:
        self.out, self.kept = self.kept + self.out, []

    def add(self, p: Pod, replica: int) -> None:
        self.replica_of[p.uid] = replica
        self.route(self.cores[replica].add(p))

    def schedule(self, replica: int) -> None:
        self.route(self.cores[replica].schedule())

    def settle(self, rounds: int = 6) -> None:
        for _ in range(rounds):
            self.now += 60.0  # past every backoff, and the flush of pods that fit nowhere
            for core in self.cores:
                self.route(core.schedule())
            self.pump()


def held_report(o: Output) -> bool:
    return o.topic == topics.HOLDS and isinstance(o.record, Held)


def test_two_replicas_sharing_a_quota_never_commit_past_its_max() -> None:
    """Replica A claims a1, a2 (held, their Helds not decided yet); replica B reads the owners'
    reports and admits b1, b2: a replica counts only bound pods and its own claims. All four
    held: only two may commit (was: 4000m against a 2000m max)."""
    net = Net()
    net.add(pod("a1"), 0)
    net.add(pod("a2"), 0)
    net.add(pod("b1"), 1)
    net.add(pod("b2"), 1)
    net.schedule(0)
    net.pump(hold=held_report)  # held at n0; the reports reach both replicas
    net.schedule(1)
    net.pump(hold=held_report)
    assert len(net.kept) == 4, "B saw room in the quota: each replica claimed two"
    net.release_kept()
    net.pump()
    assert net.committed() <= MAX_Q, f"quota q: {net.committed()}m committed against a max of {MAX_Q}m"
    assert sorted(net.bindings) == ["a1", "a2"]  # granted first come, first served
    assert {d.decision_key for d in net.denials} == {"b1", "b2"}
    assert all("quota 'q' exceeded at its ledger" in d.reason for d in net.denials)
    net.settle()  # b1, b2 are requeued; their replica now sees a1, a2 bound and waits
    assert sorted(net.bindings) == ["a1", "a2"] and net.peak <= MAX_Q
    assert net.problems == []
    # a1 ends: its node frees it, its owner tells its decider, which gives the grant back.
    net.route(net.cores[0].delete(PodDeleted(uid="a1", name="a1")))
    net.pump()
    assert net.quota_ledgers["quota:team"].grants.keys() == {"a2"}
    net.settle()
    assert len(net.bindings) == 3 and net.peak <= MAX_Q


def test_a_restarted_replica_does_not_count_its_held_claims_twice_or_not_at_all() -> None:
    """A claims a1, a2, which are held; A restarts (its assumptions gone, the owners' reports
    say held) and places a3, a4 before it reads a1, a2 again: only two of the four may commit."""
    net = Net(replicas=1)
    for uid in ("a1", "a2"):
        net.add(pod(uid), 0)
    net.schedule(0)
    net.pump(hold=held_report)
    net.cores[0] = net.new_core()  # restarted: reads the owners' tables as they are, then the pods
    net.cores[0].apply_state_changes([NodeOwner.current(n) for n in net.nodes.values()], current=True)
    for uid in ("a3", "a4", "a1", "a2"):  # a3, a4 read first (another partition of `pods`)
        net.add(pod(uid), 0)
        net.schedule(0)
        net.pump(hold=held_report)
    net.release_kept()
    net.pump()
    net.settle()
    assert net.peak <= MAX_Q, f"quota q: {net.peak}m committed against a max of {MAX_Q}m"
    assert len(net.bindings) == 2
    assert net.problems == []


def test_a_gang_held_through_its_waiting_time_is_counted_when_it_completes() -> None:
    """Gang g (g0, g1; min-available 2) of replica A is held, g1's Held late (its decider's
    partition lags): replica B sees the holds held, not its claims, and admits s1, s2, which
    commit. When g completes it would take the quota to 4000m: its ledger denies it, and the
    gang is released and requeued together; it gets in on a retry once the singles end."""
    net = Net()
    net.add(pod("g0", gang="g"), 0)
    net.add(pod("g1", gang="g"), 0)
    net.schedule(0)
    net.pump(hold=lambda o: held_report(o) and o.record.uid == "g1")
    assert len(net.kept) == 1
    net.add(pod("s1"), 1)
    net.add(pod("s2"), 1)
    net.schedule(1)
    net.pump()
    assert sorted(net.bindings) == ["s1", "s2"]
    net.release_kept()
    net.pump()
    assert net.peak <= MAX_Q, f"quota q: {net.peak}m committed against a max of {MAX_Q}m"
    assert "default/g" in {d.decision_key for d in net.denials}
    assert {r.uid for r in net.requeued} >= {"g0", "g1"}  # released and requeued together
    assert not any(h.status == "held" for n in net.nodes.values() for h in n.holds.values())
    for uid in ("s1", "s2"):
        net.route(net.cores[1].delete(PodDeleted(uid=uid, name=uid)))
    net.pump()
    net.settle()
    assert {"g0", "g1"} <= set(net.bindings) and net.peak <= MAX_Q
    assert net.quota_ledgers["quota:team"].grants.keys() == {"g0", "g1"}
    assert net.problems == []


def test_the_parent_quota_is_guaranteed_too() -> None:
    """q's parent `team` has a max of 3: q (2) and a sibling without its own max share it."""
    net = Net()
    net.add(pod("a1"), 0)
    net.add(pod("a2"), 0)
    net.add(pod("t1", quota="team"), 1)
    net.add(pod("t2", quota="team"), 1)
    net.schedule(0)
    net.pump(hold=held_report)
    net.schedule(1)
    net.pump(hold=held_report)
    net.release_kept()
    net.pump()
    team = net.committed("q") + net.committed("team")
    assert team <= 3000, f"quota team: {team}m committed against a max of 3000m"


def test_the_ledger_counts_a_pod_once_and_an_old_return_frees_nothing() -> None:
    """Through `DeciderCore`, as the deciders' agent runs it (state as the table's JSON): an
    ask redelivered is granted again without counting twice; the pod asked again for another
    group (a retry) keeps one grant, now that group's; a Return of the old group frees nothing,
    one of the current group frees it, and the key then leaves the table."""
    from agents.adapters.deciders import DeciderCore
    from agents.adapters.loop import Outcome
    from schemas.records import QuotaAsk, QuotaGranted, QuotaItem, QuotaReturn

    core = DeciderCore(600.0, quota_tree(load(CONFIG)))
    key = "quota:team"

    def ask(group: str, *uids: str) -> QuotaAsk:
        return QuotaAsk(decision_key=key, asker="x", group=group,
                        items=tuple(QuotaItem(uid=u, quota="q", requests=ResourceList(cpu=1000)) for u in uids))

    def apply(stored: Any, *records: Any) -> tuple[Any, Outcome]:
        outcome = Outcome()
        return core.apply(key, stored, list(records), [0.0] * len(records), 0.0, outcome), outcome

    stored, outcome = apply(None, ask("x/0/n0", "p1"), ask("x/0/n0", "p1"), ask("x/1/n0", "p1"))
    assert [type(o.record) for o in outcome.first] == [QuotaGranted] * 3
    assert stored["grants"]["p1"]["group"] == "x/1/n0"
    stored, outcome = apply(stored, ask("y/0/n0", "p2", "p3"))  # 1000 + 2000 > 2000: all or none
    assert isinstance(outcome.first[0].record, QuotaDenied) and set(stored["grants"]) == {"p1"}
    stored, _ = apply(stored, QuotaReturn(decision_key=key, asker="x", group="x/0/n0", uids=("p1",)))
    assert set(stored["grants"]) == {"p1"}
    stored, _ = apply(stored, QuotaReturn(decision_key=key, asker="x", group="x/1/n0", uids=("p1",)))
    assert stored is None
