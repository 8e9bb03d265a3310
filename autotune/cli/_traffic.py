"""``autotune traffic``: import production request logs into pools, sample replay sets from them.

Exit codes follow ``autotune.cli._main``: 0 done, 2 bad input (nothing usable imported, no pool, a bad
option or spec; the message says which), 4 a pool or replay set could not be written (read-only
home, full disk): the files are as they were.
"""

from __future__ import annotations

from pathlib import Path

import click

from autotune.cli._common import EXIT_WRITE, WORKLOAD, fail
from autotune.core._settings import get_settings
from autotune.core._spec import SpecError, find_spec, load_spec

EXIT_INPUT = 2


def _specs_for_rules(spec_path: str | None, studies_dir: str | None) -> list:
    """The spec given, else every spec in the studies folder (sorted by file name)."""
    try:
        if spec_path:
            return [load_spec(spec_path)]
        d = Path(studies_dir or get_settings().studies_dir)
        if not d.is_dir():
            return []
        return [load_spec(p) for p in sorted(d.glob("*.y*ml"))]
    except SpecError as e:
        fail(str(e))


@click.group("traffic")
def traffic() -> None:
    """Production traffic in: import request logs, sample replay sets."""


@traffic.command("import")
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", default="auto", show_default=True,
              type=click.Choice(["auto", "openai", "bench", "mooncake"]),
              help="log format (auto: detected per line)")
@click.option("--workload", "-w", type=WORKLOAD, help="tag every imported request with this workload")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False),
              help="take workload rules and redaction from this spec (default: all specs in --studies-dir)")
@click.option("--studies-dir", help="folder of study specs (default: AUTOTUNE__STUDIES_DIR or studies)")
@click.option("--redact", multiple=True, metavar="REGEX", help="replace matches in prompts with [REDACTED] (repeatable)")
@click.option("--synthesize", is_flag=True,
              help="replay length-only trace rows (Mooncake) as synthetic prompts; acceptance is not measurable")
@click.option("--trace-start", metavar="ISO", help="wall-clock start of a Mooncake trace (its timestamps are relative)")
@click.option("--replace", is_flag=True, help="replace the pools of the imported workloads instead of adding to them")
@click.option("--home", help="working folder (default: AUTOTUNE__HOME or .autotune); pools go to <home>/traffic")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar (there is none off a terminal)")
def traffic_import(paths, fmt, workload, spec_path, studies_dir, redact, synthesize, trace_start, replace, home,
                   quiet) -> None:
    """Import request logs at PATHS (JSONL, gzip, globs, folders) into per-workload pools."""
    from autotune.core._progress import Progress
    from autotune.traffic._sampling import SampleError, parse_time
    from autotune.traffic._traffic import ImportOptions, PoolWriteError, TrafficError, import_paths
    from autotune.traffic._workloads import Classifier, slug

    if workload and slug(workload) != workload:
        fail(f"--workload {workload!r}: use letters, digits, '_', '.', '-'")
    specs = _specs_for_rules(spec_path, studies_dir)
    rules = [r for s in specs for r in s.traffic.rules]
    patterns = [p for s in specs for p in s.traffic.redact] + list(redact)
    try:
        start = parse_time(trace_start) or 0.0
    except SampleError as e:
        fail(f"--trace-start: {e}")
    home = home or get_settings().home
    bar = Progress(desc="traffic import", unit="file", quiet=quiet)

    def on_file(done: int, files: int, lines: int) -> None:
        bar.total(files)
        bar.set(done, postfix=f"{lines} lines")

    try:
        with bar:
            report = import_paths(paths, home, fmt=fmt, classifier=Classifier(rules, force=workload),
                                  redact=patterns, options=ImportOptions(synthesize=synthesize, trace_start=start),
                                  replace=replace, on_file=on_file)
    except TrafficError as e:
        fail(str(e))
    except PoolWriteError as e:
        fail(e.strerror, EXIT_WRITE)
    for pat in report.missing:
        click.echo(f"warning: {pat}: no files match", err=True)
    for fr in report.files:
        fmts = ", ".join(f"{k} {v}" for k, v in fr.formats.most_common())
        click.echo(f"{fr.path}: {fr.lines} lines, {fr.usable} imported ({fr.new} new"
                   f"{', ' + fmts if fmts else ''}), {fr.malformed_count} malformed"
                   + (f", {sum(fr.skipped.values())} skipped" if fr.skipped else ""))
        for line, why in fr.malformed:
            click.echo(f"  {fr.where(line)}: {why}")
        if fr.malformed_count > len(fr.malformed):
            click.echo(f"  ... and {fr.malformed_count - len(fr.malformed)} more malformed lines")
        for why, k in fr.skipped.most_common():
            click.echo(f"  skipped {k}: {why}")
    for w in sorted(report.workloads):
        how = ", ".join(f"{v} by {k}" for k, v in sorted(report.workloads[w].items()))
        click.echo(f"workload {w}: {sum(report.workloads[w].values())} imported ({how}), "
                   f"{report.new.get(w, 0)} new; pool {report.pools[w]} ({report.pool_sizes[w]} requests)")
    if report.redacted:
        click.echo(f"redacted {report.redacted} matches")
    if report.synthetic:
        click.echo(f"note: {report.synthetic} synthetic requests (length-only traces): replay sets sampled from "
                   "them measure speed, not speculative acceptance (manifest: acceptance_measurable false)")


@traffic.command("sample")
@click.option("--workload", "-w", type=WORKLOAD, required=True, help="pool to sample (<home>/traffic/<workload>.jsonl)")
@click.option("--n", "n", type=click.IntRange(min=1), help="requests (default: spec traffic.sample.n, else replay warmup + 2 x requests, else 68)")
@click.option("--since", metavar="ISO", help="window start (ISO 8601 or epoch seconds)")
@click.option("--until", metavar="ISO", help="window end, exclusive")
@click.option("--window-hours", type=click.FloatRange(min=0, min_open=True), help="window length ending at --until or the newest request (default: spec, 24)")
@click.option("--all-time", is_flag=True, help="no time window")
@click.option("--seed", type=click.IntRange(min=0), help="sampling seed (default: spec traffic.sample.seed, 0)")
@click.option("--out", type=click.Path(dir_okay=False), help="replay set to write (default: the spec's replay.path)")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False), help="study spec (default: <studies-dir>/<workload>.yaml)")
@click.option("--studies-dir", help="folder of study specs")
@click.option("--max-model-len", type=click.IntRange(min=1), help="context length (default: spec engine.serve_args.max_model_len)")
@click.option("--no-tokenizer", is_flag=True, help="estimate prompt tokens instead of loading the model's tokenizer")
@click.option("--redact", multiple=True, metavar="REGEX", help="also redact these patterns")
@click.option("--home", help="working folder (default: AUTOTUNE__HOME or .autotune)")
def traffic_sample(workload, n, since, until, window_hours, all_time, seed, out, spec_path, studies_dir,
                   max_model_len, no_tokenizer, redact, home) -> None:
    """Write a deterministic stratified replay set and its manifest from a workload's pool."""
    from autotune.traffic._sampling import _UNSET, SampleError, parse_time, sample_workload
    from autotune.traffic._traffic import TrafficError

    spec = None
    try:
        if spec_path:
            spec = load_spec(spec_path)
        else:
            try:
                found = find_spec(workload, studies_dir or get_settings().studies_dir)
            except SpecError:
                if not out:
                    raise
                found = None
            spec = load_spec(found) if found else None
    except SpecError as e:
        fail(f"{e} (give --spec, or --out to sample without a spec)")
    if all_time and (window_hours or since or until):
        fail("--all-time excludes --window-hours, --since and --until")
    try:
        result_out, mpath, result = sample_workload(
            home or get_settings().home, workload, spec=spec, out=out, n=n, seed=seed,
            since=parse_time(since), until=parse_time(until),
            window_hours=None if all_time else (window_hours if window_hours else _UNSET),
            max_model_len=max_model_len, use_tokenizer=not no_tokenizer, redact=list(redact))
    except (SampleError, TrafficError) as e:
        fail(str(e))
    except OSError as e:  # the replay set or its manifest: the previous ones are intact
        fail(f"cannot write {e.filename or out or 'the replay set'}: {e.strerror or e}; the previous replay set "
             f"is unchanged", EXIT_WRITE)
    m = result.manifest
    c = m["counts"]
    w = m["window"]
    win = f"{w['since'] or '-'} .. {w['until'] or 'newest'}" if (w["since"] or w["until"]) else "all time"
    click.echo(f"sampled {c['sampled']} of {c['eligible']} eligible requests (workload {workload}, pool {c['pool']}, "
               f"window {win}, seed {m['seed']})")
    if m["skipped"]:
        click.echo("  skipped: " + ", ".join(f"{k.replace('_', ' ')} {v['count']}" for k, v in m["skipped"].items())
                   + (f" (max_model_len {m['context']['max_model_len']}, tokens: {m['context']['token_counts']})"
                      if "too_long" in m["skipped"] else ""))
    click.echo("  by length: " + ", ".join(f"{k} {v}/{m['strata']['length']['population'][k]}"
                                          for k, v in m["strata"]["length"]["sample"].items()))
    if m["short_by"]:
        click.echo(f"warning: {m['short_by']} fewer requests than the {m['n_requested']} asked for", err=True)
    if not m["acceptance_measurable"]:
        click.echo(f"warning: {m['warning']}", err=True)
    click.echo(f"wrote {result_out} (content hash {m['content_hash']}) and {mpath}")


@traffic.command("list")
@click.option("--home", help="working folder (default: AUTOTUNE__HOME or .autotune)")
@click.option("--json", "as_json", is_flag=True, help="print the pools as JSON on stdout (for other tools)")
def traffic_list(home, as_json) -> None:
    """Traffic pools: workload, requests, time range, synthetic rows."""
    import json

    from autotune.traffic._sampling import _iso, read_pool
    from autotune.traffic._traffic import traffic_dir

    d = traffic_dir(home or get_settings().home)
    pools = []
    for p in sorted(d.glob("*.jsonl")) if d.is_dir() else []:
        rows, bad = read_pool(p)
        ts = [r.ts for r in rows if r.ts is not None]
        pools.append({"workload": p.stem, "path": str(p), "requests": len(rows),
                      "first": _iso(min(ts)) if ts else None, "last": _iso(max(ts)) if ts else None,
                      "synthetic": sum(1 for r in rows if r.synthetic), "unreadable_lines": bad})
    if as_json:
        click.echo(json.dumps(pools, indent=2))
        return
    if not pools:
        click.echo(f"no traffic pools in {d}")
        return
    for p in pools:
        span = f"{p['first']} .. {p['last']}" if p["first"] else "no timestamps"
        click.echo(f"{p['workload']:16s} {p['requests']:7d} requests  {span}"
                   + (f"  {p['synthetic']} synthetic" if p["synthetic"] else "")
                   + (f"  {p['unreadable_lines']} unreadable lines" if p["unreadable_lines"] else ""))
