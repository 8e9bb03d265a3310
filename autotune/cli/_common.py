"""What every command group shares: exit codes, the error line, finding a workload's spec, and the
per-trial progress line."""

from __future__ import annotations

import sys

import click

from autotune.core._settings import Settings
from autotune.core._spec import SpecError, find_spec, load_spec
from autotune.search._space import label

EXIT_OK, EXIT_INPUT, EXIT_ENGINE, EXIT_WRITE, EXIT_INTERRUPTED = 0, 2, 3, 4, 130


def fail(msg: str, code: int = EXIT_INPUT) -> None:
    """One ``error:`` line on stderr, then exit with ``code``."""
    click.echo(f"error: {msg}", err=True)
    sys.exit(code)


def spec_for(workload: str, spec_path: str | None, settings: Settings):
    try:
        return load_spec(spec_path or find_spec(workload, settings.studies_dir))
    except SpecError as e:
        fail(str(e), EXIT_INPUT)


def print_event(e) -> None:
    """One line per finished trial (``_study.TrialEvent``)."""
    value = f"{e.value:7.2f} ms" if e.value is not None else "      -   "
    best = f"{e.best:7.2f} ms" if e.best is not None else "      -   "
    note = f"  [{e.note[:90]}]" if e.note else ""
    click.echo(f"trial {e.number:3d} {e.role:8s} {label(e.config):34s} {e.state:8s} "
               f"tpot {value}  best {best}  starts {e.server_starts:2d}  {e.elapsed_s:6.0f}s{note}")
