"""The runner's pipeline returns a ``RunResult`` the command line renders, and every failure it
foresees gets its exit code from the one table in ``autotune.ops._exit``."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from _synthetic import Workload
from test_search_study import RATES, fake_measure, make_spec
from autotune.core import _exit
from autotune.core._lock import LockDirError, LockHeld
from autotune.core._settings import Settings
from autotune.core._spec import SpecError, load_spec
from autotune.core._store import Store, StoreError
from autotune.engines import _probe
from autotune.engines._probe import Capabilities, ProbeError
from autotune.ops import _runner
from autotune.ops._exit import exit_code
from autotune.search import _study
from autotune.search._trial import TrialFailed
from autotune.traffic._replayset import ReplaySetError
from autotune.trust._gate import FidelityFailed

CAPS = Capabilities(version="0.32.0", methods=["ngram"], fields=["method", "num_speculative_tokens",
                    "prompt_lookup_min", "prompt_lookup_max"], arctic_inference=False)


@pytest.mark.parametrize("exc,code", [
    (KeyboardInterrupt(), 130), (LockHeld(Path("gpu-0.lock"), {}), 75),
    (LockDirError(errno.EPERM, "unsafe lock folder"), 2), (FidelityFailed({"off": []}), 5),
    (StoreError("down"), 3), (ProbeError("no vllm"), 3), (TrialFailed("baseline failed"), 3),
    (SpecError("bad spec"), 2), (ReplaySetError("bad line"), 2), (ValueError("bad setting"), 2),
    (OSError(errno.ENOSPC, "No space left on device", "rec/code.json"), 4),
])
def test_each_foreseen_failure_has_its_documented_code(exc, code):
    assert exit_code(exc) == code


def test_an_unforeseen_failure_is_70_unless_a_dependency_setting_or_write_explains_it():
    assert exit_code(ValueError("a bug"), foreseen=False) == _exit.EXIT_SOFTWARE == 70
    assert exit_code(RuntimeError("a bug"), foreseen=False) == 70
    assert exit_code(ImportError("no module named psycopg"), foreseen=False) == 3
    assert exit_code(OSError(errno.EROFS, "Read-only file system", "/x"), foreseen=False) == 4
    assert exit_code(OSError(errno.ENOENT, "No such file", "/x"), foreseen=False) == 70
    try:
        Settings(metrics_port="abc")
    except ValidationError as e:
        assert exit_code(e, foreseen=False) == 2
    else:
        raise AssertionError("a bad setting was accepted")


def test_a_finished_run_returns_its_decision_path_and_counts(tmp_path, monkeypatch):
    monkeypatch.setattr(_probe, "probe", lambda *a, **k: CAPS)
    for k in ("AUTOTUNE__STORAGE", "AUTOTUNE__RECOMMENDATIONS_DIR", "AUTOTUNE__STUDIES_DIR"):
        monkeypatch.delenv(k, raising=False)
    make_spec(tmp_path, budget={"max_trials": 8, "max_server_starts": 10, "max_wall_minutes": 10})
    monkeypatch.setenv("AUTOTUNE__HOME", str(tmp_path / "home"))
    monkeypatch.setattr(_study, "measure", fake_measure(Workload(rates=RATES)))
    live: list[str] = []
    res = _runner.execute(_runner.RunRequest(workload="syn", spec_path=str(tmp_path / "syn.yaml")),
                          settings=Settings(), echo=lambda msg, err=False: live.append(msg))
    assert res.exit_code == 0 and res.outcome == "ok", res.messages
    rec = json.loads(Path(res.recommendation).read_text())
    assert res.decision == rec["decision"] and res.study == rec["study"]["name"]
    assert res.server_starts == rec["study"]["server_starts"] and res.trials >= res.server_starts
    assert res.messages[-1] == (f"wrote {res.recommendation}", False)
    assert any(m.startswith("decision: ") for m, _ in res.messages)
    assert not any(m.startswith("decision: ") for m in live)  # the closing lines are the caller's to say
    spec = load_spec(tmp_path / "syn.yaml")
    row = Store(_runner.storage_for(spec, None, Settings())).last_run("syn", outcome="ok")
    assert row["exit_code"] == 0 and row["decision"] == res.decision


def test_a_bad_spec_is_a_result_with_its_error_line_and_exit_2(tmp_path):
    bad = tmp_path / "syn.yaml"
    bad.write_text("workload: syn\nmodel: [\n")
    res = _runner.execute(_runner.RunRequest(workload="syn", spec_path=str(bad)), settings=Settings(),
                          echo=lambda *a, **k: None)
    assert res.exit_code == 2 and res.outcome == "failed" and res.decision is None
    assert len(res.messages) == 1 and res.messages[0][1] is True
    assert res.messages[0][0].startswith("error: ") and str(bad) in res.messages[0][0]
