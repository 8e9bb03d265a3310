"""What a restart cleans up: orphaned server groups of a dead autotune process (and only those),
and trials left RUNNING by it (failed with the reason, retried once). Fake servers only; the
real-vLLM versions are in test_reliability_vllm.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import optuna

from autotune.engines._recovery import group_members, process_identity, reap_orphans
from autotune.search import _recovery
from autotune.search._recovery import recover_trials

HEALTHY = """\
import http.server, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a):
        pass
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # an engine-core-like child
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_server_of_a_killed_autotune_is_reaped(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(HEALTHY)
    pid_dir = tmp_path / "servers"
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from autotune.engines._engine import VllmServer, build_argv, free_port
        port = free_port()
        s = VllmServer(argv=build_argv([sys.executable, {str(script)!r}], "m", {{}}, None, port), port=port,
                       log_path=Path({str(tmp_path / 'server.log')!r}), pid_dir=Path({str(pid_dir)!r}),
                       start_timeout_s=30)
        s.start()
        print(s.proc.pid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    pgid = int(owner.stdout.readline())
    owner.kill()  # kill -9: no cleanup runs
    owner.wait()
    time.sleep(0.5)
    members = group_members(pgid)
    assert len(members) >= 2  # the orphan and its child survived their parent
    (pidfile,) = pid_dir.glob("*.json")
    assert json.loads(pidfile.read_text())["owner"]["pid"] == owner.pid
    reaped = reap_orphans(pid_dir)
    assert [r["pgid"] for r in reaped] == [pgid]
    assert group_members(pgid) == []
    assert list(pid_dir.glob("*.json")) == []


def test_a_live_owners_server_is_left_alone(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(HEALTHY)
    from autotune.engines._engine import VllmServer, build_argv, free_port

    port = free_port()
    s = VllmServer(argv=build_argv([sys.executable, str(script)], "m", {}, None, port), port=port,
                   log_path=tmp_path / "server.log", pid_dir=tmp_path / "servers", start_timeout_s=30)
    with s:
        assert reap_orphans(tmp_path / "servers") == []
        assert s.proc.poll() is None and len(list((tmp_path / "servers").glob("*.json"))) == 1
    assert list((tmp_path / "servers").glob("*.json")) == []  # a clean stop removes its pidfile


def test_a_recycled_pgid_is_not_killed(tmp_path):
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        pid_dir = tmp_path / "servers"
        pid_dir.mkdir()
        (pid_dir / f"{bystander.pid}.json").write_text(json.dumps({
            "pgid": bystander.pid, "port": 1, "token": "not-its-token",
            "owner": {"host": os.uname().nodename, "pid": _dead_pid(), "start": 1}}))
        assert reap_orphans(pid_dir) == []
        assert bystander.poll() is None  # not ours: alive
        assert list(pid_dir.glob("*.json")) == []
    finally:
        bystander.kill()
        bystander.wait()


def _study(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}", heartbeat_interval=60, grace_period=180)
    return optuna.create_study(storage=storage, study_name="autotune-code-x"), storage


def test_running_trial_of_a_dead_process_fails_with_reason_and_is_retried_once(tmp_path):
    study, storage = _study(tmp_path)
    study.enqueue_trial({"method": "ngram"}, user_attrs={"role": "search", "config_key": "k1", "claim_key": "k1"})
    dead = study.ask()
    dead.suggest_categorical("method", ["none", "ngram"])
    dead.set_user_attr("owner", {**process_identity(), "pid": _dead_pid()})
    dead.set_user_attr("measurement", {"partial": True})
    alive = study.ask()
    alive.set_user_attr("owner", process_identity())
    seen = []
    assert recover_trials(study, storage, on_failed=seen.append) == [dead.number]
    t = study.trials[dead.number]
    assert t.state.name == "FAIL" and t.user_attrs["interrupted"] is True
    assert t.user_attrs["error"].startswith("interrupted: its autotune process (pid ") and "died" in t.user_attrs["error"]
    assert [s.number for s in seen] == [dead.number]
    assert study.trials[alive.number].state.name == "RUNNING"
    (retry,) = [x for x in study.trials if x.state.name == "WAITING"]
    assert retry.params == {"method": "ngram"}
    assert retry.user_attrs == {"role": "search", "config_key": "k1", "claim_key": "k1", "retry_of": dead.number}
    assert optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(retry) == dead.number
    assert recover_trials(study, storage) == []  # idempotent


def test_retries_stop_after_two(tmp_path):
    study, storage = _study(tmp_path)
    failed = optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, params={},
                                       distributions={}, system_attrs={"retry_history": [0, 1]})
    study.add_trial(failed)
    _recovery.retry(study, study.trials[-1])
    assert [t.state.name for t in study.trials] == ["FAIL"]


def test_a_trial_on_another_host_that_stopped_its_heartbeat_is_failed_and_retried(tmp_path):
    """The stale-heartbeat check reads Optuna's RDBStorage internals (pinned range in pyproject.toml):
    this is the test that an Optuna upgrade must pass."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}", heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=storage, study_name="autotune-code-hb")
    study.enqueue_trial({"method": "ngram"}, user_attrs={"role": "search", "config_key": "k1", "claim_key": "k1"})
    t = study.ask()
    t.suggest_categorical("method", ["none", "ngram"])
    t.set_user_attr("owner", {"host": "another-host", "pid": 1, "start": 1})  # not ours to check by pid
    tid = _recovery.trial_id(study, storage, t.number)
    storage.record_heartbeat(tid)
    assert recover_trials(study, storage) == []  # beating: left alone
    time.sleep(2.5)  # the grace period passes without a heartbeat
    assert recover_trials(study, storage) == [t.number]
    failed = study.trials[t.number]
    assert failed.state.name == "FAIL"
    assert failed.user_attrs["error"] == ("interrupted: its autotune process (pid 1 on another-host) stopped sending "
                                          "heartbeats during the trial; retried")
    assert [x.user_attrs.get("retry_of") for x in study.trials if x.state.name == "WAITING"] == [t.number]
