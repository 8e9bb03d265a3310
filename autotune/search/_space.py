"""The search space: what the spec allows, minus what the installed engine cannot run.

A candidate is a plain speculative config dict (exactly what vLLM's ``--speculative-config``
gets; the llama.cpp engine turns the same dict into llama-server flags), or
``None`` for the no-speculation baseline. Optuna parameters are named per method
(``ngram.k``, ``suffix.max_tree_depth``...) so that conditional parameters keep one
distribution each, which TPE needs.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

from autotune.core._methods import ADAPTIVE_KNOBS
from autotune.core._spec import SpaceSpec
from autotune.engines._probe import Capabilities
from autotune.search._bands import BANDS_KEY

NONE = "none"

NGRAM_METHODS = ("ngram", "ngram_gpu")
"""vLLM's prompt-lookup proposers. ``ngram`` matches on the host CPU, so vLLM turns asynchronous
scheduling off and every step waits for it; ``ngram_gpu`` (vLLM 0.25 on) matches on the GPU and
keeps it on. Neither repeats reliably from start to start on the H200: about 10% each on one
machine (docs/benchmarks.md, rounds 12 and 13). Both take ``space.ngram``'s windows; each keeps
its own Optuna parameters (``ngram_gpu.window``), as their costs and acceptance counters differ."""


def canonical(config: dict | None) -> str:
    """A stable key for a config: used to find repeats and to compare with the incumbent."""
    return json.dumps(config, sort_keys=True) if config else NONE


def label(config: dict | None, none: str = "none") -> str:
    """A config in a few words, for logs, progress lines, reports and messages:
    ``ngram K=8 bands=1-4:8,5-32:0 w=1-3``, ``draft_model K=4 <model folder>``."""
    if not config:
        return none
    s = f"{config['method']} K={config.get('num_speculative_tokens')}"
    if config.get(BANDS_KEY):
        s += " bands=" + ",".join(f"{a}-{b}:{k}" for a, b, k in config[BANDS_KEY])
    if config["method"] in NGRAM_METHODS and "prompt_lookup_min" in config:
        s += f" w={config['prompt_lookup_min']}-{config['prompt_lookup_max']}"
    if config.get("model"):
        s += f" {str(config['model']).rstrip('/').rsplit('/', 1)[-1]}"
    for knob in ("p_min", "n_min"):
        if config.get(f"draft_{knob}") is not None:
            s += f" {knob}={config[f'draft_{knob}']}"
    for key, value in sorted(extra_knobs(config).items()):
        s += f" {_SHORT.get(key, key)}={_word(value)}"
    return s


_SHORT = {"enable_adaptive_verification": "adaptive", "rejection_sample_method": "rejection",
          "draft_sample_method": "draft_sampling", "disable_padded_drafter_batch": "no_padded_batch"}
"""Shorter names of some knobs in a config's label."""


def _word(value) -> str:
    return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) else str(value)


BASE_KEYS = frozenset({"method", "num_speculative_tokens", "model", BANDS_KEY, "prompt_lookup_min",
                       "prompt_lookup_max", "suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor",
                       "suffix_decoding_min_token_prob", "draft_p_min", "draft_n_min"})
"""Config keys of the methods with spec fields of their own: every other key is an entry's knob."""


def extra_knobs(config: dict | None) -> dict:
    """The knobs of ``config`` beyond K, the drafter, the bands and the n-gram and suffix limits:
    what an entry (``space.entries``) adds, e.g. ``enable_adaptive_verification``."""
    return {k: v for k, v in (config or {}).items() if k not in BASE_KEYS}



def knee(per_position_rates: list[float], share: float = 0.9) -> int | None:
    """The smallest K whose accepted tokens per drafted step keep ``share`` of those of all the
    positions given (a run at K_max gives every smaller K's); None without acceptance."""
    total = sum(per_position_rates)
    if total <= 0:
        return None
    acc = 0.0
    for k, r in enumerate(per_position_rates, 1):
        acc += r
        if acc >= share * total:
            return k
    return len(per_position_rates)

_SUFFIX_PARAMS = (("max_tree_depth", "suffix_decoding_max_tree_depth", int),
                  ("max_spec_factor", "suffix_decoding_max_spec_factor", float),
                  ("min_token_prob", "suffix_decoding_min_token_prob", float))
"""suffix's Optuna parameters (``suffix.<short>``), their SpeculativeConfig fields and types."""


@dataclass
class SearchSpace:
    """Each method in the spec's one entry form (``SpaceSpec.entry``): K, then one categorical
    Optuna parameter per knob. The parameters of the methods with spec fields of their own keep the
    names they had (``ngram.window``, ``suffix.max_tree_depth``, ``draft_model.model``), so studies
    in existing storages resume; an entry's further knobs are ``<method>.<field>``."""

    spec: SpaceSpec
    methods: list[str]
    dropped: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, spec: SpaceSpec, caps: Capabilities) -> "SearchSpace":
        methods, dropped = [], {}
        for m in spec.methods:
            reason = caps.check(m)
            if reason:
                dropped[m] = reason
            else:
                methods.append(m)
        return cls(spec=spec, methods=methods, dropped=dropped)

    def _ngram_windows(self, method: str = "ngram") -> list[str]:
        knobs = self.spec.entry(method).knobs
        return [f"{lo}-{hi}" for lo in knobs["prompt_lookup_min"] for hi in knobs["prompt_lookup_max"] if lo <= hi]

    def choices(self, method: str, *, llamacpp_knobs: bool = True) -> dict[str, list]:
        """Optuna parameter -> values of every knob of ``method`` but K, in the order candidates
        are enumerated (the first value of each is the method's first configuration).
        ``llamacpp_knobs=False`` leaves out llama.cpp's draft knobs, which the candidate list
        does not enumerate (each is tried only where the sampler proposes it)."""
        entry = self.spec.entry(method)
        out: dict[str, list] = {}
        if method in NGRAM_METHODS:
            out[f"{method}.window"] = self._ngram_windows(method)
        elif method == "suffix":
            for short, key, _ in _SUFFIX_PARAMS:
                out[f"suffix.{short}"] = list(entry.knobs[key])
        if entry.models:
            out[f"{method}.model"] = list(entry.models)
        if method == "draft_model" and llamacpp_knobs:
            for knob in ("p_min", "n_min"):
                if getattr(self.spec, f"draft_{knob}"):
                    out[f"draft_model.{knob}"] = list(getattr(self.spec, f"draft_{knob}"))
        for knob, values in self.spec.extra_knobs(method).items():
            out[f"{method}.{knob}"] = values
        return out

    def knob_combinations(self, method: str) -> list[dict]:
        """Every combination of ``method``'s knob parameters (``choices``, without llama.cpp's
        draft knobs), the first values first."""
        ch = self.choices(method, llamacpp_knobs=False)
        return [dict(zip(ch, combo)) for combo in itertools.product(*ch.values())]

    def config_from_params(self, params: dict) -> dict | None:
        """Turn Optuna params (as suggested or enqueued) into a speculative config."""
        method = params["method"]
        if method == NONE:
            return None
        k = int(params[f"{method}.k"])
        cfg: dict = {"method": method, "num_speculative_tokens": k}
        ch = self.choices(method)
        if method in NGRAM_METHODS:
            lo, hi = params.get(f"{method}.window", ch[f"{method}.window"][0]).split("-")
            cfg.update(prompt_lookup_min=int(lo), prompt_lookup_max=int(hi))
        elif method == "suffix":
            for short, key, cast in _SUFFIX_PARAMS:
                cfg[key] = cast(params.get(f"suffix.{short}", ch[f"suffix.{short}"][0]))
        if f"{method}.model" in ch:
            cfg["model"] = params.get(f"{method}.model", ch[f"{method}.model"][0])
        if method == "draft_model":
            for knob in ("p_min", "n_min"):  # llama.cpp's draft knobs, only when the spec searches them
                values = ch.get(f"draft_model.{knob}")
                if values:
                    cfg[f"draft_{knob}"] = type(values[0])(params.get(f"draft_model.{knob}", values[0]))
        for knob in self.spec.extra_knobs(method):
            name = f"{method}.{knob}"
            cfg[knob] = params.get(name, ch[name][0])
        return cfg

    def suggest(self, trial) -> dict | None:
        """Define-by-run: the method first, then that method's own knobs."""
        method = trial.suggest_categorical("method", [NONE, *self.methods])
        if method == NONE:
            return None
        kr = self.spec.k_range(method)
        trial.suggest_int(f"{method}.k", kr.min, kr.max)
        for name, values in self.choices(method).items():
            trial.suggest_categorical(name, values)
        return self.config_from_params(trial.params)

    def params_for(self, method: str, k: int | None = None) -> dict:
        """Params to enqueue for one method (default: its largest K, whose per-position
        acceptance counters also tell the acceptance of every smaller K)."""
        if method == NONE:
            return {"method": NONE}
        kr = self.spec.k_range(method)
        params: dict = {"method": method, f"{method}.k": kr.max if k is None else k}
        if method in NGRAM_METHODS:
            params[f"{method}.window"] = self._ngram_windows(method)[0]
        for knob, adaptive in ADAPTIVE_KNOBS.items():  # the static arm first: its counters predict other Ks
            static = [v for v in self.spec.extra_knobs(method).get(knob, []) if v != adaptive]
            if static:
                params[f"{method}.{knob}"] = static[0]
        return params

    def knee_k(self, method: str, per_position_rates: list[float], share: float = 0.9) -> int | None:
        """The smallest K that keeps ``share`` of the accepted tokens per drafted step seen at the
        largest K. One run at K_max gives per-position acceptance, hence the acceptance of every
        smaller K: positions past the knee add verification cost and hardly any tokens, so the
        knee is the next configuration worth a server start."""
        kr = self.spec.k_range(method)
        k = knee(list(per_position_rates)[: kr.max], share)
        return None if k is None else max(kr.min, k)

    def size(self) -> int:
        """Number of distinct candidates, the baseline included: the search stops when all are seen."""
        n = 1
        for m in self.methods:
            kr = self.spec.k_range(m)
            combos = 1
            for values in self.choices(m).values():
                combos *= len(values)
            n += (kr.max - kr.min + 1) * combos
        return n


def params_of(config: dict, space: SearchSpace) -> dict:
    """Optuna params that ``SearchSpace.suggest`` turns back into ``config``."""
    method = config["method"]
    params = {"method": method, f"{method}.k": config.get("num_speculative_tokens", 1)}
    if method in NGRAM_METHODS:
        params[f"{method}.window"] = f"{config.get('prompt_lookup_min', 5)}-{config.get('prompt_lookup_max', 5)}"
    elif method == "suffix":
        for short, key, _ in _SUFFIX_PARAMS:
            if key in config:
                params[f"suffix.{short}"] = config[key]
    if "model" in config:
        params[f"{method}.model"] = config["model"]
    if method == "draft_model":
        for knob in ("p_min", "n_min"):
            if f"draft_{knob}" in config:
                params[f"draft_model.{knob}"] = config[f"draft_{knob}"]
    for knob in space.spec.extra_knobs(method) if method in space.spec.methods else ():
        if knob in config:
            params[f"{method}.{knob}"] = config[knob]
    return params


def in_space(space: SearchSpace, params: dict) -> bool:
    """Whether enqueued params lie inside the distributions ``space.suggest`` declares (Optuna
    refuses a categorical value outside its choices)."""
    method = params["method"]
    if method not in space.spec.methods:
        return False
    kr = space.spec.k_range(method)
    if not kr.min <= int(params[f"{method}.k"]) <= kr.max:
        return False
    choices = space.choices(method)
    return all(_member(params[name], values) for name, values in choices.items() if name in params)


def _member(value, values: list) -> bool:
    """``value`` is one of ``values`` with its type (True is not 1 to Optuna's categoricals)."""
    return any(value == v and type(value) is type(v) or value == v and not isinstance(v, bool)
               and not isinstance(value, bool) for v in values)
