"""Commands that watch production: `telemetry scrape|show`, `drift check`, `recommend
mark-deployed|check`. Each is registered in ``cli._main`` with one line. None of them needs a GPU.

Exit codes: 0 ok (no retune needed, within the canary ranges), 1 retune needed / large gap
between production and the prediction, 2 bad input (spec, telemetry, replay set, no
recommendation), 3 production's /metrics could not be scraped.
"""

from __future__ import annotations

import json
import sys

import click

from autotune.cli._common import WORKLOAD, fail, hand_edited, load_recommendation, spec_for
from autotune.core._inputs import read_input
from autotune.core._settings import get_settings

EXIT_OK, EXIT_FLAG, EXIT_INPUT, EXIT_UNREACHABLE = 0, 1, 2, 3


def _spec(workload: str, spec_path: str | None):
    return spec_for(workload, spec_path, get_settings())


def _rec_dir(spec) -> str:
    from autotune.ops._runner import recommendations_dir

    return recommendations_dir(spec, get_settings())


def _load_telemetry(path: str, after: str | None = None, window_s: float | None = None) -> dict:
    from autotune.trust._telemetry import TelemetryError, load

    try:
        return load(path, after, window_s)
    except TelemetryError as e:
        fail(str(e))


# ---- telemetry ------------------------------------------------------------------------------
@click.group("telemetry")
def telemetry() -> None:
    """Production's vLLM /metrics: scrape a window, show what it says."""


@telemetry.command("scrape")
@click.option("--url", required=True, help="the deployment's vLLM server (http://host:port or .../metrics)")
@click.option("--window", "window", default="60s", show_default=True, help="how long to watch (30s, 10m, 1h)")
@click.option("--every", "every_s", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="seconds between gauge samples (running requests, KV cache usage)")
@click.option("--out", "out", type=click.Path(dir_okay=False), help="write the bundle (JSON) here")
@click.option("--json", "as_json", is_flag=True, help="print the derived figures as JSON")
def telemetry_scrape(url, window, every_s, out, as_json) -> None:
    """Scrape URL's /metrics now and after WINDOW; derive acceptance, coverage, tokens per step,
    TPOT/ITL/TTFT percentiles, preemptions, running requests, KV usage. Exit 3 if unreachable."""
    from autotune.trust import _telemetry

    window_s = _window(window)
    try:
        b = _telemetry.scrape_window(url, window_s, sample_every_s=every_s)
    except _telemetry.TelemetryError as e:
        fail(str(e), EXIT_UNREACHABLE)
    if out:
        _telemetry.save(out, b)
    if as_json:
        click.echo(json.dumps(b["derived"], indent=2))
    else:
        for line in _telemetry.summary_lines(b):
            click.echo(line)
    if out:
        click.echo(f"wrote {out}")


@telemetry.command("show")
@click.argument("path", type=click.Path(dir_okay=False))
@click.argument("after", required=False, type=click.Path(dir_okay=False))
@click.option("--window", "window", help="two exposition files: the time between them (for mean running requests)")
@click.option("--json", "as_json", is_flag=True, help="print the derived figures as JSON on stdout")
def telemetry_show(path, after, window, as_json) -> None:
    """The figures of a bundle (PATH from `scrape --out`), or of two saved exposition files
    (PATH before, AFTER after, e.g. `curl -s host:8000/metrics > before.prom`)."""
    from autotune.trust import _telemetry

    window_s = _window(window) if window else None
    b = _load_telemetry(path, after, window_s)
    if as_json:
        click.echo(json.dumps(b["derived"], indent=2))
        return
    for line in _telemetry.summary_lines(b):
        click.echo(line)


def _window(text: str) -> float:
    """``--window``'s seconds: a duration above zero (a zero window has no rates to derive)."""
    from autotune.core._schedule import parse_duration

    try:
        window_s = parse_duration(text)
    except ValueError as e:
        fail(f"--window: {e}")
    if window_s <= 0:
        fail(f"--window: {text!r} is not above zero")
    return window_s


# ---- drift ----------------------------------------------------------------------------------
@click.group("drift")
def drift() -> None:
    """Whether a workload needs a retune, without a GPU."""


@drift.command("check")
@click.argument("workload", type=WORKLOAD)
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False),
              help="study spec file (default: <studies-dir>/<workload>.yaml)")
@click.option("--replay", type=click.Path(dir_okay=False), help="current traffic (default: the spec's replay.path)")
@click.option("--telemetry", "telemetry_path", type=click.Path(dir_okay=False),
              help="production telemetry bundle (default: the spec's production.telemetry)")
@click.option("--json", "as_json", is_flag=True, help="print the check as JSON on stdout")
def drift_check(workload, spec_path, replay, telemetry_path, as_json) -> None:
    """Compare WORKLOAD's current traffic, production telemetry, engine and clock with what its
    current recommendation was made on. Prints "no retune needed" with the figures (exit 0) or
    "retune: <reasons>" (exit 1); 2 bad input."""
    from autotune.ops import _runner
    from autotune.traffic._replayset import ReplaySetError
    from autotune.trust import _drift
    from autotune.trust._telemetry import TelemetryError

    spec = _spec(workload, spec_path)
    with hand_edited(_rec_dir(spec), workload):
        try:
            res = _runner.drift_result(spec, replay, telemetry_path)
        except (ReplaySetError, TelemetryError, ValueError) as e:
            fail(str(e))
    _report_check(spec, "drift", res, as_json, _drift.drift_lines, res["retune"])


def _report_check(spec, kind: str, res: dict, as_json: bool, to_lines, flagged: bool) -> None:
    """Keep the check beside the recommendation, print it, exit 1 when it flags something."""
    from autotune.trust import _drift
    _drift.append_check(_rec_dir(spec), spec.workload, kind, res)
    if as_json:
        click.echo(json.dumps(res, indent=2, default=str))
    else:
        for line in to_lines(res):
            click.echo(line)
    sys.exit(EXIT_FLAG if flagged else EXIT_OK)


# ---- recommend mark-deployed / check ------------------------------------------------------------
def _current(spec) -> dict:
    return load_recommendation(_rec_dir(spec), spec.workload)


@click.command("mark-deployed")
@click.argument("workload", type=WORKLOAD)
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False),
              help="study spec file (default: <studies-dir>/<workload>.yaml)")
@click.option("--note", help="free text kept with the mark (change ticket, canary host)")
def recommend_mark_deployed(workload, spec_path, note) -> None:
    """Record that WORKLOAD's current recommendation is now live (recommendations/<workload>.deployed.json)."""
    from autotune.decide._history import fmt_config
    from autotune.trust import _drift

    spec = _spec(workload, spec_path)
    rec = _current(spec)
    with hand_edited(_rec_dir(spec), workload):
        mark = _drift.mark_deployed(_rec_dir(spec), rec, note)
    click.echo(f"{workload}: recommendation {mark['recommendation']} ({rec['decision']}, "
               f"{fmt_config(rec.get('speculative_config'))}) marked deployed at {mark['deployed_at']}")


@click.command("check")
@click.argument("workload", type=WORKLOAD)
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False),
              help="study spec file (default: <studies-dir>/<workload>.yaml)")
@click.option("--telemetry", "telemetry_path", required=True, type=click.Path(dir_okay=False),
              help="production telemetry bundle taken after the deploy (`autotune telemetry scrape --out`)")
@click.option("--json", "as_json", is_flag=True, help="print the comparison as JSON on stdout")
def recommend_check(workload, spec_path, telemetry_path, as_json) -> None:
    """Realized vs predicted for WORKLOAD: production's TPOT, acceptance length and tokens per step
    against the recommendation's predictions; exit 1 when a figure is outside its canary range."""
    from autotune.trust import _drift
    spec = _spec(workload, spec_path)
    rec = _current(spec)
    tel = _load_telemetry(telemetry_path)
    try:
        mark = json.loads(read_input(_drift.deployed_path(_rec_dir(spec), workload), "deploy mark"))
    except (OSError, ValueError):
        mark = None
    with hand_edited(_rec_dir(spec), workload):
        res = _drift.realized(rec, mark, tel)
    _report_check(spec, "realized", res, as_json, _drift.realized_lines, res["gap_flagged"])


def show_trust_lines(rec: dict) -> list[str]:
    """What `recommend show` adds: the fidelity gate, the engine it is valid for, canary, kill criteria."""
    from autotune.trust._gate import lines

    out = lines(rec["fidelity"]) if rec.get("fidelity") else []
    eng = rec.get("engine")
    if eng:
        out.append(f"engine: vLLM {eng.get('vllm_version')}, fingerprint {eng.get('sha256')} (model and serve args)")
    c = rec.get("canary") or {}

    def rng(key, unit=""):
        r = c.get(key)
        return f"{r[0]:.2f}-{r[1]:.2f}{unit}" if r else "unresolved" if key in (c.get("unresolved") or {}) else "-"

    if c:
        out.append(f"canary: TPOT p50 {rng('tpot_ms_p50', ' ms')}, p90 {rng('tpot_ms_p90', ' ms')}, mean "
                   f"{rng('tpot_ms_mean', ' ms')}; acceptance length "
                   f"{rng('acceptance_length')}; tokens per step {rng('tokens_per_step')}")
        out += [f"canary {key} unresolved: {why}" for key, why in (c.get("unresolved") or {}).items()]
    for k in rec.get("kill_criteria") or []:
        bound = f"above {k['above']:.2f}" if "above" in k and isinstance(k["above"], float) else \
            f"above {k['above']}" if "above" in k else f"below {k['below']:.2f}"
        out.append(f"kill if {k['figure']} {bound}: {k['why']}")
    return out
