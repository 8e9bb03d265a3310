"""The start-to-start noise of recorded grids, pooled: the figure for a spec's
``objective.start_noise``.

Each configuration started several times adds the squared deviations of its starts' log
statistic from their own mean, on ``starts - 1`` degrees of freedom (``_measure.pooled_start_noise``,
what a study pools from its own starts). A prior copied from another model or another day can
understate what one start tells: the tiny models' 5% was half of SmolLM2's 11% on 2026-12-02, and
a study on that prior called a tie a 1.21x win (docs/benchmarks.md, "chat-smollm2").

    .venv/bin/python benchmarks/start_noise.py benchmarks/results/grid-chat-smollm2.jsonl ...
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


def samples(rows: list[dict], statistic: str = "median", prefix: str = "") -> dict[str, list[float]]:
    """Config -> the log statistic of each successful start's per-request TPOT."""
    out: dict[str, list[float]] = {}
    for r in rows:
        if r.get("ok") and r.get("tpot_ms"):
            out.setdefault(prefix + r["config_key"], []).append(math.log(_measure.summarize(r["tpot_ms"], statistic)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grids", nargs="+", help="grid JSONL files (benchmarks/grid.py's rows)")
    ap.add_argument("--statistic", default="median", choices=_measure.STATISTICS)
    args = ap.parse_args(argv)
    pooled: dict[str, list[float]] = {}
    for path in args.grids:
        rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
        s = samples(rows, args.statistic, prefix=f"{path}:")
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
    # the spec's prior counts as df observations of log(1 + cv)^2 (docs/decisions.md): this cv gives back sd
    print(f"pooled: sd {n.sd:.3f} on {n.df} df -> objective.start_noise: {{cv: {math.expm1(n.sd):.3f}, df: {n.df}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
