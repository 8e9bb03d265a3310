"""Band schedules (``autotune.search._bands``): vLLM's rules and lookup, schedules from levels, the
verification that a schedule took effect, and concurrency levels from traffic."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from autotune.engines._probe import python_for
from autotune.search import _bands
from autotune.search._bands import k_at, levels_from_traffic, schedule_for_levels, validate, verify
from autotune.traffic._replayset import ReplayRequest
from conftest import vllm_command


def _vllm_package_dir() -> Path | None:
    """vLLM's package folder, found without importing it: in this interpreter, else in the
    environment of the `vllm` the real-server tests run (``AUTOTUNE_TEST_VLLM``, the venv's)."""
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    cmd = vllm_command()
    if cmd is None:
        return None
    out = subprocess.run([python_for(cmd), "-c", "import importlib.util; "
                          "print(importlib.util.find_spec('vllm').submodule_search_locations[0])"],
                         capture_output=True, text=True, timeout=60)
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def _vllm_lookup():
    """vLLM's own dense lookup, loaded from its file (no vllm import): the reference for k_at.
    Without vLLM it skips, unless AUTOTUNE_REQUIRE_VLLM=1 (``make test``, CI): then it fails."""
    pkg = _vllm_package_dir()
    p = pkg / "v1" / "spec_decode" / "dynamic" / "utils.py" if pkg else None
    if p is None or not p.exists():
        why = f"vLLM's dynamic speculative decoding module is not installed ({p or 'no vLLM found'})"
        if os.environ.get("AUTOTUNE_REQUIRE_VLLM") == "1":
            pytest.fail(why + " but AUTOTUNE_REQUIRE_VLLM=1")
        pytest.skip(why)
    spec = importlib.util.spec_from_file_location("vllm_dynamic_utils", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build_dynamic_sd_schedule_lookup


@pytest.mark.parametrize("schedule,k", [
    ([[1, 1, 4], [2, 8, 0]], 4),
    ([[1, 2, 8], [3, 5, 4], [9, 12, 2]], 8),   # a gap (6-8) and a tail past 12 carry forward
    ([[1, 16, 3], [32, 128, 2]], 3),
    ([[1, 4, 6]], 4),                          # k above num_speculative_tokens is capped
])
def test_k_at_matches_vllms_lookup(schedule, k):
    lookup = _vllm_lookup()(schedule, vllm_max_batch_size=20, vllm_num_speculative_tokens=k)
    assert [k_at(schedule, b, k) for b in range(1, 21)] == lookup[1:]


def test_validate_applies_vllms_rules():
    assert validate([[3, 8, 0], [1, 2, 4]], 4) == [[1, 2, 4], [3, 8, 0]]
    for bad, msg in (([[2, 8, 1]], "start at batch size 1"), ([[1, 4, 2], [4, 8, 1]], "overlap"),
                     ([[1, 8, 5]], "k must be"), ([], "at least one"), ([[1, 0, 1]], "start <= end")):
        with pytest.raises(ValueError, match=msg):
            validate(bad, 4)


def test_schedule_for_levels():
    assert schedule_for_levels({1: 8, 4: 0}, 8) == [[1, 2, 8], [3, 8, 0]]
    assert schedule_for_levels({1: 8, 4: 4, 16: 0}, 32) == [[1, 2, 8], [3, 8, 4], [9, 32, 0]]
    assert schedule_for_levels({1: 4, 4: 4, 8: 0}, 8) == [[1, 5, 4], [6, 8, 0]]  # equal neighbours merge
    s = schedule_for_levels({1: 8, 4: 2}, 8)
    assert validate(s, 8) == s and k_at(s, 1, 8) == 8 and k_at(s, 4, 8) == 2


def test_apply_raises_k_to_the_schedule():
    cfg = _bands.apply({"method": "ngram", "num_speculative_tokens": 2}, [[1, 1, 6], [2, 8, 0]])
    assert cfg["num_speculative_tokens"] == 6 and cfg[_bands.BANDS_KEY] == [[1, 1, 6], [2, 8, 0]]
    assert _bands.apply(None, [[1, 1, 6]]) is None and _bands.apply({"a": 1}, None) == {"a": 1}


def _level(tpot, drafts, draft_tokens, generated=24 * 64, accepted=0.0, requests=24):
    return {"tpot": tpot, "spec_delta": {"drafts": drafts, "draft_tokens": draft_tokens, "generated_tokens": generated,
                                         "accepted_tokens": accepted, "requests": requests}}


def test_verify_schedule_took_effect_and_k0_vs_no_speculation():
    cfg = {"method": "ngram", "num_speculative_tokens": 4, _bands.BANDS_KEY: [[1, 1, 4], [2, 8, 0]]}
    # level 1 drafts 4 tokens on 80% of steps; level 4 drafts only in the drain tail
    levels = {"1": _level(5.0, 400, 1600, accepted=900), "4": _level(9.0, 12, 48, accepted=20)}
    out = verify(cfg, levels, {"1": {"tpot": 8.0}, "4": {"tpot": 8.5}})
    assert out["took_effect"] is True
    assert out["levels"]["4"]["k"] == 0 and out["levels"]["1"]["k"] == 4
    assert out["k0_vs_no_speculation"] == pytest.approx(9.0 / 8.5)
    # the schedule ignored (vLLM issue 51510): level 4 drafts as much as level 1
    ignored = {"1": levels["1"], "4": _level(7.0, 380, 1520, accepted=850)}
    out = verify(cfg, ignored)
    assert out["took_effect"] is False and "did not take effect" in out["reason"]
    # nothing drafted anywhere: the counters cannot tell
    assert verify(cfg, {"1": _level(8, 0, 0), "4": _level(9, 0, 0)})["took_effect"] is None


def test_verify_gives_no_verdict_on_a_level_the_server_ran_at_batch_one():
    cfg = {"method": "ngram", "num_speculative_tokens": 4, _bands.BANDS_KEY: [[1, 1, 4], [2, 8, 0]]}
    lv1 = _level(5.0, 400, 1600, accepted=900)
    steps = 24 * 64 - 24 - 850  # the decode steps of level 4's requests (generated - first tokens - accepted)
    # level 4 drafts as level 1 does: at a mean batch of 1.05 that is batch 1's band, not a schedule ignored
    solo = _level(7.0, 380, 1520, accepted=850)
    solo["spec_delta"]["iterations"] = steps / 1.05
    out = verify(cfg, {"1": lv1, "4": solo})
    assert out["took_effect"] is None and out["levels"]["4"]["mean_batch"] == pytest.approx(1.05)
    assert "mean batch of 1.05" in out["reason"] and "cannot tell" in out["reason"]
    # the same drafting at a mean batch of 3.2: the band of batch 2-8 (k=0) was ignored
    loaded = _level(7.0, 380, 1520, accepted=850)
    loaded["spec_delta"]["iterations"] = steps / 3.2
    out = verify(cfg, {"1": lv1, "4": loaded})
    assert out["took_effect"] is False and "did not take effect" in out["reason"]
    # a schedule that gives batch 1 fewer than K tokens is judged at any batch
    low_at_one = {**cfg, _bands.BANDS_KEY: [[1, 1, 2], [2, 8, 4]]}
    out = verify(low_at_one, {"1": _level(5.0, 400, 800, accepted=500), "4": solo})
    assert out["took_effect"] is not None


def test_check_trial_marks_an_ineffective_schedule_infeasible():
    class T:
        def __init__(self):
            self.attrs, self.cons = {}, {}

        def set_user_attr(self, k, v):
            self.attrs[k] = v

        def set_constraint(self, k, v):
            self.cons[k] = v

    class M:
        config = {"method": "ngram", "num_speculative_tokens": 4, _bands.BANDS_KEY: [[1, 1, 4], [2, 8, 0]]}
        levels = {"1": _level(5.0, 400, 1600, accepted=900), "4": _level(7.0, 380, 1520, accepted=850)}

    t = T()
    _bands.check_trial(t, M(), None)
    assert t.cons == {"bands_effective": 1.0} and t.attrs["bands_check"]["took_effect"] is False


def test_levels_from_traffic():
    # a quiet hour (one request at a time) and a busy burst (8 overlapping): two levels
    reqs = [ReplayRequest(id=f"q{i}", endpoint="completions", body={"prompt": "x", "max_tokens": 50}, ts=i * 10.0)
            for i in range(40)]
    reqs += [ReplayRequest(id=f"b{i}", endpoint="completions", body={"prompt": "x", "max_tokens": 50},
                           ts=1000.0 + i * 0.125) for i in range(320)]
    levels, weights = levels_from_traffic(reqs, tpot_ms=20.0, max_levels=3)
    assert levels[0] == 1 and max(levels) >= 7 and sum(weights) == pytest.approx(1.0)
    assert weights[-1] > weights[0]  # the burst produces most tokens
    with pytest.raises(ValueError, match="arrival times"):
        levels_from_traffic([ReplayRequest(id="a", endpoint="completions", body={"prompt": "x"})], 20.0)


def test_study_takes_levels_from_traffic_when_the_spec_sets_none(tmp_path):
    from autotune.traffic._replayset import ReplaySet
    from autotune.search._search import with_profile
    from autotune.core._spec import StudySpec

    reqs = [ReplayRequest(id=f"q{i}", endpoint="completions", body={"prompt": "x", "max_tokens": 50}, ts=i * 10.0)
            for i in range(40)]
    reqs += [ReplayRequest(id=f"b{i}", endpoint="completions", body={"prompt": "x", "max_tokens": 50},
                           ts=1000.0 + i * 0.125) for i in range(320)]
    base = {"workload": "w", "model": "m", "replay": {"path": "r.jsonl", "concurrency": 4}}
    notes: list[str] = []
    spec = StudySpec.model_validate({**base, "space": {"bands": {"enabled": True, "tpot_ms": 20.0}}})
    out = with_profile(spec, ReplaySet(path=tmp_path, requests=reqs), notes)
    assert out.replay.mode == "profile" and out.replay.levels[0] == 1 and len(out.replay.levels) == 2
    assert sum(out.replay.level_weights) == pytest.approx(1.0) and "from the traffic" in notes[-1]
    # without a TPOT estimate (and no replay.levels) nothing changes, and the study says why
    spec = StudySpec.model_validate({**base, "space": {"bands": {"enabled": True}}})
    assert with_profile(spec, ReplaySet(path=tmp_path, requests=reqs), notes) is spec and "no bands" in notes[-1]
    spec = StudySpec.model_validate(base)
    assert with_profile(spec, ReplaySet(path=tmp_path, requests=reqs), notes) is spec
