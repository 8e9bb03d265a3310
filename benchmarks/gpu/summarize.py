"""Tables of the H200 results: every measured configuration per workload with its TPOT at each
concurrency level, the grid's best per level and what the study recommended.

Reads the exported study trials and the measured points (benchmarks/gpu/round.sh returns them);
the no-speculation baseline does not depend on the synthetic acceptance, so it counts for both
workloads. Rows with a label (experiments, e.g. the patched drafter) are listed apart.

    python benchmarks/gpu/summarize.py benchmarks/results/h200-trials-2026-11-30.jsonl \
        benchmarks/results/h200-points-2026-11-30.jsonl \
        --recommendations benchmarks/results/h200-recommendation-*.json --out benchmarks/results/h200-summary.json

Each TPOT cell gives the level's in-window request count (n): at c=32 the speculative configs
had 1-13 of their 32 measured requests inside the steady window, against 32 for no speculation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def label(cfg: dict | None) -> str:
    if not cfg:
        return "none"
    s = f"{cfg['method']} K={cfg['num_speculative_tokens']}"
    if cfg.get("num_speculative_tokens_per_batch_size"):
        s += " bands " + ",".join(f"{a}-{b}:{k}" for a, b, k in cfg["num_speculative_tokens_per_batch_size"])
    return s


def rows_of(paths: list[str]) -> list[dict]:
    out = []
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            ok = r.get("state") == "COMPLETE" or r.get("ok")
            if not ok:
                continue
            levels = {int(k): {"tpot": v["tpot"], "al": (v.get("spec_delta") or {}).get("acceptance_length"),
                               "tok_s": v["summary"].get("output_throughput_tok_s"),
                               "in_window": len(v.get("tpot_ms") or []), "measured": v["summary"].get("n")}
                      for k, v in (r.get("levels") or {}).items()}
            summ = r.get("summary") or {}
            tpot = r.get("value") if "study" in r else r.get("tpot")
            if not levels and summ.get("mode") == "closed" and tpot is not None:  # one closed loop
                levels = {int(summ["concurrency"]): {"tpot": tpot, "tok_s": summ.get("output_throughput_tok_s"),
                                                     "al": (r.get("spec_delta") or {}).get("acceptance_length")}}
            if not levels:
                continue
            wl = r.get("workload") if r.get("workload") not in (None, "*") else r.get("spec_workload")
            out.append({"workload": wl, "label": r.get("label") or "", "config": r.get("config"),
                        "model": r.get("model", "/tmp/models/qwen3-8b"),
                        "key": r.get("config_key"), "source": "study" if "study" in r else "point",
                        "start_s": r.get("start_seconds"), "levels": levels})
    return out


def config_key(rec: dict) -> str:
    """``autotune.search._space.canonical`` of a recommendation's config, written out: the tables run with
    a bare python3 (autotune's package import needs its dependencies)."""
    return json.dumps(rec["speculative_config"], sort_keys=True) if rec.get("speculative_config") else "none"


def objective_table(paths: list[str], workloads: list[str]) -> None:
    """The study trials decided as autotune decides a profile study (needs autotune importable)."""
    from autotune.core._measure import bootstrap_weighted_ratio_ci, weighted_statistic

    rows = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line.strip()]
    trials = [r for r in rows if "study" in r]
    for wl in workloads:
        done = [t for t in trials if t["workload"] == wl and t["state"] == "COMPLETE" and t.get("levels")]
        base = next((t for t in done if t["config_key"] == "none"), None)
        if base is None:
            continue
        w = {L: d["weight"] for L, d in base["levels"].items()}
        b = {L: [d["tpot_ms"]] for L, d in base["levels"].items()}
        print(f"\n### {wl}: traffic-weighted per-level median TPOT\n")
        print(f"none: {weighted_statistic(b, w, 'median'):.2f} ms")
        for t in done:
            if t is base:
                continue
            c = {L: [d["tpot_ms"]] for L, d in t["levels"].items() if d.get("tpot_ms")}
            ci = bootstrap_weighted_ratio_ci(b, c, w, "median", seed=0)
            print(f"{label(t['config'])}: {weighted_statistic(c, w, 'median'):.2f} ms, speedup {ci.ratio:.2f}x "
                  f"(95% CI {ci.low:.2f}-{ci.high:.2f}); trial value (median of the mixture) {t['value']:.2f} ms")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--recommendations", nargs="*", default=[])
    ap.add_argument("--objective", action="store_true",
                    help="each study config against the baseline on the traffic-weighted per-level median "
                         "(autotune's profile objective), with its bootstrap CI")
    ap.add_argument("--out", metavar="JSON", help="also write every measured row (per level: TPOT, acceptance "
                    "length, tok/s, in-window requests) here, e.g. benchmarks/results/h200-summary.json")
    ap.add_argument("--target", nargs="*", default=[], metavar="STUDY=GRID@LEVEL",
                    help="a study that targeted one level of a grid workload (chat-h200-c1=chat-h200@1): "
                         "its recommendation, not GRID's, is judged at that level")
    args = ap.parse_args(argv)
    rows = rows_of(args.files)
    recs = {r["workload"]: r for r in (json.loads(Path(p).read_text()) for p in args.recommendations)}
    targets = {}
    for t in args.target:
        study, _, where = t.partition("=")
        grid_wl, _, lv = where.partition("@")
        targets[(grid_wl, int(lv))] = study
    workloads = sorted({r["workload"] for r in rows if not r["label"]})
    grids: dict[str, list[dict]] = {}
    for wl in workloads:
        model = next((r["model"] for r in rows if r["workload"] == wl), None)
        # the baseline is shared by the workloads of one target model
        grid = [r for r in rows if not r["label"] and (r["workload"] == wl or (r["key"] == "none" and r["model"] == model))]
        seen, uniq = set(), []
        for r in sorted(grid, key=lambda r: r["workload"] != wl):  # this workload's own measurement first
            if r["key"] in seen:
                continue
            seen.add(r["key"])
            uniq.append(r)
        own = {lv for r in uniq if r["workload"] == wl for lv in r["levels"]}
        uniq = [r for r in uniq if own & set(r["levels"])]
        grids[wl] = uniq
        levels = sorted(own)
        print(f"\n### {wl}\n")
        print("| config | source | start s | " + " | ".join(f"TPOT c={lv} ms (AL, tok/s, in-window requests)"
                                                         for lv in levels) + " |")
        print("|---|---|---|" + "---|" * len(levels))
        for r in sorted(uniq, key=lambda r: label(r["config"])):
            cells = []
            for lv in levels:
                d = r["levels"].get(lv)
                al = f"{d['al']:.2f}" if d and d["al"] else "-"
                n = f", n={d['in_window']}" if d and d.get("in_window") is not None else ""
                cells.append(f"{d['tpot']:.2f} ({al}, {d['tok_s']:.0f}{n})" if d else "-")
            print(f"| {label(r['config'])} | {r['source']} | {r['start_s']:.0f} | " + " | ".join(cells) + " |")
        print(f"configurations measured: {len(uniq)}")
    print("\n### recommended vs the measured best, per workload and concurrency\n")
    for wl, uniq in grids.items():
        levels = sorted({lv for r in uniq if r["workload"] == wl for lv in r["levels"]})
        if wl in targets.values():
            continue
        if recs and not any(targets.get((wl, lv), wl) in recs for lv in levels):
            continue   # no study recommended anything for this workload (grid points only)
        base = next((r for r in uniq if r["key"] == "none"), None)
        for lv in levels:
            at = [r for r in uniq if lv in r["levels"]]
            best = min(at, key=lambda r: r["levels"][lv]["tpot"])
            b = base["levels"][lv]["tpot"] if base and lv in base["levels"] else float("nan")
            line = (f"{wl} c={lv}: measured best {label(best['config'])} {best['levels'][lv]['tpot']:.2f} ms "
                    f"({b / best['levels'][lv]['tpot']:.2f}x vs none)")
            by = targets.get((wl, lv), wl)
            rec = recs.get(by)
            rec_row = next((r for r in at if rec and r["key"] == config_key(rec)), None)
            if rec_row:
                t = rec_row["levels"][lv]["tpot"]
                line += (f"; recommended by {by} ({rec['decision']}) {label(rec_row['config'])} {t:.2f} ms "
                         f"({b / t:.2f}x vs none, {t / best['levels'][lv]['tpot'] - 1:+.1%} vs measured best)")
            elif rec:
                line += f"; recommended by {by}: {label(rec['speculative_config'])}, not measured at c={lv}"
            print(line)
    if args.out:
        Path(args.out).write_text(json.dumps({"files": args.files, "rows": rows}, indent=1) + "\n")
        print(f"\nwrote {args.out}")
    if args.objective:
        objective_table(args.files, workloads)
    exp = [r for r in rows if r["label"]]
    if exp:
        print("\n### experiments\n")
        for r in exp:
            print(f"{r['label']} ({r['workload']}): {label(r['config'])} start {r['start_s']:.0f} s, "
                  + ", ".join(f"c={lv} {d['tpot']:.2f} ms AL {d['al'] or 0:.2f}" for lv, d in sorted(r["levels"].items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
