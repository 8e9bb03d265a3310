"""The start-to-start noise of recorded grids, pooled: the figure for a spec's
``objective.start_noise``.

Each configuration started several times adds the squared deviations of its starts' log
statistic from their own mean, on ``starts - 1`` degrees of freedom (``_measure.pooled_start_noise``,
what a study pools from its own starts). A prior copied from another model or another day can
understate what one start tells: the tiny models' 5% was half of SmolLM2's 11% on 2026-12-02, and
a study on that prior called a tie a 1.21x win (docs/notes/2026-12-01-smollm2-vllm-cpu.md, "chat-smollm2").

    .venv/bin/python benchmarks/start_noise.py benchmarks/results/grid-chat-smollm2.jsonl ...
    .venv/bin/python benchmarks/start_noise.py --by-class benchmarks/results/h200-points-2026-12-03-r10.jsonl ...

``--by-class`` gives no speculation and the speculative configurations a figure each: on the H200
the baseline repeats within 0.5% where an n-gram config moves 8% (docs/notes/2026-12-03-h200-round-10.md),
and a decision that pooled them would judge a speculative winner on the baseline's quiet.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.core import _measure  # noqa: E402
from autotune.core._spec import NOISE_CLASSES  # noqa: E402
from autotune.decide._noise import noise_class  # noqa: E402
from autotune.search._levels import measurement_objective  # noqa: E402
from autotune.search._space import NONE  # noqa: E402


def start_value(row: dict, statistic: str = "median") -> float | None:
    """A successful start's objective as the decision computes it: the traffic-weighted per-level
    statistic of a profile start (the H200 rows), the statistic of its per-request TPOT otherwise
    (``_levels.measurement_objective``); None for a failed start or an experiment (labelled row)."""
    ok = row.get("ok") or row.get("state") == "COMPLETE"
    levels = row.get("levels") or {}
    if not ok or row.get("label") or not (row.get("tpot_ms") or any(d.get("tpot_ms") for d in levels.values())):
        return None
    return measurement_objective(levels, row.get("tpot_ms") or [], statistic)


def samples(rows: list[dict], statistic: str = "median", prefix: str = "",
            cls: str | None = None) -> dict[str, list[float]]:
    """Config (of one workload: a synthetic acceptance is part of the config) -> the log objective of
    each of its successful starts; with ``cls``, only the configs of that class of ``NOISE_CLASSES``."""
    out: dict[str, list[float]] = {}
    for r in rows:
        v = start_value(r, statistic)
        if v is not None and cls in (None, noise_class(r["config_key"])):
            key = r["config_key"] if r.get("workload") in (None, "*") or r["config_key"] == NONE else f"{r['workload']}:{r['config_key']}"
            out.setdefault(prefix + key, []).append(math.log(v))
    return out


def _spec_figure(n: _measure.StartNoise) -> str:
    # the spec's prior counts as df observations of log(1 + cv)^2 (docs/decisions.md): this cv gives back sd
    return f"cv: {math.expm1(n.sd):.3f}, df: {n.df}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grids", nargs="+", help="JSONL files of server starts (benchmarks/grid.py's rows, the H200 "
                                             "rounds' points and trials); each file is one machine")
    ap.add_argument("--statistic", default="median", choices=_measure.STATISTICS)
    ap.add_argument("--by-class", action="store_true",
                    help="no speculation and the speculative configs apart (objective.start_noise.speculative)")
    args = ap.parse_args(argv)
    pooled: dict[str, list[float]] = {}
    by_class: dict[str, dict[str, list[float]]] = {c: {} for c in NOISE_CLASSES}
    for path in args.grids:
        rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
        s = samples(rows, args.statistic, prefix=f"{path}:")
        for c in by_class:
            by_class[c].update(samples(rows, args.statistic, prefix=f"{path}:", cls=c))
        if not s:
            print(f"{path}: no successful rows", file=sys.stderr)
            return 2
        n = _measure.pooled_start_noise(s)
        print(f"{path}: sd of log per-start {args.statistic} {n.sd:.3f} on {n.df} df" if n.df else
              f"{path}: no configuration started twice")
        pooled.update(s)
    n = _measure.pooled_start_noise(pooled)
    if not n.df:
        print("no configuration was started twice: no start-to-start noise to pool", file=sys.stderr)
        return 1
    print(f"pooled: sd {n.sd:.3f} on {n.df} df -> objective.start_noise: {{{_spec_figure(n)}}}")
    if args.by_class:
        cls = {c: _measure.pooled_start_noise(s) for c, s in by_class.items()}
        for c, x in cls.items():
            print(f"{c}: " + (f"sd {x.sd:.3f} on {x.df} df" if x.df else "no configuration started twice"))
        if not all(x.df for x in cls.values()):
            print("a class has no repeated start: no figure per class", file=sys.stderr)
            return 1
        print(f"by class -> objective.start_noise: {{{_spec_figure(cls['none'])}, "
              f"speculative: {{{_spec_figure(cls['speculative'])}}}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
