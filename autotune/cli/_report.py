"""``autotune report W [--out DIR]``: the study report (Markdown, HTML, PNG plots; see ``_report``)."""

from __future__ import annotations

from pathlib import Path

import click

from autotune.cli._common import (EXIT_INPUT, STUDY_NAME, WORKLOAD, fail, quiet_optuna, run_storage, spec_for,
                                  storage_options, study_summaries)
from autotune.core._names import child


@click.command("report")
@click.argument("workload", type=WORKLOAD)
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="folder for report.md, report.html and the PNGs (default: <AUTOTUNE__HOME>/reports/<workload>)")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False), help="study spec file (default: from studies/)")
@storage_options("Optuna storage URL (default: AUTOTUNE__STORAGE, the spec's, or sqlite in .autotune)")
@click.option("--study-name", type=STUDY_NAME, help="a study other than the workload's latest")
def report(workload, out_dir, spec_path, storage, study_name) -> None:
    """Write WORKLOAD's study report: plots and the recommendation."""
    from autotune.core._settings import get_settings
    from autotune.core._store import safe_url
    from autotune.decide import _payload
    from autotune.report._report import ReportError, build
    from autotune.search._record import read_study

    optuna = quiet_optuna()
    settings = get_settings()
    spec = spec_for(workload, spec_path, settings)
    url = run_storage(spec, storage, settings)
    summaries = study_summaries(url)
    names = [s.study_name for s in summaries if s.study_name.startswith(spec.study_name + "-")
             or s.study_name == study_name]
    if study_name:
        names = [study_name] if study_name in names else []
    if not names:
        fail(f"no study for workload {workload!r} in {safe_url(url)}", EXIT_INPUT)
    st = optuna.load_study(study_name=names[-1], storage=url)
    try:
        rec = _payload.load(settings.recommendations_dir or spec.recommendations_dir, workload)
        if (rec.get("study") or {}).get("name") not in (None, names[-1]):
            rec = None  # the recommendation of another study (other inputs): not this report's
    except (FileNotFoundError, ValueError):  # none, or not one autotune wrote: the report without it
        rec = None
    out = Path(out_dir) if out_dir else child(Path(settings.home) / "reports", workload)
    try:
        paths = build(read_study(st), out, rec, workload)
    except ReportError as e:
        fail(str(e), EXIT_INPUT)
    click.echo(f"report of study {names[-1]}: {paths['markdown']}")
    for name, p in paths.items():
        if name not in ("markdown",):
            click.echo(f"  {name}: {p}")
