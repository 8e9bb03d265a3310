"""Sampling a replay set from a workload's traffic pool (``autotune traffic sample``).

Steps, each counted in the manifest:

1. read ``<home>/traffic/<workload>.jsonl`` (see ``_traffic``); unreadable lines: ``malformed_pool_line``;
2. redact (the spec's ``traffic.redact`` and ``--redact``; imports redact already, this catches
   pools imported before a pattern was added);
3. time window ``[since, until)``: ``--since``/``--until``, else the ``window_hours`` (spec
   ``traffic.sample.window_hours``, default 24) ending at the newest request in the pool, so a
   nightly run takes the traffic imported since the last one and the same pool and seed always
   give the same sample. Skipped: ``outside_window``, ``no_timestamp`` (only when a window applies);
4. deduplicate by prompt (endpoint + messages/prompt, sampling parameters ignored; the earliest
   request is kept): ``duplicate``;
5. drop what does not fit the model's context: prompt tokens + ``max_tokens`` (or
   ``max_completion_tokens``; 1 when absent) > ``max_model_len`` (the spec's
   ``engine.serve_args.max_model_len``, else the model folder's ``config.json``
   ``max_position_embeddings``; no limit when neither is known): ``too_long``. Prompt tokens come
   from the model's tokenizer when ``transformers`` is importable and the spec's model is a folder
   with a tokenizer (chat requests through its chat template; a request whose UTF-8 size already
   fits is not tokenized, since a token is at least one byte); otherwise from the logged
   ``usage.prompt_tokens``, else an estimate of 4 characters per token plus 4 per chat message;
   synthetic trace rows use their ``input_length``;
6. stratified sample of ``n`` with seed ``seed``: strata are prompt-length buckets (estimated
   tokens: <128, 128-512, 512-2k, 2k-8k, >=8k) crossed with 6-hour UTC time-of-day buckets.
   ``n`` is split over length buckets in proportion to their sizes (largest remainder), then each
   length bucket over its time buckets the same way, and each cell is sampled without
   replacement; the result is shuffled (seeded) so warm-up, search and confirmation requests each
   mix all strata. The same pool, window and seed always give the same replay set.

Outputs (0600): the replay set (``_replayset.save``) and ``<out>.manifest.json`` with the sources,
window, counts, skipped requests by reason, strata, seed, the replay set's content hash, and
``acceptance_measurable`` (false when any request has a synthetic prompt: a study on such a set
measures speed, not real speculative acceptance).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autotune.core._inputs import input_lines, read_input
from autotune.traffic import _replayset
from autotune.traffic._traffic import (
    Redactor,
    meta_path,
    parse_ts,
    pool_lock,
    pool_path,
    synthetic_prompt,
    write_json_private,
)
from autotune.traffic._workloads import prompt_text

log = logging.getLogger("autotune.traffic")

MANIFEST_SCHEMA = "autotune.traffic-sample/1"
DEFAULT_N = 68
LENGTH_EDGES = (128, 512, 2048, 8192)
TIME_BUCKET_HOURS = 6
CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4

SKIP_REASONS = {
    "malformed_pool_line": "pool line is not a request",
    "outside_window": "timestamp outside the window",
    "no_timestamp": "no timestamp while a window applies",
    "duplicate": "same prompt as an earlier request",
    "too_long": "prompt + max_tokens longer than max_model_len",
}


class SampleError(ValueError):
    """Nothing to sample, or an unusable option; the message says why."""


@dataclass
class PoolRow:
    id: str
    endpoint: str
    body: dict
    tag: str | None
    ts: float | None
    src: str | None = None
    prompt_tokens: int | None = None
    synthetic: dict | None = None

    @property
    def measurable(self) -> bool:
        return self.synthetic is None

    def replay_body(self) -> dict:
        if self.synthetic:
            return {"prompt": synthetic_prompt(self.synthetic), **self.body}
        return self.body

    def text(self) -> str:
        return "" if self.synthetic else prompt_text(self.endpoint, self.body)

    def dedup_key(self) -> str:
        if self.synthetic:
            what: Any = {k: self.synthetic.get(k) for k in ("input_length", "hash_ids")}
        else:
            what = self.body.get("messages") if self.endpoint == "chat" else self.body.get("prompt")
        return json.dumps([self.endpoint, what], sort_keys=True, default=str)

    def max_new_tokens(self) -> int:
        for k in ("max_completion_tokens", "max_tokens"):
            v = self.body.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
        return 1


def read_pool(path: Path) -> tuple[list[PoolRow], int]:
    rows, bad = [], 0
    for _, raw in input_lines(path, "traffic pool"):
        if not raw.strip():
            continue
        try:
            o = json.loads(raw.decode("utf-8", errors="replace"))
            if o["endpoint"] not in _replayset.ENDPOINTS or not isinstance(o["body"], dict):
                raise ValueError
            ts = o.get("ts")
            rows.append(PoolRow(id=str(o["id"]), endpoint=o["endpoint"], body=o["body"], tag=o.get("tag"),
                                ts=float(ts) if isinstance(ts, (int, float)) else None, src=o.get("src"),
                                prompt_tokens=o.get("prompt_tokens") if isinstance(o.get("prompt_tokens"), int) else None,
                                synthetic=o.get("synthetic") if isinstance(o.get("synthetic"), dict) else None))
        except (ValueError, KeyError, TypeError, RecursionError):
            bad += 1
    return rows, bad


# --- context length -----------------------------------------------------------------------------

def _human_int(v: Any) -> int | None:
    """``max_model_len`` as vLLM reads it: an int, or e.g. ``32k`` (x1000) / ``32K`` (x1024)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        s = v.strip()
        mult = {"k": 1000, "m": 1000_000, "K": 1024, "M": 1024 ** 2}.get(s[-1:], 1)
        try:
            return int(float(s[:-1] if mult != 1 else s) * mult)
        except ValueError:
            return None
    return None


def max_model_len_of(spec) -> tuple[int | None, str]:
    """The serving context length and where it came from."""
    if spec is None:
        return None, "unknown (no study spec)"
    for k, v in spec.engine.serve_args.items():
        if k.lstrip("-").replace("-", "_") == "max_model_len":
            n = _human_int(v)
            if n:
                return n, "engine.serve_args.max_model_len"
    cfg = Path(spec.model) / "config.json"
    if cfg.is_file():
        with contextlib.suppress(OSError, ValueError):
            n = json.loads(read_input(cfg, "model config")).get("max_position_embeddings")
            if isinstance(n, int) and n > 0:
                return n, f"{cfg} max_position_embeddings"
    return None, "unknown (not in serve_args, no local config.json)"


def _load_tokenizer(model: str | None):
    if not model:
        return None
    d = Path(model)
    if not d.is_dir() or not any((d / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json",
                                                             "tokenizer.model")):
        return None
    try:
        from transformers import AutoTokenizer
    except Exception:  # not installed, or broken: the estimate will do
        return None
    try:
        return AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    except Exception as e:
        log.warning("cannot load the tokenizer in %s (%s); estimating prompt tokens", d, type(e).__name__)
        return None


def _ids_len(r: Any) -> int:
    if hasattr(r, "keys") and "input_ids" in r:
        r = r["input_ids"]
    if r and isinstance(r[0], list):
        r = r[0]
    return len(r)


class TokenCounter:
    """Prompt tokens for the context-length filter (exact when a tokenizer is available) and an
    estimate for the length strata (see the module docstring)."""

    def __init__(self, model: str | None = None, use_tokenizer: bool = True):
        self.tokenizer = _load_tokenizer(model) if use_tokenizer else None
        self.model = model
        self.methods: Counter = Counter()
        self._overhead: int | None = None

    @property
    def description(self) -> str:
        if self.tokenizer is not None:
            return f"tokenizer of {self.model}"
        return (f"logged usage.prompt_tokens, else {CHARS_PER_TOKEN} characters per token "
                f"+ {TOKENS_PER_MESSAGE} per chat message")

    def estimate(self, row: PoolRow) -> int:
        if row.synthetic:
            return int(row.synthetic["input_length"])
        if row.prompt_tokens is not None:
            return row.prompt_tokens
        return self._chars_estimate(row)

    def _chars_estimate(self, row: PoolRow) -> int:
        p = row.body.get("prompt")
        if row.endpoint == "completions" and isinstance(p, list) and p and not isinstance(p[0], str):
            return len(p[0]) if isinstance(p[0], list) else len(p)  # token ids
        n = math.ceil(len(row.text()) / CHARS_PER_TOKEN)
        if row.endpoint == "chat":
            n += TOKENS_PER_MESSAGE * len(row.body.get("messages") or [])
        return n

    def fits(self, row: PoolRow, limit: int) -> bool:
        need = row.max_new_tokens()
        if row.synthetic:
            self.methods["synthetic input_length"] += 1
            return row.synthetic["input_length"] + need <= limit
        if self.tokenizer is None:
            self.methods["usage" if row.prompt_tokens is not None else "estimate"] += 1
            return self.estimate(row) + need <= limit
        text = row.text()
        bound = len(text.encode("utf-8")) + need
        if row.endpoint == "chat":
            bound += self._template_overhead() + 16 * len(row.body.get("messages") or [])
        else:
            bound += 2  # BOS/EOS
        if bound <= limit:
            self.methods["bytes bound"] += 1
            return True
        self.methods["tokenizer"] += 1
        return self._tokens(row) + need <= limit

    def _template_overhead(self) -> int:
        if self._overhead is None:
            try:
                self._overhead = _ids_len(self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": ""}], tokenize=True, add_generation_prompt=True))
            except Exception:
                self._overhead = 64
        return self._overhead

    def _tokens(self, row: PoolRow) -> int:
        tok = self.tokenizer
        if row.endpoint == "chat":
            try:
                return _ids_len(tok.apply_chat_template(row.body["messages"], tokenize=True,
                                                        add_generation_prompt=True))
            except Exception:  # no template, or messages it cannot render
                return len(tok(row.text()).input_ids) + TOKENS_PER_MESSAGE * len(row.body["messages"])
        p = row.body.get("prompt")
        if isinstance(p, list) and p and not isinstance(p[0], str):
            return len(p[0]) if isinstance(p[0], list) else len(p)
        return len(tok(row.text()).input_ids)


# --- strata -------------------------------------------------------------------------------------

def length_bucket(tokens: int) -> str:
    lo = 0
    for edge in LENGTH_EDGES:
        if tokens < edge:
            return f"{_k(lo)}-{_k(edge)}" if lo else f"<{_k(edge)}"
        lo = edge
    return f">={_k(lo)}"


def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def time_bucket(ts: float | None) -> str:
    if ts is None:
        return "no-time"
    h = datetime.fromtimestamp(ts, timezone.utc).hour // TIME_BUCKET_HOURS * TIME_BUCKET_HOURS
    return f"{h:02d}-{h + TIME_BUCKET_HOURS:02d}h"


def allocate(sizes: dict[str, int], n: int, rng: random.Random) -> dict[str, int]:
    """Split ``n`` over strata in proportion to ``sizes`` (largest remainder; ties broken by
    ``rng``); never more than a stratum holds."""
    total = sum(sizes.values())
    if n >= total:
        return dict(sizes)
    quotas = {k: n * s / total for k, s in sizes.items()}
    out = {k: min(int(q), sizes[k]) for k, q in quotas.items()}
    tiebreak = {k: rng.random() for k in sorted(sizes)}
    while sum(out.values()) < n:
        open_ = [k for k in sizes if out[k] < sizes[k]]
        k = max(open_, key=lambda k: (quotas[k] - out[k], tiebreak[k]))
        out[k] += 1
    return out


# --- sampling -----------------------------------------------------------------------------------

@dataclass
class Window:
    since: float | None
    until: float | None
    window_hours: float | None
    anchored_at: float | None = None

    def applies(self) -> bool:
        return self.since is not None or self.until is not None

    def contains(self, ts: float) -> bool:
        return (self.since is None or ts >= self.since) and (self.until is None or ts < self.until)

    def to_json(self) -> dict:
        return {"since": _iso(self.since), "until": _iso(self.until), "window_hours": self.window_hours,
                "anchored_at_newest_request": _iso(self.anchored_at)}


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")


def parse_time(value: str | float | None) -> float | None:
    """``--since``/``--until``: ISO 8601 (naive = UTC) or epoch seconds."""
    if value is None or value == "":
        return None

    try:
        return parse_ts(value)
    except (ValueError, OverflowError):
        raise SampleError(f"cannot read time {value!r}: use ISO 8601 (2025-01-31T00:00:00Z) or epoch seconds") from None


@dataclass
class Sample:
    requests: list[_replayset.ReplayRequest]
    manifest: dict
    rows: list[PoolRow] = field(default_factory=list)


def sample_rows(rows: list[PoolRow], *, n: int, seed: int, window: Window, max_model_len: int | None,
                counter: TokenCounter, redactor: Redactor | None = None, malformed: int = 0) -> Sample:
    """The pipeline of the module docstring over pool rows; pure apart from the counter's tokenizer."""
    if n < 1:
        raise SampleError(f"--n must be at least 1, got {n}")
    skipped: Counter = Counter()
    if malformed:
        skipped["malformed_pool_line"] = malformed
    if redactor:
        for r in rows:
            if not r.synthetic:
                r.body = redactor.body(r.endpoint, r.body)
    if window.since is None and window.until is None and window.window_hours:
        stamped = [r.ts for r in rows if r.ts is not None]
        if stamped:
            window.anchored_at = max(stamped)
            window.until = window.anchored_at + 0.001  # [since, until) holds the newest request
            window.since = window.until - window.window_hours * 3600
    in_window = []
    for r in rows:
        if window.applies():
            if r.ts is None:
                skipped["no_timestamp"] += 1
                continue
            if not window.contains(r.ts):
                skipped["outside_window"] += 1
                continue
        in_window.append(r)
    in_window.sort(key=lambda r: (r.ts if r.ts is not None else math.inf, r.id))
    seen: set[str] = set()
    unique = []
    for r in in_window:
        key = r.dedup_key()
        if key in seen:
            skipped["duplicate"] += 1
            continue
        seen.add(key)
        unique.append(r)
    eligible = []
    for r in unique:
        if max_model_len is not None and not counter.fits(r, max_model_len):
            skipped["too_long"] += 1
            continue
        eligible.append(r)
    counts = {"pool": len(rows) + malformed, "in_window": len(in_window), "unique": len(unique),
              "eligible": len(eligible)}
    if not eligible:
        detail = ", ".join(f"{k} {v}" for k, v in skipped.items()) or "the pool is empty"
        raise SampleError(f"no eligible requests ({len(rows)} in the pool; skipped: {detail})")

    cells: dict[str, dict[str, list[PoolRow]]] = {}
    for r in eligible:
        cells.setdefault(length_bucket(counter.estimate(r)), {}).setdefault(time_bucket(r.ts), []).append(r)
    rng = random.Random(f"{seed}|allocate")
    by_len = allocate({lb: sum(map(len, c.values())) for lb, c in cells.items()}, n, rng)
    chosen: list[PoolRow] = []
    strata_pop: dict[str, int] = {}
    strata_sample: dict[str, int] = {}
    for lb in sorted(cells, key=_bucket_order):
        per_time = allocate({tb: len(rs) for tb, rs in cells[lb].items()}, by_len[lb], rng)
        for tb in sorted(cells[lb]):
            rs = cells[lb][tb]
            k = per_time[tb]
            picked = random.Random(f"{seed}|{lb}|{tb}").sample(rs, k) if k < len(rs) else list(rs)
            chosen += picked
            strata_pop[f"{lb}|{tb}"] = len(rs)
            strata_sample[f"{lb}|{tb}"] = k
    random.Random(f"{seed}|order").shuffle(chosen)
    requests = [_replayset.ReplayRequest(id=r.id, endpoint=r.endpoint, body=r.replay_body(), tag=r.tag, ts=r.ts)
                for r in chosen]
    counts["sampled"] = len(requests)
    synthetic = sum(1 for r in chosen if r.synthetic)
    by_len_pop = Counter({lb: sum(map(len, c.values())) for lb, c in cells.items()})
    by_len_sample = Counter()
    for key, k in strata_sample.items():
        by_len_sample[key.split("|")[0]] += k
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "seed": seed,
        "n_requested": n,
        "short_by": max(0, n - len(requests)),
        "window": window.to_json(),
        "counts": counts,
        "skipped": {k: {"count": v, "reason": SKIP_REASONS[k]} for k, v in sorted(skipped.items())},
        "context": {"max_model_len": max_model_len, "token_counts": counter.description,
                    "counted_by": dict(counter.methods)},
        "strata": {
            "length_buckets_tokens": list(LENGTH_EDGES), "time_bucket_hours_utc": TIME_BUCKET_HOURS,
            "length": {"population": dict(sorted(by_len_pop.items(), key=lambda kv: _bucket_order(kv[0]))),
                       "sample": {k: by_len_sample.get(k, 0) for k in sorted(by_len_pop, key=_bucket_order)}},
            "cells": {"population": strata_pop, "sample": strata_sample},
        },
        "synthetic_requests": synthetic,
        "acceptance_measurable": synthetic == 0,
        "redaction_patterns": len(redactor.patterns) if redactor else 0,
    }
    if synthetic:
        manifest["warning"] = (f"{synthetic} of {len(requests)} requests have synthetic prompts (length-only "
                               "traces): speculative acceptance measured on this set does not reflect "
                               "production; use it for speed and capacity only")
    return Sample(requests=requests, manifest=manifest, rows=chosen)


def _bucket_order(label: str) -> int:
    order = [length_bucket(0)] + [length_bucket(e) for e in LENGTH_EDGES]
    return order.index(label) if label in order else len(order)


def manifest_path(replay_path: str | Path) -> Path:
    p = Path(replay_path)
    return p.with_name(p.name + ".manifest.json")


def read_manifest(replay_path: str | Path) -> dict | None:
    """The manifest written beside a sampled replay set, or None (hand-made or demo sets).
    A study can read ``acceptance_measurable`` from it."""
    p = manifest_path(replay_path)
    try:
        return json.loads(read_input(p, "manifest"))
    except (OSError, ValueError):
        return None


def default_n(spec) -> int:
    if spec is not None:
        if spec.traffic.sample.n:
            return spec.traffic.sample.n
        if spec.replay.requests:
            return spec.replay.warmup + 2 * spec.replay.requests
    return DEFAULT_N


_UNSET: Any = object()


def sample_workload(home: str | Path, workload: str, *, spec=None, out: str | Path | None = None,
                    n: int | None = None, seed: int | None = None, since: float | None = None,
                    until: float | None = None, window_hours: float | None = _UNSET,
                    max_model_len: int | None = None, use_tokenizer: bool = True,
                    redact: list[str] | tuple = ()) -> tuple[Path, Path, Sample]:
    """Sample ``workload``'s pool and write the replay set and its manifest (both 0600).
    Defaults come from the spec: ``traffic.sample`` (n, window_hours, seed), ``replay.path``,
    ``engine.serve_args.max_model_len``, ``traffic.redact``. Returns (replay set, manifest, sample)."""
    pool = pool_path(home, workload)
    if not pool.exists():
        raise SampleError(f"no traffic pool for workload {workload!r} at {pool}; run `autotune traffic import` first")
    if out is None:
        if spec is None:
            raise SampleError("no output path: give --out or a study spec (its replay.path)")
        out = spec.replay.path
    out = Path(out)
    ts_conf = spec.traffic.sample if spec is not None else None
    n = n if n is not None else default_n(spec)  # 0 is refused (sample_rows), never the default
    seed = seed if seed is not None else (ts_conf.seed if ts_conf else 0)
    explicit_hours = window_hours is not _UNSET
    if not explicit_hours:
        window_hours = ts_conf.window_hours if ts_conf else 24.0
    if since is not None and until is not None and since >= until:
        raise SampleError(f"empty window: since {_iso(since)} is not before until {_iso(until)}")
    if max_model_len is None:
        max_model_len, mml_source = max_model_len_of(spec)
    else:
        mml_source = "--max-model-len"
    patterns = list(spec.traffic.redact if spec is not None else []) + list(redact)
    redactor = Redactor(patterns) if patterns else None
    counter = TokenCounter(spec.model if spec is not None else None, use_tokenizer=use_tokenizer)
    if since is not None and until is not None:
        window = Window(since=since, until=until, window_hours=None)
    elif since is not None:  # --since alone: to the newest request, or for --window-hours
        hours = window_hours if explicit_hours else None
        window = Window(since=since, until=since + hours * 3600 if hours else None, window_hours=hours)
    elif until is not None:
        window = Window(since=until - window_hours * 3600 if window_hours else None, until=until,
                        window_hours=window_hours)
    else:  # the window_hours ending at the newest request in the pool
        window = Window(since=None, until=None, window_hours=window_hours)
    with pool_lock(home, shared=True):
        rows, bad = read_pool(pool)
        meta = _read_json(meta_path(pool))
    result = sample_rows(rows, n=n, seed=seed, window=window, max_model_len=max_model_len,
                         counter=counter, redactor=redactor, malformed=bad)
    _replayset.save(out, result.requests)
    rs = _replayset.load(out)  # what a study will read: prove it loads
    files = Counter((r.src or "?").rsplit(":", 1)[0] for r in result.rows)
    result.manifest.update({
        "workload": workload,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "replay_set": str(out.resolve()),
        "content_hash": rs.digest,
        "sources": {"pool": str(pool.resolve()), "pool_requests": len(rows) + bad,
                    "imported_from": sorted((meta or {}).get("sources", {})),
                    "sampled_from": dict(sorted(files.items()))},
        "spec": getattr(spec, "source", None) or None,
    })
    result.manifest["context"]["max_model_len_from"] = mml_source
    mpath = write_json_private(manifest_path(out), result.manifest)
    log.info("traffic sample %s: %d of %d eligible (pool %d; skipped %s), seed %d -> %s (%s)", workload,
             len(result.requests), result.manifest["counts"]["eligible"], len(rows) + bad,
             {k: v["count"] for k, v in result.manifest["skipped"].items()}, seed, out, rs.digest)
    return out, mpath, result


def _read_json(p: Path) -> dict | None:
    try:
        return json.loads(read_input(p, "manifest"))
    except (OSError, ValueError):
        return None
