"""Experiment: give vLLM 0.25.0's draft_model drafter CUDA graphs.

In vLLM 0.25.0 ``GPUModelRunner._check_and_update_cudagraph_mode`` initializes the drafter's
CUDA-graph dispatcher keys only for ``use_eagle()`` / ``uses_extract_hidden_states()`` methods.
``DraftModelProposer`` never gets keys, so ``CudagraphDispatcher.dispatch`` returns
``CUDAGraphMode.NONE`` for every drafter forward (capture included): the draft model runs without
CUDA graphs, one launch-bound forward per draft token. This script adds ``uses_draft_model()`` to
that condition in an installed vLLM tree (``--revert`` restores the original), so one server
start can show what the missing graphs cost. It is a measurement aid, not a fix to deploy.

    python benchmarks/gpu/patch_drafter_cudagraph.py /tmp/site/vllm [--revert]
"""

from __future__ import annotations

import sys
from pathlib import Path

OLD = """        if self.speculative_config and (
            self.speculative_config.use_eagle()
            or self.speculative_config.uses_extract_hidden_states()
        ):
            assert isinstance(
                self.drafter,
                EagleProposer
                | DFlashProposer
                | ExtractHiddenStatesProposer
                | Gemma4Proposer,
            )
            self.drafter.initialize_cudagraph_keys(cudagraph_mode)
"""
NEW = """        if self.speculative_config and (
            self.speculative_config.use_eagle()
            or self.speculative_config.uses_extract_hidden_states()
            or self.speculative_config.uses_draft_model()
        ):
            assert isinstance(
                self.drafter,
                EagleProposer
                | DFlashProposer
                | DraftModelProposer
                | ExtractHiddenStatesProposer
                | Gemma4Proposer,
            )
            self.drafter.initialize_cudagraph_keys(cudagraph_mode)
"""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    revert = "--revert" in argv
    root = Path([a for a in argv if a != "--revert"][0])
    f = root / "v1" / "worker" / "gpu_model_runner.py"
    text = f.read_text()
    src, dst = (NEW, OLD) if revert else (OLD, NEW)
    if dst in text and src not in text:
        print(f"{f}: already {'original' if revert else 'patched'}")
        return 0
    if text.count(src) != 1:
        print(f"{f}: the expected block is not there (another vLLM version?)")
        return 1
    f.write_text(text.replace(src, dst))
    for pyc in (f.parent / "__pycache__").glob("gpu_model_runner.*.pyc"):
        pyc.unlink()
    print(f"{f}: {'reverted' if revert else 'patched'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
