"""DESIGN.md's layering, enforced: import-linter contracts (.importlinter) run as a test."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), str(ROOT / ".importlinter")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 3 kept, 0 broken" in done.stdout


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
