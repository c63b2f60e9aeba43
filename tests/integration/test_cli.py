"""The `koordstream` command against the session's broker: publish (JSON lines and
Kubernetes manifests), topics, schema export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from schemas import topics
from schemas.codec import encode
from schemas.records import Binding, NodeStateChange
from tests.builders import make_pod
from tests.integration.harness import Harness

pytestmark = pytest.mark.integration


def koordstream(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=60)


async def test_publish_manifests_and_jsonl_then_pods_bind(harness: Harness, run_id: str, tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(f"""
apiVersion: v1
kind: Node
metadata: {{name: cli-{run_id}}}
status: {{allocatable: {{cpu: "8", memory: 32Gi, pods: "110"}}}}
""")
    done = koordstream("publish", str(nodes), "--topic", topics.NODES, "--bootstrap", harness.bootstrap)
    assert done.returncode == 0, done.stderr + done.stdout
    await harness.wait_for(NodeStateChange, lambda c: c.node == f"cli-{run_id}")
    pods = tmp_path / "pods.jsonl"
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "m", "uid": f"cli-m-{run_id}"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "250m"}}}]}}
    pods.write_text(encode(make_pod(f"cli-r-{run_id}")).decode() + "\n" + json.dumps(manifest) + "\n")
    done = koordstream("publish", str(pods), "--topic", topics.PODS, "--bootstrap", harness.bootstrap)
    assert done.returncode == 0, done.stderr + done.stdout
    await harness.wait_for(Binding, lambda b: b.uid in {f"cli-r-{run_id}", f"cli-m-{run_id}"}, count=2)
    read = koordstream("read", topics.BINDINGS, "--from-beginning", "--idle", "1", "--bootstrap", harness.bootstrap)
    assert read.returncode == 0
    bound = [json.loads(line) for line in read.stdout.splitlines() if f"cli-m-{run_id}" in line]
    assert len(bound) == 1 and bound[0]["kind"] == "Binding" and bound[0]["node"]


def test_publish_refuses_a_bad_line_naming_line_field_and_value(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    good = orjson.loads(encode(make_pod("x")))
    bad.write_text(json.dumps(good) + "\n" + json.dumps({**good, "requests": {"cpu": "-1"}}) + "\n")
    done = koordstream("publish", str(bad), "--topic", topics.PODS, "--bootstrap", "127.0.0.1:1")
    assert done.returncode == 1
    assert "bad.jsonl:2" in done.stdout and "requests.cpu" in done.stdout and "-1" in done.stdout


def test_schema_export_writes_a_schema_per_record(tmp_path: Path) -> None:
    done = koordstream("schema", "export", str(tmp_path))
    assert done.returncode == 0, done.stderr
    pod = json.loads((tmp_path / "Pod.schema.json").read_text())
    assert pod["properties"]["kind"] == {"const": "Pod"} and "uid" in pod["required"]
    assert len(list(tmp_path.glob("*.schema.json"))) >= 20


def test_topics_lists_the_catalogue() -> None:
    done = koordstream("topics")
    assert done.returncode == 0
    for name in (topics.NODE_INBOX, topics.HOLDS, topics.STATE_CHANGES, topics.DEAD_LETTER):
        assert name in done.stdout


def test_bad_settings_are_refused_naming_the_field() -> None:
    done = subprocess.run([sys.executable, "-m", "cli.main", "topics"], capture_output=True, text=True,
                          env={"KOORDSTREAM_KAFKA_PARTITIONS": "lots", "PATH": ""}, timeout=60)
    assert done.returncode == 2 and "kafka.partitions" in done.stdout


async def test_rebalance_plan_reads_the_cluster_from_the_topics(harness: Harness, run_id: str, tmp_path: Path) -> None:
    """`koordstream rebalance plan --bootstrap`: nodes, and the pods Bindings placed (not the
    deleted one), planned over as they are; a scale-down ranks the workload's pods."""
    from dataclasses import replace

    from schemas.records import OwnerReference, PodDeleted
    from streams.reader import read_cluster
    from tests.builders import make_node

    node = make_node(f"rb-{run_id}", cpu=8000, labels={"rb": run_id})
    owner = (OwnerReference(kind="ReplicaSet", name=f"rb-{run_id}", uid=f"rs-{run_id}", controller=True),)
    pods = [replace(make_pod(f"rb-{run_id}-{i}", cpu=1000), owner_references=owner, node_selector={"rb": run_id})
            for i in range(3)]
    await harness.publish(topics.NODES, [node])
    await harness.wait_for(NodeStateChange, lambda c: c.node == node.name)
    await harness.publish(topics.PODS, pods)
    await harness.wait_for(Binding, lambda b: b.uid.startswith(f"rb-{run_id}-"), count=3)
    await harness.publish(topics.PODS, [PodDeleted(uid=pods[0].uid, name=pods[0].name)])
    nodes, bound, _ = await read_cluster(harness.bootstrap, 4)
    ours = {p.uid: p.node_name for p in bound if p.uid.startswith(f"rb-{run_id}-")}
    assert node.name in {n.name for n in nodes}
    assert ours == {pods[1].uid: node.name, pods[2].uid: node.name}
    out = tmp_path / "plan.json"
    done = koordstream("rebalance", "plan", "--bootstrap", harness.bootstrap, "--now", "2e9", "--json", str(out),
                       "--scale-down", f"default/ReplicaSet/rb-{run_id}=1")
    assert done.returncode == 0, done.stderr + done.stdout
    assert "FragmentationAware (global)" in done.stdout
    [down] = json.loads(out.read_text())["profiles"]["default"]["scale_downs"]
    assert down["victims"] in ([pods[1].uid], [pods[2].uid]) and set(down["costs"]) == set(ours)
