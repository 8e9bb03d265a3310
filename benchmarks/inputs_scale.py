"""Inputs at scale: what reading a large replay set costs, and how soon a bad one is refused.

A replay set of N short requests is written twice, once valid and once with its last id
repeating an early one. Each is loaded by ``autotune.traffic._replayset.load`` in a fresh
process (peak resident memory from ``getrusage``), beside a reference pass in the same run that
only ``json.loads`` every line: load's time is reported as a ratio to it, memory in MB and as a
multiple of the file's size.

    python benchmarks/inputs_scale.py                 # 1,000,000 lines
    python benchmarks/inputs_scale.py --lines 200000

Results are appended to ``benchmarks/results/inputs_scale.json`` (a JSON list).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "inputs_scale.json"

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[3])
path, what = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
outcome = "ok"
if what == "json":
    with open(path, "rb") as fh:
        for line in fh:
            json.loads(line)
else:
    from autotune.traffic._replayset import ReplaySetError, load
    try:
        load(path)
    except ReplaySetError as e:
        outcome = str(e).split(": ", 1)[1]
print(json.dumps({"seconds": time.perf_counter() - t0, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "outcome": outcome}))
"""


def write_set(path: Path, n: int, duplicate: bool) -> int:
    with path.open("w") as fh:
        for i in range(n):
            rid = "r5" if duplicate and i == n - 1 else f"r{i}"
            fh.write(json.dumps({"id": rid, "endpoint": "chat", "tag": "code", "ts": 1796030558.0 + i,
                                 "body": {"max_tokens": 16, "messages": [{"role": "user", "content": f"q {i}"}]}}) + "\n")
    return path.stat().st_size


def run(path: Path, what: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), what, str(ROOT)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for dup in (True, False):
            p = Path(d) / ("dup.jsonl" if dup else "valid.jsonl")
            size_mb = write_set(p, args.lines, dup) / 2**20
            ref, got = run(p, "json"), run(p, "load")
            row = {"lines": args.lines, "case": "duplicate id on the last line" if dup else "valid",
                   "file_mb": round(size_mb, 1), "outcome": got["outcome"],
                   "time_vs_json_pass": round(got["seconds"] / ref["seconds"], 2),
                   "peak_mb": round(got["peak_mb"]), "peak_vs_file": round(got["peak_mb"] / size_mb, 2),
                   "json_pass_peak_mb": round(ref["peak_mb"])}
            rows.append(row)
            print(f"{row['case']:>30}: {args.lines:,} lines, {row['file_mb']} MB: {row['outcome']}; "
                  f"{row['time_vs_json_pass']}x a json.loads pass, peak {row['peak_mb']} MB "
                  f"({row['peak_vs_file']}x the file)", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    stamp = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
             "python": platform.python_version()}
    RESULTS.write_text(json.dumps(old + [{**stamp, **r} for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
