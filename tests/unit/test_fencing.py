"""Zombie fencing (DESIGN.md, safety rule 4): the pure rules for restorers and readers."""

from agents.adapters.tables import supersedes
from agents.intake import EpochFence, RawMessage, intake, origin_from_headers, origin_headers
from agents.ports import Origin
from schemas.codec import encode
from tests.builders import make_claim


def test_a_write_of_an_older_epoch_never_supersedes() -> None:
    assert supersedes({"epoch": 3, "seq": 1}, {"epoch": 2, "seq": 99})
    assert supersedes({"epoch": 2, "seq": 100}, {"epoch": 2, "seq": 99})
    assert not supersedes({"epoch": 1, "seq": 10**6}, {"epoch": 2, "seq": 1})
    assert supersedes(None, {"epoch": 2, "seq": 1}) and supersedes({"epoch": 0, "seq": 1}, None)


def test_origin_round_trips_through_headers() -> None:
    origin = Origin("node-inbox/3", 7)
    assert origin_from_headers(origin_headers(origin)) == origin
    assert origin_from_headers(dict(origin_headers(origin))) == origin
    assert origin_from_headers(None) is None
    assert origin_from_headers([("koordstream-origin", b"x/1"), ("koordstream-epoch", b"seven")]) is None


def test_fence_drops_only_older_epochs_of_the_same_origin() -> None:
    fence = EpochFence()
    assert fence.admit(Origin("holds/1", 4))
    assert fence.admit(Origin("holds/1", 5))
    assert not fence.admit(Origin("holds/1", 4))  # a zombie of epoch 4 after epoch 5 was seen
    assert fence.admit(Origin("holds/2", 0))  # other origins are independent
    assert fence.admit(None)  # untagged producers (schedulers, outside publishers)
    assert fence.dropped == 1


def test_intake_skips_messages_the_fence_refuses() -> None:
    fence = EpochFence()
    value = encode(make_claim("a"))
    messages = [RawMessage(value, "node-inbox", 0, 0, Origin("holds/0", 2)),
                RawMessage(value, "node-inbox", 0, 1, Origin("holds/0", 1)),
                RawMessage(value, "node-inbox", 0, 2, None)]
    got = intake(messages, fence=fence)
    assert len(got.records) == 2 and got.dead_letters == []
