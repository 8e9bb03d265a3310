"""The built-in default: tiny models and replay sets, so a fresh machine can run a real study.

``autotune demo setup`` writes, under ``.autotune/``: the tiny models (see ``_tinymodels``) and
replay sets for the shipped study specs: ``code`` (completions whose output repeats the
prompt: prompt lookup pays), ``chat`` (chat messages whose output never repeats) and
``random`` (the random model, on which speculation cannot help). All greedy, since speculation on
the CPU build is only correct at temperature 0.

With ``real`` (what ``autotune demo setup`` does) it also builds a real model for vLLM: the
SmolLM2-135M-Instruct folder and its self-speculative drafts (``_hfmodels``), and the
``code-smollm2`` traffic: a gateway log of code-editing requests on stdlib functions
(``_codetraffic``), ``chat-smollm2`` (summaries of stdlib prose, explanations, advice:
``_chattraffic``) and ``mixed-smollm2`` (both), each imported and sampled into a replay set by
the same code as ``autotune traffic import`` and ``sample``. The tiny models stay the default
of ``make run``.
"""

from __future__ import annotations

import random
from pathlib import Path

from autotune.demo import _chattraffic, _codetraffic, _hfmodels
from autotune.demo import _tinymodels as tm
from autotune.traffic import _replayset
from autotune.traffic._sampling import sample_workload
from autotune.traffic._traffic import import_paths
from autotune.traffic._workloads import Classifier

DEFAULT_SIZES = {"warmup": 4, "measured": 32}
REAL_WORKLOAD = "code-smollm2"
REAL_LOGGED = 200      # requests in the gateway log
REAL_SAMPLED = 36      # in the replay set: 4 warm-up + 16 measured + 16 to confirm
REAL_MAX_MODEL_LEN = 1024
# the real model's workloads and their request bodies: code edits (prompt lookup pays), chat
# (summaries, explanations, advice: it mostly does not) and an even mix of the two
REAL_TRAFFIC = {"code-smollm2": _codetraffic.requests, "chat-smollm2": _chattraffic.requests,
                "mixed-smollm2": _chattraffic.mixed_requests}


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


def real_traffic(home: str | Path, n_logged: int = REAL_LOGGED, n: int = REAL_SAMPLED,
                 workload: str = REAL_WORKLOAD) -> Path:
    """The workload's gateway log under ``<home>/logs/`` (``REAL_TRAFFIC``), imported into its
    pool (replacing it) and sampled into ``<home>/replay/<workload>.jsonl`` (all of the log's time)."""
    if workload not in REAL_TRAFFIC:
        raise ValueError(f"no demo traffic for workload {workload!r}; one of {', '.join(REAL_TRAFFIC)}")
    home = Path(home)
    lines = _codetraffic.log_lines(workload, REAL_TRAFFIC[workload](n_logged))
    log = _codetraffic.write_lines(home / "logs" / f"gateway-{workload}.jsonl.gz", lines)
    import_paths([str(log)], home, classifier=Classifier([]), replace=True)
    out, _, _ = sample_workload(home, workload, out=home / "replay" / f"{workload}.jsonl", n=n,
                                window_hours=None, max_model_len=REAL_MAX_MODEL_LEN, use_tokenizer=False)
    return out


def setup(home: str | Path = ".autotune", requests: int | None = None, real: bool = False) -> dict[str, Path]:
    """Build models and replay sets (idempotent). Returns the paths written. ``real`` adds the
    SmolLM2 folders and the code-, chat- and mixed-smollm2 replay sets (about 16 s more the first
    time, 2-3 s after)."""
    home = Path(home)
    paths = {f"model:{k}": v for k, v in tm.build_all(home / "models").items()}
    n = requests or DEFAULT_SIZES["warmup"] + 2 * DEFAULT_SIZES["measured"]
    for kind in KINDS:
        paths[f"replay:{kind}"] = _replayset.save(home / "replay" / f"{kind}.jsonl", replay_requests(kind, n))
    if real:
        paths.update({f"model:{k}": v for k, v in _hfmodels.build_all(home / "models").items()})
        for workload in REAL_TRAFFIC:
            paths[f"replay:{workload}"] = real_traffic(home, workload=workload)
    return paths
