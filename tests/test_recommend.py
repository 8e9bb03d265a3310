"""The recommendation: atomic writes that never damage the previous file, the deployable
fragments, and the change/keep/disable decision on stored trials."""

from __future__ import annotations

import errno
import json
import os
import statistics
from pathlib import Path

import optuna
import pytest
import yaml

from autotune import _recommend
from autotune._recommend import config_yaml, decide, serve_args_for, write_atomic
from autotune._space import NONE, canonical
from autotune._spec import load_spec
from autotune._study import Study

ROOT = Path(__file__).resolve().parent.parent

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 24,
          "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}


# --------------------------------------------------------------------------- write_atomic

OLD = {"schema": _recommend.SCHEMA, "workload": "code", "decision": "keep", "reason": "previous night"}


@pytest.fixture
def target(tmp_path) -> Path:
    p = tmp_path / "recs" / "code.json"
    write_atomic(p, OLD)
    return p


def _leftovers(d: Path, keep: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p != keep)


def test_write_atomic_writes_json(tmp_path):
    p = tmp_path / "new" / "dir" / "code.json"  # parents are created
    out = write_atomic(p, {"a": 1, "path": Path("/x/y"), "nested": {"k": [1, 2]}})
    assert out == p
    text = p.read_text()
    assert text.endswith("}\n")
    assert json.loads(text) == {"a": 1, "path": "/x/y", "nested": {"k": [1, 2]}}
    assert _leftovers(p.parent, p) == []
    assert _recommend.load(tmp_path / "new" / "dir", "code") == json.loads(text)


def test_write_atomic_replaces_previous(target):
    write_atomic(target, {"decision": "change"})
    assert json.loads(target.read_text()) == {"decision": "change"}
    assert _leftovers(target.parent, target) == []


def test_failure_mid_write_leaves_previous_file_intact(target):
    before = target.read_bytes()
    seen_tmp: list[tuple[str, int]] = []

    class Boom:
        """Fails while json.dump is already streaming the payload into the temp file."""

        def __str__(self):
            seen_tmp.extend((p.name, p.stat().st_size) for p in target.parent.iterdir() if p.name.endswith(".tmp"))
            raise RuntimeError("serialisation failed half way")

    with pytest.raises(RuntimeError, match="half way"):
        write_atomic(target, {"workload": "code", "big": "x" * 200_000, "boom": Boom()})
    # it really failed mid-write: a temp file with part of the payload existed at that moment
    assert len(seen_tmp) == 1 and seen_tmp[0][0].startswith(".code.json.") and seen_tmp[0][1] >= 100_000
    assert target.read_bytes() == before
    assert _leftovers(target.parent, target) == []


def test_disk_full_at_fsync_leaves_previous_file_intact(target, monkeypatch):
    before = target.read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_recommend.os, "fsync", full)
    with pytest.raises(OSError) as ei:
        write_atomic(target, {"workload": "code", "decision": "change", "pad": "y" * 50_000})
    assert ei.value.errno == errno.ENOSPC
    assert target.read_bytes() == before
    assert _leftovers(target.parent, target) == []


def test_read_only_directory_leaves_previous_file_intact(target):
    d = target.parent
    before = target.read_bytes()
    os.chmod(d, 0o500)
    try:
        try:
            (d / "probe").touch()
        except PermissionError:
            pass
        else:
            (d / "probe").unlink()
            pytest.skip("running as root: a read-only directory is still writable")
        with pytest.raises(PermissionError):
            write_atomic(target, {"decision": "change"})
        assert target.read_bytes() == before
        assert _leftovers(d, target) == []
    finally:
        os.chmod(d, 0o700)


def test_load_missing_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError) as ei:
        _recommend.load(tmp_path, "chat")
    assert str(tmp_path / "chat.json") in str(ei.value) and "'chat'" in str(ei.value)


# --------------------------------------------------------------------------- deployable fragments


def test_serve_args_and_config_yaml_for_no_speculation():
    assert serve_args_for(None) == []
    assert serve_args_for({}) == []
    text = config_yaml(None)
    assert text.lstrip().startswith("#")
    assert yaml.safe_load(text) is None  # nothing to set


def test_serve_args_and_config_yaml_for_a_config():
    cfg = {"prompt_lookup_min": 2, "method": "ngram", "num_speculative_tokens": 4}
    args = serve_args_for(cfg)
    assert args == ["--speculative-config",
                    '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2}']
    assert json.loads(args[1]) == cfg
    assert yaml.safe_load(config_yaml(cfg)) == {"speculative-config": cfg}


# --------------------------------------------------------------------------- decide


def _tpot(center: float, offset: float = 0.0, n: int = 32) -> list[float]:
    """Tight, deterministic per-request TPOTs around ``center``."""
    return [round(center + offset + 0.05 * ((i * 7) % 11) - 0.25, 4) for i in range(n)]


def _trial(config: dict | None, tpot: list[float], *, role: str = "search", throughput: float = 100.0,
           compared: int = 32, matched: int | None = None, failed: int = 0, guards=None):
    matched = compared if matched is None else matched
    frac = matched / compared if compared else 1.0
    g = guards
    constraints = {"failed_requests": float(failed - g.max_failed_requests),
                   "equivalence": g.equivalence_min_match - frac,
                   "throughput_floor": g.throughput_floor - throughput / 100.0}
    return optuna.trial.create_trial(
        value=statistics.median(tpot),
        user_attrs={
            "role": "baseline" if config is None else role,
            "config": config, "config_key": canonical(config),
            "measurement": {
                "tpot_ms": tpot, "start_seconds": 20.0,
                "summary": {"output_throughput_tok_s": throughput, "failed": failed, "ttft_ms": {"p90": 80.0}},
                "spec_delta": {"drafts": 100, "accepted_tokens": 250} if config else {},
                "argv": ["vllm", "serve", "m", *serve_args_for(config)],
            },
            "equivalence": {"compared": compared, "matched": matched},
            "stalled": False,
        },
        constraints=constraints,
    )


class FakeStudy:
    """What decide() reads (.spec, .trials(config_key=), .best()), over real FrozenTrials; trials,
    best and objective_of are Study's own, reading an in-memory Optuna study."""

    trials = Study.trials
    best, objective_of = Study.best, Study.objective_of

    def __init__(self, spec, frozen):
        self.spec = spec
        self.study = optuna.create_study()
        for t in frozen:
            self.study.add_trial(t)


@pytest.fixture(scope="module")
def spec():
    s = load_spec(ROOT / "studies" / "code.yaml")
    assert s.guards.equivalence_min_match == 1.0 and s.incumbent is None
    return s


def _baseline(spec, center=30.0):
    return [_trial(None, _tpot(center), guards=spec.guards),
            _trial(None, _tpot(center, 0.1), role="confirm", guards=spec.guards)]


def test_decide_change_when_winner_is_clearly_faster(spec):
    trials = [*_baseline(spec),
              _trial(NGRAM, _tpot(10.0), throughput=290.0, guards=spec.guards),
              _trial(NGRAM, _tpot(10.0, 0.05), role="confirm", throughput=300.0, guards=spec.guards),
              _trial(SUFFIX, _tpot(20.0), throughput=150.0, guards=spec.guards)]
    d = decide(FakeStudy(spec, trials))
    assert d.decision == "change"
    assert d.winner == NGRAM
    assert "ngram K=4" in d.reason and "faster" in d.reason
    ev = d.evidence
    assert ev["speedup"] == pytest.approx(3.0, rel=0.03)
    assert 1.0 < ev["speedup_ci"][0] <= ev["speedup"] <= ev["speedup_ci"][1]
    assert ev["winner"]["config"] == NGRAM
    assert ev["winner"]["server_starts"] == 2 and ev["baseline"]["server_starts"] == 2
    assert ev["winner"]["requests"] == 64
    assert ev["equivalence"] == {"compared": 64, "matched": 64}
    assert ev["throughput_ratio"] == pytest.approx(2.95)
    assert ev["winner"]["acceptance_length"] == pytest.approx(3.5)
    assert ev["single_start_only"] is False


def test_decide_keep_when_winner_equals_baseline(spec):
    trials = [*_baseline(spec),
              _trial(NGRAM, _tpot(30.0), guards=spec.guards),
              _trial(NGRAM, _tpot(30.0, 0.1), role="confirm", guards=spec.guards)]
    d = decide(FakeStudy(spec, trials))
    assert d.decision == "keep"
    assert d.winner is None
    assert "not faster" in d.reason and "keep serving without speculation" in d.reason
    assert d.evidence["speedup_ci"][0] <= 1.0 <= d.evidence["speedup_ci"][1]


def test_decide_equivalence_guard_blocks_a_fast_winner(spec):
    # the search start matched 16/16 (feasible, so it is best()), the confirmation start 14/16:
    # pooled 30/32 < equivalence_min_match 1.0
    trials = [*_baseline(spec),
              _trial(NGRAM, _tpot(10.0), compared=16, matched=16, throughput=300.0, guards=spec.guards),
              _trial(NGRAM, _tpot(10.0, 0.05), role="confirm", compared=16, matched=14, throughput=300.0,
                     guards=spec.guards)]
    st = FakeStudy(spec, trials)
    assert st.best().user_attrs["config"] == NGRAM
    d = decide(st)
    assert d.decision != "change"
    assert d.decision == "keep" and d.winner is None
    assert "fails a guard" in d.reason and "matched the baseline on 30/32" in d.reason
    assert d.evidence["speedup"] == pytest.approx(3.0, rel=0.03)  # fast, yet not recommended


def test_decide_failed_requests_guard(spec):
    trials = [*_baseline(spec),
              _trial(NGRAM, _tpot(10.0), throughput=300.0, guards=spec.guards),
              _trial(NGRAM, _tpot(10.0), role="confirm", throughput=300.0, failed=2, guards=spec.guards)]
    d = decide(FakeStudy(spec, trials))
    assert d.decision == "keep"
    assert "2 failed requests (max 0)" in d.reason


def test_decide_disable_when_incumbent_loses_to_baseline(spec):
    spec_inc = spec.model_copy(update={"incumbent": dict(NGRAM)})
    trials = [*_baseline(spec),
              _trial(NGRAM, _tpot(31.0), guards=spec.guards),
              _trial(NGRAM, _tpot(31.0, 0.1), role="confirm", guards=spec.guards),
              _trial(SUFFIX, _tpot(30.5), guards=spec.guards)]
    d = decide(FakeStudy(spec_inc, trials))
    assert d.decision == "disable"
    assert "disable the deployed speculation" in d.reason
    # the decision carries the incumbent (what to roll back from); build() deploys nothing on disable
    assert d.winner == NGRAM


def test_decide_disable_when_no_candidate_completed(spec):
    spec_inc = spec.model_copy(update={"incumbent": dict(NGRAM)})
    d = decide(FakeStudy(spec_inc, _baseline(spec)))
    assert d.decision == "disable"
    assert "no speculative configuration completed" in d.reason
    assert "winner" not in d.evidence and d.evidence["baseline"]["server_starts"] == 2


def test_decide_keep_when_incumbent_is_still_the_best(spec):
    spec_inc = spec.model_copy(update={"incumbent": dict(NGRAM)})
    trials = [*_baseline(spec),
              _trial(NGRAM, _tpot(10.0), throughput=300.0, guards=spec.guards),
              _trial(NGRAM, _tpot(10.0, 0.05), role="confirm", throughput=300.0, guards=spec.guards)]
    d = decide(FakeStudy(spec_inc, trials))
    assert d.decision == "keep"
    assert d.winner == NGRAM
    assert d.reason.startswith("the deployed config is still the best")


def test_no_candidate_and_no_incumbent_keeps_no_speculation(spec):
    d = decide(FakeStudy(spec, _baseline(spec)))
    assert d.decision == "keep" and d.winner is None
    assert canonical(d.winner) == NONE


def test_a_replay_set_that_cannot_measure_acceptance_holds_a_winner_back(spec, tmp_path):
    """A set sampled from a length-only trace (manifest ``acceptance_measurable: false``) measures
    speed, not acceptance: the faster config stays in the evidence, the decision is keep."""
    from types import SimpleNamespace

    from autotune._sampling import manifest_path

    trials = [*_baseline(spec),
              _trial(NGRAM, _tpot(10.0), throughput=290.0, guards=spec.guards),
              _trial(NGRAM, _tpot(10.0, 0.05), role="confirm", throughput=300.0, guards=spec.guards)]
    rs_path = tmp_path / "trace.jsonl"
    rs_path.write_text("")
    st = FakeStudy(spec, trials)
    st.replay_set = SimpleNamespace(path=rs_path, requests=[None] * 40)
    assert decide(st).decision == "change"  # no manifest (a hand-made set): decided as measured
    manifest_path(rs_path).write_text(json.dumps({"acceptance_measurable": False, "synthetic_requests": 40,
                                                  "workload": "code", "content_hash": "abc"}))
    d = decide(st)
    assert d.decision == "keep" and d.winner is None
    assert "synthetic prompts (40 of 40 requests" in d.reason and "not recommended" in d.reason
    assert d.evidence["held_back_winner"] == NGRAM
    manifest_path(rs_path).write_text(json.dumps({"acceptance_measurable": True, "synthetic_requests": 0}))
    assert decide(st).decision == "change"


def _damping_study(spec, days: float, version: str = "0.32.0", incumbent_rate: float | None = None):
    from types import SimpleNamespace

    from autotune import _recommend

    s = spec.model_copy(update={"drift": spec.drift.model_copy(update={"min_days_between_changes": days})})
    trials = [*_baseline(s),
              _trial(NGRAM, _tpot(10.0), throughput=290.0, guards=s.guards),
              _trial(NGRAM, _tpot(10.0, 0.05), role="confirm", throughput=300.0, guards=s.guards)]
    st = FakeStudy(s, trials)
    st.caps = SimpleNamespace(version=version)
    d = decide(st)
    assert d.decision == "change" and d.winner == NGRAM
    return st, d, _recommend.damp


def test_damping_holds_a_new_config_back_within_the_window(spec):
    import datetime as dt

    now = dt.datetime(2026, 11, 30, 3, 0, tzinfo=dt.timezone.utc)
    prev = {"id": "r1", "speculative_config": SUFFIX, "decision": "change",
            "created_at": (now - dt.timedelta(days=1)).isoformat(), "engine": {"vllm_version": "0.32.0"}}
    st, d, damp = _damping_study(spec, days=3)
    held = damp(d, st, prev, now=now)
    assert held.decision == "keep" and held.winner == SUFFIX  # the previous recommendation stands
    assert held.reason.startswith("damped: the last recommendation (suffix") and "1.0 days old" in held.reason
    assert held.evidence["damped"]["held_back_winner"] == NGRAM and held.evidence["damped"]["previous_id"] == "r1"

    # not damped: older than the window, vLLM changed, damping off, no previous, same config
    for p, days, version in [({**prev, "created_at": (now - dt.timedelta(days=4)).isoformat()}, 3, "0.32.0"),
                             (prev, 3, "0.33.0"), (prev, 0, "0.32.0"), (None, 3, "0.32.0"),
                             ({**prev, "speculative_config": NGRAM}, 3, "0.32.0")]:
        st, d, damp = _damping_study(spec, days=days, version=version)
        out = damp(d, st, p, now=now)
        assert out.decision == "change" and out.winner == NGRAM and "damped" not in out.evidence
