"""`perf.profile`: collapsed stacks read, samples sorted into stages, CPU per pod by stage, the
flame graph drawn, and py-spy attached to a real process for the length of an `async with`."""

from __future__ import annotations

import asyncio
import gzip
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from perf.profile import Profiler, codec, flamegraph_svg, per_pod_us, read_collapsed, stages

LOOP = "run (asyncio/base_events.py:607);StatefulLoop.run (agents/adapters/loop.py:273)"
STACKS = f"""\
{LOOP};OwnerCore.apply (agents/adapters/owners.py:117);NodeOwner.apply (agents/state/owner.py:647) 40
{LOOP};OwnerCore.apply (agents/adapters/owners.py:117);NodeState.to_json (agents/state/owner.py:555) 10
{LOOP};PlainSink.flush (agents/adapters/transactions.py:103);VersionedState.write_changelog (agents/adapters/tables.py:495) 5
{LOOP};PlainSink.flush (agents/adapters/transactions.py:107);PartitionedOutbox.send (streams/outbox.py:50);encode_batch (schemas/codec.py:56) 15
{LOOP};intake (agents/intake.py:139);decode_message (schemas/codec.py:438);decode (<string>:3) 20
run (asyncio/base_events.py:607);EpollSelector.select (selectors.py:468) 10
garbled line without a count
"""


def test_collapsed_stacks_are_read_and_sorted_into_stages_by_the_first_rule_any_frame_matches() -> None:
    p = read_collapsed(STACKS, "state")
    assert p.samples == 100
    # The table value built inside the owner's apply is the changelog's, not the owner's.
    by_stage = stages(p)
    assert by_stage == {"owner apply": 40, "intake": 20, "changelog": 15, "outputs": 15, "idle": 10}
    assert list(by_stage)[0] == "owner apply"  # largest first
    assert codec(p) == {"decode": 20, "encode": 15}


def test_cpu_per_pod_splits_the_busy_samples_only() -> None:
    us = per_pod_us({"owner apply": 60, "changelog": 30, "idle": 10}, cpu_s=9.0, pods=1000)
    assert us == {"owner apply": 6000.0, "changelog": 3000.0}
    assert per_pod_us({"idle": 5}, 1.0, 10) == {} and per_pod_us({"a": 1}, 1.0, 0) == {}
    assert per_pod_us({"decode": 45}, cpu_s=9.0, pods=1000, busy=90) == {"decode": 4500.0}


def test_the_flame_graph_is_valid_svg_with_a_frame_per_function_and_its_share() -> None:
    svg = flamegraph_svg(read_collapsed(STACKS), "sandbox-burst: state")
    root = ET.fromstring(svg)
    titles = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("NodeOwner.apply (agents/state/owner.py:647) (40 samples, 40.00%)") for t in titles)
    assert any(t.startswith("run (asyncio/base_events.py:607) (100 samples, 100.00%)") for t in titles)
    widths = [float(r.get("width", 0)) for r in root.iter("{http://www.w3.org/2000/svg}rect")]
    assert max(widths) == pytest.approx(1600.0)


@pytest.mark.skipif(not (shutil.which("py-spy") or Path(sys.executable).with_name("py-spy").exists()),
                    reason="py-spy is not installed")
def test_py_spy_is_attached_to_a_live_process_and_its_samples_are_kept(tmp_path: Path) -> None:
    busy = subprocess.Popen([sys.executable, "-c", "def spin():\n while True: sum(range(1000))\nspin()"])
    try:
        async def profile() -> Profiler:
            async with Profiler(tmp_path, "spin", {"worker": busy.pid}) as profiler:
                await asyncio.sleep(1.5)
            return profiler

        profiler = asyncio.run(profile())
    finally:
        busy.kill()
        busy.wait()
    if not profiler.profiles:  # py-spy needs ptrace rights this machine may not give
        pytest.skip("py-spy could not attach here")
    assert (tmp_path / "spin-worker.txt.gz").exists() and (tmp_path / "spin-worker.svg").exists()
    kept = read_collapsed(gzip.decompress((tmp_path / "spin-worker.txt.gz").read_bytes()).decode())
    assert kept.stacks == profiler.profiles["worker"].stacks
    p = profiler.profiles["worker"]
    assert p.samples > 20 and any("spin" in stack for stack in p.stacks)
    figures = profiler.figures({"worker": 1.5}, pods=10)
    assert figures["worker"]["samples"] == p.samples and figures["worker"]["stages"]
