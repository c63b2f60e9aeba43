"""The warm pool's core, driven directly: adoption, refill rounds, overflow, lifecycles, replays."""

from __future__ import annotations

from typing import Any

import pytest

from agents.sandbox import templates as tpl
from agents.sandbox.pool import COLD, READY_PHASE, REFUSED, WARM, PoolCore, PoolResult, PoolState
from schemas import topics
from schemas.records import (
    SANDBOX_CLAIM_UID_LABEL,
    SANDBOX_TEMPLATE_HASH_LABEL,
    Binding,
    EnvVar,
    Pod,
    PodDeleted,
    PodTerminated,
    Record,
    Reservation,
    ResourceList,
    SandboxBurst,
    SandboxClaim,
    SandboxClaimDeleted,
    SandboxClaimStatus,
    SandboxPoolStatus,
    SandboxTemplate,
    SandboxTick,
    SandboxWarmPool,
    SandboxWarmPoolDeleted,
)
from tests.builders import SANDBOX_NS as NS
from tests.builders import make_pool
from tests.builders import make_sandbox_claim as claim

TEMPLATE = SandboxTemplate(namespace=NS, name="py", pod=Pod(uid="", name="", runtime_class_name="gvisor",
                                                             requests=ResourceList(cpu=250, memory=256 << 20)))
ALLOWS_ENV = SandboxTemplate(namespace=NS, name="py", pod=TEMPLATE.pod, env_policy="Allowed")


def pool(replicas: int = 3, **kw: Any) -> SandboxWarmPool:
    return make_pool(replicas, template=kw.pop("template", TEMPLATE), **kw)


class Driver:
    """A pool's state and core, fed batches at given log times."""

    def __init__(self, key: str = f"{NS}/p") -> None:
        self.core = PoolCore(retention_s=60)
        self.state = PoolState(key)
        self.outputs: list[Any] = []
        self.problems: list[Any] = []
        self.ticks: list[float] = []

    def feed(self, *records: Record, at: float = 0.0) -> PoolResult:
        result = PoolResult()
        self.core.apply(self.state, list(records), [at] * len(records), at, result)
        self.outputs += result.outputs
        self.problems += result.problems
        self.ticks += result.ticks
        # what a restart would read back
        self.state = PoolState.from_json(self.state.to_json())
        return result

    def pods(self, result: PoolResult) -> list[Pod]:
        return [o.record for o in result.outputs if isinstance(o.record, Pod)]

    def statuses(self, result: PoolResult) -> list[SandboxClaimStatus]:
        return [o.record for o in result.outputs if isinstance(o.record, SandboxClaimStatus)]

    def bind_all(self, pods: list[Pod], at: float) -> None:
        self.feed(*[Binding(uid=p.uid, namespace=p.namespace, name=p.name, node=f"n{i % 2}", attempt=0,
                            decision_key=p.uid) for i, p in enumerate(pods)], at=at)


def warm(replicas: int = 3) -> Driver:
    d = Driver()
    pods = d.pods(d.feed(pool(replicas), at=1.0))
    assert len(pods) == replicas
    d.bind_all(pods, at=2.0)
    return d


def test_a_pool_starts_its_replicas_labelled_with_template_hash_and_pool() -> None:
    d = Driver()
    pods = d.pods(d.feed(pool(3), at=1.0))
    life = d.state.life
    assert life and [p.uid for p in pods] == [tpl.sandbox_uid(NS, "p", n, life) for n in range(3)]
    assert [p.name for p in pods] == [tpl.sandbox_name("p", n, life) for n in range(3)]
    h = tpl.template_hash(TEMPLATE)
    assert all(p.labels[SANDBOX_TEMPLATE_HASH_LABEL] == h and p.runtime_class_name == "gvisor" for p in pods)
    assert all(tpl.pool_of(p.uid) == f"{NS}/p" and tpl.is_pod_uid(p.uid) for p in pods)
    assert tpl.is_pod_uid(tpl.cold_uid(NS, "p", "k1")) and not tpl.is_pod_uid(tpl.reservation_uid(NS, "p", "b", 0))


def test_a_claim_adopts_a_ready_sandbox_at_once_and_a_redelivery_gets_the_same_answer() -> None:
    d = Driver()
    d.bind_all(d.pods(d.feed(pool(3, template=ALLOWS_ENV), at=1.0)), at=2.0)
    first = d.statuses(d.feed(claim("c1", env=(EnvVar("TASK", "1"),), labels={"team": "x"}), at=3.0))
    assert [(s.phase, s.path, s.sandbox) for s in first] == [(READY_PHASE, WARM, tpl.sandbox_name("p", 0, d.state.life))]
    assert first[0].env == (EnvVar("TASK", "1"),) and first[0].labels == {"team": "x"}  # no disqualification
    again = d.statuses(d.feed(claim("c1", labels={"changed": "yes"}), at=4.0))  # redelivered, changed fields
    assert again == first


def test_an_adopted_sandbox_pod_is_published_again_with_its_claims_metadata() -> None:
    """agent-sandbox's `additionalPodMetadata`: the claim's labels (under the template's) and
    annotations reach the pod it adopts, warm or starting; a claim without any sends no pod."""
    d = warm(2)
    plain = d.feed(claim("a"), at=3.0)
    assert not d.pods(plain)
    r = d.feed(claim("b", labels={"team": "x"}, annotations={"trace": "t1"}), at=4.0)
    [pod] = d.pods(r)
    [status] = d.statuses(r)
    assert pod.uid == status.pod_uid and pod.name == status.sandbox and status.path == WARM
    assert pod.labels["team"] == "x" and pod.labels[SANDBOX_TEMPLATE_HASH_LABEL] == tpl.template_hash(TEMPLATE)
    assert pod.annotations["trace"] == "t1" and SANDBOX_CLAIM_UID_LABEL not in pod.labels
    assert pod.creation_timestamp == 1.0  # when the pool started it, not when it was bound
    starting = Driver()
    starting.feed(pool(1), at=1.0)
    r = starting.feed(claim("c", labels={"team": "y"}), at=2.0)
    assert [(p.labels["team"], p.node_name) for p in starting.pods(r)] == [("y", "")]


@pytest.mark.parametrize(("where", "key"), [
    ("labels", SANDBOX_CLAIM_UID_LABEL), ("labels", SANDBOX_TEMPLATE_HASH_LABEL), ("labels", tpl.ACCOUNTING_LABEL),
    ("labels", "koordinator.sh/qosClass"), ("annotations", "koordstream.io/uid"),
    ("annotations", "scheduling.koordinator.sh/reservation-affinity"), ("labels", "node-role.kubernetes.io/x")])
def test_a_claims_metadata_in_a_reserved_domain_is_refused_naming_the_key(where: str, key: str) -> None:
    """Burst reservations select the claim-uid label, the bridge knows a sandbox pod by its uid
    annotation, QoS decides its CPUs: a claim could forge them onto the pod it adopts."""
    d = warm(1)
    [status] = d.statuses(d.feed(claim("a", **{where: {key: "forged"}}), at=3.0))
    assert status.phase == REFUSED and status.reason == "InvalidClaim" and key in status.message
    assert d.problems[-1].field == f"spec.additionalPodMetadata.{where}" and d.problems[-1].value == key
    assert d.state.unclaimed() == 1


def test_a_sandbox_removed_by_someone_else_is_deleted_again_after_the_records_the_pool_sent() -> None:
    """A record the pool sent of a pod (with its claim's labels once adopted; again in a replay)
    can reach `pods` after the pod's removal did (in the same batch, or racing it): `pods` must
    end with the deletion, or the scheduler places the pod again and nothing deletes it."""
    def last_on_pods(uid: str, *results: PoolResult) -> str:
        last = "deleted"  # the removal went out first (the deciders forward it from `pods`)
        for r in results:
            for o in r.outputs:
                if getattr(o.record, "uid", None) == uid:
                    last = "deleted" if isinstance(o.record, PodDeleted) else "pod"
        return last

    d = warm(3)
    [pod] = d.pods(d.feed(claim("a", labels={"team": "x"}), at=3.0))
    gone = PodDeleted(uid=pod.uid, name=pod.name, namespace=NS)
    assert last_on_pods(pod.uid, d.feed(claim("a", labels={"team": "x"}), gone, at=4.0)) == "deleted"  # redelivered
    first = next(iter(d.state._ready))
    same = d.feed(claim("b", labels={"team": "x"}),
                  PodDeleted(uid=first, name=d.state.sandboxes[first]["name"], namespace=NS), at=5.0)
    assert last_on_pods(first, same) == "deleted"  # adopted and removed in one batch
    racing = next(iter(d.state._ready))
    adopted = d.feed(claim("c", labels={"team": "x"}), at=6.0)
    removed = d.feed(PodDeleted(uid=racing, name=d.state.sandboxes[racing]["name"], namespace=NS), at=6.5)
    assert last_on_pods(racing, adopted, removed) == "deleted"  # across batches
    cold = Driver()  # a replayed tick re-sends the unbound cold pod's record in the batch that reads its removal
    cold.feed(pool(0), at=1.0)
    tick = SandboxTick(namespace=NS, name="p", at=1.0)
    cold.feed(tick, at=1.0)
    [pod] = cold.pods(cold.feed(claim("a", labels={"team": "x"}), at=1.0))
    assert last_on_pods(pod.uid, cold.feed(tick, PodDeleted(uid=pod.uid, name=pod.name, namespace=NS), at=1.0)) \
        == "deleted"


def test_the_generations_decided_on_are_on_the_statuses() -> None:
    d = Driver()
    first = d.feed(pool(1, generation=4), at=1.0)
    assert [o.record.observed_generation for o in first.outputs if isinstance(o.record, SandboxPoolStatus)] == [4]
    again = d.feed(pool(1, generation=5), at=2.0)  # only the generation changed: a status all the same
    assert [o.record.observed_generation for o in again.outputs if isinstance(o.record, SandboxPoolStatus)] == [5]
    [status] = d.statuses(d.feed(claim("a", generation=3), at=3.0))
    assert status.observed_generation == 3


def test_env_on_a_template_that_disallows_it_is_refused_naming_the_field() -> None:
    d = warm()  # agent-sandbox's default policy: Disallowed
    s = d.statuses(d.feed(claim("c1", env=(EnvVar("A", "1"),)), at=3.0))
    assert s[0].phase == REFUSED and "spec.env" in s[0].message and d.problems[-1].field == "spec.env"
    assert d.state.unclaimed() == 3  # nothing taken


def test_claims_beyond_the_ready_take_starting_then_go_cold_or_are_refused() -> None:
    d = warm(2)
    got = d.statuses(d.feed(claim("a"), claim("b"), claim("c"), at=3.0))
    assert [(s.name, s.path) for s in got] == [("a", WARM), ("b", WARM), ("c", COLD)]
    cold = [o.record for o in d.outputs if isinstance(o.record, Pod) and o.record.uid == tpl.cold_uid(NS, "p", "u-c")]
    assert cold and cold[0].labels[SANDBOX_CLAIM_UID_LABEL] == "u-c"
    deny = Driver()
    deny.feed(pool(0, overflow="Deny"), at=1.0)
    refused = deny.statuses(deny.feed(claim("x"), at=2.0))
    assert refused[0].phase == REFUSED and refused[0].reason == "WarmPoolEmpty"
    assert any(a.kind == "ScaleWarmPool" for a in refused[0].alternatives)


def test_refill_happens_at_ticks_within_the_rate_limit() -> None:
    d = warm(3)
    r = d.feed(claim("a"), claim("b"), at=3.0)
    assert not d.pods(r) and r.ticks  # claims never refill: a tick is asked for
    refill = d.pods(d.feed(SandboxTick(namespace=NS, name="p", at=r.ticks[0]), at=r.ticks[0]))
    assert len(refill) == 2
    slow = Driver()
    first = slow.pods(slow.feed(pool(10, refill_batch=4, refill_per_s=2.0), at=0.0))
    assert len(first) == 4 and slow.ticks and slow.ticks[-1] == pytest.approx(2.0)  # 4 tokens at 2/s


def test_a_starting_sandbox_adopted_becomes_ready_at_its_binding() -> None:
    d = Driver()
    pods = d.pods(d.feed(pool(1), at=1.0))
    s = d.statuses(d.feed(claim("a"), at=2.0))
    assert s[0].path == "starting" and s[0].phase == "Pending"
    d.bind_all(pods, at=3.0)
    ready = [o.record for o in d.outputs if isinstance(o.record, SandboxClaimStatus) and o.record.phase == READY_PHASE]
    assert ready and ready[-1].node == "n0"


def test_deletions_shrink_and_lifecycles_delete_sandboxes() -> None:
    d = warm(3)
    d.feed(claim("a", shutdown_time=10.0), at=3.0)
    r = d.feed(SandboxTick(namespace=NS, name="p", at=10.0), at=10.0)
    first = tpl.sandbox_uid(NS, "p", 0, d.state.life)
    assert any(isinstance(o.record, PodDeleted) and o.record.uid == first for o in r.outputs)
    assert [s.phase for s in d.statuses(r)] == ["Expired"]
    r = d.feed(pool(1), at=11.0)
    assert sum(isinstance(o.record, PodDeleted) for o in r.outputs) >= 1
    r = d.feed(SandboxWarmPoolDeleted(namespace=NS, name="p"), at=12.0)
    assert d.state.unclaimed() == 0
    d.feed(SandboxClaimDeleted(uid="u-a", namespace=NS, name="a", warm_pool="p"), at=13.0)
    d.feed(at=100.0)
    assert PoolCore.empty(d.state)


def test_a_burst_becomes_reservations_once() -> None:
    d = warm(1)
    r = d.feed(SandboxBurst(namespace=NS, name="b", warm_pool="p", count=5, ttl_s=600), at=3.0)
    rs = [o.record for o in r.outputs if isinstance(o.record, Reservation)]
    assert len(rs) == 5 and all(o.topic == topics.PODS for o in r.outputs if isinstance(o.record, Reservation))
    again = [o.record for o in d.feed(SandboxBurst(namespace=NS, name="b", warm_pool="p", count=5), at=4.0).outputs
             if isinstance(o.record, Reservation)]
    assert again == rs  # a redelivery: the recorded reservations sent again, never new ones


@pytest.mark.parametrize(("record", "field"), [
    (claim("x", warm_pool="nope"), "spec.warmPoolRef.name"),
    (pool(-1), "spec.replicas"),
    (claim("y", shutdown_policy="Sometimes"), "spec.lifecycle.shutdownPolicy"),
])
def test_bad_input_is_refused_naming_the_field(record: Record, field: str) -> None:
    d = warm(1)
    if isinstance(record, SandboxClaim) and record.warm_pool != "p":
        d = Driver(f"{NS}/{record.warm_pool}")  # its own pool's key: where the agent routes it
    d.feed(record, at=5.0)
    assert d.problems and d.problems[-1].field == field
    statuses = d.statuses(PoolResult(outputs=[o for o in d.outputs]))
    if isinstance(record, SandboxClaim):
        assert statuses[-1].phase == REFUSED and field in statuses[-1].message



def test_a_sandbox_removed_by_someone_else_leaves_the_pool_and_fails_its_claim() -> None:
    d = warm(3)
    [ready] = d.statuses(d.feed(claim("a"), at=3.0))
    unclaimed = next(u for u in d.state.sandboxes if u != ready.pod_uid)
    r = d.feed(PodTerminated(uid=unclaimed, node="n1", decision_key=unclaimed, reason="NodeDeleted"),
               PodDeleted(uid=ready.pod_uid, name=ready.sandbox, namespace=NS), at=4.0)
    assert [(s.name, s.phase) for s in d.statuses(r)] == [("a", "Failed")]
    # gone already, deleted again all the same: a record the pool sent of it may have come after
    assert {o.record.uid for o in r.outputs if isinstance(o.record, PodDeleted)} == {unclaimed, ready.pod_uid}
    assert d.state.unclaimed() == 1 and r.ticks  # a tick refills
    refill = d.pods(d.feed(SandboxTick(namespace=NS, name="p", at=r.ticks[-1]), at=r.ticks[-1]))
    assert len(refill) == 2
    again = d.statuses(d.feed(claim("a"), at=5.0))  # its redelivery: the recorded answer
    assert [s.phase for s in again] == ["Failed"]
    published = {o.record.uid for o in d.outputs if isinstance(o.record, Pod)}
    resent = d.pods(d.feed(PodDeleted(uid=ready.pod_uid, namespace=NS), at=6.0))  # a redelivery decides nothing:
    assert {p.uid for p in resent} <= published and d.state.unclaimed() == 3  # it re-sends what was sent (rule 6)


def test_the_deciders_send_the_removal_of_a_sandbox_pod_on_to_its_pool() -> None:
    from agents.adapters.deciders import gone_sandboxes

    uid = tpl.sandbox_uid(NS, "p", 4)
    sent = gone_sandboxes([PodDeleted(uid=uid, namespace=NS), PodDeleted(uid="plain-pod"),
                           PodTerminated(uid=tpl.reservation_uid(NS, "p", "b", 0), node="n", decision_key="x")])
    assert [(o.topic, o.key, o.record.uid) for o in sent] == [(topics.SANDBOX, "p", uid)]
