"""One stall truth per start and the noise each trial reports (``search._trial`` and the study's
``_record``): a start is ``stalled`` exactly when its TPOT figure is biased by TTFT stalls, and
every reader (summary, trial attribute, decision) says the same."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from autotune.cli._main import main
from autotune.search import _study
from autotune.search._trial import noise_text, stall_verdict, within_start_noise
from _synthetic import Workload
from autotune.engines._probe import Capabilities
from autotune.search._space import SearchSpace
from test_search_study import FIELDS, RATES, fake_measure, make_spec


def _summary(stalled: bool) -> dict:
    return {"stall": {"stalled": stalled, "reason": "8 of 24 requests over 2.5x the p25 TTFT"},
            "levels": {"1": {"stall": {"stalled": stalled}}, "8": {"stall": None}}}


@pytest.mark.parametrize("source,biased", [("client", True), ("server", False), ("mixed", False)])
def test_a_ttft_stall_marks_a_start_stalled_only_when_its_tpot_is_client_side(source, biased):
    s = stall_verdict(_summary(True), source)
    assert s["stall"]["ttft_stalled"] is True and s["stall"]["stalled"] is biased
    assert s["levels"]["1"]["stall"]["stalled"] is biased and s["levels"]["8"]["stall"] is None
    assert stall_verdict(s, "client")["stall"]["stalled"] is biased  # applied once: a second call changes nothing
    assert stall_verdict(_summary(False), source)["stall"]["stalled"] is False


def test_within_start_noise_is_the_per_request_spread_and_the_medians_precision():
    n = within_start_noise([9.0, 10.0, 11.0, 10.0])
    sd = (2 / 3) ** 0.5
    assert n["n"] == 4 and n["cv"] == pytest.approx(sd / 10)
    assert n["median_se_rel"] == pytest.approx(1.2533 * sd / 10 / 2)
    assert within_start_noise([10.0]) is None


def test_trials_carry_one_stall_flag_and_both_noises(tmp_path, monkeypatch):
    """The engine's TPOT with TTFT stalls: the trial is not stalled and its summary agrees; each
    trial says its within-start noise and the start-to-start noise known when it was recorded."""
    w = Workload(rates=RATES)
    inner = fake_measure(w)

    def measure(*a, **kw):
        m = inner(*a, **kw)
        m.summary["stall"] = {"stalled": True, "reason": "TTFT stalls"}
        m.summary["noise"] = within_start_noise(m.tpot_ms)
        return m

    spec = make_spec(tmp_path, budget={"max_trials": 3, "max_server_starts": 5, "max_wall_minutes": 10})
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=FIELDS, arctic_inference=False)
    monkeypatch.setattr(_study, "measure", measure)
    study = _study.Study(spec, caps, SearchSpace.build(spec.space, caps), spec.storage, ["vllm", "serve"],
                         tmp_path / "home")
    study.run()
    ts = study.trials()
    for t in ts:
        m = t.user_attrs["measurement"]
        assert t.user_attrs["stalled"] is False and m["summary"]["stall"]["stalled"] is False
        assert m["summary"]["stall"]["ttft_stalled"] is True
        assert t.user_attrs["noise"]["start_to_start"]["config_starts"] >= 1
    base = [t for t in ts if t.user_attrs["config_key"] == "none"]
    assert len(base) == 2  # baseline and its confirmation start: a repeat, so a start-to-start figure
    last = base[-1].user_attrs["noise"]["start_to_start"]
    assert last["config_starts"] == 2 and last["config_sd_log"] > 0 and last["study_df"] >= 1
    assert base[0].user_attrs["noise"]["start_to_start"]["config_sd_log"] is None  # one start: unknown
    # the one line `study show` and the report print: the start's precision beside the starts' scatter
    se = base[-1].user_attrs["measurement"]["summary"]["noise"]["median_se_rel"]
    assert noise_text(base[-1].user_attrs) == (f"+-{se:.1%} within the start; "
                                               f"{last['config_sd_log']:.1%} between its 2 starts")
    first = noise_text(ts[0].user_attrs)
    assert "within the start" in first and "between" not in first  # nothing repeated yet
    monkeypatch.setenv("AUTOTUNE__STUDIES_DIR", str(tmp_path))
    out = CliRunner().invoke(main, ["study", "show", "syn", "--study-name", study.name], catch_exceptions=False).output
    assert out.count("within the start") == len(ts) and f"{last['config_sd_log']:.1%} between its 2 starts" in out


def test_a_profile_starts_noise_is_taken_level_by_level():
    """Levels 2 ms and 6 ms apart: one spread over the pooled list would report the levels'
    distance as noise; per level each is 4%, and the objective's precision weighs them."""
    from autotune.search._trial import profile_noise

    lv1, lv32 = [1.9, 2.0, 2.1, 2.0], [5.7, 6.0, 6.3, 6.0]
    assert within_start_noise(lv1 + lv32)["cv"] > 0.5
    levels = {"1": {"weight": 0.5, "tpot": 2.0, "tpot_ms": lv1}, "32": {"weight": 0.5, "tpot": 6.0, "tpot_ms": lv32},
              "8": {"weight": 0.0, "tpot": None, "tpot_ms": []}}
    n = profile_noise(levels)
    assert n["levels"]["1"]["cv"] == pytest.approx(n["levels"]["32"]["cv"]) == pytest.approx(0.0408, abs=1e-3)
    assert n["levels"]["8"] is None and n["n"] == 8
    se = n["levels"]["1"]["median_se_rel"]
    assert n["median_se_rel"] == pytest.approx(se * (1 + 9) ** 0.5 / 4)  # (1*se, 3*se) in quadrature over 4
    assert profile_noise({"1": {"weight": 1.0, "tpot": None, "tpot_ms": [2.0]}}) is None
