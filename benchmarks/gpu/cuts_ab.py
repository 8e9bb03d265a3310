"""A start-up cut against no cut, from mirrored starts on one machine (``night_then_cuts.sh``),
and the nights' GPU minutes and decisions side by side.

Rows labelled ``cuts-ab`` come in pairs, one start of a configuration with the cut (the spec
``--cut-workload``) next to one without it, in mirrored order (D F F D), so a linear drift of the machine cancels within a
configuration. Per configuration and per figure (the objective, each level's TPOT), the cut's
effect is the mean over pairs of log(TPOT with the cut / TPOT without) with its 95% t-interval,
set against the machine's own start-to-start noise (the sd of the no-cut starts of that
configuration, which are its repeats): a cut ships only where the interval lies within plus or
minus that noise, and the issue's rule reads the point estimate against it. The start's effect is
the same pairs' difference of time to healthy, by phase.

Nights (``--trials``: exported study trials; one file or several): per study, its server starts,
GPU minutes from the first start to the last (each trial's timeline total, failed starts
included), minutes starting servers and measuring, and its decision from the recommendation files
given with ``--rec``.

    python benchmarks/gpu/cuts_ab.py points.jsonl --trials trials.jsonl [--rec a.json b.json] --json out.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
from pathlib import Path

from scipy.stats import t as student_t

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.engines import _startup  # noqa: E402
from autotune.search._space import canonical, label  # noqa: E402

LABEL = "cuts-ab"


def rows_of(path: str) -> list[dict]:
    op = gzip.open if str(path).endswith(".gz") else open
    with op(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


CUT_WORKLOAD = "code-smollm2-night-fast"
"""The spec whose starts make the cut (its ``engine.env``); every other spec's starts are without it."""


def arm(row: dict) -> str:
    return "cut" if row.get("spec_workload") == CUT_WORKLOAD else "default"


def figures(row: dict) -> dict[str, float]:
    out = {"objective": row["tpot"]}
    for lv, d in sorted((row.get("levels") or {}).items(), key=lambda x: int(x[0])):
        if d.get("tpot"):
            out[f"level {lv}"] = d["tpot"]
    return out


def pairs(rows: list[dict]) -> list[tuple[dict, dict]]:
    """(default, cut) rows of one configuration next to each other in the run's order."""
    out, pending = [], {}
    for r in rows:
        key = r["config_key"]
        other = pending.pop(key, None)
        if other is not None and arm(other) != arm(r):
            out.append((other, r) if arm(other) == "default" else (r, other))
        else:
            pending[key] = r
    return out


def interval(xs: list[float]) -> dict:
    n = len(xs)
    mean = statistics.mean(xs)
    if n < 2:
        return {"n": n, "mean": mean, "lo": None, "hi": None}
    half = student_t.ppf(0.975, n - 1) * statistics.stdev(xs) / math.sqrt(n)
    return {"n": n, "mean": mean, "lo": mean - half, "hi": mean + half}


def tpot_effect(*machines: list[dict]) -> dict:
    """Per configuration and figure, the cut's effect over the pairs (mean log ratio, 95%
    t-interval) against the start-to-start noise. Each argument is one machine's rows (one points
    file): pairs are formed within a machine, and the noise is the default starts' sd about each
    machine's own mean, pooled."""
    out: dict = {}
    ps = [p for m in machines for p in pairs(m)]
    for key in sorted({d["config_key"] for d, _ in ps}):
        mine = [(d, c) for d, c in ps if d["config_key"] == key]
        by: dict = {}
        for name in figures(mine[0][0]):
            logs = [math.log(figures(c)[name] / figures(d)[name]) for d, c in mine]
            ss = df = 0.0
            for m in machines:
                ref = [math.log(figures(r)[name]) for r in m if r["config_key"] == key and arm(r) == "default"]
                if len(ref) >= 2:
                    ss += statistics.variance(ref) * (len(ref) - 1)
                    df += len(ref) - 1
            noise = math.sqrt(ss / df) if df else None
            iv = interval(logs)
            by[name] = {**{k: (round(math.expm1(v), 4) if isinstance(v, float) and k != "n" else v)
                           for k, v in iv.items()},
                        "start_noise": round(math.expm1(noise), 4) if noise is not None else None,
                        "within_noise": (noise is not None and abs(iv["mean"]) <= noise),
                        "interval_within_noise": (noise is not None and iv["lo"] is not None
                                                  and -noise <= iv["lo"] and iv["hi"] <= noise)}
        out[key] = by
    return out


def start_effect(*machines: list[dict]) -> dict:
    """The pairs' time to healthy and its phases, with and without the cut (pairs within each machine)."""
    out: dict = {}
    ps = [p for m in machines for p in pairs(m)]
    for d, c in ps:
        for name, row in (("default", d), ("cut", c)):
            tl = row.get("timeline") or {}
            slot = out.setdefault(name, {"starts": 0, "to_healthy": [], "phases": {}})
            slot["starts"] += 1
            slot["to_healthy"].append(tl.get("to_healthy"))
            for k, v in ((tl.get("engine") or {}).get("phases") or {}).items():
                slot["phases"].setdefault(k, []).append(v)
    for slot in out.values():
        slot["to_healthy"] = round(statistics.mean(x for x in slot["to_healthy"] if x is not None), 2)
        slot["phases"] = {k: round(statistics.mean(v), 2) for k, v in slot["phases"].items()}
    if {"default", "cut"} <= set(out):
        saved = [(d.get("timeline") or {}).get("to_healthy", 0) - (c.get("timeline") or {}).get("to_healthy", 0)
                 for d, c in ps]
        out["saved_s"] = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in interval(saved).items()}
    return out


def nights(trials: list[dict], recs: dict[str, dict], by: str = "workload") -> dict:
    """Per night (the trials' ``by`` field: their workload, or their study), its starts, GPU
    minutes by phase and the decision of its recommendation in ``recs`` (keyed the same way)."""
    out: dict = {}
    for t in trials:
        out.setdefault(t[by], []).append(t)
    res = {}
    for w, ts in out.items():
        tls = [t.get("timeline") or (t.get("user_attrs") or {}).get("timeline") for t in ts]
        tls = [tl for tl in tls if tl]
        spent = _startup.night(tls)
        rec = recs.get(w) or {}
        pick = rec.get("speculative_config")
        res[w] = {"starts": len(tls), "gpu_minutes": round(sum(spent.values()) / 60, 2),
                  "starting_minutes": round(sum(v for k, v in spent.items() if k not in _startup.OWN) / 60, 2),
                  "measuring_minutes": round(spent.get("measure", 0) / 60, 2), "by_phase_s": spent,
                  "text": _startup.night_text(spent),
                  "decision": rec.get("decision"), "pick": pick,
                  "speedup": (rec.get("evidence") or {}).get("speedup"),
                  "speedup_ci": (rec.get("evidence") or {}).get("speedup_ci"),
                  "winner": canonical(pick) if rec else None}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("points", nargs="+", help="points files, one a machine (pairs are formed within each)")
    ap.add_argument("--trials", nargs="*", default=[])
    ap.add_argument("--rec", nargs="*", default=[], help="recommendation files of the nights")
    ap.add_argument("--cut-workload", default=CUT_WORKLOAD, help="the spec whose starts make the cut")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    globals()["CUT_WORKLOAD"] = args.cut_workload
    machines = [[r for r in rows_of(p) if r.get("label") == LABEL and r.get("ok")] for p in args.points]
    rows = [r for m in machines for r in m]
    trials = [t for p in args.trials if Path(p).exists() for t in rows_of(p)]
    recs = {}
    for p in args.rec:
        rec = json.loads(Path(p).read_text())
        recs[rec.get("workload") or Path(p).stem] = rec
    out = {"pairs": sum(len(pairs(m)) for m in machines), "machines": len(machines),
           "tpot": tpot_effect(*machines) if rows else {}, "start": start_effect(*machines),
           "nights": nights(trials, recs)}
    names = {r["config_key"]: label(r.get("config")) for r in rows}
    for key, by in out["tpot"].items():
        for name, d in by.items():
            span = f"{d['lo']:+.1%} to {d['hi']:+.1%}" if d["lo"] is not None else "-"
            noise = f"{d['start_noise']:.1%}" if d["start_noise"] is not None else "-"
            print(f"{names[key]:<12} {name:<10} cut/none {d['mean']:+.1%} ({span}, {d['n']} pairs), start-to-start {noise}")
    st = out["start"]
    if "saved_s" in st:
        print(f"to healthy: {st['default']['to_healthy']:.1f} s without the cut, {st['cut']['to_healthy']:.1f} s with it; "
              f"saved {st['saved_s']['mean']:.1f} s a start")
        for k in st["default"]["phases"]:
            print(f"  {k:<13} {st['default']['phases'][k]:6.1f} {st['cut']['phases'].get(k, 0):6.1f}")
    for w, n in out["nights"].items():
        print(f"{w}: {n['starts']} starts, {n['text']}; decision {n['decision']} {n['winner'] or ''} "
              f"{n['speedup'] or ''}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
