"""Write a replay set of real prompts for SmolLM2-135M on the GPU: the demo's code-editing
requests (a stdlib function and one edit: rename, docstring, constant; the answer repeats most of
the function, which is what n-gram and suffix decoding feed on) or its chat requests (prose
questions and summaries), greedy, 96 output tokens, stopping at the model's end of turn.

The prompts come from this Python's standard library, so the set is written on this machine
and sent along (the GPU machine's Python is another version, with other functions); the rows
measured on it carry its digest (``replay_digest``).

    python benchmarks/gpu/make_real_replay.py code .gpu/replay/code-smollm2-gpu.jsonl --n 480
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.demo import _chattraffic, _codetraffic  # noqa: E402
from autotune.traffic import _replayset  # noqa: E402

KINDS = {"code": _codetraffic.requests, "chat": _chattraffic.requests}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=480, help="requests (code: at most about 500, chat: 265)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    bodies = KINDS[args.kind](args.n, seed=args.seed, max_tokens=args.max_tokens)
    reqs = [_replayset.ReplayRequest(id=f"{args.kind}-gpu-{i:04d}", endpoint="chat", body=b,
                                     tag=f"{args.kind}-smollm2") for i, b in enumerate(bodies)]
    path = _replayset.save(args.out, reqs)
    print(f"wrote {len(reqs)} {args.kind} requests to {path} (digest {_replayset.load(str(path)).digest})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
