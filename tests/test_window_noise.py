"""``benchmarks/gpu/window_noise.py``: the start-to-start noise split into a part each start
carries for its whole life and a part that moves from one steady window to the next."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from _bench import benchmark

ROWS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "h200-points-2026-12-05-r15.jsonl"


@pytest.fixture(scope="module")
def wn():
    return benchmark("gpu/window_noise.py", "window_noise_bench")


def groups(rng, starts, windows, between, within):
    out = []
    for _ in range(starts):
        b = rng.gauss(0, between)
        out.append([b + rng.gauss(0, within) for _ in range(windows)])
    return out


def test_components_recover_a_known_split(wn):
    d = wn.components(groups(random.Random(3), 60, 8, between=0.06, within=0.05))
    assert d["within"] == pytest.approx(0.05, rel=0.1)
    assert d["between"] == pytest.approx(0.06, rel=0.25)
    assert d["p"] < 1e-6 and d["within_df"] == 60 * 7 and d["between_df"] == 59
    one = math.hypot(d["between"], d["within"])
    assert d["per_start_sd"]["1"] == pytest.approx(one)
    assert d["per_start_sd"]["4"] == pytest.approx(math.hypot(d["between"], d["within"] / 2))
    assert d["scale"]["inf"] == pytest.approx(d["between"] / one) and d["scale"]["8"] < d["scale"]["4"] < 1


def test_starts_that_differ_only_by_their_windows_have_no_between_part(wn):
    d = wn.components(groups(random.Random(4), 60, 8, between=0.0, within=0.05))
    assert d["between"] < 0.01 and d["p"] > 0.01
    assert d["scale"]["8"] == pytest.approx(math.sqrt(1 / 8), rel=0.35)


def test_round_15_rows_starts_differ_beyond_their_windows_at_both_levels(wn):
    """The committed H200 rows behind docs/notes/2026-12-05-h200-round-15.md: 8 starts of one configuration,
    54 windows; window-to-window and start-to-start parts of 4-8% each, the latter significant."""
    res = wn.analyse([json.loads(ln) for ln in ROWS.read_text().splitlines() if ln.strip()])
    assert res["rows"] == 8 and set(res["levels"]) == {"1", "32"}
    for d in res["levels"].values():
        assert d["windows"] == 54 and d["p"] < 1e-4
        assert 0.04 < d["within"] < 0.07 and 0.04 < d["between"] < 0.08
        assert len(d["start_means_ms"]["free"]) == len(d["start_means_ms"]["pinned"]) == 4
        wi = d["window_index"]  # the six 8-window starts; window i ran the same prompts in each
        assert wi["starts"] == 6 and wi["windows"] == 8 and wi["residual_df"] == 35
        assert wi["residual_sd"] < d["within"] + 1e-9 and math.prod(wi["effects"]) == pytest.approx(1, abs=1e-3)
    assert res["levels"]["1"]["window_index"]["p"] < 0.05 < res["levels"]["32"]["window_index"]["p"]


def test_index_effects_find_a_window_that_is_slow_in_every_start(wn):
    rng = random.Random(5)
    g = groups(rng, 8, 6, between=0.05, within=0.01)
    for row in g:
        row[2] += math.log(1.1)
    wi = wn.index_effects(g)
    assert wi["effects"][2] == pytest.approx(1.1 / 1.1 ** (1 / 6), rel=0.02) and wi["p"] < 1e-6
    assert wi["residual_sd"] == pytest.approx(0.01, rel=0.3)
    assert wn.index_effects([[0.0, 0.1], [0.1, 0.0]]) is None


def test_the_products_own_windows_read_like_the_harness(wn):
    """Rows of ``replay.windows`` (the trial's ``summary.windows``; benchmarks/grid.py copies it to
    the row) analyse like the harness's: per level for a profile, at the row's concurrency else."""
    prof = {"ok": True, "config_key": "k", "summary": {"windows": {
        "n": 2, "objective_ms": [3.0, 3.3], "levels": {"1": [2.0, 2.2], "32": [6.0, 6.6]}}}}
    assert wn.windows_of(prof) == [{"levels": {"1": {"tpot": 2.0}, "32": {"tpot": 6.0}}},
                                   {"levels": {"1": {"tpot": 2.2}, "32": {"tpot": 6.6}}}]
    rng = random.Random(6)
    rows = [{"ok": True, "config_key": "k", "concurrency": 4,
             "windows": {"n": 3, "objective_ms": [math.exp(x) for x in g]}}
            for g in groups(rng, 40, 3, between=0.0, within=0.08)]
    res = wn.analyse(rows + [{"ok": True, "config_key": "k", "concurrency": 4, "windows": None}])
    assert res["rows"] == 40 and list(res["levels"]) == ["4"]
    d = res["levels"]["4"]
    assert d["windows"] == 120 and d["within"] == pytest.approx(0.08, rel=0.2) and d["corr_sm_clock"] is None
    assert "| c=4 | 40 (120) |" in wn.table(res)
