"""The search space: what the spec allows, minus what the installed vLLM cannot run.

A candidate is a plain speculative config dict (exactly what ``--speculative-config`` gets), or
``None`` for the no-speculation baseline. Optuna parameters are named per method
(``ngram.k``, ``suffix.max_tree_depth``...) so that conditional parameters keep one
distribution each, which TPE needs.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

from ._probe import Capabilities
from ._spec import SpaceSpec

NONE = "none"


def canonical(config: dict | None) -> str:
    """A stable key for a config: used to find repeats and to compare with the incumbent."""
    return json.dumps(config, sort_keys=True) if config else NONE


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
        if method == "ngram":
            lo, hi = params.get("ngram.window", self._ngram_windows()[0]).split("-")
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
        if method == "ngram":
            trial.suggest_categorical("ngram.window", self._ngram_windows())
        elif method == "suffix":
            s = self.spec.suffix
            trial.suggest_categorical("suffix.max_tree_depth", s.max_tree_depth)
            trial.suggest_categorical("suffix.max_spec_factor", s.max_spec_factor)
            trial.suggest_categorical("suffix.min_token_prob", s.min_token_prob)
        elif method == "draft_model":
            trial.suggest_categorical("draft_model.model", self.spec.draft_models)
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
        if method == "ngram":
            params["ngram.window"] = self._ngram_windows()[0]
        return params

    def knee_k(self, method: str, per_position_rates: list[float], share: float = 0.9) -> int | None:
        """The smallest K that keeps ``share`` of the accepted tokens per drafted step seen at the
        largest K. One run at K_max gives per-position acceptance, hence the acceptance of every
        smaller K: positions past the knee add verification cost and hardly any tokens, so the
        knee is the next configuration worth a server start."""
        kr = self.spec.k_range(method)
        rates = list(per_position_rates)[: kr.max]
        total = sum(rates)
        if total <= 0:
            return None
        acc = 0.0
        for k, r in enumerate(rates, 1):
            acc += r
            if acc >= share * total:
                return max(kr.min, k)
        return kr.max

    def size(self) -> int:
        """Number of distinct candidates, the baseline included: the search stops when all are seen."""
        n = 1
        for m in self.methods:
            kr = self.spec.k_range(m)
            ks = kr.max - kr.min + 1
            if m == "ngram":
                n += ks * len(self._ngram_windows())
            elif m == "suffix":
                s = self.spec.suffix
                n += ks * len(list(itertools.product(s.max_tree_depth, s.max_spec_factor, s.min_token_prob)))
            elif m == "draft_model":
                n += ks * len(self.spec.draft_models)
            elif m in ("eagle", "eagle3"):
                n += ks * len(self.spec.eagle_heads)
            else:
                n += ks
        return n
