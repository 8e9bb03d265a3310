"""Is the step cost linear in K on the H200? The predictor fits ``a + b*K`` per method and level
(``autotune.search._cost.CostFit``); this checks that shape on the measured GPU rows.

Step cost = TPOT x tokens per decode step (from each start's own counters at that level: the time
of one decode step, drafting and verification included). Per method and concurrency level, with
every measured K of that method (plain configs, no bands, one prompt-lookup window), it fits the
line by least squares and reports each point's residual, the slope, and the same for the
no-speculation step as K=0 (the line the predictor's one-K bracket leans on).

    python benchmarks/gpu/step_cost.py benchmarks/results/h200-*.jsonl --out benchmarks/results/h200-step-cost.json

Runs with the package's dependencies (it reads counters with ``autotune.search._observations``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.search._observations import tokens_per_step  # noqa: E402

WORKLOADS = ("code-h200", "chat-h200")


def points(paths: list[str]) -> dict[tuple[str, str, int], list[tuple[int, float, float, int]]]:
    """(workload, method, level) -> [(K, step ms, TPOT ms, in-window requests)] of every start."""
    out: dict[tuple[str, str, int], list[tuple[int, float, float, int]]] = {}
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if not (r.get("state") == "COMPLETE" or r.get("ok")):
                continue
            wl = r.get("workload") if r.get("workload") not in (None, "*") else r.get("spec_workload")
            cfg = r.get("config")
            if wl not in WORKLOADS or r.get("label") or (cfg or {}).get("num_speculative_tokens_per_batch_size"):
                continue
            if cfg and cfg.get("method") == "ngram" and cfg.get("prompt_lookup_min") not in (None, 2):
                continue  # one prompt-lookup window (2-4, the studies' own)
            method, k = (cfg["method"], int(cfg["num_speculative_tokens"])) if cfg else ("none", 0)
            for name, lv in (r.get("levels") or {}).items():
                d = lv.get("spec_delta") or {}
                n = d.get("requests") or (lv.get("summary") or {}).get("n")
                t = 1.0 if not cfg else tokens_per_step(d, n)
                if lv.get("tpot") is None or t is None:
                    continue
                out.setdefault((wl, method, int(name)), []).append(
                    (k, lv["tpot"] * t, lv["tpot"], len(lv.get("tpot_ms") or [])))
    return out


def fit(xy: list[tuple[int, float]]) -> dict | None:
    ks = [k for k, _ in xy]
    if len(set(ks)) < 2:
        return None
    mk, my = statistics.mean(ks), statistics.mean(y for _, y in xy)
    sxx = sum((k - mk) ** 2 for k in ks)
    b = sum((k - mk) * (y - my) for k, y in xy) / sxx
    a = my - b * mk
    res = [y - (a + b * k) for k, y in xy]
    return {"a_ms": a, "b_ms_per_k": b, "max_abs_residual_rel": max(abs(e) / (a + b * k) for (k, _), e in zip(xy, res)),
            "residuals_rel": [e / (a + b * k) for (k, _), e in zip(xy, res)]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    pts = points(args.rows)
    result = []
    for (wl, method, level), xs in sorted(pts.items()):
        if method == "none":
            continue
        base = pts.get((wl, "none", level)) or pts.get(("code-h200" if wl == "chat-h200" else "chat-h200", "none", level))
        step0 = statistics.mean(s for _, s, _, _ in base) if base else None
        xy = [(k, s) for k, s, _, _ in xs]
        row = {"workload": wl, "method": method, "level": level, "starts": len(xs),
               "points": [{"k": k, "step_ms": s, "tpot_ms": t, "in_window": n} for k, s, t, n in sorted(xs)],
               "baseline_step_ms": step0, "fit": fit(xy),
               "fit_with_baseline": fit(xy + [(0, step0)]) if step0 is not None else None}
        result.append(row)
        f = row["fit"]
        ks = ", ".join(f"K={k}: {s:.2f}" for k, s, _, _ in sorted(xs))
        line = f"{wl} {method} c={level}: step ms {ks}; baseline step {step0:.2f}" if step0 else f"{wl} {method} c={level}: {ks}"
        if f:
            line += (f"; line {f['a_ms']:.2f} + {f['b_ms_per_k']:.3f}*K, worst residual "
                     f"{100 * f['max_abs_residual_rel']:.1f}%")
        fb = row["fit_with_baseline"]
        if fb:
            line += f"; with the baseline as K=0: worst residual {100 * fb['max_abs_residual_rel']:.1f}%"
        print(line)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": "python benchmarks/gpu/step_cost.py " + " ".join(args.rows),
                                              "fits": result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
