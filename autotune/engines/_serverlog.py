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
        re.compile(r"(?P<what>[\w, ]{1,200}?) parameters? won't work with speculative decoding"),
        "sampling parameters ignored with speculative decoding: {what}"),
    "jit_while_serving": Pattern(
        re.compile(r"kernel JIT compilation during inference: (?P<kernel>\w+)"),
        "a kernel was compiled while serving ({kernel}): a latency spike the warm-up did not cover"),
}


def register(name: str, regex: str, note: str) -> None:
    """Add a pattern (a vLLM build with messages of its own)."""
    PATTERNS[name] = Pattern(re.compile(regex), note)


LINE_CAP = 8192
"""The most of one log line a pattern is matched against: what autotune looks for sits at a
line's start, and a regex on a line of megabytes (a blob vLLM logs at debug level) can take
hours where it backtracks."""


def line_starts(path: str | Path, max_bytes: int):
    """The first ``LINE_CAP`` characters of each line of the log, reading a line of any length a
    piece at a time and at most ``max_bytes`` in all: what autotune looks for sits at a line's
    start. Raises ``OSError`` where the log cannot be read."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        read, at_start = 0, True
        for piece in iter(lambda: fh.readline(LINE_CAP), ""):
            read += len(piece)
            starts, at_start = at_start, piece.endswith("\n")
            if starts:
                yield piece
            if read >= max_bytes:
                return


def scan(path: str | Path, max_bytes: int = 32 << 20, patterns: dict[str, Pattern] | None = None) -> dict[str, dict]:
    """``{id: {"note", "line"}}`` for each pattern found in the log (first occurrence; vLLM's API
    server and engine processes often log the same warning twice). Reads line by line, at most
    ``max_bytes`` and only until every pattern was found: the start-up messages come first.
    ``patterns``: another engine's registry (default: vLLM's ``PATTERNS``)."""
    patterns = PATTERNS if patterns is None else patterns
    found: dict[str, dict] = {}
    try:
        for line in line_starts(path, max_bytes):
            for name, p in patterns.items():
                m = None if name in found else p.regex.search(line)
                if m:
                    found[name] = {"note": p.note.format(**{k: v.strip() for k, v in m.groupdict().items()}),
                                   "line": line.strip()[-300:]}
            if len(found) == len(patterns):
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


CHUNK = 1 << 20
"""How much of a log ``_grep`` holds at once: a vLLM at debug level writes gigabytes in a night."""
MAX_MATCHES = 1000


def _grep(path: str | Path, offset: int, regexes) -> tuple[list[re.Match], int]:
    """Matches of ``regexes`` in the whole lines after byte ``offset``, read a chunk at a time
    (memory bounded whatever the log's size), and the offset after the last whole line read."""
    out: list[re.Match] = []
    try:
        fh = open(path, "rb")
    except OSError:
        return out, offset
    with fh:
        fh.seek(offset)
        pos, buf = offset, b""
        while chunk := fh.read(CHUNK):
            buf += chunk
            # only whole lines: a line the server is still writing is read on the next call
            cut = buf.rfind(b"\n") + 1
            if not cut:
                if len(buf) > 4 * CHUNK:  # a line without end: skip its head, keep its tail
                    pos, buf = pos + len(buf) - CHUNK, buf[-CHUNK:]
                continue
            for line in buf[:cut].decode("utf-8", errors="replace").splitlines():
                for rx in regexes:
                    m = rx.search(line[:LINE_CAP])
                    if m and len(out) < MAX_MATCHES:
                        out.append(m)
            pos, buf = pos + cut, buf[cut:]
    return out, pos


def tail(path: str | Path, max_bytes: int = 4 * CHUNK) -> str:
    """The last ``max_bytes`` of a log as text: where a server that died says why, read without
    holding a log of any size."""
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - max_bytes))
        return fh.read().decode("utf-8", errors="replace")
