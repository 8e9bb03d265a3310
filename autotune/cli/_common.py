"""What every command group shares: exit codes, the error line, finding a workload's spec, the
storage options, the current recommendation, and the per-trial progress line."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import stat
import sys
from pathlib import Path

import click

from autotune.core._inputs import LIMITS, InputError, open_input
from autotune.core._names import study_name_problem, workload_problem
from autotune.core._settings import Settings
from autotune.core._spec import SpecError, find_spec, load_spec
from autotune.core._store import StoreError, check_url, error_line, has_password, safe_url, scrub

from autotune.core._exit import (EXIT_ENGINE, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_SOFTWARE,  # noqa: F401
                                 EXIT_WRITE)


def fail(msg: str, code: int = EXIT_INPUT) -> None:
    """One ``error:`` line on stderr, then exit with ``code``."""
    click.echo(f"error: {msg}", err=True)
    sys.exit(code)


class _Name(click.ParamType):
    """A workload or study name from the command line: it becomes file names, so it is checked
    first (``core._names``)."""

    def __init__(self, name: str, problem):
        self.name, self.problem = name, problem

    def convert(self, value, param, ctx):
        problem = self.problem(value)
        if problem:
            self.fail(problem, param, ctx)
        return value


WORKLOAD = _Name("workload", workload_problem)
STUDY_NAME = _Name("study name", study_name_problem)


def spec_for(workload: str, spec_path: str | None, settings: Settings):
    try:
        return load_spec(spec_path or find_spec(workload, settings.studies_dir))
    except SpecError as e:
        fail(str(e), EXIT_INPUT)


def read_storage_file(path: str) -> str:
    """The storage URL in ``path``: its first line that is not blank or a comment; an
    ``AUTOTUNE__STORAGE=...`` line is read too, so the systemd environment file serves as is."""
    try:
        with open_input(path, "storage file") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            lines = fh.read(LIMITS["storage file"]).decode("utf-8").splitlines()
    except InputError as e:
        fail(f"--storage-file {e}")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"--storage-file {path}: cannot read it ({getattr(e, 'strerror', None) or e})")
    urls = []
    for line in (ln.strip().removeprefix("export ").strip() for ln in lines):
        name = re.match(r"([A-Za-z_][A-Za-z0-9_]*)=", line)
        if line and not line.startswith("#") and (name is None or name.group(1) == "AUTOTUNE__STORAGE"):
            urls.append(line[name.end():].strip().strip("'\"") if name else line)
    if not urls:
        fail(f"--storage-file {path}: no storage URL in it (one line, or AUTOTUNE__STORAGE=URL)")
    if has_password(urls[0]) and stat.S_IMODE(mode) & 0o077:
        click.echo(f"warning: {path} holds a database password and other users may read it "
                   f"(mode {stat.S_IMODE(mode):04o}); chmod 600 {path}", err=True)
    return urls[0]


def resolve_storage(storage: str | None, storage_file: str | None) -> str | None:
    """``--storage`` or ``--storage-file`` (not both). A password on the command line is shown to
    every local user by ``ps``: it is used, with a warning naming the safe places for it."""
    if storage and storage_file:
        fail("give --storage or --storage-file, not both")
    if storage_file:
        return read_storage_file(storage_file)
    if storage and has_password(storage):
        click.echo(f"warning: --storage {safe_url(storage)} carries a password, which every local user can read "
                   "in the process list; put the URL in AUTOTUNE__STORAGE or in a 0600 file given with "
                   "--storage-file", err=True)
    return storage


def storage_options(help: str):
    """``--storage URL`` and ``--storage-file PATH``, resolved into the command's ``storage``."""
    def deco(f):
        @functools.wraps(f)
        def wrapper(*args, storage=None, storage_file=None, **kw):
            return f(*args, storage=resolve_storage(storage, storage_file), **kw)

        wrapper = click.option("--storage-file", type=click.Path(dir_okay=False),
                               help="read the storage URL from this file (keep it 0600): a password stays "
                                    "out of the process list")(wrapper)
        return click.option("--storage", help=help)(wrapper)
    return deco


def run_storage(spec, storage: str | None, settings: Settings) -> str:
    """The storage a command reads for ``spec`` (``ops._runner.storage_for``), checked: exit 3 when
    it is no database URL, its driver is missing or its SQLite folder cannot be made."""
    from autotune.ops._runner import storage_for

    try:
        return checked_storage(storage_for(spec, storage, settings))
    except StoreError as e:
        fail(str(e), EXIT_ENGINE)


def checked_storage(url: str) -> str:
    """``url`` if it is a database URL whose driver is installed, else exit 3 naming it (masked)."""
    try:
        return check_url(url)
    except StoreError as e:
        fail(str(e), EXIT_ENGINE)


def quiet_optuna():
    """Optuna, imported when a command needs it (``autotune --help`` loads none of it), with its
    INFO lines off below ``-vv``: failed trials are reported on the progress line, without
    Optuna's traceback."""
    import optuna

    ctx = click.get_current_context(silent=True)
    verbose = (ctx.find_root().params.get("verbose") or 0) if ctx is not None else 0
    if verbose < 2:
        optuna.logging.set_verbosity(optuna.logging.ERROR)
    return optuna


def study_summaries(url: str, include_best_trial: bool = False) -> list:
    """Optuna's study summaries in ``url``; a database that cannot be read is exit 3 (URL masked)."""
    optuna = quiet_optuna()
    checked_storage(url)
    try:
        return optuna.get_all_study_summaries(url, include_best_trial=include_best_trial)
    except Exception as e:  # the driver's or SQLAlchemy's error, whatever its class
        fail(f"cannot read the studies in {safe_url(url)}: {scrub(error_line(e), url)}", EXIT_ENGINE)


def load_recommendation(rec_dir: str, workload: str) -> dict:
    """The current recommendation of ``workload``; missing, not JSON or not a recommendation
    (a list, a hand-edit without its fields) is exit 2 naming the file."""
    from autotune.decide import _payload

    try:
        return _payload.load(rec_dir, workload)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e), EXIT_INPUT)
    except OSError as e:
        fail(f"{_payload.recommendation_path(rec_dir, workload)}: cannot read it ({e.strerror})", EXIT_INPUT)


@contextlib.contextmanager
def hand_edited(rec_dir: str, workload: str):
    """Reading a recommendation's inner fields: one that is not what autotune wrote (hand-edited)
    is exit 2 naming the file, not a traceback."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:
        from autotune.decide._payload import recommendation_path

        fail(f"{recommendation_path(rec_dir, workload)}: not a recommendation autotune wrote (hand-edited?): "
             f"{type(e).__name__} {e}; its history copies are in {Path(rec_dir) / 'history' / workload}", EXIT_INPUT)


def print_event(e) -> None:
    """One line per finished trial (``_study.TrialEvent``)."""
    click.echo(event_line(e))


def event_line(e) -> str:
    from autotune.search._space import label

    value = f"{e.value:7.2f} ms" if e.value is not None else "      -   "
    best = f"{e.best:7.2f} ms" if e.best is not None else "      -   "
    note = f"  [{e.note[:90]}]" if e.note else ""
    return (f"trial {e.number:3d} {e.role:8s} {label(e.config):34s} {e.state:8s} "
            f"tpot {value}  best {best}  starts {e.server_starts:2d}  {e.elapsed_s:6.0f}s{note}")


def run_and_exit(req, quiet: bool = False) -> None:
    """Run ``req`` (``ops._runner.execute``), one line per trial as it goes and a bar of the
    server starts against the budget on a terminal's stderr (not with ``quiet``), then say the
    run's closing lines and exit with its code."""
    from autotune.core._progress import Progress
    from autotune.ops._runner import execute, render

    quiet_optuna()
    with Progress(_starts_budget(req), desc=f"{req.workload}: server starts", unit="start", quiet=quiet) as bar:
        def on_event(e) -> None:
            bar.echo(event_line(e))
            bar.set(e.server_starts, postfix=f"trial {e.number}" + (f", best {e.best:.2f} ms" if e.best else ""))

        result = execute(req, echo=bar.echo, on_event=on_event)
    render(result, lambda msg, err=False: click.echo(msg, err=err))
    sys.exit(result.exit_code)


def _starts_budget(req) -> int | None:
    """The bar's total: the run's ``max_server_starts`` (None when the spec cannot be read: the
    run says why)."""
    from autotune.core._settings import get_settings

    if req.max_server_starts:
        return req.max_server_starts
    try:
        return load_spec(req.spec_path or find_spec(req.workload, get_settings().studies_dir)).budget.max_server_starts
    except (SpecError, OSError, ValueError):
        return None
