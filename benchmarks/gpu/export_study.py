"""Export every trial of the studies in an Optuna storage to JSONL (one row per trial: config,
state, role, objective value, per-level TPOT, start seconds, speculative counters, argv, error)
and print a short per-study table. Used by benchmarks/gpu/round.sh after each study.

    python benchmarks/gpu/export_study.py sqlite:////tmp/h200/autotune.db $OUT/trials.jsonl
"""

from __future__ import annotations

import json
import sys


def _workload(study_name: str) -> str:
    """autotune-<workload>[-<8 hex fingerprint>] -> workload."""
    import re

    return re.sub(r"-[0-9a-f]{8}$", "", study_name.removeprefix("autotune-"))


def main(argv=None) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url, out = (sys.argv[1:] if argv is None else argv)[:2]
    with open(out, "w") as fh:
        for s in optuna.get_all_study_summaries(url):
            study = optuna.load_study(study_name=s.study_name, storage=url)
            print(f"study {s.study_name}")
            for t in study.get_trials(deepcopy=False):
                ua = dict(t.user_attrs)
                m = ua.pop("measurement", None) or {}
                # levels that could draw from the replay set's reserve (filled steady windows, round 5 on)
                # carry `drawn`: mark the row as measure_points.py marks its rows
                filled = any(isinstance(v, dict) and "drawn" in v for v in (m.get("levels") or {}).values())
                row = {"study": s.study_name, "workload": _workload(s.study_name), "number": t.number, "state": t.state.name, "value": t.value,
                       "config_key": ua.get("config_key"), "config": ua.get("config"), "role": ua.get("role"),
                       "error": ua.get("error"), **({"protocol": "window-filled"} if filled else {}),
                       "start_seconds": m.get("start_seconds"),
                       "wall_seconds": m.get("wall_seconds"), "timeline": m.get("timeline") or ua.get("timeline"),
                       "tpot_source": m.get("tpot_source"),
                       "levels": m.get("levels"), "summary": m.get("summary"), "spec_delta": m.get("spec_delta"),
                       "argv": m.get("argv"), "log_path": m.get("log_path"),
                       # the greedy outputs the equivalence guard judged (judge_points.py reads the baseline's)
                       **{k: m.get(k) for k in ("outputs", "texts", "token_ids", "logprobs", "engine_noise") if m.get(k)},
                       "datetime_start": str(t.datetime_start), "datetime_complete": str(t.datetime_complete),
                       "user_attrs": {k: v for k, v in ua.items() if k not in ("config",)}}
                fh.write(json.dumps(row, default=str) + "\n")
                lv = {k: round(v.get("tpot") or 0, 3) for k, v in (m.get("levels") or {}).items()}
                print(f"  #{t.number} {t.state.name:8s} {ua.get('role')!s:9s} {ua.get('config_key')!s:90.90s} "
                      f"value={t.value} levels={lv} start={m.get('start_seconds')} err={ua.get('error')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
