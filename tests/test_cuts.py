"""Start-up cuts (``core._cuts``): one measured to move TPOT is refused where a spec measures
production's engine, with what was measured; ``benchmarks/gpu/cuts_ab.py`` reads the mirrored
starts that decide a cut's verdict."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune.core import _cuts
from autotune.core._spec import load_spec

from test_spec import VALID, _line, _spec_error, _write

ROOT = Path(__file__).resolve().parent.parent
ROWS = ROOT / "benchmarks" / "results" / "h100-smollm2-cuts-ab-points-2026-12-07.jsonl.gz"
FORK = "engine:\n  env:\n    VLLM_WORKER_MULTIPROC_METHOD: fork\n"


def test_a_cut_that_moved_tpot_is_refused_by_file_line_and_field(tmp_path):
    text = VALID + FORK
    p = _write(tmp_path, text)
    msg = _spec_error(p)
    assert f"{p}:{_line(text, 'VLLM_WORKER_MULTIPROC_METHOD')}: field 'engine.env.VLLM_WORKER_MULTIPROC_METHOD'" in msg
    assert "fork_engine_core" in msg and "measured to move TPOT: ngram K=10 47% slower" in msg
    assert "production_equivalent: false" in msg  # what to do where the setup is deliberate


def test_a_benchmark_spec_may_measure_the_cut_again_and_other_methods_pass(tmp_path):
    spec = load_spec(_write(tmp_path, VALID + FORK + "production_equivalent: false\n"))
    assert spec.engine.env == {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    spawn = load_spec(_write(tmp_path, VALID + "engine:\n  env:\n    VLLM_WORKER_MULTIPROC_METHOD: spawn\n"))
    assert spawn.engine.env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert load_spec(ROOT / "benchmarks" / "gpu" / "code-smollm2-night-fast.yaml").production_equivalent is False


def test_every_registered_cut_says_what_it_saves_and_what_it_did_to_tpot():
    assert _cuts.CUTS
    for name, cut in _cuts.CUTS.items():
        assert cut.name == name and (cut.env or cut.spec_field) and cut.why
        for verdict in (cut.moves_tpot, cut.unsettled):
            if verdict:  # a refuted or open cut names the rows it was measured by
                assert "benchmarks/results/" in verdict
                assert (ROOT / verdict.split("(")[-1].rstrip(")")).exists()
    assert _cuts.refuted_in({}) is None


def test_an_open_cut_is_allowed_and_said_where_it_is_used(monkeypatch):
    # the preload cut passed (eight pairs on two hosts): a study using it says nothing more
    assert _cuts.unsettled_note("engine.preload") is None and not _cuts.CUTS["preload_api_process"].moves_tpot
    assert load_spec(ROOT / "benchmarks" / "gpu" / "code-smollm2-night-preload.yaml").engine.preload is True
    # a cut whose figure is still open is allowed and said where a spec field makes it
    monkeypatch.setitem(_cuts.CUTS, "open_one", _cuts.StartCut(name="open_one", env={}, spec_field="engine.x",
                                                              why="saves 5 s", moves_tpot=None,
                                                              unsettled="level 16 +13.5% (4 pairs)"))
    note = _cuts.unsettled_note("engine.x")
    assert note.startswith("engine.x: the start-up cut open_one (saves 5 s)") and "not yet shown harmless" in note
    assert "level 16 +13.5%" in note and _cuts.unsettled_note("engine.env") is None


def test_cuts_ab_pools_hosts_with_pairs_formed_within_each():
    """The preload verdict: each host's rows a file; pairs never cross hosts, the noise is each host's
    default starts about their own mean, pooled."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import cuts_ab

    files = [ROOT / "benchmarks" / "results" / f for f in ("h100-smollm2-preload-ab-points-2026-12-07.jsonl.gz",
                                                          "h100-smollm2-preload-ab-k10-points-2026-12-07-r2.jsonl.gz")]
    before = cuts_ab.CUT_WORKLOAD
    cuts_ab.CUT_WORKLOAD = "code-smollm2-night-preload"
    try:
        hosts = [[r for r in cuts_ab.rows_of(str(f)) if r.get("label") == cuts_ab.LABEL and r.get("ok")] for f in files]
        effect = cuts_ab.tpot_effect(*hosts)
        k10 = next(v for k, v in effect.items() if k != "none")
        assert {f: d["n"] for f, d in k10.items()} == {"objective": 8, "level 2": 8, "level 16": 8}
        # every effect within its noise: the verdict the registry states
        assert all(d["within_noise"] and d["lo"] < 0 < d["hi"] for d in k10.values())
    finally:
        cuts_ab.CUT_WORKLOAD = before


def test_cuts_ab_reads_the_mirrored_starts_into_an_effect_against_the_noise():
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import cuts_ab

    rows = [r for r in cuts_ab.rows_of(str(ROWS)) if r.get("label") == cuts_ab.LABEL and r.get("ok")]
    pairs = cuts_ab.pairs(rows)
    assert len(pairs) == 4 and all(cuts_ab.arm(d) == "default" and cuts_ab.arm(c) == "cut" for d, c in pairs)
    assert all(d["config_key"] == c["config_key"] for d, c in pairs)
    effect = cuts_ab.tpot_effect(rows)
    k10 = next(v for k, v in effect.items() if k != "none")["objective"]
    assert k10["n"] == 2 and k10["lo"] > k10["start_noise"] > 0 and not k10["interval_within_noise"]
    start = cuts_ab.start_effect(rows)
    assert start["saved_s"]["mean"] == pytest.approx(start["default"]["to_healthy"] - start["cut"]["to_healthy"])
    assert start["default"]["phases"]["engine_setup"] > 3 * start["cut"]["phases"]["engine_setup"]
