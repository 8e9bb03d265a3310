"""The records the stages above search read: one adapter from Optuna's stored attributes."""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from autotune.search import StudyRecord, TrialRecord, read_study, study_record, trial_record
from autotune.search._space import NONE, canonical

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def _frozen(config, tpot, role="search", state=optuna.trial.TrialState.COMPLETE, **attrs):
    return optuna.trial.create_trial(
        state=state, value=tpot if state == optuna.trial.TrialState.COMPLETE else None,
        user_attrs={"role": role, "config": config, "config_key": canonical(config), "server_starts": 1,
                    "measurement": {"tpot_ms": [tpot, tpot], "summary": {"ok": 2},
                                    "spec_delta": {"drafts": 4}}, **attrs},
        constraints={"throughput_floor": -0.1} if state == optuna.trial.TrialState.COMPLETE else None)


def _study(*frozen):
    st = optuna.create_study(study_name="code-abc")
    for t in frozen:
        st.add_trial(t)
    return st


def test_trial_record_reads_every_attribute_the_stages_use():
    t = _frozen(NGRAM, 10.0, role="confirm", stalled=True, equivalence={"compared": 3, "matched": 3},
                predicted_tpot_ms=9.5, predicted_ci=[9.0, 10.0], error="slow", noise={"within_start": None})
    r = trial_record(t)
    assert isinstance(r, TrialRecord) and r.number == t.number and r.state == "COMPLETE" and r.value == 10.0
    assert r.role == "confirm" and r.config == NGRAM and r.config_key == canonical(NGRAM)
    assert r.stalled is True and r.equivalence == {"compared": 3, "matched": 3} and r.server_starts == 1
    assert r.predicted_tpot_ms == 9.5 and r.predicted_ci == (9.0, 10.0) and r.error == "slow"
    assert r.tpot_ms == [10.0, 10.0] and r.summary == {"ok": 2} and r.counters == {"drafts": 4} and r.levels == {}
    assert r.constraints == {"throughput_floor": -0.1}
    assert r.noise_attrs() == {"measurement": t.user_attrs["measurement"], "noise": {"within_start": None}}
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.value = 1.0


def test_a_trial_without_a_measurement_reads_as_empty():
    r = trial_record(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={"error": "boom"}))
    assert r.state == "FAIL" and r.measurement == {} and r.tpot_ms == [] and r.summary == {} and r.counters == {}
    assert r.stalled is False and r.server_starts == 0 and r.config is None and r.error == "boom"


def test_read_study_reads_the_stored_study_attributes_and_filters_like_study_trials():
    st = _study(_frozen(None, 30.0, role="baseline"), _frozen(NGRAM, 10.0),
                _frozen(NGRAM, 11.0, role="confirm"), _frozen(NGRAM, 0.0, state=optuna.trial.TrialState.FAIL))
    for k, v in {"workload": "code", "hardware": "cpu x2", "vllm_version": "0.32.0", "confirm_looks": 3,
                 "replay_digest": "d1", "predictor": {"curve": []}}.items():
        st.set_user_attr(k, v)
    rec = read_study(st)
    assert isinstance(rec, StudyRecord) and rec.name == "code-abc" and rec.workload == "code"
    assert (rec.hardware, rec.vllm_version, rec.confirm_looks, rec.replay_digest) == ("cpu x2", "0.32.0", 3, "d1")
    assert rec.predictor == {"curve": []}
    assert [t.number for t in rec.all_trials] == [0, 1, 2, 3]
    assert [t.number for t in rec.trials()] == [0, 1, 2]  # completed only
    assert [t.number for t in rec.trials(config_key=NONE)] == [0]
    assert [t.number for t in rec.trials(role="confirm", config_key=canonical(NGRAM))] == [2]
    assert [t.number for t in rec.trials(complete=False, config_key=canonical(NGRAM))] == [1, 2, 3]
    assert rec.best() is None  # storage alone does not say what the search picked
    assert read_study(st, name="other", confirmation={"rounds": 1}).confirmation == {"rounds": 1}


def test_study_record_takes_the_live_run_s_pick_and_context():
    from types import SimpleNamespace

    st = _study(_frozen(None, 30.0, role="baseline"), _frozen(NGRAM, 10.0))
    live = SimpleNamespace(study=st, spec=SimpleNamespace(workload="code"), name="code-abc",
                           caps=SimpleNamespace(version="0.33.0"), hardware="1x H200",
                           space=SimpleNamespace(dropped={"eagle3": "no drafter"}), confirmation={"looks": 2},
                           best=lambda search_only=False: st.trials[1])
    rec = study_record(live)
    assert rec.best().number == 1 and rec.best().config == NGRAM
    assert (rec.name, rec.workload, rec.vllm_version, rec.hardware) == ("code-abc", "code", "0.33.0", "1x H200")
    assert rec.dropped_methods == {"eagle3": "no drafter"} and rec.confirmation == {"looks": 2}
