"""The offline search benchmark (``benchmarks/search.py``) on a tiny synthetic grid."""

from __future__ import annotations

import json
import random

import pytest

from _synthetic import Workload, ngram
from autotune.search._predict import canonical
from _bench import benchmark



@pytest.fixture(scope="module")
def bench():
    return benchmark("search.py", "search_bench")


def synthetic_grid(bench, starts=3):
    w = Workload(rates=[0.9 * 0.75 ** i for i in range(8)], noise=0.02)
    rng = random.Random(1)
    configs = [None] + [ngram(k) for k in range(1, 9)]
    obs = {canonical(c): [w.observe(c, rng) for _ in range(starts)] for c in configs}
    return bench.Grid(name="syn", source="test", configs=configs, starts=obs, level=4), w


def test_simulated_searches(bench):
    grid, w = synthetic_grid(bench)
    assert grid.best_key == min((canonical(ngram(k)) for k in range(1, 9)), key=grid.truth.get)
    r = bench.evaluate(grid, seeds=6)
    s = r["strategies"]
    assert s["grid"]["mean_starts"] == 9
    assert s["ours"]["mean_starts"] <= 5 and s["ours"]["failed"] == 0
    assert s["ours"]["mean_starts_at_stop"] <= 6 and s["ours"]["pick_within_3pct"] == 1.0
    for name in ("tpe", "random", "before"):
        assert 1 <= s[name]["mean_starts"] <= 9
    e = r["predictor_error"]
    assert e["one_shot"]["configs"] and e["one_shot"]["mape"] < 0.5
    json.dumps(r)  # the results file is plain JSON


def test_reach_counts_starts_until_the_incumbent_is_good(bench):
    grid, _ = synthetic_grid(bench)
    tr = bench.Trace()
    worst = max(grid.truth, key=grid.truth.get)
    for key in ("none", worst, grid.best_key):
        tr.keys.append(key)
        tr.values.append(grid.truth[key])
    assert tr.reach(grid) == 3
    assert bench.Trace(keys=["none"], values=[1.0]).reach(grid) is None


def test_docs_section_is_replaced_and_others_kept(bench, tmp_path, monkeypatch):
    grid, _ = synthetic_grid(bench, starts=2)
    r = bench.evaluate(grid, seeds=2)
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\n## Replay fidelity\n\nkeep me\n\n" + bench.SECTION + "\n\nold table\n\n"
                    "## Other\n\nkeep me too\n")
    monkeypatch.setattr(bench, "DOCS", docs)
    bench.write_docs([r], 2)
    text = docs.read_text()
    assert "keep me\n" in text and "keep me too" in text and "old table" not in text
    assert text.count(bench.SECTION) == 1 and "| syn | 9 |" in text
    bench.write_docs([r], 2)
    assert docs.read_text() == text
