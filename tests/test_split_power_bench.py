"""The GPU night's split against its old four-round reserve on decisions.py's simulated nights
(``benchmarks/split_power.py``): both reserves run, each cell a row, and the study's own reserve is
back where the simulated night reads it afterwards."""

from __future__ import annotations

from _bench import benchmark

sp = benchmark("split_power.py", "split_power_bench")


def test_both_reserves_run_every_cell(capsys):
    from autotune.search import _budget, _study

    assert sp.main(["--nights", "2"]) == 0
    rows = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| four rounds") or
            x.startswith("| confirm_reserve")]
    assert len(rows) == 12 and sum(r.startswith("| four rounds (8)") for r in rows) == 6
    assert _study.confirm_reserve is _budget.confirm_reserve
