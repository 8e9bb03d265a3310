"""vLLM's compile cache per configuration: each speculative config a VLLM_CACHE_ROOT of its own,
the same one for its repeated starts (vLLM 0.25 keys compiled functions without K, so a shared
cache hands one K's n-gram kernel to every other K)."""

from __future__ import annotations

import pytest

from autotune.core._spec import load_spec
from autotune.engines._engine import ServerStartError, compile_cache_env
from autotune.search import _trial

from test_cli import _run, env  # noqa: F401  (the CLI fixture)
from test_synthetic_acceptance import _spec


class _Refused:
    """Stands in for VllmServer: records the server's environment and refuses to start."""
    envs: list[dict] = []

    def __init__(self, argv, **kw):
        type(self).envs.append(dict(kw.get("env") or {}))

    launched_at = start_seconds = None  # never started

    def start(self):
        raise ServerStartError("not started in this test", None)

    def stop(self):
        pass


def _roots(tmp_path, monkeypatch, configs, block=""):
    spec = load_spec(_spec(tmp_path, block))
    monkeypatch.setattr(_trial, "VllmServer", _Refused)
    monkeypatch.setenv("AUTOTUNE__HOME", str(tmp_path / "home"))
    _Refused.envs = []
    for cfg in configs:
        with pytest.raises(_trial.TrialFailed):
            _trial.measure(spec, cfg, [], [], tmp_path / "t.log", ["vllm", "serve"])
    return [e.get("VLLM_CACHE_ROOT") for e in _Refused.envs]


K8 = {"method": "ngram_gpu", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
K10 = {**K8, "num_speculative_tokens": 10}


def test_each_configuration_compiles_into_its_own_cache(tmp_path, monkeypatch):
    k8, k10, k8_again, base = _roots(tmp_path, monkeypatch, [K8, K10, dict(K8), None])
    assert k8 == k8_again  # a repeated start may reuse what its configuration compiled
    assert len({k8, k10, base}) == 3  # and nothing another configuration compiled
    assert all(r.startswith(str(tmp_path / "home" / "vllm-cache") + "/") for r in (k8, k10, base))


def test_the_specs_cache_root_is_the_parent_and_shared_turns_it_off(tmp_path, monkeypatch):
    assert compile_cache_env(K8, {"VLLM_CACHE_ROOT": "/fast/cache"}, tmp_path)["VLLM_CACHE_ROOT"].startswith("/fast/cache/")
    monkeypatch.setenv("AUTOTUNE__VLLM_COMPILE_CACHE", "shared")
    assert _roots(tmp_path, monkeypatch, [K8, K10]) == [None, None]  # vLLM's own single cache


def test_a_bad_cache_setting_is_refused_before_anything_runs(env, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("AUTOTUNE__VLLM_COMPILE_CACHE", "per-k")
    r = _run("study", "start", "--workload", "code")
    assert r.exit_code == 2
    assert "AUTOTUNE__VLLM_COMPILE_CACHE: 'per-k'; Input should be 'per-config' or 'shared'" in r.output
    assert not (tmp_path / "home").exists()
