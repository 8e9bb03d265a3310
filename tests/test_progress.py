"""Progress bars go to a terminal's stderr only: never to stdout, never when stderr is not a
terminal (cron, pipes, JSON consumers), never with --quiet."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from click.testing import CliRunner

from _traffic_logs import gateway_lines, write_gz
from test_cli_json import synthetic_workload
from autotune.cli._main import main
from autotune.core import _progress


@pytest.fixture
def tty(monkeypatch):
    monkeypatch.setattr(_progress, "stderr_is_tty", lambda: True)


def test_a_bar_only_on_a_terminal_and_not_when_quiet(monkeypatch, capsys):
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with _progress.Progress(3, desc="grid", unit="start") as bar:  # stderr is no terminal
        bar.echo("a line")
        bar.set(1)
    assert not bar.shown and err.getvalue() == "" and capsys.readouterr().out == "a line\n"
    monkeypatch.setattr(_progress, "stderr_is_tty", lambda: True)
    with _progress.Progress(3, desc="grid", unit="start", quiet=True) as bar:
        bar.set(2)
    assert not bar.shown and err.getvalue() == ""
    with _progress.Progress(3, desc="grid", unit="start") as bar:
        bar.echo("another line")
        bar.set(2, postfix="round 1")
    assert "grid" in err.getvalue() and "2/3" in err.getvalue() and "round 1" in err.getvalue()
    assert capsys.readouterr().out == "another line\n"


def test_traffic_import_draws_its_bar_on_stderr(tmp_path, monkeypatch, tty):
    monkeypatch.setenv("AUTOTUNE__STUDIES_DIR", str(tmp_path / "none"))
    lines, _ = gateway_lines()
    log = write_gz(tmp_path / "gw.jsonl.gz", lines)
    r = CliRunner().invoke(main, ["traffic", "import", "--home", str(tmp_path / "h"), str(log)])
    assert r.exit_code == 0, r.output
    assert "traffic import" in r.stderr and "1/1" in r.stderr and "lines" in r.stderr
    assert "traffic import" not in r.stdout and f"{log}: 12 lines" in r.stdout
    q = CliRunner().invoke(main, ["traffic", "import", "-q", "--home", str(tmp_path / "h2"), str(log)])
    assert q.exit_code == 0 and q.stderr == "" and q.stdout == r.stdout.replace(str(tmp_path / "h"),
                                                                              str(tmp_path / "h2"))


def _study_start(d: Path, monkeypatch, *extra):
    synthetic_workload(monkeypatch, d)
    return CliRunner().invoke(main, ["study", "start", "--workload", "syn", *extra])


def test_a_study_shows_its_server_starts_against_the_budget(tmp_path, monkeypatch, tty):
    r = _study_start(tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    assert "syn: server starts" in r.stderr and "/10" in r.stderr and "best" in r.stderr
    assert "server starts:" not in r.stdout
    assert r.stdout.splitlines()[-1].startswith("wrote ") and "trial   0 baseline" in r.stdout


def test_a_quiet_study_draws_no_bar(tmp_path, monkeypatch, tty):
    r = _study_start(tmp_path, monkeypatch, "--quiet")
    assert r.exit_code == 0, r.output
    assert "server starts:" not in r.stderr and "trial   0 baseline" in r.stdout
