"""One run of one workload, start to finish: what `study start`, cron, the daemon and `worker` share.

    spec -> fresh? -> local paths -> GPU lock -> reap orphans -> probe -> (nightly: fresh traffic)
    -> fields and replay set checked -> run recorded -> study (resumed, warm-started) -> decide
    -> recommendation + history + table, all or nothing -> run recorded as finished

Everything that can be wrong with the input is found before the first write (exit 2), so a
bad spec or replay set leaves no study, trial or file behind. The GPU lock is held from before
the probe to after the recommendation is written. SIGTERM/SIGINT at any point stop the server,
fail the running trial with the reason, record the run as interrupted and return 130.

Exit codes (stable; cron, systemd and the daemon read them):
  0   recommendation written (any decision), or nothing to do (``--if-stale``: still fresh;
      a worker: its share of the study done)
  2   bad input: spec, replay set, traffic, model path, a field this vLLM lacks
  3   engine or database unusable: vLLM missing, probe failed, baseline failed, storage unreachable
  4   recommendation not writable (the previous file, history and table are unchanged)
  5   the replay does not reproduce production (fidelity gate, ``production.telemetry``): the
      message names each figure that is off and by how much; no recommendation is written (the
      previous file, history and table are unchanged)
  75  GPU busy: another study holds this GPU's lock (EX_TEMPFAIL; ``--wait`` waits instead)
  130 interrupted by SIGTERM/SIGINT: server stopped, running trial marked failed; rerun resumes
"""

from __future__ import annotations

import logging
import os
import socket
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pydantic import ValidationError

from autotune.core._lock import (EX_TEMPFAIL, FileLock, LockDirError, LockHeld, gpu_lock_path, lead_lock_path,
                                 servers_dir)
from autotune.core._schedule import iso, now, parse_iso
from autotune.core._settings import Settings, get_settings
from autotune.core._signals import StopState, graceful_stop, signame_of
from autotune.core._spec import BudgetSpec, SpecError, find_spec, load_spec
from autotune.core._store import Store, StoreError, safe_url
from autotune.decide import _decision, _history, _noise, _payload
from autotune.engines import _affinity, _recovery, _registry
from autotune.engines._engine import check_compile_cache
from autotune.engines._probe import ProbeError
from autotune.engines._serverlog import engine_note_lines
from autotune.search import _preflight
from autotune.search._record import study_record
from autotune.search._space import SearchSpace
from autotune.search._study import Study, interrupted_attrs
from autotune.search._trial import TrialFailed
from autotune.traffic import _replayset, _traffic
from autotune.traffic._replayset import ReplaySetError
from autotune.traffic._sampling import sample_workload
from autotune.trust import _drift, _gate
from autotune.trust._telemetry import load as load_telemetry

log = logging.getLogger(__name__)

EXIT_OK, EXIT_INPUT, EXIT_ENGINE, EXIT_WRITE, EXIT_BUSY, EXIT_INTERRUPTED = 0, 2, 3, 4, EX_TEMPFAIL, 130
EXIT_FIDELITY = 5


@dataclass
class RunRequest:
    workload: str
    spec_path: str | None = None
    storage: str | None = None
    study_name: str | None = None
    max_trials: int | None = None
    max_server_starts: int | None = None
    pause_after_starts: int | None = None
    """Stop after this many server starts in this run, before confirming or deciding (exit 0,
    nothing written, the run recorded as paused); the next run resumes the study."""
    pause_after_minutes: float | None = None
    """Pause, as above, before a server start that is not expected to end within this many
    minutes of the request (waiting for the GPU lock included): a window with a hard end."""
    nightly: bool = False
    """Fresh traffic (when the workload has a traffic pool), warm start from the current
    recommendation, and decide against it (the incumbent is what is recommended now)."""
    if_stale_s: float | None = None
    """Do nothing when the last successful run finished less than this many seconds ago."""
    wait_for_gpu: bool = False
    kind: str = "manual"  # manual | cron | daemon | worker
    worker: bool = False
    """Join the study as an extra worker: trials only, no confirmation, no recommendation."""


Echo = Callable[..., None]


def _default_echo(msg: str, err: bool = False) -> None:
    import click

    click.echo(msg, err=err)


def storage_for(spec, cli_storage: str | None, settings: Settings) -> str:
    """The storage URL of a run: ``--storage``, AUTOTUNE__STORAGE, the spec's, else SQLite in the
    home. A SQLite file's folder is created; one that cannot be is a StoreError (exit 3)."""
    url = cli_storage or settings.storage or (spec.storage if spec is not None else None)
    if not url:
        url = f"sqlite:///{Path(settings.home).resolve() / 'autotune.db'}"
    if url.startswith("sqlite:///") and ":memory:" not in url:
        folder = Path(url.removeprefix("sqlite:///").split("?", 1)[0]).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"storage {safe_url(url)}: cannot create {folder} ({e.strerror})") from None
    return url


def with_budget(spec, **overrides):
    """``spec`` with the budget fields given (None: the spec's own), validated like the spec's:
    a value the spec could not hold (``--max-trials 0``) is a ValueError naming the option."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if not given:
        return spec
    try:
        budget = BudgetSpec.model_validate({**spec.budget.model_dump(), **given})
    except ValidationError as e:
        raise ValueError("; ".join(f"--{str(err['loc'][0]).replace('_', '-')} {given.get(err['loc'][0])}: "
                                   f"{err['msg']}" for err in e.errors())) from None
    return spec.model_copy(update={"budget": budget})


def recommendations_dir(spec, settings: Settings) -> str:
    return settings.recommendations_dir or spec.recommendations_dir


def last_success(store, spec, settings: Settings) -> str | None:
    """When the workload last got a recommendation: the runs table, else the file's created_at."""
    row = store.last_run(spec.workload, outcome="ok") if store is not None else None
    if row and row.get("finished_at"):
        return row["finished_at"]
    try:
        rec = _payload.load(recommendations_dir(spec, settings), spec.workload)
        return iso(parse_iso(rec["created_at"]))
    except (FileNotFoundError, KeyError, ValueError):
        return None


def run(req: RunRequest, settings: Settings | None = None, echo: Echo | None = None,
        on_event=None, stop: StopState | None = None) -> int:
    """Run it; returns the exit code (see the module doc). Never raises for expected failures."""
    began = time.monotonic()
    settings = settings or get_settings()
    echo = echo or _default_echo

    def fail(msg: str, code: int) -> int:
        echo(f"error: {msg}", err=True)
        return code

    try:
        spec = load_spec(req.spec_path or find_spec(req.workload, settings.studies_dir))
    except SpecError as e:
        return fail(str(e), EXIT_INPUT)
    if spec.workload != req.workload:
        return fail(f"{spec.source}: field 'workload' is {spec.workload!r}, not {req.workload!r}", EXIT_INPUT)
    try:
        spec = with_budget(spec, max_trials=req.max_trials, max_server_starts=req.max_server_starts)
    except ValueError as e:
        return fail(str(e), EXIT_INPUT)
    if req.if_stale_s is not None:
        try:
            store = Store(storage_for(spec, req.storage, settings))
        except StoreError as e:
            return fail(str(e), EXIT_ENGINE)
        last = last_success(store, spec, settings)
        if last and (now() - parse_iso(last)).total_seconds() < req.if_stale_s:
            echo(f"{spec.workload}: fresh (last successful run finished {last}, less than "
                 f"{req.if_stale_s / 3600:g}h ago); nothing to do")
            return EXIT_OK
    try:
        _affinity.placement(settings.server_cpus, settings.client_cpus)
        check_compile_cache(settings.vllm_compile_cache)
        _preflight.check_paths(spec)
    except (SpecError, ValueError) as e:  # ValueError: a setting (AUTOTUNE__SERVER_CPUS, ...)
        return fail(str(e), EXIT_INPUT)
    lock_dir = settings.lock_path()
    lead = None if req.worker else FileLock(lead_lock_path(lock_dir, spec.workload))
    lock = FileLock(gpu_lock_path(lock_dir, settings.gpu))
    what = f"{req.kind} study of {spec.workload} on GPU {settings.gpu}"
    with graceful_stop(stop) as stop:
        try:
            try:
                if lead is not None:  # one leader per workload: a second confirms and decides nothing twice
                    lead.acquire(what=what, wait=req.wait_for_gpu, gpu=settings.gpu,
                                 on_wait=lambda h: echo(f"workload {spec.workload} is being studied ({_holder(h)}); "
                                                        "waiting"))
                lock.acquire(what=what, wait=req.wait_for_gpu,
                             on_wait=lambda h: echo(f"GPU {settings.gpu} is busy ({_holder(h)}); waiting"))
            except LockHeld as e:
                if lead is not None:
                    lead.release()
                same_gpu = e.holder.get("gpu") == settings.gpu and e.holder.get("host") == socket.gethostname()
                if lead is not None and e.path == lead.path and not same_gpu:  # on this GPU: it is busy, below
                    return fail(f"workload {spec.workload} is being studied already: {_holder(e.holder)}; one "
                                f"leader per workload (lock {e.path}); rerun later, pass --wait, or join its study "
                                f"from this GPU with `autotune worker --workload {spec.workload}`", EXIT_BUSY)
                return fail(f"GPU {settings.gpu} is busy: {_holder(e.holder)}; one study per GPU "
                            f"(lock {lock.path}); rerun later or pass --wait", EXIT_BUSY)
            except LockDirError as e:
                if lead is not None:
                    lead.release()
                return fail(e.strerror, EXIT_INPUT)
            try:
                return _locked(req, spec, settings, echo, on_event, lock_dir, stop, began)
            finally:
                lock.release()
                if lead is not None:
                    lead.release()
        except KeyboardInterrupt as e:  # before or after the study (the study handles its own)
            echo(f"interrupted by {signame_of(e)}", err=True)
            return EXIT_INTERRUPTED


def _holder(h: dict) -> str:
    return f"held by pid {h.get('pid')} on {h.get('host')}: {h.get('what')} since {h.get('since')}" if h else "held"


def _locked(req: RunRequest, spec, settings: Settings, echo: Echo, on_event, lock_dir: Path,
            stop: StopState, began: float) -> int:
    """The run under the GPU lock; ``began``: when the request began (``pause_after_minutes`` counts from it)."""
    def fail(msg: str, code: int) -> int:
        echo(f"error: {msg}", err=True)
        return code

    pid_dir = servers_dir(lock_dir, settings.gpu)
    for r in _recovery.reap_orphans(pid_dir):
        echo(f"  stopped an orphaned vllm serve (pgid {r['pgid']}, port {r['port']}) left by dead process "
             f"{(r.get('owner') or {}).get('pid')}")
    try:
        url = storage_for(spec, req.storage, settings)
        store = Store(url)
    except StoreError as e:
        return fail(str(e), EXIT_ENGINE)
    for r in store.mark_dead_runs(socket.gethostname(), lambda pid: _recovery.owner_alive({"pid": pid})):
        echo(f"  run {r['run_id']} of {r['workload']} (pid {r['pid']}) had died; marked interrupted")
    engine = _registry.for_spec(spec)
    command = (settings.vllm_argv() if engine.kind == "vllm" else None) or list(spec.engine.command)
    home = Path(settings.home).resolve()
    rec_dir = recommendations_dir(spec, settings)

    def failed_before_start(msg: str, code: int) -> int:
        store.record_failed_run(spec.workload, req.kind, settings.gpu, code, msg)
        return fail(msg, code)

    try:
        caps = engine.probe(command, settings.vllm_python or spec.engine.python, spec.engine.env, home / "cache")
    except ProbeError as e:
        return failed_before_start(str(e), EXIT_ENGINE)
    if req.nightly:
        try:
            _refresh_traffic(spec, home, echo)
        except ValueError as e:  # SampleError, TrafficError: unreadable or empty traffic
            return failed_before_start(f"traffic for {spec.workload}: {e}", EXIT_INPUT)
        except OSError as e:  # the fresh replay set could not be written: the previous one is intact
            return failed_before_start(f"traffic for {spec.workload}: cannot write {e.filename or spec.replay.path}: "
                                       f"{e.strerror or e}", EXIT_WRITE)
    space = SearchSpace.build(spec.space, caps)
    try:
        warnings = _preflight.check_fields(spec, caps, space)
        _preflight.check_replay(spec)
        if spec.production.telemetry:  # the fidelity gate's input, read before any server start
            load_telemetry(spec.production.telemetry)
    except (SpecError, ReplaySetError, ValueError) as e:
        return failed_before_start(str(e), EXIT_INPUT)
    previous = _history.previous(spec.workload, rec_dir, store)
    warm: list[dict] = []
    if req.nightly:
        spec, warm = _warm_start(spec, previous, echo)
    echo(f"autotune: workload {spec.workload}, {engine.name} {caps.version}, model {spec.model}, "
         f"concurrency {spec.replay.concurrency}")
    for w in warnings:
        echo(f"  warning: {w}")
    for m, why in space.dropped.items():
        echo(f"  dropped method {m}: {why}")
    if not space.methods:
        echo("  no speculative method can run here: only the baseline will be measured")
    run_id = store.start_run(spec.workload, req.kind, settings.gpu)
    st = None
    try:
        try:
            st = Study(spec, caps, space, url, command, home, study_name=req.study_name, on_event=on_event,
                       store=store, pid_dir=pid_dir, warm_start=warm, leader=not req.worker, run_id=run_id,
                       sampler_seed=_worker_seed(spec.seed) if req.worker else None, hardware=settings.hardware,
                       fidelity_check=_gate.fidelity_check, pause_after_starts=req.pause_after_starts,
                       pause_after_minutes=req.pause_after_minutes, window_began=began)
        except (ReplaySetError, ValueError) as e:
            store.finish_run(run_id, "failed", EXIT_INPUT, error=str(e))
            return fail(str(e), EXIT_INPUT)
        store.set_run_study(run_id, st.name)
        echo(f"  study {st.name} in {safe_url(url)}; {len(st.search_reqs)} requests per start, "
             f"space of {space.size()} configs; budget {spec.budget.max_trials} trials, "
             f"{spec.budget.max_server_starts} starts, {spec.budget.max_wall_minutes:g} min"
             + ("; joined as a worker" if req.worker else ""))
        for note in st.notes:
            echo(f"  {note}")
        nights = _history.history(spec.workload, rec_dir, store)  # earlier nights' start-to-start variance
        prior = _noise.prior_noise(study_record(st), nights)["speculative"]  # the predictor's intervals carry it too
        st.set_noise_prior(prior.sd, prior.df)
        st.confirm_open = lambda: _decision.open_question(study_record(st), nights)
        try:
            outcome = st.run()
        except TrialFailed as e:
            _finish(store, run_id, st, "failed", EXIT_ENGINE, error=e.reason)
            return fail(e.reason, EXIT_ENGINE)
        except _gate.FidelityFailed as e:
            for line in _gate.lines(e.result):
                echo(f"  {line}")
            msg = (f"the replay does not reproduce production ({'; '.join(e.result['off'])}); no recommendation "
                   f"written, the previous one is unchanged")
            _finish(store, run_id, st, "failed", EXIT_FIDELITY, error=msg)
            return fail(msg, EXIT_FIDELITY)
        if outcome.paused:
            _finish(store, run_id, st, "paused", EXIT_OK)
            echo(f"{outcome.stopped_because}; {outcome.server_starts} server starts in the study so far, "
                 f"no recommendation written yet")
            return EXIT_OK
        if req.worker:
            _finish(store, run_id, st, "ok", EXIT_OK)
            echo(f"worker done: {outcome.stopped_because}; {outcome.server_starts} server starts in the study")
            return EXIT_OK
        record = study_record(st)  # the study as decide, trust and the payload read it
        decision = _decision.damp(_decision.decide(record, nights), record, previous)
        payload = _payload.build(record, decision, outcome)
        payload["drift"] = _history.drift_block(record, payload, previous, spec.drift.min_acceptance_rate)
        payload["fidelity"] = record.fidelity or _gate.not_checked(
            "no production telemetry in the spec (production.telemetry)")
        try:  # engine fingerprint, traffic profile, predicted figures, canary ranges, kill criteria
            payload.update(_drift.trust_blocks(record, payload, payload["fidelity"]))
        except Exception as e:  # never lose a study's recommendation over its auxiliary fields
            log.warning("cannot derive the canary fields: %s", e)
            payload["canary_error"] = f"{type(e).__name__}: {e}"
        payload["run"] = {"id": run_id, "kind": req.kind, "host": socket.gethostname(), "gpu": settings.gpu,
                          "nightly": req.nightly}
        try:
            path = _history.write(payload, rec_dir, store, run_id)
        except OSError as e:
            where = getattr(e, "filename", None) or rec_dir
            msg = f"cannot write {where}: {e.strerror or e}; the previous recommendation is unchanged"
            _finish(store, run_id, st, "failed", EXIT_WRITE, error=msg)
            return fail(msg, EXIT_WRITE)
        _finish(store, run_id, st, "ok", EXIT_OK, decision=decision.decision)
    except KeyboardInterrupt as e:
        reason = interrupted_attrs(signame_of(e))["error"]
        if st is not None:
            if st.current_server is not None:
                st.current_server.stop()
            st.fail_own_running(signame_of(e))
            _finish(store, run_id, st, "interrupted", EXIT_INTERRUPTED, error=reason)
        else:
            store.finish_run(run_id, "interrupted", EXIT_INTERRUPTED, error=reason)
        echo(f"interrupted ({signame_of(e)}): server stopped, running trial marked failed; rerun to resume",
             err=True)
        return EXIT_INTERRUPTED
    ev = payload["evidence"]
    echo(f"stopped: {outcome.stopped_because}")
    echo(f"decision: {decision.decision} — {decision.reason}")
    b = ev["baseline"]["tpot_ms"]
    w = ev.get("winner", {}).get("tpot_ms")
    echo((f"  baseline {b:.2f} ms" if b is not None else "  baseline: no usable start")
         + (f", winner {w:.2f} ms" if w else ""))
    for line in _payload.comparison_lines(ev):
        echo(f"  {line}")
    for line in (payload.get("per_level") or {}).get("advice") or []:
        echo(f"  note: {line}")
    for line in engine_note_lines(payload.get("engine_notes")):
        echo(f"  {line}")
    for note in payload["drift"]["notes"]:
        echo(f"  drift: {note}")
    for line in _gate.lines(payload["fidelity"]):
        echo(f"  {line}")
    echo(f"  {outcome.server_starts} server starts"
         + (f" ({outcome.interrupted_starts} stopped by a signal, not counted against the budget)"
            if outcome.interrupted_starts else "") + f", {len(outcome.trials)} trials, {outcome.wall_s:.0f}s")
    echo(f"wrote {path}")
    return EXIT_OK


def _finish(store, run_id: str, st, outcome: str, code: int, **kw) -> None:
    trials = st.study.get_trials(deepcopy=False)
    store.finish_run(run_id, outcome, code, trials=len(trials), server_starts=st.server_starts(),
                     failed_trials=sum(1 for t in trials if t.state.name == "FAIL"), **kw)


def _worker_seed(seed: int) -> int:
    """Workers sample with their own seed, so they do not all propose the same configuration."""
    return seed + 1 + zlib.crc32(f"{socket.gethostname()}:{os.getpid()}".encode()) % 100_000


def _refresh_traffic(spec, home: Path, echo: Echo) -> None:
    """Nightly: resample the replay set from the workload's traffic pool, when it has one."""
    if not _traffic.pool_path(home, spec.workload).exists():
        echo(f"  no traffic pool for {spec.workload} in {home}: replaying {spec.replay.path} as it is")
        return

    out, _, result = sample_workload(home, spec.workload, spec=spec)
    echo(f"  fresh traffic: sampled {len(result.requests)} requests into {out}")


def _warm_start(spec, previous: dict | None, echo: Echo):
    """Nightly: the incumbent is what is recommended now (if it was made for this model), and
    yesterday's best candidate is measured early too, even when it was not adopted."""
    if not previous or (previous.get("valid_for") or {}).get("model") != spec.model:
        return spec, []
    incumbent = previous.get("speculative_config") or None
    spec = spec.model_copy(update={"incumbent": incumbent})
    warm = []
    best = ((previous.get("evidence") or {}).get("winner") or {}).get("config")
    if best and best != incumbent:
        warm.append(best)
    echo(f"  warm start: incumbent {incumbent or 'no speculation'} (recommended {previous.get('created_at')})"
         + (f", yesterday's best {best}" if warm else ""))
    return spec, warm


def drift_result(spec, replay: str | None = None, telemetry_path: str | None = None, vllm_version: str | None = None):
    """The drift check of one workload (also used by the daemon); raises ValueError on bad input."""
    rec_dir = recommendations_dir(spec, get_settings())
    try:
        rec = _payload.load(rec_dir, spec.workload)  # ValueError naming the file: not one autotune wrote
    except FileNotFoundError:
        rec = None
    rs = _replayset.load(replay or spec.replay.path)
    tpath = telemetry_path or spec.production.telemetry
    tel = load_telemetry(tpath) if tpath else None
    if vllm_version is None:
        vllm_version = installed_vllm_version(spec)
    res = _drift.check_drift(spec, rec, rs.requests, tel, vllm_version)
    res["replay_set"] = str(rs.path)
    res["telemetry"] = tpath
    return res


def installed_vllm_version(spec) -> str | None:
    """The engine version the studies would run (the probe's answer, cached per interpreter)."""
    settings = get_settings()
    engine = _registry.for_spec(spec)
    command = (settings.vllm_argv() if engine.kind == "vllm" else None) or list(spec.engine.command)
    try:
        return engine.probe(command, settings.vllm_python or spec.engine.python, spec.engine.env,
                            Path(settings.home).resolve() / "cache").version
    except ProbeError:
        return None
