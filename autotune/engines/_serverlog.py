"""What vLLM's server log says about how it runs a config, beyond the config itself.

A speculative config can put the whole engine on a slower path than the baseline: vLLM turns
off async scheduling for ngram and draft models, falls back to the V1 model runner, and with a
per-batch-size K schedule overrides the CUDA graph mode from FULL_AND_PIECEWISE to PIECEWISE
(seen on vLLM 0.25.0 on an H200: a k=0 band still cost 29% over no speculation). It may also
stop honouring sampling parameters (min_p, logit_bias). vLLM says each of these once, at start-up,
in its log and nowhere else. A trial keeps what its log said; a recommendation lists what the
winner's engine does that the baseline's did not, so an SRE deploying it knows.

Patterns form a registry (``PATTERNS``): an id, a regex on one log line, and a note built from
the regex's groups. Unknown lines are ignored; a log that cannot be read gives no notes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pattern:
    regex: re.Pattern
    note: str
    """``str.format`` template over the regex's named groups."""


PATTERNS: dict[str, Pattern] = {
    "async_scheduling_off": Pattern(
        re.compile(r"Async scheduling not supported with (?P<what>.+?) and will be disabled"),
        "async scheduling disabled (not supported with {what})"),
    "v1_model_runner": Pattern(
        re.compile(r"Model Runner V2 (?P<why>does not yet support .+?|requires \w+); using the V1 model runner"),
        "V1 model runner (Model Runner V2 {why})"),
    "cudagraph_mode": Pattern(
        re.compile(r"Overriding cudagraph_mode from (?P<old>\w+) to (?P<new>\w+)"),
        "CUDA graph mode {old} overridden to {new}"),
    "eager": Pattern(
        re.compile(r"Enforce eager set, disabling torch\.compile, CUDAGraphs"),
        "eager mode: no torch.compile, no CUDA graphs"),
    "sampling_params_ignored": Pattern(
        re.compile(r"(?P<what>[\w, ]+?) parameters? won't work with speculative decoding"),
        "sampling parameters ignored with speculative decoding: {what}"),
    "jit_while_serving": Pattern(
        re.compile(r"kernel JIT compilation during inference: (?P<kernel>\w+)"),
        "a kernel was compiled while serving ({kernel}): a latency spike the warm-up did not cover"),
}


def register(name: str, regex: str, note: str) -> None:
    """Add a pattern (a vLLM build with messages of its own)."""
    PATTERNS[name] = Pattern(re.compile(regex), note)


def scan(path: str | Path, max_bytes: int = 32 << 20, patterns: dict[str, Pattern] | None = None) -> dict[str, dict]:
    """``{id: {"note", "line"}}`` for each pattern found in the log (first occurrence; vLLM's API
    server and engine processes often log the same warning twice). Reads line by line, at most
    ``max_bytes`` and only until every pattern was found: the start-up messages come first.
    ``patterns``: another engine's registry (default: vLLM's ``PATTERNS``)."""
    patterns = PATTERNS if patterns is None else patterns
    found: dict[str, dict] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            read = 0
            for line in fh:
                read += len(line)
                for name, p in patterns.items():
                    m = None if name in found else p.regex.search(line)
                    if m:
                        found[name] = {"note": p.note.format(**{k: v.strip() for k, v in m.groupdict().items()}),
                                       "line": line.strip()[-300:]}
                if read >= max_bytes or len(found) == len(patterns):
                    break
    except OSError:
        return {}
    return found


def added(winner: dict | None, baseline: dict | None) -> dict[str, dict]:
    """Notes of the winner's engine that the baseline's engine did not have (or had differently:
    another CUDA graph override, another reason for the V1 runner)."""
    baseline = baseline or {}
    return {k: v for k, v in (winner or {}).items()
            if k not in baseline or baseline[k]["note"] != v["note"]}


def engine_note_lines(block: dict | None) -> list[str]:
    """A recommendation's ``engine_notes`` for people: what the config changes in the engine."""
    extra = (block or {}).get("not_in_baseline") or {}
    return [f"engine: {v['note']} -- in the server log, not in the baseline's" for v in extra.values()]


# ---- compilations while serving: what the warm-up has to wait out ----------------------------
JIT_MONITOR = re.compile(r"JIT monitor activated")
"""vLLM (CUDA workers) logs this once warm-up at start-up is done; from then on each kernel
compiled while serving is logged (``jit_while_serving``). Engines without it cannot be watched."""
COMPILED = (re.compile(r"JIT compilation during inference: (?P<kernel>\w+(?:\.\w+)*)"),
            re.compile(r"Triton autotuning for function (?P<kernel>\w+(?:\.\w+)*)"))
"""A kernel compiled (or autotuned) while serving. vLLM logs each kernel's first compile once;
Triton's autotuner prints each run. A recompile of an already-logged kernel for a new shape is
not logged: that is why a warm-up round always covers the level's concurrency first."""


def log_size(path: str | Path) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


def reports_compiles(path: str | Path) -> bool:
    """Whether the server's log announces vLLM's kernel JIT monitor (so compiles can be watched)."""
    return bool(_grep(path, 0, (JIT_MONITOR,))[0])


def compiles_since(path: str | Path, offset: int) -> tuple[list[str], int]:
    """Kernels the server logged as compiled while serving after byte ``offset`` of its log, and
    the log's new end (the next call's offset)."""
    found, end = _grep(path, offset, COMPILED)
    return [m.group("kernel") for m in found], end


def _grep(path: str | Path, offset: int, regexes) -> tuple[list[re.Match], int]:
    out: list[re.Match] = []
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return out, offset
    # only whole lines: a line the server is still writing is read on the next call
    cut = data.rfind(b"\n") + 1
    for line in data[:cut].decode("utf-8", errors="replace").splitlines():
        for rx in regexes:
            m = rx.search(line)
            if m:
                out.append(m)
    return out, offset + cut
