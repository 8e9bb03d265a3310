"""Engines as plug-ins: what the study needs from a serving engine, one entry per engine.

Each engine says how to probe itself (version, speculative methods, knobs), turn a candidate
into argv, start/stop/health-check a server (``VllmServer`` runs any OpenAI-compatible server
that answers ``/health``; the engine gives its name and its error-line reader), read its
metrics into the common per-position counters (``_metrics.ALIASES``), read its per-request TPOT,
what its log notes mean (``_serverlog.Pattern`` registry), and what a recommendation tells an
SRE to deploy. A study spec's ``engine.kind`` picks the entry (default ``vllm``); the study,
search, decision and trust code only talk to this interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from autotune.engines import _engine, _invariance, _llamacpp, _probe, _serverlog, _startup
from autotune.engines._probe import Capabilities


@dataclass(frozen=True)
class Engine:
    kind: str
    name: str
    """the engine for people: ``vLLM``, ``llama.cpp``"""
    server: str
    """its server in messages: ``vllm serve``, ``llama-server``"""
    probe: Callable[[list[str], str | None, dict, Path | None], Capabilities]
    """(command, python, env, cache_dir) -> Capabilities"""
    build_argv: Callable[..., list[str]]
    """(command, model, serve_args, config, port, served_model_name) -> argv"""
    error_line: Callable[[str], str | None]
    log_patterns: dict
    request_tpot_ms: Callable[[dict | None], float | None]
    """the engine's own TPOT of one request, from the response's server-side figures"""
    deploy_fields: Callable[[dict | None], dict]
    """recommendation fields beyond ``speculative_config`` (the flags to deploy)"""
    batch_invariant: Callable[[dict, dict, Capabilities | None], bool] = lambda serve_args, env, caps: True
    """(serve_args, the server's environment (the tuner's under the spec's engine env), the probed
    capabilities or None where not known) ->
    whether greedy outputs of concurrent requests do not depend on which requests share a batch;
    where they do, the equivalence check replays one request at a time"""
    invariant_how: str | None = None
    """how a spec makes the engine batch-invariant (study notes say it where it is not)"""
    server_env: Callable[[dict | None, dict, Path, str], dict] = lambda config, env, home, cache: {}
    """(run config, the spec's engine env, autotune's home, the compile-cache setting) -> environment
    a server start of that configuration gets on top of the spec's (vLLM: its compile cache)"""
    logprobs: bool = False
    """whether its OpenAI endpoints return top log-probabilities per generated token: the baseline's
    greedy replays then ask for them, for the equivalence guard's near-tie margins"""
    start_milestones: tuple | None = None
    """the log lines that end each start-up phase (``_startup.VLLM``); None: the start is one phase"""
    equivalence_body: dict | None = None
    """request fields the equivalence replays add (llama.cpp: no prompt cache, since a replayed
    prompt would reuse KV computed in another batch)"""

    def server_kwargs(self) -> dict:
        """What ``VllmServer`` (the lifecycle of any engine's server) takes from the engine."""
        return {"name": self.server, "error_line": self.error_line}


def _vllm_probe(command, python, env, cache_dir):
    return _probe.probe(_probe.python_for(command, python), env, cache_dir=cache_dir)


def _vllm_tpot(server_metrics: dict | None) -> float | None:
    v = (server_metrics or {}).get("mean_itl_ms")
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


VLLM = Engine(kind="vllm", name="vLLM", server="vllm serve", probe=_vllm_probe, build_argv=_engine.build_argv,
              error_line=_engine.error_line, log_patterns=_serverlog.PATTERNS, request_tpot_ms=_vllm_tpot,
              deploy_fields=lambda config: {}, server_env=_engine.compile_cache_env,
              batch_invariant=_invariance.batch_invariant, invariant_how=_invariance.HOW, logprobs=True,
              start_milestones=_startup.VLLM)
LLAMACPP = Engine(kind=_llamacpp.KIND, name="llama.cpp", server=_llamacpp.SERVER,
                  probe=lambda command, python, env, cache_dir: _llamacpp.probe(command, env),
                  build_argv=_llamacpp.build_argv, error_line=_llamacpp.error_line,
                  log_patterns=_llamacpp.PATTERNS, request_tpot_ms=_llamacpp.request_tpot_ms,
                  deploy_fields=_llamacpp.deploy_fields, batch_invariant=_llamacpp.batch_invariant,
                  invariant_how="serve_args.parallel: 1", equivalence_body=_llamacpp.EQUIVALENCE_BODY)

ENGINES: dict[str, Engine] = {VLLM.kind: VLLM, LLAMACPP.kind: LLAMACPP}


def register(engine: Engine) -> None:
    ENGINES[engine.kind] = engine


def get(kind: str | None) -> Engine:
    try:
        return ENGINES[kind or "vllm"]
    except KeyError:
        raise ValueError(f"unknown engine kind {kind!r}; known: {', '.join(ENGINES)}") from None


def for_spec(spec) -> Engine:
    return get(getattr(spec.engine, "kind", "vllm"))


def request_tpot_ms(server_metrics: dict | None) -> float | None:
    """The engine's own TPOT of one request, whichever engine answered (the figures differ in
    name: vLLM's ``metrics.mean_itl_ms``, llama-server's ``timings``)."""
    for e in ENGINES.values():
        v = e.request_tpot_ms(server_metrics)
        if v is not None:
            return v
    return None
