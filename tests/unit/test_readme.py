"""The README's library example runs as written."""

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CLUSTER = """
apiVersion: v1
kind: Node
metadata: {name: worker-1}
spec: {taints: [{key: dedicated, value: gpu, effect: NoSchedule}]}
status: {allocatable: {cpu: "4", memory: 8Gi}}
---
apiVersion: v1
kind: Node
metadata: {name: worker-2}
status: {allocatable: {cpu: "8", memory: 16Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: web, uid: web-1}
spec: {containers: [{name: c, resources: {requests: {cpu: 500m}}}]}
"""


def test_library_example_runs(tmp_path: Path, capsys) -> None:
    block = re.search(r"## Using the core as a library.*?```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(block.group(1), "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "web -> worker-2"
    assert "'NodeResourcesFit':" in lines[1] and "'total':" in lines[1]
    assert lines[2] == "{'worker-1': ['TaintToleration']}"
