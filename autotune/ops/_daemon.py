"""`autotune daemon run`: nightly retuning, unattended, one study at a time per GPU.

APScheduler decides *when* (a cron trigger per workload from its spec's ``schedule``, coalesced,
one instance, with a misfire grace); the main thread decides *what runs now*, one workload at a
time, through the same ``_runner`` as `study start --nightly`. Studies run in the main thread
on purpose: that is where SIGTERM lands, so stopping the daemon stops the running vLLM server,
fails the running trial with the reason and exits cleanly (0), with no thread left to kill.

Locks: a daemon takes ``daemon-gpu-<id>.lock`` for its lifetime, so a second daemon on the same
GPU exits at once (75) instead of doubling every schedule; each study takes ``gpu-<id>.lock``
(waiting for it), so a cron run or an engineer's `study start` and the daemon never measure at
the same time. At startup the daemon resumes what a killed predecessor left: runs still marked
running whose process is gone are resumed first (the study itself fails and retries the
interrupted trial; finished trials are kept), and a scheduled run missed while it was down is
made up if it is still within ``schedule.misfire_grace_minutes``.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
import threading
from pathlib import Path

from autotune.core._lock import EX_TEMPFAIL, FileLock, LockDirError, LockHeld, daemon_lock_path
from autotune.core._schedule import now, parse_cron, parse_iso, previous_fire
from autotune.core._settings import Settings
from autotune.core._signals import StopState, graceful_stop
from autotune.core._spec import SpecError, find_spec, load_spec
from autotune.core._store import Store, StoreError
from autotune.engines._recovery import owner_alive
from autotune.ops import _exporter
from autotune.core._exit import EXIT_INPUT, EXIT_INTERRUPTED
from autotune.ops._runner import (
    RunRequest,
    _refresh_traffic,
    drift_result,
    last_success,
    recommendations_dir,
    storage_for,
)
from autotune.ops._runner import run as run_workload
from autotune.trust import _drift

log = logging.getLogger(__name__)


class Pending:
    """Workloads due to run, in order, each at most once (coalescing repeated triggers)."""

    def __init__(self):
        self._items: list[str] = []
        self._cond = threading.Condition()
        self.running: str | None = None

    def add(self, workload: str, why: str = "") -> bool:
        with self._cond:
            if workload in self._items or workload == self.running:
                log.info("%s already queued or running; trigger coalesced (%s)", workload, why)
                return False
            self._items.append(workload)
            self._cond.notify()
            return True

    def pop(self, timeout_s: float) -> str | None:
        with self._cond:
            if not self._items:
                self._cond.wait(timeout_s)
            if not self._items:
                return None
            self.running = self._items.pop(0)
            return self.running

    def done(self) -> None:
        with self._cond:
            self.running = None

    def snapshot(self) -> list[str]:
        with self._cond:
            return list(self._items)


class Daemon:
    def __init__(self, settings: Settings, workloads: list[str] | None = None, run_now: bool = False,
                 metrics: bool = True, echo=None, on_event=None):
        self.settings, self.run_now, self.metrics = settings, run_now, metrics
        self.only = workloads or None
        self.echo = echo or (lambda msg, err=False: print(msg, flush=True))
        self.on_event = on_event
        self.pending = Pending()
        self.state = StopState()
        self.specs: dict = {}
        self.scheduler = None
        self.exporter = None
        self.last: dict[str, int] = {}

    def say(self, msg: str, err: bool = False) -> None:
        # local time with its zone: a line read across a DST change or from another host is unambiguous
        self.echo(dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z ") + msg, err=err)

    # ---- setup ------------------------------------------------------------------------------
    def load_specs(self) -> None:
        """Every spec with an enabled schedule (or the workloads asked for). Raises SpecError."""
        d = Path(self.settings.studies_dir)
        paths = ([find_spec(w, d) for w in self.only] if self.only
                 else sorted(d.glob("*.y*ml")) if d.is_dir() else [])
        for p in paths:
            spec = load_spec(p)
            if spec.schedule.enabled or self.only:
                self.specs[spec.workload] = spec
        if not self.specs:
            raise SpecError(f"no study spec with an enabled schedule in {d}")

    def schedule(self) -> None:
        from apscheduler.schedulers.background import BackgroundScheduler

        self.scheduler = BackgroundScheduler(timezone="UTC")
        for w, spec in self.specs.items():
            self.scheduler.add_job(self.pending.add, parse_cron(spec.schedule.cron, spec.schedule.timezone).trigger(),
                                   args=[w, "cron"], id=w, name=f"nightly {w}", coalesce=True, max_instances=1,
                                   misfire_grace_time=max(1, int(spec.schedule.misfire_grace_minutes * 60)))
        self.scheduler.start()
        for job in self.scheduler.get_jobs():
            sched = self.specs[job.id].schedule
            nxt = parse_cron(sched.cron, sched.timezone).local(job.next_run_time) if job.next_run_time else "never"
            self.say(f"scheduled {job.id}: {sched.cron} ({sched.timezone}), next at {nxt}")

    def catch_up(self) -> None:
        """Resume runs a killed daemon left behind; make up runs missed within the grace."""
        host = socket.gethostname()
        for w, spec in self.specs.items():
            try:
                store = Store(storage_for(spec, None, self.settings))
            except StoreError as e:
                self.say(f"{w}: {e}", err=True)
                continue
            for r in store.mark_dead_runs(host, lambda pid: owner_alive({"pid": pid})):
                if r["workload"] in self.specs and self.pending.add(r["workload"], "resume"):
                    self.say(f"{r['workload']}: run {r['run_id']} (pid {r['pid']}) was killed mid-study; resuming it")
            schedule = parse_cron(spec.schedule.cron, spec.schedule.timezone)
            prev = previous_fire(schedule, now())
            last = last_success(store, spec, self.settings)
            grace_s = spec.schedule.misfire_grace_minutes * 60
            if prev and (now() - prev).total_seconds() <= grace_s and (last is None or parse_iso(last) < prev):
                if self.pending.add(w, "missed"):
                    self.say(f"{w}: the run due at {schedule.local(prev)} was missed; within the misfire grace, "
                             "running it now")
            if self.run_now:
                self.pending.add(w, "--now")

    def start_exporter(self) -> None:
        urls = set()
        for w, spec in self.specs.items():
            try:
                urls.add(storage_for(spec, None, self.settings))
            except StoreError as e:  # said by catch_up already; the exporter shows the others
                log.warning("%s: %s", w, e)
        self.exporter, _ = _exporter.serve(urls, self.settings.metrics_addr, self.settings.metrics_port,
                                           extra=self._daemon_metrics)
        self.say(f"metrics on http://{self.settings.metrics_addr}:{self.exporter.server_port}/metrics")

    def _daemon_metrics(self):
        from prometheus_client.core import GaugeMetricFamily

        nxt = GaugeMetricFamily("autotune_next_run_timestamp_seconds", "Next scheduled run", labels=["workload"])
        queued = GaugeMetricFamily("autotune_queued", "1 while a workload waits to run", labels=["workload"])
        code = GaugeMetricFamily("autotune_daemon_last_exit_code", "Exit code of the daemon's last run of the workload",
                                 labels=["workload"])
        for job in (self.scheduler.get_jobs() if self.scheduler else []):
            if job.next_run_time:
                nxt.add_metric([job.id], job.next_run_time.timestamp())
        waiting = set(self.pending.snapshot())
        for w in self.specs:
            queued.add_metric([w], 1 if w in waiting else 0)
            if w in self.last:
                code.add_metric([w], self.last[w])
        up = GaugeMetricFamily("autotune_daemon_up", "1 while the daemon runs")
        up.add_metric([], 1)
        return [nxt, queued, code, up]

    # ---- main loop ----------------------------------------------------------------------------
    def run(self) -> int:
        try:
            self.load_specs()
        except SpecError as e:
            self.say(f"error: {e}", err=True)
            return EXIT_INPUT
        lock = FileLock(daemon_lock_path(self.settings.lock_path(), self.settings.gpu))
        try:
            lock.acquire(what=f"autotune daemon for {', '.join(self.specs)}")
        except LockHeld as e:
            h = e.holder
            self.say(f"error: another daemon already runs on GPU {self.settings.gpu} (pid {h.get('pid')} on "
                     f"{h.get('host')}, since {h.get('since')}); exiting", err=True)
            return EX_TEMPFAIL
        except LockDirError as e:
            self.say(f"error: {e.strerror}", err=True)
            return EXIT_INPUT
        try:
            with graceful_stop(self.state):
                try:
                    self.schedule()
                    if self.metrics:
                        self.start_exporter()
                    self.catch_up()
                    self.say(f"daemon up (pid {__import__('os').getpid()}, GPU {self.settings.gpu})")
                    while not self.state.requested:
                        w = self.pending.pop(timeout_s=1.0)
                        if w is None:
                            continue
                        try:
                            if self.no_retune_needed(w):  # drift.skip_unless_drift: no study without drift
                                continue
                            self.say(f"{w}: nightly run starts")
                            code = run_workload(RunRequest(workload=w, nightly=True, kind="daemon", wait_for_gpu=True),
                                                self.settings, echo=self._prefixed(w), on_event=self.on_event,
                                                stop=self.state)
                        finally:
                            self.pending.done()
                        self.last[w] = code
                        self.say(f"{w}: run ended with exit code {code}")
                        if code == EXIT_INTERRUPTED:
                            break
                except KeyboardInterrupt:
                    pass
                self.say(f"stopping ({self.state.signame or 'done'})")
        finally:
            if self.scheduler is not None:
                self.scheduler.shutdown(wait=False)
            if self.exporter is not None:
                self.exporter.shutdown()
            lock.release()
        return EXIT_INTERRUPTED if self.state.signame == "SIGINT" else 0  # SIGTERM: the service's stop

    def no_retune_needed(self, w: str) -> bool:
        """With ``drift.skip_unless_drift``: fresh traffic, then `autotune drift check` (no GPU);
        True (and the figures said) when it finds no reason to retune. Any error runs the study."""
        spec = self.specs.get(w)
        if spec is None or not spec.drift.skip_unless_drift:
            return False
        try:
            _refresh_traffic(spec, Path(self.settings.home).resolve(), self._prefixed(w))
            res = drift_result(spec)
            _drift.append_check(recommendations_dir(spec, self.settings), w, "drift", res)
        except Exception as e:
            self.say(f"[{w}] drift check failed ({type(e).__name__}: {e}); running the study")
            return False
        for line in _drift.drift_lines(res):
            self.say(f"[{w}] {line}")
        return not res["retune"]

    def _prefixed(self, w: str):
        return lambda msg, err=False: self.say(f"[{w}] {msg}", err=err)
