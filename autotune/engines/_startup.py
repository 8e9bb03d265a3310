"""Where a server start's time goes, read from the engine's own log.

On a GPU a night is mostly server start-up (on one H100, 89-108 s of a config's first 103-123 s;
the measurement is 15-20 s), so what an operator pays for a night is decided by phases no
TPOT shows: Python and CLI start, engine set-up, weights, torch.compile (and whether its cache
served it), KV-cache profiling, CUDA-graph capture, the API server coming up. vLLM logs the end
of each once, with a timestamp; a phase's length is the time from the previous milestone found to
its own. A milestone the log lacks (eager mode has no compile, a CPU no CUDA graphs) folds its time
into the next one found, so the phases always add up to the start's measured time to healthy.

Milestones form a registry per engine (``VLLM``): a phase name and the regexes of the line that
ends it, first or last occurrence (a draft model loads and compiles after the target, so the
weights and compile phases end at their last line). Figures vLLM states itself ("torch.compile
took 29.18 s in total") are kept beside the timeline: they are sub-second where the timestamps
are whole seconds. The log is read as a stream, a line at a time, and only up to the API
server's start, whatever its size.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path

from autotune.engines._serverlog import line_starts


@dataclass(frozen=True)
class Milestone:
    phase: str
    """the phase this line ends"""
    regex: re.Pattern
    last: bool = False
    """take the last occurrence before the API server starts (a drafter repeats it)"""


def _m(phase: str, pattern: str, last: bool = False) -> Milestone:
    return Milestone(phase, re.compile(pattern), last)


VLLM: tuple[Milestone, ...] = (
    _m("launch", r"non-default args:|Initializing a V1 LLM engine"),
    _m("engine_setup", r"Starting to load model|Loading model from scratch"),
    _m("weights", r"Model loading took|Loading weights took|Loading drafter model", last=True),
    _m("compile", r"torch\.compile took|Directly load the compiled graph|Directly load AOT compilation", last=True),
    _m("kv_cache", r"Available KV cache memory|KV cache size:|Memory profiling takes", last=True),
    _m("cuda_graphs", r"Graph capturing finished", last=True),
    _m("engine_ready", r"init engine \(profile, create kv cache, warmup model\) took"),
    _m("api_server", r"Starting vLLM server on|Application startup complete"),
)
"""vLLM 0.25 (CUDA) and 0.32 (CPU) wording; the first milestone is the API server's first
line, so ``launch`` is Python's and vLLM's imports before it logs anything."""

REPORTED: dict[str, re.Pattern] = {
    "weights_s": re.compile(r"(?:Model loading took [\d.]+ GiB (?:memory )?and|Loading weights took) (?P<s>[\d.]+) seconds"),
    "compile_s": re.compile(r"torch\.compile took (?P<s>[\d.]+) s in total"),
    "compile_cache_load_s": re.compile(r"from the cache, took (?P<s>[\d.]+) s"),
    "cuda_graphs_s": re.compile(r"Graph capturing finished in (?P<s>[\d.]+) secs"),
    "init_engine_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<s>[\d.]+)"),
}
"""Durations vLLM states itself: summed over occurrences (a target and its drafter)."""

COMPILED = re.compile(r"Compiling a graph for")
CACHE_HIT = re.compile(r"Directly load the compiled graph|Directly load AOT compilation")
STAMP = re.compile(r"\b(?P<mo>\d\d)-(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d+))?\b")
MAX_BYTES = 64 << 20
"""the most of a log read for its start-up: start-up lines come first; a log at debug level can
reach gigabytes, and nothing past the API server's start is a start-up phase."""


def _instant(m: re.Match, launched: dt.datetime) -> float:
    """A log line's timestamp (month-day, local wall time, no year) as epoch seconds: the year
    that puts it nearest the launch (a start across New Year)."""
    best = None
    for year in (launched.year - 1, launched.year, launched.year + 1):
        try:
            t = dt.datetime(year, int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]),
                            int((m["f"] or "0")[:6].ljust(6, "0"))).timestamp()
        except ValueError:  # 02-29 in a year without it
            continue
        if best is None or abs(t - launched.timestamp()) < abs(best - launched.timestamp()):
            best = t
    return best if best is not None else launched.timestamp()


def breakdown(path: str | Path, launched_at: float, healthy_s: float,
              milestones: tuple[Milestone, ...] | None = VLLM) -> dict:
    """``{"phases": {phase: seconds}, "reported": {...}, "compile_cache": "hit"|"miss"|None}``.

    ``launched_at``: the epoch time the server process was spawned; ``healthy_s``: seconds from
    then to the first healthy /health. Phases end at the milestones found, in registry order,
    never earlier than the one before (the log's clock has whole seconds), and ``health`` is the
    rest to ``healthy_s``: the phases add up to it. An unreadable log, or an engine without
    milestones, gives the one phase ``start``."""
    if not milestones:
        return {"phases": {"start": round(healthy_s, 2)}, "reported": {}, "compile_cache": None}
    launched = dt.datetime.fromtimestamp(launched_at)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    reported: dict[str, float] = {}
    compiled = hit = False
    try:
        for line in line_starts(path, MAX_BYTES):
            if not (stamp := STAMP.search(line[:120])):
                continue
            t = None
            for ms in milestones:
                if ms.regex.search(line):
                    t = _instant(stamp, launched) if t is None else t
                    first.setdefault(ms.phase, t)
                    last[ms.phase] = t
            for key, rx in REPORTED.items():
                if r := rx.search(line):
                    reported[key] = round(reported.get(key, 0.0) + float(r["s"]), 3)
            compiled = compiled or bool(COMPILED.search(line))
            hit = hit or bool(CACHE_HIT.search(line))
            if milestones[-1].phase in first:  # the API server is up: nothing later is start-up
                break
    except OSError:
        return {"phases": {"start": round(healthy_s, 2)}, "reported": {}, "compile_cache": None}
    phases: dict[str, float] = {}
    at = 0.0
    for ms in milestones:
        t = (last if ms.last else first).get(ms.phase)
        if t is None:
            continue
        end = min(max(t - launched_at, at), healthy_s)
        phases[ms.phase] = round(end - at, 2)
        at = end
    phases["health"] = round(max(healthy_s - at, 0.0), 2)
    cache = "hit" if hit and not compiled else "miss" if compiled else None
    return {"phases": phases, "reported": reported, "compile_cache": cache}


OWN = ("settle", "measure", "outputs", "stop")
"""a start's parts on autotune's clock, after the engine's start-up phases"""

LABELS = {"launch": "launch", "engine_setup": "engine", "weights": "weights", "compile": "compile",
          "kv_cache": "KV cache", "cuda_graphs": "CUDA graphs", "engine_ready": "warm-up",
          "api_server": "API", "health": "health", "start": "start", "failed_start": "failed starts",
          "settle": "settle", "measure": "measure", "outputs": "outputs", "stop": "stop"}


def text(timeline: dict | None) -> str:
    """One line for people: ``start 104 s (launch 12, engine 8, ..., compile 45 miss) + settle 3,
    measure 16, outputs 2, stop 2 = 127 s``."""
    if not timeline:
        return ""
    engine = timeline.get("engine") or {}
    phases = engine.get("phases") or {}
    cache = engine.get("compile_cache")
    inner = ", ".join(f"{LABELS.get(k, k)} {v:.0f}" + (f" {cache}" if k == "compile" and cache else "")
                      for k, v in phases.items() if k != "start")
    after = ", ".join(f"{LABELS[k]} {timeline[k]:.0f}" for k in OWN if timeline.get(k) is not None)
    start = timeline.get("to_healthy")
    head = (f"start {start:.0f} s" + (" preloaded" if timeline.get("preloaded") else "")
            + (f" ({inner})" if inner else "") if start is not None else "no start")
    return head + (f" + {after}" if after else "") + (f" = {timeline['total']:.0f} s" if timeline.get("total") else "")


def seconds(timeline: dict) -> dict[str, float]:
    """One start's seconds by phase: the engine's start-up phases, then autotune's own parts."""
    return {**((timeline.get("engine") or {}).get("phases") or {}),
            **{k: timeline[k] for k in OWN if timeline.get(k) is not None}}


def night(timelines: list[dict]) -> dict:
    """The night's seconds per phase, summed over its starts: where the GPU minutes went."""
    out: dict[str, float] = {}
    for tl in timelines:
        for k, v in seconds(tl).items():
            out[k] = out.get(k, 0.0) + v
        if "to_healthy" not in tl and tl.get("total"):  # never healthy: its time went on trying to start
            out["failed_start"] = out.get("failed_start", 0.0) + tl["total"] - (tl.get("stop") or 0.0)
    return {k: round(v, 1) for k, v in out.items()}


def night_text(spent: dict) -> str:
    """``night()`` for people: total minutes, the share starting up against measuring."""
    total = sum(spent.values())
    if not total:
        return "-"
    starting = sum(v for k, v in spent.items() if k not in OWN)
    top = sorted(((v, k) for k, v in spent.items()), reverse=True)[:4]
    return (f"{total / 60:.1f} min in all, {starting / total:.0%} of it starting servers, "
            f"{spent.get('measure', 0) / total:.0%} measuring; most: "
            + ", ".join(f"{LABELS.get(k, k)} {v / 60:.1f} min" for v, k in top))
