"""Two nights of one spec on one machine side by side (``two_nights.sh``): night 1 as any night
runs, night 2 the nightly run after it that may carry night 1's search (objective.carry_search).
Per night: server starts (search and confirmation), GPU minutes from the first server start to the
recommendation (each trial's timeline total, as ``study show`` sums them), the decision, its pick
and speedup, and what night 2's carry judged; then whether night 2 reached night 1's decision and
a pick whose TPOT is within 3% of night 1's pick's.

    python benchmarks/gpu/two_nights.py trials.jsonl night-1.json night-2.json --json two-nights.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cuts_ab import nights, rows_of  # noqa: E402

from autotune.search._space import NONE, canonical  # noqa: E402


def pick_tpot(trials: list[dict], key: str) -> float | None:
    """The mean objective of ``key``'s starts over both nights (the pick's TPOT on this machine)."""
    vals = [t["value"] for t in trials if t.get("config_key") == key and t.get("state") == "COMPLETE"
            and t.get("value")]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


def compare(trials: list[dict], recs: list[dict]) -> dict:
    by_study = {r["study"]["name"]: r for r in recs}
    got = nights([t for t in trials if t["study"] in by_study], by_study, by="study")
    out = {"nights": []}
    for r in recs:
        n = got.get(r["study"]["name"], {})
        roles = [t.get("role") for t in trials if t["study"] == r["study"]["name"] and t.get("timeline")]
        n.update(study=r["study"]["name"], stopped_because=r["study"].get("stopped_because"),
                 search_starts=sum(x in ("baseline", "search") for x in roles),
                 confirm_starts=sum(x == "confirm" for x in roles), carry=r["study"].get("carry"))
        out["nights"].append(n)
    a, b = out["nights"][0], out["nights"][1]
    ka, kb = (canonical(x["pick"]) if x["pick"] else NONE for x in (a, b))
    ta, tb = pick_tpot(trials, ka), pick_tpot(trials, kb)
    out["same_decision"] = a["decision"] == b["decision"]
    out["pick_excess"] = None if not (ta and tb) else tb / ta - 1
    out["pick_within_3pct"] = ka == kb or (out["pick_excess"] is not None and out["pick_excess"] <= 0.03)
    out["gpu_minutes_ratio"] = b["gpu_minutes"] / a["gpu_minutes"] if a.get("gpu_minutes") else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trials")
    ap.add_argument("night1")
    ap.add_argument("night2")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    recs = [json.loads(Path(p).read_text()) for p in (args.night1, args.night2)]
    out = compare(rows_of(args.trials), recs)
    for i, n in enumerate(out["nights"], 1):
        print(f"night {i} ({n['study']}): {n['starts']} starts ({n['search_starts']} search, {n['confirm_starts']} "
              f"confirmation), {n['text']}; decision {n['decision']} {n['winner'] or ''} {n['speedup'] or ''}")
        print(f"  stopped: {n['stopped_because']}")
    ex = out["pick_excess"]
    print(f"same decision: {out['same_decision']}; night 2's pick within 3% of night 1's: {out['pick_within_3pct']}"
          + (f" ({ex:+.1%})" if ex is not None else "")
          + (f"; GPU minutes night 2 / night 1: {out['gpu_minutes_ratio']:.2f}" if out["gpu_minutes_ratio"] else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
