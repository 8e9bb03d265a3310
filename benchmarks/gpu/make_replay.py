"""Write the H200 replay set: prompts of 512 words t<id>, which the Qwen3-shaped word-level
tokenizer of make_models.py (words t0..t151935) maps to exactly one token each; 128 output
tokens, temperature 0, ``ignore_eos`` so every request decodes the full 128 tokens.

    python benchmarks/gpu/make_replay.py /tmp/h200/replay.jsonl [--n 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=200, help="requests")
    ap.add_argument("--prompt-words", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as fh:
        for i in range(args.n):
            # ids below 151643 only: 151643.. are the pad/eos words of the tokenizer
            words = " ".join(f"t{rng.randrange(10, 151000)}" for _ in range(args.prompt_words))
            body = {"prompt": words, "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
            fh.write(json.dumps({"id": f"h200-{i:04d}", "endpoint": "completions", "body": body,
                                 "tag": "synthetic-512", "ts": None}) + "\n")
    print(f"wrote {args.n} requests to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
