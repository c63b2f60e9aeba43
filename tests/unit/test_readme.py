"""The README's and the reference pages' examples run as written, and the settings table is whole."""

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
SANDBOXES = ROOT / "docs" / "sandboxes.md"

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
    block = re.search(r"## Using the core as a library.*?```python\n(.*?)```", README.read_text(), re.S)
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


def test_every_setting_is_in_the_configuration_table() -> None:
    import dataclasses

    from streams.settings import Settings

    text = CONFIGURATION.read_text()
    table = text[text.index("## Settings"):text.index("## Secured Kafka")]
    documented = set()
    for section, name, other in re.findall(r"^\| `([a-z_]+)\.([a-z_]+)`(?: / `([a-z_]+)`)?", table, re.M):
        documented |= {f"{section}.{name}", f"{section}.{other}"}
    settings = Settings()
    missing = [f"{s.name}.{f.name}" for s in dataclasses.fields(settings)
               for f in dataclasses.fields(getattr(settings, s.name)) if f"{s.name}.{f.name}" not in documented]
    assert missing == []


def test_the_secured_kafka_example_loads_and_logs_in_with_scram_over_tls(tmp_path: Path) -> None:
    from streams.connection import connect
    from streams.kafka_broker import write_tls_files
    from streams.settings import load_settings

    block = re.search(r"## Secured Kafka.*?```yaml\n(.*?)```", CONFIGURATION.read_text(), re.S)
    assert block
    write_tls_files(tmp_path)
    (tmp_path / "password").write_text("from-a-file\n")
    text = (block.group(1).replace("/run/secrets/kafka-password", str(tmp_path / "password"))
            .replace("/etc/koordstream/kafka-ca.pem", str(tmp_path / "ca.pem")))
    (tmp_path / "koordstream.yaml").write_text(text)
    conn = connect(load_settings(tmp_path / "koordstream.yaml", env={}).kafka)
    assert (conn.security_protocol, conn.sasl_mechanism, conn.sasl_username) == ("SASL_SSL", "SCRAM-SHA-512",
                                                                                   "koordstream")
    assert conn.sasl_password.reveal() == "from-a-file" and conn.ssl_context is not None


def test_the_sandbox_runtimes_example_loads_and_admits() -> None:
    from agents.sandbox.runtimes import load_runtimes
    from schemas.records import Pod, ResourceList

    block = re.search(r"## Runtime classes.*?```yaml\n(.*?)```", SANDBOXES.read_text(), re.S)
    assert block
    pod = load_runtimes(block.group(1)).admit(Pod(uid="p", name="p", runtime_class_name="gvisor",
                                                  requests=ResourceList(cpu=100)))
    assert pod.node_selector == {"sandbox.gke.io/runtime": "gvisor"} and pod.labels["koordinator.sh/qosClass"] == "LS"


def test_the_warm_pool_example_is_a_pool_the_pools_accept() -> None:
    import json

    from agents.sandbox.templates import validate_pool
    from schemas.codec import decode_object
    from schemas.records import SandboxWarmPool

    block = re.search(r"## Sandboxes and warm pools.*?```json\n(.*?)```", README.read_text(), re.S)
    assert block
    pool = decode_object(json.loads(block.group(1)))
    assert isinstance(pool, SandboxWarmPool) and pool.replicas == 20 and pool.template.pod.runtime_class_name == "gvisor"
    validate_pool(pool)


def test_the_readme_configuration_example_loads(tmp_path: Path) -> None:
    from streams.settings import load_settings

    block = re.search(r"## Configuration.*?```yaml\n(.*?)```", README.read_text(), re.S)
    assert block
    (tmp_path / "koordstream.yaml").write_text(block.group(1))
    settings = load_settings(tmp_path / "koordstream.yaml", env={})
    assert settings.worker.roles == ("scheduler", "state") and settings.worker.metrics_port == 9100


def test_the_warm_pool_manifests_convert_to_a_pool_the_pools_accept(tmp_path: Path) -> None:
    from agents.sandbox.templates import validate_pool
    from schemas.records import SandboxWarmPool
    from streams.publish import read_records

    block = re.search(r"## Warm pools.*?```yaml\n(.*?)```", SANDBOXES.read_text(), re.S)
    assert block
    (tmp_path / "pools.yaml").write_text(block.group(1))
    [pool] = read_records(tmp_path / "pools.yaml")
    assert isinstance(pool, SandboxWarmPool) and pool.replicas == 20 and pool.template.pod.runtime_class_name == "gvisor"
    validate_pool(pool)


def test_the_reference_pages_linked_from_the_readme_exist() -> None:
    for link in re.findall(r"\]\((docs/[a-z-]+\.md)", README.read_text()):
        assert (ROOT / link).is_file(), link
