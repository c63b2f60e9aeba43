"""Bad trace files are refused before a run, naming the file, line, column and value: a cell
that is not a non-negative integer, and a `gpu_spec` naming a GPU model no node has."""

from __future__ import annotations

from pathlib import Path

import pytest

from perf.trace import bench_trace

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,96000,393216,8,V100M32\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


@pytest.mark.parametrize(("pod_line", "message"), [
    ("p1,4000,1024,1,500,A100|P100,LS,Running,0,,0", "pods.csv:3: gpu_spec='A100|P100': no node has GPU model A100"),
    ("p1,lots,1024,1,500,,LS,Running,0,,0", "pods.csv:3: cpu_milli='lots': not an integer"),
    ("p1,4000,-5,0,0,,LS,Running,0,,0", "pods.csv:3: memory_mib='-5': cannot be negative"),
])
def test_a_bad_pod_row_is_refused_before_the_run(tmp_path: Path, pod_line: str, message: str) -> None:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(POD_HEADER + "p0,1000,1024,1,1000,V100M32,LS,Running,0,,0\n" + pod_line + "\n")
    with pytest.raises(ValueError, match=message.replace("|", r"\|")):
        bench_trace(str(nodes), str(pods), 1.0, [1], ["BestFit"])


def test_a_bad_node_row_is_refused(tmp_path: Path) -> None:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES.replace("n1,96000,393216,8", "n1,96000,393216,eight"))
    pods.write_text(POD_HEADER)
    with pytest.raises(ValueError, match="nodes.csv:3: gpu='eight': not an integer"):
        bench_trace(str(nodes), str(pods), 1.0, [1], ["BestFit"])


def test_good_files_run(tmp_path: Path) -> None:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(POD_HEADER + "p0,1000,1024,1,1000,V100M32,LS,Running,0,,0\np1,4000,1024,1,500,,LS,Running,0,,0\n")
    result = bench_trace(str(nodes), str(pods), 1.0, [1], ["FGD", "BestFit"])
    assert {r["policy"] for r in result["results"]} == {"FGD", "BestFit"}
