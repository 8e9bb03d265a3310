"""The command line's help is cheap and complete: `autotune --help` (and each group's and
command's) imports none of the heavy machinery, and every option and argument says what it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("optuna", "sqlalchemy", "vllm", "torch")

_PROBE = """
import json, runpy, sys
sys.argv = ["autotune"] + sys.argv[1:]
try:
    runpy.run_module("autotune", run_name="__main__")
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "loaded": sorted(m for m in sys.modules if m.split(".")[0] in %r)}), file=sys.stderr)
""" % (HEAVY,)


def _help(*args: str) -> tuple[str, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=120)
    return p.stdout, json.loads(p.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [("--help",), ("study", "--help"), ("study", "start", "--help"),
                                  ("daemon", "run", "--help"), ("recommend", "show", "--help"),
                                  ("traffic", "--help"), ("--version",)])
def test_help_imports_no_optuna_sqlalchemy_vllm_or_torch(args):
    out, seen = _help(*args)
    assert seen["code"] == 0 and ("Usage:" in out or "autotune " in out), out
    assert seen["loaded"] == [], f"`autotune {' '.join(args)}` imported {seen['loaded']}"


def test_the_probe_sees_a_heavy_import():
    """The check itself can fail: a command that runs (``study list``) does import Optuna."""
    env = {**os.environ, "AUTOTUNE__STORAGE": "sqlite:///:memory:"}
    p = subprocess.run([sys.executable, "-c", _PROBE, "study", "list"], capture_output=True, text=True, cwd=ROOT,
                       env={**env, "PYTHONPATH": str(ROOT)}, timeout=120)
    seen = json.loads(p.stderr.strip().splitlines()[-1])
    assert "optuna" in seen["loaded"], p.stderr
