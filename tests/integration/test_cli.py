"""The `koordstream` command against the session's broker: publish (JSON lines and
Kubernetes manifests), topics, schema export, a sandbox claim and the pools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from schemas import topics
from schemas.codec import encode
from schemas.records import (
    Binding,
    Node,
    NodeStateChange,
    Pod,
    ResourceList,
    SandboxPoolStatus,
    SandboxTemplate,
    SandboxWarmPool,
)
from tests.builders import make_pod
from tests.integration.harness import Harness

pytestmark = pytest.mark.integration


def koordstream(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "250"})  # tables unwrapped


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


async def test_sandbox_claim_prints_the_sandbox_or_the_refusal_and_pools_lists_the_pools(harness: Harness,
                                                                                         run_id: str) -> None:
    ns, label = f"cli-sbx-{run_id}", {"suite": f"cli-sbx-{run_id}"}
    node = Node(name=f"cli-sbx-{run_id}", labels=label, allocatable=ResourceList(cpu=8000, memory=2**34, pods=110))
    await harness.publish(topics.NODES, [node])
    await harness.wait_for(NodeStateChange, lambda c: c.node == node.name)
    template = SandboxTemplate(namespace=ns, name="py", env_policy="Allowed", pod=Pod(
        uid="", name="", node_selector=label, requests=ResourceList(cpu=100, memory=128 << 20)))
    await harness.publish(topics.SANDBOX, [SandboxWarmPool(namespace=ns, name="warm", template=template, replicas=2),
                                           SandboxWarmPool(namespace=ns, name="empty", template=template, replicas=0,
                                                           overflow="Deny")])
    await harness.wait_for(SandboxPoolStatus, lambda s: s.namespace == ns and s.name == "warm" and s.ready == 2,
                           timeout=60)
    common = ("--namespace", ns, "--bootstrap", harness.bootstrap)
    done = koordstream("sandbox", "claim", "warm", "--name", "mine", "--env", "TASK=7", "--label", "team=a",
                       "--shutdown-after", "10m", "--json", *common)
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout.splitlines()[0])
    assert answer["phase"] == "Ready" and answer["name"] == "mine" and answer["path"] == "warm"
    assert answer["env"] == [{"name": "TASK", "value": "7", "container_name": ""}] and answer["labels"] == {"team": "a"}
    assert f"on node {node.name} (path warm" in done.stdout and "ready in" in done.stdout
    done = koordstream("sandbox", "claim", "empty", *common)  # nothing to adopt, and overflow Deny
    assert done.returncode == 1
    assert "refused: WarmPoolEmpty" in done.stdout and "next step: ScaleWarmPool" in done.stdout
    assert "alternative ScaleWarmPool: raise spec.replicas of empty above 0 (spec.replicas=1)" in done.stdout
    done = koordstream("sandbox", "claim", "nowhere", *common)
    assert done.returncode == 1 and "refused: WarmPoolNotFound" in done.stdout and "CreateWarmPool" in done.stdout
    await harness.wait_for(SandboxPoolStatus, lambda s: s.namespace == ns and s.name == "warm" and s.claims == 1
                           and s.ready == 2, timeout=60)  # refilled
    done = koordstream("sandbox", "pools", "--bootstrap", harness.bootstrap)
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if f"{ns}/warm " in line)
    cells = [cell.strip() for cell in row.split("│")[1:-1]]
    assert cells[:7] == [f"{ns}/warm", "2", "2", "0", "1", "1", "1"]  # replicas, ready, starting, claimed, claims, warm


@pytest.mark.parametrize("option", [("--env", "NOVALUE"), ("--label", "=x"), ("--shutdown-after", "soon")],
                         ids=["env", "label", "shutdown-after"])
def test_sandbox_claim_refuses_a_bad_option_before_sending(option: tuple[str, str]) -> None:
    done = koordstream("sandbox", "claim", "warm", *option, "--bootstrap", "127.0.0.1:1")
    assert done.returncode == 2 and option[0] in done.stdout
