"""benchmarks/grid_by_kind.py: a grid's per-request TPOTs split by kind of request."""

from __future__ import annotations

import pytest

from _bench import benchmark


def test_split_by_kind_and_each_statistic_over_starts():
    bench = benchmark("grid_by_kind.py", "bench_grid_by_kind")
    kinds = ["code edit", "chat", "chat"]
    k8 = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    rows = [{"ok": True, "config": None, "tpot_ms": [30.0, 30.0, 33.0]},
            {"ok": True, "config": None, "tpot_ms": [28.0, 31.0, 31.0]},
            {"ok": True, "config": k8, "tpot_ms": [10.0, 31.0, 32.0]},
            {"ok": True, "config": k8, "tpot_ms": [12.0, 29.0, 30.0]},
            {"ok": True, "config": k8, "tpot_ms": [11.0, 30.0]},        # another request count: left out
            {"ok": False, "config": k8, "tpot_ms": [1.0, 1.0, 1.0]}]     # a failed start: left out
    res = bench.by_kind(rows, kinds)
    none, k = res["none"], res["ngram K=8 w=2-4"]
    assert none["starts"] == 2 and k["starts"] == 2
    assert k["code edit"] == pytest.approx(11.0) and k["chat"] == pytest.approx(30.5)  # medians of 31.5, 29.5
    assert none["code edit"] == pytest.approx(29.0)
    # the median falls among the majority (chat) and hides the code edit's gain; the mean shows it
    assert k["median"] == pytest.approx(30.0) and none["median"] == pytest.approx(30.5)
    assert none["mean"] == pytest.approx(30.5) and k["mean"] == pytest.approx(24.0)
