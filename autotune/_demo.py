"""The built-in default: tiny models and replay sets, so a fresh machine can run a real study.

``autotune demo setup`` writes, under ``.autotune/``: the tiny models (see ``_tinymodels``) and
replay sets for the shipped study specs: ``code`` (completions whose output repeats the
prompt: prompt lookup pays), ``chat`` (chat messages whose output never repeats) and
``random`` (the random model, on which speculation cannot help). All greedy, since speculation on
the CPU build is only correct at temperature 0.
"""

from __future__ import annotations

import random
from pathlib import Path

from . import _replayset, _tinymodels as tm

DEFAULT_SIZES = {"warmup": 4, "measured": 32}


def code_prompt(maps: tm.TinyMaps, rng: random.Random) -> tuple[str, int]:
    """A few walks along the target's code cycles: like source code, the continuation copies
    text already in the prompt."""
    toks: list[int] = []
    for _ in range(rng.randint(2, 3)):
        start = rng.randrange(*tm.CODE_RANGE)
        toks += [start] + tm.greedy(maps.target, start, rng.randint(9, 16))
    return " ".join(tm.word(t) for t in toks), len(toks)


def chat_prompt(rng: random.Random) -> tuple[str, int]:
    toks = [rng.randrange(*tm.CHAT_RANGE) for _ in range(rng.randint(16, 40))]
    return " ".join(tm.word(t) for t in toks), len(toks)


def partial_prompt(maps: tm.TinyMaps, rng: random.Random, out_len: int = 64,
                   gap: tuple[int, int] = (6, 6)) -> tuple[str, int]:
    """The continuation is in the prompt, but the copy is corrupted every few tokens (like code
    edited since the lines it repeats): a prompt-lookup draft holds for about ``gap - 2``
    positions and then fails, so drafting further only buys verification cost: a middle K wins."""
    start = rng.randrange(*tm.CHAT_RANGE)
    walk = [start] + tm.greedy(maps.target, start, out_len + 8)
    copy = list(walk)
    j = 3 + rng.randint(*gap)
    while j < len(copy):
        copy[j] = rng.randrange(*tm.CHAT_RANGE)
        j += rng.randint(*gap)
    noise = [rng.randrange(*tm.CHAT_RANGE) for _ in range(6)]
    toks = noise + copy + noise[:3] + walk[:3]
    return " ".join(tm.word(t) for t in toks), len(toks)


KINDS = ("code", "chat", "random", "partial", "mixed")


def replay_requests(kind: str, n: int, seed: int = 0, max_tokens: int = 64) -> list[_replayset.ReplayRequest]:
    if kind not in KINDS:
        raise ValueError(f"unknown demo traffic kind {kind!r}; one of {', '.join(KINDS)}")
    rng = random.Random(f"{kind}-{seed}")
    maps = tm.TinyMaps.build(0)
    out = []
    for i in range(n):
        kind_i = ("partial" if rng.random() < 0.5 else "chat") if kind == "mixed" else kind
        if kind_i == "chat":
            prompt, _ = chat_prompt(rng)
            endpoint, tag = "chat", "chat"
            body = {"messages": [{"role": "user", "content": prompt}]}
        else:
            prompt, _ = partial_prompt(maps, rng, out_len=max_tokens) if kind_i == "partial" \
                else code_prompt(maps, rng)
            endpoint, tag = "completions", "code"
            body = {"prompt": prompt}
        body.update(max_tokens=max_tokens, temperature=0)
        out.append(_replayset.ReplayRequest(id=f"{kind}-{i:04d}", endpoint=endpoint, body=body, tag=tag,
                                            ts=1_790_000_000.0 + i))
    return out


def setup(home: str | Path = ".autotune", requests: int | None = None) -> dict[str, Path]:
    """Build models and replay sets (idempotent). Returns the paths written."""
    home = Path(home)
    paths = {f"model:{k}": v for k, v in tm.build_all(home / "models").items()}
    n = requests or DEFAULT_SIZES["warmup"] + 2 * DEFAULT_SIZES["measured"]
    for kind in KINDS:
        paths[f"replay:{kind}"] = _replayset.save(home / "replay" / f"{kind}.jsonl", replay_requests(kind, n))
    return paths
