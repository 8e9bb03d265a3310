"""Where the start-to-start differences of one machine come from: a configuration's own effect, its
first start on the machine, the machine's time trend, what is left from start to start, and the
steady windows within a start.

    python benchmarks/gpu/decompose.py benchmarks/results/h100-smollm2-order-2026-12-06.jsonl \\
        [--json benchmarks/results/h100-smollm2-order-decomposition.json] [--trend clock|index] [--label L] \\
        [--trials STUDY_TRIALS.jsonl ...]

Rows: one server start each (``measure_points.py`` / round.sh ``points:`` and ``grid:`` steps), in
the order of their ``at`` (when the start began), with the spec's steady windows in
``summary.windows`` (``replay.windows``). Every configuration with at least two starts enters.

Per level and for the traffic-weighted objective, on the log of the start's figure (so every effect
is a ratio), an ordinary least-squares fit:

    log y = config + first start (of its configuration on the machine) + trend x time + residual

- ``config``: each configuration against no speculation (or the first configuration), at the same
  time and not on a first start;
- ``first start``: a configuration's first start on the machine against its later ones (vLLM's
  compile cache, autotuning, allocator: whatever a repeat skips); split into no speculation's and
  the speculative configurations' first starts where both have repeats and the residual keeps two
  degrees of freedom;
- ``trend``: the machine's linear drift, per 10 minutes of wall clock (``--trend clock``, the
  default: the rows' ``at``) or per start (``--trend index``);
- ``residual``: the start-to-start sd left (the noise a search sees between two starts of one
  configuration), with its chi-square interval.

95% intervals from the fit's covariance and Student t on the residual degrees of freedom (numpy
least squares, scipy.stats). A first start made in the machine's first minutes is confounded with
any drift that is not linear there; the ``by_first`` figures (each configuration's first start over
the mean of its repeats) and the first start's window gradient (below) are the checks.

Windows: the one-way within-start sd of the log window figures (``within``), and the same with each
window index's own effect taken out per class (every start replays the same prompts in window i,
so the index is the prompts' effect plus the position's), with chi-square intervals; and the
first-start window gradient: the last window over the first in first starts against repeats
(a warm-up that fades within the first start shows here, a start-long offset does not).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

LEVEL_OBJECTIVE = "objective"


def config_name(row: dict) -> str:
    try:
        from autotune.search._space import label
        return label(row.get("config"))
    except Exception:  # noqa: BLE001 - a name is only a name
        return row.get("config_key") or "none"


def from_trial(t: dict) -> dict | None:
    """A study trial (``export_study.py``'s row) as a start row: a study's search and confirmation
    starts are starts of the machine like any other (each configuration's first start on a
    machine is usually a search start), so they join the points rows."""
    from datetime import datetime

    if t.get("state") != "COMPLETE" or t.get("value") is None or not t.get("levels"):
        return None
    at = datetime.fromisoformat(str(t["datetime_start"])).timestamp()
    return {"ok": True, "tpot": float(t["value"]), "at": at, "config_key": t.get("config_key") or "none",
            "config": t.get("config"), "levels": t["levels"], "summary": t.get("summary"),
            "label": f"study:{(t.get('user_attrs') or {}).get('role')}", "study": t.get("study")}


def weighted(r: dict) -> float | None:
    """The study's objective of a start (its levels' TPOT weighted by the spec's level weights,
    ``measurement_objective``): what the search ranks on. A points row's own ``tpot`` is the
    median of every request's TPOT pooled over the levels, another figure; both kinds of row are
    read as this one where the levels carry their weights."""
    lv = [d for d in (r.get("levels") or {}).values() if isinstance(d, dict)]
    if not lv or any(d.get("weight") is None or not d.get("tpot") for d in lv):
        return None
    return sum(d["weight"] * d["tpot"] for d in lv) / sum(d["weight"] for d in lv)


def load(paths: list[str], label: str | None = None, trials: list[str] = ()) -> list[dict]:
    rows = [json.loads(x) for p in paths for x in Path(p).read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r.get("ok") and r.get("tpot")]
    if label is not None:
        rows = [r for r in rows if (r.get("label") or "").startswith(label)]
    rows += [r for p in trials for x in Path(p).read_text().splitlines() if x.strip()
             for r in [from_trial(json.loads(x))] if r]
    if trials:  # one objective for both kinds of row
        for r in rows:
            r["tpot"] = weighted(r) or r["tpot"]
    rows.sort(key=lambda r: r["at"])
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["config_key"]] = counts.get(r["config_key"], 0) + 1
    kept = [r for r in rows if counts[r["config_key"]] >= 2]
    seen: set[str] = set()
    for i, r in enumerate(kept):
        r["_index"] = i + 1
        r["_minutes"] = (r["at"] - kept[0]["at"]) / 60
        r["_first"] = r["config_key"] not in seen
        seen.add(r["config_key"])
    return kept


def start_value(r: dict, level: str) -> float:
    if level == LEVEL_OBJECTIVE:
        return float(r["tpot"])
    return float(r["levels"][level]["tpot"])


def window_values(r: dict, level: str) -> list[float]:
    w = (r.get("summary") or {}).get("windows") or {}
    if level == LEVEL_OBJECTIVE:
        return list(w.get("objective_ms") or [])
    return list((w.get("levels") or {}).get(level) or [])


def _ci_sd(s2: float, df: int) -> tuple[float, float]:
    if df <= 0 or not math.isfinite(s2):
        return (math.nan, math.nan)
    return (math.sqrt(df * s2 / stats.chi2.ppf(0.975, df)), math.sqrt(df * s2 / stats.chi2.ppf(0.025, df)))


def fit(rows: list[dict], level: str, trend: str = "clock", split_first: bool | None = None) -> dict:
    """OLS of log(start figure) on config dummies, first-start indicator(s) and a linear trend."""
    keys = list(dict.fromkeys(r["config_key"] for r in rows))
    base = "none" if "none" in keys else keys[0]
    others = [k for k in keys if k != base]
    y = np.log([start_value(r, level) for r in rows])
    x_trend = np.array([r["_minutes"] / 10 if trend == "clock" else r["_index"] for r in rows], float)
    x_trend -= x_trend.mean()
    has_none_first = "none" in keys
    n_spec = sum(1 for k in keys if k != "none")
    can_split = has_none_first and n_spec >= 1
    cols, names = [np.ones(len(rows))], ["intercept"]
    for k in others:
        cols.append(np.array([r["config_key"] == k for r in rows], float))
        names.append(f"config:{k}")
    first = np.array([r["_first"] for r in rows], float)
    is_none = np.array([r["config_key"] == "none" for r in rows], float)
    p_if_split = len(cols) + 3
    if split_first is None:
        split_first = can_split and len(rows) - p_if_split >= 2
    if split_first:
        cols += [first * is_none, first * (1 - is_none)]
        names += ["first_start:none", "first_start:speculative"]
    else:
        cols.append(first)
        names.append("first_start")
    cols.append(x_trend)
    names.append("trend_per_10min" if trend == "clock" else "trend_per_start")
    X = np.column_stack(cols)
    n, p = X.shape
    rank = np.linalg.matrix_rank(X)
    df = n - p
    if rank < p or df < 1:
        return {"level": level, "n": n, "p": p, "df": df, "error": "not identifiable with these rows"}
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    s2 = float(resid @ resid) / df
    cov = s2 * np.linalg.inv(X.T @ X)
    t = stats.t.ppf(0.975, df)
    terms = {}
    for i, name in enumerate(names):
        if name == "intercept":
            continue
        se = math.sqrt(cov[i, i])
        b = float(beta[i])
        terms[name] = {"ratio": math.exp(b), "lo": math.exp(b - t * se), "hi": math.exp(b + t * se),
                       "log": b, "se": se, "p": float(2 * stats.t.sf(abs(b / se), df)) if se > 0 else None,
                       "vif": vif(X, i)}
    lo, hi = _ci_sd(s2, df)
    return {"level": level, "n": n, "p": p, "df": df, "base": base, "trend": trend, "terms": terms,
            "residual_sd": math.sqrt(s2), "residual_sd_ci": [lo, hi],
            "residuals": {f"{r['_index']}:{config_name(r)}": round(float(e), 4) for r, e in zip(rows, resid)}}


def vif(X: np.ndarray, j: int) -> float:
    """Variance inflation of column ``j``: 1 / (1 - R^2) of it on the other columns. Above about 10
    the design cannot tell that term from the others (a grid measured pass after pass puts every
    first start before every repeat, so the first start and the trend are one column)."""
    others = np.delete(X, j, axis=1)
    coef, *_ = np.linalg.lstsq(others, X[:, j], rcond=None)
    res = X[:, j] - others @ coef
    tot = X[:, j] - X[:, j].mean()
    r2 = 1 - float(res @ res) / float(tot @ tot) if float(tot @ tot) > 0 else 1.0
    return math.inf if r2 >= 1 else 1 / (1 - r2)


def by_first(rows: list[dict], level: str) -> dict:
    """Each configuration's first start over the geometric mean of its later ones (no model)."""
    out = {}
    for k in dict.fromkeys(r["config_key"] for r in rows):
        rs = [r for r in rows if r["config_key"] == k]
        later = [math.log(start_value(r, level)) for r in rs[1:]]
        out[config_name(rs[0])] = {"first": start_value(rs[0], level), "first_index": rs[0]["_index"],
                                   "later_gmean": math.exp(statistics.mean(later)),
                                   "first_over_later": math.exp(math.log(start_value(rs[0], level)) - statistics.mean(later))}
    return out


def windows(rows: list[dict], level: str) -> dict | None:
    """Within-start window sd (log), raw and with the window index's effect taken out per class."""
    groups = [(r, [math.log(v) for v in window_values(r, level) if v]) for r in rows]
    groups = [(r, g) for r, g in groups if len(g) >= 2]
    if not groups:
        return None
    ssw = sum(sum((v - statistics.mean(g)) ** 2 for v in g) for _, g in groups)
    dfw = sum(len(g) - 1 for _, g in groups)
    out = {"starts": len(groups), "windows": sum(len(g) for _, g in groups)}
    s2 = ssw / dfw
    out["within"] = {"sd": math.sqrt(s2), "ci": list(_ci_sd(s2, dfw)), "df": dfw}
    # window index effects per class (none / speculative), estimated from starts of equal window counts
    ss_res, df_res, index_effects, gradient = 0.0, 0, {}, {}
    for cls in ("none", "speculative"):
        gs = [(r, g) for r, g in groups if (r["config_key"] == "none") == (cls == "none")]
        if not gs:
            continue
        m = max(len(g) for _, g in gs)
        gs = [(r, g) for r, g in gs if len(g) == m]
        dev = [[v - statistics.mean(g) for v in g] for _, g in gs]
        eff = [statistics.mean(d[j] for d in dev) for j in range(m)]
        ss_res += sum((d[j] - eff[j]) ** 2 for d in dev for j in range(m))
        df_res += (len(gs) - 1) * (m - 1)
        index_effects[cls] = [round(math.exp(e), 4) for e in eff]
        # last window over the first: first starts against repeats
        grad = {"first": [], "repeat": []}
        for r, g in gs:
            grad["first" if r["_first"] else "repeat"].append(g[-1] - g[0])
        gradient[cls] = {k: (round(math.exp(statistics.mean(v)), 4) if v else None) for k, v in grad.items()}
        gradient[cls]["n"] = {k: len(v) for k, v in grad.items()}
    if df_res > 0:
        s2r = ss_res / df_res
        out["within_index_removed"] = {"sd": math.sqrt(s2r), "ci": list(_ci_sd(s2r, df_res)), "df": df_res}
    out["index_effects"] = index_effects
    out["last_over_first_window"] = gradient
    return out


def analyse(rows: list[dict], trend: str = "clock") -> dict:
    levels = [LEVEL_OBJECTIVE] + sorted({lv for r in rows for lv in (r.get("levels") or {})}, key=int)
    res = {"rows": len(rows), "order": [f"{r['_index']}:{config_name(r)}{'*' if r['_first'] else ''}" for r in rows],
           "minutes": [round(r["_minutes"], 2) for r in rows], "levels": {}}
    for lv in levels:
        d = {"model": fit(rows, lv, trend), "by_first": by_first(rows, lv), "windows": windows(rows, lv)}
        other = "index" if trend == "clock" else "clock"
        d["model_other_trend"] = fit(rows, lv, other)
        d["model_one_first"] = fit(rows, lv, trend, split_first=False)
        d["model_config_only"] = _config_only(rows, lv)
        res["levels"][lv] = d
    return res


def _config_only(rows: list[dict], level: str) -> dict:
    """Residual sd with the configurations alone (what the other terms take away)."""
    keys = list(dict.fromkeys(r["config_key"] for r in rows))
    ss, df = 0.0, 0
    for k in keys:
        v = [math.log(start_value(r, level)) for r in rows if r["config_key"] == k]
        ss += sum((x - statistics.mean(v)) ** 2 for x in v)
        df += len(v) - 1
    return {"residual_sd": math.sqrt(ss / df) if df else None, "df": df,
            "residual_sd_ci": list(_ci_sd(ss / df, df)) if df else None}


def _fmt(term: dict, pct: bool = True) -> str:
    return f"{term['ratio']:.3f} [{term['lo']:.3f}, {term['hi']:.3f}]"


def table(res: dict, names: dict[str, str]) -> str:
    lines = []
    levels = list(res["levels"])
    head = "| effect (ratio, 95% interval) | " + " | ".join("objective" if lv == LEVEL_OBJECTIVE else f"c={lv}"
                                                            for lv in levels) + " |"
    lines += [head, "|---" * (1 + len(levels)) + "|"]
    first = res["levels"][levels[0]]["model"]
    if "error" in first:
        return f"model not identifiable: {first}"
    for term in first["terms"]:
        nice = term
        if term.startswith("config:"):
            nice = f"{names.get(term[7:], term[7:])} / {names.get(first['base'], first['base'])}"
        cells = []
        for lv in levels:
            t = res["levels"][lv]["model"]["terms"].get(term)
            cells.append(_fmt(t) + (f" p={t['p']:.2g}" if t.get("p") is not None else "")
                         + (f" VIF {t['vif']:.0f}: confounded" if t["vif"] > 10 else "") if t else "-")
        lines.append(f"| {nice} | " + " | ".join(cells) + " |")
    cells = []
    for lv in levels:
        m = res["levels"][lv]["model"]
        cells.append(f"{m['residual_sd']:.1%} [{m['residual_sd_ci'][0]:.1%}, {m['residual_sd_ci'][1]:.1%}] ({m['df']} df)")
    lines.append("| start-to-start residual sd | " + " | ".join(cells) + " |")
    cells = []
    for lv in levels:
        m = res["levels"][lv]["model_config_only"]
        cells.append(f"{m['residual_sd']:.1%} ({m['df']} df)" if m["residual_sd"] is not None else "-")
    lines.append("| sd between starts, configs alone | " + " | ".join(cells) + " |")
    for key, title in (("within", "window sd within a start"), ("within_index_removed", "window sd, window index out")):
        cells = []
        for lv in levels:
            w = (res["levels"][lv]["windows"] or {}).get(key)
            cells.append(f"{w['sd']:.1%} [{w['ci'][0]:.1%}, {w['ci'][1]:.1%}] ({w['df']} df)" if w else "-")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--json", help="write the analysis here")
    ap.add_argument("--trend", choices=("clock", "index"), default="clock")
    ap.add_argument("--label", default=None, help="only rows whose label starts with this")
    ap.add_argument("--trials", action="append", default=[],
                    help="a study's trials (export_study.py JSONL) on the same machine: their starts join the rows, "
                         "and every row is read by the study's objective (the levels weighted)")
    args = ap.parse_args(argv)
    rows = load(args.rows, args.label, args.trials)
    if len(rows) < 4:
        print(f"too few rows ({len(rows)}) of configurations with two starts or more")
        return 1
    names = {r["config_key"]: config_name(r) for r in rows}
    res = analyse(rows, args.trend)
    res["files"] = args.rows
    print("starts in order (* = the configuration's first start on the machine): " + ", ".join(res["order"]))
    print("minutes from the first start: " + ", ".join(f"{m:.1f}" for m in res["minutes"]))
    print()
    print(table(res, names))
    for lv, d in res["levels"].items():
        name = "objective" if lv == LEVEL_OBJECTIVE else f"c={lv}"
        bf = ", ".join(f"{k} {v['first_over_later']:.3f}" for k, v in d["by_first"].items())
        print(f"\n{name}: first start / mean of later starts: {bf}")
        for alt, label_ in (("model_other_trend", "other trend"), ("model_one_first", "one first-start term")):
            m = d[alt]
            if "error" in m:
                continue
            fs = ", ".join(f"{k} {_fmt(v)}" for k, v in m["terms"].items() if k.startswith(("first", "trend")))
            print(f"{name} ({label_}): {fs}; residual {m['residual_sd']:.1%} ({m['df']} df)")
        w = d["windows"]
        if w:
            print(f"{name}: window index effects {w['index_effects']}; last window / first: "
                  f"{ {k: {kk: vv for kk, vv in v.items() if kk != 'n'} for k, v in w['last_over_first_window'].items()} }")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
