"""The acceptance model: accepted tokens per drafted step for every K of a method and its knobs.

The K_max run's per-position counters give, for every K <= K_max of that method and knobs, the
accepted tokens per drafted step: ``S(K) = sum_{i<K} rate_i``; with the coverage ``c`` (how often
a step drafts, ``_observations.coverage_of``) the tokens per decode step are ``T(K) = 1 + c * S(K)``.
Beyond the largest K measured the rates are extrapolated geometrically (with the range "nothing
more" .. "as much as the last position"); where the counters lack generated tokens the coverage is
unknown and spans ``UNKNOWN_COVERAGE``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from autotune.core._methods import always_drafts
from autotune.search._observations import BANDS, Observation, decode_steps, k_of, level_k

UNKNOWN_COVERAGE = (0.4, 0.7, 1.0)
"""Coverage corners (lo, mid, hi) when the counters lack generated tokens (prompt lookup, suffix)."""


@dataclass
class Acceptance:
    """Accepted tokens per drafted step for each K, and how often a step drafts."""

    rates: list[float]
    coverage: tuple[float, float, float]
    scale: tuple[float, float, float] = (1.0, 1.0, 1.0)
    """borrowed from another group of the same method: a wide range around the donor's gain."""
    basis: str = ""

    def gain(self, k: int) -> tuple[float, float, float]:
        """(lo, mid, hi) of S(K) = expected accepted tokens per drafted step."""
        if k <= 0 or not self.rates:
            return (0.0, 0.0, 0.0)
        m = len(self.rates)
        known = sum(self.rates[:k])
        if k <= m:
            lo = mid = hi = known
        else:
            last = self.rates[-1]
            q = self.rates[-1] / self.rates[-2] if m >= 2 and self.rates[-2] > 0 else self.rates[0]
            q = min(max(q, 0.0), 1.0)
            extra = k - m
            tail = sum(last * q ** j for j in range(1, extra + 1))
            lo, mid, hi = known, known + tail, known + last * extra
        return (lo * self.scale[0], mid * self.scale[1], hi * self.scale[2])


def acceptance_of(obs: Sequence[Observation], method: str) -> Acceptance | None:
    """Pool the per-position counters of a group's runs (drafts-weighted), and its coverage."""
    acc: dict[int, float] = {}
    wts: dict[int, float] = {}
    drafts = steps = 0.0
    for o in obs:
        for d, n, k in _deltas_with_k(o):
            if k <= 0:
                continue
            rates = d.get("per_position_rates") or []
            w = float(d.get("drafts") or 0.0) or 1.0
            for i, r in enumerate(rates[:k]):
                acc[i] = acc.get(i, 0.0) + w * float(r)
                wts[i] = wts.get(i, 0.0) + w
            s = decode_steps(d, n)
            if s is not None and d.get("drafts") is not None:
                drafts += float(d["drafts"])
                steps += s
    if not wts:
        return None
    rates = [acc[i] / wts[i] for i in range(max(wts) + 1) if i in wts]
    for i in range(1, len(rates)):  # a token at position i needs all before it: non-increasing
        rates[i] = min(rates[i], rates[i - 1])
    if steps > 0:
        c = min(1.0, drafts / steps)
        cov = (c, c, c)
    else:
        cov = (1.0, 1.0, 1.0) if always_drafts(method) else UNKNOWN_COVERAGE
    return Acceptance(rates=rates, coverage=cov, basis=f"{len(rates)} positions measured")


def _deltas_with_k(o: Observation) -> list[tuple[dict, int | None, int]]:
    """(counters, requests, K in force) pieces of a run usable for acceptance: per level where a
    band schedule makes K differ by level, else the whole run."""
    if o.config and o.config.get(BANDS):
        return [(lv.delta, lv.requests, level_k(o.config, L)) for L, lv in o.levels.items() if lv.delta]
    if o.delta:
        return [(o.delta, o.requests, k_of(o.config))]
    return [(lv.delta, lv.requests, k_of(o.config)) for lv in o.levels.values() if lv.delta]
