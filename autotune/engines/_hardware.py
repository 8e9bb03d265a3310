"""What the trials run on: accelerator model and count, part of every study's fingerprint.

TPOT measured on an H100 says nothing about an H200, so trials from different hardware never
pool into one decision: the study is named after the hardware too, and a worker on other
hardware that tries to join a study is refused (``_trials.HardwareMismatch``).

Detected, first answer wins: ``AUTOTUNE__HARDWARE`` (any string; for accelerators this cannot
detect, or containers without ``nvidia-smi``); the NVIDIA GPUs ``nvidia-smi`` lists, restricted to
``CUDA_VISIBLE_DEVICES`` (the engine's environment first, then ours) when it names indices; else
the CPU model from ``/proc/cpuinfo`` and the core count. Examples: ``2x NVIDIA H200``,
``cpu: Intel(R) Xeon(R) Platinum 8481C x2``.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path


def identity(env: dict[str, str] | None = None, explicit: str | None = None) -> str:
    if explicit:
        return explicit.strip()
    visible = (env or {}).get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    gpus = _nvidia_gpus(visible)
    if gpus:
        return " + ".join(f"{n}x {name}" for name, n in sorted(Counter(gpus).items()))
    return f"cpu: {_cpu_model()} x{os.cpu_count() or 1}"


@functools.lru_cache(maxsize=8)
def _nvidia_gpus(visible: str | None) -> tuple[str, ...]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run([exe, "--query-gpu=index,name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if out.returncode != 0:
        return ()
    rows = []
    for line in out.stdout.splitlines():
        idx, _, name = line.partition(",")
        if name.strip():
            rows.append((idx.strip(), name.strip()))
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        if all(v.isdigit() for v in wanted):
            rows = [r for r in rows if r[0] in wanted]
    return tuple(name for _, name in rows)


@functools.lru_cache(maxsize=1)
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "cpu model", "Processor") and value.strip():
                return value.strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown"
