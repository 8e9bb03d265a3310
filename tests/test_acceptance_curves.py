"""benchmarks/acceptance_curves.py: per-position acceptance pooled from the engines' counters."""

from __future__ import annotations

import json

import pytest

from tests._bench import benchmark

ac = benchmark("acceptance_curves.py", "acceptance_curves_bench")
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def row(drafts, per, ok=True, config=NGRAM):
    return {"ok": ok, "config": config, "spec_delta": {"drafts": drafts, "accepted_per_position": per}}


def test_starts_are_pooled_by_counts_not_by_averaging_their_rates():
    rows = [row(100, [80, 40, 4]), row(300, [120, 60, 30]),
            row(50, [50, 50, 50], ok=False),  # a failed start
            row(10, [0, 0, 0], config=None)]  # no speculation
    (name, c), = ac.curves(rows).items()
    assert "ngram K=3" in name and c["starts"] == 2 and c["drafts"] == 400
    assert c["rates"] == pytest.approx([0.5, 0.25, 34 / 400])  # not the mean of 0.8 and 0.4
    assert c["conditional"] == pytest.approx([0.5, 0.5, 0.34])
    assert c["acceptance_length"] == pytest.approx(1 + 0.5 + 0.25 + 0.085)


def test_a_position_after_one_that_is_almost_never_accepted_has_no_conditional_rate():
    (_, c), = ac.curves([row(100, [3, 1, 0])]).items()
    assert c["conditional"][0] == pytest.approx(0.03) and c["conditional"][1:] == [None, None]


def test_the_script_writes_its_table_and_json(tmp_path, capsys):
    grid = tmp_path / "grid-x.jsonl"
    grid.write_text("\n".join(json.dumps(r) for r in [row(100, [80, 40, 4]), row(100, [60, 20, 0])]) + "\n")
    out = tmp_path / "curves.json"
    assert ac.main([str(grid), "--out", str(out), "--png", str(tmp_path / "c.png")]) == 0
    data = json.loads(out.read_text())
    assert data["grid-x.jsonl"][next(iter(data["grid-x.jsonl"]))]["rates"] == pytest.approx([0.7, 0.3, 0.02])
    assert "0.70, 0.30, 0.02" in capsys.readouterr().out
