"""The replay's HTTP/1.1 client (``autotune.replay._http``) against a scripted raw asyncio server:
body framings, keep-alive reuse, a stale keep-alive connection, protocol errors."""

from __future__ import annotations

import asyncio
import json

import pytest

from autotune.replay import _http
from autotune.replay._replay import run_closed_loop
from autotune.traffic._replayset import ReplayRequest

SSE = [b'data: {"choices":[{"index":0,"text":" a"}]}\n\n', b'data: {"choices":[{"index":0,"text":" b"}]}\n\n',
       b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n', b"data: [DONE]\n\n"]


class RawServer:
    """Answers every POST per ``framing``: chunked | length | close (read-to-close body) |
    stale (chunked, then closes the idle connection without saying so) | garbage."""

    def __init__(self, framing: str = "chunked"):
        self.framing = framing
        self.connections = 0
        self.requests: list[tuple[bytes, dict]] = []

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()

    async def handle(self, reader, writer):
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                lines = head.decode().split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                self.requests.append((lines[0].encode(), headers))
                json.loads(body)
                if self.framing == "garbage":
                    writer.write(b"SPDY/9 what\r\n\r\n")
                    await writer.drain()
                    return
                if self.framing in ("chunked", "stale"):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                    for piece in SSE:
                        writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                        await writer.drain()
                    writer.write(b"0\r\n\r\n")
                elif self.framing == "length":
                    payload = b"".join(SSE)
                    writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: {len(payload)}\r\n\r\n".encode() + payload)
                elif self.framing == "close":
                    writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + b"".join(SSE))
                    await writer.drain()
                    return
                await writer.drain()
                if self.framing == "stale":
                    return
        finally:
            writer.close()


def reqs(n: int) -> list[ReplayRequest]:
    return [ReplayRequest(id=f"r{i}", endpoint="completions", body={"prompt": "x"}) for i in range(n)]


@pytest.mark.parametrize("framing", ["chunked", "length", "close", "stale"])
def test_framings_and_connection_reuse(framing):
    async def go():
        async with RawServer(framing) as srv:
            run = await run_closed_loop(srv.url, "m", reqs(6), 2, timeout_s=5)
            return run, srv.connections

    run, connections = asyncio.run(go())
    assert len(run.ok()) == 6, run.summary()["errors"]
    assert all(r.text == " a b" and r.output_tokens == 2 for r in run.ok())
    if framing in ("chunked", "length"):
        assert connections == 2  # one keep-alive connection per request in flight
    else:
        assert connections == 6  # closed by the server after each response: a fresh one each time


def test_protocol_error_and_connect_error():
    async def go():
        async with RawServer("garbage") as srv:
            bad = await run_closed_loop(srv.url, "m", reqs(1), 1, timeout_s=5)
        refused = await run_closed_loop(srv.url, "m", reqs(1), 1, timeout_s=5)
        return bad, refused

    bad, refused = asyncio.run(go())
    assert bad.results[0].error.startswith("RemoteProtocolError: not an HTTP/1.1 status line")
    assert refused.results[0].error.startswith("ConnectError: cannot connect to 127.0.0.1")


def test_header_values_cannot_inject():
    async def go():
        async with RawServer() as srv:
            async with _http.Pool(srv.url) as pool:
                async with await pool.post("/v1/completions", b"{}", {"X-Autotune-Request-Id": "a\r\nEvil: 1"}) as r:
                    body = await r.read()
            return srv.requests, body

    requests, body = asyncio.run(go())
    (line, headers), = requests
    assert line == b"POST /v1/completions HTTP/1.1"
    assert "evil" not in headers and headers["x-autotune-request-id"] == "a%0D%0AEvil: 1"
    assert body.endswith(b"data: [DONE]\n\n")


def test_base_url_prefix_and_bad_scheme():
    pool = _http.Pool("http://gw.example:8080/vllm/")
    assert (pool.host, pool.port, pool.prefix, pool.host_header) == ("gw.example", 8080, "/vllm", "gw.example:8080")
    assert _http.Pool("https://h").port == 443
    with pytest.raises(ValueError, match="unsupported base URL"):
        _http.Pool("unix:///tmp/sock")
