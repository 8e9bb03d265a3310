"""The study report for humans: Markdown + HTML with PNG plots (``autotune report W``).

Plots: TPOT vs K per method (and per concurrency level in profile mode) with the predictor's
curve and interval; acceptance by draft position; the band schedule of the winner (or the best
band trial); trials over time with the best so far; predicted vs measured TPOT of the starts the
predictor chose (its error on configurations it had not seen). Then the recommendation.

matplotlib is optional (``pip install 'autotune[report]'``) and imported only here, with the
Agg backend (no display needed).
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
from pathlib import Path

from autotune.core._files import SHARED, SHARED_DIR, make_dirs, write_text
from autotune.engines import _startup
from autotune.search import _bands, _observations
from autotune.search._record import StudyRecord
from autotune.search._space import canonical, label
from autotune.search._trial import noise_text

BANDS = _bands.BANDS_KEY


class ReportError(RuntimeError):
    pass


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise ReportError("the report needs matplotlib: pip install 'autotune[report]' "
                          "(or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _done(trials) -> list:
    return [t for t in trials if t.state == "COMPLETE" and t.value is not None and math.isfinite(t.value)
            and t.measurement]


def _group_label(cfg) -> str:
    if not cfg:
        return "none"
    g = {k: v for k, v in cfg.items() if k not in ("num_speculative_tokens", BANDS)}
    s = g.pop("method")
    if "prompt_lookup_min" in g:
        s += f" w={g.pop('prompt_lookup_min')}-{g.pop('prompt_lookup_max')}"
    if g.get("model"):
        s += " " + str(g.pop("model")).rstrip("/").rsplit("/", 1)[-1]
    for k, v in sorted(g.items()):
        s += f" {k.removeprefix('suffix_decoding_')}={v}"
    return s


def _levels_of(t) -> dict[int, float]:
    lv = t.levels
    return {int(k): d["tpot"] for k, d in lv.items() if d.get("tpot") is not None}


# --------------------------------------------------------------------------- plots


def _save(plt, fig, path: Path) -> None:
    """Every figure of the report: laid out, written at one resolution, and closed (pyplot keeps
    open figures alive)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_tpot_vs_k(plt, trials, predictor: dict | None, path: Path) -> Path | None:
    done = [t for t in _done(trials) if not (t.config or {}).get(BANDS)]
    if not done:
        return None
    by_level = any(_levels_of(t) for t in done)
    levels = sorted({L for t in done for L in _levels_of(t)}) if by_level else [None]
    fig, axes = plt.subplots(1, len(levels), figsize=(5.5 * len(levels), 4), squeeze=False)
    table = (predictor or {}).get("table") or []
    for ax, L in zip(axes[0], levels):
        groups: dict[str, list] = {}
        for t in done:
            groups.setdefault(_group_label(t.config), []).append(t)
        for g, ts in sorted(groups.items()):
            xs, ys = [], []
            for t in ts:
                v = t.value if L is None else _levels_of(t).get(L)
                if v is None:
                    continue
                xs.append(_observations.k_of(t.config))
                ys.append(v)
            if g == "none":
                for y in ys:
                    ax.axhline(y, color="k", ls="--", lw=1)
                if ys:
                    ax.text(0.02, ys[0], " no speculation", va="bottom", fontsize=8, transform=ax.get_yaxis_transform())
                continue
            line = ax.plot(xs, ys, "o", label=f"{g} (measured)")[0]
            pred = sorted((r for r in table if not r.get("bands") and _group_label(r["config"]) == g),
                          key=lambda r: r["k"])
            if pred:
                pk = [r["k"] for r in pred]
                if L is None:
                    mid = [r["predicted_tpot_ms"] for r in pred]
                    lo = [r["predicted_ci"][0] for r in pred]
                    hi = [r["predicted_ci"][1] for r in pred]
                else:
                    vals = [r["per_level"].get(str(L)) for r in pred]
                    keep = [i for i, v in enumerate(vals) if v]
                    pk = [pk[i] for i in keep]
                    lo, mid, hi = ([vals[i][j] for i in keep] for j in range(3))
                ax.plot(pk, mid, "-", color=line.get_color(), alpha=0.7, label=f"{g} (predicted)")
                ax.fill_between(pk, lo, hi, color=line.get_color(), alpha=0.15)
        ax.set_xlabel("K (num_speculative_tokens)")
        ax.set_ylabel("TPOT (ms)")
        ax.set_title("TPOT vs K" + (f" at concurrency {L}" if L is not None else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _save(plt, fig, path)
    return path


def plot_acceptance(plt, trials, path: Path) -> Path | None:
    best: dict[str, tuple[int, list[float], float | None]] = {}
    for t in _done(trials):
        cfg = t.config
        if not cfg or cfg.get(BANDS):
            continue
        d = t.counters
        rates = d.get("per_position_rates") or []
        g = _group_label(cfg)
        if rates and len(rates) > len(best.get(g, (0, []))[1]):
            m = t.measurement
            n = _observations._profile_requests(m) or (m.get("summary") or {}).get("n")
            best[g] = (t.number, rates, _observations.coverage_of(d, n))
    if not best:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for g, (num, rates, cov) in sorted(best.items()):
        pos = list(range(1, len(rates) + 1))
        a1.plot(pos, rates, "o-", label=f"{g} (trial {num})")
        al = [1 + sum(rates[:k]) for k in range(0, len(rates) + 1)]
        a2.plot(range(0, len(rates) + 1), al, "o-", label=f"{g}" + (f", coverage {cov:.0%}" if cov is not None else ""))
    a1.set_xlabel("draft position")
    a1.set_ylabel("accepted / drafted steps")
    a1.set_title("Acceptance by position")
    a1.set_ylim(0, 1.05)
    a2.set_xlabel("K")
    a2.set_ylabel("acceptance length per drafted step")
    a2.set_title("AL(K) = 1 + sum of the first K rates")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    _save(plt, fig, path)
    return path


def plot_bands(plt, trials, winner_cfg, path: Path) -> tuple[Path | None, dict | None]:
    band_trials = [t for t in _done(trials) if (t.config or {}).get(BANDS)]
    if winner_cfg and winner_cfg.get(BANDS):
        cfg = winner_cfg
    elif band_trials:
        cfg = min(band_trials, key=lambda t: t.value).config
    else:
        return None, None
    check = next((t.bands_check for t in band_trials if canonical(t.config) == canonical(cfg)), None)
    sched = cfg[BANDS]
    kmax = int(cfg["num_speculative_tokens"])
    top = max(b[1] for b in sched)
    xs = list(range(1, top + 1))
    ys = [_bands.k_at(sched, x, kmax) for x in xs]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.step(xs, ys, where="mid", label="schedule k")
    if check:
        for name, r in check.get("levels", {}).items():
            if r.get("draft_tokens_per_step") is not None:
                ax.plot([int(name)], [r["draft_tokens_per_step"]], "s", color="C3")
        ax.plot([], [], "s", color="C3", label="measured draft tokens / decode step")
    ax.set_xlabel("batch size (requests in the step)")
    ax.set_ylabel("K")
    ax.set_title(f"Band schedule: {label(cfg)}", fontsize=9)
    ax.set_ylim(-0.3, kmax + 0.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save(plt, fig, path)
    return path, {"config": cfg, "check": check}


def plot_trials(plt, trials, path: Path) -> Path | None:
    done = _done(trials)
    if not done:
        return None
    t0 = min((t.datetime_start for t in done if t.datetime_start), default=None)
    xs = [((t.datetime_complete or t.datetime_start) - t0).total_seconds() / 60 if t0 and t.datetime_start
          else t.number for t in done]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    colors = {"baseline": "k", "search": "C0", "confirm": "C2"}
    for role, c in colors.items():
        pts = [(x, t.value) for x, t in zip(xs, done) if t.role == role]
        if pts:
            ax.plot(*zip(*pts), "o", color=c, label=role)
    best, run = math.inf, []
    for x, t in sorted(zip(xs, done), key=lambda p: p[0]):
        if t.config and all(c <= 0 for c in t.constraints.values()):
            best = min(best, t.value)
        run.append((x, best if math.isfinite(best) else None))
    pts = [(x, b) for x, b in run if b is not None]
    if pts:
        ax.step(*zip(*pts), where="post", color="C1", label="best speculative so far")
    for x, t in zip(xs, done):
        ax.annotate(str(t.number), (x, t.value), fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.set_xlabel("minutes since the first trial" if t0 else "trial")
    ax.set_ylabel("TPOT (ms)")
    ax.set_title("Trials over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save(plt, fig, path)
    return path


def predicted_rows(trials) -> list[dict]:
    rows = []
    for t in _done(trials):
        p = t.predicted_tpot_ms
        if p is None:
            continue
        ci = t.predicted_ci or [p, p]
        measured = _objective_like_prediction(t)
        rows.append({"trial": t.number, "config": label(t.config), "predicted": p,
                     "lo": ci[0], "hi": ci[1], "measured": measured,
                     "error": (p - measured) / measured, "inside": ci[0] <= measured <= ci[1]})
    return rows


def _objective_like_prediction(t) -> float:
    """The quantity the predictor predicts: the weighted per-level statistic in profile mode."""
    lv = t.levels
    if lv:
        w = {k: d.get("weight", 0) for k, d in lv.items() if d.get("tpot") is not None}
        s = sum(w.values())
        if s > 0:
            return sum(w[k] * lv[k]["tpot"] for k in w) / s
    return t.value


def plot_predicted(plt, rows: list[dict], path: Path) -> Path | None:
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(4.8, 4.4))
    xs = [r["measured"] for r in rows]
    ys = [r["predicted"] for r in rows]
    ax.errorbar(xs, ys, yerr=[[r["predicted"] - r["lo"] for r in rows], [r["hi"] - r["predicted"] for r in rows]],
                fmt="o", capsize=3)
    for r in rows:
        ax.annotate(str(r["trial"]), (r["measured"], r["predicted"]), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    lo, hi = min(xs + ys) * 0.9, max(xs + ys) * 1.1
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured TPOT (ms)")
    ax.set_ylabel("predicted before the start (ms)")
    ax.set_title("Predicted vs measured (90% intervals)")
    ax.grid(alpha=0.3)
    _save(plt, fig, path)
    return path


# --------------------------------------------------------------------------- document


def build(study: StudyRecord, out_dir: str | Path, recommendation: dict | None = None,
          workload: str | None = None) -> dict[str, Path]:
    """Write ``report.md``, ``report.html`` and the PNGs of the study's record (``search.read_study``)
    into ``out_dir``; returns their paths."""
    plt = _plt()
    out = Path(out_dir)
    make_dirs(out, SHARED_DIR)
    study_name, trials = study.name, list(study.all_trials)
    predictor = study.predictor
    winner = (recommendation or {}).get("speculative_config")
    pred_rows = predicted_rows(trials)
    figs: dict[str, Path | None] = {
        "tpot_vs_k": plot_tpot_vs_k(plt, trials, predictor, out / "tpot_vs_k.png"),
        "acceptance": plot_acceptance(plt, trials, out / "acceptance.png"),
        "trials": plot_trials(plt, trials, out / "trials.png"),
        "predicted_vs_measured": plot_predicted(plt, pred_rows, out / "predicted_vs_measured.png"),
    }
    bands_png, bands_info = plot_bands(plt, trials, winner, out / "bands.png")
    figs["bands"] = bands_png
    blocks = _blocks(study_name, workload or study.workload, trials, predictor, recommendation,
                     pred_rows, bands_info, figs)
    md = write_text(out / "report.md", _markdown(blocks), SHARED)
    page = write_text(out / "report.html", _html(blocks, study_name), SHARED)
    written = {"markdown": md, "html": page}
    written.update({k: v for k, v in figs.items() if v is not None})
    return written


def _blocks(study_name, workload, trials, predictor, rec, pred_rows, bands_info, figs) -> list[tuple]:
    """The report as (kind, payload) blocks: ('h', text, level), ('p', text), ('table', head, rows),
    ('img', file, caption), ('code', text)."""
    b: list[tuple] = [("h", f"autotune report: {workload or study_name}", 1),
                      ("p", f"Study `{study_name}`, generated {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC.")]
    b.append(("h", "Recommendation", 2))
    if rec:
        b.append(("p", f"**{rec['decision']}**: {rec['reason']}"))
        if rec.get("benchmark_only"):
            b.append(("p", f"**BENCHMARK ONLY, do not deploy**: {rec.get('warning', '')} "
                           f"(`{json.dumps(rec['benchmark_only'].get('synthetic_acceptance'))}`)"))
        b.append(("code", json.dumps(rec.get("speculative_config"), indent=2)))
        if rec.get("vllm_serve_args"):
            b.append(("code", "vllm serve ... " + " ".join(_q(a) for a in rec["vllm_serve_args"])))
        if rec.get("llama_server_args"):
            b.append(("code", "llama-server ... " + " ".join(_q(a) for a in rec["llama_server_args"])))
        ev = rec.get("evidence") or {}
        if "speedup" in ev:
            b.append(("p", f"Speedup {ev['speedup']:.2f}x ({ev['confidence']:.0%} CI {ev['speedup_ci'][0]:.2f}-"
                           f"{ev['speedup_ci'][1]:.2f}); baseline {ev['baseline']['tpot_ms']:.2f} ms vs "
                           f"{ev['winner']['tpot_ms']:.2f} ms {ev['statistic']} TPOT; "
                           f"{rec['study']['server_starts']} server starts; stopped because: "
                           f"{rec['study'].get('stopped_because') or '-'}."))
    else:
        b.append(("p", "No recommendation file found for this study."))
    done = _done(trials)
    starts = sum(t.server_starts for t in trials if t.state != "WAITING")
    b.append(("h", "Trials", 2))
    b.append(("p", f"{len(trials)} trials, {len(done)} complete, {starts} server starts."))
    rows = []
    for t in trials:
        d = t.counters
        p = t.predicted_tpot_ms
        rows.append([str(t.number), t.role or "?", label(t.config), t.state,
                     f"{t.value:.2f}" if t.value is not None and math.isfinite(t.value) else "-",
                     f"{p:.2f}" if p is not None else "-",
                     f"{d['acceptance_length']:.2f}" if d.get("acceptance_length") else "-",
                     noise_text(t.noise_attrs()) or "-", (t.error or "")[:80]])
    b.append(("table", ["#", "role", "config", "state", "TPOT ms", "predicted ms", "AL", "noise", "error"], rows))
    if figs.get("trials"):
        b.append(("img", figs["trials"].name, "Trials over time"))
    b += _time_blocks(trials)
    b.append(("h", "TPOT vs K", 2))
    if figs.get("tpot_vs_k"):
        b.append(("img", figs["tpot_vs_k"].name, "Measured TPOT per method and K; lines: the predictor's last "
                                                  "estimate with its 90% interval"))
    if figs.get("acceptance"):
        b.append(("h", "Acceptance by position", 2))
        b.append(("img", figs["acceptance"].name, "Per-position acceptance of each method's longest run, and "
                                                   "the acceptance length it implies for every K"))
    b.append(("h", "Predictor", 2))
    if predictor:
        b.append(("p", f"Last decision: {predictor.get('action')} — {predictor.get('reason')}"))
    if pred_rows:
        mape = sum(abs(r["error"]) for r in pred_rows) / len(pred_rows)
        inside = sum(r["inside"] for r in pred_rows) / len(pred_rows)
        b.append(("p", f"Error on the {len(pred_rows)} configurations it chose before they were measured: "
                       f"mean absolute {mape:.1%}; measured value inside the 90% interval: {inside:.0%}."))
        b.append(("table", ["trial", "config", "predicted ms", "90% interval", "measured ms", "error"],
                  [[str(r["trial"]), r["config"], f"{r['predicted']:.2f}", f"{r['lo']:.2f}-{r['hi']:.2f}",
                    f"{r['measured']:.2f}", f"{r['error']:+.1%}"] for r in pred_rows]))
        b.append(("img", figs["predicted_vs_measured"].name, "Predicted (before the start) vs measured TPOT"))
    else:
        b.append(("p", "No trial was chosen by the predictor in this study."))
    b.append(("h", "Band schedule", 2))
    if bands_info:
        chk = bands_info.get("check") or {}
        b.append(("p", f"{label(bands_info['config'])}: took effect: {chk.get('took_effect')} — "
                       f"{chk.get('reason', 'not verified')}"
                       + (f"; k=0 levels vs no speculation: {chk['k0_vs_no_speculation']:.2f}x TPOT"
                          if chk.get("k0_vs_no_speculation") else "")))
        b.append(("img", figs["bands"].name, "K by batch size; squares: measured draft tokens per decode step"))
    else:
        b.append(("p", "No band schedule was measured (see `space.bands` and `replay.mode: profile`)."
                       + _per_level_best((predictor or {}).get("table") or [])))
    return b


def _time_blocks(trials) -> list[tuple]:
    """Where each start's seconds went (``_startup``): the engine's start-up phases from its log,
    then autotune's settle, measure, outputs and stop; the night's sums under it."""
    timed = [t for t in trials if t.timeline]
    if not timed:
        return []
    cells = [_startup.seconds(t.timeline) for t in timed]
    cols = [k for k in _startup.LABELS if any(k in cell for cell in cells)]
    rows = []
    for t, cell in zip(timed, cells):
        tl = t.timeline
        cache = (tl.get("engine") or {}).get("compile_cache")
        rows.append([str(t.number), label(t.config)]
                    + [(f"{cell[k]:.1f}" + (f" ({cache})" if k == "compile" and cache else "")) if k in cell else "-"
                       for k in cols]
                    + [f"{tl['total']:.0f}" if tl.get("total") is not None else "-"])
    spent = _startup.night([t.timeline for t in timed])
    return [("h", "Where the time went", 2),
            ("p", "Seconds of each server start, from the engine's own log (start-up phases end at the line "
                  "that reports them; whole seconds) and autotune's clock (settle, measure, outputs, stop). "
                  f"The night: {_startup.night_text(spent)}."),
            ("table", ["#", "config"] + [_startup.LABELS[k] for k in cols] + ["total s"], rows)]


def _per_level_best(table: list[dict]) -> str:
    """From the predictor's table: the predicted best K at each concurrency level."""
    best: dict[str, tuple[float, str]] = {}
    for r in table:
        if r.get("bands"):
            continue
        for L, (_, mid, _) in (r.get("per_level") or {}).items():
            if L not in best or mid < best[L][0]:
                best[L] = (mid, r["label"])
    if len(best) < 2:
        return ""
    return (" Predicted best per concurrency level: " +
            "; ".join(f"{L}: {lab} ({v:.2f} ms)" for L, (v, lab) in sorted(best.items(), key=lambda x: int(x[0])))
            + (" (one configuration is best at every level: no schedule was worth a start)."
               if len({lab for _, lab in best.values()}) == 1 else "."))


def _q(a: str) -> str:
    import shlex

    return shlex.quote(a)


def _markdown(blocks) -> str:
    out = []
    for blk in blocks:
        kind = blk[0]
        if kind == "h":
            out.append("#" * blk[2] + " " + blk[1])
        elif kind == "p":
            out.append(blk[1])
        elif kind == "code":
            out.append("```\n" + blk[1] + "\n```")
        elif kind == "img":
            out.append(f"![{blk[2]}]({blk[1]})")
        elif kind == "table":
            head, rows = blk[1], blk[2]
            lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
            out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def _html(blocks, title: str) -> str:
    e = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>",
           "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;"
           "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}img{max-width:100%}</style></head><body>"]
    for blk in blocks:
        kind = blk[0]
        if kind == "h":
            out.append(f"<h{blk[2]}>{e(blk[1])}</h{blk[2]}>")
        elif kind == "p":
            out.append(f"<p>{e(blk[1]).replace('**', '')}</p>")
        elif kind == "code":
            out.append(f"<pre>{e(blk[1])}</pre>")
        elif kind == "img":
            out.append(f"<figure><img src='{e(blk[1])}' alt='{e(blk[2])}'><figcaption>{e(blk[2])}</figcaption></figure>")
        elif kind == "table":
            out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in blk[1]) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in blk[2]]
            out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out)
