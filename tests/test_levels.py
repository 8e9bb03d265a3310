"""Per-level evidence of a profile study, on the trials of the H200 studies as they were stored
(benchmarks/results/h200-trials-2026-11-30.jsonl) and on constructed trials."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import optuna
import pytest

from autotune.cli._main import _per_level_lines
from autotune.search import study_record
from autotune.search._levels import level_evidence
from autotune.search._space import NONE, canonical
from autotune.search._study import Study

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "benchmarks" / "results" / "h200-trials-2026-11-30.jsonl"
NGRAM8 = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
CODE_BANDS = {**NGRAM8, "num_speculative_tokens_per_batch_size": [[1, 5, 8], [6, 32, 6]]}


class _Study:
    """What level_evidence and Study.best read, over real FrozenTrials in memory."""

    trials, best, objective_of = Study.trials, Study.best, Study.objective_of
    spec = type("Spec", (), {"objective": type("Objective", (), {"statistic": "median"})()})()

    def __init__(self, frozen):
        self.study = optuna.create_study()
        for t in frozen:
            self.study.add_trial(t)


def _frozen(config, levels: dict, feasible: bool = True, stalled: bool = False):
    return optuna.trial.create_trial(
        value=1.0,
        user_attrs={"config": config, "config_key": canonical(config), "stalled": stalled,
                    "measurement": {"levels": levels}},
        constraints={"throughput_floor": -0.1 if feasible else 0.5},
    )


def _rows(workload: str) -> list[dict]:
    rows = [json.loads(line) for line in H200.read_text().splitlines()]
    return [r for r in rows if r["workload"] == workload and r["state"] == "COMPLETE"]


def _h200(workload: str) -> _Study:
    return _Study([_frozen(r["config"], r["levels"]) for r in _rows(workload)])


def _median(workload: str, config, level: str) -> float:
    """What a level's TPOT must be, computed here from the stored rows: the median of the
    config's in-window requests at that level (one start per config in these studies)."""
    (row,) = [r for r in _rows(workload) if r["config"] == config]
    return statistics.median(row["levels"][level]["tpot_ms"])


def _speculative(workload: str) -> list[dict]:
    return [r["config"] for r in _rows(workload) if r["config"]]


DOCS = (ROOT / "docs" / "notes" / "2026-11-30-h200-rounds-1-2.md").read_text()


def test_h200_chat_keep_says_that_concurrency_1_alone_would_speculate():
    """chat (alpha 0.35): the weighted study keeps no speculation, as ngram K=8 loses at 32 in
    flight; at 1 in flight it wins, which the file must say."""
    ev = level_evidence(study_record(_h200("chat-h200")), NONE, "median", 0.95)
    one, many = ev["levels"]["1"], ev["levels"]["32"]
    base1, base32 = _median("chat-h200", None, "1"), _median("chat-h200", None, "32")
    fastest1 = min(_speculative("chat-h200"), key=lambda c: _median("chat-h200", c, "1"))
    assert fastest1 == NGRAM8 and _median("chat-h200", NGRAM8, "1") < base1   # what the data says
    assert all(_median("chat-h200", c, "32") > base32 for c in _speculative("chat-h200"))
    assert one["weight"] == many["weight"] == 0.5
    assert one["baseline_tpot_ms"] == pytest.approx(base1)
    assert one["recommended"]["config_key"] == NONE and one["recommended"]["speedup"] == 1.0
    best1 = _median("chat-h200", NGRAM8, "1")
    assert one["best"]["config"] == NGRAM8 and one["best"]["tpot_ms"] == pytest.approx(best1)
    assert one["best"]["speedup"] == pytest.approx(base1 / best1)
    assert one["best"]["speedup_ci"][0] > 1.0 and one["best"]["vs_recommended_ci"][0] > 1.0
    assert many["best"]["config_key"] == NONE  # nothing beats no speculation at 32
    (advice,) = ev["advice"]
    assert advice.startswith(f"at concurrency 1 alone, ngram K=8 w=2-4 is {base1 / best1:.2f}x faster than the "
                             f"recommended none (95% CI")
    lines = _per_level_lines(ev)
    assert lines[0] == (f"c=1 (weight 0.50): none {base1:.2f} ms, best here ngram K=8 w=2-4 {best1:.2f} ms "
                        f"({base1 / best1:.2f}x)")
    assert lines[1] == f"c=32 (weight 0.50): none {base32:.2f} ms" and lines[2] == f"note: {advice}"
    # the H200 rounds 1-2 note quotes these lines
    assert f"    {lines[0]}\n    {lines[1]}\n" in DOCS


def test_h200_code_bands_are_best_at_1_and_near_best_at_32():
    ev = level_evidence(study_record(_h200("code-h200")), canonical(CODE_BANDS), "median", 0.95)
    one, many = ev["levels"]["1"], ev["levels"]["32"]
    tp = {lv: {canonical(c): _median("code-h200", c, lv) for c in _speculative("code-h200")} for lv in ("1", "32")}
    assert min(tp["1"], key=tp["1"].get) == canonical(CODE_BANDS)
    assert min(tp["32"], key=tp["32"].get) == canonical(NGRAM8)
    assert one["recommended"]["config"] == CODE_BANDS and one["best"]["config"] == CODE_BANDS
    assert one["recommended"]["speedup"] == pytest.approx(_median("code-h200", None, "1") / tp["1"][canonical(CODE_BANDS)])
    # at 32 plain ngram K=8 is faster than the bands, on 7 and 3 in-window requests
    assert [len(r["levels"]["32"]["tpot_ms"]) for c in (NGRAM8, CODE_BANDS)
            for r in _rows("code-h200") if r["config"] == c] == [7, 3]
    assert many["best"]["config"] == NGRAM8
    assert many["best"]["vs_recommended"] == pytest.approx(tp["32"][canonical(CODE_BANDS)] / tp["32"][canonical(NGRAM8)])
    assert many["recommended"]["speedup"] == pytest.approx(_median("code-h200", None, "32") / tp["32"][canonical(CODE_BANDS)])
    lo, hi = many["best"]["vs_recommended_ci"]
    assert lo <= many["best"]["vs_recommended"] <= hi
    assert ev["advice"] == ([] if lo <= 1.0 else ev["advice"]) and all("concurrency 32" in a for a in ev["advice"])


def _tp(center: float, n: int = 24) -> list[float]:
    return [center + 0.01 * ((i * 7) % 5) for i in range(n)]


def test_infeasible_and_stalled_trials_do_not_count_and_a_study_without_levels_has_none():
    suffix = {"method": "suffix", "num_speculative_tokens": 8}
    base = _frozen(None, {"1": {"weight": 0.3, "tpot_ms": _tp(5.0)}, "8": {"weight": 0.7, "tpot_ms": _tp(8.0)}})
    st = _Study([
        base,
        _frozen(NGRAM8, {"1": {"tpot_ms": _tp(3.0)}, "8": {"tpot_ms": _tp(7.0)}}),
        _frozen(suffix, {"1": {"tpot_ms": _tp(1.0)}, "8": {"tpot_ms": _tp(1.0)}}, feasible=False),
        _frozen(NGRAM8, {"1": {"tpot_ms": _tp(0.5)}, "8": {"tpot_ms": _tp(0.5)}}, stalled=True),
    ])
    ev = level_evidence(study_record(st), canonical(NGRAM8), "median", 0.95)
    assert [ev["levels"][L]["best"]["config"] for L in ("1", "8")] == [NGRAM8, NGRAM8]
    assert ev["levels"]["1"]["best"]["server_starts"] == 1
    assert ev["levels"]["1"]["best"]["tpot_ms"] == pytest.approx(statistics.median(_tp(3.0)))
    assert ev["levels"]["8"]["weight"] == 0.7 and ev["advice"] == []
    assert ev["levels"]["1"]["recommended"]["speedup"] == pytest.approx(5.0 / 3.0, rel=0.01)
    no_levels = _Study([_frozen(None, {}), _frozen(NGRAM8, {})])
    assert level_evidence(study_record(no_levels), canonical(NGRAM8), "median", 0.95) is None
    assert _per_level_lines(None) == []


def test_best_ranks_resumed_trials_by_todays_objective_not_their_stored_value():
    """The H200 code study's trials kept the values of the pooled objective (bands 2.30 ms, plain
    ngram K=8 2.54 ms); resumed today, the best is the one the per-level objective prefers."""
    rows = [json.loads(line) for line in H200.read_text().splitlines()]
    rows = [r for r in rows if r["workload"] == "code-h200" and r["state"] == "COMPLETE"]
    study = _Study([optuna.trial.create_trial(
        value=r["value"], constraints={"throughput_floor": -0.1},
        user_attrs={"config": r["config"], "config_key": r["config_key"],
                    "measurement": {"levels": r["levels"], "tpot_ms": [1.0]}}) for r in rows])
    stored = min((t for t in study.trials() if t.user_attrs["config_key"] != NONE), key=lambda t: t.value)
    assert stored.user_attrs["config"] == CODE_BANDS                       # what the stored values say
    best = study.best()
    assert best.user_attrs["config"] == NGRAM8                              # what the objective says

    def weighted(config) -> float:  # sum over levels of weight x median, from the stored rows
        (row,) = [r for r in rows if r["config"] == config]
        return sum(d["weight"] * statistics.median(d["tpot_ms"]) for d in row["levels"].values())

    assert study.objective_of(best) == pytest.approx(weighted(NGRAM8))
    assert study.objective_of(stored) == pytest.approx(weighted(CODE_BANDS))
    assert weighted(NGRAM8) < weighted(CODE_BANDS) and stored.value < best.value
    # the H200 rounds 1-2 note's table of the re-decided studies
    assert f"| code | ngram K=8 | **{weighted(NGRAM8):.2f} ms** |" in DOCS
    assert f"| code | ngram K=8, bands 1-5:8, 6-32:6 | {weighted(CODE_BANDS):.2f} ms |" in DOCS
