"""The GPU night's split and the decision: its confirmation reserve of four rounds (8 starts) against
the split ``_budget.confirm_reserve`` gives it now, on ``benchmarks/decisions.py``'s own simulated
nights (``decisions.run_cell``: the search, the confirmation as ``Study.confirm`` runs it, ``decide``).

The reserve yields a fourth round to the search's start after the largest K only where three rounds
still see a true 20% gain in 80% of nights at the spec's expected start noise; each night's spec here
carries a prior at the true noise ("right") or half of it ("too small"), as decisions.py draws them.

    python benchmarks/split_power.py               # 2000 nights a cell, a few minutes
    python benchmarks/split_power.py --nights 200
"""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SPEC = ROOT / "benchmarks" / "gpu" / "code-smollm2-night.yaml"


def main(argv=None) -> int:
    import decisions
    from autotune.core._spec import load_spec
    from autotune.search import _budget, _study

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nights", type=int, default=2000)
    args = ap.parse_args(argv)
    base = load_spec(SPEC).model_copy(update={"incumbent": None})
    print("| reserve | start noise | prior | true 20% gain: change | no gain: change | rounds (gain) |")
    print("|---|---|---|---|---|---|")
    own = _study.confirm_reserve
    try:
        for name, reserve in (("four rounds (8)", lambda spec: 8), ("confirm_reserve", _budget.confirm_reserve)):
            _study.confirm_reserve = reserve  # what Study.confirm_reserve, which the simulated night binds, calls
            for truth in ("cv 3%", "cv 6%", "cv 9%"):
                for prior in ("right", "too small"):
                    r = {sc: decisions.run_cell(("night", base, truth, prior, sc, args.nights,
                                                 35000 + zlib.crc32(f"{truth}{prior}{sc}".encode()) % 1000))
                         for sc in ("gain-20-none", "no-gain-none")}
                    g, n = r["gain-20-none"], r["no-gain-none"]
                    print(f"| {name} | {truth} | {prior} | {g['change_rate']:.1%} | {n['change_rate']:.1%} | "
                          f"{g['mean_rounds']:.2f} |", flush=True)
    finally:
        _study.confirm_reserve = own
    return 0


if __name__ == "__main__":
    sys.exit(main())
