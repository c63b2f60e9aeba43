"""Bad input goes to the dead-letter topic with field, value, source and original bytes; the
agents keep running and process the next valid record."""

from __future__ import annotations

import base64

import orjson
import pytest

from schemas import topics
from schemas.codec import encode
from schemas.records import Binding, Claim, DeadLetter, Pod, ResourceList, SchedulingFeedback
from tests.integration.harness import Harness

pytestmark = pytest.mark.integration


def pod_json(uid: str, **fields: object) -> bytes:
    raw = orjson.loads(encode(Pod(uid=uid, name=uid, requests=ResourceList(cpu=100))))
    raw.update(fields)
    return orjson.dumps(raw)


CASES = [
    ("not-json", lambda u: b"{this is not json " + u.encode(), ""),
    ("unknown-major", lambda u: pod_json(u, schema_version="9.0"), "schema_version"),
    ("missing-field", lambda u: orjson.dumps({"kind": "Pod", "name": u}), "uid"),
    ("ill-typed", lambda u: pod_json(u, priority="urgent"), "priority"),
    ("unparsable-quantity", lambda u: pod_json(u, requests={"cpu": "two"}), "requests.cpu"),
    ("negative-quantity", lambda u: pod_json(u, requests={"memory": "-1Gi"}), "requests.memory"),
    ("superscript-quantity", lambda u: pod_json(u, requests={"cpu": "\u00b2"}), "requests.cpu"),  # "²".isdigit()
]


@pytest.mark.parametrize(("case", "make", "field"), CASES, ids=[c[0] for c in CASES])
async def test_bad_pod_record_is_dead_lettered_and_the_next_one_bound(
        harness: Harness, run_id: str, case: str, make, field: str) -> None:
    uid = f"bad-{case}-{run_id}"
    raw = make(uid)
    await harness.producer.send_raw(topics.PODS, raw, key=uid.encode(), partition=1)
    good = Pod(uid=f"good-{case}-{run_id}", name="good", requests=ResourceList(cpu=100))
    await harness.producer.send_raw(topics.PODS, encode(good), key=good.uid.encode(), partition=1)
    [letter] = await harness.wait_for(DeadLetter, lambda d: base64.b64decode(d.original) == raw)
    assert letter.topic == topics.PODS and letter.partition == 1 and letter.offset >= 0
    assert letter.field == field
    if field:
        assert field in letter.error
    await harness.wait_for(Binding, lambda b: b.uid == good.uid)


@pytest.mark.parametrize("topic", [topics.NODES, topics.NODE_INBOX, topics.HOLDS, topics.SANDBOX])
async def test_every_agent_dead_letters_garbage_and_keeps_going(harness: Harness, run_id: str, topic: str) -> None:
    raw = f"garbage for {topic} {run_id}".encode()
    await harness.producer.send_raw(topic, raw, partition=0)
    [letter] = await harness.wait_for(DeadLetter, lambda d: base64.b64decode(d.original) == raw)
    assert letter.topic == topic and "not JSON" in letter.error


async def test_record_of_the_wrong_kind_is_dead_lettered(harness: Harness, run_id: str) -> None:
    misplaced = Binding(uid=f"misplaced-{run_id}", namespace="ns", name="x", node="n", attempt=0, decision_key="x")
    await harness.producer.send_raw(topics.PODS, encode(misplaced), partition=2)
    [letter] = await harness.wait_for(DeadLetter, lambda d: misplaced.uid in base64.b64decode(d.original).decode())
    assert letter.field == "kind" and letter.value == "Binding"


async def test_a_claim_naming_a_device_that_does_not_parse_is_dead_lettered_and_the_owners_go_on(
        harness: Harness, run_id: str) -> None:
    claim = Claim(uid=f"bad-device-{run_id}", attempt=0, node="n1", decision_key=f"bad-device-{run_id}",
                  requests=ResourceList(cpu=100), devices=("gpu/x/50/50",))
    await harness.producer.send_raw(topics.NODE_INBOX, encode(claim), key=b"n1", partition=0)
    [letter] = await harness.wait_for(DeadLetter, lambda d: claim.uid in base64.b64decode(d.original).decode())
    assert letter.field == "devices[0]" and letter.value == "gpu/x/50/50" and letter.topic == topics.NODE_INBOX
    good = Pod(uid=f"after-bad-device-{run_id}", name="good", requests=ResourceList(cpu=100))
    await harness.producer.send_raw(topics.PODS, encode(good), key=good.uid.encode(), partition=0)
    await harness.wait_for(Binding, lambda b: b.uid == good.uid)


async def test_one_bad_element_of_a_batch_spares_the_rest(harness: Harness, run_id: str) -> None:
    good = orjson.loads(encode(Pod(uid=f"batch-ok-{run_id}", name="ok", requests=ResourceList(cpu=100))))
    bad = {**good, "uid": f"batch-bad-{run_id}", "requests": {"cpu": "-5"}}
    await harness.producer.send_raw(topics.PODS, orjson.dumps([bad, good]), partition=3)
    [letter] = await harness.wait_for(DeadLetter, lambda d: d.field == "[0].requests.cpu" and run_id in base64.b64decode(d.original).decode())
    assert letter.value == "-5"
    await harness.wait_for(Binding, lambda b: b.uid == good["uid"])


async def test_commit_of_a_hold_never_held_raises_an_alarm(harness: Harness, run_id: str) -> None:
    from schemas.records import Commit, Node, NodeStateChange

    node = Node(name=f"alarm-{run_id}", allocatable=ResourceList(cpu=1000))
    await harness.publish(topics.NODES, [node])
    await harness.wait_for(NodeStateChange, lambda c: c.node == node.name)
    await harness.publish(topics.NODE_INBOX, [Commit(uid=f"nobody-{run_id}", attempt=0, node=node.name, decision_key="x")])
    [letter] = await harness.wait_for(DeadLetter, lambda d: d.value == f"nobody-{run_id}/0/{node.name}")
    assert letter.field == "hold_id" and "not held" in letter.error and letter.topic == topics.NODE_INBOX


async def test_deciders_drop_a_zombies_records(harness: Harness, run_id: str) -> None:
    """Held records stamped with an older epoch of an origin already seen are a zombie's:
    the decider ignores them (DESIGN.md, safety rule 4)."""
    from agents.intake import origin_headers
    from agents.ports import Origin
    from schemas.records import Held

    origin = f"test-origin-{run_id}/0"

    async def held(uid: str, epoch: int) -> None:
        record = Held(uid=uid, attempt=0, node=f"fence-{run_id}", decision_key=uid, name=uid)
        await harness.producer.send_raw(topics.HOLDS, encode(record), partition=0,
                                        headers=origin_headers(Origin(origin, epoch)))

    await held(f"fresh-{run_id}", 100)
    await held(f"zombie-{run_id}", 99)
    await held(f"later-{run_id}", 100)
    await harness.wait_for(Binding, lambda b: b.uid in {f"fresh-{run_id}", f"later-{run_id}"}, count=2)
    assert not harness.seen(Binding, lambda b: b.uid == f"zombie-{run_id}")


BAD_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "zone=z1"}}}


@pytest.mark.parametrize(("fields", "says"), [
    ({"scheduler_name": "no-such-profile"}, "no scheduler profile named 'no-such-profile'"),
    ({"requests": ResourceList({"example.com/widget": 2})}, "unknown resource"),
    ({"affinity": BAD_AFFINITY}, "nodeSelectorTerms"),
], ids=["unknown-profile", "unknown-resource", "malformed-affinity"])
async def test_unplaceable_pod_gets_final_feedback_and_the_next_pod_is_bound(
        harness: Harness, run_id: str, fields: dict[str, object], says: str) -> None:
    bad = Pod(uid=f"unplaceable-{run_id}", name="unplaceable", **fields)  # type: ignore[arg-type]
    good = Pod(uid=f"after-unplaceable-{run_id}", name="after", requests=ResourceList(cpu=10))
    await harness.publish(topics.PODS, [bad, good])
    [feedback] = await harness.wait_for(SchedulingFeedback, lambda f: f.uid == bad.uid)
    assert feedback.final and says in feedback.message
    await harness.wait_for(Binding, lambda b: b.uid == good.uid)
    assert len(harness.seen(SchedulingFeedback, lambda f: f.uid == bad.uid)) == 1  # not retried in a loop


async def test_a_pod_naming_an_unknown_runtime_class_gets_final_feedback_naming_the_field(
        harness: Harness, run_id: str) -> None:
    """Admission through the runtimes table at the scheduler's edge: refused with a hint, never
    a crash; the worker goes on and the next sandbox (a shipped runtime class) binds."""
    bad = Pod(uid=f"no-runtime-{run_id}", name="no-runtime", runtime_class_name="no-such-runtime",
              requests=ResourceList(cpu=10))
    good = Pod(uid=f"gvisor-{run_id}", name="gvisor", runtime_class_name="gvisor", requests=ResourceList(cpu=10))
    await harness.publish(topics.PODS, [bad, good])
    [feedback] = await harness.wait_for(SchedulingFeedback, lambda f: f.uid == bad.uid)
    assert feedback.final and feedback.message.startswith("spec.runtimeClassName='no-such-runtime': no such RuntimeClass")
    assert feedback.reason == "RuntimeClassNotFound" and feedback.next_step in ("ChangeRuntimeClass", "FixPod")
    assert {a.kind for a in feedback.alternatives} <= {"RuntimeClass"}  # decoded from the topic, nested records and all
    await harness.wait_for(Binding, lambda b: b.uid == good.uid)
    assert len(harness.seen(SchedulingFeedback, lambda f: f.uid == bad.uid)) == 1  # not retried in a loop
