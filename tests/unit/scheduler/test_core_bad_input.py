"""Pods that cannot be placed as they are get one final SchedulingFeedback that says why, are
not retried in a loop, and the scheduler goes on with the others."""

from __future__ import annotations

from typing import Any

import pytest

from agents.scheduler.cluster import ClusterState
from agents.scheduler.core import SchedulerCore
from agents.state.resources import ResourceSpace
from schemas.records import Claim, NodeStateChange, Pod, ResourceList, SchedulingFeedback
from tests.builders import make_node

BAD_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["z1"]}]}]}}}


BAD = pytest.mark.parametrize(("fields", "says"), [
    ({"scheduler_name": "nobody"}, "no scheduler profile named 'nobody'"),
    ({"requests": ResourceList({"example.com/widget": 1})}, "requests.example.com/widget: unknown resource"),
    ({"requests": ResourceList({"cpu": -5})}, "requests.cpu=-5: a request cannot be negative"),
    ({"affinity": BAD_AFFINITY}, "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                                 ".nodeSelectorTerms[0].matchExpressions[0].operator='Near'"),
    ({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}}},
     "affinity.podAntiAffinity: inter-pod affinity is not supported yet"),
], ids=["unknown-profile", "unknown-resource", "negative-request", "malformed-affinity", "pod-affinity"])


@BAD
def test_bad_pod_gets_final_feedback_once_and_the_scheduler_goes_on(fields: dict[str, Any], says: str) -> None:
    space = ResourceSpace()
    clock = [0.0]
    core = SchedulerCore(space, ClusterState.from_records(space, [make_node("a")]), lambda: clock[0])
    outputs = core.add(Pod(uid="bad", name="bad", **fields))
    core.add(Pod(uid="good", name="good", requests=ResourceList(cpu=100)))
    outputs += core.schedule()
    feedback = [o.record for o in outputs if isinstance(o.record, SchedulingFeedback)]
    assert len(feedback) == 1 and feedback[0].uid == "bad" and feedback[0].final and says in feedback[0].message
    assert [o.record.uid for o in outputs if isinstance(o.record, Claim)] == ["good"]
    # Nothing brings it back by itself: not time, not cluster events.
    clock[0] += 3600
    core.apply_state_changes([NodeStateChange(node="b", seq=1, allocatable=ResourceList(cpu=4000))])
    assert core.schedule() == [] and core.next_wakeup() is None


@BAD
def test_a_queued_pod_updated_to_a_bad_version_is_not_placed_as_it_was(fields: dict[str, Any], says: str) -> None:
    """Found by the restart property (tests/unit/test_commit_points_restart.py): the earlier
    version stayed queued, was claimed, and the refused pod counted as claimed again."""
    space = ResourceSpace()
    core = SchedulerCore(space, ClusterState.from_records(space, [make_node("a")]), lambda: 0.0)
    core.add(Pod(uid="p", name="p", requests=ResourceList(cpu=100)))
    outputs = core.add(Pod(uid="p", name="p", **fields))
    outputs += core.schedule()
    assert not [o for o in outputs if isinstance(o.record, Claim)]
    [feedback] = [o.record for o in outputs if isinstance(o.record, SchedulingFeedback)]
    assert feedback.final and says in feedback.message and core.pods["p"].state == "failed"
