"""A synthetic speculative-decoding workload: exact TPOT, counters and noise for any config.

Tokens per decode step ``T = 1 + c * S(K)`` (per-position acceptance ``rates``, coverage ``c``),
step time ``base + overhead + per_k * K`` (per concurrency level), TPOT = step / T. The counters
are what vLLM's /metrics would show for that run, so the predictor sees realistic input.
"""

from __future__ import annotations

import random

from autotune.search._bands import BANDS_KEY, k_at
from autotune.search._observations import LevelObs, Observation


class Workload:
    def __init__(self, rates, coverage=0.8, base=10.0, overhead=1.0, per_k=1.2, noise=0.0, levels=None,
                 requests=24, out_tokens=64, band_overhead=0.0, step_extra=None, band_tax=0.0):
        self.rates, self.coverage = list(rates), coverage
        self.step_extra = step_extra or {}  # K -> extra step cost (ms): a cost that is not a line in K
        self.levels = levels or {4: (base, overhead, per_k)}
        self.noise, self.requests, self.out_tokens = noise, requests, out_tokens
        self.band_overhead = band_overhead
        self.band_tax = band_tax  # a schedule's step costs this share more than plain K (vLLM's graph downgrade)

    def k_at(self, config, level) -> int:
        if not config:
            return 0
        if config.get(BANDS_KEY):
            return k_at(config[BANDS_KEY], level, config["num_speculative_tokens"])
        return config["num_speculative_tokens"]

    def tpot(self, config, level) -> float:
        base, over, per_k = self.levels[level]
        k = self.k_at(config, level)
        if not config:
            return base
        if k == 0:
            return base * (1 + self.band_overhead)
        t = 1 + self.coverage * sum(self.rates[:k])
        tax = 1 + self.band_tax if config.get(BANDS_KEY) else 1.0
        return tax * (base + over + per_k * k + self.step_extra.get(k, 0.0)) / t

    def objective(self, config, weights) -> float:
        s = sum(weights.values())
        return sum(w * self.tpot(config, L) for L, w in weights.items()) / s

    def delta(self, config, level=None) -> dict:
        """Counters of a run over ``level`` (or every level), warm-up-free: what vLLM counts."""
        levels = [level] if level is not None else list(self.levels)
        n = self.requests * len(levels)
        drafts = acc = dtoks = 0.0
        per = [0.0] * max([self.k_at(config, L) for L in levels] + [0])
        for L in levels:
            k = self.k_at(config, L)
            t = 1 + (self.coverage * sum(self.rates[:k]) if k else 0.0)
            steps = (self.requests * (self.out_tokens - 1)) / t
            d = self.coverage * steps if k else 0.0
            drafts += d
            dtoks += d * k
            for i in range(k):
                per[i] += d * self.rates[i]
            acc += d * sum(self.rates[:k])
        return {"drafts": drafts, "draft_tokens": dtoks, "accepted_tokens": acc, "accepted_per_position": per,
                "generated_tokens": n * self.out_tokens, "preemptions": 0.0,
                "acceptance_length": 1 + acc / drafts if drafts else None,
                "per_position_rates": [p / drafts for p in per] if drafts else [0.0] * len(per),
                "requests": n}

    def observe(self, config, rng: random.Random | None = None, weights=None) -> Observation:
        rng = rng or random.Random(0)
        levels = {}
        for L in self.levels:
            v = self.tpot(config, L) * (1 + self.noise * rng.gauss(0, 1))
            levels[L] = LevelObs(v, self.delta(config, L) if len(self.levels) > 1 else None, self.requests)
        d = self.delta(config) if config else {"drafts": 0.0, "accepted_tokens": 0.0, "generated_tokens":
                                                self.requests * len(self.levels) * self.out_tokens,
                                                "accepted_per_position": [], "per_position_rates": []}
        if len(self.levels) == 1:
            (L,) = self.levels
            levels[L].delta = d
        return Observation(config=config, levels=levels, delta=d, requests=self.requests * len(self.levels))


def ngram(k: int, window=(1, 4)) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": window[0],
            "prompt_lookup_max": window[1]}
