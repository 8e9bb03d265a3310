"""Closed-loop streaming replay of a replay set against an OpenAI-compatible server.

Why closed loop: the tuned quantity is TPOT at a given concurrency, and speculative
decoding's benefit shrinks as the batch grows; a closed loop holds exactly
``concurrency`` requests in flight, so a trial measures the batch size it claims.

Timing is client side (``time.monotonic``): TTFT is send -> first token-bearing
chunk, e2e is send -> ``[DONE]``, TPOT is ``(e2e - ttft) / (completion_tokens - 1)``
with the server-reported usage (a chunk can carry several tokens when drafts are
accepted, so chunks cannot be counted instead).

SSE parsing is split into :func:`parse_sse_line` and :class:`StreamParser`, which
take text lines and timestamps only, so they are tested on real captures.

Privacy: prompts and generated text are never logged at INFO; per-request lines
go to DEBUG and carry ids, not text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import httpx

from ._measure import STATISTICS, detect_stall, percentiles, request_tpot_ms, summarize
from ._replayset import ReplayRequest

__all__ = [
    "DONE",
    "ID_HEADER",
    "parse_sse_line",
    "StreamParser",
    "RequestResult",
    "ReplayRun",
    "run_closed_loop",
    "replay",
]

log = logging.getLogger(__name__)

#: Returned by parse_sse_line for the ``data: [DONE]`` end-of-stream marker.
DONE = "[DONE]"

#: Header carrying the replay-set request id.  vLLM ignores it (unlike X-Request-Id,
#: whose reuse across warm-up and measured runs could collide); the mock server uses it.
ID_HEADER = "X-Autotune-Request-Id"

_ERROR_EXCERPT = 500
_DRAIN_S = 5.0  # grace for reading the end of a body after [DONE]


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
    done_at: float | None = None
    error: str | None = None
    chunks: int = 0

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
        carried_any = False
        n_tokens: int | None = 0
        for choice in event.get("choices") or []:
            text, carried, n = _chunk_tokens(choice)
            if choice.get("index", 0) == 0:
                self.text_parts.append(text)
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

    def to_dict(self) -> dict:
        return asdict(self)


def _stats(values: list[float]) -> dict[str, float] | None:
    return percentiles(values) if values else None


@dataclass
class ReplayRun:
    results: list[RequestResult]
    concurrency: int
    wall_s: float
    steady_state: tuple[float, float] | None

    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    def failed(self) -> list[RequestResult]:
        return [r for r in self.results if not r.ok]

    def summary(self, statistic: str = "median") -> dict:
        """Plain-JSON digest of the run; latency fields are None when no value exists."""
        if statistic not in STATISTICS:
            raise ValueError(f"unknown statistic {statistic!r}; expected one of {', '.join(STATISTICS)}")
        ok = self.ok()
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
        return {
            "n": len(self.results),
            "ok": len(ok),
            "failed": len(failed),
            "concurrency": self.concurrency,
            "wall_s": self.wall_s,
            "steady_state_s": (self.steady_state[1] - self.steady_state[0]) if self.steady_state else None,
            "tpot_ms": tpot_d,
            "ttft_ms": _stats(ttft),
            "itl_ms": _stats(itl),
            "output_tokens": out_tokens,
            "output_throughput_tok_s": out_tokens / self.wall_s if self.wall_s > 0 else None,
            "spec": spec_d,
            "stall": stall,
            "errors": dict(errors.most_common(10)),
        }


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


async def _one(client: httpx.AsyncClient, base_url: str, model: str, req: ReplayRequest,
               timeout_s: float) -> RequestResult:
    """Send one request and read its stream; every failure becomes an ok=False result."""
    url = base_url.rstrip("/") + req.path
    body = _body(req, model)
    parser = StreamParser()
    status: int | None = None
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            async with client.stream("POST", url, json=body, headers={ID_HEADER: req.id}) as resp:
                status = resp.status_code
                if status != 200:
                    raw = (await resp.aread()).decode("utf-8", "replace")
                    return _failure(req, f"HTTP {status}: {raw[:_ERROR_EXCERPT].strip()}", status, t0)
                # Read to the end of the body even after [DONE] so the connection
                # goes back to the pool instead of being closed.
                async for line in resp.aiter_lines():
                    was_done = parser.done
                    parser.feed_line(line, time.monotonic())
                    if parser.error:
                        break
                    if parser.done and not was_done:  # don't wait long for a lingering body
                        deadline.reschedule(min(deadline.when() or float("inf"),
                                                asyncio.get_running_loop().time() + _DRAIN_S))
    except Exception as e:  # noqa: BLE001 - a failed request is a result, never an exception
        if parser.done_at is None:
            if isinstance(e, TimeoutError):
                err = f"timeout after {timeout_s:g}s"
            elif isinstance(e, ValueError) and not isinstance(e, httpx.HTTPError):
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
    tpot = request_tpot_ms(e2e, ttft, out_tokens) if (ttft is not None and out_tokens) else None
    metrics = dict(parser.metrics) if parser.metrics else None
    spec = metrics.pop("speculative_decoding", None) if metrics else None
    result = RequestResult(
        id=req.id, tag=req.tag, ok=True, error=None, status=status,
        ttft_ms=ttft, e2e_ms=e2e, tpot_ms=tpot, itl_ms=parser.itl_ms,
        output_tokens=out_tokens, prompt_tokens=usage.get("prompt_tokens"),
        finish_reason=parser.finish_reason, text=parser.text,
        spec=spec if isinstance(spec, dict) else None, server_metrics=metrics,
        started_at=t0, finished_at=t_end,
    )
    log.debug("request %s done: %s tokens, ttft %.1f ms, tpot %s ms", req.id, out_tokens,
              ttft if ttft is not None else float("nan"), tpot)
    return result


async def _loop(client: httpx.AsyncClient, base_url: str, model: str,
                requests: Sequence[ReplayRequest], concurrency: int, timeout_s: float
                ) -> tuple[list[RequestResult], tuple[float, float] | None]:
    """Run ``concurrency`` workers over a shared queue; results are in request order."""
    queue: asyncio.Queue[tuple[int, ReplayRequest]] = asyncio.Queue()
    for i, r in enumerate(requests):
        queue.put_nowait((i, r))
    results: list[RequestResult | None] = [None] * len(requests)
    first_start: list[float | None] = [None] * concurrency
    last_end: list[float | None] = [None] * concurrency

    async def worker(w: int) -> None:
        while True:
            try:
                i, req = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            res = await _one(client, base_url, model, req, timeout_s)
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
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(timeout_s)
    async with httpx.AsyncClient(http1=True, http2=False, trust_env=False, limits=limits,
                                 timeout=timeout) as client:
        if warmup:
            wres, _ = await _loop(client, base_url, model, warmup, concurrency, timeout_s)
            n_bad = sum(not r.ok for r in wres)
            log.info("warm-up: %d requests, %d failed", len(wres), n_bad)
        t0 = time.monotonic()
        results, steady = await _loop(client, base_url, model, requests, concurrency, timeout_s)
        wall = time.monotonic() - t0
    n_bad = sum(not r.ok for r in results)
    log.info("replay: %d requests at concurrency %d in %.2f s, %d failed", len(results), concurrency,
             wall, n_bad)
    return ReplayRun(results=results, concurrency=concurrency, wall_s=wall, steady_state=steady)


def replay(base_url: str, model: str, requests: Sequence[ReplayRequest], concurrency: int,
           timeout_s: float = 300.0, warmup: Sequence[ReplayRequest] = ()) -> ReplayRun:
    """Synchronous wrapper around :func:`run_closed_loop` (must not be called inside a running loop)."""
    return asyncio.run(run_closed_loop(base_url, model, requests, concurrency, timeout_s, warmup))
