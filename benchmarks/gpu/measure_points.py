"""Measure single configurations (grid points, experiments) on the H200 with a study spec's
setup, one server start each, appending one JSON row per start to ``--out`` as soon as it is
measured (a command that hits its time limit keeps what it measured).

A configuration already measured (same workload and config key in ``--out`` or in any
``--done`` JSONL, e.g. the studies' exported trials) is skipped, so nothing is measured twice.
The benchmark-only synthetic acceptance of the spec is added to the server's config (and
recorded in ``run_config``), exactly as in a study trial.

    python benchmarks/gpu/measure_points.py benchmarks/gpu/code-h200.yaml \
        --configs '[null, {"method": "ngram", "num_speculative_tokens": 4, ...}]' \
        --out $OUT/grid.jsonl [--done $OUT/trials.jsonl] [--label patched] [--log-dir /tmp/h200/logs]
    python benchmarks/gpu/measure_points.py SPEC --grid ngram:1,2,4,8 draft_model:1,2 --out ...

``--windows N`` measures every start N times, one steady window after another on the same server
(``row["windows"]``: each window's time and per-level TPOT and acceptance length): the first
window is the row's measurement, as in any start; the others replay fresh prompts of the same
shape (``--windows-replay``), so no prefix-cache hit flatters them. Windows of one start against
starts of one configuration tell noise that drifts with time on the machine from noise that a
start carries for its whole life. It is round 15's protocol: a window holds every level and is
timed whole (for the GPU clock samples), and the row keeps the first window's figures. A spec's
own ``replay.windows`` is the product's: a level's windows run back to back and the row's figures
pool them (``summary.windows`` holds each window's).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.core import _measure
from autotune.traffic import _replayset  # noqa: E402
from autotune.engines._probe import probe, python_for  # noqa: E402
from autotune.core._signals import graceful_stop  # noqa: E402
from autotune.search._space import SearchSpace, canonical  # noqa: E402
from autotune.core._spec import load_spec  # noqa: E402
from autotune.search._study import reserve_requests, split_requests, window_requests  # noqa: E402
from autotune.search import _trial  # noqa: E402
from autotune.engines import _preload  # noqa: E402
from autotune.search._trial import TrialFailed, measure, request_tpot  # noqa: E402

# server-log lines worth keeping beside a row: how the drafter and the graphs were set up
LOG_PATTERNS = re.compile(r"cuda ?graph|cudagraph|eager|falling back|fall back|drafter|draft model|draft_model|"
                          r"async(hronous)? scheduling|model runner|torch\.compile|compil|Capturing|speculative|"
                          r"eagle|mtp|suffix|arctic|error|exception",
                          re.IGNORECASE)


TARGET = "/tmp/models/qwen3-8b"
"""The target of rows written before rows named their model."""


PROTOCOL = "window-filled"
"""Rows whose profile levels drew from the replay set's reserve until each steady window held
``replay.min_in_window`` requests (round 5 on); earlier rows measured one share per level."""


def done_counts(paths: list[Path], workload: str, model: str = TARGET, protocol: str | None = None) -> dict[str, int]:
    """Measured starts per config key (rows of ``workload``, and no-speculation rows of any workload
    with the same target model; labelled experiment rows never count; with ``protocol``, only rows
    measured under it)."""
    counts: dict[str, int] = {}
    for p in paths:
        if not p.exists():
            continue
        for line in p.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            # the no-speculation baseline does not depend on the synthetic acceptance: shared by the
            # workloads of one target model
            same = r.get("workload") in (workload, "*") or r.get("config_key") == "none"
            if r.get("config_key") == "none" and r.get("model", TARGET) != model:
                same = False
            if protocol is not None and r.get("protocol") != protocol:
                continue
            if same and (r.get("ok") or r.get("state") == "COMPLETE") and not r.get("label"):
                counts[r["config_key"]] = counts.get(r["config_key"], 0) + 1
    return counts


def done_keys(paths: list[Path], workload: str, model: str = TARGET) -> set[str]:
    return set(done_counts(paths, workload, model))


def log_lines(path: Path, limit: int = 60) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    hits = [ln[-300:] for ln in lines if LOG_PATTERNS.search(ln)]
    # the head says how the engine was set up, the tail why it stopped (a failed start's error)
    return hits if len(hits) <= limit else hits[: limit - 25] + ["..."] + hits[-25:]


def window_figures(run) -> dict:
    """One window's per-level median engine TPOT, requests in its steady window and, from the
    level's counter delta, its acceptance length."""
    out = {}
    for lv, d in run.level_details(request_tpot, "median").items():
        sd = (d.get("spec_delta") or {})
        drafts, acc = sd.get("drafts") or 0, sd.get("accepted_tokens") or 0
        out[lv] = {"tpot": d.get("tpot"), "in_window": d.get("in_window"),
                   "acceptance_length": round(1 + acc / drafts, 4) if drafts else None}
    return out


def repeat_windows(n: int, slices: list[tuple[list, list, list]], record: list[dict]):
    """Make ``_trial.measure`` replay ``n`` windows on its server: the first on the requests it
    was given (its result is the start's measurement), window i on ``slices[i - 1]`` (warm-up,
    measured, reserve). Each window's figures are appended to ``record``."""
    original = _trial._replay_with_scrape

    async def replay(base_url, model, requests, warmup, spec, log_path=None, reserve=None, windows=None):
        first = None
        for i in range(n):
            w, r, res = (warmup, requests, reserve) if i == 0 else slices[(i - 1) % len(slices)]
            t0 = time.time()
            got = await original(base_url, model, r, w, spec, log_path, res, windows if i == 0 else None)
            record.append({"window": i, "t0": round(t0, 2), "t1": round(time.time(), 2),
                           "levels": window_figures(got[0])})
            print(f"  window {i}: " + ", ".join(f"c={lv} {d['tpot'] and round(d['tpot'], 3)} ms"
                                                for lv, d in record[-1]["levels"].items()), flush=True)
            first = first or got
        return first

    _trial._replay_with_scrape = replay
    return original


def window_slices(path: Path, spec, per: int = 300) -> list[tuple[list, list, list]]:
    """Fresh (warm-up, measured, reserve) sets of ``per`` requests each from the replay file at
    ``path`` (written by make_replay.py with another seed when missing)."""
    if not path.exists():
        import subprocess
        subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu/make_replay.py"), str(path), "--n", "2400",
                        "--seed", "1"], check=True)
    reqs = _replayset.load(str(path)).requests
    per = min(per, len(reqs))
    w, n = spec.replay.warmup, spec.replay.requests or 96
    return [(c[:w], c[w:w + n], c[w + n:]) for c in (reqs[i:i + per] for i in range(0, len(reqs) - per + 1, per))]


def main(argv=None) -> int:
    with graceful_stop():
        return _main(argv)


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec")
    ap.add_argument("--configs", help="JSON list of speculative configs (null = no speculation)")
    ap.add_argument("--grid", nargs="*", help="METHOD:K,K,... (and 'none') from the spec's space")
    ap.add_argument("--out", required=True)
    ap.add_argument("--done", nargs="*", default=[], help="JSONL files of configurations already measured")
    ap.add_argument("--label", default="", help="experiment label (rows with a label never count as grid points)")
    ap.add_argument("--log-dir", default="/tmp/h200/logs/points")
    ap.add_argument("--home", default="/tmp/h200/home")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="end within this many seconds: start a server only when the longest start of this call "
                         "(--first-start-s before any) still fits")
    ap.add_argument("--first-start-s", type=float, default=150.0,
                    help="what a start is expected to take before this call has timed one (the H200 rounds: "
                         "53-145 s for none and ngram, the first of a machine the longest)")
    ap.add_argument("--protocol", default=None,
                    help=f"count only --done rows measured under this protocol ({PROTOCOL!r}: filled windows)")
    ap.add_argument("--starts", type=int, default=1,
                    help="measure each config until it has this many measured starts (grid: counting --done rows)")
    ap.add_argument("--equivalence", action="store_true",
                    help="replay the study's greedy equivalence requests after each start and keep their outputs, "
                         "texts and (no speculation) log-probabilities in the row, for judge_points.py")
    ap.add_argument("--windows", type=int, default=1,
                    help="steady windows per start, one after another on the same server (the first is the row's)")
    ap.add_argument("--windows-replay", default="/tmp/h200/replay-windows.jsonl",
                    help="fresh prompts for windows 2..N (written when missing)")
    args = ap.parse_args(argv)

    t_start = time.monotonic()
    spec = load_spec(args.spec)
    command = list(spec.engine.command)
    caps = probe(python_for(command, spec.engine.python), spec.engine.env, cache_dir=Path(args.home) / "cache")
    space = SearchSpace.build(spec.space, caps)
    configs: list[dict | None] = json.loads(args.configs) if args.configs else []
    for item in args.grid or []:
        if item == "none":
            configs.append(None)
            continue
        method, ks = item.split(":")
        configs += [space.config_from_params(space.params_for(method, int(k))) for k in ks.split(",")]
    rs = _replayset.load(spec.replay.path)
    windows: list[dict] = []
    if args.windows > 1:
        repeat_windows(args.windows, window_slices(Path(args.windows_replay), spec), windows)
    warmup, search, _ = split_requests(spec, rs)
    reserve = reserve_requests(spec, rs) if spec.replay.mode == "profile" else []
    more = window_requests(spec, rs)  # the spec's own replay.windows, pooled into the row's figures
    equivalence = _trial.equivalence_requests(spec, search, caps) if args.equivalence else []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    have = done_counts([out, *map(Path, args.done)], spec.workload, spec.model, args.protocol) if not args.label else {}
    # every config's first start before any config's second: a deadline then cuts repeats, not coverage
    order = [(s, cfg) for s in range(args.starts) for cfg in configs]
    took: list[float] = []
    if _trial.preload_next(spec, command[0]):  # engine.preload: the first start's process imported ahead too
        _preload.POOL.idle()
    for i, (start_no, cfg) in enumerate(order):
        key = canonical(cfg)
        if have.get(key, 0) > start_no:
            print(f"skip (measured {have[key]}x): {key}", flush=True)
            continue
        # a start begun late runs past the command's limit, which kills it and lets the machine go
        # cold before the next command (round 11): begin one only when the longest so far still fits
        need = max(took, default=args.first_start_s)
        if args.deadline_s is not None and time.monotonic() - t_start + need > args.deadline_s:
            print(f"deadline: not starting {key} (a start takes up to {need:.0f} s)", flush=True)
            break
        log = Path(args.log_dir) / f"{spec.workload}-{args.label or 'grid'}-{int(time.time())}.log"
        # a no-speculation row is shared by the workloads of its target (done_counts); another target's is its own
        row = {"workload": spec.workload if cfg or spec.model != TARGET else "*", "spec_workload": spec.workload, "label": args.label,
               "model": spec.model, "start_no": start_no + 1, "config_key": key, "config": cfg, "run_config": spec.run_config(cfg),
               "benchmark_only": spec.benchmark_only(), "replay_digest": rs.digest, "vllm_version": caps.version,
               **({"protocol": PROTOCOL, "reserve": len(reserve)} if reserve else {}),
               "at": time.time()}
        t0 = time.monotonic()
        windows.clear()
        try:
            m = measure(spec, cfg, search, warmup, log, command,
                        extra_args=caps.per_request_metrics_args(cfg is not None), reserve=reserve,
                        windows=more, last=i == len(order) - 1,
                        **({"equivalence": equivalence, "caps": caps} if args.equivalence else {}))
            row.update(ok=True, tpot=_measure.summarize(m.tpot_ms, spec.objective.statistic) if m.tpot_ms else None,
                       tpot_source=m.tpot_source, start_seconds=m.start_seconds, wall_seconds=m.wall_seconds,
                       timeline=m.timeline,
                       levels=m.levels, summary=m.summary, spec_delta=m.spec_delta, argv=m.argv,
                       **({"outputs": m.outputs, "texts": m.texts, "token_ids": m.token_ids, "logprobs": m.logprobs,
                           "engine_noise": m.engine_noise} if args.equivalence else {}))
        except TrialFailed as e:
            row.update(ok=False, error=e.reason)
        took.append(time.monotonic() - t0)
        if args.windows > 1:
            row["windows"] = list(windows)
        row["log_lines"] = log_lines(log)
        with out.open("a") as fh:
            fh.write(json.dumps(row, default=str) + "\n")
        if row.get("ok") and not args.label:
            have[key] = have.get(key, 0) + 1
        per_level = {lv: round(d.get("tpot") or 0, 3) for lv, d in (row.get("levels") or {}).items()}
        print(f"{args.label or 'grid'} {key}: {row.get('tpot') if row.get('ok') else row.get('error')} "
              f"per level {per_level} ({time.monotonic() - t0:.0f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
