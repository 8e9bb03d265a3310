"""Robust statistics for TPOT measurements on a noisy machine.

Why this module exists: on the tuning host, run-to-run coefficient of variation
of TPOT is ~10%, some runs suffer time-to-first-token stalls, and separate
server starts differ systematically.  So point estimates use robust statistics,
stalled runs are detected (and can be discarded), and the decision's interval for a speedup
is a t interval on per-start statistics whose start-to-start variance is pooled across configs
and nights (``start_ratio_ci``, see docs/decisions.md). ``bootstrap_ratio_ci`` (starts, then
requests) stays for descriptive per-level figures; with two or three starts per side it does not
keep its stated confidence and no decision rests on it.

Only numpy is imported at module level.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = [
    "STATISTICS",
    "TRIM_FRACTION",
    "request_tpot_ms",
    "summarize",
    "percentiles",
    "StallReport",
    "detect_stall",
    "RatioCI",
    "bootstrap_ratio_ci",
    "bootstrap_weighted_ratio_ci",
    "weighted_statistic",
    "coefficient_of_variation",
    "StartNoise",
    "pooled_start_noise",
    "LogRatioCI",
    "start_ratio_ci",
    "error_spending",
    "detect_power",
]

#: Objective statistics a study spec can pick.
STATISTICS = ("median", "mean", "trimmed_mean", "p90")

#: Fraction cut from *each* side by ``trimmed_mean`` (floor(0.1 * n) values).
TRIM_FRACTION = 0.1

# Upper bound on elements materialised per bootstrap chunk (keeps memory ~32 MB).
_CHUNK_ELEMENTS = 4_000_000


# ---------------------------------------------------------------------------
# per-request helpers


def request_tpot_ms(e2e_ms: float, ttft_ms: float, output_tokens: int) -> float | None:
    """Client-side time per output token: (e2e - ttft) / (n - 1).

    The first token's latency is TTFT, so only the n-1 later tokens share the
    remaining time.  Returns None when there are fewer than 2 output tokens (no
    inter-token interval exists) or when an input is not finite.
    """
    if output_tokens is None or output_tokens < 2:
        return None
    e2e = float(e2e_ms)
    ttft = float(ttft_ms)
    if not (math.isfinite(e2e) and math.isfinite(ttft)):
        return None
    return (e2e - ttft) / (int(output_tokens) - 1)


# ---------------------------------------------------------------------------
# statistics


def _check_statistic(statistic: str) -> None:
    if statistic not in STATISTICS:
        raise ValueError(
            f"unknown statistic {statistic!r}; expected one of {', '.join(STATISTICS)}"
        )


def _as_finite_1d(values: Sequence[float], what: str = "values") -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    if arr.size == 0:
        raise ValueError(f"{what} is empty: need at least one value")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} contains non-finite values (NaN or inf)")
    return arr


def _row_statistic(sorted_rows: np.ndarray, counts: np.ndarray, statistic: str) -> np.ndarray:
    """Statistic of each row of an ascending-sorted, NaN-padded 2-D array.

    Row i holds ``counts[i]`` real values followed by NaN padding (np.sort puts
    NaN last).  One implementation serves both the point estimate and the
    bootstrap, so the two are computed identically.
    """
    k = np.asarray(counts, dtype=np.intp)
    rows = np.arange(sorted_rows.shape[0])

    if statistic in ("median", "p90"):
        q = 0.5 if statistic == "median" else 0.9
        # Same as numpy's default 'linear' percentile method.
        pos = (k - 1) * q
        lo = np.floor(pos).astype(np.intp)
        hi = np.minimum(lo + 1, k - 1)
        frac = pos - lo
        v_lo = sorted_rows[rows, lo]
        v_hi = sorted_rows[rows, hi]
        return v_lo + (v_hi - v_lo) * frac

    csum = np.cumsum(np.where(np.isnan(sorted_rows), 0.0, sorted_rows), axis=1)
    if statistic == "mean":
        return csum[rows, k - 1] / k
    if statistic == "trimmed_mean":
        # floor(TRIM_FRACTION * k); the epsilon guards against 0.1*k landing just below an integer.
        cut = np.floor(k * TRIM_FRACTION + 1e-9).astype(np.intp)
        upper = csum[rows, k - cut - 1]
        lower = np.where(cut > 0, csum[rows, np.maximum(cut - 1, 0)], 0.0)
        return (upper - lower) / (k - 2 * cut)
    _check_statistic(statistic)  # raises
    raise AssertionError("unreachable")


def summarize(values: Sequence[float], statistic: str) -> float:
    """Reduce values with one of STATISTICS.

    median and trimmed_mean (10% cut from each side) resist the outliers a
    noisy machine produces; mean and p90 are there for specs that want them.
    Raises ValueError for an unknown statistic or empty input.
    """
    _check_statistic(statistic)
    arr = np.sort(_as_finite_1d(values))
    return float(_row_statistic(arr[None, :], np.array([arr.size]), statistic)[0])


def percentiles(values: Sequence[float], ps: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
    """Percentiles (numpy linear method) keyed "p50", "p90", "p99", ... ."""
    arr = _as_finite_1d(values)
    ps = list(ps)
    if not ps:
        return {}
    vals = np.percentile(arr, ps)
    return {f"p{p:g}": float(v) for p, v in zip(ps, vals)}


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Sample std (ddof=1) divided by mean; nan for fewer than 2 values or zero mean."""
    arr = np.asarray(values, dtype=float).ravel()
    if arr.size < 2:
        return float("nan")
    mean = float(np.mean(arr))
    if mean == 0.0:
        return float("nan")
    return float(np.std(arr, ddof=1) / mean)


# ---------------------------------------------------------------------------
# stall detection


@dataclass(frozen=True)
class StallReport:
    """Outcome of detect_stall; ``reason`` is a human-readable sentence."""

    stalled: bool
    ttft_median_ms: float
    ttft_reference_ms: float
    stalled_fraction: float
    reason: str


def detect_stall(
    ttft_ms: Sequence[float],
    reference_ttft_ms: float | None = None,
    factor: float = 2.5,
    max_fraction: float = 0.25,
) -> StallReport:
    """Flag a run whose requests suffered time-to-first-token stalls.

    Why: a stall inflates TTFT, and client-side TPOT = (e2e - ttft)/(n-1) then
    comes out too LOW, flattering the configuration.  A run is stalled when more
    than ``max_fraction`` of its requests have ttft > ``factor`` * reference.
    The reference is ``reference_ttft_ms`` (e.g. from a baseline run) when given,
    else the run's own 25th percentile of TTFT (robust to up to 75% stalls).
    """
    arr = _as_finite_1d(ttft_ms, "ttft_ms")
    if factor <= 0:
        raise ValueError(f"factor must be positive, got {factor}")
    if not 0.0 <= max_fraction < 1.0:
        raise ValueError(f"max_fraction must be in [0, 1), got {max_fraction}")
    median = float(np.median(arr))
    if reference_ttft_ms is None:
        reference = float(np.percentile(arr, 25))
        ref_desc = "the run's own 25th percentile"
    else:
        reference = float(reference_ttft_ms)
        if not (math.isfinite(reference) and reference > 0):
            raise ValueError(f"reference_ttft_ms must be positive and finite, got {reference_ttft_ms}")
        ref_desc = "the given reference"
    threshold = factor * reference
    n_slow = int(np.count_nonzero(arr > threshold))
    fraction = n_slow / arr.size
    stalled = fraction > max_fraction
    verdict = "stalled" if stalled else "not stalled"
    comparison = "more than" if stalled else "within"
    reason = (
        f"{n_slow} of {arr.size} requests ({fraction:.0%}) had TTFT above "
        f"{factor:g}x {ref_desc} ({reference:.1f} ms, threshold {threshold:.1f} ms), "
        f"{comparison} the allowed {max_fraction:.0%}: {verdict} "
        f"(median TTFT {median:.1f} ms)."
    )
    return StallReport(
        stalled=stalled,
        ttft_median_ms=median,
        ttft_reference_ms=reference,
        stalled_fraction=fraction,
        reason=reason,
    )


# ---------------------------------------------------------------------------
# hierarchical bootstrap


class _Interval:
    """What a decision asks of a ratio's interval (``low``, ``high``)."""

    low: float
    high: float

    def wholly_above(self, x: float = 1.0) -> bool:
        """True when the whole interval lies above x (e.g. a real speedup)."""
        return self.low > x

    def wholly_below(self, x: float = 1.0) -> bool:
        """True when the whole interval lies below x (e.g. a real slowdown)."""
        return self.high < x


@dataclass(frozen=True)
class RatioCI(_Interval):
    """Point ratio with a percentile-bootstrap confidence interval."""

    ratio: float
    low: float
    high: float
    confidence: float
    n_a: int
    n_b: int
    resamples: int


def _as_groups(side: Sequence, name: str) -> list[np.ndarray]:
    """Normalise one side to a list of non-empty finite 1-D arrays.

    A flat sequence of numbers is accepted as a single group.  Empty groups are
    dropped (a server start with no usable requests carries no information).
    """
    if isinstance(side, np.ndarray) and side.ndim == 1:
        side = [side]
    else:
        side = list(side)
        if side and all(isinstance(v, numbers.Real) for v in side):
            side = [side]
    groups = []
    for g in side:
        arr = np.asarray(g, dtype=float).ravel()
        if arr.size == 0:
            continue
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"side {name!r} contains non-finite values (NaN or inf)")
        groups.append(arr)
    if not groups:
        raise ValueError(f"side {name!r} has no values: need at least one non-empty group")
    return groups


def _bootstrap_statistic(
    groups: list[np.ndarray], statistic: str, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Hierarchical bootstrap distribution of ``statistic`` for one side.

    Each resample draws len(groups) groups with replacement, then, for each
    drawn group, as many values as it holds, with replacement from it; the
    drawn values are pooled.  Fully vectorised: groups are laid out in a
    (resample, group slot, max group size) array padded with NaN.
    """
    flat = np.concatenate(groups)
    sizes = np.array([g.size for g in groups], dtype=np.intp)
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.intp)
    n_groups = sizes.size
    max_n = int(sizes.max())
    slots = np.arange(max_n)

    per_resample = n_groups * max_n
    chunk = max(1, min(resamples, _CHUNK_ELEMENTS // per_resample))
    out = np.empty(resamples, dtype=float)
    for start in range(0, resamples, chunk):
        r = min(chunk, resamples - start)
        if n_groups == 1:
            gi = np.zeros((r, 1), dtype=np.intp)
        else:
            gi = rng.integers(0, n_groups, size=(r, n_groups))
        n_sel = sizes[gi]  # (r, G)
        u = rng.random((r, n_groups, max_n))
        # u < 1, so the index always stays inside the drawn group.
        idx = offsets[gi][..., None] + (u * n_sel[..., None]).astype(np.intp)
        vals = np.where(slots < n_sel[..., None], flat[idx], np.nan)
        vals = np.sort(vals.reshape(r, per_resample), axis=1)
        out[start : start + r] = _row_statistic(vals, n_sel.sum(axis=1), statistic)
    return out


def bootstrap_ratio_ci(
    a: Sequence[Sequence[float]],
    b: Sequence[Sequence[float]],
    statistic: str = "median",
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> RatioCI:
    """Ratio summarize(pooled a) / summarize(pooled b) with a hierarchical CI.

    Used as baseline_tpot / candidate_tpot = speedup.  ``a`` and ``b`` are lists
    of groups, one group of per-request values per server start (a flat list
    of numbers counts as one group).  Because start-to-start variance is real,
    each bootstrap resample first draws server starts with replacement, then
    requests within each drawn start with replacement, pools them and applies
    the statistic; a and b are resampled independently and the interval is the
    percentile interval of the resampled ratios.

    When a side has a single group only values are resampled, so start-to-start
    variance is NOT covered for that side and the interval is optimistic.

    Deterministic for a given seed.  Raises ValueError if a side has no values,
    the statistic is unknown, or confidence/resamples are out of range.
    """
    return _ratio_ci({"": a}, {"": b}, {"": 1.0}, statistic, confidence, resamples, seed)


def weighted_statistic(levels: dict, weights: dict, statistic: str) -> float:
    """Traffic-weighted objective of a concurrency profile: ``sum_l w_l * statistic(level l)``
    over the levels with values, the weights renormalized over them.

    Not the statistic of the pooled mixture: with levels far apart (1 ms per token at one request
    in flight, 10 ms at 32) the median of a 50/50 mixture lands anywhere in the gap between them
    and its bootstrap interval spans the gap (H200: speedup CI 0.51-1.26 on a config 1.13x faster
    at one level and 1.53x slower at the other). Each level's own statistic is stable.
    """
    _check_statistic(statistic)
    present = {k: v for k, v in levels.items() if len(v) and weights.get(k, 0.0) > 0}
    if not present:
        raise ValueError("no level has both values and a positive weight")
    s = sum(weights[k] for k in present)
    return float(sum(weights[k] * summarize(np.concatenate(_as_groups(v, str(k))), statistic)
                     for k, v in present.items()) / s)


def bootstrap_weighted_ratio_ci(
    a: dict,
    b: dict,
    weights: dict,
    statistic: str = "median",
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> RatioCI:
    """``bootstrap_ratio_ci`` for concurrency profiles: ``a`` and ``b`` map a level to its groups
    (one per server start); the ratio is ``weighted_statistic(a) / weighted_statistic(b)`` over
    the levels both sides measured. Each level is resampled like ``bootstrap_ratio_ci`` does
    (starts, then requests), independently of the other levels."""
    keys = [k for k in a if k in b and weights.get(k, 0.0) > 0 and len(a[k]) and len(b[k])]
    if not keys:
        raise ValueError("the two sides share no level with values and a positive weight")
    return _ratio_ci({k: a[k] for k in keys}, {k: b[k] for k in keys}, weights, statistic, confidence,
                     resamples, seed)


def _ratio_ci(a: dict, b: dict, weights: dict, statistic: str, confidence: float, resamples: int,
              seed: int) -> RatioCI:
    """The weighted ratio and its percentile interval; one level ``""`` is the plain case."""
    _check_statistic(statistic)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if int(resamples) < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    resamples = int(resamples)
    keys = list(a)
    w = np.array([weights[k] for k in keys], dtype=float)
    w = w / w.sum()
    ga = {k: _as_groups(a[k], f"a[{k}]" if k else "a") for k in keys}
    gb = {k: _as_groups(b[k], f"b[{k}]" if k else "b") for k in keys}
    point_a, point_b = weighted_statistic(ga, weights, statistic), weighted_statistic(gb, weights, statistic)
    if point_b == 0.0:
        raise ValueError(f"{statistic} of side 'b' is zero: the ratio is undefined")
    seqs = np.random.SeedSequence(seed).spawn(2 * len(keys))
    boot_a = sum(wi * _bootstrap_statistic(ga[k], statistic, resamples, np.random.default_rng(seqs[2 * i]))
                 for i, (wi, k) in enumerate(zip(w, keys)))
    boot_b = sum(wi * _bootstrap_statistic(gb[k], statistic, resamples, np.random.default_rng(seqs[2 * i + 1]))
                 for i, (wi, k) in enumerate(zip(w, keys)))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = boot_a / boot_b
    alpha = (1.0 - confidence) / 2.0
    low, high = np.percentile(ratios, [100.0 * alpha, 100.0 * (1.0 - alpha)])
    return RatioCI(ratio=point_a / point_b, low=float(low), high=float(high), confidence=float(confidence),
                   n_a=int(sum(g.size for k in keys for g in ga[k])), n_b=int(sum(g.size for k in keys for g in gb[k])),
                   resamples=resamples)


# ---------------------------------------------------------------------------
# per-start t interval: the decision's statistics (docs/decisions.md)


@dataclass(frozen=True)
class StartNoise:
    """Start-to-start variance of the log of a per-start statistic, as a sum of squared
    deviations ``ss`` on ``df`` degrees of freedom; ``parts`` says where each piece came from."""

    ss: float
    df: int
    parts: tuple = ()

    @property
    def sd(self) -> float:
        """Pooled standard deviation (log scale: about the start-to-start CV); nan without df."""
        return math.sqrt(self.ss / self.df) if self.df > 0 else float("nan")

    def __add__(self, other: "StartNoise") -> "StartNoise":
        return StartNoise(self.ss + other.ss, self.df + other.df, self.parts + other.parts)

    def to_dict(self) -> dict:
        return {"sd_log": None if self.df <= 0 else self.sd, "ss": self.ss, "df": self.df,
                "parts": [dict(p) for p in self.parts]}


def noisier_than_prior(own: StartNoise, prior: StartNoise) -> float | None:
    """One-sided F test of a study's own start-to-start variance against its prior's: the chance
    of own variance at least this far above the prior's if both measured the same noise. A small
    value says the prior (a figure from other hardware, another model or another day) understates
    this machine's noise, and with it every interval the decision states. None without degrees
    of freedom on either side."""
    if own.df < 1 or prior.df < 1 or prior.ss <= 0:
        return None
    from scipy.stats import f as f_dist

    return float(f_dist.sf((own.ss / own.df) / (prior.ss / prior.df), own.df, prior.df))


def pooled_start_noise(samples: dict, source: str = "study") -> StartNoise:
    """Pool the within-config variance of log per-start values: ``samples`` maps a config (any
    key) to its per-start log values; each config with ``n >= 2`` starts adds its squared
    deviations from its own mean on ``n - 1`` degrees of freedom (the standard pooled variance
    of a one-way layout). Configs with one start add nothing."""
    ss, df, parts = 0.0, 0, []
    for key, vals in samples.items():
        arr = np.asarray(list(vals), dtype=float)
        if arr.size < 2:
            continue
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"non-finite per-start value for {key!r}")
        s = float(np.sum((arr - arr.mean()) ** 2))
        ss += s
        df += int(arr.size - 1)
        parts.append({"source": source, "config": str(key), "starts": int(arr.size), "ss": s})
    return StartNoise(ss, df, tuple(parts))


@dataclass(frozen=True)
class LogRatioCI(_Interval):
    """Speedup ``exp(mean(log a) - mean(log b))`` with a Student t interval.

    ``a`` and ``b`` are per-start log statistics (e.g. log median TPOT of each start): the ratio
    is a over b (baseline TPOT / candidate TPOT = speedup). ``df`` and ``sd`` come from the
    pooled start noise, not from the two samples alone."""

    ratio: float
    low: float
    high: float
    confidence: float
    n_a: int
    n_b: int
    df: int
    sd: float
    label: float | None = None
    """What the interval promises where that is not ``confidence``: a look of a sequential
    confirmation is computed at its share of the error (``confidence``, e.g. 98.4%), and the
    intervals of all its looks together hold the truth with ``label`` (95%): a repeated
    confidence interval, honest whichever look stopped."""

    @property
    def stated(self) -> float:
        """The confidence the interval is reported with."""
        return self.confidence if self.label is None else self.label

    def to_dict(self) -> dict:
        return {"speedup": self.ratio, "ci": [self.low, self.high], "confidence": self.stated,
                "look_confidence": self.confidence, "starts": [self.n_a, self.n_b], "df": self.df, "sd_log": self.sd}


def start_ratio_ci(a: Sequence[float], b: Sequence[float], noise: StartNoise,
                   confidence: float = 0.95, noise_b: StartNoise | None = None) -> LogRatioCI:
    """Two-sided t interval for ``exp(mean(a) - mean(b))`` of per-start log values, with the
    variance ``noise.ss / noise.df`` (pooled across configs and nights) on ``noise.df`` degrees
    of freedom. ``noise_b``: ``b``'s own variance where the two sides vary differently (a
    speculative config against no speculation: on the H200 the baseline repeats within 0.5%,
    an n-gram config moves 8%): the standard error is then Welch's, on the Welch-Satterthwaite
    degrees of freedom, capped (``welch_df``). Without degrees of freedom the interval is (0, inf): nothing is known
    about the start-to-start variance, so nothing is concluded. Raises ValueError for an empty
    side."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    xa, xb = np.asarray(list(a), dtype=float), np.asarray(list(b), dtype=float)
    if xa.size == 0 or xb.size == 0:
        raise ValueError("each side needs at least one start")
    if not (np.all(np.isfinite(xa)) and np.all(np.isfinite(xb))):
        raise ValueError("per-start values must be finite")
    d = float(xa.mean() - xb.mean())
    nb = noise if noise_b is None else noise_b
    if noise.df <= 0 or nb.df <= 0:
        return LogRatioCI(math.exp(d), 0.0, float("inf"), confidence, int(xa.size), int(xb.size), 0, float("nan"))
    from scipy.stats import t as student_t

    va, vb = noise.ss / noise.df / xa.size, nb.ss / nb.df / xb.size
    se = math.sqrt(va + vb)
    df = float(noise.df) if (nb.ss, nb.df) == (noise.ss, noise.df) else welch_df(va, noise.df, vb, nb.df, cap=True)
    sd = se / math.sqrt(1.0 / xa.size + 1.0 / xb.size)  # the one per-start sd that gives this se
    q = float(student_t.ppf(1.0 - (1.0 - confidence) / 2.0, df))
    # an early look spends almost no error: on one df its t quantile can pass exp's range (an
    # interval of (0, inf) in all but name)
    high = math.exp(d + q * se) if d + q * se < 700 else float("inf")
    return LogRatioCI(math.exp(d), math.exp(max(d - q * se, -700)), high, confidence,
                      int(xa.size), int(xb.size), int(df), sd)


WELCH_CAP = 2.0
"""The decision's Welch degrees of freedom are at most this many times the smaller side's own."""


def welch_df(va: float, df_a: int, vb: float, df_b: int, cap: bool = False) -> float:
    """Welch-Satterthwaite degrees of freedom of ``va + vb``, two variance estimates (of the
    means) on ``df_a`` and ``df_b`` degrees of freedom; between the smaller of the two and their
    sum. ``cap``: at most ``WELCH_CAP`` times the smaller, for intervals. Why: the formula
    plugs in the estimated variances, so when the noisier side has one to three df of its own
    (a speculative winner's two to four confirmation starts against a baseline 5-20x quieter)
    and its few starts happen to agree, its variance is underestimated and the df climb toward
    the sum at the same moment: the interval is too narrow twice over. The cap trades the two
    targets of docs/decisions.md (benchmarks/decisions.py, nothing deployed): at 2x, false
    change 1.9-2.8% at 0.5% / 8% and 2% / 10% noise and power at equal 6% noise 83-86%; at 1.5x,
    1.8-2.5% and 80-82%; Hsu's conservative minimum, ``min(df_a, df_b)``, 1.0-1.8% and 65%."""
    den = va * va / df_a + vb * vb / df_b
    df = max(min(df_a, df_b), (va + vb) ** 2 / den) if den > 0 else float(df_a + df_b)
    return min(df, WELCH_CAP * min(df_a, df_b)) if cap else df


def error_spending(alpha: float, looks: int) -> list[float]:
    """The one-sided error rate each of ``looks`` planned looks may spend, together ``alpha``:
    the increments of Lan and DeMets' O'Brien-Fleming-shaped spending function at equally spaced
    looks, ``f(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t))``. Early looks, on few starts, get almost
    nothing (only a large effect stops there); the last look keeps most of ``alpha``, so a
    decision that needs every planned start loses little to the earlier looks, where an even
    (Bonferroni) split would test the last look at ``alpha / looks``. The looks are combined by
    the union bound, valid whatever the correlation between them and whichever look stops."""
    return list(_error_spending(float(alpha), int(looks)))


@functools.lru_cache(maxsize=256)
def _error_spending(alpha: float, looks: int) -> tuple[float, ...]:
    if looks < 1:
        raise ValueError(f"looks must be at least 1, got {looks}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    from scipy.stats import norm

    z = float(norm.ppf(1.0 - alpha / 2.0))

    def spent(t: float) -> float:
        return 2.0 - 2.0 * float(norm.cdf(z / math.sqrt(t))) if t > 0 else 0.0

    out = [spent(k / looks) - spent((k - 1) / looks) for k in range(1, looks + 1)]
    out[-1] = alpha - sum(out[:-1])  # exactly alpha in all
    return tuple(out)


def detect_power(effect: float, sd_ref: float, sd_cand: float, n: int, df: float, alpha: float) -> float:
    """About the chance that ``n`` starts a side show a true log speedup ``effect`` at one-sided
    level ``alpha``: the noncentral t of the difference of two means with per-start sds
    ``sd_ref`` and ``sd_cand``, on ``df`` degrees of freedom. A planning figure (it ignores the
    earlier looks, which only add to it, and the winner's curse), not a decision."""
    if n < 1 or df <= 0 or not (sd_ref > 0 or sd_cand > 0):
        return 0.0
    from scipy.stats import nct
    from scipy.stats import t as student_t

    se = math.sqrt((sd_ref ** 2 + sd_cand ** 2) / n)
    return float(nct.sf(student_t.ppf(1.0 - alpha, df), df, effect / se))


POWER_GAIN = 0.20
"""the gain a confirmation is planned to see (``decide`` states its plan's power at it)"""
POWER_TARGET = 0.80
"""how often the planned rounds should see it"""


def confirmation_power(sd_ref: float, sd_winner: float, rounds: int, deployed: bool, alpha: float) -> float:
    """About how often ``rounds`` confirmation rounds see a true ``POWER_GAIN`` of the winner over
    its reference (the incumbent when ``deployed``, else no speculation) at one-sided ``alpha``
    spent over that many looks, at per-start log sds ``sd_ref`` and ``sd_winner`` (a planning
    figure: ``detect_power``). The decision's plan and the budget's split read the same figure."""
    a = error_spending(alpha, rounds)[-1]
    if deployed:  # incumbent: its search start and the rounds; winner: the rounds
        df = 2 * rounds - 1
    elif rounds < 2:
        return 0.0
    else:
        df = welch_df(sd_ref ** 2 / rounds, rounds, sd_winner ** 2 / rounds, rounds - 1, cap=True)
    return detect_power(math.log1p(POWER_GAIN), sd_ref, sd_winner, rounds, df, a)
