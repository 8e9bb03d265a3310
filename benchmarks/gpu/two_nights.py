"""Nights of one spec on one machine side by side (``two_nights.sh``, ``two_nights_local.sh``): night 1
as any night runs, then nightly runs after it, the last of which may carry the search before it
(objective.carry_search).

Per night: server starts (search and confirmation), GPU minutes from the first server start to the
recommendation (each trial's timeline total, as ``study show`` sums them), the decision, its pick
and speedup, and what its carry judged; for each later night whether it reached night 1's answer
(the same configuration deployed after it: night 1's `change` to X and a later `keep` of X agree)
with a pick whose TPOT is within 3% of night 1's pick's; and the last night's minutes and starts
against the night before it.

    python benchmarks/gpu/two_nights.py trials.jsonl night-1.json night-2.json [night-3.json] --json two-nights.json
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
    first = out["nights"][0]
    k0 = canonical(first["pick"]) if first["pick"] else NONE
    t0 = pick_tpot(trials, k0)
    for n in out["nights"][1:]:
        k = canonical(n["pick"]) if n["pick"] else NONE
        t = pick_tpot(trials, k)
        # night 1's change to X and a later night's keep of X (now deployed) are one answer
        n["same_decision"] = k == k0 and (n["decision"] == first["decision"]
                                          or (first["decision"], n["decision"]) == ("change", "keep"))
        n["pick_excess"] = None if not (t0 and t) else t / t0 - 1
        n["pick_within_3pct"] = k == k0 or (n["pick_excess"] is not None and n["pick_excess"] <= 0.03)
    a, b = out["nights"][-2], out["nights"][-1]
    out["gpu_minutes_ratio"] = b["gpu_minutes"] / a["gpu_minutes"] if a.get("gpu_minutes") else None
    out["starts_ratio"] = b["starts"] / a["starts"] if a.get("starts") else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trials")
    ap.add_argument("nights", nargs="+", help="the nights' recommendation files, in order")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    recs = [json.loads(Path(p).read_text()) for p in args.nights]
    out = compare(rows_of(args.trials), recs)
    for i, n in enumerate(out["nights"], 1):
        print(f"night {i} ({n['study']}): {n['starts']} starts ({n['search_starts']} search, {n['confirm_starts']} "
              f"confirmation), {n['text']}; decision {n['decision']} {n['winner'] or ''} {n['speedup'] or ''}")
        print(f"  stopped: {n['stopped_because']}")
        if "same_decision" in n:
            ex = n["pick_excess"]
            print(f"  night 1's answer: {n['same_decision']}; pick within 3% of night 1's: {n['pick_within_3pct']}"
                  + (f" ({ex:+.1%})" if ex is not None else ""))
    if out["gpu_minutes_ratio"]:
        print(f"the last night against the one before: {out['gpu_minutes_ratio']:.2f}x the minutes, "
              f"{out['starts_ratio']:.2f}x the server starts")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
