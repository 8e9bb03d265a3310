"""Nightly warm start: the incumbent is the config recommended now, yesterday's best candidate is
enqueued early too, and a config the space cannot express is skipped (said, not crashed on)."""

from __future__ import annotations

from pathlib import Path

from autotune.core._spec import load_spec
from autotune.engines._probe import Capabilities
from autotune.ops._runner import _warm_start
from autotune.search._space import SearchSpace
from autotune.search._space import in_space as _in_space
from autotune.search._space import params_of as _params_of

ROOT = Path(__file__).resolve().parent.parent
CAPS = Capabilities(version="0.32.0", methods=["ngram", "suffix", "draft_model"], arctic_inference=True,
                    fields=["method", "num_speculative_tokens", "model", "prompt_lookup_min", "prompt_lookup_max",
                            "suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor",
                            "suffix_decoding_min_token_prob"])
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 24,
          "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}


def test_incumbent_is_the_current_recommendation_and_yesterdays_best_is_warm_started():
    spec = load_spec(ROOT / "studies" / "code.yaml")
    prev = {"speculative_config": NGRAM, "created_at": "2026-11-28T02:00:00+00:00",
            "valid_for": {"model": spec.model}, "evidence": {"winner": {"config": SUFFIX}}}
    lines = []
    new, warm = _warm_start(spec, prev, lambda m, err=False: lines.append(m))
    assert new.incumbent == NGRAM and warm == [SUFFIX]
    assert "warm start: incumbent" in lines[0]
    # a recommendation made for another model says nothing about this one
    assert _warm_start(spec, {**prev, "valid_for": {"model": "/other"}}, print) == (spec, [])
    # a disabled speculation is the incumbent "none"
    new, warm = _warm_start(spec, {**prev, "speculative_config": None}, lambda *a, **k: None)
    assert new.incumbent is None and warm == [SUFFIX]


def test_only_configs_the_space_can_express_are_enqueued():
    spec = load_spec(ROOT / "studies" / "code.yaml")
    space = SearchSpace.build(spec.space, CAPS)
    for cfg in (NGRAM, {**SUFFIX, "num_speculative_tokens": 8}):
        params = _params_of(cfg, space)
        assert space.config_from_params(params) == cfg and _in_space(space, params)
    outside = [{**NGRAM, "num_speculative_tokens": 12},           # K above the range
               {**NGRAM, "prompt_lookup_min": 3},                  # window not in the lists
               {**SUFFIX, "suffix_decoding_min_token_prob": 0.5}]  # knob not in the lists
    for cfg in outside:
        params = _params_of(cfg, space)
        assert space.config_from_params(params) != cfg or not _in_space(space, params)
