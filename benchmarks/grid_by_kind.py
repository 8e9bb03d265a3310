"""A mixed workload's grid split by kind of request, and read with each objective statistic.

``mixed-smollm2`` holds code edits and chat under one tag. Each grid row keeps its measured
requests' TPOTs in request order (the replay's results are indexed by request), so the spec's
measured requests (``split_requests``) say which TPOT is which kind: a code edit carries
``_codetraffic.SYSTEM`` as its system message. Per configuration: the median over starts of each
kind's per-start median, and of each start's median, trimmed mean and mean, with the speedup over
no speculation (docs/notes/2026-12-01-smollm2-vllm-cpu.md, "mixed-smollm2").

    .venv/bin/python benchmarks/grid_by_kind.py studies/mixed-smollm2.yaml
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.core import _measure  # noqa: E402
from autotune.search._space import label  # noqa: E402

STATS = ("median", "trimmed_mean", "mean")


def by_kind(rows: list[dict], kinds: list[str]) -> dict[str, dict]:
    """Config label -> {kind: median over starts of the kind's per-start median, statistic: median
    over starts of the start's statistic}; rows whose request count is not ``len(kinds)`` are left out."""
    per: dict[str, list[list[float]]] = {}
    for r in rows:
        if r.get("ok") and len(r.get("tpot_ms") or []) == len(kinds):
            per.setdefault(label(r.get("config")), []).append(r["tpot_ms"])
    out = {}
    for name, starts in per.items():
        d = {k: statistics.median(statistics.median(t for t, kk in zip(s, kinds) if kk == k) for s in starts)
             for k in sorted(set(kinds))}
        d.update({st: statistics.median(_measure.summarize(s, st) for s in starts) for st in STATS})
        d["starts"] = len(starts)
        out[name] = d
    return out


def main(argv=None) -> int:
    from autotune.core._spec import load_spec
    from autotune.demo._codetraffic import SYSTEM
    from autotune.search._study import split_requests
    from autotune.traffic import _replayset

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec")
    ap.add_argument("--rows", help="grid JSONL (default benchmarks/results/grid-<workload>.jsonl)")
    args = ap.parse_args(argv)
    spec = load_spec(args.spec)
    _, measured, _ = split_requests(spec, _replayset.load(spec.replay.path))
    kinds = ["code edit" if (r.body.get("messages") or [{}])[0].get("content") == SYSTEM else "chat" for r in measured]
    path = Path(args.rows or ROOT / "benchmarks" / "results" / f"grid-{spec.workload}.jsonl")
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    res = by_kind(rows, kinds)
    if "none" not in res:
        print(f"{path}: no start of no speculation to compare with", file=sys.stderr)
        return 1
    names = sorted(set(kinds))
    print("| config | " + " | ".join(f"{k}s ({kinds.count(k)})" for k in names) + " | " + " | ".join(STATS) + " |")
    print("|---" * (1 + len(names) + len(STATS)) + "|")
    base = res["none"]
    for name, d in sorted(res.items(), key=lambda kv: kv[1]["median"]):
        cells = [f"{d[k]:.2f}" for k in names] + [
            f"{d[st]:.2f}" + ("" if name == "none" else f" ({base[st] / d[st]:.2f}x)") for st in STATS]
        print(f"| {name} | " + " | ".join(cells) + " |")
    out = path.with_name(path.stem + "-by-kind.json")
    out.write_text(json.dumps({"spec": args.spec, "kinds": kinds, "configs": res}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
