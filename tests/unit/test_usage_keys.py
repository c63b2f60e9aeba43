"""The device-usage keys (`agents.state.usage`): what the owners write, the replicas and
preemption read back."""

from agents.intake import RawMessage, intake
from agents.state import devices
from agents.state import usage as keys
from schemas.codec import encode_batch
from schemas.records import Claim, ResourceList


def test_keys_parse_back_to_their_parts() -> None:
    for key, parts in ((keys.gpu_core(3), ("gpu", 3, "core")), (keys.gpu_ratio(3), ("gpu", 3, "ratio")),
                       (keys.rdma_vfs(1), ("rdma", 1, "vfs")), (keys.cpu_used(17), ("cpu", 17, "used")),
                       (keys.numa_memory(0), ("numa", 0, "memory"))):
        assert keys.parse(key) == parts


def test_a_claims_devices_add_up_under_the_keys_the_readers_use() -> None:
    usage: dict[str, int] = {}
    claimed = [devices.GpuAllocation(minor=2, core=50, ratio=50).encode(),
               devices.RdmaAllocation(minor=1, vfs=2).encode()]
    devices.add_usage(usage, claimed)
    devices.add_usage(usage, claimed)
    assert usage == {keys.gpu_core(2): 100, keys.gpu_ratio(2): 100, keys.rdma_vfs(1): 4}
    assert keys.by_index(usage, "rdma") == {1: 4} and keys.by_index(usage, "cpu") == {}


def test_a_device_entry_its_kinds_parser_refuses_is_named_and_unknown_kinds_pass() -> None:
    assert devices.malformed(["gpu/0/50/50", "rdma/1/2", "cpuset/0/1,2/100", "fpga/0"]) is None
    for bad in ("gpu/x/50/50", "rdma/1/two", "cpuset/0/1,x"):
        found = devices.malformed(["gpu/0/50/50", bad])
        assert found is not None and found[0] == 1


def test_intake_dead_letters_a_record_whose_device_entry_does_not_parse() -> None:
    good = Claim(uid="ok", attempt=0, node="n1", decision_key="ok", requests=ResourceList(cpu=1), devices=("gpu/0/50/50",))
    bad = Claim(uid="bad", attempt=0, node="n1", decision_key="bad", requests=ResourceList(cpu=1),
                devices=("gpu/0/50/50", "gpu/x/50/50"))
    out = intake([RawMessage(encode_batch([bad, good]), "node-inbox", 0, 7)])
    assert out.records == [good]
    [letter] = [o.record for o in out.dead_letters]
    assert (letter.field, letter.value, letter.offset) == ("devices[1]", "gpu/x/50/50", 7)  # type: ignore[attr-defined]
