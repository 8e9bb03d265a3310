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
    return s



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

@dataclass
class SearchSpace:
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

    def _ngram_windows(self) -> list[str]:
        s = self.spec.ngram
        return [f"{lo}-{hi}" for lo in s.prompt_lookup_min for hi in s.prompt_lookup_max if lo <= hi]

    def config_from_params(self, params: dict) -> dict | None:
        """Turn Optuna params (as suggested or enqueued) into a speculative config."""
        method = params["method"]
        if method == NONE:
            return None
        k = int(params[f"{method}.k"])
        cfg: dict = {"method": method, "num_speculative_tokens": k}
        if method in NGRAM_METHODS:
            lo, hi = params.get(f"{method}.window", self._ngram_windows()[0]).split("-")
            cfg.update(prompt_lookup_min=int(lo), prompt_lookup_max=int(hi))
        elif method == "suffix":
            s = self.spec.suffix
            cfg.update(
                suffix_decoding_max_tree_depth=int(params.get("suffix.max_tree_depth", s.max_tree_depth[0])),
                suffix_decoding_max_spec_factor=float(params.get("suffix.max_spec_factor", s.max_spec_factor[0])),
                suffix_decoding_min_token_prob=float(params.get("suffix.min_token_prob", s.min_token_prob[0])),
            )
        elif method == "draft_model":
            cfg["model"] = params.get("draft_model.model", self.spec.draft_models[0])
            for knob in ("p_min", "n_min"):  # llama.cpp's draft knobs, only when the spec searches them
                values = getattr(self.spec, f"draft_{knob}")
                if values:
                    cfg[f"draft_{knob}"] = type(values[0])(params.get(f"draft_model.{knob}", values[0]))
        elif method in ("eagle", "eagle3"):
            cfg["model"] = params.get(f"{method}.model", self.spec.eagle_heads[0])
        return cfg

    def suggest(self, trial) -> dict | None:
        """Define-by-run: the method first, then that method's own knobs."""
        method = trial.suggest_categorical("method", [NONE, *self.methods])
        if method == NONE:
            return None
        kr = self.spec.k_range(method)
        trial.suggest_int(f"{method}.k", kr.min, kr.max)
        if method in NGRAM_METHODS:
            trial.suggest_categorical(f"{method}.window", self._ngram_windows())
        elif method == "suffix":
            s = self.spec.suffix
            trial.suggest_categorical("suffix.max_tree_depth", s.max_tree_depth)
            trial.suggest_categorical("suffix.max_spec_factor", s.max_spec_factor)
            trial.suggest_categorical("suffix.min_token_prob", s.min_token_prob)
        elif method == "draft_model":
            trial.suggest_categorical("draft_model.model", self.spec.draft_models)
            for knob in ("p_min", "n_min"):
                if getattr(self.spec, f"draft_{knob}"):
                    trial.suggest_categorical(f"draft_model.{knob}", getattr(self.spec, f"draft_{knob}"))
        elif method in ("eagle", "eagle3"):
            trial.suggest_categorical(f"{method}.model", self.spec.eagle_heads)
        return self.config_from_params(trial.params)

    def params_for(self, method: str, k: int | None = None) -> dict:
        """Params to enqueue for one method (default: its largest K, whose per-position
        acceptance counters also tell the acceptance of every smaller K)."""
        if method == NONE:
            return {"method": NONE}
        kr = self.spec.k_range(method)
        params: dict = {"method": method, f"{method}.k": kr.max if k is None else k}
        if method in NGRAM_METHODS:
            params[f"{method}.window"] = self._ngram_windows()[0]
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
            ks = kr.max - kr.min + 1
            if m in NGRAM_METHODS:
                n += ks * len(self._ngram_windows())
            elif m == "suffix":
                s = self.spec.suffix
                n += ks * len(list(itertools.product(s.max_tree_depth, s.max_spec_factor, s.min_token_prob)))
            elif m == "draft_model":
                n += ks * len(self.spec.draft_models) * max(1, len(self.spec.draft_p_min)) \
                    * max(1, len(self.spec.draft_n_min))
            elif m in ("eagle", "eagle3"):
                n += ks * len(self.spec.eagle_heads)
            else:
                n += ks
        return n


def params_of(config: dict, space: SearchSpace) -> dict:
    """Optuna params that ``SearchSpace.suggest`` turns back into ``config``."""
    method = config["method"]
    params = {"method": method, f"{method}.k": config.get("num_speculative_tokens", 1)}
    if method in NGRAM_METHODS:
        params[f"{method}.window"] = f"{config.get('prompt_lookup_min', 5)}-{config.get('prompt_lookup_max', 5)}"
    elif method == "suffix":
        for p, key in (("max_tree_depth", "suffix_decoding_max_tree_depth"),
                       ("max_spec_factor", "suffix_decoding_max_spec_factor"),
                       ("min_token_prob", "suffix_decoding_min_token_prob")):
            if key in config:
                params[f"suffix.{p}"] = config[key]
    elif method in ("draft_model", "eagle", "eagle3"):
        params[f"{method}.model"] = config["model"]
        for knob in ("p_min", "n_min"):
            if f"draft_{knob}" in config:
                params[f"draft_model.{knob}"] = config[f"draft_{knob}"]
    return params


def in_space(space: SearchSpace, params: dict) -> bool:
    """Whether enqueued params lie inside the distributions ``space.suggest`` declares (Optuna
    refuses a categorical value outside its choices)."""
    method = params["method"]
    kr = space.spec.k_range(method)
    if not kr.min <= int(params[f"{method}.k"]) <= kr.max:
        return False
    choices = {**{f"{m}.window": space._ngram_windows() for m in NGRAM_METHODS},
               "suffix.max_tree_depth": space.spec.suffix.max_tree_depth,
               "suffix.max_spec_factor": space.spec.suffix.max_spec_factor,
               "suffix.min_token_prob": space.spec.suffix.min_token_prob,
               "draft_model.model": space.spec.draft_models,
               "draft_model.p_min": space.spec.draft_p_min, "draft_model.n_min": space.spec.draft_n_min,
               "eagle.model": space.spec.eagle_heads, "eagle3.model": space.spec.eagle_heads}
    return all(params[name] in values for name, values in choices.items() if name in params)
