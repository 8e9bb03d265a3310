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


def replay_requests(kind: str, n: int, seed: int = 0, max_tokens: int = 64) -> list[_replayset.ReplayRequest]:
    rng = random.Random(f"{kind}-{seed}")
    maps = tm.TinyMaps.build(0)
    out = []
    for i in range(n):
        if kind in ("code", "random"):
            prompt, _ = code_prompt(maps, rng)
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
            out.append(_replayset.ReplayRequest(id=f"{kind}-{i:04d}", endpoint="completions", body=body,
                                                tag="code", ts=1_790_000_000.0 + i))
        elif kind == "chat":
            prompt, _ = chat_prompt(rng)
            body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                    "temperature": 0}
            out.append(_replayset.ReplayRequest(id=f"{kind}-{i:04d}", endpoint="chat", body=body,
                                                tag="chat", ts=1_790_000_000.0 + i))
        else:
            raise ValueError(f"unknown demo traffic kind {kind!r}")
    return out


def setup(home: str | Path = ".autotune", requests: int | None = None) -> dict[str, Path]:
    """Build models and replay sets (idempotent). Returns the paths written."""
    home = Path(home)
    paths = {f"model:{k}": v for k, v in tm.build_all(home / "models").items()}
    n = requests or DEFAULT_SIZES["warmup"] + 2 * DEFAULT_SIZES["measured"]
    for kind in ("code", "chat", "random"):
        paths[f"replay:{kind}"] = _replayset.save(home / "replay" / f"{kind}.jsonl", replay_requests(kind, n))
    return paths
