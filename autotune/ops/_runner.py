"""One run of one workload, start to finish: what `study start`, cron, the daemon and `worker` share.

A pipeline of named steps, each a function of its own:

    check_request, freshness, check_host   the spec and this host, before anything is written
    (locks)                                the workload's lead lock, then the GPU's
    prepare                                orphans reaped, store, probe, (nightly) fresh traffic,
                                           fields and replay set checked, warm start, run recorded
    search                                 the study (resumed, warm-started): baseline, search and
                                           the confirmation rounds (``Study.run``), fed by
                                           ``confirm_inputs``
    decide                                 keep / change / disable, and the recommendation built
    publish                                recommendation + history + table, all or nothing; the
                                           run recorded as finished

``execute`` runs them and returns a ``RunResult`` (workload, decision, recommendation path,
trials and server starts, exit code, closing lines) that the caller renders; ``run`` does both
and returns the exit code. A step that meets a failure it foresees raises ``Failure``; its exit
code comes from the one table in ``autotune.ops._exit``.

Everything that can be wrong with the input is found before the first write (exit 2), so a
bad spec or replay set leaves no study, trial or file behind. The GPU lock is held from before
the probe to after the recommendation is written. SIGTERM/SIGINT at any point stop the server,
fail the running trial with the reason, record the run as interrupted and return 130.

Exit codes (stable; cron, systemd and the daemon read them; ``autotune.core._exit``):
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

import contextlib
import logging
import os
import socket
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pydantic import ValidationError

from autotune.core._files import PRIVATE_DIR, make_dirs
from autotune.core._exit import EXIT_INTERRUPTED, EXIT_OK
from autotune.core._lock import (FileLock, LockDirError, LockHeld, gpu_lock_path, lead_lock_path,
                                 servers_dir)
from autotune.core._schedule import iso, now, parse_iso
from autotune.core._settings import Settings, get_settings
from autotune.core._signals import StopState, graceful_stop, signame_of
from autotune.core._spec import BudgetSpec, SpecError, find_spec, load_spec
from autotune.core._store import Store, StoreError, error_line, safe_url, scrub, storage_fault
from autotune.decide import _decision, _history, _noise, _payload
from autotune.engines import _affinity, _preload, _recovery, _registry
from autotune.engines._engine import check_compile_cache
from autotune.engines._probe import ProbeError
from autotune.engines._serverlog import engine_note_lines
from autotune.ops._exit import exit_code
from autotune.search import _preflight
from autotune.search._budget import uncounted_note
from autotune.search._recovery import end_run
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
            make_dirs(folder, PRIVATE_DIR)
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


# ---- the result, and the failures the steps foresee --------------------------------------------
@dataclass
class RunResult:
    """What one run did: the caller renders ``messages`` (``render``) and exits with ``exit_code``.

    Lines said while the run goes (warnings, the study's header, waiting for a lock) go to the
    run's ``echo`` as they happen; ``messages`` are the closing lines: the summary, or the error
    line and what explains it."""

    workload: str
    exit_code: int = EXIT_OK
    outcome: str = "ok"
    """ok (recommendation written), fresh (``--if-stale``: nothing to do), paused, worker (its
    share of the study done), failed, interrupted."""
    decision: str | None = None
    """keep, change or disable: what the recommendation says; None when nothing was decided."""
    recommendation: Path | None = None
    study: str | None = None
    trials: int | None = None
    server_starts: int | None = None
    messages: list[tuple[str, bool]] = field(default_factory=list)
    """(line, to stderr)."""

    def say(self, msg: str, err: bool = False) -> None:
        self.messages.append((msg, err))

    def failed(self, f: "Failure") -> "RunResult":
        for line in f.lines:
            self.say(line)
        self.say(f"error: {f}", err=True)
        self.exit_code, self.outcome = f.code, "failed"
        return self

    def interrupted(self, msg: str) -> "RunResult":
        self.say(msg, err=True)
        self.exit_code, self.outcome = EXIT_INTERRUPTED, "interrupted"
        return self


def render(result: RunResult, echo: Echo) -> None:
    """Say a run's closing lines."""
    for msg, err in result.messages:
        echo(msg, err=err)


class Failure(Exception):
    """A failure a step foresees. Its text is the error line, ``lines`` what is said before it;
    its exit code is the one ``ops._exit.exit_code`` gives its cause."""

    def __init__(self, msg: str, cause: BaseException, lines: list[str] | tuple = ()):
        super().__init__(msg)
        self.cause, self.lines = cause, list(lines)

    @property
    def code(self) -> int:
        return exit_code(self.cause)


def _failure(e: BaseException, msg: str | None = None) -> Failure:
    return Failure(str(e) if msg is None else msg, e)


@dataclass
class _Run:
    """What the steps hand on: the request, its spec, and what each step opened."""

    req: RunRequest
    spec: object
    settings: Settings
    echo: Echo
    began: float
    """When the request began (``pause_after_minutes`` counts from it)."""
    on_event: Callable | None = None
    pid_dir: Path | None = None
    store: Store | None = None
    url: str | None = None
    engine: object = None
    command: list[str] = field(default_factory=list)
    caps: object = None
    space: SearchSpace | None = None
    previous: dict | None = None
    warm: list[dict] = field(default_factory=list)
    nights: list[dict] = field(default_factory=list)
    """Earlier nights' recommendations (``_history.history``): their start-to-start noise."""
    run_id: str | None = None
    st: Study | None = None

    @property
    def home(self) -> Path:
        return Path(self.settings.home).resolve()

    @property
    def rec_dir(self) -> str:
        return recommendations_dir(self.spec, self.settings)

    def record_failure(self, f: Failure) -> None:
        """Keep the failure in the runs table: a row of its own before the run started, else the run's.
        A database that cannot take it (the failure may be the database itself) leaves the row
        ``running``; the next run on this host marks it interrupted (``mark_dead_runs``): said."""
        if self.store is None:
            return
        try:
            if self.run_id is None:
                self.store.record_failed_run(self.spec.workload, self.req.kind, self.settings.gpu, f.code, str(f))
            elif self.st is None:
                self.store.finish_run(self.run_id, "failed", f.code, error=str(f))
            else:
                try:
                    _finish(self.store, self.run_id, self.st, "failed", f.code, error=str(f))
                except Exception as e:  # noqa: BLE001  (the trial counts read the study's storage)
                    if storage_fault(e) is None:
                        raise
                    self.store.finish_run(self.run_id, "failed", f.code, error=str(f))
        except Exception as e:  # noqa: BLE001  (only a database fault is swallowed, and said)
            cause = storage_fault(e)
            if cause is None:
                raise
            if self.run_id is not None:  # this process's next run (the daemon's) records it
                _UNRECORDED.append((self.store.url, self.run_id, f.code, str(f)))
            f.lines.append(f"  the run could not be recorded as failed in {safe_url(self.url or self.store.url)} "
                           f"({scrub(error_line(cause), self.url)}): the next run on this host records it")


_UNRECORDED: list[tuple[str, str, int, str]] = []
"""(storage, run id, exit code, error) of runs whose failure the database could not take: the next
run of this process records them (a daemon outlives its runs, so ``mark_dead_runs``, which waits
for the process to die, would leave them ``running`` until it stops)."""


def _record_unrecorded(store: Store) -> None:
    for item in [u for u in _UNRECORDED if u[0] == store.url]:
        _, run_id, code, error = item
        store.finish_run(run_id, "failed", code, error=error)
        _UNRECORDED.remove(item)


# ---- the pipeline ---------------------------------------------------------------------------------
def run(req: RunRequest, settings: Settings | None = None, echo: Echo | None = None,
        on_event=None, stop: StopState | None = None) -> int:
    """Run it, say its closing lines; returns the exit code (see the module doc)."""
    echo = echo or _default_echo
    result = execute(req, settings, echo, on_event, stop)
    render(result, echo)
    return result.exit_code


def execute(req: RunRequest, settings: Settings | None = None, echo: Echo | None = None,
            on_event=None, stop: StopState | None = None) -> RunResult:
    """prepare -> (locks) -> search -> confirm -> decide -> publish. Never raises for expected failures:
    each is a ``Failure`` the result carries, with its exit code and error line."""
    began = time.monotonic()
    settings = settings or get_settings()
    echo = echo or _default_echo
    result = RunResult(workload=req.workload)
    try:
        spec = check_request(req, settings)
        if not req.worker:
            check_recommendation_path(spec, settings)
        if req.if_stale_s is not None and (fresh := freshness(req, spec, settings)):
            result.outcome = "fresh"
            result.say(fresh)
            return result
        check_host(spec, settings)
    except Failure as f:
        return result.failed(f)
    with graceful_stop(stop) as stop:
        try:
            with _locks(req, spec, settings, echo) as lock_dir:
                r = _Run(req, spec, settings, echo, began, on_event,
                         pid_dir=servers_dir(lock_dir, settings.gpu))
                return _locked(r, result)
        except Failure as f:  # busy, or an unsafe lock folder
            return result.failed(f)
        except KeyboardInterrupt as e:  # before or after the study (the study handles its own)
            return result.interrupted(f"interrupted by {signame_of(e)}")


def _locked(r: _Run, result: RunResult) -> RunResult:
    """The steps under the locks; a failure is recorded in the runs table and carried by the result."""
    try:
        prepare(r)
        outcome = confirm(r, search(r))
        result.study, result.trials = r.st.name, len(outcome.trials)
        result.server_starts = outcome.server_starts
        if outcome.paused or r.req.worker:
            return stopped_early(r, outcome, result)
        decision, payload = decide(r, outcome)
        path = publish(r, decision, payload)
    except Failure as f:
        r.record_failure(f)
        return result.failed(f)
    except KeyboardInterrupt as e:
        if r.run_id is None:
            raise
        return result.interrupted(interrupted(r, signame_of(e)))
    except Exception as e:  # noqa: BLE001  (only a database fault is foreseen here; the rest re-raised)
        f = storage_failure(r, e)
        if f is None:
            raise
        r.record_failure(f)
        return result.failed(f)
    result.decision, result.recommendation = decision.decision, path
    for line in summary_lines(decision, payload, outcome):
        result.say(line)
    result.say(f"wrote {path}")
    return result


def check_request(req: RunRequest, settings: Settings):
    """The spec, for this workload, with the request's budget: bad input before anything is written."""
    try:
        spec = load_spec(req.spec_path or find_spec(req.workload, settings.studies_dir))
    except SpecError as e:
        raise _failure(e) from None
    if spec.workload != req.workload:
        msg = f"{spec.source}: field 'workload' is {spec.workload!r}, not {req.workload!r}"
        raise Failure(msg, SpecError(msg))
    try:
        return with_budget(spec, max_trials=req.max_trials, max_server_starts=req.max_server_starts)
    except ValueError as e:
        raise _failure(e) from None


def freshness(req: RunRequest, spec, settings: Settings) -> str | None:
    """``--if-stale``: what to say when the last successful run is recent enough, else None."""
    try:
        store = Store(storage_for(spec, req.storage, settings))
    except StoreError as e:
        raise _failure(e) from None
    last = last_success(store, spec, settings)
    if last and (now() - parse_iso(last)).total_seconds() < req.if_stale_s:
        return (f"{spec.workload}: fresh (last successful run finished {last}, less than "
                f"{req.if_stale_s / 3600:g}h ago); nothing to do")
    return None


def check_recommendation_path(spec, settings: Settings) -> None:
    """Where the recommendation goes must take a file: a folder there would refuse the write only
    after the whole study (exit 4 now, before any server start)."""
    path = _payload.recommendation_path(recommendations_dir(spec, settings), spec.workload)
    try:
        _history.refuse_to_replace(path)
    except OSError as e:
        raise _failure(e, f"cannot write {path}: {e.strerror}; nothing was started") from None


def check_host(spec, settings: Settings) -> None:
    """This host's settings and the spec's local paths (model, drafts, compile cache)."""
    try:
        _affinity.placement(settings.server_cpus, settings.client_cpus)
        check_compile_cache(settings.vllm_compile_cache)
        _preflight.check_paths(spec)
    except (SpecError, ValueError) as e:  # ValueError: a setting (AUTOTUNE__SERVER_CPUS, ...)
        raise _failure(e) from None


@contextlib.contextmanager
def _locks(req: RunRequest, spec, settings: Settings, echo: Echo):
    """The workload's lead lock (not for a worker), then the GPU's; held until the run ends.
    Busy is a Failure naming the holder (exit 75, or waits with ``wait_for_gpu``)."""
    lock_dir = settings.lock_path()
    lead = None if req.worker else FileLock(lead_lock_path(lock_dir, spec.workload))
    lock = FileLock(gpu_lock_path(lock_dir, settings.gpu))
    what = f"{req.kind} study of {spec.workload} on GPU {settings.gpu}"
    try:
        try:
            if lead is not None:  # one leader per workload: a second confirms and decides nothing twice
                lead.acquire(what=what, wait=req.wait_for_gpu, gpu=settings.gpu,
                             on_wait=lambda h: echo(f"workload {spec.workload} is being studied ({_holder(h)}); "
                                                    "waiting"))
            lock.acquire(what=what, wait=req.wait_for_gpu,
                         on_wait=lambda h: echo(f"GPU {settings.gpu} is busy ({_holder(h)}); waiting"))
        except LockHeld as e:
            same_gpu = e.holder.get("gpu") == settings.gpu and e.holder.get("host") == socket.gethostname()
            if lead is not None and e.path == lead.path and not same_gpu:  # on this GPU: it is busy, below
                raise _failure(e, f"workload {spec.workload} is being studied already: {_holder(e.holder)}; one "
                                  f"leader per workload (lock {e.path}); rerun later, pass --wait, or join its "
                                  f"study from this GPU with `autotune worker --workload {spec.workload}`") from None
            raise _failure(e, f"GPU {settings.gpu} is busy: {_holder(e.holder)}; one study per GPU "
                              f"(lock {lock.path}); rerun later or pass --wait") from None
        except LockDirError as e:
            raise _failure(e, e.strerror) from None
        yield lock_dir
    finally:
        _preload.POOL.close()  # the next start's preloaded process has no next start
        lock.release()
        if lead is not None:
            lead.release()


def _holder(h: dict) -> str:
    return f"held by pid {h.get('pid')} on {h.get('host')}: {h.get('what')} since {h.get('since')}" if h else "held"


def prepare(r: _Run) -> None:
    """Everything before the first server start: orphans reaped, the store opened, the engine
    probed, (nightly) fresh traffic, the spec's fields and replay set checked against this
    engine, the warm start, and the run recorded as started."""
    req, spec, settings, echo = r.req, r.spec, r.settings, r.echo
    for o in _recovery.reap_orphans(r.pid_dir):
        echo(f"  stopped an orphaned vllm serve (pgid {o['pgid']}, port {o['port']}) left by dead process "
             f"{(o.get('owner') or {}).get('pid')}")
    try:
        r.url = storage_for(spec, req.storage, settings)
        r.store = Store(r.url)
    except StoreError as e:
        raise _failure(e) from None
    _record_unrecorded(r.store)
    for d in r.store.mark_dead_runs(socket.gethostname(), lambda pid: _recovery.owner_alive({"pid": pid})):
        echo(f"  run {d['run_id']} of {d['workload']} (pid {d['pid']}) had died; marked interrupted")
    r.engine = _registry.for_spec(spec)
    r.command = (settings.vllm_argv() if r.engine.kind == "vllm" else None) or list(spec.engine.command)
    try:
        r.caps = r.engine.probe(r.command, settings.vllm_python or spec.engine.python, spec.engine.env,
                                r.home / "cache")
    except ProbeError as e:
        raise _failure(e) from None
    if req.nightly:
        try:
            _refresh_traffic(spec, r.home, echo)
        except ValueError as e:  # SampleError, TrafficError: unreadable or empty traffic
            raise _failure(e, f"traffic for {spec.workload}: {e}") from None
        except OSError as e:  # the fresh replay set could not be written: the previous one is intact
            raise _failure(e, f"traffic for {spec.workload}: cannot write {e.filename or spec.replay.path}: "
                              f"{e.strerror or e}") from None
    r.space = SearchSpace.build(spec.space, r.caps)
    try:
        warnings = _preflight.check_fields(spec, r.caps, r.space)
        _preflight.check_replay(spec)
        if spec.production.telemetry:  # the fidelity gate's input, read before any server start
            load_telemetry(spec.production.telemetry)
    except (SpecError, ReplaySetError, ValueError) as e:
        raise _failure(e) from None
    r.previous = _history.previous(spec.workload, r.rec_dir, r.store)
    if req.nightly:
        r.spec, r.warm = _warm_start(spec, r.previous, echo)
    echo(f"autotune: workload {r.spec.workload}, {r.engine.name} {r.caps.version}, model {r.spec.model}, "
         f"concurrency {r.spec.replay.concurrency}")
    for w in warnings:
        echo(f"  warning: {w}")
    for m, why in r.space.dropped.items():
        echo(f"  dropped method {m}: {why}")
    if not r.space.methods:
        echo("  no speculative method can run here: only the baseline will be measured")
    r.run_id = r.store.start_run(r.spec.workload, req.kind, settings.gpu)


def search(r: _Run):
    """Open (or resume) the study and run it: the baseline, the search and, for the leader, the
    confirmation rounds (``Study.run``), fed with what the confirmation needs from the decision
    (``confirm_inputs``). Returns the ``StudyOutcome``."""
    req, spec = r.req, r.spec
    try:
        r.st = Study(spec, r.caps, r.space, r.url, r.command, r.home, study_name=req.study_name,
                     on_event=r.on_event, store=r.store, pid_dir=r.pid_dir, warm_start=r.warm,
                     previous=r.previous if req.nightly else None, leader=not req.worker, run_id=r.run_id,
                     sampler_seed=_worker_seed(spec.seed) if req.worker else None, hardware=r.settings.hardware,
                     fidelity_check=_gate.fidelity_check, pause_after_starts=req.pause_after_starts,
                     pause_after_minutes=req.pause_after_minutes, window_began=r.began)
    except (ReplaySetError, ValueError) as e:
        raise _failure(e) from None
    st = r.st
    r.store.set_run_study(r.run_id, st.name)
    r.echo(f"  study {st.name} in {safe_url(r.url)}; {len(st.search_reqs)} requests per start, "
           f"space of {r.space.size()} configs; budget {spec.budget.max_trials} trials, "
           f"{spec.budget.max_server_starts} starts, {spec.budget.max_wall_minutes:g} min"
           + ("; joined as a worker" if req.worker else ""))
    for note in st.notes:
        r.echo(f"  {note}")
    tax = st.use_earlier_bands_tax()  # a schedule's cost on this machine, from earlier nights
    if tax:
        r.echo(f"  {tax}")
    confirm_inputs(r)
    try:
        return st.run(confirm=False)
    except TrialFailed as e:
        raise _failure(e, e.reason) from None
    except _gate.FidelityFailed as e:
        raise Failure(f"the replay does not reproduce production ({'; '.join(e.result['off'])}); no "
                      f"recommendation written, the previous one is unchanged", e,
                      lines=[f"  {line}" for line in _gate.lines(e.result)]) from None


def confirm(r: _Run, outcome):
    """The leader's confirmation rounds (``Study.confirm``): fresh starts of baseline, incumbent and
    winner, interleaved, more rounds while the decision is open (``confirm_inputs``). A paused run
    or a worker confirms nothing. Returns the study's outcome after them."""
    if outcome.paused or r.req.worker:
        return outcome
    try:
        r.st.confirm()
    except TrialFailed as e:
        raise _failure(e, e.reason) from None
    return r.st.outcome()


def confirm_inputs(r: _Run) -> None:
    """What the study's confirmation rounds take from the decision: the start-to-start noise of
    earlier nights (the predictor's intervals carry it too), and whether the decision is still open
    (more rounds while it is)."""
    r.nights = nights = _history.history(r.spec.workload, r.rec_dir, r.store)
    prior = _noise.prior_noise(study_record(r.st), nights)["speculative"]
    r.st.set_noise_prior(prior.sd, prior.df)
    r.st.confirm_open = lambda: _decision.open_question(study_record(r.st), nights)


def stopped_early(r: _Run, outcome, result: RunResult) -> RunResult:
    """A paused run (its window ended) or a worker (the leader decides): nothing decided."""
    if outcome.paused:
        _finish(r.store, r.run_id, r.st, "paused", EXIT_OK)
        result.outcome = "paused"
        result.say(f"{outcome.stopped_because}; {outcome.server_starts} server starts in the study so far, "
                   f"no recommendation written yet")
    else:
        _finish(r.store, r.run_id, r.st, "ok", EXIT_OK)
        result.outcome = "worker"
        result.say(f"worker done: {outcome.stopped_because}; {outcome.server_starts} server starts in the study")
    return result


def decide(r: _Run, outcome):
    """keep / change / disable, damped against the previous night, and the recommendation built
    around it (drift, fidelity, the canary fields, the run). Returns (decision, payload)."""
    st, spec = r.st, r.spec
    record = study_record(st)  # the study as decide, trust and the payload read it
    decision = _decision.damp(_decision.decide(record, r.nights), record, r.previous)
    payload = _payload.build(record, decision, outcome)
    payload["drift"] = _history.drift_block(record, payload, r.previous, spec.drift.min_acceptance_rate)
    payload["fidelity"] = record.fidelity or _gate.not_checked(
        "no production telemetry in the spec (production.telemetry)")
    try:  # engine fingerprint, traffic profile, predicted figures, canary ranges, kill criteria
        payload.update(_drift.trust_blocks(record, payload, payload["fidelity"]))
    except Exception as e:  # never lose a study's recommendation over its auxiliary fields
        log.warning("cannot derive the canary fields: %s", e)
        payload["canary_error"] = f"{type(e).__name__}: {e}"
    payload["run"] = {"id": r.run_id, "kind": r.req.kind, "host": socket.gethostname(), "gpu": r.settings.gpu,
                      "nightly": r.req.nightly}
    return decision, payload


def publish(r: _Run, decision, payload) -> Path:
    """The recommendation, its history copy and the table row, all or nothing; then the run is
    recorded as finished. A refused write leaves the previous recommendation as it was."""
    try:
        path = _history.write(payload, r.rec_dir, r.store, r.run_id)
    except OSError as e:
        where = getattr(e, "filename", None) or r.rec_dir
        raise _failure(e, f"cannot write {where}: {e.strerror or e}; the previous recommendation is "
                          f"unchanged") from None
    _finish(r.store, r.run_id, r.st, "ok", EXIT_OK, decision=decision.decision)
    return path


def storage_failure(r: _Run, e: BaseException) -> Failure | None:
    """The study's database unusable mid-run (a full disk, a file removed or corrupted, PostgreSQL
    stopped): the server stopped, exit 3 naming the database (None: ``e`` is no database fault).
    Every trial finished before it stays in the database; a rerun resumes the study."""
    cause = storage_fault(e)
    if cause is None:
        return None
    if r.st is not None and r.st.current_server is not None:
        r.st.current_server.stop()
    if r.run_id is not None:  # its trial left RUNNING is dead: this process's next run retries it
        end_run(r.run_id)
    where = safe_url(r.url) if r.url else "the study's database"
    if r.run_id is None:  # before the run was recorded: nothing started yet
        msg = f"database {where} is unusable ({scrub(error_line(cause), r.url)}); nothing was started"
    else:
        msg = (f"database {where} became unusable mid-study ({scrub(error_line(cause), r.url)}); the server "
               f"is stopped, the finished trials are kept in it; rerun to resume once it is usable")
    return Failure(msg, StoreError(msg))


def interrupted(r: _Run, signame: str) -> str:
    """SIGTERM/SIGINT after the run was recorded: the server stopped, this process's running
    trial failed with the reason, the run recorded as interrupted. Returns what to say."""
    reason = interrupted_attrs(signame)["error"]
    if r.st is not None:
        if r.st.current_server is not None:
            r.st.current_server.stop()
        r.st.fail_own_running(signame)
        _finish(r.store, r.run_id, r.st, "interrupted", EXIT_INTERRUPTED, error=reason)
    else:
        r.store.finish_run(r.run_id, "interrupted", EXIT_INTERRUPTED, error=reason)
    return f"interrupted ({signame}): server stopped, running trial marked failed; rerun to resume"


def summary_lines(decision, payload: dict, outcome) -> list[str]:
    """What a finished run says: why it stopped, the decision, the figures behind it."""
    ev = payload["evidence"]
    out = [f"stopped: {outcome.stopped_because}", f"decision: {decision.decision} — {decision.reason}"]
    b = ev["baseline"]["tpot_ms"]
    w = ev.get("winner", {}).get("tpot_ms")
    out.append((f"  baseline {b:.2f} ms" if b is not None else "  baseline: no usable start")
               + (f", winner {w:.2f} ms" if w else ""))
    out += [f"  {line}" for line in _payload.comparison_lines(ev)]
    out += [f"  note: {line}" for line in (payload.get("per_level") or {}).get("advice") or []]
    out += [f"  {line}" for line in engine_note_lines(payload.get("engine_notes"))]
    out += [f"  drift: {note}" for note in payload["drift"]["notes"]]
    out += [f"  {line}" for line in _gate.lines(payload["fidelity"])]
    out.append(f"  {outcome.server_starts} server starts"
               + (f" ({uncounted_note(outcome.trials, noun=False)}, not counted against the budget)"
                  if outcome.interrupted_starts else "") + f", {len(outcome.trials)} trials, {outcome.wall_s:.0f}s")
    return out


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
