"""The chaos run's pure parts: the seeded workload and kill plan, recovery times, the verdict."""

from __future__ import annotations

import json
from pathlib import Path

from perf.chaos import (
    QUOTA,
    ChaosConfig,
    Seen,
    Workload,
    _schedule,
    dump_records,
    recovery_s,
    verdict,
    workload,
)
from schemas import topics
from schemas.records import (
    GANG_NAME_ANNOTATION,
    QUOTA_LABEL,
    Binding,
    Claim,
    Node,
    NodeStateChange,
    Pod,
    PodDeleted,
    PodTerminated,
    Requeue,
    Reservation,
    ResourceList,
)
from streams.catalogue import partition_for


def test_workload_is_seeded_and_fits_with_room_to_spare() -> None:
    cfg = ChaosConfig.preset("tansu", quick=True, seed=5)
    a, b = workload(cfg, "x"), workload(cfg, "x")
    assert a.timeline == b.timeline and a.nodes == b.nodes and a.deleted == b.deleted
    kinds = {type(r) for _, _, r in a.timeline}
    assert {Pod, PodDeleted, Reservation} <= kinds and a.gangs
    gpus = sum(n.allocatable.get("nvidia.com/gpu", 0) for n in a.nodes)
    cpu = sum(n.allocatable["cpu"] for n in a.nodes)
    asked_gpus = sum(p.requests.get("nvidia.com/gpu", 0) + p.requests.get("koordinator.sh/gpu-core", 0) / 100
                     for p in a.pods.values())
    assert asked_gpus <= 0.6 * gpus and sum(p.requests["cpu"] for p in a.pods.values()) <= 0.5 * cpu
    # A gang has one member beyond min-available, so one deletion cannot leave it short.
    for minimum, members in a.gangs.values():
        assert len(members) == minimum + 1 and len(set(members) & a.deleted) <= 1
        assert all(GANG_NAME_ANNOTATION in a.pods[m].annotations for m in members)
    # Deletions come after their pod.
    first = {r.uid: at for at, _, r in a.timeline if isinstance(r, Pod)}
    assert all(at >= first[r.uid] for at, _, r in a.timeline if isinstance(r, PodDeleted))
    # The quota's pods come in bursts that ask more than its max; none is deleted by the workload.
    assert len(a.quota_pods) == cfg.quota_pods and not a.quota_pods & a.deleted
    assert all(a.pods[uid].labels == {QUOTA_LABEL: QUOTA} for uid in a.quota_pods)
    bursts = sorted({first[uid] for uid in a.quota_pods})
    assert len(bursts) == cfg.quota_pods // cfg.quota_burst and cfg.quota_burst * 1000 > a.quotas[QUOTA]["cpu"]
    assert f"{{name: {QUOTA}, max: {{cpu: 4000m}}}}" in a.profiles_yaml()
    # Budgeted workloads: each asked to lose more than its budget allows, at a seeded moment.
    assert len(a.budgeted) == cfg.budget_workloads and a.budgeted == b.budgeted
    span = len(a.pods) / cfg.rate
    for bw in a.budgeted:
        assert bw.replicas - bw.scale_down_by < bw.min_available < bw.replicas and 0 < bw.scale_down_at < span


def test_kill_plan_is_seeded_inside_the_load_and_spaced() -> None:
    cfg = ChaosConfig.preset("kafka", quick=False, seed=9)
    plan = _schedule(cfg, 400.0)
    assert plan == _schedule(cfg, 400.0)
    assert len(plan) == cfg.kills + cfg.broker_restarts and sum(w == "broker" for _, w in plan) == 1
    times = [t for t, _ in plan]
    assert times == sorted(times) and times[0] >= 10.0 and times[-1] <= 380.0
    assert min(b - a for a, b in zip(times, times[1:], strict=False)) > 0
    assert _schedule(ChaosConfig.preset("kafka", quick=False, seed=10), 400.0) != plan


def _claim(uid: str) -> Claim:
    return Claim(uid=uid, attempt=0, node="n", decision_key=uid, requests=ResourceList(cpu=1))


def test_recovery_is_when_every_source_active_before_the_kill_decides_again() -> None:
    seen = Seen()
    p = 4
    uids = {partition_for(f"u{i}", p): f"u{i}" for i in range(50)}  # one uid per partition
    for uid in uids.values():
        seen.records.append((95.0, topics.NODE_INBOX, 0, "", _claim(uid)))  # all four active before
    seen.records.append((101.0, topics.NODE_INBOX, 0, "", _claim(uids[0])))
    seen.records.append((102.0, topics.NODE_INBOX, 0, "", _claim(uids[1])))
    seen.records.append((103.0, topics.NODE_INBOX, 0, "", _claim(uids[2])))
    assert recovery_s(seen, 100.0, "scheduler", p) is None  # partition 3 never decided again
    seen.records.append((112.5, topics.NODE_INBOX, 0, "", _claim(uids[3])))
    assert recovery_s(seen, 100.0, "scheduler", p) == 12.5
    # A state worker: by the origins of the owners' reports and the deciders' Bindings.
    seen.records.append((96.0, topics.STATE_CHANGES, 0, "node-inbox/1", NodeStateChange(node="n", seq=1)))
    seen.records.append((104.0, topics.STATE_CHANGES, 0, "node-inbox/1", NodeStateChange(node="n", seq=2)))
    assert recovery_s(seen, 100.0, "state", p) == 4.0


def test_verdict_counts_what_the_issue_asks_for() -> None:
    pods = {u: Pod(uid=u, name=u, requests=ResourceList(cpu=100)) for u in ("a", "b", "c", "g0", "g1", "g2")}
    w = Workload(nodes=[Node(name="n1", allocatable=ResourceList(cpu=1000, pods=110))],
                 timeline=[], pods=pods, deleted={"c"}, gangs={"g": (2, ["g0", "g1", "g2"])})
    seen = Seen()
    for t, (uid, node) in enumerate([("a", "n1"), ("b", "n1"), ("b", "n2"), ("g0", "n1")]):
        seen.records.append((float(t), topics.BINDINGS, 0, "holds/0", Binding(uid=uid, namespace="d", name=uid, node=node, attempt=0, decision_key=uid)))
    seen.records.append((9.0, topics.STATE_CHANGES, 0, "node-inbox/0",
                         NodeStateChange(node="n1", seq=1, holds={"g1/0/n1": "held", "a/0/n1": "committed"})))
    out = verdict(w, seen, 4)
    assert out["pods_total"] == 6 and out["pods_deleted"] == 1
    assert out["pods_double_bound"] == 1  # b on two nodes
    assert out["pods_unschedulable"] == 2  # g1, g2 (c was deleted)
    assert out["gangs_partial"] == 1 and out["holds_leaked"] == 1
    assert out["examples"]["unbound_history"] == {"g1": [], "g2": []}  # nothing about them on the topics
    seen.records.append((10.0, topics.REQUEUE, 0, "holds/1", Requeue(uid="g1", attempt=3, decision_key="g", reason="timeout")))
    assert verdict(w, seen, 4)["examples"]["unbound_history"]["g1"] == ["10.00 requeue holds/1 Requeue attempt=3 reason=timeout"]


def test_a_failed_runs_records_are_written_one_per_line(tmp_path: Path) -> None:
    seen = Seen()
    seen.records.append((10.0, topics.REQUEUE, 1, "holds/1", Requeue(uid="g1", attempt=3, decision_key="g", reason="timeout")))
    seen.records.append((11.0, topics.STATE_CHANGES, 0, "", NodeStateChange(node="n1", seq=2, holds={"g1/3/n1": "held"})))
    lines = dump_records(seen, tmp_path / "records.jsonl").read_text().splitlines()
    first, second = (json.loads(line) for line in lines)
    assert first["type"] == "Requeue" and first["uid"] == "g1" and first["attempt"] == 3 and first["source"] == "holds/1"
    assert second["topic"] == topics.STATE_CHANGES and second["holds"] == {"g1/3/n1": "held"} and second["ts"] == 11.0


def test_verdict_replays_quota_usage_and_budget_health_from_the_topics() -> None:
    """The wiring of `quotas_overcommitted` and `pdb_violations` (the pure checks are table-tested
    in test_checker.py): which topics and records count."""
    quota = {"cpu": 2000}
    pods = {u: Pod(uid=u, name=u, namespace="c", labels={QUOTA_LABEL: QUOTA}, requests=ResourceList(cpu=1000))
            for u in ("q1", "q2", "q3")}
    keep = ChaosConfig.preset("tansu", quick=True, seed=1)
    budgeted = workload(keep, "x").budgeted[:1]
    ns, app = budgeted[0].namespace, budgeted[0].name
    w = Workload(nodes=[Node(name="n1", allocatable=ResourceList(cpu=64000, pods=110))], timeline=[], pods=pods,
                 deleted=set(), gangs={}, quotas={QUOTA: quota}, quota_pods=set(pods), budgeted=budgeted)

    def bind(t: float, uid: str) -> tuple[float, str, int, str, Binding]:
        return (t, topics.BINDINGS, 0, "holds/0", Binding(uid=uid, namespace="c", name=uid, node="n1", attempt=0,
                                                         decision_key=uid))

    def budget_pod(t: float, i: int, running: bool) -> tuple[float, str, int, str, Pod]:
        return (t, topics.PODS, 0, "", Pod(uid=f"k{i}", name=f"k{i}", namespace=ns, labels={"app": app},
                                             requests=ResourceList(cpu=500), node_name="n1" if running else "",
                                             phase="Running" if running else "Pending"))

    seen = Seen()
    seen.records += [bind(1.0, "q1"), bind(1.1, "q2"),
                     (2.0, topics.PODS, 0, "", PodDeleted(uid="q1", name="q1", namespace="c")), bind(2.5, "q3")]
    seen.records += [budget_pod(0.0, i, running=False) for i in range(6)]
    seen.records += [budget_pod(1.0, i, running=True) for i in range(6)]
    out = verdict(w, seen, 4)
    assert out["quotas_overcommitted"] == 0 and out["pdb_violations"] == 0  # q3 was admitted after q1 went
    # Two more evictions than minAvailable 4 of 6 allows (the pods terminate at their node)
    seen.records += [(3.0, topics.NODE_INBOX, 0, "", PodTerminated(uid=f"k{i}", node="n1", reason="Evicted"))
                     for i in range(3)]
    seen.records += [bind(3.5, "q1"), (4.0, topics.NODE_INBOX, 0, "", PodTerminated(uid="q2", node="n1")),
                     (4.0, topics.PODS, 0, "", PodDeleted(uid="k3", name="k3", namespace=ns)),
                     (5.0, topics.FEEDBACK, 0, "", PodDeleted(uid="k4", name="k4", namespace=ns))]  # not `pods`
    out = verdict(w, seen, 4)
    assert out["quotas_overcommitted"] == 0  # q1 bound again after its deletion: it never ran again
    assert out["pdb_violations"] == 4 + 4 and out["pdb_lowest_healthy"] == {f"{ns}/{app}": 2}  # 3.0 .. 4.75
    seen.records.insert(3, bind(1.5, "q3"))  # q3 admitted while q1 and q2 were committed: 3000m of 2000m
    out = verdict(w, seen, 4)
    assert out["quotas_overcommitted"] == 1 and out["examples"]["quotas_overcommitted"][0].startswith(
        f"{QUOTA}: cpu 3000 > 2000 after q3")
