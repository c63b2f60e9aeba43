"""DESIGN.md's layering, enforced: import-linter contracts (.importlinter) run as a test."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), str(ROOT / ".importlinter")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 5 kept, 0 broken" in done.stdout


def lint_with_probe(tmp_path: Path, module: str, source: str) -> subprocess.CompletedProcess[str]:
    """Run the contracts on a copy of the packages with one extra module added."""
    import shutil

    for package in ("schemas", "agents", "streams", "perf", "cli"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    probe = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
    probe.write_text(f'"""A probe."""\n{source}\n')
    lint = Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # ahead of the editable install's finder
    return subprocess.run([str(lint), "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize(("module", "package"), [
    ("agents.probe", "faust"), ("agents.probe", "mode"), ("agents.state.probe", "aiokafka"),
    ("agents.scheduler.plugins.probe", "faust"), ("agents.state.probe", "faust")])
def test_a_new_agents_module_outside_the_adapters_may_not_import_kafka(tmp_path: Path, module: str,
                                                                      package: str) -> None:
    done = lint_with_probe(tmp_path, module, f"import {package}")
    assert done.returncode != 0, done.stdout
    assert "In agents, only agents.adapters imports faust, mode or aiokafka BROKEN" in done.stdout, done.stdout
    assert f"{module} -> {package}" in done.stdout, done.stdout


def test_the_cores_may_not_import_their_adapters(tmp_path: Path) -> None:
    done = lint_with_probe(tmp_path, "agents.state.probe", "import agents.adapters.loop")
    assert done.returncode != 0, done.stdout
    assert "agents.adapters is wired by streams only" in done.stdout and "BROKEN" in done.stdout, done.stdout


def test_an_adapter_may_import_faust(tmp_path: Path) -> None:
    done = lint_with_probe(tmp_path, "agents.adapters.probe", "import faust\nimport aiokafka")
    assert done.returncode == 0, done.stdout


def test_every_module_has_a_docstring() -> None:
    import ast

    missing = []
    for package in ("schemas", "agents", "streams", "perf", "cli"):
        for path in (ROOT / package).rglob("*.py"):
            if not ast.get_docstring(ast.parse(path.read_text())):
                missing.append(str(path.relative_to(ROOT)))
    assert missing == []


def test_ruff_clean() -> None:
    done = subprocess.run([str(Path(sys.executable).parent / "ruff"), "check", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout


def test_mypy_clean() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "schemas", "agents", "streams", "perf", "cli"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout


def test_the_sandbox_core_is_pure(tmp_path: Path) -> None:
    """agents.sandbox is among the pure cores: no streams (nor Kafka or Kubernetes clients)."""
    done = lint_with_probe(tmp_path, "agents.sandbox.probe", "import streams.settings")
    assert done.returncode != 0, done.stdout
    assert "The decision core imports no Kafka, faust or Kubernetes client BROKEN" in done.stdout, done.stdout
    assert "agents.sandbox.probe -> streams" in done.stdout, done.stdout
