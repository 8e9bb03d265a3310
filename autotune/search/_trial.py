"""One measurement: start a server with one speculative config, replay, scrape, stop.

Everything a later decision needs is kept in the returned ``Measurement`` (and from there in the
trial's user attributes): per-request TPOTs for the bootstrap, output digests for the greedy
equivalence check, the server-side counters for acceptance, and the exact argv that ran.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from autotune.core import _measure
from autotune.core._spec import StudySpec
from autotune.core._settings import get_settings
from autotune.engines import _affinity, _metrics, _preload, _registry, _serverlog, _startup
from autotune.engines._engine import ServerStartError, VllmServer, free_port
from autotune.replay import _logprobs, _replay
from autotune.replay._profile import ProfileRun
from autotune.search import _equivalence, _settle
from autotune.search._bands import BANDS_KEY, run_profile_scraped, scraped_profile_run
from autotune.search._observations import k_of
from autotune.traffic._replayset import ReplayRequest

log = logging.getLogger(__name__)


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
    texts: dict[str, str] = field(default_factory=dict)
    """request id -> the generated text of the same requests: where a candidate leaves the baseline."""
    token_ids: dict[str, list[int]] = field(default_factory=dict)
    """request id -> the generated token ids, where the engine returned them (the equivalence replays)."""
    logprobs: dict[str, list] = field(default_factory=dict)
    """the baseline's (no speculation) equivalence replays: request id -> ``_equivalence.reference``."""
    engine_noise: dict | None = None
    """the baseline's equivalence replays a second time in another batching: ``_equivalence.engine_noise``."""
    errors: list[str] = field(default_factory=list)
    levels: dict[str, dict] = field(default_factory=dict)
    """``replay.mode: profile``: per level (``"4"``) its weight, in-window ``tpot_ms`` (engine's),
    ``client_tpot_ms``, ``tags``, ``tpot`` (the objective statistic) and ``summary``; ``tpot_ms``
    above is then the levels pooled with their weights (see ``_profile``). Empty otherwise."""
    engine_notes: dict[str, dict] = field(default_factory=dict)
    """what the server log said about the engine's path (``_serverlog.scan``)."""
    tpot_mixed: dict[str, int] = field(default_factory=dict)
    """set when some requests had the engine's TPOT and others only the client's: the counts of
    each (``tpot_ms`` then keeps the engine's only; ``tpot_source`` is ``mixed``)."""
    timeline: dict = field(default_factory=dict)
    """where the start's seconds went (``timeline``): the engine's start-up phases, then settle,
    measure, outputs (the equivalence replays) and stop."""

    def to_attrs(self) -> dict:
        return asdict(self)


class TrialFailed(RuntimeError):
    """A trial that produced no measurement; ``reason`` is what the study records."""

    def __init__(self, reason: str, log_path: str | None = None, start_seconds: float | None = None,
                 timeline: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.log_path = log_path
        self.start_seconds = start_seconds
        self.timeline = timeline
        """where the start's time went, as far as it got (``timeline``)"""


def digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def batch_invariant(spec: StudySpec, caps=None, serve_args: dict | None = None) -> bool:
    """Whether the engine's greedy outputs of concurrent requests can be compared (see
    ``Engine.batch_invariant``); if not, only one-at-a-time replays are. ``caps``: the probe's
    ``Capabilities`` (vLLM: its platform), None where not known. The server inherits the
    tuner's environment under the spec's ``engine.env``, so both are what it runs with."""
    env = {**os.environ, **spec.engine.env}
    return _registry.for_spec(spec).batch_invariant(spec.engine.serve_args if serve_args is None else serve_args,
                                                    env, caps)


def equivalence_requests(spec: StudySpec, requests: list[ReplayRequest], caps=None) -> list[ReplayRequest]:
    """The greedy requests replayed after the measured part of every start, for their outputs
    only (their timings are not measured), so the equivalence check compares enough outputs.

    Batch-invariant engine: greedy copies of sampled requests when the measured ones hold fewer
    greedy requests than ``guards.equivalence_min_compared`` (the measured greedy outputs count).
    Otherwise the measured outputs cannot be compared, so up to that many greedy requests (copies
    of sampled ones) are replayed one at a time, with the engine's ``equivalence_body`` added."""
    n = spec.guards.equivalence_min_compared
    engine = _registry.for_spec(spec)
    if not batch_invariant(spec, caps):
        extra = engine.equivalence_body or {}
        return [replace(g, body={**g.body, **extra}) for g in
                (r if r.greedy else r.greedy_copy() for r in requests[:n])]
    need = n - sum(1 for r in requests if r.greedy)
    return [r.greedy_copy() for r in requests if not r.greedy][:max(need, 0)]


def preload_next(spec: StudySpec, argv0: str, server_cpus=None) -> bool:
    """``engine.preload`` (vLLM only, the spec says): have a `vllm serve` of this spec imported for
    the next start (``engines._preload``); whether the spec preloads. ``server_cpus``: the
    server's placement where the caller has it."""
    if not spec.engine.preload:
        return False
    if server_cpus is None:
        settings = get_settings()
        server_cpus, _ = _affinity.placement(settings.server_cpus, settings.client_cpus)
    _preload.POOL.prime(argv0, {**os.environ, **spec.engine.env}, server_cpus)
    return True


def measure(spec: StudySpec, config: dict | None, requests: list[ReplayRequest],
            warmup: list[ReplayRequest], log_path: Path, command: list[str],
            on_server=None, extra_args: dict | None = None, pid_dir: Path | None = None,
            equivalence: list[ReplayRequest] | None = None,
            reserve: list[ReplayRequest] | None = None,
            windows: list[tuple[list[ReplayRequest], list[ReplayRequest]]] | None = None,
            caps=None, last: bool = False) -> Measurement:
    """Run one server start. Raises TrialFailed (with vLLM's reason) when the server won't start,
    dies during the replay (``kill -9``, OOM, a crash: the trial fails, the study goes on), or
    the replay itself breaks.

    ``extra_args`` are the tuner's own serve args (per-request metrics). ``equivalence``: greedy
    copies replayed after the measured part, for their outputs only (``equivalence_requests``).
    ``reserve``: requests a profile level may draw to fill its steady window (``WindowTarget``).
    ``windows``: the (warm-up, measured) requests of each further window (``replay.windows``,
    ``_study.window_requests``), measured after the first on the same server and pooled with it.

    ``caps``: the probe's ``Capabilities``, for whether measured greedy outputs count
    (``batch_invariant``; the study passes its own, so this agrees with ``equivalence_requests``).
    ``last``: no start follows, so none is preloaded (``engine.preload``).

    ``on_server`` is called with the running VllmServer, so a signal handler can stop it.
    ``pid_dir`` gets the server's pidfile while it runs (see ``engines._recovery``).
    """
    if len(windows or []) != spec.replay.windows - 1:
        raise ValueError(f"replay.windows is {spec.replay.windows}: {spec.replay.windows - 1} further windows' "
                         f"requests are needed (_study.window_requests), {len(windows or [])} given")
    port = free_port()
    serve_args = {**spec.engine.serve_args, **(extra_args or {})}
    # benchmark-only additions (synthetic acceptance) go to the server, never into ``config``
    run_config = spec.run_config(config)
    engine = _registry.for_spec(spec)
    invariant = batch_invariant(spec, caps, serve_args)  # else outputs only from one-at-a-time replays
    argv = engine.build_argv(command, spec.model, serve_args, run_config, port, spec.served_model_name)
    settings = get_settings()
    server_cpus, client_cpus = _affinity.placement(settings.server_cpus, settings.client_cpus)
    env = {**spec.engine.env, **engine.server_env(run_config, dict(spec.engine.env), Path(settings.home),
                                                  settings.vllm_compile_cache)}
    pre = _preload.POOL.take(argv[0], {**os.environ, **env}, server_cpus) if spec.engine.preload else None
    server = VllmServer(argv=argv, port=port, log_path=log_path, env=env,
                        start_timeout_s=spec.engine.start_timeout_s, stop_timeout_s=spec.engine.stop_timeout_s,
                        pid_dir=pid_dir, cpus=server_cpus, preloaded=pre, **engine.server_kwargs())
    t0 = time.monotonic()
    tl: dict = {}  # filled as the start goes; a failure carries what it reached
    own_cpus = os.sched_getaffinity(0) if client_cpus else None  # given back after the start
    try:
        _affinity.pin_current_thread(client_cpus)
        if on_server:
            on_server(server)
        if not last:  # the next start's imports run while this server starts, and end before it is measured
            preload_next(spec, argv[0], server_cpus)
        try:
            server.start()
        except ServerStartError as e:
            raise TrialFailed(e.reason, str(e.log_path), timeline=tl) from None
        if spec.engine.preload:
            _preload.POOL.idle()
        model = spec.served_model_name or spec.model
        try:
            t = time.monotonic()
            run, before, after, settled = asyncio.run(
                _replay_with_scrape(server.base_url, model, requests, warmup, spec, log_path, reserve, windows))
            tl["settle"] = round(settled.get("seconds", 0.0), 2)
            tl["measure"] = round(time.monotonic() - t - tl["settle"], 2)
            t = time.monotonic()
            eq_run, eq_again = asyncio.run(_equivalence_replays(
                server.base_url, model, equivalence, spec, invariant, engine.logprobs, baseline=config is None))
            tl["outputs"] = round(time.monotonic() - t, 2)
        except Exception as e:  # a dead server surfaces here as a refused /metrics scrape
            died = server.death(grace_s=5.0)
            reason = (f"{engine.server} died during the replay ({died})" if died
                      else f"the replay failed: {type(e).__name__}: {e}")
            raise TrialFailed(reason, str(log_path), server.start_seconds, tl) from None
        died = server.death() if server.proc is not None else "not running"
        if died:
            raise TrialFailed(f"{engine.server} died during the replay ({died})", str(log_path),
                              server.start_seconds, tl)
    finally:
        launched, healthy = server.launched_at, server.start_seconds
        t = time.monotonic()
        server.stop()
        tl.update(timeline(log_path, launched, healthy, time.monotonic() - t, time.monotonic() - t0,
                           engine.start_milestones))
        if getattr(server, "preloaded_start", False):
            tl["preloaded"] = True
        if own_cpus:
            os.sched_setaffinity(0, own_cpus)
        if on_server:
            on_server(None)
    d = _metrics.delta(before, after)
    bad = _metrics.nonsense(d)  # a profile level's own scrapes are checked as they are taken (_bands)
    if bad:
        raise TrialFailed(f"{engine.name}'s /metrics cannot be true: {bad}", str(log_path), server.start_seconds, tl)
    ok = run.ok()
    failed = run.failed()
    greedy = [r for r in ok if invariant and _is_greedy([*warmup, *requests], r.id)]
    if eq_run is not None:  # greedy copies of sampled requests: outputs only, after the measured part
        greedy += eq_run.ok()
    outputs = {r.id: digest(r.text) for r in greedy}
    texts = {r.id: r.text for r in greedy}
    token_ids = {r.id: r.token_ids for r in greedy if r.token_ids}
    refs = {r.id: ref for r in greedy if (ref := _equivalence.reference(r.logprobs))}
    noise = _equivalence.engine_noise({r.id: r.logprobs for r in eq_run.ok()},
                                      {r.id: r.logprobs for r in eq_again.ok()}) if eq_again else None
    levels: dict[str, dict] = {}
    if isinstance(run, ProfileRun):  # the levels pooled with their traffic weights
        timed = run.weighted_tpots(request_tpot)
        client_tpots = [v for v, _ in run.weighted_tpots(lambda r: (r.tpot_ms, "client"))]
        levels = run.level_details(request_tpot, spec.objective.statistic)
        for lv, detail in levels.items():
            if detail.get("thin"):
                log.warning("profile level %s: %d request(s), %d tokens inside the steady window, fewer than "
                            "replay.min_in_window (%d) or replay.min_window_tokens (%s), and the reserve could not "
                            "fill it: its figures rest on few requests", lv, detail["in_window"],
                            detail["in_window_tokens"], detail["min_in_window"], detail.get("min_window_tokens", "-"))
    else:
        timed = [(request_tpot(r)[0], r.tag) for r in ok if request_tpot(r)[0] is not None]
        client_tpots = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    mixed = tpot_mix(ok)
    n_engine = sum(1 for r in ok if request_tpot(r)[1] == "server" and request_tpot(r)[0] is not None)
    if mixed and not isinstance(run, ProfileRun):
        timed = [(request_tpot(r)[0], r.tag) for r in ok if request_tpot(r)[1] == "server"]
    tpots = [v for v, _ in timed]
    source = "mixed" if mixed else "server" if n_engine else "client"
    summary = stall_verdict(run.summary(spec.objective.statistic), source)
    summary["noise"] = profile_noise(levels) if levels else within_start_noise(tpots)
    per_window = window_figures(run, spec.objective.statistic)
    if per_window:
        summary["windows"] = per_window
    late = _settle.compiled_after(settled, log_path)
    summary["settle"] = {**{k: v for k, v in settled.items() if k not in ("offset", "seconds")}, "compiled_after": late}
    if engine.kind == "vllm":  # rows measured before per-config caches may hold another K's n-gram kernel
        summary["compile_cache"] = settings.vllm_compile_cache
    if server_cpus or client_cpus:  # which cores the start ran on, so rows of pinned and free starts stay apart
        summary["cpus"] = {k: _affinity.format_cpulist(v) if v else None
                           for k, v in (("server", server_cpus), ("client", client_cpus))}
    if late:
        log.warning("kernels compiled after the settle rounds, inside the measured replay: %s", late)
    reach = drafted_short(config, d)
    if reach:
        summary["drafts_short"] = reach
        log.warning("no draft accepted past position %d of K=%d (%.0f accepted at %d, about %.0f expected at "
                    "%d): the engine drafted fewer tokens than configured, or the drafter never agrees that far",
                    reach["position"], reach["k"], reach["accepted"], reach["position"],
                    reach["expected_next"], reach["position"] + 1)
    return Measurement(
        config=config, argv=argv, log_path=str(log_path), start_seconds=server.start_seconds or 0.0,
        wall_seconds=time.monotonic() - t0, summary=summary,
        spec_delta=d.to_dict(), tpot_ms=tpots, client_tpot_ms=client_tpots,
        tpot_source=source, tpot_mixed=mixed,
        outputs=outputs, texts=texts, token_ids=token_ids, logprobs=refs, engine_noise=noise,
        tags=[t for _, t in timed], errors=[f"{r.id}: {r.error}" for r in failed][:20],
        levels=levels, engine_notes=_serverlog.scan(log_path, patterns=engine.log_patterns), timeline=tl,
    )


def timeline(log_path: Path, launched_at: float | None, healthy_s: float | None, stop_s: float, total_s: float,
             milestones) -> dict:
    """The start's time besides settle, measure and outputs: to a healthy server (the engine's
    phases from its log, ``_startup.breakdown``), the stop, the whole. A start that never became
    healthy has no phases: its log's error line says why."""
    out: dict = {"stop": round(stop_s, 2), "total": round(total_s, 2)}
    if launched_at is not None and healthy_s is not None:
        out["to_healthy"] = round(healthy_s, 2)
        out["engine"] = _startup.breakdown(log_path, launched_at, healthy_s, milestones)
    return out


def drafted_short(config: dict | None, d: _metrics.SpecDelta) -> dict | None:
    """``_metrics.draft_reach`` for a config with one K (a band schedule drafts fewer tokens at
    some batch sizes on purpose)."""
    if not config or config.get(BANDS_KEY):
        return None
    return _metrics.draft_reach(d.accepted_per_position, d.drafts, k_of(config))


def stall_verdict(summary: dict, tpot_source: str) -> dict:
    """The one stall truth of a start, written into its summary (and each level's): ``stalled``
    means its TPOT figure is biased by time-to-first-token stalls. Only client-side TPOT is
    ((e2e - TTFT) / (n - 1) comes out too low when TTFT stalls); the engine's own per-request
    timings are immune, so a start measured with them keeps the detector's finding as
    ``ttft_stalled`` and is not ``stalled``. The trial's ``stalled`` attribute, the decision's
    excluded starts and the recommendation's ``stalled_starts`` all read this flag."""
    biased = tpot_source == "client"
    blocks = [summary.get("stall")] + [lv.get("stall") for lv in (summary.get("levels") or {}).values()
                                       if isinstance(lv, dict)]
    for st in blocks:
        if isinstance(st, dict) and "ttft_stalled" not in st:
            st["ttft_stalled"] = bool(st.get("stalled"))
            st["stalled"] = st["ttft_stalled"] and biased
            st["tpot_source"] = tpot_source
    return summary


def within_start_noise(tpots: list[float]) -> dict | None:
    """How much one start's per-request TPOT varies (``cv``) and how precisely that start's median
    is known (``median_se_rel``: the relative standard error of a median, 1.2533 * sd / sqrt(n)
    over the mean). Set beside the start-to-start noise (``search.start_noise`` of the study):
    when starts differ by far more than this, more requests per start buy nothing, more starts do.
    Requests of one steady window share that window's pace, so this is the window's precision,
    not the start's (``profile_noise``)."""
    vals = [v for v in tpots if v is not None and v > 0]
    if len(vals) < 2:
        return None
    n = len(vals)
    mean = sum(vals) / n
    sd = (sum((v - mean) ** 2 for v in vals) / (n - 1)) ** 0.5
    return {"n": n, "cv": sd / mean, "median_se_rel": 1.2533 * sd / mean / n ** 0.5}


def profile_noise(levels: dict[str, dict]) -> dict | None:
    """``within_start_noise`` of a profile start, level by level: its levels' TPOTs differ by
    design (2 ms at 1 against 6 ms at 32 on the H200), so one spread over the pooled list would
    measure the levels' distance, not the noise. ``median_se_rel`` is that of the weighted
    objective (each level's absolute standard error, weighted, in quadrature, over the weighted
    sum). A lower bound of the start's own uncertainty: on the H200 a window's median is known to
    2-3% this way, while whole steady windows of one server differ by 5-6% (round 15,
    docs/benchmarks.md)."""
    per = {lv: within_start_noise(d.get("tpot_ms") or []) for lv, d in levels.items()}
    known = [(d["weight"], d["tpot"], per[lv]) for lv, d in levels.items() if per[lv] and d.get("tpot")]
    if not known:
        return None
    total = sum(w * t for w, t, _ in known)
    se = sum((w * t * n["median_se_rel"]) ** 2 for w, t, n in known) ** 0.5 / total
    return {"n": sum(n["n"] for _, _, n in known), "median_se_rel": se, "levels": per}


def noise_text(attrs: dict) -> str:
    """A trial's noise in one line, from what the study recorded (``measurement.summary`` and the
    ``noise`` attribute): the start's own precision (``summary.noise``, a window's median), the
    scatter of its windows (``replay.windows``) and how far starts differ (this configuration's
    starts, else the study's pooled repeats). Shown side by side because they answer different
    questions: when starts differ by far more than a start's own precision, more requests per
    start buy nothing, more starts do. Empty when nothing was recorded."""
    summary = (attrs.get("measurement") or {}).get("summary") or {}
    noise = attrs.get("noise") or {}
    parts = []
    within = summary.get("noise") or {}  # the noise attribute's within_start is this same figure
    if within.get("median_se_rel") is not None:
        parts.append(f"+-{within['median_se_rel']:.1%} within the start")
    win = summary.get("windows") or {}
    if win.get("cv") is not None:
        parts.append(f"{win['n']} windows, cv {win['cv']:.1%}")
    between = noise.get("start_to_start") or {}
    if between.get("config_sd_log") is not None:
        parts.append(f"{between['config_sd_log']:.1%} between its {between['config_starts']} starts")
    elif between.get("study_sd_log") is not None:
        parts.append(f"{between['study_sd_log']:.1%} between starts (the study's repeats, {between['study_df']} df)")
    return "; ".join(parts)


def window_figures(run, statistic: str = "median") -> dict | None:
    """``replay.windows``: each window's own figure, level by level and weighted like the objective,
    and how far they scatter (``cv``; ``se_rel``, the pooled figure's relative standard error from
    that scatter, cv / sqrt(windows)). It says more than ``profile_noise``, whose requests share one
    window's pace, but not all: what a start carries for its whole life shows only between starts
    (``_study.start_to_start_noise``). None for a start of one window."""
    def tpots(w) -> list[float]:
        return [v for r in w.measured() for v in [request_tpot(r)[0]] if v is not None]

    def stat(vals: list[float]) -> float | None:
        return _measure.summarize(vals, statistic) if vals else None

    if isinstance(run, ProfileRun):
        if not all(r.windows for r in run.levels.values()):
            return None
        # window i of every level, each level's in-window TPOTs: the objective as the trial's own
        per = [dict(zip(run.levels, map(tpots, ws))) for ws in zip(*(r.windows for r in run.levels.values()))]
        levels = {str(lv): [stat(p[lv]) for p in per] for lv in run.levels}
        objective = [_measure.weighted_statistic(p, run.weights, statistic) if any(p.values()) else None
                     for p in per]
    elif run.windows:
        levels, objective = None, [stat(tpots(w)) for w in run.windows]
    else:
        return None
    vals = [v for v in objective if v is not None]
    cv = statistics.stdev(vals) / statistics.fmean(vals) if len(vals) >= 2 else None
    return {"n": len(objective), "objective_ms": objective, **({"levels": levels} if levels else {}),
            "cv": cv, "se_rel": cv / math.sqrt(len(vals)) if cv is not None else None}


def request_tpot(r) -> tuple[float | None, str]:
    """The engine's per-request TPOT (vLLM's ``metrics.mean_itl_ms``, llama-server's ``timings``:
    engine-side timestamps) when the server reports it, else the client's (e2e - TTFT)/(n - 1).

    On a loaded host the API server can fall behind the engine and flush a whole response at
    once: the client then sees a long TTFT and a near-zero TPOT although decoding ran at its
    normal pace. The engine's timestamps do not have that bias.
    """
    v = _registry.request_tpot_ms(r.server_metrics)
    if v is not None:
        return v, "server"
    return r.tpot_ms, "client"


def tpot_mix(ok) -> dict[str, int]:
    """``{"engine": n, "client": m}`` when some requests carry the engine's TPOT and others only
    the client's, else {}. The two differ by the API server's lag, so they are never pooled: a
    mixed start keeps the engine's values only (the trustworthy timing) and is flagged."""
    sources = [request_tpot(r)[1] for r in ok if request_tpot(r)[0] is not None]
    n_engine, n_client = sources.count("server"), sources.count("client")
    return {"engine": n_engine, "client": n_client} if n_engine and n_client else {}


async def _equivalence_replays(base_url, model, equivalence, spec, invariant: bool, logprobs: bool,
                               baseline: bool):
    """The equivalence replays of one start: (run, second run or None). One at a time where the
    engine is not batch-invariant, else at the replay's concurrency. ``logprobs`` (an engine that
    reports them): every replay returns its token ids, and the baseline's its top log-probabilities
    too and, where the engine is not batch-invariant, runs once more all in one batch, so that
    ``_equivalence.engine_noise`` measures how far the engine's own numerics move a margin (an
    invariant engine's batchings agree by definition)."""
    if not equivalence:
        return None, None
    if logprobs:
        extra = _logprobs.request_fields if baseline else (lambda endpoint: _logprobs.ID_FIELDS)
        equivalence = [replace(r, body={**r.body, **extra(r.endpoint)}) for r in equivalence]
    first = await _replay.run_closed_loop(base_url, model, equivalence, spec.replay.concurrency if invariant else 1,
                                          timeout_s=spec.replay.timeout_s)
    if not (logprobs and baseline) or invariant:
        return first, None
    return first, await _replay.run_closed_loop(base_url, model, equivalence, len(equivalence),
                                                timeout_s=spec.replay.timeout_s)


def _is_greedy(requests: list[ReplayRequest], rid: str) -> bool:
    return any(r.id == rid and r.greedy for r in requests)


async def _replay_with_scrape(base_url, model, requests, warmup, spec, log_path=None, reserve=None, windows=None):
    """Replay in the spec's ``replay.mode``; the /metrics scrapes around the measured part.
    First the settle rounds (``_settle``: warm-up until the engine stops compiling) at each
    concurrency the replay measures; they run before the first scrape, so no counter holds them.

    ``open``: the warm-up runs on into the measured phase by design, so the counter deltas
    include it (per-request acceptance and TPOT do not). ``profile``: the pool is the warm-up
    then the measured requests, split by ``run_profile`` into per-level warm-ups and measured
    sets; the deltas cover all levels. ``windows`` (closed and profile): further (warm-up,
    measured) request sets, each measured like the first after it, all pooled
    (``_replay.merge_windows``).
    """
    import httpx

    mode = spec.replay.mode
    levels = spec.replay.levels if mode == "profile" else [spec.replay.concurrency]
    t = time.monotonic()
    settled = await _settle.settle(base_url, model, warmup, levels, log_path, spec.replay.settle_rounds,
                                   spec.replay.timeout_s)
    settled["seconds"] = time.monotonic() - t
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        if mode == "open":
            before = await _metrics.scrape(client, base_url)
            run = await _replay.run_open_loop(base_url, model, requests, time_scale=spec.replay.time_scale,
                                              timeout_s=spec.replay.timeout_s, warmup=warmup)
            after = await _metrics.scrape(client, base_url)
            return run, before, after, settled
        if mode == "profile":
            before = await _metrics.scrape(client, base_url)
            runs, deltas = await run_profile_scraped(
                client, base_url, model, [*warmup, *requests], levels=spec.replay.levels,
                timeout_s=spec.replay.timeout_s, reserve=reserve, min_in_window=spec.replay.min_in_window,
                min_window_tokens=spec.replay.min_window_tokens, windows=[[*w, *r] for w, r in windows or []])
            after = await _metrics.scrape(client, base_url)
            return (scraped_profile_run(runs, spec.replay.weights(), deltas, spec.replay.min_in_window,
                                        spec.replay.min_window_tokens),
                    before, after, settled)
        if warmup:
            await _replay.run_closed_loop(base_url, model, warmup, spec.replay.concurrency,
                                          timeout_s=spec.replay.timeout_s)
        before = await _metrics.scrape(client, base_url)
        runs = [await _replay.run_closed_loop(base_url, model, requests, spec.replay.concurrency,
                                              timeout_s=spec.replay.timeout_s)]
        for w, r in windows or []:  # each window ramps up on its own warm-up, as the first did
            runs.append(await _replay.run_closed_loop(base_url, model, r, spec.replay.concurrency,
                                                      timeout_s=spec.replay.timeout_s, warmup=w))
        after = await _metrics.scrape(client, base_url)
    return _replay.merge_windows(runs), before, after, settled


# ---- stored trials: the one rule for which starts count, the one sum of their counters ------
def usable_starts(trials) -> tuple[list, list[dict]]:
    """Split a config's completed trials (``_record.TrialRecord``) into the starts a statistic may use and the excluded
    ones, each with the reason. The one stall rule: a start whose client-side TPOT was biased by
    TTFT stalls (``stalled``, see ``_study._record``) or that has no per-request TPOT is excluded.
    There is no fallback: when every start is excluded the caller has nothing to decide on and
    must say so (the decision is then ``keep``, "inconclusive")."""
    ok, excluded = [], []
    for t in trials:
        m = t.measurement
        if t.stalled:
            excluded.append({"trial": t.number, "why": "TTFT stalls bias its client-side TPOT"})
        elif not m.get("tpot_ms") and not any(d.get("tpot_ms") for d in (m.get("levels") or {}).values()):
            excluded.append({"trial": t.number, "why": "no request with a TPOT"})
        else:
            ok.append(t)
    return ok, excluded


COUNTERS = ("drafts", "draft_tokens", "accepted_tokens", "generated_tokens", "itl_count")


def per_request_acceptance(trials) -> dict | None:
    """The acceptance the engine reported per request (vLLM 0.32's ``--per-request-spec-decode-metrics``,
    summed over each start's measured requests: ``measurement.summary.spec``), pooled over the
    trials' starts; None unless every start has it, so a pool never mixes it with the /metrics
    counters, which also count warm-up and equivalence requests. Per request is the figure of
    exactly the requests measured, which is what the TPOT is of."""
    steps = accepted = drafted = 0
    for t in trials:
        spec = (t.measurement.get("summary") or {}).get("spec") or {}
        if not spec.get("num_spec_steps"):
            return None
        steps += int(spec["num_spec_steps"])
        accepted += int(spec.get("num_accepted_draft_tokens") or 0)
        drafted += int(spec.get("num_draft_tokens") or 0)
    if not steps:
        return None
    return {"acceptance_length": 1 + accepted / steps, "acceptance_rate": accepted / drafted if drafted else None,
            "spec_steps": steps, "accepted_tokens": accepted, "draft_tokens": drafted}


def spec_counters(trials) -> dict:
    """Speculation counters summed over the trials' (``_record.TrialRecord``) starts (each ``measurement.spec_delta``),
    with the pool's acceptance length (1 + accepted / drafts) and rate (accepted / draft tokens).
    ``itl_counted``: every start knew its decode steps (an ITL histogram count)."""
    tot = {k: 0.0 for k in COUNTERS}
    counted = bool(trials)
    for t in trials:
        d = t.counters
        for k in COUNTERS:
            tot[k] += d.get(k) or 0
        counted = counted and bool(d.get("itl_count"))
    return {**tot, "itl_counted": counted, "trials": len(trials),
            "acceptance_length": 1 + tot["accepted_tokens"] / tot["drafts"] if tot["drafts"] else None,
            "acceptance_rate": tot["accepted_tokens"] / tot["draft_tokens"] if tot["draft_tokens"] else None}
