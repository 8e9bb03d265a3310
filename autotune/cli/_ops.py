"""Commands for running autotune unattended and for SREs: daemon, worker, exporter, db, and
`recommend diff` / `recommend history`. Each is registered in ``cli._main`` with one line.

Exit codes are the runner's (``autotune.ops._runner``): 0 ok, 2 bad input, 3 engine or database
unusable, 4 not writable, 75 busy (GPU or daemon lock held), 130 interrupted.
"""

from __future__ import annotations

import json
import sys

import click

from autotune.cli._common import (EXIT_ENGINE, EXIT_INTERRUPTED, STUDY_NAME, WORKLOAD, fail, print_event,
                                  read_storage_file, run_and_exit, storage_options)
from autotune.core._settings import get_settings


# ---- daemon -------------------------------------------------------------------------------
@click.group("daemon")
def daemon() -> None:
    """Nightly retuning of every scheduled workload, unattended."""


@daemon.command("run")
@click.option("--workload", "-w", "workloads", type=WORKLOAD, multiple=True, help="only these workloads (default: every spec "
              "with an enabled schedule)")
@click.option("--now", "run_now", is_flag=True, help="also run every workload once at startup")
@click.option("--metrics-addr", help="exporter bind address (default AUTOTUNE__METRICS_ADDR, 127.0.0.1)")
@click.option("--metrics-port", type=click.IntRange(0, 65535), help="exporter port (default AUTOTUNE__METRICS_PORT, 9464; 0 = any)")
@click.option("--no-metrics", is_flag=True, help="no Prometheus exporter")
def daemon_run(workloads, run_now, metrics_addr, metrics_port, no_metrics) -> None:
    """Schedule each workload's nightly study (spec `schedule.cron`) and run them one at a time.
    SIGTERM stops the running study cleanly and exits 0; a second daemon on the GPU exits 75."""
    from autotune.cli._common import quiet_optuna
    from autotune.ops._daemon import Daemon

    quiet_optuna()
    settings = get_settings()
    update = {k: v for k, v in (("metrics_addr", metrics_addr), ("metrics_port", metrics_port)) if v is not None}
    settings = settings.model_copy(update=update)
    sys.exit(Daemon(settings, list(workloads), run_now=run_now, metrics=not no_metrics,
                    echo=lambda m, err=False: click.echo(m, err=err), on_event=print_event).run())


# ---- worker -------------------------------------------------------------------------------
@click.command("worker")
@click.option("--workload", "-w", type=WORKLOAD, required=True, help="workload whose study to join (studies/<workload>.yaml)")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False),
              help="study spec file (default: <studies-dir>/<workload>.yaml)")
@storage_options("the shared Optuna storage (PostgreSQL URL) of the study")
@click.option("--study-name", type=STUDY_NAME, help="join this study (default: the one the same inputs name)")
@click.option("--wait", "wait_for_gpu", is_flag=True, help="wait for this host's GPU lock instead of exiting 75")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar (there is none off a terminal)")
def worker(workload, spec_path, storage, study_name, wait_for_gpu, quiet) -> None:
    """Join a workload's study from another host (or GPU): run trials under this GPU's lock,
    share the search through the storage; the leader (`study start`/daemon) confirms and decides."""
    from autotune.ops._runner import RunRequest

    run_and_exit(RunRequest(workload=workload, spec_path=spec_path, storage=storage, study_name=study_name,
                            wait_for_gpu=wait_for_gpu, kind="worker", worker=True), quiet=quiet)


# ---- exporter -----------------------------------------------------------------------------
@click.command("exporter")
@click.option("--storage", "storages", multiple=True, help="database URL(s) (default: every spec's storage)")
@click.option("--storage-file", "storage_files", multiple=True, type=click.Path(dir_okay=False),
              help="read a database URL from this file (keep it 0600): a password stays out of the process list")
@click.option("--addr", help="bind address (default AUTOTUNE__METRICS_ADDR, 127.0.0.1)")
@click.option("--port", type=click.IntRange(0, 65535), help="port (default AUTOTUNE__METRICS_PORT, 9464)")
def exporter(storages, storage_files, addr, port) -> None:
    """Serve the Prometheus metrics alone (for cron-driven setups without the daemon)."""
    import threading

    from autotune.cli._common import resolve_storage
    from autotune.core._signals import graceful_stop, signame_of
    from autotune.ops import _exporter

    settings = get_settings()
    urls = ({resolve_storage(u, None) for u in storages} | {read_storage_file(f) for f in storage_files}
            or spec_storages(settings))
    srv, _ = _exporter.serve(urls, addr or settings.metrics_addr, port if port is not None else settings.metrics_port,
                             addr_from="--addr" if addr else "AUTOTUNE__METRICS_ADDR")
    click.echo(f"metrics on http://{addr or settings.metrics_addr}:{srv.server_port}/metrics")
    try:
        with graceful_stop():
            threading.Event().wait()
    except KeyboardInterrupt as e:  # SIGTERM is the service's clean stop; Ctrl-C is 130, as everywhere
        if signame_of(e) == "SIGINT":
            fail("interrupted", EXIT_INTERRUPTED)
    finally:
        srv.shutdown()


def spec_storages(settings, default: bool = True) -> set[str]:
    """The storages of every valid spec in the studies folder; none (and ``default``): the one a
    run without a spec uses (AUTOTUNE__STORAGE, else SQLite in AUTOTUNE__HOME, created). A
    storage that cannot be prepared is exit 3."""
    from pathlib import Path

    from autotune.core._spec import SpecError, load_spec
    from autotune.core._store import StoreError
    from autotune.ops._runner import storage_for

    urls = set()
    try:
        for p in sorted(Path(settings.studies_dir).glob("*.y*ml")):
            try:
                urls.add(storage_for(load_spec(p), None, settings))
            except SpecError:
                continue
        if not urls and default:
            urls.add(storage_for(None, None, settings))
    except StoreError as e:
        fail(str(e), EXIT_ENGINE)
    return urls


# ---- db -----------------------------------------------------------------------------------
@click.group("db")
def db() -> None:
    """autotune's own tables: migrations and SRE reports (the repository's sql/, installed with autotune)."""


def _store_for(storage: str | None):
    from autotune.core._store import Store, StoreError

    settings = get_settings()
    url = storage or sorted(spec_storages(settings))[0]
    try:
        return Store(url)
    except StoreError as e:
        fail(str(e), EXIT_ENGINE)


@db.command("migrate")
@storage_options("database URL (default: the first spec's storage)")
def db_migrate(storage) -> None:
    """Apply pending migrations from sql/migrations (shipped with autotune; also done at every start)."""
    from autotune.core._store import StoreError, migrate, safe_url

    settings = get_settings()
    url = storage or sorted(spec_storages(settings))[0]
    try:
        done = migrate(url)
    except StoreError as e:
        fail(str(e), EXIT_ENGINE)
    click.echo(f"{safe_url(url)}: " + (f"applied {', '.join(map(str, done))}" if done else "up to date"))


@db.command("report")
@click.argument("name")
@storage_options("database URL (default: the first spec's storage)")
@click.option("--json", "as_json", is_flag=True, help="print the rows as JSON on stdout")
def db_report(name, storage, as_json) -> None:
    """Run the shipped report NAME: latest_recommendations, recommendation_history, failures, runs."""
    from autotune.core._store import StoreError

    store = _store_for(storage)
    try:
        rows = store.report(name)
    except StoreError as e:
        fail(str(e))
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    if not rows:
        click.echo("(no rows)")
        return
    cols = list(rows[0])
    width = {c: min(60, max(len(c), *(len(_cell(r[c])) for r in rows))) for c in cols}
    click.echo("  ".join(c.ljust(width[c]) for c in cols))
    for r in rows:
        click.echo("  ".join(_cell(r[c])[:width[c]].ljust(width[c]) for c in cols))


def _cell(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


# ---- recommend diff / history -----------------------------------------------------------------
def _history_for(workload: str, storage: str | None):
    from autotune.cli._common import spec_for
    from autotune.core._store import Store, StoreError
    from autotune.decide import _history
    from autotune.ops._runner import recommendations_dir, storage_for

    settings = get_settings()
    spec = spec_for(workload, None, settings)
    try:
        store = Store(storage_for(spec, storage, settings))
    except StoreError:
        store = None  # the history files still answer
    return _history.history(workload, recommendations_dir(spec, settings), store)


@click.command("diff")
@click.argument("workload", type=WORKLOAD)
@click.option("--from", "old_id", help="recommendation id to compare from (default: the one before the latest)")
@click.option("--to", "new_id", help="recommendation id to compare to (default: the latest)")
@storage_options("database URL (default: AUTOTUNE__STORAGE, the spec's, or sqlite in .autotune)")
def recommend_diff(workload, old_id, new_id, storage) -> None:
    """What changed between two recommendations of WORKLOAD, and why."""
    from autotune.decide import _history
    h = _history_for(workload, storage)
    if len(h) < 2 and not (old_id and new_id):
        fail(f"workload {workload!r} has {len(h)} recommendation(s) in its history; a diff needs two")

    def pick(rid, default):
        if rid is None:
            return default
        found = [r for r in h if str(r.get("id", "")).startswith(rid)]
        if not found:
            fail(f"no recommendation {rid!r} for {workload!r}")
        return found[0]

    new = pick(new_id, h[0])
    old = pick(old_id, h[h.index(new) + 1] if new in h and h.index(new) + 1 < len(h) else None)
    if old is None:
        fail(f"no recommendation before {new.get('id')}")
    for line in _history.diff_lines(old, new):
        click.echo(line)


@click.command("history")
@click.argument("workload", type=WORKLOAD)
@storage_options("database URL (default: AUTOTUNE__STORAGE, the spec's, or sqlite in .autotune)")
@click.option("--json", "as_json", is_flag=True, help="print the recommendations as JSON on stdout, each as written")
def recommend_history(workload, storage, as_json) -> None:
    """Every recommendation of WORKLOAD, newest first."""
    from autotune.decide._history import fmt_config

    h = _history_for(workload, storage)
    if as_json:
        click.echo(json.dumps(h, indent=2, default=str))
        return
    for r in h:
        ev = r.get("evidence") or {}
        drift = r.get("drift") or {}
        sp = f" speedup {ev['speedup']:.2f}x" if isinstance(ev.get("speedup"), (int, float)) else ""
        click.echo(f"{r.get('id', '-')}  {r.get('created_at')}  {r.get('decision'):7s} "
                   f"{fmt_config(r.get('speculative_config')):24s}{sp}" + ("  DRIFT" if drift.get("drifted") else ""))
