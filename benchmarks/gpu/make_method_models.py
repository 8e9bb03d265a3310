"""Write the model folders for the speculative methods that need weights of their own, beside the
Qwen3-8B-shaped target of make_models.py (config only; vLLM fills weights with --load-format dummy):

- ``qwen3-8b-eagle3``: an EAGLE-3 head shaped for the Qwen3-8B target, as vLLM 0.25 loads one
  (``LlamaForCausalLMEagle3`` -> ``llama_eagle3.Eagle3LlamaForCausalLM``): one Llama decoder layer
  of the target's width (hidden 4096, 32 heads, 8 KV heads, head_dim 128, MLP 12288), ``fc`` from
  the target's three auxiliary hidden states (3 x 4096 -> 4096), a 32,000-word draft vocabulary
  mapped onto the target's 151,936 words (``draft_vocab_size``; the dummy ``d2t`` map is zero, so
  the draft ids are the first 32,000 target ids). That is the layout of the published EAGLE-3
  heads for Qwen3-8B; the auxiliary layers are vLLM's defaults for the target (2, 18, 33).
- ``mimo-7b``: a MiMo-7B-shaped target with one MTP layer (``MiMoForCausalLM``,
  ``num_nextn_predict_layers: 1``), for ``method: mtp``: vLLM 0.25 turns it into its draft
  (``SpeculativeConfig.hf_config_override``: ``mimo_mtp`` / ``MiMoMTPModel``). MiMo-7B is Qwen2
  with MTP layers, so the config is a Qwen2 config (``model_type: qwen2``, which transformers
  knows without MiMo's remote code) whose architecture is MiMo's. Shapes of MiMo-7B-Base (hidden
  4096, 36 layers, 32 heads, 8 KV heads, MLP 11008, rope theta 640000); vocabulary 151,936, the
  word-level tokenizer's (MiMo's own is 151,680), so the same replay set works.

    python benchmarks/gpu/make_method_models.py /tmp/models     (after .gpu/make_models.py)
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

V = 151936
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")

EAGLE3_HEAD = dict(
    architectures=["LlamaForCausalLMEagle3"], model_type="llama",
    hidden_size=4096, intermediate_size=12288, num_hidden_layers=1, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000,
    rope_scaling=None, max_position_embeddings=40960, vocab_size=V, draft_vocab_size=32000,
    target_hidden_size=4096, attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
    torch_dtype="bfloat16", bos_token_id=151643, eos_token_id=151645, pretraining_tp=1,
)

MIMO_7B = dict(
    architectures=["MiMoForCausalLM"], model_type="qwen2", num_nextn_predict_layers=1,
    hidden_size=4096, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, hidden_act="silu", rms_norm_eps=1e-5, rope_theta=640000, rope_scaling=None,
    max_position_embeddings=32768, vocab_size=V, tie_word_embeddings=False, torch_dtype="bfloat16",
    use_sliding_window=False, sliding_window=None, max_window_layers=36, attention_dropout=0.0,
    bos_token_id=151643, eos_token_id=151645, initializer_range=0.02, use_cache=True,
)


def write(root: Path, name: str, config: dict, tokenizer_from: Path | None) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config, indent=1))
    (d / "generation_config.json").write_text(json.dumps({"bos_token_id": 151643, "eos_token_id": 151645}))
    if tokenizer_from is not None:
        for f in TOKENIZER_FILES:
            if (tokenizer_from / f).exists():
                shutil.copy(tokenizer_from / f, d / f)
    print("wrote", d)
    return d


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0] if args else "/tmp/models")
    target = root / "qwen3-8b"
    tok = target if (target / "tokenizer.json").exists() else None
    if tok is None:
        print(f"warning: no tokenizer in {target} (run .gpu/make_models.py first); mimo-7b gets none")
    write(root, "qwen3-8b-eagle3", EAGLE3_HEAD, None)   # the head uses the target's tokenizer
    write(root, "mimo-7b", MIMO_7B, tok)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
