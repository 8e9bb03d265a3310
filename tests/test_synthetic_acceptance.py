"""The benchmarking-only acceptance profile (``benchmark.synthetic_acceptance``): the spec block
validates with file:line errors, every speculative trial's server gets vLLM's synthetic rejection
sampler with the rates for its K, and the recommendation never carries them but is marked
benchmark-only."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.decide import _decision, _payload
from autotune.search import StudyRecord, TrialRecord, _trial
from autotune.search._space import canonical
from autotune.engines._engine import ServerStartError
from autotune.core._spec import SpecError, load_spec

ROOT = Path(__file__).resolve().parent.parent

BASE = """\
workload: w
model: org/some-model
replay:
  path: replay.jsonl
  concurrency: 2
space:
  methods: [ngram]
  k: {min: 1, max: 4}
"""


def _spec(tmp_path: Path, block: str):
    p = tmp_path / "spec.yaml"
    p.write_text(BASE + block)
    return p


def _error(path: Path) -> str:
    with pytest.raises(SpecError) as ei:
        load_spec(path)
    return str(ei.value)


def test_alpha_gives_per_position_powers_for_each_k(tmp_path):
    spec = load_spec(_spec(tmp_path, "benchmark:\n  synthetic_acceptance: {alpha: 0.8}\n"))
    sa = spec.benchmark.synthetic_acceptance
    assert sa.rates_for(1) == [0.8]
    assert sa.rates_for(3) == [0.8, 0.64, 0.512]
    assert len(sa.rates_for(4)) == 4


def test_explicit_rates_are_cut_to_k(tmp_path):
    spec = load_spec(_spec(tmp_path, "benchmark:\n  synthetic_acceptance: {rates: [0.9, 0.7, 0.5, 0.3]}\n"))
    assert spec.benchmark.synthetic_acceptance.rates_for(2) == [0.9, 0.7]


def test_no_block_means_no_change_and_no_mark(tmp_path):
    spec = load_spec(_spec(tmp_path, ""))
    cfg = {"method": "ngram", "num_speculative_tokens": 3}
    assert spec.benchmark is None
    assert spec.run_config(cfg) == cfg
    assert spec.benchmark_only() is None


@pytest.mark.parametrize("block, field, words", [
    ("benchmark:\n  synthetic_acceptance: {alpha: 0.8, rates: [0.5]}\n",
     "benchmark.synthetic_acceptance", "exactly one of alpha"),
    ("benchmark:\n  synthetic_acceptance: {}\n", "benchmark.synthetic_acceptance", "exactly one of alpha"),
    ("benchmark:\n  synthetic_acceptance: {alpha: 1.5}\n", "benchmark.synthetic_acceptance.alpha", "less than or equal"),
    ("benchmark:\n  synthetic_acceptance:\n    rates: [0.5, 0.7, 0.4, 0.3]\n",
     "benchmark.synthetic_acceptance.rates", "non-increasing"),
    ("benchmark:\n  synthetic_acceptance:\n    rates: [1.2, 0.7, 0.4, 0.3]\n",
     "benchmark.synthetic_acceptance.rates", "[0, 1]"),
    ("benchmark:\n  synthetic_acceptance:\n    rates: [0.8, 0.6]\n", "benchmark", "reaches K=4"),
    ("benchmark:\n  synthetic_acceptance: {alpha: 0.8}\n  other: 1\n", "benchmark.other", "Extra inputs"),
])
def test_invalid_blocks_name_file_line_and_field(tmp_path, block, field, words):
    path = _spec(tmp_path, block)
    msg = _error(path)
    m = re.search(rf"{re.escape(str(path))}:(\d+): field '{re.escape(field)}': (.*)", msg)
    assert m, msg
    assert words in m.group(2), msg
    assert int(m.group(1)) > BASE.count("\n")  # a line inside the benchmark block


def test_run_config_adds_the_sampler_and_leaves_the_config_alone(tmp_path):
    spec = load_spec(_spec(tmp_path, "benchmark:\n  synthetic_acceptance: {alpha: 0.5}\n"))
    cfg = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    run = spec.run_config(cfg)
    assert run["rejection_sample_method"] == "synthetic"
    assert run["synthetic_acceptance_rates"] == [0.5, 0.25]
    assert "rejection_sample_method" not in cfg and "synthetic_acceptance_rates" not in cfg
    assert spec.run_config(None) is None  # the no-speculation baseline gets nothing


def test_bands_use_num_speculative_tokens_as_k(tmp_path):
    spec = load_spec(_spec(tmp_path, "benchmark:\n  synthetic_acceptance: {alpha: 0.5}\n"))
    cfg = {"method": "ngram", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 32, 1]]}
    assert spec.run_config(cfg)["synthetic_acceptance_rates"] == [0.5, 0.25, 0.125]


class _Refused:
    """Stands in for VllmServer: records the argv and refuses to start (no process is run)."""
    seen: list[list[str]] = []

    def __init__(self, argv, **kw):
        type(self).seen.append(list(argv))

    launched_at = start_seconds = None  # never started

    def start(self):
        raise ServerStartError("not started in this test", None)

    def stop(self):
        pass


def test_trial_argv_carries_the_rates_for_its_k(tmp_path, monkeypatch):
    spec = load_spec(_spec(tmp_path, "benchmark:\n  synthetic_acceptance: {alpha: 0.8}\n"))
    monkeypatch.setattr(_trial, "VllmServer", _Refused)
    _Refused.seen = []
    for cfg in ({"method": "ngram", "num_speculative_tokens": 3}, None):
        with pytest.raises(_trial.TrialFailed):
            _trial.measure(spec, cfg, [], [], tmp_path / "t.log", ["vllm", "serve"])
    spec_argv, base_argv = _Refused.seen
    sc = json.loads(spec_argv[spec_argv.index("--speculative-config") + 1])
    assert sc == {"method": "ngram", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
                  "synthetic_acceptance_rates": [0.8, 0.64, 0.512]}
    assert "--speculative-config" not in base_argv


def _fake_study(spec, config):
    """What _payload.build reads from a study, for one measured winner."""
    trial = TrialRecord(number=0, state="COMPLETE", config=config, config_key=canonical(config),
                        measurement={"argv": ["vllm", "serve", "m", "--speculative-config",
                                              json.dumps(spec.run_config(config))]})
    return StudyRecord(
        name=None, spec=spec, vllm_version="0.25.0", dropped_methods={}, all_trials=(trial,),
        replay_set=SimpleNamespace(path="r.jsonl", digest="d", requests=[1, 2], by_tag=lambda: {None: 2}))


def test_recommendation_never_carries_the_sampler_and_is_marked(tmp_path):
    spec = load_spec(_spec(tmp_path, "benchmark:\n  synthetic_acceptance: {alpha: 0.8}\n"))
    cfg = {"method": "ngram", "num_speculative_tokens": 3}
    decision = _decision.Decision("change", "faster", cfg, {"statistic": "median"})
    outcome = SimpleNamespace(study_name="s", storage="sqlite://", trials=[], server_starts=2, interrupted_starts=0,
                              wall_s=1.0, stopped_because="done")
    rec = _payload.build(_fake_study(spec, cfg), decision, outcome)
    deployable = json.dumps([rec["speculative_config"], rec["vllm_serve_args"], rec["vllm_config_yaml"],
                             rec["rollback"]])
    assert "synthetic" not in deployable
    assert rec["speculative_config"] == cfg
    assert rec["benchmark_only"]["synthetic_acceptance"] == {"alpha": 0.8}
    assert "BENCHMARK ONLY" in rec["warning"] and "do not deploy" in rec["warning"]


def test_production_recommendation_has_no_mark(tmp_path):
    spec = load_spec(_spec(tmp_path, ""))
    cfg = {"method": "ngram", "num_speculative_tokens": 3}
    rec = _payload.build(_fake_study(spec, cfg), _decision.Decision("change", "faster", cfg, {}),
                           SimpleNamespace(study_name="s", storage="sqlite://", trials=[], server_starts=2,
                                           interrupted_starts=0, wall_s=1.0, stopped_because="done"))
    assert "benchmark_only" not in rec and "warning" not in rec


def test_report_marks_a_benchmark_only_recommendation():
    from autotune.report import _report
    rec = json.loads((ROOT / "benchmarks" / "results" / "h200-recommendation-code-h200.json").read_text())
    blocks = _report._blocks("s", "code-h200", [], None, rec, [], None, {})
    text = json.dumps(blocks)
    assert "BENCHMARK ONLY, do not deploy" in text


@pytest.mark.parametrize("name, alpha", [("code-h200", 0.8), ("chat-h200", 0.35), ("code-h200-ngram-gpu", 0.8)])
def test_gpu_specs_validate(name, alpha):
    spec = load_spec(ROOT / "benchmarks" / "gpu" / f"{name}.yaml")
    assert spec.benchmark.synthetic_acceptance.alpha == alpha
    assert spec.guards.equivalence_min_match == 0.0  # synthetic acceptance changes outputs by design
    assert spec.replay.levels == [1, 32]
