"""A lean HTTP/1.1 client for the replay's streamed POSTs (asyncio streams, keep-alive pool).

Why not httpx here: the replay client shares the host with the server it measures, and every
CPU-microsecond it spends per streamed chunk is taken from the server (on the 2-core CPU hosts
the server then ran measurably slower while our client read it) and sits between a chunk's
arrival and its timestamp. Per chunk, httpx goes through httpcore, h11, anyio and two decoder
layers; this module reads a chunked body with two buffered reads per chunk. Measured against
the same local server: about 2.5x fewer client CPU-seconds per chunk than httpx, and fewer than
aiohttp (which `vllm bench serve` uses). See benchmarks/client_capacity.py.

Scope: ``http`` and ``https`` URLs, requests with a body, responses with ``Transfer-Encoding:
chunked``, ``Content-Length`` or read-to-close bodies; no proxies, redirects, compression or
HTTP/2 (the replay talks to one server directly). Errors carry the names the replay reports:
:class:`ConnectError` (could not connect), :class:`RemoteProtocolError` (the server closed the
connection or broke the protocol mid-response).

A connection from the pool that turns out to be closed by the server before it answered
(keep-alive timeout) is retried once on a fresh connection; nothing is retried after the
response has started.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from typing import AsyncIterator
from urllib.parse import quote, urlsplit

__all__ = ["HTTPError", "ConnectError", "RemoteProtocolError", "Pool", "Response"]

_READ_LIMIT = 1 << 20  # longest header block / chunk-size line
_SAFE_HEADER = set(range(0x20, 0x7F))


class HTTPError(Exception):
    """Base of the transport errors."""


class ConnectError(HTTPError):
    """No connection to the server (refused, unreachable, DNS, TLS handshake)."""


class RemoteProtocolError(HTTPError):
    """The server closed the connection or sent something that is not HTTP/1.1."""


def _header_value(v: str) -> str:
    if all(ord(c) in _SAFE_HEADER for c in v):
        return v
    return quote(v, safe="".join(chr(c) for c in _SAFE_HEADER if chr(c) not in "%"))


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - closing a broken transport
            pass


@dataclass
class Response:
    status: int
    reason: str
    headers: dict[str, str]
    _conn: _Conn
    _pool: "Pool"
    _complete: bool = False
    _reusable: bool = True
    _released: bool = field(default=False, repr=False)

    async def iter_raw(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (one piece per HTTP chunk when chunked); the connection
        goes back to the pool once the body has been read to its end."""
        r = self._conn.reader
        te = self.headers.get("transfer-encoding", "").lower()
        try:
            if "chunked" in te:
                while True:
                    line = await r.readline()
                    if not line.endswith(b"\n"):
                        raise RemoteProtocolError("peer closed connection without sending complete message body")
                    try:
                        size = int(line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise RemoteProtocolError(f"malformed chunk size line {line[:40]!r}") from None
                    if size == 0:
                        while True:  # trailers, then the blank line
                            t = await r.readline()
                            if not t.endswith(b"\n"):
                                raise RemoteProtocolError("peer closed connection inside the chunked trailer")
                            if t in (b"\r\n", b"\n"):
                                break
                        break
                    data = await r.readexactly(size + 2)
                    yield data[:-2]
            elif "content-length" in self.headers:
                left = int(self.headers["content-length"])
                while left > 0:
                    data = await r.read(min(left, 1 << 16))
                    if not data:
                        raise RemoteProtocolError("peer closed connection without sending complete message body")
                    left -= len(data)
                    yield data
            else:  # read to close
                self._reusable = False
                while True:
                    data = await r.read(1 << 16)
                    if not data:
                        break
                    yield data
        except asyncio.IncompleteReadError:
            raise RemoteProtocolError("peer closed connection without sending complete message body") from None
        except (ConnectionError, OSError) as e:
            raise RemoteProtocolError(f"connection lost: {type(e).__name__}") from None
        self._complete = True
        self._release()

    async def read(self, limit: int = 1 << 16) -> bytes:
        """The body (at most ``limit`` bytes kept; the rest is read and dropped)."""
        out = bytearray()
        async for piece in self.iter_raw():
            if len(out) < limit:
                out += piece[:limit - len(out)]
        return bytes(out)

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._complete and self._reusable and self.headers.get("connection", "").lower() != "close":
            self._pool._put(self._conn)
        else:
            self._pool._discard(self._conn)

    async def __aenter__(self) -> "Response":
        return self

    async def __aexit__(self, *exc) -> None:
        self._release()


class Pool:
    """Keep-alive connections to one server; one connection per request in flight, reused LIFO."""

    def __init__(self, base_url: str, timeout_s: float | None = None) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"unsupported base URL {base_url!r}: expected http://host[:port][/prefix]")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        netloc = u.netloc.rsplit("@", 1)[-1]
        self.host_header = netloc
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if u.scheme == "https" else None
        self.timeout_s = timeout_s
        self._free: list[_Conn] = []
        self._conns: dict[int, _Conn] = {}

    async def _connect(self) -> _Conn:
        try:
            reader, writer = await asyncio.open_connection(
                self.host, self.port, ssl=self._ssl, limit=_READ_LIMIT,
                server_hostname=self.host if self._ssl else None)
        except (OSError, ssl.SSLError) as e:
            why = getattr(e, "strerror", None) or str(e) or type(e).__name__
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: {why}") from None
        conn = _Conn(reader, writer)
        self._conns[id(conn)] = conn
        return conn

    def _put(self, conn: _Conn) -> None:
        self._free.append(conn)

    def _discard(self, conn: _Conn) -> None:
        conn.close()
        self._conns.pop(id(conn), None)

    async def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> Response:
        """Send ``POST prefix+path`` and read the status line and headers. Use the response as
        an async context manager so its connection is released (or closed) on every path."""
        lines = [f"POST {self.prefix}{path} HTTP/1.1", f"Host: {self.host_header}",
                 "User-Agent: autotune-replay", "Accept: */*", "Content-Type: application/json",
                 f"Content-Length: {len(body)}"]
        lines += [f"{k}: {_header_value(str(v))}" for k, v in (headers or {}).items()]
        payload = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        for attempt in (0, 1):
            reused = bool(self._free) and attempt == 0
            conn = self._free.pop() if reused else await self._connect()
            try:
                conn.writer.write(payload)
                head = await conn.reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
                self._discard(conn)
                if reused:
                    continue  # the server had closed the idle keep-alive connection: once more, fresh
                raise RemoteProtocolError(f"server disconnected without sending a response "
                                          f"({type(e).__name__})") from None
            except asyncio.LimitOverrunError:
                self._discard(conn)
                raise RemoteProtocolError("response header block too long") from None
            except BaseException:
                self._discard(conn)
                raise
            try:
                return self._response(head, conn)
            except RemoteProtocolError:
                self._discard(conn)
                raise
        raise AssertionError("unreachable")

    def _response(self, head: bytes, conn: _Conn) -> Response:
        text = head.decode("latin-1")
        status_line, _, rest = text.partition("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise RemoteProtocolError(f"not an HTTP/1.1 status line: {status_line[:60]!r}")
        headers: dict[str, str] = {}
        for line in rest.split("\r\n"):
            if not line:
                continue
            k, sep, v = line.partition(":")
            if not sep:
                raise RemoteProtocolError(f"malformed header line {line[:60]!r}")
            k = k.strip().lower()
            headers[k] = f"{headers[k]}, {v.strip()}" if k in headers else v.strip()
        resp = Response(status=int(parts[1]), reason=parts[2] if len(parts) > 2 else "", headers=headers,
                        _conn=conn, _pool=self)
        if parts[0] == "HTTP/1.0":
            resp._reusable = False
        return resp

    async def aclose(self) -> None:
        for conn in list(self._conns.values()):
            conn.close()
        self._conns.clear()
        self._free.clear()

    async def __aenter__(self) -> "Pool":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
