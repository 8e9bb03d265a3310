"""Faults in the middle of a study, in a process of its own (``_standin_study.py``: a stand-in
engine, real SQLite and PostgreSQL): the database unusable after trial 0, the process killed -9 mid-trial. Each
ends as documented (exit code, message, the runs table) and the rerun resumes without losing a
finished trial or a start of the budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from _standin_study import reopen_database
from test_search_study import make_spec

from autotune.core._spec import StudySpec
from autotune.core._store import Store, safe_url

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _autotune(d: Path, *args: str, fault: str = "", wait: bool = True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE__")}
    env.update(AUTOTUNE__HOME=str(d / "home"), AUTOTUNE__LOCK_DIR=str(d / "locks"), AUTOTUNE_STANDIN_FAULT=fault,
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, str(HERE / "_standin_study.py"), *args]
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _start(d: Path, fault: str = "", **kw):
    return _autotune(d, "study", "start", "--workload", "syn", "--spec", str(d / "syn.yaml"), fault=fault, **kw)


def _runs(spec) -> list[dict]:
    return Store(spec.storage).query("SELECT outcome, exit_code, error FROM autotune_runs")


def _trials(spec) -> list:
    (summary,) = optuna.get_all_study_summaries(spec.storage)
    return optuna.load_study(study_name=summary.study_name, storage=spec.storage).get_trials(deepcopy=False)


@pytest.fixture(params=["sqlite", "postgresql"])
def storage(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'study.db'}"
    return request.getfixturevalue("pg_url")


def _spec_on(tmp_path: Path, storage: str, budget: dict):
    """``make_spec``'s study, its storage ``storage``."""
    make_spec(tmp_path, budget=budget)
    data = yaml.safe_load((tmp_path / "syn.yaml").read_text())
    data["storage"] = storage
    (tmp_path / "syn.yaml").write_text(yaml.safe_dump(data))
    return StudySpec.model_validate(data)


def test_a_database_unusable_after_trial_0_exits_3_naming_it_and_the_rerun_resumes(tmp_path, storage):
    """SQLite corrupted, or PostgreSQL refusing connections and ending the sessions, after trial 0:
    exit 70 before (Optuna's AssertionError or UnboundLocalError), the run left ``running``."""
    spec = _spec_on(tmp_path, storage, {"max_trials": 8, "max_server_starts": 10, "max_wall_minutes": 10})
    r = _start(tmp_path, fault="break-db-at:1")
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"error: database {safe_url(storage)} became unusable mid-study (" in r.stderr
    assert "); the server is stopped, the finished trials are kept in it; rerun to resume once it is usable" in r.stderr
    assert "could not be recorded as failed" in r.stdout and "the next run on this host records it" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr
    assert not (tmp_path / "rec" / "syn.json").exists()

    reopen_database(storage)  # the database is back (SQLite: as it was at the fault)
    baseline = _trials(spec)[0]
    assert (baseline.state.name, baseline.user_attrs["role"]) == ("COMPLETE", "baseline")
    r = _start(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "rec" / "syn.json").exists()
    runs = _runs(spec)
    assert sorted(x["outcome"] for x in runs) == ["interrupted", "ok"], runs  # nothing left running
    kept = _trials(spec)[0]
    assert kept.datetime_complete == baseline.datetime_complete and kept.values == baseline.values
    assert sum(1 for t in _trials(spec) if t.user_attrs.get("role") == "baseline") == 1  # not measured twice


def _lost(msg: str):
    import sqlalchemy.exc

    return sqlalchemy.exc.OperationalError("UPDATE ...", {}, Exception(msg))


def _in_process(tmp_path, monkeypatch, lose_connection_at: int):
    """The study in this process, its database connection lost once at the end of start
    ``lose_connection_at`` (a PostgreSQL restart). Returns (run, spec, servers stopped)."""
    from _standin_study import CAPS
    from _synthetic import Workload
    from test_search_study import RATES, fake_measure

    from autotune.core._settings import Settings
    from autotune.engines import _probe
    from autotune.ops import _runner
    from autotune.search import _study

    monkeypatch.setattr(_probe, "probe", lambda *a, **k: CAPS)
    for k in ("AUTOTUNE__STORAGE", "AUTOTUNE__RECOMMENDATIONS_DIR", "AUTOTUNE__STUDIES_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AUTOTUNE__HOME", str(tmp_path / "home"))
    spec = make_spec(tmp_path, budget={"max_trials": 8, "max_server_starts": 10, "max_wall_minutes": 10})
    inner = fake_measure(Workload(rates=RATES))
    storage = optuna.storages.RDBStorage
    real = storage.set_trial_state_values
    stopped = []

    class Server:  # what the study knows of the running server: the runner stops it
        def stop(self):
            stopped.append(True)

    def lost(self, *a, **kw):
        monkeypatch.setattr(storage, "set_trial_state_values", real)
        raise optuna.exceptions.StorageInternalError("commit failed") from _lost(
            "server closed the connection unexpectedly")

    def measure(*a, **kw):
        if len(inner.calls) == lose_connection_at:
            kw["on_server"](Server())
            monkeypatch.setattr(storage, "set_trial_state_values", lost)
        return inner(*a, **kw)

    monkeypatch.setattr(_study, "measure", measure)

    def run():
        said: list[str] = []
        code = _runner.run(_runner.RunRequest(workload="syn", spec_path=str(tmp_path / "syn.yaml")),
                           settings=Settings(), echo=lambda msg, err=False: said.append(msg))
        return code, said
    return run, spec, stopped


def test_a_run_whose_database_comes_back_is_recorded_failed(tmp_path, monkeypatch):
    """When the database takes the record again by the time the run ends (a PostgreSQL restart),
    the run is ``failed`` with exit 3 at once, not left ``running`` for the next run to find."""
    run, spec, stopped = _in_process(tmp_path, monkeypatch, lose_connection_at=1)
    code, said = run()
    assert code == 3, said
    assert "server closed the connection unexpectedly" in said[-1] and said[-1].startswith("error: database ")
    assert stopped
    (row,) = _runs(spec)
    assert (row["outcome"], row["exit_code"]) == ("failed", 3) and "became unusable mid-study" in row["error"]


def test_a_failure_the_database_refused_is_recorded_by_the_next_run_of_the_process(tmp_path, monkeypatch):
    """A daemon outlives its runs: the run whose failure the database refused is recorded
    ``failed`` by the daemon's next run, not left ``running`` while the daemon lives."""
    from autotune.core._store import Store as S

    run, spec, _ = _in_process(tmp_path, monkeypatch, lose_connection_at=1)
    real_finish, down = S.finish_run, [True]

    def finish_refused(self, *a, **kw):
        if down:
            raise _lost("the database system is shutting down")
        return real_finish(self, *a, **kw)

    monkeypatch.setattr(S, "finish_run", finish_refused)
    code, said = run()
    down.clear()  # the database is back before the daemon's next run
    assert code == 3, said
    assert any("the run could not be recorded as failed in sqlite:///" in line and "the database system is shutting "
               "down): the next run on this host records it" in line for line in said), said
    assert [x["outcome"] for x in _runs(spec)] == ["running"]
    code, said = run()
    assert code == 0, said
    assert sorted((x["outcome"], x["exit_code"]) for x in _runs(spec)) == [("failed", 3), ("ok", 0)]
    # the trial the lost connection left RUNNING is this live process's: failed and retried at once
    # (not waited for until its heartbeat went stale)
    lost = _trials(spec)[1]
    assert lost.state.name == "FAIL" and lost.user_attrs["error"].startswith(
        f"interrupted: its run in this process (pid {os.getpid()} on ")
    (retry,) = [t for t in _trials(spec) if t.user_attrs.get("retry_of") == 1]
    assert retry.state.name == "COMPLETE"


def test_a_study_killed_mid_trial_spends_its_whole_budget_on_the_rerun(tmp_path):
    """kill -9 in the middle of the first search start, under a budget of 6 starts: the dead start
    does not count (docs/reliability.md), so its retry runs and the rerun spends the other starts
    on the search and the confirmation. Before, the dead start counted, the confirmation's reserve
    then blocked the retry (left WAITING) and the rerun made 2 starts: "no speculative
    configuration completed", 4 starts unused."""
    spec = make_spec(tmp_path, budget={"max_trials": 12, "max_server_starts": 6, "max_wall_minutes": 10})
    proc = _start(tmp_path, fault="hang-at:1", wait=False)
    hung = tmp_path / "home" / "hung"
    deadline = time.monotonic() + 120
    while not hung.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.kill()  # SIGKILL, mid-trial: nothing is cleaned up
    proc.communicate()
    assert [(t.number, t.state.name) for t in _trials(spec)] == [(0, "COMPLETE"), (1, "RUNNING")]

    r = _start(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    ts = _trials(spec)
    assert ts[1].state.name == "FAIL" and ts[1].user_attrs["error"].startswith("interrupted: its autotune process")
    (retry,) = [t for t in ts if t.user_attrs.get("retry_of") == 1]
    assert retry.state.name == "COMPLETE" and retry.user_attrs["config_key"] == ts[1].user_attrs["config_key"]
    starts = (tmp_path / "home" / "starts.jsonl").read_text().splitlines()
    assert len(starts) == 1 + 5  # the baseline before the kill; the retry, then search and confirmation
    rec = json.loads((tmp_path / "rec" / "syn.json").read_text())
    assert (rec["study"]["server_starts"], rec["study"]["interrupted_starts"]) == (7, 1)  # 6 counted: the budget
    assert rec["evidence"]["winner"]["config"]["method"] == "ngram", rec["reason"]
    assert "no speculative configuration completed" not in rec["reason"]
    assert sorted(x["outcome"] for x in _runs(spec)) == ["interrupted", "ok"]
    assert "7 server starts (1 whose process died, not counted against the budget)" in r.stdout


def test_only_the_first_dead_start_of_a_configuration_goes_uncounted():
    """A configuration whose start dies again may be what kills the process (the OOM killer): from
    its second death on, its starts count, so a crash loop ends with the budget."""
    from optuna.trial import TrialState, create_trial

    from autotune.search._budget import uncounted

    study = optuna.create_study()
    died = {"error": "interrupted: its autotune process (pid 1 on h) died during the trial; retried",
            "interrupted": True, "process_died": True}
    for key, attrs in (("none", {}), ("a", died), ("a", died), ("b", died), ("b", {"interrupted_by": "SIGTERM"}),
                       ("b", {"interrupted_by": "SIGINT"}), ("c", {})):
        study.add_trial(create_trial(state=TrialState.FAIL if attrs else TrialState.COMPLETE,
                                     value=None if attrs else 1.0,
                                     user_attrs={"config_key": key, "server_starts": 1, **attrs}))
    assert [t.number for t in uncounted(study.get_trials())] == [1, 3, 4, 5]
