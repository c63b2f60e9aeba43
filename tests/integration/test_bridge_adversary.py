"""Adversarial runs of the bridge against the real control plane (kube-apiserver, etcd, Kwok),
the session's broker and worker: leader election against a real Lease, the actuator's calls
against real refusals, the API server restarted under a watch, and the bridge process killed
while pods come and go. Each test names a fault an adversarial review found (see the report
on branch `bridge-adversary`), or something it tried that held."""

from __future__ import annotations

import asyncio
import base64
import functools
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agents.ports import Output
from schemas import topics
from schemas.records import (
    Binding,
    DeadLetter,
    EvictionCommand,
    Pod,
    PodTerminated,
    SchedulingFeedback,
)
from streams.bridge.actuator import Actuator
from streams.bridge.lease import LeaderElection
from streams.bridge.mirror import POD, Mirror
from streams.bridge.reflector import Reflector
from streams.bridge.service import Bridge
from streams.broker import EmbeddedBroker, wait_ready
from streams.kube_cluster import ControlPlane
from streams.kubeapi import KubeApi, KubeError, Limits
from streams.settings import load_settings
from tests.integration.conftest import BridgeProcess
from tests.integration.harness import Harness
from tests.integration.kube import (
    condition,
    create_all,
    create_namespace,
    kwok_node,
    nodes_ready,
    pod_manifest,
    pods,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration


async def _lead_forever() -> None:
    await asyncio.sleep(3600)


async def _both_lead(a: LeaderElection, b: LeaderElection, seconds: float) -> float:
    """How long, within `seconds`, both candidates believed they led."""
    both = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if a.leading and b.leading:
            both += 0.05
        await asyncio.sleep(0.05)
    return both


async def _until(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f}s for {what}")
        await asyncio.sleep(0.05)


async def _campaign(election: LeaderElection, lead: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
    return asyncio.create_task(election.run(lead))  # type: ignore[arg-type]


async def _stop(*tasks: asyncio.Task[Any]) -> None:
    """Cancel the tasks; each must end (a campaign that swallows its cancellation never does)."""
    for task in tasks:
        task.cancel()
    _, running = await asyncio.wait(tasks, timeout=10)
    assert not running, f"{len(running)} task(s) did not end when cancelled"


async def test_a_leader_whose_renewals_queue_behind_its_own_writes_never_leads_beside_another(
        control_plane: ControlPlane) -> None:
    """The Lease's requests go through the same token bucket and concurrency bound as the
    bridge's writes. A leader busy with a burst (here 30 calls at 2 qps: 15 s of queue, as
    10,000 Bindings at the default 200 qps are 50 s) waits that long for its renewal and, all
    the while, believes it leads: its Lease expires after 3 s and another bridge takes it."""
    lease = unique("lease")
    async with control_plane.api(Limits(qps=2, burst=1)) as busy, control_plane.api() as idle:
        a = LeaderElection(busy, "a", namespace="default", name=lease, duration_s=3, renew_deadline_s=2, retry_s=0.5)
        b = LeaderElection(idle, "b", namespace="default", name=lease, duration_s=3, renew_deadline_s=2, retry_s=0.5)

        async def burst() -> None:  # what a leader does with a batch of Bindings: many calls at once
            await asyncio.gather(*(busy.request("GET", "/api/v1/namespaces/default") for _ in range(30)))
            await asyncio.sleep(3600)

        task_a = await _campaign(a, burst)
        await _until("a to lead", lambda: a.leading)
        task_b = await _campaign(b, _lead_forever)
        try:
            both = await _both_lead(a, b, 12.0)
        finally:
            await _stop(task_a, task_b)
        assert both == 0.0, f"two bridges led at once for {both:.1f} s"


async def test_a_candidate_whose_clock_runs_ahead_does_not_take_the_lease_from_a_live_leader(
        control_plane: ControlPlane) -> None:
    """Expiry is judged by comparing the holder's renewTime (the holder's clock) with the
    candidate's clock: a candidate 10 s ahead takes a Lease of 3 s that its holder renews
    every 0.5 s, and both lead until the holder's next renewal. client-go judges expiry by
    when the candidate last saw the record change (its own clock only)."""
    lease = unique("lease")
    async with control_plane.api() as api:
        a = LeaderElection(api, "a", namespace="default", name=lease, duration_s=3, renew_deadline_s=2, retry_s=0.5)
        b = LeaderElection(api, "b", namespace="default", name=lease, duration_s=3, renew_deadline_s=2, retry_s=0.5,
                           clock=lambda: time.time() + 10)
        task_a = await _campaign(a, _lead_forever)
        await _until("a to lead", lambda: a.leading)
        task_b = await _campaign(b, _lead_forever)
        try:
            both = await _both_lead(a, b, 6.0)
            took_over = b.transitions
        finally:
            await _stop(task_a, task_b)
        assert (took_over, both) == (0, 0.0), f"b took the Lease {took_over} time(s); both led for {both:.2f} s"


async def test_a_watch_survives_the_api_server_restarted_under_it(tmp_path: Path) -> None:
    """kube-apiserver killed under a running watch and started again on the same port (etcd
    kept everything): the reflector must back off, watch again from where it was (or list
    again) and deliver what happened meanwhile. A dropped connection is an aiohttp error, not
    a `KubeError`: the reflector's task ended with it, and in the bridge a reflector's end
    ends the term and the process."""
    async with ControlPlane(tmp_path / "k8s", kwok=False, crds=False) as cp, cp.api() as api:
        await create_namespace(api, "restart")
        path = "/api/v1/namespaces/restart/pods"
        mirror = Mirror(frozenset({"koordstream"}))
        names: list[str] = []

        async def on_list(items: list[dict[str, Any]]) -> None:
            names.extend(o.record.name for o in mirror.relisted(POD, items) if isinstance(o.record, Pod))

        async def on_events(events: list[tuple[str, dict[str, Any]]]) -> None:
            names.extend(o.record.name for e, obj in events for o in mirror.apply(POD, e, obj)
                         if isinstance(o.record, Pod))

        reflector = Reflector(api, path, on_list, on_events, timeout_s=60, max_backoff_s=0.5)
        task = asyncio.create_task(reflector.run())
        try:
            await api.request("POST", path, body=pod_manifest("before", "restart", "g"))
            await _until("the first pod", lambda: "before" in names)
            cp.kill("kube-apiserver")
            await asyncio.sleep(1.0)
            await cp.restart_apiserver()
            await api.request("POST", path, body=pod_manifest("after", "restart", "g"))
            await _until("the pod created after the restart", lambda: "after" in names or task.done())
            assert not task.done(), f"the reflector ended: {task.exception()!r}"
        finally:
            await _stop(task)


# -- the actuator against the API server's real refusals ------------------------------------


def _binding(pod: dict[str, Any], node: str, attempt: int = 0) -> Binding:
    meta = pod["metadata"]
    return Binding(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"], node=node, attempt=attempt,
                   decision_key=meta["uid"])


def _refusals(outputs: list[Output]) -> list[tuple[str, str]]:
    return [(o.key, o.record.uid) for o in outputs if isinstance(o.record, PodTerminated)]


async def test_bindings_meet_the_api_servers_refusals_and_free_the_right_hold(control_plane: ControlPlane) -> None:
    """What held: a Binding redelivered after it was carried out is done; one for a pod deleted
    and created again under its name (another uid) is refused by the UID precondition; one for
    a pod being deleted (a finalizer keeps it) is refused (409 "being deleted"); two Bindings of
    one pod to two nodes at once bind it once, and the refusal frees the other node's hold."""
    ns = unique("bindref")
    async with control_plane.api() as api:
        await create_namespace(api, ns)
        base = f"/api/v1/namespaces/{ns}/pods"
        actuator = Actuator(api, retry_initial_s=0.05)

        [first] = await create_all(api, base, [pod_manifest("again", ns, ns)])
        assert await actuator.bind(_binding(first, "n1")) == []
        assert await actuator.bind(_binding(first, "n1")) == []  # redelivered after a crash: done
        assert actuator.counts.get("bound_before") == 1

        [old] = await create_all(api, base, [pod_manifest("renamed", ns, ns)])
        await api.request("DELETE", f"{base}/renamed", params={"gracePeriodSeconds": 0})
        [new] = await create_all(api, base, [pod_manifest("renamed", ns, ns)])
        assert _refusals(await actuator.bind(_binding(old, "n1"))) == [("n1", old["metadata"]["uid"])]
        assert not (await api.request("GET", f"{base}/renamed"))["spec"].get("nodeName")

        held = pod_manifest("finalized", ns, ns)
        held["metadata"]["finalizers"] = ["example.com/keep"]
        [going] = await create_all(api, base, [held])
        await api.request("DELETE", f"{base}/finalized")
        assert _refusals(await actuator.bind(_binding(going, "n1"))) == [("n1", going["metadata"]["uid"])]
        await api.request("PATCH", f"{base}/finalized", body={"metadata": {"finalizers": None}},
                          content_type="application/merge-patch+json")

        [twice] = await create_all(api, base, [pod_manifest("twice", ns, ns)])
        outcomes = await asyncio.gather(actuator.bind(_binding(twice, "n1", 1)), actuator.bind(_binding(twice, "n2", 2)))
        node = (await api.request("GET", f"{base}/twice"))["spec"]["nodeName"]
        other = "n2" if node == "n1" else "n1"
        assert [r for o in outcomes for r in _refusals(o)] == [(other, twice["metadata"]["uid"])]
        assert new["metadata"]["uid"] != old["metadata"]["uid"]


async def test_late_feedback_and_evictions_of_pods_created_again_change_nothing(control_plane: ControlPlane) -> None:
    """What held: feedback of an attempt that came before the Binding, written by a bridge
    that did not see the binding (a new term): its write crosses the binding, is undone
    (PodScheduled stays True) and no FailedScheduling Event is written; an eviction, and a
    preemption's deletion, of a pod deleted and created again under its name (another uid)
    are done without touching the new pod (the UID precondition: 409)."""
    ns = unique("late")
    async with control_plane.api() as api:
        await create_namespace(api, ns)
        base = f"/api/v1/namespaces/{ns}/pods"
        [p] = await create_all(api, base, [pod_manifest("bound", ns, ns)])
        assert await Actuator(api).bind(_binding(p, "n1")) == []
        fresh = Actuator(api)  # a new term: it has bound nothing, and its mirror is not there yet
        await fresh.feedback(SchedulingFeedback(uid=p["metadata"]["uid"], namespace=ns, name="bound", attempt=0,
                                                message="0/1 nodes are available: 1 Insufficient cpu.",
                                                reasons={"Insufficient cpu": 1}))
        got = await api.request("GET", f"{base}/bound")
        assert (condition(got, "PodScheduled") or {}).get("status") == "True"
        events = await api.request("GET", f"/apis/events.k8s.io/v1/namespaces/{ns}/events")
        assert [e for e in events["items"] if e.get("reason") == "FailedScheduling"] == []

        for preemptor in ("", "u-preemptor"):
            [old] = await create_all(api, base, [pod_manifest("reused", ns, ns)])
            await api.request("DELETE", f"{base}/reused", params={"gracePeriodSeconds": 0})
            [new] = await create_all(api, base, [pod_manifest("reused", ns, ns)])
            command = EvictionCommand(uid=old["metadata"]["uid"], namespace=ns, name="reused", node="n1",
                                      reason="test", preemptor_uid=preemptor)
            assert await Actuator(api).evict(command) == []
            still = await api.request("GET", f"{base}/reused")
            assert still["metadata"]["uid"] == new["metadata"]["uid"] and not still["metadata"].get("deletionTimestamp")
            await api.request("DELETE", f"{base}/reused", params={"gracePeriodSeconds": 0})


async def test_a_binding_the_api_server_forbids_is_retried_not_reported_refused(control_plane: ControlPlane) -> None:
    """A Binding answered 403 (the bridge's RBAC changed under it, its token not yet accepted,
    an admission webhook on pods/binding) or any other status but 404 / 409 was reported as
    refused: PodTerminated frees the hold, the pod is tombstoned at its node and never
    scheduled again (decisions are final), while it waits unbound in the API server for
    ever. The pod is there and unbound: the Binding must be carried out later, not dropped."""
    ns = unique("forbid")
    async with control_plane.api() as api:
        await create_namespace(api, ns)
        await api.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts",
                          body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}})
        await api.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", body={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})
        await api.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", body={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}]})
        [pod] = await create_all(api, f"/api/v1/namespaces/{ns}/pods", [pod_manifest("waiting", ns, ns)])
    kubeconfig = await control_plane.service_account_kubeconfig(ns, "reader", control_plane.folder / f"{ns}.kubeconfig")
    async with await KubeApi.connect(str(kubeconfig)) as limited:
        actuator = Actuator(limited, retry_initial_s=0.05, retry_max_s=0.2)
        try:
            outcome = await asyncio.wait_for(actuator.bind(_binding(pod, "n1")), 3.0)
        except TimeoutError:
            outcome = []  # still trying: nothing dropped
    assert _refusals(outcome) == [], "a Binding of a pod that waits unbound was reported refused"
    # A 403 that says the pod can never run is a refusal: its namespace is being deleted (no
    # namespace controller runs here: it stays Terminating, and so does the pod).
    async with control_plane.api() as api:
        await api.request("DELETE", f"/api/v1/namespaces/{ns}")
        outcome = await asyncio.wait_for(Actuator(api).bind(_binding(pod, "n1")), 10.0)
    assert _refusals(outcome) == [("n1", pod["metadata"]["uid"])]


# -- the bridge process: killed while pods come and go -----------------------------------------


@pytest.fixture
async def admin(control_plane: ControlPlane, bridge: BridgeProcess) -> AsyncIterator[KubeApi]:
    assert bridge.alive(), f"the bridge died: {bridge.log.read_text()[-3000:]}"
    async with control_plane.api() as client:
        yield client


async def _bound_names(api: KubeApi, ns: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in await pods(api, ns) if p["spec"].get("nodeName"))


async def test_a_pod_deleted_while_no_bridge_leads_frees_its_node(admin: KubeApi, bridge: BridgeProcess) -> None:
    """A pod bound by koordstream is deleted while no bridge leads (the leader killed, its
    successor not yet in: here the one bridge, killed -9 and started again). The new term's
    mirror starts empty and lists the pods: the deleted one is not in the list, and nothing
    was known before it, so no PodDeleted goes out, its decider never sends PodTerminated,
    and its node's owner keeps its capacity for ever: a pod that needs it never binds."""
    ns = unique("gone")
    node = f"{ns}-0"
    await create_namespace(admin, ns)
    await create_all(admin, "/api/v1/nodes", [kwok_node(node, ns, cpu="2")])
    await wait_until("the node Ready", lambda: nodes_ready(admin, [node]))
    await create_all(admin, f"/api/v1/namespaces/{ns}/pods", [pod_manifest("first", ns, ns, cpu="2")])
    await wait_until("the first pod bound", lambda: _bound_names(admin, ns))
    bridge.kill()
    try:
        await admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods/first", params={"gracePeriodSeconds": 0})
        await wait_until("the first pod gone", lambda: _gone(admin, ns))
    finally:
        bridge.start()
    await create_all(admin, f"/api/v1/namespaces/{ns}/pods", [pod_manifest("second", ns, ns, cpu="2")])
    try:
        await wait_until("the second pod bound", lambda: _bound_names(admin, ns), timeout=45)
    except AssertionError:
        second = await admin.request("GET", f"/api/v1/namespaces/{ns}/pods/second")
        raise AssertionError(f"the capacity of the deleted pod was never freed: the second pod is unbound, "
                             f"its PodScheduled condition {condition(second, 'PodScheduled')}") from None


async def _gone(api: KubeApi, ns: str) -> bool:
    return not await pods(api, ns)


@pytest.mark.kafka
async def test_pods_that_cannot_be_converted_are_dead_lettered_and_the_bridge_keeps_going(
        admin: KubeApi, bridge: BridgeProcess, bootstrap: str) -> None:
    """The API server accepts a request of 8Ei of memory (it stores int64's maximum,
    9223372036854775807); koordstream refuses it as absurd: the pod goes to the dead-letter
    topic with the field and the value (held). A pod of a megabyte (here environment; the
    API server takes objects up to etcd's 1.5 MiB): its watch event is one line longer than
    aiohttp reads a line (512 KiB): `LineTooLong`, not a client error, ends the watch, the
    term and the bridge process; the next bridge lists it (a list is read whole), and dies
    again at its next event. Any user who may create a pod anywhere stops the bridge. The
    pod is refused here too (8Ei), and its dead letter carried the whole object (base64):
    larger than Apache Kafka takes in one message (1 MiB), `MessageSizeTooLargeError` ended
    the bridge, and the next one at the same pod (Tansu took it)."""
    ns = unique("badin")
    node = f"{ns}-0"
    await create_namespace(admin, ns)
    await create_all(admin, "/api/v1/nodes", [kwok_node(node, ns, cpu="4")])
    await wait_until("the node Ready", lambda: nodes_ready(admin, [node]))
    base = f"/api/v1/namespaces/{ns}/pods"
    async with Harness(bootstrap) as h:
        await create_all(admin, base, [pod_manifest("absurd", ns, ns, memory="8Ei")])
        [letter] = await h.wait_for(DeadLetter, lambda d: f"{ns}/absurd" in d.error, topic=topics.DEAD_LETTER)
        assert (letter.field, letter.value) == ("spec.containers[0].resources.requests.memory", "9223372036854775807")
        huge = pod_manifest("huge", ns, ns, memory="8Ei")
        huge["spec"]["containers"][0]["env"] = [  # incompressible, as certificates or tokens are
            {"name": f"V{i}", "value": base64.b64encode(os.urandom(48_000)).decode()} for i in range(23)]
        await create_all(admin, base, [huge])
        [cut] = await h.wait_for(DeadLetter, lambda d: f"{ns}/huge" in d.error, topic=topics.DEAD_LETTER, timeout=30)
        assert cut.field == "spec.containers[0].resources.requests.memory" and "cut to" in cut.error
        await asyncio.sleep(2)
        assert bridge.alive(), f"the bridge died: {bridge.log.read_text()[-2000:]}"
        await create_all(admin, base, [pod_manifest("fine", ns, ns)])
        assert await wait_until("the next pod bound", lambda: _bound_names(admin, ns), timeout=30) == ["fine"]


LEASE = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/koordstream-bridge"


async def _holder(api: KubeApi) -> str:
    lease = await api.request("GET", LEASE)
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def test_two_bridges_the_leader_killed_mid_run_lose_nothing_and_bind_nothing_twice(
        admin: KubeApi, bridge: BridgeProcess, bridge_kubeconfig: Path, bootstrap: str,
        tmp_path: Path) -> None:
    """What held: a second bridge stands by; pods are created while the leader is killed -9;
    the standby takes over within the Lease's duration (4 s here) and a retry; every pod is
    bound once (the API server's word and the `bindings` topic), no node over its cpu, and
    the survivor keeps running."""
    ns = unique("twobr")
    nodes = [kwok_node(f"{ns}-{i}", ns, cpu="8") for i in range(4)]
    await create_namespace(admin, ns)
    await create_all(admin, "/api/v1/nodes", nodes)
    await wait_until("the nodes Ready", lambda: nodes_ready(admin, [n["metadata"]["name"] for n in nodes]))
    standby = BridgeProcess(bootstrap, bridge_kubeconfig, tmp_path / "standby.log")
    standby.start()
    base = f"/api/v1/namespaces/{ns}/pods"
    try:
        async with Harness(bootstrap) as h:
            await asyncio.sleep(3)  # the standby campaigning
            first = await create_all(admin, base, [pod_manifest(f"a-{i}", ns, ns, cpu="500m") for i in range(30)])
            await wait_until("some bound", lambda: _at_least(_bound_names(admin, ns), 5))
            holder = await _holder(admin)
            pids = {p.proc.pid: p for p in (bridge, standby) if p.proc is not None}
            leader = pids[int(holder.rsplit("-", 1)[-1])]
            survivor = standby if leader is bridge else bridge
            leader.kill()
            killed = time.monotonic()
            second = await create_all(admin, base, [pod_manifest(f"b-{i}", ns, ns, cpu="500m") for i in range(30)])
            await wait_until("the survivor to take the Lease", lambda: _other(admin, holder), timeout=20, every=0.1)
            took = time.monotonic() - killed
            await wait_until("every pod bound", lambda: _at_least(_bound_names(admin, ns), 60), timeout=120)
            uids = {p["metadata"]["uid"] for p in first + second}
            await h.wait_for(Binding, lambda b: b.uid in uids, count=len(uids), timeout=30)
            targets: dict[str, set[str]] = {}
            for b in h.seen(Binding, lambda b: b.uid in uids):
                targets.setdefault(b.uid, set()).add(b.node)
            assert {u: n for u, n in targets.items() if len(n) > 1} == {}
            placed = [p for p in await pods(admin, ns) if p["spec"].get("nodeName")]
            assert {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in placed} == {
                u: next(iter(n)) for u, n in targets.items()}
            per_node: dict[str, int] = {}
            for p in placed:
                per_node[p["spec"]["nodeName"]] = per_node.get(p["spec"]["nodeName"], 0) + 500
            assert max(per_node.values()) <= 8000, per_node
            assert took < 4 + 0.5 + 3, f"the takeover took {took:.1f} s"
            assert survivor.alive(), f"the survivor died: {survivor.log.read_text()[-3000:]}"
    finally:
        if not bridge.alive():
            bridge.start()
        standby.stop()


async def _at_least(names: Awaitable[list[str]], count: int) -> bool:
    return len(await names) >= count


async def _other(api: KubeApi, holder: str) -> bool:
    now = await _holder(api)
    return bool(now) and now != holder


@pytest.mark.e2e
async def test_the_bridge_outlives_its_broker_unreachable_for_a_while(tmp_path: Path) -> None:
    """The broker stops answering (paused, as a partition or a long GC would look) for 45 s
    while pods are created: the bridge's produce and its consumers' commits give up after
    aiokafka's 40 s, the term fails, and so did the process: `koordstream worker` with the
    bridge among its roles starts the bridge's process once and never again, so the cluster
    went on with no bridge at all. The bridge must lead again once the broker answers, from a
    full list (nothing lost: `Mirror.vanished` finds what was deleted meanwhile).
    Its own broker, control plane and Lease: the session's are not paused."""
    broker = EmbeddedBroker()
    broker.start()
    try:
        await wait_ready(broker.bootstrap)
        async with ControlPlane(tmp_path / "k8s", kwok=False, crds=False) as cp, cp.api() as api:
            lone = BridgeProcess(broker.bootstrap, cp.kubeconfig, tmp_path / "bridge.log",
                                 KOORDSTREAM_BRIDGE_LEASE_NAME="paused-broker")
            lone.start()
            try:
                await create_namespace(api, "paused")
                lease = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/paused-broker"

                async def leads() -> bool:
                    try:
                        return bool(((await api.request("GET", lease)).get("spec") or {}).get("holderIdentity"))
                    except KubeError:
                        return False
                await wait_until("the bridge to lead", leads, timeout=60)
                os.kill(broker.pid, signal.SIGSTOP)
                try:
                    await create_all(api, "/api/v1/namespaces/paused/pods",
                                     [pod_manifest(f"p{i}", "paused", "g") for i in range(3)])
                    await asyncio.sleep(45)
                finally:
                    os.kill(broker.pid, signal.SIGCONT)
                await create_all(api, "/api/v1/namespaces/paused/pods", [pod_manifest("after", "paused", "g")])
                async with Harness(broker.bootstrap) as h:
                    await h.wait_for(Pod, lambda p: p.name == "after", topic=topics.PODS, timeout=60)
                    assert {p.name for p in h.seen(Pod, topic=topics.PODS)} >= {"p0", "p1", "p2", "after"}
                assert lone.alive(), f"the bridge died: {lone.log.read_text()[-2000:]}"
            finally:
                lone.stop()
    finally:
        broker.stop()


@pytest.mark.e2e
async def test_the_bridge_killed_at_random_moments_while_pods_come_and_go_leaks_nothing(
        admin: KubeApi, bridge: BridgeProcess, bootstrap: str) -> None:
    """Three rounds: pods created, the bridge killed -9 at a random moment, pods deleted (bound
    ones among them) and created while no bridge leads, the bridge started again. Then every pod is deleted:
    each node must take a pod of its whole cpu (no capacity kept by a pod gone), and no pod
    was ever bound to two nodes."""
    rng = random.Random(29)
    ns = unique("churn")
    nodes = [kwok_node(f"{ns}-{i}", ns, cpu="4") for i in range(3)]
    await create_namespace(admin, ns)
    await create_all(admin, "/api/v1/nodes", nodes)
    await wait_until("the nodes Ready", lambda: nodes_ready(admin, [n["metadata"]["name"] for n in nodes]))
    base = f"/api/v1/namespaces/{ns}/pods"
    made = 0
    async with Harness(bootstrap) as h:
        try:
            for _ in range(3):
                await create_all(admin, base, [pod_manifest(f"p{made + i}", ns, ns, cpu="500m") for i in range(6)])
                made += 6
                await wait_until("some bound", functools.partial(_bound_at_least, admin, ns, made // 2))
                await asyncio.sleep(rng.uniform(0.0, 2.0))
                bridge.kill()
                listed = await pods(admin, ns)
                bound = [p["metadata"]["name"] for p in listed if p["spec"].get("nodeName")]
                live = [p["metadata"]["name"] for p in listed]
                doomed = set(rng.sample(bound, k=min(2, len(bound)))) | set(rng.sample(live, k=min(2, len(live))))
                for name in doomed:
                    await admin.request("DELETE", f"{base}/{name}", params={"gracePeriodSeconds": 0})
                await create_all(admin, base, [pod_manifest(f"p{made + i}", ns, ns, cpu="500m") for i in range(3)])
                made += 3
                bridge.start()
                await asyncio.sleep(rng.uniform(0.0, 6.0))
        finally:
            if not bridge.alive():
                bridge.start()
        await wait_until("every pod left bound", lambda: _all_bound(admin, ns), timeout=90)
        uids = {p["metadata"]["uid"] for p in await pods(admin, ns)}
        targets: dict[str, set[str]] = {}
        for b in h.seen(Binding, lambda b: b.namespace == ns):
            targets.setdefault(b.uid, set()).add(b.node)
        assert {u: n for u, n in targets.items() if len(n) > 1} == {}
        for name in [p["metadata"]["name"] for p in await pods(admin, ns)]:
            await admin.request("DELETE", f"{base}/{name}", params={"gracePeriodSeconds": 0})
        await wait_until("every pod gone", lambda: _gone(admin, ns))
        await create_all(admin, base, [pod_manifest(f"whole-{i}", ns, ns, cpu="4") for i in range(3)])
        assert len(await wait_until("a pod of a whole node's cpu on each node",
                                    lambda: _at_least_list(_bound_names(admin, ns), 3), timeout=60)) == 3
        assert uids


async def _bound_at_least(api: KubeApi, ns: str, count: int) -> bool:
    return len(await _bound_names(api, ns)) >= count


async def _all_bound(api: KubeApi, ns: str) -> bool:
    listed = await pods(api, ns)
    return bool(listed) and all(p["spec"].get("nodeName") for p in listed)


async def _at_least_list(names: Awaitable[list[str]], count: int) -> list[str] | None:
    got = await names
    return got if len(got) >= count else None


async def test_a_leader_listing_a_large_cluster_keeps_its_lease(control_plane: ControlPlane) -> None:
    """A leader's renewals run on the same event loop as the mirror: the mirror's work on a
    full list (about 90 us a pod here: 100,000 pods are 9 s and more of a blocked loop)
    must leave the renewals their turn, or a leader whose renewals are bounded by its renew
    deadline steps down after every list of a large cluster, and the next term lists again.
    Here 30,000 pods (3 s and more of work) against a 2 s deadline."""
    settings = load_settings(env={})
    async with control_plane.api() as api:
        bridge = Bridge(settings, api, frozenset({"koordstream"}))
        items = [{"metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}", "resourceVersion": "1"},
                  "spec": {"schedulerName": "koordstream", "containers": [
                      {"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]},
                  "status": {"phase": "Pending"}} for i in range(30_000)]
        published: list[Output] = []

        async def publish(outputs: list[Output]) -> None:
            published.extend(outputs)

        listed = asyncio.Event()

        async def lead() -> None:
            await bridge._on_list(POD, publish)(items)
            listed.set()
            await asyncio.sleep(3600)

        election = LeaderElection(api, "big", namespace="default", name=unique("lease"), duration_s=3,
                                  renew_deadline_s=2, retry_s=0.2)
        task = await _campaign(election, lead)
        try:
            await _until("the list handled", listed.is_set, timeout=120)
            await asyncio.sleep(0.5)
            assert (election.leading, election.transitions) == (True, 1), "the leader stepped down while it listed"
            assert len(published) == len(items)
        finally:
            await _stop(task)
