"""The order of the starts that follow a study on the same machine: A = no speculation, B = the
study's winner, C = its runner-up (the best other speculative configuration by the study's own
search starts), in the order A B C C B A A B C C B A, less the starts already measured under
LABEL. Every one of them had its first start in the study, so these are repeats whose time trend
the mirrored blocks balance, and the study's own starts of A, B and C are their first starts
(decompose.py --trials joins both).

    python benchmarks/gpu/order_after_study.py --rec REC.json --trials trials.jsonl \\
        [--points points.jsonl --label after-study]   # prints the JSON list for round.sh points:

Prints nothing when the order is complete or the study has no winner yet.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

BLOCK = "ABCCBA"


def _rows(path: str | None) -> list[dict]:
    p = Path(path) if path else None
    if not p or not p.is_file():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def sides(rec: dict, trials: list[dict]) -> list[dict | None]:
    """[none, winner, runner-up] as speculative configs (the winner's band schedule kept)."""
    from autotune.search._space import canonical

    trials = [t for t in trials if t.get("workload") in (None, rec.get("workload"))]

    win = ((rec.get("evidence") or {}).get("winner") or {}).get("config")
    by: dict[str, list[float]] = {}
    cfg: dict[str, dict] = {}
    for t in trials:
        if t.get("state") != "COMPLETE" or t.get("value") is None or not t.get("config"):
            continue
        k = canonical(t["config"])
        by.setdefault(k, []).append(float(t["value"]))
        cfg[k] = t["config"]
    if win is None:  # a study that kept no speculation: its best speculative start is B
        if not by:
            return []
        best = min(by, key=lambda k: statistics.mean(by[k]))
        win = cfg[best]
    rest = [k for k in by if k != canonical(win)]
    if not rest:
        return [None, win]
    runner = min(rest, key=lambda k: statistics.mean(by[k]))
    return [None, win, cfg[runner]]


def remaining(order: list[dict | None], done: list[dict], label: str) -> list[dict | None]:
    n = sum(1 for r in done if r.get("label") == label)
    return order[n:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rec", required=True)
    ap.add_argument("--trials", required=True)
    ap.add_argument("--points")
    ap.add_argument("--label", default="after-study")
    ap.add_argument("--blocks", type=int, default=2)
    a = ap.parse_args(argv)
    if not Path(a.rec).is_file():
        return 0
    s = sides(json.loads(Path(a.rec).read_text()), _rows(a.trials))
    if not s:
        return 0
    letters = {"A": 0, "B": 1, "C": 2}
    order = [s[letters[x]] for _ in range(a.blocks) for x in BLOCK if letters[x] < len(s)]
    left = remaining(order, _rows(a.points), a.label)
    if left:
        print(json.dumps(left))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
