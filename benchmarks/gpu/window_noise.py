"""Split the start-to-start noise into what a start carries for its whole life and what moves
from one steady window to the next (round 15): one configuration started again and again, each
start measured on several windows (``measure_points.py --windows``).

    python benchmarks/gpu/window_noise.py benchmarks/results/h200-points-2026-12-05-r15.jsonl \\
        --out benchmarks/results/h200-window-noise.json

Per level, on log TPOT (so the figures are relative): a one-way random-effects analysis of
variance with the start as the group. ``within`` is the sd of one window about its start's mean,
``between`` the sd of the starts' own levels (the ANOVA estimate, floored at 0), with the F test
that starts differ by more than their windows. ``per_start_sd[W]`` is the noise of one start
measured on W windows, sqrt(between^2 + within^2 / W), and ``scale[W]`` its ratio to one window's:
the factor ``benchmarks/search.py --noise-scale`` applies to the recorded one-window starts.
Rows of several configurations (benchmarks/grid.py with a spec's ``replay.windows``) are analysed
one configuration at a time. Also: the lag-1 autocorrelation of windows within a start (taken
about the start's own mean, so white noise gives -1/(W-1); noise that drifts slowly, more), the correlation of a window's TPOT with its acceptance length and with the
GPU's SM clock (``windows[].gpu``), the starts' means by arm (pinned or free), and the window
index's own effect (``index_effects``: window i replays the same prompts in every start).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

WINDOWS = (1, 2, 4, 8)


def components(groups: list[list[float]]) -> dict:
    """One-way random-effects ANOVA of ``groups`` (log values, one list per start)."""
    from scipy import stats

    k, n = len(groups), sum(map(len, groups))
    grand = sum(map(sum, groups)) / n
    ssw = sum(sum((x - statistics.mean(g)) ** 2 for x in g) for g in groups)
    ssb = sum(len(g) * (statistics.mean(g) - grand) ** 2 for g in groups)
    msw, msb = ssw / (n - k), ssb / (k - 1)
    n0 = (n - sum(len(g) ** 2 for g in groups) / n) / (k - 1)
    within, between = math.sqrt(msw), math.sqrt(max(0.0, (msb - msw) / n0))
    f = msb / msw
    per = {w: math.sqrt(between ** 2 + within ** 2 / w) for w in WINDOWS}
    return {"starts": k, "windows": n, "within": within, "within_df": n - k, "between": between,
            "between_df": k - 1, "f": f, "p": float(stats.f.sf(f, k - 1, n - k)),
            "per_start_sd": {**{str(w): v for w, v in per.items()}, "inf": between},
            "scale": {**{str(w): v / per[1] for w, v in per.items()}, "inf": between / per[1]}}


def index_effects(groups: list[list[float]]) -> dict | None:
    """Starts of equal window counts, window i of every start on the same prompts: how much each
    window index sits off its start's mean (exp of the mean log deviation), the F test of the
    index against the residual (two-way, no interaction), and the residual sd: the window part
    with the prompts' own effect taken out."""
    from scipy import stats

    n = max((len(g) for g in groups), default=0)
    g = [x for x in groups if len(x) == n]
    if len(g) < 3 or n < 3:
        return None
    dev = [[x - statistics.mean(row) for x in row] for row in g]
    eff = [statistics.mean(d[j] for d in dev) for j in range(n)]
    ss_res = sum((d[j] - eff[j]) ** 2 for d in dev for j in range(n))
    df_res, df_idx = (len(g) - 1) * (n - 1), n - 1
    f = (len(g) * sum(e * e for e in eff) / df_idx) / (ss_res / df_res)
    return {"starts": len(g), "windows": n, "effects": [round(math.exp(e), 4) for e in eff], "f": f,
            "p": float(stats.f.sf(f, df_idx, df_res)), "residual_sd": math.sqrt(ss_res / df_res), "residual_df": df_res}


def lag1(groups: list[list[float]]) -> float | None:
    num = den = 0.0
    for g in groups:
        m = statistics.mean(g)
        num += sum((g[i] - m) * (g[i + 1] - m) for i in range(len(g) - 1))
        den += sum((x - m) ** 2 for x in g[:-1])
    return num / den if den else None


def windows_of(row: dict) -> list[dict]:
    """A row's windows as ``[{"levels": {level: {"tpot": ms, ...}}, ...}]``, whoever measured them:
    the harness (``measure_points.py --windows``: a list, each window timed whole) or the product
    (``replay.windows``: the trial's ``summary.windows``, which benchmarks/grid.py copies to the row's
    ``windows``; per level for a profile, else one figure per window at the row's concurrency)."""
    w = row.get("windows")
    if isinstance(w, list):
        return w
    w = w or (row.get("summary") or {}).get("windows")
    if not w:
        return []
    if w.get("levels"):
        return [{"levels": {lv: {"tpot": v[i]} for lv, v in w["levels"].items()}} for i in range(w["n"])]
    return [{"levels": {str(row.get("concurrency") or 0): {"tpot": v}}} for v in w["objective_ms"]]


def analyse(rows: list[dict]) -> dict:
    rows = [{**r, "windows": windows_of(r)} for r in rows if r.get("ok")]
    rows = [r for r in rows if len(r["windows"]) >= 2]
    levels = sorted({lv for r in rows for w in r["windows"] for lv in w["levels"]}, key=int)
    out: dict = {"rows": len(rows), "configs": sorted({r["config_key"] for r in rows}), "levels": {}}
    for lv in levels:
        groups, flat = [], []
        for r in rows:
            ws = [w for w in r["windows"] if (w["levels"].get(lv) or {}).get("tpot")]
            groups.append([math.log(w["levels"][lv]["tpot"]) for w in ws])
            flat += [(w["levels"][lv]["tpot"], w["levels"][lv].get("acceptance_length"),
                      (w.get("gpu") or {}).get("sm_clock_mhz")) for w in ws]
        d = components(groups)
        d["lag1_autocorrelation"] = lag1(groups)
        d["window_index"] = index_effects(groups)
        for name, i in (("corr_acceptance_length", 1), ("corr_sm_clock", 2)):
            pairs = [(t[0], t[i]) for t in flat if t[i] is not None]
            d[name] = statistics.correlation(*zip(*pairs)) if len(pairs) > 2 else None
        by_arm: dict[str, list[float]] = {}
        for r, g in zip(rows, groups):
            by_arm.setdefault("pinned" if "pinned" in (r.get("label") or "") else "free", []).append(
                math.exp(statistics.mean(g)))
        d["start_means_ms"] = {arm: [round(v, 4) for v in vs] for arm, vs in by_arm.items()}
        d["first_window_over_rest"] = [round(math.exp(g[0] - statistics.mean(g[1:])), 4) for g in groups if len(g) > 1]
        out["levels"][lv] = d
    return out


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}"


def table(res: dict) -> str:
    lines = ["| level | starts (windows) | window sd within a start | sd between starts (F, p) | "
             "one start on 1 / 4 / 8 windows | scale at 4 / 8 / all | lag-1 | corr. AL, SM clock |",
             "|---|---|---|---|---|---|---|---|"]
    for lv, d in res["levels"].items():
        ps, sc = d["per_start_sd"], d["scale"]
        lines.append(f"| c={lv} | {d['starts']} ({d['windows']}) | {d['within']:.1%} ({d['within_df']} df) | "
                     f"{d['between']:.1%} (F {d['f']:.1f}, p {d['p']:.1g}) | {ps['1']:.1%} / {ps['4']:.1%} / {ps['8']:.1%} | "
                     f"{sc['4']:.2f} / {sc['8']:.2f} / {sc['inf']:.2f} | {_signed(d['lag1_autocorrelation'])} | "
                     f"{_signed(d['corr_acceptance_length'])}, {_signed(d['corr_sm_clock'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows = [json.loads(ln) for p in args.rows for ln in Path(p).read_text().splitlines() if ln.strip()]
    keys = sorted({r.get("config_key") for r in rows if r.get("ok")}, key=str)
    # several configurations (a grid.py run): each its own analysis, their levels apart
    results = {k: analyse([r for r in rows if r.get("config_key") == k]) for k in keys}
    for key, res in results.items():
        if len(keys) > 1:
            print(f"\n{key}")
        print(table(res))
        for lv, d in res["levels"].items():
            print(f"c={lv}: start means {d['start_means_ms']}; first window / the rest {d['first_window_over_rest']}")
            wi = d["window_index"]
            if wi:
                print(f"c={lv}: window index over {wi['starts']} starts of {wi['windows']} windows: {wi['effects']} "
                      f"(F {wi['f']:.2f}, p {wi['p']:.2g}); without it the window sd is {wi['residual_sd']:.1%} "
                      f"({wi['residual_df']} df)")
    if args.out:
        out = results[keys[0]] if len(keys) == 1 else {"by_config": results}
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
