"""`study start --pause-after-starts N`: a study run in slices of N server starts makes the same
starts, in the same order, and reaches the same decision as one uninterrupted run; a paused run
writes nothing and is recorded as paused (the GPU window that ends before the study does)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from _synthetic import Workload
from test_search_study import RATES, fake_measure, make_spec
from autotune.core._settings import Settings
from autotune.core._store import Store
from autotune.engines import _probe
from autotune.engines._probe import Capabilities
from autotune.ops import _runner
from autotune.search import _budget, _study
from autotune.search._budget import Pause
from autotune.search._space import SearchSpace, canonical

CAPS = Capabilities(version="0.32.0", methods=["ngram"], fields=["method", "num_speculative_tokens",
                    "prompt_lookup_min", "prompt_lookup_max"], arctic_inference=False)


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setattr(_probe, "probe", lambda *a, **k: CAPS)
    for k in ("AUTOTUNE__STORAGE", "AUTOTUNE__RECOMMENDATIONS_DIR", "AUTOTUNE__STUDIES_DIR"):
        monkeypatch.delenv(k, raising=False)

    def setup(d):
        spec = make_spec(d, budget={"max_trials": 8, "max_server_starts": 10, "max_wall_minutes": 10})
        monkeypatch.setenv("AUTOTUNE__HOME", str(d / "home"))
        fm = fake_measure(Workload(rates=RATES))
        monkeypatch.setattr(_study, "measure", fm)
        return spec, fm
    return setup


def _run(d, pause=None, minutes=None):
    said: list[str] = []
    code = _runner.run(_runner.RunRequest(workload="syn", spec_path=str(d / "syn.yaml"), pause_after_starts=pause,
                                          pause_after_minutes=minutes),
                       settings=Settings(), echo=lambda msg, err=False: said.append(msg))
    return code, said


def test_a_study_in_slices_of_one_start_matches_the_uninterrupted_study(tmp_path, env):
    whole, sliced = tmp_path / "whole", tmp_path / "sliced"
    whole.mkdir(), sliced.mkdir()
    spec, fm = env(whole)
    code, said = _run(whole)
    assert code == 0, said
    reference = [canonical(c) for c in fm.calls]
    want = json.loads((whole / "rec" / "syn.json").read_text())
    assert len(reference) >= 5  # baseline, K max, search, confirmation: several slices below

    spec, fm = env(sliced)
    rec = sliced / "rec" / "syn.json"
    store = Store(spec.storage)
    paused_runs = 0
    while True:
        before = len(fm.calls)
        code, said = _run(sliced, pause=1)
        assert code == 0, said
        made = len(fm.calls) - before
        assert made <= 1, said  # never more than the slice allows
        if rec.exists():
            break
        paused_runs += 1
        assert made == 1 or paused_runs > 1, said  # a slice that made nothing only after one that did
        assert "paused after" in said[-1] and "no recommendation written yet" in said[-1]
        assert paused_runs <= len(reference) + 2, "the slices never finish"
    assert [canonical(c) for c in fm.calls] == reference  # the same starts, in the same order
    got = json.loads(rec.read_text())
    assert got["decision"] == want["decision"]
    assert got["speculative_config"] == want["speculative_config"]
    assert got["evidence"]["winner"]["config"] == want["evidence"]["winner"]["config"]
    outcomes = [r["outcome"] for r in store.query("SELECT outcome FROM autotune_runs WHERE workload = 'syn'")]
    assert sorted(outcomes) == ["ok"] + ["paused"] * paused_runs  # each paused run recorded as such
    assert paused_runs >= len(reference) - 1  # every start but the last one ended a paused run


def test_a_slice_that_makes_the_last_start_decides(tmp_path, env):
    """The run whose allowance ends exactly with the study's last start writes the decision."""
    spec, fm = env(tmp_path)
    code, said = _run(tmp_path)
    assert code == 0, said
    n = len(fm.calls)
    other = tmp_path / "again"
    other.mkdir()
    spec, fm = env(other)
    code, said = _run(other, pause=n)
    assert code == 0 and len(fm.calls) == n, said
    assert (other / "rec" / "syn.json").exists(), said


def test_pause_after_zero_starts_is_refused():
    from autotune.cli._main import main

    res = CliRunner().invoke(main, ["study", "start", "--workload", "syn", "--pause-after-starts", "0"])
    assert res.exit_code == 2 and "--pause-after-starts" in res.output


def test_an_interrupted_start_does_not_spend_the_budget(tmp_path, env, monkeypatch):
    """SIGINT in the middle of a start (a GPU window's time limit): the rerun redoes that start, and
    the study makes the same measured starts and decision as one uninterrupted run, under a
    budget of server starts that binds."""
    budget = {"max_trials": 8, "max_server_starts": 5, "max_wall_minutes": 10}
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()
    spec, fm = env(whole)
    make_spec(whole, budget=budget)  # the same study, its budget tighter
    code, said = _run(whole)
    assert code == 0, said
    reference = [canonical(c) for c in fm.calls]
    assert len(reference) == 5  # the budget binds: every start it allows is made
    want = json.loads((whole / "rec" / "syn.json").read_text())
    assert "server-start budget (5) reached" in want["study"]["stopped_because"]

    _, fm = env(cut)
    make_spec(cut, budget=budget)
    measure, calls = fm, []

    def interrupted_third(*a, **k):
        calls.append(a[1])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return measure(*a, **k)
    monkeypatch.setattr(_study, "measure", interrupted_third)
    code, said = _run(cut)
    assert code == 130 and "interrupted" in said[-1], said
    assert not (cut / "rec" / "syn.json").exists()
    code, said = _run(cut)
    assert code == 0, said
    assert [canonical(c) for c in fm.calls] == reference  # the measured starts: the same, in order
    assert canonical(calls[2]) == canonical(calls[3])  # the interrupted start was redone first
    got = json.loads((cut / "rec" / "syn.json").read_text())
    assert got["decision"] == want["decision"] and got["speculative_config"] == want["speculative_config"]
    assert got["study"]["server_starts"] == 6 and got["study"]["interrupted_starts"] == 1
    assert got["study"]["stopped_because"] == ("server-start budget (5) reached "
                                               "(1 start stopped by a signal not counted): "
                                               "2 of its starts kept for the confirmation")
    assert any("6 server starts (1 stopped by a signal, not counted against the budget)" in line for line in said), said


def test_a_signal_stop_is_told_from_a_death_also_in_older_storages():
    from types import SimpleNamespace as T

    from autotune.search._trials import stopped_by_signal
    assert stopped_by_signal(T(user_attrs={"interrupted": True, "interrupted_by": "SIGTERM"}))
    # written before the mark existed: the error says it
    assert stopped_by_signal(T(user_attrs={"interrupted": True,
                                           "error": "interrupted by SIGINT: vllm serve stopped, trial not measured"}))
    assert not stopped_by_signal(T(user_attrs={"interrupted": True, "error": "interrupted: its autotune process "
                                               "(pid 7 on h) died during the trial; retried"}))
    assert not stopped_by_signal(T(user_attrs={"error": "vllm serve exited with code 1"}))


class _Clock:
    """A monotonic clock that only the fake starts move: a start of ngram K takes 150 + 10 K s, the
    baseline 200 s (the GPU's order of magnitude), so the test is not timed."""
    def __init__(self):
        self.t = 1000.0

    def monotonic(self):
        return self.t

    @staticmethod
    def sleep(s):
        pass


def test_a_study_in_timed_windows_begins_only_starts_that_fit_and_matches_the_uninterrupted_study(
        tmp_path, env, monkeypatch):
    """--pause-after-minutes: each run begins a start only when its expected length (the longest
    earlier start of the method) fits the time left; no start overruns its window, none is cut, and
    the windows together make the same starts and decision as one run."""
    budget = {"max_trials": 8, "max_server_starts": 10, "max_wall_minutes": 1000}
    whole, timed = tmp_path / "whole", tmp_path / "timed"
    whole.mkdir(), timed.mkdir()
    spec, fm = env(whole)
    make_spec(whole, budget=budget)
    code, said = _run(whole)
    assert code == 0, said
    reference = [canonical(c) for c in fm.calls]
    want = json.loads((whole / "rec" / "syn.json").read_text())

    spec, fm = env(timed)
    make_spec(timed, budget=budget)
    clock, spans = _Clock(), []
    monkeypatch.setattr(_study, "time", clock)
    monkeypatch.setattr(_budget, "time", clock)
    monkeypatch.setattr(_runner, "time", clock)

    def timed_measure(spec, config, *a, **k):
        began = clock.t
        clock.t += 150 + 10 * config["num_speculative_tokens"] if config else 200
        spans.append((began, clock.t))
        return fm(spec, config, *a, **k)
    timed_measure.calls = fm.calls
    monkeypatch.setattr(_study, "measure", timed_measure)
    rec, windows, reasons = timed / "rec" / "syn.json", 0, []
    while not rec.exists():
        opened, before = clock.t, len(fm.calls)
        code, said = _run(timed, minutes=7)  # 420 s: two or three starts a window
        assert code == 0, said
        windows += 1
        assert len(fm.calls) > before, said  # every window makes progress
        assert all(end - opened <= 420 for began, end in spans[before:]), spans  # no start overran
        if not rec.exists():
            reasons.append(said[-1])
            clock.t += 3600  # the next window, a night later
        assert windows <= len(reference), "the windows never finish"
    assert windows >= 3 and reasons
    assert all("expected to take" in r and "no recommendation written yet" in r for r in reasons), reasons
    assert [canonical(c) for c in fm.calls] == reference  # the same starts, in the same order
    got = json.loads(rec.read_text())
    assert got["decision"] == want["decision"] and got["speculative_config"] == want["speculative_config"]
    assert got["study"]["interrupted_starts"] == 0


def test_the_expected_start_length_is_the_longest_of_its_method_or_its_own_attempt():
    from datetime import datetime, timedelta
    from types import SimpleNamespace as T

    from autotune.search._budget import expected_start_s

    def trial(state, method, k, s=None, dt=None):
        cfg = None if method == "none" else {"method": method, "num_speculative_tokens": k}
        t0 = datetime(2026, 12, 3)
        return T(state=T(name=state), user_attrs={"config": cfg, "config_key": f"{method}:{k}", "server_starts": 1,
                                                  **({"start_s": s} if s is not None else {})},
                 datetime_start=t0, datetime_complete=t0 + timedelta(seconds=dt) if dt else None)
    assert expected_start_s([], "ngram:4", "ngram") is None  # nothing ended yet: the first start begins
    trials = [trial("COMPLETE", "none", 0, 200), trial("COMPLETE", "ngram", 8, 170), trial("COMPLETE", "ngram", 4, 160)]
    assert expected_start_s(trials, "ngram:6", "ngram")[0] == 170  # the longest of the method
    s, why = expected_start_s(trials, "draft_model:4", "draft_model")
    assert s == 300 and "no start of draft_model yet" in why  # no start of it: 1.5 x the longest of any
    cut = trial("FAIL", "draft_model", 4, dt=330)  # an interrupted attempt, written before start_s: its own times
    assert expected_start_s([*trials, cut], "draft_model:4", "draft_model")[0] == 330
    assert expected_start_s([*trials, cut], "draft_model:2", "draft_model")[0] == 300  # not another K's failure
    assert expected_start_s([*trials, trial("RUNNING", "ngram", 2, dt=900)], "ngram:2", "ngram")[0] == 170


def test_a_pause_given_as_one_value_pauses_the_study_as_its_parts_do(tmp_path, monkeypatch):
    """``Study(pause=Pause(...))`` is ``pause_after_starts`` and the rest under one name; both at
    once is refused, naming the two ways."""
    spec = make_spec(tmp_path, budget={"max_trials": 8, "max_server_starts": 10, "max_wall_minutes": 10})
    monkeypatch.setattr(_study, "measure", fake_measure(Workload(rates=RATES)))

    def study(d, **kw):
        return _study.Study(spec.model_copy(update={"storage": f"sqlite:///{tmp_path / d}.db"}), CAPS,
                            SearchSpace.build(spec.space, CAPS), f"sqlite:///{tmp_path / d}.db", ["vllm", "serve"],
                            tmp_path / d, **kw)
    grouped, parts = study("grouped", pause=Pause(after_starts=2)).run(), study("parts", pause_after_starts=2).run()
    assert grouped.paused and parts.paused and grouped.server_starts == parts.server_starts == 2
    assert grouped.stopped_because == parts.stopped_because and "paused after 2 server starts" in parts.stopped_because
    with pytest.raises(ValueError, match="pause=Pause.*not both"):
        study("both", pause=Pause(after_starts=2), pause_after_starts=2)
