"""Checks that run after the probe and before anything is written or started.

A nightly run that would fail on its first server start, or half-way through the search, must
instead fail at once, with a message that names the spec file, the field and its line, and
leave no study, trial or recommendation behind (exit code 2). Checked here:

- local paths that do not exist: ``model``, ``space.draft_models``, ``space.eagle_heads``,
  ``space.entries.<method>.models``
  (a value that starts with ``./``, ``../``, ``/``, ``~`` or ``$`` is a path; others are hub ids);
- fields the installed vLLM does not have (the probe lists ``SpeculativeConfig`` fields):
  the incumbent's keys and every key the search would put in a ``--speculative-config`` of a
  method it kept, each knob of ``space.entries`` by its own name (serve arguments the probe
  does not list only warn, see ``check_fields``);
- the replay set: readable, well-formed, enough requests for the concurrency.
"""

from __future__ import annotations

from pathlib import Path

from autotune.core._inputs import read_input
from autotune.core._spec import SpecError, StudySpec, _line_of
from autotune.engines._probe import Capabilities
from autotune.search._space import SearchSpace
from autotune.search._study import split_requests, window_requests
from autotune.traffic import _replayset

_PATHLIKE = (".", "/", "~", "$")
# the spec field that puts each speculative-config key into a trial's config
_FIELD_OF_KEY = {
    "num_speculative_tokens": ("space", "k"),
    "prompt_lookup_min": ("space", "ngram", "prompt_lookup_min"),
    "prompt_lookup_max": ("space", "ngram", "prompt_lookup_max"),
    "suffix_decoding_max_tree_depth": ("space", "suffix", "max_tree_depth"),
    "suffix_decoding_max_spec_factor": ("space", "suffix", "max_spec_factor"),
    "suffix_decoding_min_token_prob": ("space", "suffix", "min_token_prob"),
    "draft_p_min": ("space", "draft_p_min"),
    "draft_n_min": ("space", "draft_n_min"),
}


class _Where:
    """Raw YAML (values as written, before path expansion) and line numbers of the spec file."""

    def __init__(self, spec: StudySpec):
        import yaml

        self.path = spec.source or "(spec)"
        try:
            text = read_input(spec.source, "study spec").decode("utf-8")
            self.data, self.root = yaml.safe_load(text) or {}, yaml.compose(text)
        except Exception:
            self.data, self.root = {}, None

    def raw(self, *loc):
        node = self.data
        for p in loc:
            if isinstance(node, dict) and p in node:
                node = node[p]
            elif isinstance(node, list) and isinstance(p, int) and p < len(node):
                node = node[p]
            else:
                return None
        return node

    def error(self, loc: tuple, msg: str) -> SpecError:
        line = _line_of(self.root, loc) if self.root is not None else None
        field = ".".join(str(p) for p in loc)
        return SpecError(f"{self.path}:{line}: field '{field}': {msg}" if line else f"{self.path}: field '{field}': {msg}")


def check_paths(spec: StudySpec) -> None:
    """Local model paths must exist (checked before the probe: no vLLM needed to say so)."""
    w = _Where(spec)
    raw_model = w.raw("model")
    if isinstance(raw_model, str) and raw_model.startswith(_PATHLIKE) and not Path(spec.model).exists():
        raise w.error(("model",), f"no such file or directory: {spec.model} (a local path; a hub id has no "
                                  "leading ./, ../, / or ~)")
    for field, method_names, values in (("draft_models", ("draft_model",), spec.space.draft_models),
                                        ("eagle_heads", ("eagle", "eagle3"), spec.space.eagle_heads)):
        if not set(method_names) & set(spec.space.methods):
            continue
        for i, value in enumerate(values):
            raw = w.raw("space", field, i)
            if isinstance(raw, str) and raw.startswith(_PATHLIKE) and not Path(value).exists():
                raise w.error(("space", field, i), f"no such file or directory: {value}")
    for method, entry in spec.space.entries.items():
        for i, value in enumerate(entry.models):
            raw = w.raw("space", "entries", method, "models", i)
            if isinstance(raw, str) and raw.startswith(_PATHLIKE) and not Path(value).exists():
                raise w.error(("space", "entries", method, "models", i), f"no such file or directory: {value}")


def check_fields(spec: StudySpec, caps: Capabilities, space: SearchSpace) -> list[str]:
    """Fields the spec asks for that this vLLM lacks: a clear error instead of failed starts.

    SpeculativeConfig's dataclass fields are the whole truth about speculative keys, so a
    missing one is an error. ``vllm serve`` also takes options that are not EngineArgs or
    FrontendArgs fields (``--headless``...), so a serve argument the probe does not list is
    only a warning (returned): if vLLM refuses it, the baseline fails with vLLM's message."""
    w = _Where(spec)
    warnings = []
    if caps.serve_fields:
        known = set(caps.serve_fields)
        for key in spec.engine.serve_args:
            name = key.replace("-", "_")
            if name not in known:
                warnings.append(str(w.error(("engine", "serve_args", key),
                                            f"{caps.engine_name} {caps.version} may have no "
                                            f"`--{name.replace('_', '-')}` server option (not among the "
                                            "probe's server fields)")))
    if not caps.fields:
        return warnings
    fields = set(caps.fields) | {"method"}
    for key in (spec.incumbent or {}):
        if key not in fields:
            raise w.error(("incumbent", key), f"vLLM {caps.version} has no SpeculativeConfig field {key!r} "
                                              "(per the capability probe)")
    for method in space.methods:
        entry = spec.space.entries.get(method)
        for key in caps.missing_knobs(entry.knobs if entry else {}):  # the entry's knobs, each by name
            raise w.error(("space", "entries", method, "knobs", key),
                          f"{caps.engine_name} {caps.version} has no SpeculativeConfig field {key!r} (per the "
                          f"capability probe): remove the knob from {method}'s entry or upgrade vLLM")
        sample = space.config_from_params(space.params_for(method)) or {}
        for key in sample:
            if key not in fields:
                loc = _FIELD_OF_KEY.get(key, ("space", "methods"))
                raise w.error(loc, f"method {method} needs SpeculativeConfig field {key!r}, which "
                                   f"{caps.engine_name} {caps.version} does not have (per the capability probe); remove "
                                   f"{method} from space.methods or upgrade vLLM")
    return warnings


def check_replay(spec: StudySpec):
    """The replay set loads and is large enough; returns it. ReplaySetError/ValueError name the file."""
    rs = _replayset.load(spec.replay.path)
    warmup, search, _ = split_requests(spec, rs)
    mode = spec.replay.mode
    if mode == "open":  # every request is sent at its recorded time
        lines = {r.id: i for i, r in enumerate(rs.requests, 1)}
        missing = [r.id for r in rs.requests if r.ts is None]
        if missing:
            raise ValueError(f"{rs.path}:{lines[missing[0]]}: replay.mode is 'open' but request {missing[0]!r} "
                             f"has no recorded arrival time (ts); {len(missing)} of {len(rs.requests)} lack one")
    elif mode == "profile" and spec.replay.levels:  # one warm-up wave + at least one measured request per level
        need = sum(spec.replay.levels) + len(spec.replay.levels)
        if len(warmup) + len(search) < need:
            raise ValueError(f"{rs.path}: replay.levels {spec.replay.levels} need at least {need} requests per "
                             f"server start (a warm-up wave and measured requests per level), "
                             f"replay.warmup + replay.requests give {len(warmup) + len(search)}")
    window_requests(spec, rs)  # replay.windows: the further windows' requests fit
    return rs
