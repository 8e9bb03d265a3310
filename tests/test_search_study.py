"""``objective.search`` inside a real Study (Optuna storage, claims, confirmation) with a synthetic
engine in place of ``vllm serve``: the predictor's wiring, the band trials and the report."""

from __future__ import annotations

import hashlib
import random

import optuna
import pytest
import yaml

from _synthetic import Workload, ngram
from autotune import _replayset, _study
from autotune._bands import BANDS_KEY, k_at
from autotune._probe import Capabilities
from autotune._space import NONE, SearchSpace, canonical
from autotune._spec import StudySpec
from autotune._trial import Measurement

RATES = [0.9 * 0.75 ** i for i in range(8)]
FIELDS = ["method", "num_speculative_tokens", "model", "prompt_lookup_min", "prompt_lookup_max", BANDS_KEY]


def make_spec(tmp_path, search="predictor", levels=None, bands=False, budget=None) -> StudySpec:
    reqs = [_replayset.ReplayRequest(id=f"r{i}", endpoint="completions",
                                     body={"prompt": f"p{i}", "max_tokens": 64, "temperature": 0}, ts=1000.0 + i)
            for i in range(80)]
    path = _replayset.save(tmp_path / "replay.jsonl", reqs)
    replay = {"path": str(path), "concurrency": 4, "warmup": 4, "requests": 24}
    if levels:
        replay.update(mode="profile", levels=list(levels), level_weights=list(levels.values()))
    data = {
        "workload": "syn", "model": "m", "replay": replay,
        "space": {"methods": ["ngram"], "k": {"min": 1, "max": 8},
                  "ngram": {"prompt_lookup_min": [1], "prompt_lookup_max": [4]}, "bands": {"enabled": bands}},
        "budget": budget or {"max_trials": 12, "max_server_starts": 14, "max_wall_minutes": 10},
        "objective": {"confirm_starts": 1, "search": search},
        "engine": {"serve_args": {"max_num_seqs": 8}},
        "storage": f"sqlite:///{tmp_path / 'study.db'}", "recommendations_dir": str(tmp_path / "rec")}
    (tmp_path / "syn.yaml").write_text(yaml.safe_dump(data))
    return StudySpec.model_validate(data)


def fake_measure(w: Workload, seed=0, weights=None):
    rng = random.Random(seed)
    calls = []

    def measure(spec, config, requests, warmup, log_path, command, on_server=None, extra_args=None, pid_dir=None):
        calls.append(config)
        levels = {}
        pooled = []
        for L in w.levels:
            t = w.tpot(config, L) * (1 + 0.01 * rng.gauss(0, 1))
            vals = sorted(t * (1 + 0.02 * rng.gauss(0, 1)) for _ in range(24))
            pooled += vals
            if len(w.levels) > 1:
                d = w.delta(config, L) if config else {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0,
                                                       "generated_tokens": 24 * 64, "requests": 24}
                levels[str(L)] = {"level": L, "weight": (weights or {}).get(L, 1 / len(w.levels)), "tpot_ms": vals,
                                  "tpot": vals[12], "spec_delta": d, "summary": {"n": 24}}
        delta = w.delta(config) if config else {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0,
                                                "accepted_per_position": [], "generated_tokens": 24 * 64 * len(w.levels),
                                                "per_position_rates": [], "acceptance_length": None}
        outs = {r.id: hashlib.sha1(r.id.encode()).hexdigest()[:16] for r in requests}
        return Measurement(config=config, argv=["vllm", "serve"], log_path=str(log_path), start_seconds=1.0,
                           wall_seconds=2.0, summary={"failed": 0, "n": 24 * len(w.levels),
                                                      "output_throughput_tok_s": 4000.0 / (sum(pooled) / len(pooled))},
                           spec_delta=delta, tpot_ms=pooled, client_tpot_ms=pooled, tpot_source="server",
                           outputs=outs, tags=[None] * len(pooled), levels=levels)

    measure.calls = calls
    return measure


def run_study(tmp_path, monkeypatch, w, spec, caps_fields=FIELDS):
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=caps_fields, arctic_inference=False)
    space = SearchSpace.build(spec.space, caps)
    fm = fake_measure(w, weights=spec.replay.weights() if spec.replay.mode == "profile" else None)
    monkeypatch.setattr(_study, "measure", fm)
    study = _study.Study(spec, caps, space, spec.storage, ["vllm", "serve"], tmp_path / "home")
    outcome = study.run()
    return study, outcome, fm


def test_predictor_search_finds_the_grid_winner_in_a_third_of_the_starts(tmp_path, monkeypatch):
    w = Workload(rates=RATES)
    study, outcome, fm = run_study(tmp_path, monkeypatch, w, make_spec(tmp_path))
    truth = {k: w.tpot(ngram(k), 4) for k in range(1, 9)}
    best = study.best()
    assert truth[best.user_attrs["config"]["num_speculative_tokens"]] <= min(truth.values()) * 1.03
    search = [t for t in study.trials() if t.user_attrs["role"] in ("baseline", "search")]
    assert len(search) <= 9 / 3, [t.user_attrs["config_key"] for t in search]  # the grid: 9 configurations
    assert outcome.stopped_because.startswith("predictor: no remaining candidate")
    chosen = [t for t in search if "predicted_tpot_ms" in t.user_attrs]
    assert chosen, "the predictor chose no start"
    for t in chosen:
        lo, hi = t.user_attrs["predicted_ci"]
        assert lo <= t.user_attrs["predicted_tpot_ms"] <= hi
    table = study.study.user_attrs["predictor"]["table"]
    assert {r["k"] for r in table} == set(range(1, 9))
    assert [t.user_attrs["role"] for t in study.trials(role="confirm")] == ["confirm", "confirm"]


def test_grid_and_tpe_modes_still_search(tmp_path, monkeypatch):
    w = Workload(rates=RATES)
    study, outcome, fm = run_study(tmp_path, monkeypatch, w, make_spec(tmp_path, search="grid"))
    assert {canonical(c) for c in fm.calls} == {NONE} | {canonical(ngram(k)) for k in range(1, 9)}
    tpe_dir = tmp_path / "tpe"
    tpe_dir.mkdir()
    study, outcome, fm = run_study(tpe_dir, monkeypatch, w, make_spec(tpe_dir, search="tpe",
                                   budget={"max_trials": 5, "max_server_starts": 7, "max_wall_minutes": 10}))
    assert len([t for t in study.trials() if t.user_attrs["role"] != "confirm"]) == 5
    assert not any("predicted_tpot_ms" in t.user_attrs for t in study.trials())


def test_bands_are_searched_verified_and_confirmed(tmp_path, monkeypatch):
    # K pays at concurrency 1 and loses at 8: the best deployment speculates only at small batches
    w = Workload(rates=RATES, levels={1: (10.0, 0.5, 0.2), 8: (14.0, 10.0, 12.0)})
    spec = make_spec(tmp_path, levels={1: 0.5, 8: 0.5}, bands=True)
    study, outcome, fm = run_study(tmp_path, monkeypatch, w, spec)
    band_trials = [t for t in study.trials() if (t.user_attrs.get("config") or {}).get(BANDS_KEY)]
    assert band_trials, [t.user_attrs["config_key"] for t in study.trials()]
    t = band_trials[0]
    sched = t.user_attrs["config"][BANDS_KEY]
    assert k_at(sched, 1, 8) > 0 and k_at(sched, 8, 8) == 0
    assert t.user_attrs["bands"] == sched and t.user_attrs["bands_check"]["took_effect"] is True
    assert t.constraints["bands_effective"] == 0.0
    best = study.best()
    assert best.user_attrs["config"].get(BANDS_KEY) == sched
    confirm = study.trials(role="confirm", config_key=best.user_attrs["config_key"])
    assert confirm and confirm[0].user_attrs["config"] == best.user_attrs["config"]
    assert fm.calls[-1] == best.user_attrs["config"] or fm.calls[-2] == best.user_attrs["config"]
    # the file lists each level: the schedule deployed, its speedup where it speculates
    from autotune import _recommend

    rec = _recommend.build(study, _recommend.decide(study), outcome)
    # decided on the traffic-weighted per-level median, whose interval is tight; the median of the
    # pooled 50/50 mixture fell in the gap between the levels (CI 0.74-4.08: "keep")
    ev = rec["evidence"]
    assert rec["decision"] == "change" and ev["objective"] == "traffic-weighted per-level median"
    assert ev["speedup_ci"][0] > 1.2 and ev["speedup_ci"][1] / ev["speedup_ci"][0] < 1.1, ev["speedup_ci"]
    levels = rec["per_level"]["levels"]
    assert set(levels) == {"1", "8"} and levels["1"]["weight"] == levels["8"]["weight"] == 0.5
    assert all(levels[L]["recommended"]["config"] == best.user_attrs["config"] for L in levels)
    assert levels["1"]["recommended"]["speedup"] > 1.5


def test_bands_not_in_vllm_are_not_searched(tmp_path, monkeypatch):
    w = Workload(rates=RATES, levels={1: (10.0, 0.5, 0.2), 8: (14.0, 10.0, 12.0)})
    spec = make_spec(tmp_path, levels={1: 0.5, 8: 0.5}, bands=True)
    study, outcome, fm = run_study(tmp_path, monkeypatch, w, spec, caps_fields=FIELDS[:-1])
    assert not any(c and c.get(BANDS_KEY) for c in fm.calls)
    assert any("bands" in n for n in study.notes)


def test_report_from_the_study(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from autotune import _report

    w = Workload(rates=RATES, levels={1: (10.0, 0.5, 0.2), 8: (14.0, 10.0, 12.0)})
    spec = make_spec(tmp_path, levels={1: 0.5, 8: 0.5}, bands=True)
    study, outcome, fm = run_study(tmp_path, monkeypatch, w, spec)
    st = optuna.load_study(study_name=study.name, storage=spec.storage)
    paths = _report.build(study.name, st.get_trials(), st.user_attrs, tmp_path / "report", None, "syn")
    for name in ("markdown", "html", "tpot_vs_k", "acceptance", "trials", "predicted_vs_measured", "bands"):
        assert paths[name].exists() and paths[name].stat().st_size > 0, name
    md = paths["markdown"].read_text()
    assert "![" in md and "Band schedule" in md and "took effect: True" in md

    # the command line: the workload's latest study from the spec's storage
    from click.testing import CliRunner

    from autotune._cli import main

    res = CliRunner().invoke(main, ["report", "syn", "--spec", str(tmp_path / "syn.yaml"), "--out",
                                    str(tmp_path / "cli-report")], env={"AUTOTUNE__HOME": str(tmp_path / "home")})
    assert res.exit_code == 0, res.output
    assert (tmp_path / "cli-report" / "report.html").exists() and "predicted_vs_measured" in res.output


def test_report_without_matplotlib_says_how_to_install(monkeypatch, tmp_path):
    import sys

    from autotune import _report

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    with pytest.raises(_report.ReportError, match=r"autotune\[report\]"):
        _report.build("s", [], {}, tmp_path)
