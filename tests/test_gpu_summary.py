"""The H200 report's verdict table (benchmarks/gpu/summarize.py) on the stored rows of both GPU
rounds: a study that targeted one concurrency is judged at that level, closed-loop trials count."""

from __future__ import annotations

import re
from pathlib import Path
from _bench import benchmark

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _summarize():
    return benchmark("gpu/summarize.py", "h200_summarize")


def _files() -> list[str]:
    return [str(p) for p in sorted(RESULTS.glob("h200-trials-*.jsonl")) + sorted(RESULTS.glob("h200-points-*.jsonl"))]


def test_closed_loop_study_trials_become_one_level():
    rows = [r for r in _summarize().rows_of(_files()) if r["workload"] == "chat-h200-c1"]
    assert {r["key"] for r in rows} >= {"none"} and len(rows) == 4      # 5 trials, one interrupted
    assert all(set(r["levels"]) == {1} for r in rows)
    base = next(r for r in rows if r["key"] == "none")
    assert 4.5 < base["levels"][1]["tpot"] < 6 and base["levels"][1]["al"] is None


def test_verdict_judges_each_level_by_the_study_that_targeted_it(capsys):
    recs = [str(p) for p in sorted(RESULTS.glob("h200-recommendation-*.json"))]
    assert _summarize().main([*_files(), "--recommendations", *recs, "--target", "chat-h200-c1=chat-h200@1"]) == 0
    out = capsys.readouterr().out
    verdict = {m.group(1, 2): m.group(0) for m in re.finditer(r"^(\S+) c=(\d+): .*$", out, re.M)}
    assert set(verdict) == {("chat-h200", "1"), ("chat-h200", "32"), ("code-h200", "1"), ("code-h200", "32")}
    assert "recommended by chat-h200-c1 (change) ngram K=8" in verdict["chat-h200", "1"]
    assert "recommended by chat-h200 (keep) none" in verdict["chat-h200", "32"]
    for line in verdict.values():   # every recommendation within 5% of the best measured point
        gap = float(re.search(r"([+-]\d+\.\d)% vs measured best", line).group(1))
        assert 0.0 <= gap <= 5.0, line
    # the band with k=0 is an experiment (labelled), never a grid point
    assert "band-k0 (chat-h200): ngram K=8 bands 1-5:8,6-32:0" in out
    assert "| ngram K=8 bands 1-5:8,6-32:0 |" not in out
