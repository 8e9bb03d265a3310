"""Fidelity gate: the incumbent's replay against production's figures (saved real expositions).

Production is one server's window of code traffic (``before.prom`` -> ``after_code.prom``); the
replay that must match it is ANOTHER server start on other code requests of the same workload
(``replay_*``, captured by ``tests/data/telemetry/capture.py``); the replay that must not match
is the same server's window of chat traffic.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.core._spec import FidelityTolerances, ProductionSpec
from autotune.engines import _metrics
from autotune.search import StudyRecord, TrialRecord, study_record
from autotune.trust import _gate
from autotune.trust import _telemetry as tel

DATA = Path(__file__).parent / "data" / "telemetry"
TOL = FidelityTolerances().model_dump()
REPLAY_CODE = ("replay_before.prom", "replay_after_code.prom", "replay_code_requests.json")
# The two code windows come from server starts at different times and host loads (mean TPOT
# 1.61 ms and 0.44 ms per token): timings are reported, not judged, in the tests that need the
# replay to match; the counters, which greedy decoding makes deterministic, must agree.
TIMINGS_NOT_JUDGED = {"tpot_p50": None, "tpot_p90": None, "tpot_mean": None, "itl_mean": None}
PROD_CHAT = ("after_code.prom", "after_chat.prom", "chat_requests.json")


def window(before: str, after: str) -> tuple[tel.Exposition, tel.Exposition]:
    return tel.parse((DATA / before).read_text()), tel.parse((DATA / after).read_text())


def measurement(before: str, after: str, requests: str) -> dict:
    """A trial's measurement as the study keeps it, made from a real window of one server."""
    b, a = window(before, after)
    req = json.loads((DATA / requests).read_text())
    return {"spec_delta": _metrics.delta(b.snapshot, a.snapshot).to_dict(), "tpot_ms": req["tpot_ms"],
            "summary": {"ok": req["ok"], "failed": 0}}


@pytest.fixture(scope="module")
def prod() -> dict:
    return tel.derive(*window("before.prom", "after_code.prom"))


def test_replay_on_another_server_of_the_same_traffic_matches_production(prod):
    """Greedy decoding on the loop model accepts every draft of code traffic, on any server
    start and any code request: the counters agree exactly; the timings within tolerance."""
    p = _gate.production_figures(prod)
    replay = measurement(*REPLAY_CODE)
    assert replay["tpot_ms"] != json.loads((DATA / "code_requests.json").read_text())["tpot_ms"]  # another run
    r = _gate.replay_figures(replay, prod["tpot_ms"]["bounds_ms"])
    for fig in ("acceptance_length", "coverage", "tokens_per_step", "deployed_k"):
        assert r[fig] == pytest.approx(p[fig]), fig
    res = _gate.compare(p, r, {**TOL, **TIMINGS_NOT_JUDGED})
    assert res["passed"], res["off"]
    judged = {c["figure"] for c in res["checks"]}
    assert {"acceptance_length", "coverage", "tokens_per_step"} <= judged


def test_replay_of_other_traffic_fails_naming_the_figure_and_by_how_much(prod):
    p = _gate.production_figures(prod)
    r = _gate.replay_figures(measurement(*PROD_CHAT), prod["tpot_ms"]["bounds_ms"])
    res = _gate.compare(p, r, TOL)
    assert not res["passed"]
    al = next(o for o in res["off"] if o.startswith("acceptance_length off"))
    c = next(c for c in res["checks"] if c["figure"] == "acceptance_length")
    assert f"{c['relative']:+.0%}" in al and "tolerance ±10%" in al
    assert f"production {p['acceptance_length']:.2f}" in al


def test_compare_kinds_and_missing_figures():
    p = {"acceptance_length": 3.0, "coverage": 0.50, "tokens_per_step": 2.0, "tpot_p50": 20.0, "tpot_p90": 30.0,
         "tpot_mean": 21.0, "itl_mean": 50.0, "deployed_k": 4}
    r = {**p, "coverage": 0.58, "tpot_p50": 24.0, "itl_mean": None}
    res = _gate.compare(p, r, TOL)
    assert res["passed"] and res["skipped"] == ["itl_mean"]
    res = _gate.compare(p, {**r, "coverage": 0.65, "tpot_p90": 50.0}, TOL)
    assert not res["passed"]
    assert any(o.startswith("coverage off: replay 0.65 vs production 0.50 (+0.15, tolerance ±0.10)") for o in res["off"])
    assert any(o.startswith("tpot_p90 off: replay 50.00 ms vs production 30.00 ms (+67%") for o in res["off"])
    res = _gate.compare(p, {**p, "deployed_k": 2}, TOL)
    assert not res["passed"] and res["off"][0].startswith("deployed K: production drafts 4 positions")
    # a figure whose tolerance is null is not compared
    res = _gate.compare(p, {**p, "tpot_p50": 99.0}, {**TOL, "tpot_p50": None})
    assert res["passed"]


def test_too_few_compared_figures_fail_the_gate():
    """A gate that could compare only two figures (the rest missing on one side or switched off)
    has not shown that the replay measures production."""
    p = {"acceptance_length": 3.0, "coverage": 0.50, "tokens_per_step": None, "tpot_p50": None, "tpot_p90": None,
         "tpot_mean": None, "itl_mean": None, "deployed_k": 4}
    res = _gate.compare(p, dict(p), TOL)
    assert not res["passed"] and len(res["checks"]) == 2
    assert res["off"][-1].startswith("only 2 figure(s) compared (acceptance_length, coverage; skipped: "
                                     "tokens_per_step, tpot_p50")
    assert _gate.compare(p, dict(p), TOL, min_figures=2)["passed"]


def test_the_older_tpot_histogram_name_is_read_too(prod):
    """vLLM before 0.32 names the TPOT histogram vllm:time_per_output_token_seconds."""
    old_name = _metrics.TPOT_HISTOGRAMS[1]
    texts = [(DATA / f).read_text().replace(_metrics.TPOT_HISTOGRAMS[0], old_name)
             for f in ("before.prom", "after_code.prom")]
    assert old_name in texts[1]
    derived = tel.derive(tel.parse(texts[0]), tel.parse(texts[1]))
    assert derived["tpot_ms"]["count"] == prod["tpot_ms"]["count"] > 0
    assert derived["tpot_ms"]["p50"] == pytest.approx(prod["tpot_ms"]["p50"])


def _study(tmp_path, prod_file, incumbent, trials):
    spec = SimpleNamespace(production=ProductionSpec(telemetry=str(prod_file)), incumbent=incumbent,
                           replay=SimpleNamespace(concurrency=4))

    return StudyRecord(name=None, spec=spec, all_trials=tuple(trials))


def test_check_study_gates_on_the_incumbent_trial(tmp_path):
    b = tel.bundle((DATA / "before.prom").read_text(), (DATA / "after_code.prom").read_text(), source="prod")
    f = tel.save(tmp_path / "prod.json", b)
    inc = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    from autotune.search._space import canonical

    good = TrialRecord(number=1, state="COMPLETE", config_key=canonical(inc), role="search",
                       measurement=measurement(*REPLAY_CODE))
    st = _study(tmp_path, f, inc, [good])
    st.spec.production = ProductionSpec(telemetry=str(f), tolerances=TIMINGS_NOT_JUDGED)
    block = _gate.check_study(st)
    assert block["checked"] and block["passed"] and block["replay"]["trial"] == 1
    assert any("replay reproduces production" in line for line in _gate.lines(block))
    bad = TrialRecord(number=1, state="COMPLETE", config_key=canonical(inc), role="search",
                      measurement=measurement(*PROD_CHAT))
    with pytest.raises(_gate.FidelityFailed) as e:
        _gate.check_study(_study(tmp_path, f, inc, [bad]))
    assert "acceptance_length off" in str(e.value)
    assert any("OFF" in line for line in _gate.lines(e.value.result))
    with pytest.raises(_gate.FidelityFailed, match="was not replayed"):
        _gate.check_study(_study(tmp_path, f, inc, []))


def test_percentiles_inside_the_first_bucket_are_marked_unresolved(prod):
    """On this CPU the TPOT is under vLLM's first bucket (10 ms): p50/p90 read 5 and 9 ms on both
    sides whatever the values; the check says so, and the exact mean is compared as well."""
    p = _gate.production_figures(prod)
    r = _gate.replay_figures(measurement(*REPLAY_CODE), prod["tpot_ms"]["bounds_ms"])
    res = _gate.compare(p, r, TOL)
    c = {c["figure"]: c for c in res["checks"]}
    assert c["tpot_p50"]["bucket_limited"].startswith("both in the histogram's first bucket (0-10 ms)")
    assert "bucket_limited" not in c["tpot_mean"]


def _fake_study(tmp_path, monkeypatch, incumbent_window: tuple[str, str, str]):
    """A real Study (Optuna storage) whose trials return measurements made from the saved real
    windows: the incumbent gets ``incumbent_window``, everything else production's code window."""
    import yaml

    from autotune.core._spec import StudySpec
    from autotune.engines._probe import Capabilities
    from autotune.search import _study
    from autotune.search._space import SearchSpace
    from autotune.search._trial import Measurement
    from autotune.traffic import _replayset

    reqs = [_replayset.ReplayRequest(id=f"r{i}", endpoint="completions",
                                     body={"prompt": f"p{i}", "max_tokens": 64, "temperature": 0}) for i in range(72)]
    path = _replayset.save(tmp_path / "replay.jsonl", reqs)
    prod = tel.save(tmp_path / "prod.json", tel.bundle((DATA / "before.prom").read_text(),
                                                       (DATA / "after_code.prom").read_text(), source="prod"))
    inc = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    data = {"workload": "syn", "model": "m", "replay": {"path": str(path), "concurrency": 4, "warmup": 4, "requests": 32},
            "space": {"methods": ["ngram"], "k": {"min": 1, "max": 4},
                      "ngram": {"prompt_lookup_min": [2], "prompt_lookup_max": [4]}},
            "budget": {"max_trials": 3, "max_server_starts": 3}, "objective": {"confirm_starts": 0, "search": "grid"},
            "incumbent": inc, "production": {"telemetry": str(prod), "tolerances": TIMINGS_NOT_JUDGED},
            "storage": f"sqlite:///{tmp_path / 'study.db'}", "recommendations_dir": str(tmp_path / "rec")}
    (tmp_path / "syn.yaml").write_text(yaml.safe_dump(data))
    spec = StudySpec.model_validate(data)
    calls = []

    def measure(spec, config, requests, warmup, log_path, command, on_server=None, extra_args=None, pid_dir=None,
                reserve=None):
        calls.append(config)
        win = incumbent_window if config == inc else ("before.prom", "after_code.prom", "code_requests.json")
        m = measurement(*win)
        if config is None:  # the baseline: no speculation
            m["spec_delta"] = {**m["spec_delta"], "drafts": 0.0, "accepted_tokens": 0.0, "accepted_per_position": []}
        return Measurement(config=config, argv=["vllm", "serve"], log_path=str(log_path), start_seconds=1.0,
                           wall_seconds=2.0, summary={**m["summary"], "n": 64, "output_throughput_tok_s": 1000.0},
                           spec_delta=m["spec_delta"], tpot_ms=m["tpot_ms"], client_tpot_ms=m["tpot_ms"],
                           tpot_source="server", outputs={r.id: "x" for r in requests}, tags=[None] * len(m["tpot_ms"]))

    monkeypatch.setattr(_study, "measure", measure)
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=["method", "num_speculative_tokens",
                                                                     "prompt_lookup_min", "prompt_lookup_max"],
                        arctic_inference=False)
    return _study.Study(spec, caps, SearchSpace.build(spec.space, caps), spec.storage, ["vllm", "serve"],
                        tmp_path / "home", fidelity_check=_gate.fidelity_check), calls


def test_study_stops_before_the_search_when_the_incumbent_replay_is_off(tmp_path, monkeypatch):
    st, calls = _fake_study(tmp_path, monkeypatch, PROD_CHAT)
    with pytest.raises(_gate.FidelityFailed) as e:
        st.run()
    assert len(calls) == 2  # the baseline and the incumbent: no server start spent on the search
    assert e.value.result["off"] and e.value.result["off"][0].startswith("acceptance_length off: replay 1.00 vs production 5.00")


def test_study_goes_on_when_the_incumbent_replay_matches(tmp_path, monkeypatch):
    st, calls = _fake_study(tmp_path, monkeypatch, REPLAY_CODE)
    st.run()
    assert st.fidelity["passed"] and len(calls) == 3


from test_preflight import _start, _write, setup  # noqa: E402,F401  (a spec on a fake engine)


def test_unreadable_production_telemetry_fails_before_any_server_start(setup):  # noqa: F811
    setup["data"]["production"] = {"telemetry": "./prod.json"}
    (setup["dir"] / "prod.json").write_text("not json")
    r = _start(setup, _write(setup))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "prod.json: not a telemetry bundle" in r.stderr
    assert not setup["marker"].exists()


def test_recommendation_trust_fields_from_the_gated_study(tmp_path, monkeypatch):
    from autotune.trust import _drift
    st, _ = _fake_study(tmp_path, monkeypatch, REPLAY_CODE)
    st.run()
    inc = st.spec.incumbent
    b = _drift.trust_blocks(study_record(st), {"speculative_config": inc}, st.fidelity)
    p = b["predicted"]
    assert p["deployed_k"] == 4 and p["acceptance_length"] == pytest.approx(5.0)
    assert p["tokens_per_step"] == pytest.approx(st.fidelity["production"]["tokens_per_step"])
    lo, hi = b["canary"]["acceptance_length"]
    assert lo == pytest.approx(4.5) and hi == pytest.approx(5.5)
    assert b["engine"]["vllm_version"] == "0.32.0" and len(b["engine"]["sha256"]) == 16
    assert b["traffic"]["requests"] == 72 and b["traffic"]["tag_shares"] == {"None": 1.0}
    assert {k["figure"] for k in b["kill_criteria"]} >= {"acceptance_length", "failed_requests", "preemptions"}


def test_canary_quantiles_production_histogram_cannot_resolve_have_no_range(tmp_path, monkeypatch):
    """The replay's TPOTs (a few ms) sit in vLLM's first TPOT bucket (0-10 ms): Prometheus reads
    the same p50 whatever the TPOT inside it, so a p50 range would be a band around the bucket's
    midpoint that no regression can leave. The canary drops those ranges, says why, keeps the
    exact mean; with production's own finer buckets the ranges come back."""
    import dataclasses

    from autotune.trust import _drift
    st, _ = _fake_study(tmp_path, monkeypatch, REPLAY_CODE)
    st.run()
    inc = st.spec.incumbent
    rec = study_record(st)  # the timings judged, at the default tolerances
    prod = rec.spec.production.model_copy(update={"tolerances": FidelityTolerances()})
    rec = dataclasses.replace(rec, spec=rec.spec.model_copy(update={"production": prod}))
    b = _drift.trust_blocks(rec, {"speculative_config": inc}, st.fidelity)
    p, c = b["predicted"], b["canary"]
    assert p["tpot_ms_p50"] < 10 and p["tpot_ms_p90"] < 10
    assert c["tpot_ms_p50"] is None and c["tpot_ms_p90"] is None and c["tpot_ms_mean"]
    assert "0-10 ms histogram bucket" in c["unresolved"]["tpot_ms_p50"]
    fine = {**st.fidelity, "telemetry": {**st.fidelity["telemetry"],
                                         "tpot_bounds_ms": [p["tpot_ms_p50"] * f for f in (0.8, 0.9, 1.0, 1.1, 1.2)]
                                         + [p["tpot_ms_p90"] * f for f in (0.9, 1.0, 1.1)]}}
    b = _drift.trust_blocks(rec, {"speculative_config": inc}, fine)
    assert b["canary"]["tpot_ms_p50"] and b["canary"]["tpot_ms_p90"] and "unresolved" not in b["canary"]
