"""The method table of the H200 report: one line per server start of each speculative method of
the protocol (no speculation, ngram and its GPU proposer, draft model, EAGLE-3, suffix decoding,
MTP), with TPOT and acceptance length per concurrency level, the requests measured per level
(and how many of them ran inside the level's steady window), seconds to a healthy server and the
failed starts with their error. Reads study trials and measured points (benchmarks/results/h200-*.jsonl).

    python3 benchmarks/gpu/method_table.py benchmarks/results/h200-*.jsonl [--workload code-h200]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TARGET = "/tmp/models/qwen3-8b"
ORDER = ["none", "ngram", "ngram_gpu", "draft_model", "eagle3", "suffix", "mtp"]


def describe(cfg: dict | None) -> str:
    if not cfg:
        return "none"
    s = f"{cfg['method']} K={cfg['num_speculative_tokens']}"
    if cfg.get("num_speculative_tokens_per_batch_size"):
        s += " bands " + ",".join(f"{a}-{b}:{k}" for a, b, k in cfg["num_speculative_tokens_per_batch_size"])
    if cfg.get("enforce_eager"):
        s += " (drafter eager)"
    return s


def rows_of(paths: list[str]) -> list[dict]:
    out = []
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            wl = r.get("spec_workload") or r.get("workload")
            model = r.get("model", TARGET)
            ok = bool(r.get("ok") or r.get("state") == "COMPLETE")
            levels = {}
            for k, v in (r.get("levels") or {}).items():
                s = v.get("summary") or {}
                levels[int(k)] = {"tpot": v.get("tpot"), "al": (v.get("spec_delta") or {}).get("acceptance_length"),
                                  "tok_s": s.get("output_throughput_tok_s"), "n": s.get("ok"),
                                  "in_window": s.get("in_window")}
            out.append({"file": Path(p).name, "workload": wl, "model": model, "label": r.get("label") or "",
                        "config": r.get("config"), "method": (r.get("config") or {}).get("method", "none"),
                        "source": "study" if "study" in r else "point", "ok": ok,
                        "error": r.get("error"), "start_s": r.get("start_seconds"), "levels": levels,
                        "env": r.get("env_extra")})
    return out


def fmt_level(lv: dict | None) -> str:
    if not lv or lv.get("tpot") is None:
        return "-"
    s = f"{lv['tpot']:.2f}"
    if lv.get("al"):
        s += f" ({lv['al']:.2f})"
    return s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--workload", action="append", default=None,
                    help="workloads to list (default: code-h200 and the MTP target's mimo-code-h200)")
    args = ap.parse_args(argv)
    wls = args.workload or ["code-h200", "mimo-code-h200"]
    rows = [r for r in rows_of(args.paths) if r["workload"] in wls
            or (r["method"] == "none" and r["model"] == TARGET and "code-h200" in wls and r["levels"]
                and set(r["levels"]) == {1, 32})]
    rows.sort(key=lambda r: (ORDER.index(r["method"]) if r["method"] in ORDER else 99, r["model"] != TARGET,
                             describe(r["config"]), r["file"]))
    print("| method | target | config | source | start s | TPOT c=1 ms (AL) | TPOT c=32 ms (AL) "
          "| out tok/s c=32 | requests c=1 / c=32 (in steady window) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        target = Path(r["model"]).name
        src = f"{r['source']} ({r['file'].removeprefix('h200-').removesuffix('.jsonl')})"
        if r["label"]:
            src += f", {r['label']}"
        if r["env"]:
            src += ", " + " ".join(f"{k}={v}" for k, v in r["env"].items())
        if not r["ok"]:
            print(f"| {r['method']} | {target} | {describe(r['config'])} | {src} | - | failed: {r['error'][:160]} | | | |")
            continue
        l1, l32 = r["levels"].get(1), r["levels"].get(32)
        req = " / ".join(f"{lv['n']} ({lv['in_window']})" if lv else "-" for lv in (l1, l32))
        tok = f"{l32['tok_s']:.0f}" if l32 and l32.get("tok_s") else "-"
        start = f"{r['start_s']:.0f}" if r["start_s"] else "-"
        print(f"| {r['method']} | {target} | {describe(r['config'])} | {src} | {start} | {fmt_level(l1)} "
              f"| {fmt_level(l32)} | {tok} | {req} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
