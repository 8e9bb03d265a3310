"""Replay-client capacity: streamed chunks per second one core of the client sustains.

A replay client that cannot keep up with the server it measures adds its own delay to every
token it timestamps, and on a shared host takes CPU from the server. This benchmark streams from a fast local server (the aiohttp mock in
``autotune.testing``, no sleeps, one token per chunk) running in its own process pinned to one
core, with the replay client (``_replay.run_closed_loop``) pinned to another, at 64 and 256
concurrent streams. Reported per level: token-bearing chunks received per second of wall time,
the client's and the server's CPU time per wall second (from ``/proc/<pid>/stat``), and chunks
per client CPU-second (what one fully busy client core would sustain; equal to the first figure
when the client's share is 100%). When the server's share is the one near 100%, the server was
the bottleneck and the client's capacity is the per-CPU-second figure. For reference the same
closed loop and SSE parsing also run over httpx (the replay's transport before ``autotune.replay._http``)
and aiohttp (the library `vllm bench serve` uses).

    python benchmarks/client_capacity.py                      # 64 and 256 streams
    python benchmarks/client_capacity.py --streams 64,256 --tokens 256 --waves 4

Results are appended to ``benchmarks/results/client_capacity.json`` (a JSON list).
Needs two cores (``os.sched_setaffinity``); with one, both processes share it and it says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "client_capacity.json"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(core: int | None, tokens: int) -> int:
    """Child: the mock server pinned to ``core``; prints its port, runs until stdin closes."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    from autotune.testing import MockServer

    m = MockServer(tokens_per_request=tokens, spec=False)
    m.start()
    m.seen = _Discard()  # don't keep every request body of a long benchmark
    print(m.port, flush=True)
    sys.stdin.read()
    m.stop()
    return 0


class _Discard(list):
    def append(self, item) -> None:  # noqa: D401 - a list that keeps nothing
        pass


async def _reference_loop(kind: str, base_url: str, bodies: list[dict], streams: int) -> list:
    """The same closed loop and SSE parsing (``StreamParser``) over another HTTP library:
    ``httpx`` (one client, a pool of ``streams`` connections: the replay's transport before
    ``_http``) or ``aiohttp`` (what `vllm bench serve` uses)."""
    from autotune.replay._replay import StreamParser

    url = base_url + "/v1/completions"
    queue = list(reversed(bodies))
    parsers: list = []
    if kind == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
        async with httpx.AsyncClient(trust_env=False, limits=limits, timeout=600) as client:
            async def worker():
                while queue:
                    body, p = queue.pop(), StreamParser()
                    async with client.stream("POST", url, json=body) as resp:
                        async for line in resp.aiter_lines():
                            p.feed_line(line, time.monotonic())
                    parsers.append(p)
            await asyncio.gather(*(worker() for _ in range(streams)))
    else:
        import aiohttp

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams)) as session:
            async def worker():
                while queue:
                    body, p = queue.pop(), StreamParser()
                    async with session.post(url, json=body) as resp:
                        async for line in resp.content:
                            p.feed_line(line.decode(), time.monotonic())
                    parsers.append(p)
            await asyncio.gather(*(worker() for _ in range(streams)))
    return parsers


async def one_level(client: str, base_url: str, streams: int, n_requests: int, tokens: int, server_pid: int) -> dict:
    from autotune.replay._replay import run_closed_loop
    from autotune.traffic._replayset import ReplayRequest

    reqs = [ReplayRequest(id=f"cap{streams}-{i}", endpoint="completions",
                          body={"prompt": f"p{i}", "max_tokens": tokens}) for i in range(n_requests)]
    bodies = [{"prompt": f"p{i}", "max_tokens": tokens, "model": "m", "stream": True,
               "stream_options": {"include_usage": True}} for i in range(n_requests)]
    warm = [ReplayRequest(id=f"w{streams}-{i}", endpoint="completions", body={"prompt": "w", "max_tokens": 8})
            for i in range(streams)]
    await run_closed_loop(base_url, "m", warm, streams, timeout_s=600)  # server warm
    me = os.getpid()
    c0, s0, t0 = cpu_seconds(me), cpu_seconds(server_pid), time.monotonic()
    if client == "autotune":
        run = await run_closed_loop(base_url, "m", reqs, streams, timeout_s=600)
        ok = [(r.itl_ms, r.ok) for r in run.results]
        max_in_flight = run.max_in_flight
    else:
        parsers = await _reference_loop(client, base_url, bodies, streams)
        ok = [(p.itl_ms, p.done) for p in parsers]
        max_in_flight = None
    wall = time.monotonic() - t0
    c1, s1 = cpu_seconds(me), cpu_seconds(server_pid)
    good = [itl for itl, fine in ok if fine]
    chunks = sum(len(itl) + 1 for itl in good)  # token-bearing chunks: first + one per gap
    client_cpu, server_cpu = c1 - c0, s1 - s0
    return {"client": client, "streams": streams, "requests": len(reqs), "ok": len(good),
            "failed": len(reqs) - len(good), "tokens_per_request": tokens, "chunks": chunks, "wall_s": wall,
            "chunks_per_s": chunks / wall, "client_cpu_share": client_cpu / wall,
            "server_cpu_share": server_cpu / wall,
            "chunks_per_client_cpu_s": chunks / client_cpu if client_cpu > 0 else None,
            "client_cpu_us_per_chunk": client_cpu / chunks * 1e6 if chunks else None,
            "max_in_flight": max_in_flight}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="64,256", help="comma-separated concurrent stream counts")
    ap.add_argument("--tokens", type=int, default=256, help="tokens (= chunks) per request")
    ap.add_argument("--waves", type=int, default=4, help="requests per level = waves x streams")
    ap.add_argument("--clients", default="autotune,httpx,aiohttp",
                    help="autotune (the replay client) and references: httpx, aiohttp (comma-separated)")
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--client-core", type=int, default=1)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    pinned = len(cores) >= 2
    if args.serve:
        return serve(args.server_core if pinned else None, args.tokens)

    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--tokens", str(args.tokens),
                             "--server-core", str(args.server_core)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        for lib in {"httpx", "aiohttp"} & set(args.clients.split(",")):
            __import__(lib)  # imported before the clock starts
        if pinned:
            os.sched_setaffinity(0, {args.client_core})
        base_url = f"http://127.0.0.1:{port}"
        rows = []
        for streams in [int(x) for x in args.streams.split(",")]:
            for client in args.clients.split(","):
                row = asyncio.run(one_level(client, base_url, streams, args.waves * streams, args.tokens, proc.pid))
                rows.append(row)
                print(f"{client:9s} {streams:4d} streams: {row['chunks_per_s']:8.0f} chunks/s, client CPU "
                      f"{row['client_cpu_share']:.0%}, server CPU {row['server_cpu_share']:.0%}, "
                      f"{row['chunks_per_client_cpu_s']:8.0f} chunks per client CPU-second ({row['failed']} failed)",
                      flush=True)
    finally:
        proc.stdin.close()
        proc.wait(30)
    import httpx

    entry = {"at": time.time(), "host": platform.node(), "python": platform.python_version(),
             "httpx": httpx.__version__, "cpus": os.cpu_count(), "pinned": pinned,
             "server_core": args.server_core if pinned else None, "client_core": args.client_core if pinned else None,
             "load_avg_before": os.getloadavg(), "levels": rows}
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else []
    results.append(entry)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print("\n| client | concurrent streams | chunks/s | client CPU share | server CPU share | "
          "chunks per client CPU-second | client CPU per chunk |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['client']} | {r['streams']} | {r['chunks_per_s']:.0f} | {r['client_cpu_share']:.0%} | "
              f"{r['server_cpu_share']:.0%} | {r['chunks_per_client_cpu_s']:.0f} | {r['client_cpu_us_per_chunk']:.1f} us |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
