"""One measurement: start a server with one speculative config, replay, scrape, stop.

Everything a later decision needs is kept in the returned ``Measurement`` (and from there in the
trial's user attributes): per-request TPOTs for the bootstrap, output digests for the greedy
equivalence check, the server-side counters for acceptance, and the exact argv that ran.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import _metrics, _replay, _serverlog
from ._engine import ServerStartError, VllmServer, build_argv, free_port
from ._profile import ProfileRun
from ._replayset import ReplayRequest
from ._spec import StudySpec


@dataclass
class Measurement:
    config: dict | None
    argv: list[str]
    log_path: str
    start_seconds: float
    wall_seconds: float
    summary: dict
    spec_delta: dict
    tpot_ms: list[float]
    """Per-request TPOT the study decides on: the engine's own (see ``request_tpot``)."""
    client_tpot_ms: list[float]
    tpot_source: str
    tags: list[str | None] = field(default_factory=list)
    """workload tag of each entry of ``tpot_ms``: per-tag breakdowns of one deployment's traffic."""
    outputs: dict[str, str] = field(default_factory=dict)
    """request id -> sha1 of the generated text, greedy requests only."""
    errors: list[str] = field(default_factory=list)
    levels: dict[str, dict] = field(default_factory=dict)
    """``replay.mode: profile``: per level (``"4"``) its weight, in-window ``tpot_ms`` (engine's),
    ``client_tpot_ms``, ``tags``, ``tpot`` (the objective statistic) and ``summary``; ``tpot_ms``
    above is then the levels pooled with their weights (see ``_profile``). Empty otherwise."""
    engine_notes: dict[str, dict] = field(default_factory=dict)
    """what the server log said about the engine's path (``_serverlog.scan``)."""

    def to_attrs(self) -> dict:
        return asdict(self)


class TrialFailed(RuntimeError):
    """A trial that produced no measurement; ``reason`` is what the study records."""

    def __init__(self, reason: str, log_path: str | None = None, start_seconds: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.log_path = log_path
        self.start_seconds = start_seconds


def digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def measure(spec: StudySpec, config: dict | None, requests: list[ReplayRequest],
            warmup: list[ReplayRequest], log_path: Path, command: list[str],
            on_server=None, extra_args: dict | None = None, pid_dir: Path | None = None) -> Measurement:
    """Run one server start. Raises TrialFailed (with vLLM's reason) when the server won't start,
    dies during the replay (``kill -9``, OOM, a crash: the trial fails, the study goes on), or
    the replay itself breaks.

    ``extra_args`` are the tuner's own serve args (per-request metrics).

    ``on_server`` is called with the running VllmServer, so a signal handler can stop it.
    ``pid_dir`` gets the server's pidfile while it runs (see ``_recovery``).
    """
    port = free_port()
    serve_args = {**spec.engine.serve_args, **(extra_args or {})}
    # benchmark-only additions (synthetic acceptance) go to the server, never into ``config``
    run_config = spec.run_config(config)
    argv = build_argv(command, spec.model, serve_args, run_config, port, spec.served_model_name)
    server = VllmServer(argv=argv, port=port, log_path=log_path, env=dict(spec.engine.env),
                        start_timeout_s=spec.engine.start_timeout_s, stop_timeout_s=spec.engine.stop_timeout_s,
                        pid_dir=pid_dir)
    t0 = time.monotonic()
    try:
        if on_server:
            on_server(server)
        try:
            server.start()
        except ServerStartError as e:
            raise TrialFailed(e.reason, str(e.log_path)) from None
        model = spec.served_model_name or spec.model
        try:
            run, before, after = asyncio.run(_replay_with_scrape(server.base_url, model, requests, warmup, spec))
        except Exception as e:  # a dead server surfaces here as a refused /metrics scrape
            died = server.death(grace_s=5.0)
            reason = (f"vllm serve died during the replay ({died})" if died
                      else f"the replay failed: {type(e).__name__}: {e}")
            raise TrialFailed(reason, str(log_path), server.start_seconds) from None
        died = server.death() if server.proc is not None else "not running"
        if died:
            raise TrialFailed(f"vllm serve died during the replay ({died})", str(log_path), server.start_seconds)
    finally:
        server.stop()
        if on_server:
            on_server(None)
    d = _metrics.delta(before, after)
    ok = run.ok()
    failed = run.failed()
    outputs = {r.id: digest(r.text) for r in ok if _is_greedy([*warmup, *requests], r.id)}
    levels: dict[str, dict] = {}
    if isinstance(run, ProfileRun):  # the levels pooled with their traffic weights
        timed = run.weighted_tpots(request_tpot)
        client_tpots = [v for v, _ in run.weighted_tpots(lambda r: (r.tpot_ms, "client"))]
        levels = run.level_details(request_tpot, spec.objective.statistic)
    else:
        timed = [(request_tpot(r)[0], r.tag) for r in ok if request_tpot(r)[0] is not None]
        client_tpots = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    tpots = [v for v, _ in timed]
    return Measurement(
        config=config, argv=argv, log_path=str(log_path), start_seconds=server.start_seconds or 0.0,
        wall_seconds=time.monotonic() - t0, summary=run.summary(spec.objective.statistic),
        spec_delta=d.to_dict(), tpot_ms=tpots, client_tpot_ms=client_tpots,
        tpot_source="server" if all(request_tpot(r)[1] == "server" for r in ok) else "client",
        outputs=outputs, tags=[t for _, t in timed], errors=[f"{r.id}: {r.error}" for r in failed][:20],
        levels=levels, engine_notes=_serverlog.scan(log_path),
    )


def request_tpot(r) -> tuple[float | None, str]:
    """The engine's per-request TPOT (``metrics.mean_itl_ms``, from engine-side timestamps) when
    the server reports it, else the client's (e2e - TTFT)/(n - 1).

    On a loaded host the API server can fall behind the engine and flush a whole response at
    once: the client then sees a long TTFT and a near-zero TPOT although decoding ran at its
    normal pace. The engine's timestamps do not have that bias.
    """
    v = (r.server_metrics or {}).get("mean_itl_ms")
    if isinstance(v, (int, float)) and v > 0:
        return float(v), "server"
    return r.tpot_ms, "client"


def _is_greedy(requests: list[ReplayRequest], rid: str) -> bool:
    return any(r.id == rid and r.greedy for r in requests)


async def _replay_with_scrape(base_url, model, requests, warmup, spec):
    """Replay in the spec's ``replay.mode``; the /metrics scrapes around the measured part.

    ``open``: the warm-up runs on into the measured phase by design, so the counter deltas
    include it (per-request acceptance and TPOT do not). ``profile``: the pool is the warm-up
    then the measured requests, split by ``run_profile`` into per-level warm-ups and measured
    sets; the deltas cover all levels.
    """
    import httpx

    mode = spec.replay.mode
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        if mode == "open":
            before = await _metrics.scrape(client, base_url)
            run = await _replay.run_open_loop(base_url, model, requests, time_scale=spec.replay.time_scale,
                                              timeout_s=spec.replay.timeout_s, warmup=warmup)
            after = await _metrics.scrape(client, base_url)
            return run, before, after
        if mode == "profile":
            from ._bands import run_profile_scraped, scraped_profile_run  # a /metrics scrape around each level

            before = await _metrics.scrape(client, base_url)
            runs, deltas = await run_profile_scraped(client, base_url, model, [*warmup, *requests],
                                                     levels=spec.replay.levels, timeout_s=spec.replay.timeout_s)
            after = await _metrics.scrape(client, base_url)
            return scraped_profile_run(runs, spec.replay.weights(), deltas), before, after
        if warmup:
            await _replay.run_closed_loop(base_url, model, warmup, spec.replay.concurrency,
                                          timeout_s=spec.replay.timeout_s)
        before = await _metrics.scrape(client, base_url)
        run = await _replay.run_closed_loop(base_url, model, requests, spec.replay.concurrency,
                                            timeout_s=spec.replay.timeout_s)
        after = await _metrics.scrape(client, base_url)
    return run, before, after
