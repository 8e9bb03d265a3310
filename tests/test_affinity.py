"""CPU placement of server and client: the settings' parsing and checks, a pinned server's whole
process group, and a study refusing a bad placement before it writes anything."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.engines._affinity import format_cpulist, parse_cpulist, placement

from test_cli import _run, env  # noqa: F401  (the CLI fixture)
from test_engine import HEALTHY, _script, _server

ALLOWED = sorted(os.sched_getaffinity(0))


def test_parse_and_format_cpulist_round_trip():
    assert parse_cpulist("0-3,8, 10-11", "X") == {0, 1, 2, 3, 8, 10, 11}
    assert format_cpulist({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert format_cpulist(parse_cpulist("5", "X")) == "5"
    for bad, why in (("0-x", "'0-x' is not a CPU list"), ("", "is not a CPU list"), ("4-2", "runs backwards"),
                     ("0-4294967295", "CPU 4294967295 is beyond any CPU id Linux names (0-8191)")):
        with pytest.raises(ValueError) as ei:
            parse_cpulist(bad, "AUTOTUNE__SERVER_CPUS")
        assert ei.value.args[0].startswith("AUTOTUNE__SERVER_CPUS: ") and why in ei.value.args[0]


def test_placement_rejects_unavailable_and_shared_cpus():
    assert placement(None, None) == (None, None)
    with pytest.raises(ValueError, match=r"AUTOTUNE__CLIENT_CPUS: CPUs 4096 are not available to this process"):
        placement(None, "4096")
    first = str(ALLOWED[0])
    with pytest.raises(ValueError, match=rf"share CPUs {first}$"):
        placement(first, first)
    assert placement(first, None) == (frozenset({ALLOWED[0]}), None)


def _allowed(pid: int) -> set[int]:
    return os.sched_getaffinity(pid)


def test_pinned_server_and_its_workers_run_on_the_given_cpus(tmp_path):
    script = _script(tmp_path, "healthy.py", HEALTHY)
    one = frozenset({ALLOWED[-1]})
    with _server(tmp_path, script, start_timeout_s=20, stop_timeout_s=1, cpus=one) as server:
        child = int(Path(str(script) + ".child").read_text())
        assert _allowed(server.proc.pid) == one
        assert _allowed(child) == one  # the worker it spawned inherits the placement
    assert _allowed(0) == set(ALLOWED)  # the caller itself is untouched
    (tmp_path / "free").mkdir()
    free = _script(tmp_path / "free", "healthy.py", HEALTHY)
    with _server(tmp_path / "free", free, start_timeout_s=20, stop_timeout_s=1) as server:
        assert _allowed(server.proc.pid) == set(ALLOWED)  # unpinned: wherever the OS may put it


def test_study_refuses_a_bad_placement_before_writing(env, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("AUTOTUNE__SERVER_CPUS", "0-")
    r = _run("study", "start", "--workload", "code")
    assert r.exit_code == 2
    assert "AUTOTUNE__SERVER_CPUS: '0-' is not a CPU list" in r.output
    assert not (tmp_path / "home").exists()  # before the probe, any server or any write
