"""Record the exhaustive grid of a workload on real vLLM: ground truth for studies and search.

Every configuration of the workload's space (the baseline included) is measured on several
fresh server starts, interleaved round by round so slow drift of the machine hits every
configuration alike, each round in its own shuffled order (seeded by workload and round: a rerun
keeps it) so that no configuration is always measured first, right after the previous round's
last (on chat-llamacpp-vllm a fixed baseline-first order showed up as a 5-17% "speedup"). Each start's row is appended to ``benchmarks/results/grid-<workload>.jsonl``
as soon as it is measured; a rerun skips (config, start) pairs already recorded, so an
interrupted grid continues where it stopped and nothing is measured twice.

    python benchmarks/grid.py benchmarks/workloads/ngram-mid.yaml --k 1,2,3,4,6,8 --starts 3
    python benchmarks/grid.py studies/code-smollm2.yaml --only ngram=2,4,8 --only draft_model=2,4 --starts 2
    python benchmarks/grid.py benchmarks/workloads/ngram-mid.yaml --report   # table only

``--requests N --max-tokens M`` measure a short protocol (the first N measured requests, each
capped at M output tokens): enough for a configuration's acceptance, which greedy decoding makes
a property of the requests and not of the machine, where a start of the full protocol would cost
minutes; rows carry ``protocol`` then, and belong in a file of their own, not a grid's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.core import _measure
from autotune.core._progress import Progress  # noqa: E402
from autotune.traffic import _replayset  # noqa: E402
from autotune.engines import _registry  # noqa: E402
from autotune.core._signals import graceful_stop  # noqa: E402
from autotune.search._space import NONE, SearchSpace, canonical  # noqa: E402
from autotune.search._space import label as space_label  # noqa: E402
from autotune.core._spec import load_spec  # noqa: E402
from autotune.search._study import split_requests, window_requests  # noqa: E402
from autotune.search._trial import TrialFailed, measure  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def parse_only(values: list[str] | None) -> dict[str, list[int]] | None:
    """``--only ngram=2,4,8 --only draft_model=2,4`` -> {method: Ks}."""
    if not values:
        return None
    out = {}
    for v in values:
        method, sep, ks = v.partition("=")
        if not sep or not method:
            raise SystemExit(f"--only {v!r}: expected METHOD=K,K,... (e.g. ngram=2,4,8)")
        try:
            out[method] = [int(k) for k in ks.split(",")]
        except ValueError:
            raise SystemExit(f"--only {v!r}: the Ks must be integers") from None
    return out


def grid_configs(space: SearchSpace, ks: list[int] | None,
                 only: dict[str, list[int]] | None = None) -> list[dict | None]:
    configs: list[dict | None] = [None]
    if only:
        unknown = sorted(set(only) - set(space.methods))
        if unknown:
            raise SystemExit(f"--only: {', '.join(unknown)} not in the space ({', '.join(space.methods)})")
    for method in space.methods:
        if only is not None and method not in only:
            continue
        kr = space.spec.k_range(method)
        for k in (only or {}).get(method) or ks or range(kr.min, kr.max + 1):
            if kr.min <= k <= kr.max:
                params = space.params_for(method, k)
                for model in (space.spec.draft_models if method == "draft_model" else [None]):
                    if model is not None:
                        params = {**params, "draft_model.model": model}
                    configs.append(space.config_from_params(params))
    return configs


def short_protocol(requests: int | None, max_tokens: int | None) -> dict | None:
    """What a row records of a short protocol (None: the spec's own)."""
    p = {k: v for k, v in (("requests", requests), ("max_tokens", max_tokens)) if v is not None}
    return p or None


def shorten(reqs: list, n: int | None, max_tokens: int | None) -> list:
    """The first ``n`` requests, each asking for at most ``max_tokens`` (either None: unchanged)."""
    reqs = list(reqs[:n] if n else reqs)
    if max_tokens is None:
        return reqs
    return [dataclasses.replace(r, body={**r.body, "max_tokens": min(max_tokens, r.body.get("max_tokens") or max_tokens)})
            for r in reqs]


def load_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(rows: list[dict], statistic: str = "median") -> list[dict]:
    """Per configuration: the statistic of per-request TPOT pooled over starts, the per-start
    values and their coefficient of variation (the grid's own noise), per-tag values."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("ok"):
            by.setdefault(r["config_key"], []).append(r)
    out = []
    for key, rs in by.items():
        pooled = [v for r in rs for v in r["tpot_ms"]]
        per_start = [_measure.summarize(r["tpot_ms"], statistic) for r in rs]
        tags: dict[str, list[float]] = {}
        for r in rs:
            for v, t in zip(r["tpot_ms"], r.get("tags") or []):
                tags.setdefault(str(t), []).append(v)
        al = [r["acceptance_length"] for r in rs if r.get("acceptance_length")]
        out.append({
            "config_key": key, "config": rs[0]["config"], "starts": len(rs),
            "tpot_ms": _measure.summarize(pooled, statistic), "per_start": per_start,
            "cv": _measure.coefficient_of_variation(per_start) if len(per_start) > 1 else None,
            "by_tag": {t: _measure.summarize(v, statistic) for t, v in sorted(tags.items())},
            "acceptance_length": statistics.mean(al) if al else None,
        })
    out.sort(key=lambda s: s["tpot_ms"])
    return out


def label(config: dict | None) -> str:
    return space_label(config)


def report(rows: list[dict], statistic: str = "median") -> str:
    s = summarize(rows, statistic)
    if not s:
        return "(no rows)"
    base = next((x for x in s if x["config_key"] == NONE), None)
    tags = sorted({t for x in s for t in x["by_tag"]})
    head = f"| config | starts | {statistic} TPOT ms | per start | CV | speedup | AL |" + \
        "".join(f" {t} TPOT |" for t in tags)
    lines = [head, "|" + "---|" * (7 + len(tags))]
    for x in s:
        sp = base["tpot_ms"] / x["tpot_ms"] if base else float("nan")
        cv = "-" if x["cv"] is None else f"{x['cv']:.0%}"
        al = "-" if x["acceptance_length"] is None else f"{x['acceptance_length']:.2f}"
        per_start = ", ".join(f"{v:.2f}" for v in x["per_start"])
        lines.append(f"| {label(x['config'])} | {x['starts']} | {x['tpot_ms']:.2f} | {per_start} | {cv} | "
                     f"{sp:.2f}x | {al} |" + "".join(f" {x['by_tag'].get(t, float('nan')):.2f} |" for t in tags))
    best, runner = s[0], (s[1] if len(s) > 1 else None)
    lines.append("")
    lines.append(f"best: {label(best['config'])} {best['tpot_ms']:.2f} ms"
                 + (f"; runner-up: {label(runner['config'])} {runner['tpot_ms']:.2f} ms "
                    f"({runner['tpot_ms'] / best['tpot_ms'] - 1:+.1%})" if runner else ""))
    for t in tags:
        bt = min(s, key=lambda x: x["by_tag"].get(t, float("inf")))
        lines.append(f"best for tag {t}: {label(bt['config'])} {bt['by_tag'][t]:.2f} ms")
    return "\n".join(lines)


def main(argv=None) -> int:
    with graceful_stop():  # SIGTERM unwinds through measure(), which stops the server
        return _main(argv)


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec")
    ap.add_argument("--k", help="comma-separated K values (default: the space's whole K range)")
    ap.add_argument("--only", action="append", metavar="METHOD=K,K",
                    help="only these methods, at these Ks (repeatable; the baseline is always measured)")
    ap.add_argument("--starts", type=int, default=3, help="server starts per configuration")
    ap.add_argument("--out", help="results JSONL (default benchmarks/results/grid-<workload>.jsonl)")
    ap.add_argument("--report", action="store_true", help="print the table from recorded rows only")
    ap.add_argument("--home", default=str(ROOT / ".autotune"))
    ap.add_argument("--requests", type=int, help="measure only the first N measured requests (a short protocol)")
    ap.add_argument("--max-tokens", type=int, help="cap each request's max_tokens (a short protocol)")
    ap.add_argument("--quiet", "-q", action="store_true", help="no progress bar on stderr (none off a terminal)")
    args = ap.parse_args(argv)
    for name in ("requests", "max_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")

    spec = load_spec(args.spec)
    out = Path(args.out) if args.out else RESULTS / f"grid-{spec.workload}.jsonl"
    rows = load_rows(out)
    if not args.report:
        command = list(spec.engine.command)
        caps = _registry.for_spec(spec).probe(command, spec.engine.python, spec.engine.env, Path(args.home) / "cache")
        space = SearchSpace.build(spec.space, caps)
        rs = _replayset.load(spec.replay.path)
        warmup, search, _ = split_requests(spec, rs)
        protocol = short_protocol(args.requests, args.max_tokens)
        warmup, search = (shorten(warmup, None, args.max_tokens), shorten(search, args.requests, args.max_tokens))
        more = [(shorten(w, None, args.max_tokens), shorten(r, args.requests, args.max_tokens))
                for w, r in window_requests(spec, rs)]  # replay.windows
        configs = grid_configs(space, [int(k) for k in args.k.split(",")] if args.k else None,
                               parse_only(args.only))
        print(f"grid {spec.workload}: {len(configs)} configs x {args.starts} starts, "
              f"{len(search)} requests each, concurrency {spec.replay.concurrency}", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        todo = sum(max(0, args.starts - sum(1 for r in rows if r["config_key"] == canonical(c) and r.get("ok")))
                   for c in configs)
        with Progress(todo, desc=f"grid {spec.workload}", unit="start", quiet=args.quiet) as bar:
            _grid(args, spec, configs, rows, out, caps, rs, warmup, search, more, command, protocol, bar)
    print(report(rows, spec.objective.statistic))
    return 0


def _grid(args, spec, configs, rows, out, caps, rs, warmup, search, more, command, protocol, bar) -> None:
    """Each configuration's missing starts, round by round in a shuffled order; rows appended as they end."""
    done = 0
    for rnd in range(args.starts):
        order = list(configs)
        random.Random(f"{spec.workload}-{rnd}").shuffle(order)
        for cfg in order:
            key = canonical(cfg)
            if sum(1 for r in rows if r["config_key"] == key and r.get("ok")) > rnd:
                continue
            t0 = time.monotonic()
            row = {"workload": spec.workload, "config_key": key, "config": cfg, "round": rnd,
                   "replay_digest": rs.digest, "vllm_version": caps.version,
                   "concurrency": spec.replay.concurrency, "at": time.time(),
                   **({"protocol": protocol} if protocol else {})}
            try:
                m = measure(spec, cfg, search, warmup, Path(args.home) / "logs" / "grid" /
                            f"{spec.workload}-{rnd}-{len(rows)}.log", command,
                            extra_args=caps.per_request_metrics_args(cfg is not None), windows=more)
                row.update(ok=True, tpot_ms=m.tpot_ms, tags=m.tags, tpot_source=m.tpot_source,
                           start_seconds=m.start_seconds,
                           acceptance_length=m.spec_delta.get("acceptance_length"),
                           per_position_rates=m.spec_delta.get("per_position_rates"),
                           spec_delta=m.spec_delta, requests=len(m.tpot_ms),
                           output_throughput=m.summary.get("output_throughput_tok_s"),
                           failed=m.summary.get("failed"),
                           **({"windows": m.summary["windows"]} if "windows" in m.summary else {}))
            except TrialFailed as e:
                row.update(ok=False, error=e.reason)
            rows.append(row)
            with out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            tp = f"{_measure.summarize(row['tpot_ms'], spec.objective.statistic):.2f} ms" \
                if row.get("ok") else row.get("error")
            bar.echo(f"  round {rnd} {label(cfg):40s} {tp}  ({time.monotonic() - t0:.0f}s)")
            done += 1
            bar.set(done, postfix=f"round {rnd}")


if __name__ == "__main__":
    sys.exit(main())
