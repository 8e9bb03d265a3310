"""``objective.search`` inside a real Study (Optuna storage, claims, confirmation) with a synthetic
engine in place of ``vllm serve``: the predictor's wiring, the band trials and the report."""

from __future__ import annotations

import hashlib
import json
import random

import optuna
import pytest
import yaml
from click.testing import CliRunner

from _synthetic import Workload, ngram
from autotune.traffic import _replayset
from autotune.search import StudyRecord, _study, read_study, study_record
from autotune.search._bands import BANDS_KEY, k_at
from autotune.engines._probe import Capabilities
from autotune.search._space import NONE, SearchSpace, canonical
from autotune.core._spec import StudySpec
from autotune.search._trial import Measurement
from autotune.cli._main import main

RATES = [0.9 * 0.75 ** i for i in range(8)]
FIELDS = ["method", "num_speculative_tokens", "model", "prompt_lookup_min", "prompt_lookup_max", BANDS_KEY]


def make_spec(tmp_path, search="predictor", levels=None, bands=False, budget=None, objective=None) -> StudySpec:
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
        # room for 12 search starts beside the four confirmation rounds the search leaves room for
        "budget": budget or {"max_trials": 12, "max_server_starts": 20, "max_wall_minutes": 10},
        "objective": {"confirm_starts": 1, "search": search, **(objective or {})},
        "engine": {"serve_args": {"max_num_seqs": 8}},
        "storage": f"sqlite:///{tmp_path / 'study.db'}", "recommendations_dir": str(tmp_path / "rec")}
    (tmp_path / "syn.yaml").write_text(yaml.safe_dump(data))
    return StudySpec.model_validate(data)


def fake_measure(w: Workload, seed=0, weights=None):
    rng = random.Random(seed)
    calls = []

    def measure(spec, config, requests, warmup, log_path, command, on_server=None, extra_args=None, pid_dir=None,
                reserve=None):
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
                           outputs=outs, tags=[None] * len(pooled), levels=levels,
                           timeline={"to_healthy": 1.0, "stop": 0.5, "total": 9.0, "settle": 0.5, "measure": 6.0,
                                     "outputs": 1.0, "engine": {"phases": {"launch": 0.5, "compile": 0.5},
                                                                "compile_cache": "miss", "reported": {}}})

    measure.calls = calls
    return measure


def run_study(tmp_path, monkeypatch, w, spec, caps_fields=FIELDS):
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=caps_fields, arctic_inference=False)
    space = SearchSpace.build(spec.space, caps)
    fm = fake_measure(w, weights=spec.replay.weights() if spec.replay.mode == "profile" else None)
    monkeypatch.setattr(_study, "measure", fm)
    study = _study.Study(spec, caps, space, spec.storage, ["vllm", "serve"], tmp_path / "home")
    from autotune.decide import _decision

    study.confirm_open = lambda: _decision.open_question(study_record(study))  # as the runner asks it
    outcome = study.run()
    return study, outcome, fm


def test_predictor_search_finds_the_grid_winner_and_stops_by_itself(tmp_path, monkeypatch):
    w = Workload(rates=RATES)
    study, outcome, fm = run_study(tmp_path, monkeypatch, w, make_spec(tmp_path))
    truth = {k: w.tpot(ngram(k), 4) for k in range(1, 9)}
    best = study.best(search_only=True)  # the winner the confirmation started (the runoff's, where one ran)
    assert truth[best.user_attrs["config"]["num_speculative_tokens"]] <= min(truth.values()) * 1.03
    search = [t for t in study.trials() if t.user_attrs["role"] in ("baseline", "search")
              and "runoff_round" not in t.user_attrs]  # the runoff's starts apart
    # the grid: 9 configurations; baseline, K_max, its acceptance knee, the predicted best, and its
    # neighbours checked (both of them here: the best was measured once, at the default 3% noise,
    # so a neighbour predicted within that noise of it stays open)
    assert len(search) <= 7, [t.user_attrs["config_key"] for t in search]
    assert outcome.stopped_because.startswith("predictor: no remaining candidate")
    chosen = [t for t in search if "predicted_tpot_ms" in t.user_attrs]
    assert chosen, "the predictor chose no start"
    for t in chosen:
        lo, hi = t.user_attrs["predicted_ci"]
        assert lo <= t.user_attrs["predicted_tpot_ms"] <= hi
    table = study.study.user_attrs["predictor"]["table"]
    assert {r["k"] for r in table} == set(range(1, 9))
    # baseline and winner in rounds, at least two: the winner's own noise needs two of its starts
    confirm = [t.user_attrs["config_key"] for t in sorted(study.trials(role="confirm"), key=lambda t: t.number)]
    rounds = study.confirmation["rounds"]
    assert rounds >= 2 and len(confirm) == 2 * rounds, confirm
    assert all(sorted(confirm[2 * i:2 * i + 2]) == sorted([NONE, best.user_attrs["config_key"]])
               for i in range(rounds)), confirm  # each round both sides, in the round's drawn order


def test_every_start_measures_the_same_further_windows(tmp_path, monkeypatch):
    """``replay.windows: 2``: the study hands every start, baseline, search and confirmation alike,
    the same second window (warm-up and measured requests of their own, none of the first's)."""
    spec = make_spec(tmp_path)
    spec = spec.model_copy(update={"replay": spec.replay.model_copy(update={"windows": 2})})
    inner, seen = fake_measure(Workload(rates=RATES)), []

    def measure(spec, config, requests, warmup, *a, windows=None, **kw):
        seen.append((requests[0].id, [[r.id for r in part] for w in windows for part in w]))
        m = inner(spec, config, requests, warmup, *a, **kw)
        m.summary["windows"] = {"n": 2, "objective_ms": [1.0, 1.1], "cv": 0.0667, "se_rel": 0.0471}
        return m

    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=FIELDS, arctic_inference=False)
    monkeypatch.setattr(_study, "measure", measure)
    study = _study.Study(spec, caps, SearchSpace.build(spec.space, caps), spec.storage, ["vllm", "serve"],
                         tmp_path / "home")
    study.run()
    firsts = {first for first, _ in seen}
    assert firsts == {"r4", "r28"} and len(seen) >= 4  # search and confirmation requests
    assert all(w == [[f"r{i}" for i in range(52, 56)], [f"r{i}" for i in range(56, 80)]] for _, w in seen)
    # `autotune study show` lists each start's window scatter
    monkeypatch.setenv("AUTOTUNE__STUDIES_DIR", str(tmp_path))
    out = CliRunner().invoke(main, ["study", "show", "syn", "--study-name", study.name], catch_exceptions=False).output
    assert out.count("2 windows, cv 6.7%") == len(seen), out


def test_grid_and_tpe_modes_still_search(tmp_path, monkeypatch):
    w = Workload(rates=RATES)
    study, outcome, fm = run_study(tmp_path, monkeypatch, w, make_spec(tmp_path, search="grid"))
    assert {canonical(c) for c in fm.calls} == {NONE} | {canonical(ngram(k)) for k in range(1, 9)}
    tpe_dir = tmp_path / "tpe"
    tpe_dir.mkdir()
    study, outcome, fm = run_study(tpe_dir, monkeypatch, w, make_spec(tpe_dir, search="tpe",
                                   budget={"max_trials": 5, "max_server_starts": 13, "max_wall_minutes": 10}))
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
    from autotune.decide import _decision, _payload
    rec = _payload.build(study_record(study), _decision.decide(study_record(study)), outcome)
    # decided on the traffic-weighted per-level median, whose interval is tight; the median of the
    # pooled 50/50 mixture fell in the gap between the levels (CI 0.74-4.08: "keep")
    ev = rec["evidence"]
    assert rec["decision"] == "change" and ev["objective"] == "traffic-weighted per-level median"
    # (two confirmation starts of the winner: its own 1 df caps Welch's df at 2, so the interval at look 2
    # is wide, still far narrower than the pooled mixture's)
    assert ev["speedup_ci"][0] > 1.2 and ev["speedup_ci"][1] / ev["speedup_ci"][0] < 1.5, ev["speedup_ci"]
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
    from autotune.report import _report
    w = Workload(rates=RATES, levels={1: (10.0, 0.5, 0.2), 8: (14.0, 10.0, 12.0)})
    spec = make_spec(tmp_path, levels={1: 0.5, 8: 0.5}, bands=True)
    study, outcome, fm = run_study(tmp_path, monkeypatch, w, spec)
    st = optuna.load_study(study_name=study.name, storage=spec.storage)
    paths = _report.build(read_study(st), tmp_path / "report", None, "syn")
    for name in ("markdown", "html", "tpot_vs_k", "acceptance", "trials", "predicted_vs_measured", "bands"):
        assert paths[name].exists() and paths[name].stat().st_size > 0, name
    md = paths["markdown"].read_text()
    assert "![" in md and "Band schedule" in md and "took effect: True" in md
    assert "between its 2 starts" in md  # the confirmation's repeats: each trial's noise column
    starts = sum(t.user_attrs.get("server_starts", 0) for t in st.trials)
    assert "## Where the time went" in md
    assert f"The night: {9 * starts / 60:.1f} min in all, 11% of it starting servers, 67% measuring" in md
    assert "| 0.5 (miss) |" in md

    # the command line: the workload's latest study from the spec's storage
    res = CliRunner().invoke(main, ["report", "syn", "--spec", str(tmp_path / "syn.yaml"), "--out",
                                    str(tmp_path / "cli-report")], env={"AUTOTUNE__HOME": str(tmp_path / "home")})
    assert res.exit_code == 0, res.output
    assert (tmp_path / "cli-report" / "report.html").exists() and "predicted_vs_measured" in res.output


def test_report_without_matplotlib_says_how_to_install(monkeypatch, tmp_path):
    import sys

    from autotune.report import _report
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    with pytest.raises(_report.ReportError, match=r"autotune\[report\]"):
        _report.build(StudyRecord(name="s"), tmp_path)


def test_the_search_is_one_optuna_optimize_ended_by_the_samplers_stop(tmp_path, monkeypatch):
    """The predictor is an Optuna sampler: its stop is a study.stop() on a trial that starts no
    server, and the stored study reads back as a plain Optuna study (any storage, the dashboard)."""
    from autotune.search._sampler import CandidateSampler

    spec = make_spec(tmp_path)
    study, outcome, fm = run_study(tmp_path, monkeypatch, Workload(rates=RATES), spec)
    assert isinstance(study.study.sampler, CandidateSampler)
    assert isinstance(study.study.sampler, optuna.samplers.BaseSampler)
    plain = optuna.load_study(study_name=study.name, storage=spec.storage)
    stops = [t for t in plain.trials if t.user_attrs.get("stop")]
    assert len(stops) == 1 and stops[0].state == optuna.trial.TrialState.PRUNED
    assert stops[0].user_attrs["stop"] == outcome.stopped_because
    assert plain.user_attrs["stopped_because"] == outcome.stopped_because
    assert not any(t.number > stops[0].number and t.user_attrs.get("role") == "search"
                   and "runoff_round" not in t.user_attrs for t in plain.trials)  # the runoff's starts apart
    assert len(fm.calls) == study.server_starts()  # the stop trial started nothing
    measured = [t for t in plain.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert all(t.params["method"] in (NONE, "ngram") for t in measured)
    assert all(t.params.get("ngram.k") == t.user_attrs["config"]["num_speculative_tokens"]
               for t in measured if t.user_attrs["config"])


@pytest.mark.parametrize("search", ["grid", "random"])
def test_grid_and_random_samplers_measure_every_candidate_once_then_stop(tmp_path, monkeypatch, search):
    spec = make_spec(tmp_path, search=search)
    study, outcome, fm = run_study(tmp_path, monkeypatch, Workload(rates=RATES), spec)
    ks = [t.user_attrs["config"]["num_speculative_tokens"] for t in study.trials(role="search")
          if "runoff_round" not in t.user_attrs]  # the runoff's starts apart
    assert sorted(ks) == list(range(1, 9))  # every candidate, none twice
    assert outcome.stopped_because in (f"{search}: every candidate was measured",
                                       "every configuration in the space was measured")
    if search == "grid":  # K=8 first (each method at its largest K), then ascending
        assert ks[1:] == sorted(ks[1:])


def _with_objective(spec, **kw):
    return spec.model_copy(update={"objective": spec.objective.model_copy(update=kw)})


def test_confirmation_interleaves_baseline_incumbent_and_winner_and_goes_on_while_open(tmp_path, monkeypatch):
    w = Workload(rates=RATES)
    base = make_spec(tmp_path, budget={"max_trials": 4, "max_server_starts": 30, "max_wall_minutes": 10})
    spec = _with_objective(base, confirm_max_starts=3).model_copy(update={"incumbent": ngram(1)})
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=FIELDS, arctic_inference=False)
    fm = fake_measure(w)
    monkeypatch.setattr(_study, "measure", fm)
    study = _study.Study(spec, caps, SearchSpace.build(spec.space, caps), spec.storage, ["vllm", "serve"],
                         tmp_path / "home")
    looks = []
    study.confirm_open = lambda: looks.append(len(study.trials(role="confirm"))) or True  # always open
    study.run()
    winner = study.best(search_only=True).user_attrs["config_key"]
    assert winner != canonical(ngram(1))
    from autotune.search._confirm import round_order

    confirm = sorted(study.trials(role="confirm"), key=lambda t: t.number)
    order = [t.user_attrs["config_key"] for t in confirm]
    sides = [NONE, canonical(ngram(1)), winner]
    # three interleaved rounds, each side once a round, in the order drawn for that round from
    # the spec's seed and the study's name; each start stores its round and place
    drawn = [round_order(f"{spec.seed}/{study.name}", i, sides) for i in range(3)]
    assert order == [k for r in drawn for k in r]
    assert [(t.user_attrs["confirm_round"], t.user_attrs["confirm_position"]) for t in confirm] == \
        [(i, p) for i in range(3) for p in range(3)]
    assert study.confirmation["order"] == drawn
    assert looks == [3, 6]  # asked before each round beyond confirm_starts, never past confirm_max_starts
    study.confirmation, looks[:] = {}, []
    study.confirm()  # a rerun: the rounds already measured count, none is run again, nothing to ask
    assert study.confirmation["rounds"] == 3 and looks == [] and len(study.trials(role="confirm")) == 9
    assert study.confirmation["rounds"] == 3 and study.confirmation["skipped"] is None


def test_confirmation_order_is_drawn_per_round_and_differs_between_studies():
    """A fixed order puts the same side after the same neighbour every round (a carry-over from a
    speculative start becomes a bias); the order is a uniform permutation per round, the same on
    a resumed run, another for another study or seed."""
    from collections import Counter

    from autotune.search._confirm import round_order

    sides = ["none", "inc", "win"]
    assert round_order("0/a", 2, sides) == round_order("0/a", 2, list(sides))  # a resumed run draws it again
    orders = [tuple(round_order(f"0/study-{n}", i, sides)) for n in range(400) for i in range(4)]
    counts = Counter(orders)
    assert len(counts) == 6 and min(counts.values()) > 200  # all six permutations, about evenly (1600/6)
    assert Counter(o.index("win") for o in orders)[2] < 700  # the winner is not always last
    assert [round_order("0/a", i, sides) for i in range(4)] != [round_order("1/a", i, sides) for i in range(4)]


def test_a_confirmation_the_budget_cannot_pay_is_recorded_as_skipped(tmp_path, monkeypatch):
    w = Workload(rates=RATES)
    spec = make_spec(tmp_path, budget={"max_trials": 4, "max_server_starts": 4, "max_wall_minutes": 10})
    study, outcome, fm = run_study(tmp_path, monkeypatch, w, spec)
    # the search leaves 2 starts for one round (baseline, winner); a resumed run finds none left
    assert study.confirmation["rounds"] == 1 and study.confirmation["skipped"] is None
    study.spec = _with_objective(spec, confirm_starts=2)
    study.confirm()
    assert study.confirmation["skipped"] == "the server-start budget (4) was spent after 1 of 2 confirmation rounds"


def test_the_predictor_carries_the_known_start_to_start_noise(tmp_path, monkeypatch):
    """The spec's recorded A/A figure (and, through the runner, earlier nights) is the prior of
    the predictor's noise: a host known to be noisy gets wider intervals for the same trials."""
    w = Workload(rates=RATES)
    quiet_dir, noisy_dir = tmp_path / "quiet", tmp_path / "noisy"
    widths = {}
    for d, cv in ((quiet_dir, 0.01), (noisy_dir, 0.2)):
        d.mkdir()
        spec = make_spec(d, budget={"max_trials": 3, "max_server_starts": 5, "max_wall_minutes": 10},
                         objective={"start_noise": {"cv": cv, "df": 40}})
        study, outcome, fm = run_study(d, monkeypatch, w, spec)
        assert study.sampler.noise_prior == (cv, 40)
        table = study.study.user_attrs["predictor"]["table"]
        widths[cv] = {r["k"]: r["predicted_ci"][1] - r["predicted_ci"][0] for r in table}
    assert all(widths[0.2][k] > 2 * widths[0.01][k] for k in widths[0.01])
    study.set_noise_prior(0.07, 60)  # what the runner passes: A/A prior pooled with earlier nights
    assert study.sampler.noise_prior == (0.07, 60)
    # the candidates are speculative: where the spec records their own figure, that is the prior
    d = tmp_path / "classed"
    d.mkdir()
    spec = make_spec(d, budget={"max_trials": 3, "max_server_starts": 5, "max_wall_minutes": 10},
                     objective={"start_noise": {"cv": 0.005, "df": 6, "speculative": {"cv": 0.06, "df": 9}}})
    study, _, _ = run_study(d, monkeypatch, w, spec)
    assert study.sampler.noise_prior == (0.06, 9)


def test_a_noisy_host_starts_a_close_rival_again_and_the_best_is_the_mean(tmp_path, monkeypatch):
    """At 7% start-to-start noise one start each cannot tell configurations 3% apart: the search
    starts the pair's less measured side again (a search trial with ``repeat``, its own claim),
    and the pick is the configuration with the lowest mean over its starts. Without
    ``search_repeats`` no configuration is started twice."""
    w = Workload(rates=[0.75 ** (i + 1) for i in range(8)], coverage=1.0, overhead=2.0, per_k=0.6)
    runs = {}
    for repeats in (True, False):
        d = tmp_path / str(repeats)
        d.mkdir()
        spec = make_spec(d, budget={"max_trials": 8, "max_server_starts": 16, "max_wall_minutes": 10},
                         objective={"start_noise": {"cv": 0.07, "df": 40}, "search_repeats": repeats,
                                    "runoff_contenders": 0})  # the search's own pick (the runoff's: below)
        study, outcome, fm = run_study(d, monkeypatch, w, spec)
        search = [t for t in study.trials() if t.user_attrs["role"] == "search"]
        runs[repeats] = (study, search)
    study, search = runs[True]
    again = [t for t in search if t.user_attrs.get("repeat")]
    assert again, [t.user_attrs["config_key"] for t in search]
    for t in again:
        key = t.user_attrs["config_key"]
        n = len([u for u in search if u.user_attrs["config_key"] == key and u.number <= t.number])
        assert n >= 2 and t.user_attrs["claim_key"] == f"{key}#{n}"
        assert t.user_attrs["search_reason"].startswith("another start of")
    by: dict = {}
    for t in search:
        by.setdefault(t.user_attrs["config_key"], []).append(study.objective_of(t))
    means = {k: sum(v) / len(v) for k, v in by.items()}
    best = study.best(search_only=True)
    assert best.user_attrs["config_key"] == min(means, key=means.get)
    assert study.mean_objective(best) == pytest.approx(means[best.user_attrs["config_key"]])
    _, plain = runs[False]
    keys = [t.user_attrs["config_key"] for t in plain]
    assert len(keys) == len(set(keys)) and not any(t.user_attrs.get("repeat") for t in plain)


def test_the_search_leaves_the_confirmation_its_rounds_and_the_looks_are_fixed_once(tmp_path, monkeypatch):
    """The decision's power lies in the confirmation rounds: the search stops where four rounds
    of baseline and winner still fit the budget, the looks the error is spent over are those the
    starts left can pay for, fixed before the first confirmation start, and a resumed run keeps
    them though fewer starts are left by then."""
    w = Workload(rates=RATES)
    spec = make_spec(tmp_path, budget={"max_trials": 12, "max_server_starts": 12, "max_wall_minutes": 10})
    study, outcome, fm = run_study(tmp_path, monkeypatch, w, spec)
    search = [t for t in study.trials() if t.user_attrs["role"] in ("baseline", "search")]
    assert 2 <= len(search) <= 12 - 2 * 4, [t.user_attrs["config_key"] for t in search]
    looks = study.study.user_attrs["confirm_looks"]
    assert looks == min(4, (12 - len(search)) // 2) and study.confirmation["looks"] == looks
    assert 2 <= study.confirmation["rounds"] <= looks and study.budget_starts() <= 12
    study.confirmation = {}
    study.confirm()
    assert study.confirmation["looks"] == looks


def test_a_study_starts_from_the_bands_tax_earlier_nights_measured_on_this_hardware(tmp_path, monkeypatch):
    """Night 1 measures band schedules on a machine that charges 25% for one; night 2 (other traffic,
    so another study in the same storage) begins with that tax in its predictor's prior, and a study
    on other hardware does not."""
    from autotune.search import _bands

    levels = {2: 0.5, 16: 0.5}
    w = Workload(rates=[0.9 * 0.75 ** i for i in range(8)], levels={2: (10.0, 1.0, 0.6), 16: (12.0, 3.0, 2.2)},
                 band_tax=0.25)
    spec = make_spec(tmp_path, levels=levels, bands=True)
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=FIELDS, arctic_inference=False)
    space = SearchSpace.build(spec.space, caps)
    fm = fake_measure(w, weights=spec.replay.weights())
    monkeypatch.setattr(_study, "measure", fm)
    schedule = {**ngram(8), _bands.BANDS_KEY: [[1, 4, 8], [5, 16, 3]]}  # yesterday's winner, say
    night1 = _study.Study(spec, caps, space, spec.storage, ["vllm", "serve"], tmp_path / "home", warm_start=[schedule])
    night1.run()
    assert any(c and c.get(_bands.BANDS_KEY) for c in fm.calls), f"night 1 measured no band schedule: {night1.notes}"
    assert night1.use_earlier_bands_tax() is None  # its own study is not an earlier night

    night2_dir = tmp_path / "night2"
    night2_dir.mkdir()
    spec2 = make_spec(night2_dir, levels=levels, bands=True).model_copy(update={"storage": spec.storage})
    _replayset.save(night2_dir / "replay.jsonl", [
        _replayset.ReplayRequest(id=f"n{i}", endpoint="completions",
                                 body={"prompt": f"night two {i}", "max_tokens": 64, "temperature": 0}, ts=2000.0 + i)
        for i in range(80)])
    night2 = _study.Study(spec2, caps, space, spec2.storage, ["vllm", "serve"], tmp_path / "home")
    assert night2.name != night1.name
    assert night2.sampler.bands_tax is None  # the spec gives no prior
    line = night2.use_earlier_bands_tax()
    assert line and "earlier nights measured" in line
    ratio, df = night2.sampler.bands_tax
    assert ratio == pytest.approx(1.25, rel=0.08) and df >= 2

    elsewhere = _study.Study(spec2, caps, space, spec2.storage, ["vllm", "serve"], tmp_path / "home",
                             hardware="gpu:NVIDIA H100 80GB HBM3 x1")
    assert elsewhere.use_earlier_bands_tax() is None and elsewhere.sampler.bands_tax is None


def _scripted(centers: dict):
    """A stand-in engine whose n-th start of a configuration runs at ``centers[k][n]`` ms (the last
    one repeats): a lucky first start, then the configuration's own speed."""
    made: dict = {}

    def measure(spec, config, requests, warmup, log_path, command, on_server=None, extra_args=None, pid_dir=None,
                reserve=None, **kw):
        k = config["num_speculative_tokens"] if config else 0
        seq = centers[k]
        c = seq[min(made.get(k, 0), len(seq) - 1)]
        made[k] = made.get(k, 0) + 1
        vals = [c * (1 + 0.002 * ((i * 7) % 11 - 5)) for i in range(24)]
        delta = {"drafts": 100.0, "draft_tokens": 100.0 * k, "accepted_tokens": 250.0,
                 "accepted_per_position": [], "generated_tokens": 24 * 64, "per_position_rates": [],
                 "acceptance_length": 3.5} if config else \
            {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0, "accepted_per_position": [],
             "generated_tokens": 24 * 64, "per_position_rates": [], "acceptance_length": None}
        outs = {r.id: hashlib.sha1(r.id.encode()).hexdigest()[:16] for r in requests}
        return Measurement(config=config, argv=["vllm", "serve"], log_path=str(log_path), start_seconds=1.0,
                           wall_seconds=2.0, summary={"failed": 0, "n": 24, "output_throughput_tok_s": 4000.0 / c},
                           spec_delta=delta, tpot_ms=vals, client_tpot_ms=vals, tpot_source="server",
                           outputs=outs, tags=[None] * 24, levels={})

    measure.made = made
    return measure


def _lucky_study(tmp_path, monkeypatch, budget, **objective):
    """``make run``'s case on a stand-in: K=8 picked on one lucky start (8.6 ms) that its later
    starts never repeat (14.2 ms), K=7 steady at 9.7 ms, no speculation 16 ms; the spec's noise 12%."""
    from autotune.decide import _decision

    spec = make_spec(tmp_path, search="grid", budget=budget,
                     objective={"start_noise": {"cv": 0.12, "df": 20}, "confirm_max_starts": 2, **objective})
    spec = spec.model_copy(update={"space": spec.space.model_copy(update={"k": spec.space.k.model_copy(
        update={"min": 7, "max": 8})})})
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=FIELDS, arctic_inference=False)
    fm = _scripted({0: [16.0], 8: [8.6, 14.2], 7: [9.7]})
    monkeypatch.setattr(_study, "measure", fm)
    study = _study.Study(spec, caps, SearchSpace.build(spec.space, caps), spec.storage, ["vllm", "serve"],
                         tmp_path / "home")
    study.confirm_open = lambda: _decision.open_question(study_record(study))
    study.run()
    return study, fm


def test_the_runoff_starts_a_lucky_best_and_its_contender_again_and_confirms_the_winner_like_with_like(
        tmp_path, monkeypatch):
    """The search stops with K=8 best on one lucky start and K=7 a contender (24% likely faster at
    the spec's 12% noise): each gets one more start, in the runoff's drawn order, K=7 wins on the
    mean of the first two starts of each, and the confirmation starts K=7, not the lucky K=8. A
    resumed run starts nothing again, and the recommendation reports no configuration likely faster
    than its winner."""
    from autotune.decide import decide
    from autotune.search import _runoff

    study, fm = _lucky_study(tmp_path, monkeypatch, {"max_trials": 6, "max_server_starts": 20, "max_wall_minutes": 10})
    k7, k8 = canonical(ngram(7) | {"prompt_lookup_min": 1, "prompt_lookup_max": 4}), \
        canonical(ngram(8) | {"prompt_lookup_min": 1, "prompt_lookup_max": 4})
    ran = sorted((t for t in study.trials() if "runoff_round" in t.user_attrs), key=lambda t: t.number)
    plan = study.study.user_attrs["runoff"]
    assert plan["entrants"] == [k8, k7] and plan["chances"][k7] > 0.2
    assert [t.user_attrs["config_key"] for t in ran] == plan["order"] == _runoff.order(f"{study.spec.seed}/{study.name}",
                                                                                       [k8, k7])
    assert [(t.user_attrs["runoff_round"], t.user_attrs["runoff_position"], t.user_attrs["claim_key"]) for t in ran] \
        == [(0, i, f"runoff/0/{k}") for i, k in enumerate(plan["order"])]
    assert all(t.user_attrs["role"] == "search" for t in ran)  # search starts as far as the budget goes
    assert study.best(search_only=True).user_attrs["config_key"] == k7
    assert {t.user_attrs["config_key"] for t in study.trials(role="confirm")} == {NONE, k7}
    starts = sum(fm.made.values())
    study.runoff()  # a resumed run: the runoff is done, nothing starts again
    assert sum(fm.made.values()) == starts
    ev = decide(study_record(study)).evidence
    assert ev["winner"]["config"]["num_speculative_tokens"] == 7
    assert ev["runoff"]["winner"] == "ngram K=7 w=1-4" and ev["runoff"]["starts_each"] == 2
    assert "likely_faster" not in ev and "warning" not in ev
    assert all(x["chance_faster"] < 0.5 for x in ev["indistinguishable"])


def test_a_runoff_the_budget_cannot_pay_is_skipped_and_said(tmp_path, monkeypatch):
    """The search's trials are spent (max_trials 3: baseline, K=8, K=7): no runoff start, the
    study's notes and the evidence say why; with runoff_contenders 0 nothing is planned."""
    from autotune.decide import decide

    study, fm = _lucky_study(tmp_path, monkeypatch, {"max_trials": 3, "max_server_starts": 20, "max_wall_minutes": 10})
    assert not [t for t in study.trials() if "runoff_round" in t.user_attrs]
    assert any(n.startswith("runoff: no room in the budget") for n in study.notes)
    ev = decide(study_record(study)).evidence
    assert ev["runoff"]["skipped"].startswith("no room in the budget for the runoff of 2 configurations")
    d = tmp_path / "off"
    d.mkdir()
    study, _ = _lucky_study(d, monkeypatch, {"max_trials": 6, "max_server_starts": 20, "max_wall_minutes": 10},
                            runoff_contenders=0)
    assert "runoff" not in study.study.user_attrs and study.best(search_only=True).user_attrs["config_key"] == \
        canonical(ngram(8) | {"prompt_lookup_min": 1, "prompt_lookup_max": 4})


def test_no_runoff_where_the_search_s_best_is_slower_than_no_speculation(tmp_path, monkeypatch):
    """A night with nothing to gain: K=8 and K=7 both slower than no speculation on their search
    starts (and within each other's noise). Ranking them would spend two starts on configurations
    the confirmation is about to reject; no runoff is planned and none starts."""
    from autotune.decide import _decision
    from autotune.search import _runoff

    assert _runoff.entrants({"a": [9.0], "b": [9.2]}, 0.12, 2, baseline=[8.0]) == []
    assert [k for k, _ in _runoff.entrants({"a": [9.0], "b": [9.2]}, 0.12, 2, baseline=[10.0])] == ["a", "b"]
    spec = make_spec(tmp_path, search="grid", budget={"max_trials": 6, "max_server_starts": 20, "max_wall_minutes": 10},
                     objective={"start_noise": {"cv": 0.12, "df": 20}, "confirm_max_starts": 2})
    spec = spec.model_copy(update={"space": spec.space.model_copy(update={"k": spec.space.k.model_copy(
        update={"min": 7, "max": 8})})})
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=FIELDS, arctic_inference=False)
    monkeypatch.setattr(_study, "measure", _scripted({0: [8.0], 8: [9.0], 7: [9.2]}))
    study = _study.Study(spec, caps, SearchSpace.build(spec.space, caps), spec.storage, ["vllm", "serve"],
                         tmp_path / "home")
    study.confirm_open = lambda: _decision.open_question(study_record(study))
    study.run()
    assert "runoff" not in study.study.user_attrs
    assert not [t for t in study.trials() if "runoff_round" in t.user_attrs]


KNEE = [0.9, 0.8, 0.7, 0.05, 0.03, 0.02, 0.01, 0.01]
"""Acceptance that falls off after the third position: K=3 is the grid's best, K=8 (the search's
opening) pays for five positions that are almost never accepted."""


def _two_start_study(tmp_path, monkeypatch, measure=None, **objective):
    """A budget of 10 server starts, 8 kept for four confirmation rounds: the search gets two (no
    speculation, K=8), and with ``objective.nominee`` the predictor's nominee is confirmed."""
    from autotune.decide import _decision

    spec = make_spec(tmp_path, budget={"max_trials": 12, "max_server_starts": 10, "max_wall_minutes": 10},
                     objective=objective)
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=FIELDS, arctic_inference=False)
    fm = measure or fake_measure(Workload(rates=KNEE))
    monkeypatch.setattr(_study, "measure", fm)
    study = _study.Study(spec, caps, SearchSpace.build(spec.space, caps), spec.storage, ["vllm", "serve"],
                         tmp_path / "home")
    study.confirm_open = lambda: _decision.open_question(study_record(study))
    outcome = study.run()
    return study, outcome


def _k(key):
    return 0 if key == NONE else json.loads(key)["num_speculative_tokens"]


def test_a_two_start_search_confirms_the_predictors_nominee_and_the_file_says_it_was_not_searched(
        tmp_path, monkeypatch):
    from autotune.decide import _payload, decide

    w = Workload(rates=KNEE)
    assert min(range(1, 9), key=lambda k: w.tpot(ngram(k), 4)) == 3
    study, outcome = _two_start_study(tmp_path, monkeypatch, nominee=True)
    searched = [_k(t.user_attrs["config_key"]) for t in study.trials() if t.user_attrs["role"] != "confirm"]
    assert searched == [0, 8] and outcome.stopped_because.startswith("server-start budget (10) reached")
    plan = study.study.user_attrs["nominee"]
    assert _k(plan["config_key"]) == 3 and _k(plan["best_key"]) == 8 and plan["p_beat"] >= 0.5
    assert plan["predicted_tpot_ms"] < plan["best_tpot_ms"]
    confirm = study.trials(role="confirm")
    assert {_k(t.user_attrs["config_key"]) for t in confirm} == {0, 3}  # the nominee, never K=8
    assert all(t.user_attrs.get("nominated") for t in confirm if t.user_attrs["config_key"] != NONE)
    d = decide(study_record(study))
    assert d.decision == "change" and d.winner["num_speculative_tokens"] == 3
    nom = d.evidence["nominee"]
    assert nom["searched"] is False and nom["confirmed"] is True and "dropped" not in nom
    lo, hi = nom["predicted_ci"]
    assert lo < nom["predicted_tpot_ms"] < hi and nom["instead_of"]["config"]["num_speculative_tokens"] == 8
    assert nom["p_faster"] >= 0.5 and nom["predicted_tpot_ms"] < nom["than"]["tpot_ms"]
    assert "ngram K=3 w=1-4 was nominated by the predictor, not searched: predicted" in d.reason
    assert d.evidence["starts"]["winner"] == len([t for t in confirm if t.user_attrs["config_key"] != NONE]) >= 2
    assert any(line.startswith("nominee: ngram K=3 w=1-4 was nominated by the predictor, not searched")
               for line in _payload.comparison_lines(d.evidence))
    monkeypatch.setenv("AUTOTUNE__STUDIES_DIR", str(tmp_path))
    out = CliRunner().invoke(main, ["study", "show", "syn", "--study-name", study.name], catch_exceptions=False).output
    assert "nominee: ngram K=3 w=1-4 was nominated by the predictor" in out
    assert "in place of the search's best ngram K=8 w=1-4" in out and "dropped" not in out
    starts = study.server_starts()
    study.confirm()  # a resumed run confirms the same nominee, and starts nothing again
    assert study.server_starts() == starts and study.study.user_attrs["nominee"] == plan


def test_without_the_nominee_or_where_the_predictor_stopped_the_search_nothing_changes(tmp_path, monkeypatch):
    off = tmp_path / "off"
    off.mkdir()
    study, _ = _two_start_study(off, monkeypatch)  # objective.nominee off (the default)
    assert "nominee" not in study.study.user_attrs
    assert {_k(t.user_attrs["config_key"]) for t in study.trials(role="confirm")} == {0, 8}
    assert "nominee" not in decide_evidence(study)
    # a budget the search does not run out of: the predictor stops it, and confirms what it measured
    roomy = tmp_path / "roomy"
    roomy.mkdir()
    spec = make_spec(roomy, objective={"nominee": True})
    study, outcome, _ = run_study(roomy, monkeypatch, Workload(rates=KNEE), spec)
    assert outcome.stopped_because.startswith("predictor:") and "nominee" not in study.study.user_attrs
    winner = study.best(search_only=True).user_attrs["config_key"]
    assert {t.user_attrs["config_key"] for t in study.trials(role="confirm")} == {NONE, winner}


def decide_evidence(study) -> dict:
    from autotune.decide import decide

    return decide(study_record(study)).evidence


@pytest.mark.parametrize("how", ["guard", "refused"])
def test_a_nominee_that_fails_a_guard_is_dropped_and_never_recommended(tmp_path, monkeypatch, how):
    """The nominee's first confirmation start fails a guard (failed requests), or the engine refuses
    it: it is dropped, the search's best (K=8) is confirmed on the rounds left, and the file says why."""
    from autotune.decide import decide
    from autotune.search._trial import TrialFailed

    inner = fake_measure(Workload(rates=KNEE))

    def measure(spec, config, *a, **kw):
        if config and config["num_speculative_tokens"] == 3:
            if how == "refused":
                raise TrialFailed("vllm serve exited with code 1 before it was healthy")
            m = inner(spec, config, *a, **kw)
            m.summary["failed"] = 3
            return m
        return inner(spec, config, *a, **kw)

    study, _ = _two_start_study(tmp_path, monkeypatch, measure=measure, nominee=True)
    plan = study.study.user_attrs["nominee"]
    assert _k(plan["config_key"]) == 3
    assert plan["dropped"] == ("its confirmation start failed the guard failed_requests" if how == "guard" else
                               "its confirmation start failed: vllm serve exited with code 1 before it was healthy")
    assert any(n.startswith("nominee: ngram K=3 w=1-4 dropped") for n in study.notes)
    nominee_starts = [t for t in study.study.get_trials() if t.user_attrs.get("nominated")]
    assert len(nominee_starts) == 1  # screened on its first start, never started again
    k8 = [t for t in study.trials(role="confirm") if _k(t.user_attrs["config_key"]) == 8]
    assert len(k8) >= 2 and study.budget_starts() <= 10
    d = decide(study_record(study))
    assert d.winner is None or d.winner["num_speculative_tokens"] == 8
    assert d.evidence["winner"]["config"]["num_speculative_tokens"] == 8
    nom = d.evidence["nominee"]
    assert nom["confirmed"] is False and nom["dropped"] == plan["dropped"]
    assert f"in place of the search's best ngram K=8 w=1-4; dropped, {plan['dropped']}" in d.reason
