"""The device-usage keys (`agents.state.usage`): what the owners write, the replicas and
preemption read back."""

from agents.state import devices
from agents.state import usage as keys


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
