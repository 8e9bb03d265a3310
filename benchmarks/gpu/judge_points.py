"""The equivalence guard's verdict on single starts measured beside a study (``measure_points.py
--equivalence``): each row's greedy outputs judged against the study's baseline starts exactly as a
study trial is (``autotune.search._equivalence``), with the baseline's measured tolerance.

Used for configurations a study may not search, such as vLLM's synthetic rejection sampler,
which accepts drafts unchecked: the lossy configuration the guard must block.

    python benchmarks/gpu/judge_points.py --trials trials.jsonl --points points.jsonl \\
        [--label lossy] [--near-tie auto] [--json verdicts.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.search import _equivalence  # noqa: E402


def _rows(path: str) -> list[dict]:
    """JSON lines, gzipped (``.gz``: rows kept with their outputs and log-probabilities) or not."""
    data = Path(path).read_bytes()
    text = (gzip.decompress(data) if path.endswith(".gz") else data).decode()
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def judge_rows(trials: list[dict], points: list[dict], near_tie="auto", label: str | None = None) -> list[dict]:
    """One verdict per point row that kept its outputs: ``config``, ``label`` and the judgment."""
    base = [t for t in trials if t.get("config_key") == "none" and t.get("state") == "COMPLETE" and t.get("outputs")]
    if not base:
        raise SystemExit("no completed no-speculation start with greedy outputs in the trials")
    outputs, texts, refs, tol = _equivalence.baseline_reference(base, near_tie)
    out = []
    for r in points:
        if not r.get("ok") or not r.get("outputs") or (label and r.get("label") != label):
            continue
        j = _equivalence.judge(outputs, texts, refs, r["outputs"], r.get("texts") or {}, tol["nats"],
                               r.get("token_ids"))
        out.append({"label": r.get("label"), "config": r.get("run_config") or r.get("config"),
                    "tolerance_how": tol["how"], **j})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", required=True, help="the study's exported trials (export_study.py)")
    ap.add_argument("--points", required=True, help="measure_points.py rows measured with --equivalence")
    ap.add_argument("--label", default=None)
    ap.add_argument("--near-tie", default="auto", help="guards.equivalence_near_tie: auto or nats")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    near = args.near_tie if args.near_tie == "auto" else float(args.near_tie)
    verdicts = judge_rows(_rows(args.trials), _rows(args.points), near, args.label)
    for v in verdicts:
        gaps = v.get("gaps") or []
        print(f"{v['label']} {json.dumps(v['config'], sort_keys=True)}: equivalent {v['matched']}/{v['compared']} "
              f"(identical {v['identical']}, near-ties {v['near_ties']}, real differences {v['differs']}; "
              f"tolerance {v['tolerance']:.3g} nats; margins {[round(g, 3) for g in gaps]})")
    if args.json:
        Path(args.json).write_text(json.dumps(verdicts, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
