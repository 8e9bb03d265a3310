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


def _commands(group, path=("autotune",)):
    import click

    yield path, group
    if isinstance(group, click.Group):
        for name, cmd in sorted(group.commands.items()):
            yield from _commands(cmd, path + (name,))


def test_every_command_option_and_argument_says_what_it_is():
    """Options carry ``help``; click arguments have none, so the command's help names each
    (``WORKLOAD``, ``PATHS...``) in words; every command has a help text."""
    import click

    from autotune.cli._main import main

    missing = []
    for path, cmd in _commands(main):
        where = " ".join(path)
        text = cmd.help or ""
        if not text.strip():
            missing.append(f"{where}: no help text")
        for p in cmd.params:
            if isinstance(p, click.Option):
                if not (p.help or "").strip() and not p.hidden:
                    missing.append(f"{where} {p.opts[0]}: no help")
            elif isinstance(p, click.Argument):
                if p.human_readable_name not in text:
                    missing.append(f"{where} {p.human_readable_name}: not named in the command's help")
    assert not missing, "\n".join(missing)


def test_the_walk_sees_an_option_without_help():
    import click

    @click.group()
    def g():
        """A group."""

    @g.command()
    @click.option("--bare")
    @click.argument("thing")
    def c(bare, thing):
        """Does something."""

    found = [(p.opts[0] if isinstance(p, click.Option) else p.human_readable_name)
             for _, cmd in _commands(g) for p in cmd.params
             if (isinstance(p, click.Option) and not p.help)
             or (isinstance(p, click.Argument) and p.human_readable_name not in (cmd.help or ""))]
    assert found == ["--bare", "THING"]
