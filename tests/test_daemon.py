"""The daemon's scheduling (cron, coalescing, misfire grace, catch-up), its lock (a second daemon
on the GPU exits 75), its clean stop on SIGTERM, and the Prometheus exporter scraped over HTTP.
Fake engine: runs fail fast at the (fake) baseline; real-vLLM runs are in test_reliability_vllm.py."""

from __future__ import annotations

import datetime as dt
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from autotune.ops import _exporter
from autotune.decide import _history
from autotune.ops._daemon import Daemon, Pending
from autotune.core._schedule import parse_cron, parse_duration, previous_fire
from autotune.core._settings import Settings
from autotune.core._store import Store

from test_preflight import setup  # noqa: F401,E402  (fixture: a spec on a fake engine)

ROOT = Path(__file__).resolve().parent.parent


def test_cron_and_durations():
    t = parse_cron("30 2 * * *", "Europe/Paris")
    at = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.timezone.utc)
    assert previous_fire(t, at) == dt.datetime(2026, 11, 29, 1, 30, tzinfo=dt.timezone.utc)
    assert previous_fire(parse_cron("0 2 1 1 *"), at) is None  # not within the look-back
    for bad in ("0 2 * *", "61 * * * *", "* * * * mon-xyz"):
        with pytest.raises(ValueError, match="cron"):
            parse_cron(bad)
    assert parse_duration("20h") == 72000 and parse_duration("90m") == 5400 and parse_duration("1d") == 86400
    assert parse_duration("45") == 45
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration("20 hours")


def test_pending_coalesces_repeated_triggers():
    p = Pending()
    assert p.add("code") and not p.add("code") and p.add("chat")
    assert p.pop(0.1) == "code"
    assert not p.add("code")  # still running: coalesced
    p.done()
    assert p.pop(0.1) == "chat" and p.pop(0.05) is None


def _daemon_spec(setup, cron="0 3 * * *", grace=360, timezone="UTC"):
    setup["data"]["schedule"] = {"cron": cron, "misfire_grace_minutes": grace, "timezone": timezone}
    setup["data"]["space"]["methods"] = ["ngram"]
    studies = setup["dir"] / "studies"
    studies.mkdir(exist_ok=True)
    text = yaml.safe_dump(setup["data"], sort_keys=False)
    (studies / "code.yaml").write_text(text.replace("./", "../"))
    return studies


def test_catch_up_runs_a_missed_night_within_the_grace(setup):
    studies = _daemon_spec(setup, cron="* * * * *", grace=10)
    settings = Settings(studies_dir=str(studies), home=str(setup["dir"] / "home"))
    d = Daemon(settings)
    d.load_specs()
    d.catch_up()
    assert d.pending.snapshot() == ["code"]  # fired within the last minute, never ran
    store = Store(f"sqlite:///{setup['dir'] / 'db.sqlite'}")
    store.finish_run(store.start_run("code", "daemon", "0"), "ok", 0)
    d = Daemon(settings)
    d.load_specs()
    d.catch_up()
    assert d.pending.snapshot() == []  # ran since the last fire time
    d = Daemon(settings.model_copy(), run_now=True)
    d.load_specs()
    d.catch_up()
    assert d.pending.snapshot() == ["code"]


def test_catch_up_on_the_fall_back_morning_comes_back_and_queues_the_night_once(setup, monkeypatch):
    """01:30 New York happens twice on 2026-11-01: the night ran at the first; the catch-up at
    01:45 EST sees it (not a loop, not a second night) and the log names the zone."""
    studies = _daemon_spec(setup, cron="30 1 * * *", grace=360, timezone="America/New_York")
    settings = Settings(studies_dir=str(studies), home=str(setup["dir"] / "home"))
    said: list[str] = []
    monkeypatch.setattr("autotune.ops._daemon.now", lambda: dt.datetime(2026, 11, 1, 6, 45, tzinfo=dt.timezone.utc))
    d = Daemon(settings, echo=lambda msg, err=False: said.append(msg))
    d.load_specs()
    t0 = time.process_time()
    d.catch_up()
    assert time.process_time() - t0 < 5
    assert d.pending.snapshot() == ["code"]
    assert any("the run due at 2026-11-01 01:30 EDT (-0400) was missed" in m for m in said), said
    monkeypatch.setattr("autotune.ops._daemon.last_success", lambda *a: "2026-11-01T05:40:00Z")  # ran at 01:40 EDT
    d = Daemon(settings, echo=lambda msg, err=False: said.append(msg))
    d.load_specs()
    d.catch_up()
    assert d.pending.snapshot() == []  # the repeated 01:30 EST is the same night, not another


def _metrics(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False, timeout=10).text


def test_daemon_runs_stops_on_sigterm_and_a_second_daemon_exits(setup):
    studies = _daemon_spec(setup)
    env = {**setup["env"], "AUTOTUNE__STUDIES_DIR": str(studies), "AUTOTUNE__METRICS_PORT": "0"}
    d1 = subprocess.Popen([sys.executable, "-m", "autotune", "daemon", "run", "--now"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    watchdog = threading.Timer(240, d1.kill)  # never hang the suite on a stuck daemon
    watchdog.start()
    try:
        for line in d1.stdout:
            lines.append(line)
            if "run ended with exit code" in line:
                break
        out = "".join(lines)
        assert "scheduled code: 0 3 * * * (UTC)" in out
        assert "[code] error: the no-speculation baseline failed" in out  # the fake engine
        port = int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", out).group(1))
        m = _metrics(port)
        assert "autotune_daemon_up 1.0" in m
        assert re.search(r'autotune_next_run_timestamp_seconds\{workload="code"\} \d', m)
        assert 'autotune_last_run_success{workload="code"} 0.0' in m
        assert 'autotune_run_failures_total{workload="code"} 1.0' in m
        assert 'autotune_daemon_last_exit_code{workload="code"} 3.0' in m

        d2 = subprocess.run([sys.executable, "-m", "autotune", "daemon", "run"], capture_output=True, text=True,
                            env=env, timeout=60)
        assert d2.returncode == 75
        assert f"another daemon already runs on GPU 7 (pid {d1.pid}" in d2.stderr + d2.stdout

        t0 = time.monotonic()
        d1.send_signal(signal.SIGTERM)
        rest, _ = d1.communicate(timeout=60)
        assert d1.returncode == 0 and time.monotonic() - t0 < 30  # at once, not at the next scheduled run
        assert "stopping (SIGTERM)" in rest
    finally:
        watchdog.cancel()
        if d1.poll() is None:
            d1.kill()


def test_daemon_with_an_invalid_spec_exits_2(setup):
    studies = _daemon_spec(setup)
    (studies / "bad.yaml").write_text("workload: bad\nmodel: m\n")
    r = subprocess.run([sys.executable, "-m", "autotune", "daemon", "run", "--no-metrics"], capture_output=True,
                       text=True, env={**setup["env"], "AUTOTUNE__STUDIES_DIR": str(studies)}, timeout=60)
    assert r.returncode == 2 and "bad.yaml" in r.stdout + r.stderr and "field 'replay'" in r.stdout + r.stderr


def test_exporter_serves_last_run_recommendation_and_counters(tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    store = Store(url)
    rid = store.start_run("code", "daemon", "0")
    store.upsert_trial({"study_name": "s", "trial_number": 0, "workload": "code", "state": "COMPLETE", "server_starts": 1})
    store.upsert_trial({"study_name": "s", "trial_number": 1, "workload": "code", "state": "FAIL", "server_starts": 1,
                        "error": "vllm serve died during the replay (killed by SIGKILL)"})
    store.finish_run(rid, "ok", 0, decision="change", trials=2, server_starts=2, failed_trials=1)
    _history.write({"workload": "code", "decision": "change", "reason": "r", "created_at": "2026-11-29T02:00:00+00:00",
                    "speculative_config": {"method": "ngram", "num_speculative_tokens": 4},
                    "evidence": {"speedup": 2.4, "speedup_ci": [2.1, 2.7]},
                    "drift": {"incumbent_acceptance_rate": 0.35, "drifted": True}}, tmp_path / "recs", store)
    running = store.start_run("chat", "cron", "0")
    srv, _ = _exporter.serve([url, f"sqlite:///{tmp_path / 'missing' / 'x' / 'no.db'}"], port=0)
    try:
        assert srv.server_address[0] == "127.0.0.1"  # loopback by default
        m = _metrics(srv.server_port)
    finally:
        srv.shutdown()
    expect = ['autotune_last_run_success{workload="code"} 1.0',
              'autotune_last_run_outcome{outcome="ok",workload="code"} 1.0',
              'autotune_recommendation_info{decision="change",k="4",method="ngram",workload="code"} 1.0',
              'autotune_recommended_k{workload="code"} 4.0',
              'autotune_measured_speedup{workload="code"} 2.4',
              'autotune_measured_speedup_ci_low{workload="code"} 2.1',
              'autotune_incumbent_acceptance_rate{workload="code"} 0.35',
              'autotune_drift{workload="code"} 1.0',
              'autotune_last_run_trials{workload="code"} 2.0',
              'autotune_last_run_server_starts{workload="code"} 2.0',
              'autotune_last_run_failed_trials{workload="code"} 1.0',
              'autotune_running{workload="chat"} 1.0',
              'autotune_server_starts_total{workload="code"} 2.0',
              'autotune_trial_failures_total{workload="code"} 1.0',
              'autotune_trials_total{state="FAIL",workload="code"} 1.0',
              'autotune_runs_total{outcome="ok",workload="code"} 1.0',
              f'autotune_store_up{{storage="{url}"}} 1.0']
    for line in expect:
        assert line in m, line
    assert re.search(r'autotune_last_run_timestamp_seconds\{workload="code"\} 1\.\d+e\+09', m)
    assert 'autotune_store_up{storage="sqlite:///' in m and "no.db\"} 0.0" in m  # an unreadable one says so
    assert running


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_exporter_exits_130_on_sigint_and_0_on_sigterm(tmp_path, sig, code):
    """The README's table: Ctrl-C is 130 in every command; SIGTERM is the service's clean stop."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("AUTOTUNE__")}
    env.update(AUTOTUNE__HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-m", "autotune", "exporter", "--port", "0", "--storage",
                          f"sqlite:///{tmp_path / 'a.db'}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    try:
        assert "metrics on http://" in p.stdout.readline()
        time.sleep(1)  # serving: the signal lands while it waits, as an operator's Ctrl-C does
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        assert p.returncode == code
        assert ("error: interrupted" in err) == (code == 130)
    finally:
        if p.poll() is None:
            p.kill()


def test_daemon_exits_130_on_ctrl_c(setup):
    """SIGTERM is the service's stop (exit 0, tested above); Ctrl-C is 130, as in every command."""
    studies = _daemon_spec(setup, cron="0 3 1 1 *", grace=1)  # nothing to catch up
    env = {**setup["env"], "AUTOTUNE__STUDIES_DIR": str(studies)}
    d = subprocess.Popen([sys.executable, "-m", "autotune", "daemon", "run", "--no-metrics"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=env)
    try:
        for line in d.stdout:
            if "daemon up" in line:
                break
        d.send_signal(signal.SIGINT)
        rest, _ = d.communicate(timeout=60)
        assert d.returncode == 130, rest
        assert "stopping (SIGINT)" in rest
    finally:
        if d.poll() is None:
            d.kill()
