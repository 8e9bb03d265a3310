"""Lint as a test: ruff with the rules of pyproject.toml ([tool.ruff.lint]) over the package, the
tests, the benchmarks and the tools. The rules are the ones that catch bugs and dead code (unused
or undefined names, mutable defaults, bad escapes), not a style."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATHS = ["autotune", "sql", "tests", "benchmarks", "tools"]


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_code_passes_ruff():
    r = ruff("check", "--no-cache", "--output-format", "concise", *PATHS)
    assert r.returncode == 0, f"ruff found problems (fix them, or `ruff check --fix`):\n{r.stdout}{r.stderr}"


def test_ruff_with_the_project_rules_catches_an_unused_import(tmp_path):
    """The check can fail: the project's rules report a module with an unused import and an
    undefined name."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f():\n    return undefined_name\n")
    r = ruff("check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), "--output-format", "concise", str(bad))
    assert r.returncode == 1
    assert "F401" in r.stdout and "F821" in r.stdout
