"""Studies on workloads whose right answer is not obvious, checked against measured grids.

The grids (benchmarks/results/grid-<workload>.jsonl, recorded by benchmarks/grid.py with several
server starts per configuration) are the ground truth. A study passes when its recommendation's
grid TPOT is within the grid's own noise of the grid's best.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.search._space import NONE, canonical
from _bench import benchmark

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parent.parent


def _grid_module():
    return benchmark("grid.py", "bench_grid")


def grid(workload: str) -> list[dict]:
    g = _grid_module()
    return g.summarize(g.load_rows(ROOT / "benchmarks" / "results" / f"grid-{workload}.jsonl"))


def noise(entry: dict) -> float:
    """Relative start-to-start spread of one grid configuration (at least 5%)."""
    spread = (max(entry["per_start"]) - min(entry["per_start"])) / entry["tpot_ms"]
    return max(0.05, spread)


def grid_point(g: list[dict], config: dict | None) -> tuple[float, float]:
    """(grid TPOT, noise) of a configuration. A K the grid skipped (ngram-mid measures K 1-4, 6
    and 8; a study may pick 5 or 7) gets the mean of its measured neighbours at that K's two
    sides and the larger of their noises: TPOT moves smoothly with K between them."""
    key = canonical(config)
    hit = next((e for e in g if e["config_key"] == key), None)
    if hit is not None:
        return hit["tpot_ms"], noise(hit)
    k = config["num_speculative_tokens"]
    same = [e for e in g if e["config"] and {**e["config"], "num_speculative_tokens": k} == config]
    below = [e for e in same if e["config"]["num_speculative_tokens"] < k]
    above = [e for e in same if e["config"]["num_speculative_tokens"] > k]
    assert below and above, f"{key} is outside the grid"
    lo = max(below, key=lambda e: e["config"]["num_speculative_tokens"])
    hi = min(above, key=lambda e: e["config"]["num_speculative_tokens"])
    return (lo["tpot_ms"] + hi["tpot_ms"]) / 2, max(noise(lo), noise(hi))


def measured(tmp_path: Path) -> list[dict]:
    """The configurations the study measured to completion (``None``: no speculation)."""
    import optuna

    url = f"sqlite:///{tmp_path / 'study.db'}"
    (summary,) = optuna.get_all_study_summaries(url)
    return [t.user_attrs["config"] for t in optuna.load_study(study_name=summary.study_name, storage=url).get_trials()
            if t.state.name == "COMPLETE"]


def run_study(spec: Path, tmp_path: Path) -> dict:
    env = {**os.environ, "AUTOTUNE__HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "autotune", "study", "start", "--workload", spec.stem,
                           "--spec", str(spec)], capture_output=True, text=True, env=env, timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((tmp_path / "recommendations" / f"{spec.stem}.json").read_text())


def test_ngram_mid_study_searches_below_k_max_and_picks_within_the_grids_noise(make_spec, tmp_path):
    """ngram-mid's measured best is a middle K (K=4), and K=8, the edge a search that stops at
    K_max would keep, is 6% slower there: less than one start on these machines can tell (CV
    about 10%, docs/notes/2026-12-01-smollm2-vllm-cpu.md). So the test asks what a search can be held to: it measures a
    middle K (a search that stops at the edge never does), and its pick is within the grid's noise
    of the best. A study that measured the middle may still keep K=8 when K=8's start ran fast;
    requiring 1 < K < 8 of the pick asserts the machine's timing, and failed in CI.

    The pick is the search's (``evidence.winner``), with no confirmation rounds: whether two or
    three rounds settle the decision is the noise of the host that day (a 2.15x gain on 2 vs 2
    starts, 1 df, stayed inconclusive in CI, as the rule says it must), and the decision on
    confirmation rounds has tests of its own (test_study_vllm.py, test_recommend.py)."""
    g = grid("ngram-mid")
    best = g[0]
    # the workload is only worth testing while its measured answer is a middle K
    assert best["config"] and 1 < best["config"]["num_speculative_tokens"] < 8, best
    # four search starts, no confirmation: an unconfirmed pick is kept as "not confirmed"
    spec = make_spec("benchmarks/workloads/ngram-mid.yaml", budget__max_trials=4,
                     budget__max_server_starts=4, objective__confirm_starts=0)
    rec = run_study(spec, tmp_path)
    ev = rec["evidence"]
    assert rec["decision"] == "keep" and ev["keep_reason"] == "not confirmed", rec["reason"]
    assert rec["speculative_config"] is None and "objective.confirm_starts is 0" in rec["reason"]
    conf = ev["winner"]["config"]
    assert conf["method"] == "ngram" and conf["num_speculative_tokens"] > 1, conf
    done = measured(tmp_path)
    middle = [c for c in done if c and 1 < c["num_speculative_tokens"] < 8]
    assert middle, f"the search measured no middle K: {done}"
    tpot, chosen_noise = grid_point(g, conf)
    assert tpot <= best["tpot_ms"] * (1 + noise(best) + chosen_noise), (conf, tpot, best)
    assert rec["study"]["server_starts"] == 4


def test_nospec_study_keeps_no_speculation(make_spec, tmp_path):
    g = grid("nospec")
    assert g[0]["config_key"] == NONE, g[0]
    spec = make_spec("benchmarks/workloads/nospec.yaml", space__k={"min": 1, "max": 4},
                     budget__max_trials=2, budget__max_server_starts=4, objective__confirm_starts=1)
    rec = run_study(spec, tmp_path)
    assert rec["decision"] in ("keep", "disable"), rec["reason"]
    assert rec["speculative_config"] is None
    # kept because speculation measured no faster, not because no speculative trial completed
    spec_measured = [c for c in measured(tmp_path) if c]
    assert spec_measured, "no speculative configuration was measured"
    ev = rec["evidence"]
    if "winner" in ev:  # a candidate passed the guards and is not faster
        assert ev["winner"]["config"] in spec_measured and ev["speedup_ci"][0] <= 1.0, ev
    else:  # every measured candidate was refused by a guard (e.g. the throughput floor)
        assert ev["keep_reason"] == "no candidate" and "passed the guards" in rec["reason"], ev
