import math

import numpy as np
import pytest

from autotune.core import _measure
from autotune.core._measure import (
    STATISTICS,
    RatioCI,
    StallReport,
    bootstrap_ratio_ci,
    coefficient_of_variation,
    detect_stall,
    percentiles,
    request_tpot_ms,
    summarize,
)


# --------------------------------------------------------------------------- tpot


def test_request_tpot_ms():
    assert request_tpot_ms(1100.0, 100.0, 101) == pytest.approx(10.0)
    assert request_tpot_ms(300.0, 100.0, 2) == pytest.approx(200.0)
    assert request_tpot_ms(300.0, 100.0, 1) is None
    assert request_tpot_ms(300.0, 100.0, 0) is None
    assert request_tpot_ms(float("nan"), 100.0, 10) is None


# --------------------------------------------------------------------------- statistics


def test_statistics_tuple():
    assert STATISTICS == ("median", "mean", "trimmed_mean", "p90")


def test_summarize_known_data():
    data = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert summarize(data, "median") == pytest.approx(5.5)
    assert summarize(data, "mean") == pytest.approx(5.5)
    assert summarize(data, "p90") == pytest.approx(9.1)  # numpy linear method
    # 10% of 10 = 1 value cut from each side -> mean of 2..9
    assert summarize(data, "trimmed_mean") == pytest.approx(5.5)
    assert summarize([3.0, 1.0, 2.0], "median") == 2.0
    assert summarize([7.5], "p90") == 7.5
    assert summarize([7.5], "trimmed_mean") == 7.5


def test_summarize_matches_numpy_on_random_data():
    rng = np.random.default_rng(1)
    for n in (1, 2, 7, 10, 33, 101):
        x = rng.lognormal(3.0, 0.3, size=n)
        assert summarize(x, "median") == pytest.approx(np.median(x))
        assert summarize(x, "mean") == pytest.approx(np.mean(x))
        assert summarize(x, "p90") == pytest.approx(np.percentile(x, 90))
        cut = int(0.1 * n)
        s = np.sort(x)
        assert summarize(x, "trimmed_mean") == pytest.approx(s[cut : n - cut].mean())


def test_trimmed_mean_ignores_outliers():
    data = [10.0] * 18 + [1000.0, -500.0]  # 20 values -> 2 cut from each side
    assert summarize(data, "trimmed_mean") == pytest.approx(10.0)
    assert summarize(data, "mean") != pytest.approx(10.0)
    # one-sided outliers too
    data2 = list(range(1, 21))
    data2[-1] = 10_000  # 20 values; largest 2 and smallest 2 are dropped
    assert summarize(data2, "trimmed_mean") == pytest.approx(np.mean(range(3, 19)))


def test_summarize_errors():
    with pytest.raises(ValueError, match="bogus"):
        summarize([1.0, 2.0], "bogus")
    with pytest.raises(ValueError, match="empty"):
        summarize([], "median")
    with pytest.raises(ValueError):
        summarize([1.0, float("nan")], "median")


def test_percentiles():
    data = np.arange(1, 101, dtype=float)
    p = percentiles(data)
    assert set(p) == {"p50", "p90", "p99"}
    assert p["p50"] == pytest.approx(np.percentile(data, 50))
    assert p["p90"] == pytest.approx(np.percentile(data, 90))
    assert p["p99"] == pytest.approx(np.percentile(data, 99))
    assert percentiles(data, ps=(25, 99.9)).keys() == {"p25", "p99.9"}
    with pytest.raises(ValueError):
        percentiles([])


def test_coefficient_of_variation():
    assert coefficient_of_variation([2.0, 4.0]) == pytest.approx(np.std([2, 4], ddof=1) / 3.0)
    assert math.isnan(coefficient_of_variation([5.0]))
    assert math.isnan(coefficient_of_variation([]))
    assert coefficient_of_variation([3.0, 3.0, 3.0]) == 0.0


# --------------------------------------------------------------------------- stalls


def _ttfts(n, stalled_fraction, base=100.0, mult=4.0, seed=0):
    rng = np.random.default_rng(seed)
    x = base * rng.uniform(0.9, 1.1, size=n)
    k = int(round(stalled_fraction * n))
    x[:k] *= mult
    rng.shuffle(x)
    return x


def test_detect_stall_40_percent_is_stalled():
    rep = detect_stall(_ttfts(100, 0.40))
    assert isinstance(rep, StallReport)
    assert rep.stalled
    assert rep.stalled_fraction == pytest.approx(0.40)
    assert 85.0 < rep.ttft_reference_ms < 115.0  # own p25 ~ typical ttft
    assert "stalled" in rep.reason and "40%" in rep.reason


def test_detect_stall_5_percent_is_not_stalled():
    rep = detect_stall(_ttfts(100, 0.05))
    assert not rep.stalled
    assert rep.stalled_fraction == pytest.approx(0.05)
    assert "not stalled" in rep.reason


def test_detect_stall_uses_given_reference():
    # Every request is slow: the run's own p25 cannot see it, a baseline reference can.
    x = _ttfts(50, 1.0)
    assert not detect_stall(x).stalled
    rep = detect_stall(x, reference_ttft_ms=100.0)
    assert rep.stalled
    assert rep.ttft_reference_ms == 100.0
    assert rep.stalled_fraction == pytest.approx(1.0)
    assert rep.ttft_median_ms == pytest.approx(np.median(x))


def test_detect_stall_errors():
    with pytest.raises(ValueError):
        detect_stall([])
    with pytest.raises(ValueError):
        detect_stall([1.0, 2.0], reference_ttft_ms=0.0)


# --------------------------------------------------------------------------- bootstrap


def test_bootstrap_ratio_2x():
    rng = np.random.default_rng(42)
    base = [rng.lognormal(np.log(20.0), 0.1, size=200)]
    cand = [rng.lognormal(np.log(10.0), 0.1, size=200)]
    ci = bootstrap_ratio_ci(base, cand, statistic="median", resamples=2000, seed=0)
    assert isinstance(ci, RatioCI)
    assert ci.low <= 2.0 <= ci.high
    assert ci.low <= ci.ratio <= ci.high
    assert ci.wholly_above(1.0)
    assert not ci.wholly_below(1.0)
    assert ci.n_a == 200 and ci.n_b == 200 and ci.resamples == 2000
    assert ci.confidence == 0.95
    # reversed direction is a slowdown
    rev = bootstrap_ratio_ci(cand, base, seed=0)
    assert rev.wholly_below(1.0) and not rev.wholly_above(1.0)


@pytest.mark.parametrize("statistic", STATISTICS)
def test_bootstrap_identical_distributions_contains_one(statistic):
    rng = np.random.default_rng(7)
    a = [rng.lognormal(np.log(15.0), 0.1, size=150) for _ in range(3)]
    b = [rng.lognormal(np.log(15.0), 0.1, size=150) for _ in range(3)]
    ci = bootstrap_ratio_ci(a, b, statistic=statistic, resamples=1000, seed=3)
    assert ci.low <= 1.0 <= ci.high
    assert not ci.wholly_above(1.0)
    assert not ci.wholly_below(1.0)
    assert ci.ratio == pytest.approx(
        summarize(np.concatenate(a), statistic) / summarize(np.concatenate(b), statistic)
    )


def test_bootstrap_deterministic_for_seed():
    rng = np.random.default_rng(5)
    a = [rng.normal(20, 2, size=80) for _ in range(4)]
    b = [rng.normal(12, 1, size=60) for _ in range(2)]
    c1 = bootstrap_ratio_ci(a, b, seed=11)
    c2 = bootstrap_ratio_ci(a, b, seed=11)
    c3 = bootstrap_ratio_ci(a, b, seed=12)
    assert c1 == c2
    assert (c1.low, c1.high) != (c3.low, c3.high)


def test_bootstrap_hierarchical_wider_than_pooled():
    rng = np.random.default_rng(9)
    # Four server starts whose levels differ a lot (start-to-start variance).
    a_groups = [rng.normal(mu, 0.3, size=60) for mu in (16.0, 20.0, 24.0, 28.0)]
    a_pooled = [np.concatenate(a_groups)]
    b = [rng.normal(11.0, 0.3, size=240)]
    hier = bootstrap_ratio_ci(a_groups, b, statistic="mean", seed=1)
    flat = bootstrap_ratio_ci(a_pooled, b, statistic="mean", seed=1)
    assert hier.ratio == pytest.approx(flat.ratio)
    w_hier = hier.high - hier.low
    w_flat = flat.high - flat.low
    assert w_hier > 3.0 * w_flat


def test_bootstrap_accepts_unequal_groups_and_flat_side():
    rng = np.random.default_rng(2)
    a = [rng.normal(20, 1, size=n) for n in (5, 50, 200)] + [[]]  # empty group dropped
    ci = bootstrap_ratio_ci(a, list(rng.normal(10, 1, size=100)), seed=0)
    assert ci.n_a == 255 and ci.n_b == 100
    assert ci.low < ci.ratio < ci.high
    assert ci.wholly_above(1.5)


def test_bootstrap_every_statistic_covers_the_true_ratio():
    rng = np.random.default_rng(0)
    a = [rng.normal(20, 2, size=100) for _ in range(4)]
    b = [rng.normal(15, 2, size=100) for _ in range(4)]
    for stat in STATISTICS:
        ci = bootstrap_ratio_ci(a, b, statistic=stat, resamples=500)
        assert ci.ratio == pytest.approx(summarize(np.concatenate(a), stat) / summarize(np.concatenate(b), stat))
        assert 1.2 < ci.low < ci.ratio < ci.high < 1.5, (stat, ci)


def test_bootstrap_errors():
    with pytest.raises(ValueError, match="'a'"):
        bootstrap_ratio_ci([], [[1.0, 2.0]])
    with pytest.raises(ValueError, match="'b'"):
        bootstrap_ratio_ci([[1.0, 2.0]], [[], []])
    with pytest.raises(ValueError, match="nope"):
        bootstrap_ratio_ci([[1.0, 2.0]], [[1.0, 2.0]], statistic="nope")
    with pytest.raises(ValueError):
        bootstrap_ratio_ci([[1.0, 2.0]], [[1.0, 2.0]], confidence=1.5)


# --------------------------------------------------------------------------- concurrency profiles


def test_weighted_statistic_weights_per_level_statistics():
    from autotune.core._measure import weighted_statistic

    levels = {"1": [[1.0, 1.1, 0.9]], "32": [[10.0, 9.0], [11.0]]}
    assert weighted_statistic(levels, {"1": 0.25, "32": 0.75}, "median") == pytest.approx(0.25 * 1.0 + 0.75 * 10.0)
    # a level without values or weight drops out and the others are renormalized
    assert weighted_statistic({**levels, "8": []}, {"1": 1.0, "32": 0.0, "8": 5.0}, "mean") == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no level"):
        weighted_statistic({"1": []}, {"1": 1.0}, "median")
    with pytest.raises(ValueError, match="unknown statistic"):
        weighted_statistic(levels, {"1": 1.0}, "mode")


def test_weighted_ratio_ci_is_tight_where_the_mixture_median_is_not():
    """Two levels far apart, 50/50: a candidate 2x faster at level 1 and 1.1x slower at level 8.
    The weighted per-level median ratio has a tight interval around its true value; the median of
    the pooled mixture sits in the gap between the levels and its interval spans most of it."""
    from autotune.core._measure import bootstrap_weighted_ratio_ci

    rng = np.random.default_rng(3)
    base = {"1": [list(rng.normal(10.0, 0.3, 32))], "8": [list(rng.normal(20.0, 0.6, 32))]}
    cand = {"1": [list(rng.normal(5.0, 0.15, 32))], "8": [list(rng.normal(22.0, 0.6, 32))]}
    w = {"1": 0.5, "8": 0.5}
    ci = bootstrap_weighted_ratio_ci(base, cand, w, "median", seed=1)
    assert ci.ratio == pytest.approx(15.0 / 13.5, rel=0.02)
    assert ci.low < ci.ratio < ci.high and ci.high - ci.low < 0.05 and ci.wholly_above(1.0)
    assert ci.n_a == ci.n_b == 64
    pooled = bootstrap_ratio_ci([v for g in base.values() for v in g[0]], [v for g in cand.values() for v in g[0]],
                                "median", seed=1)
    assert pooled.high - pooled.low > 10 * (ci.high - ci.low)
    # one level: the same figure as the plain bootstrap
    one = bootstrap_weighted_ratio_ci({"1": base["1"]}, {"1": cand["1"]}, {"1": 1.0}, "median", seed=1)
    plain = bootstrap_ratio_ci(base["1"], cand["1"], "median", seed=1)
    assert one.ratio == pytest.approx(plain.ratio) and one.low == pytest.approx(plain.low, rel=0.02)
    with pytest.raises(ValueError, match="share no level"):
        bootstrap_weighted_ratio_ci({"1": base["1"]}, {"8": cand["8"]}, w)


def test_start_ratio_ci_with_each_sides_own_noise_is_welchs():
    """Sides that vary alike: the pooled interval as before. A quiet baseline against a noisy
    speculative config: the standard error adds each side's variance of its mean, and the degrees
    of freedom are Welch-Satterthwaite's, between the smaller side's and the sum."""
    quiet, noisy = _measure.StartNoise(4 * 0.005 ** 2, 4), _measure.StartNoise(8 * 0.08 ** 2, 8)
    a, b = [math.log(30.0), math.log(30.2)], [math.log(24.0)]
    same = _measure.start_ratio_ci(a, b, noisy, 0.95)
    assert _measure.start_ratio_ci(a, b, noisy, 0.95, noise_b=noisy) == same
    mixed = _measure.start_ratio_ci(a, b, quiet, 0.95, noise_b=noisy)
    only_quiet = _measure.start_ratio_ci(a, b, quiet, 0.95)
    assert only_quiet.low > 1.2 and mixed.low < 1.1  # the noisy side's variance widens what the quiet one set
    assert mixed.ratio == pytest.approx(same.ratio)
    se = math.sqrt(0.005 ** 2 / 2 + 0.08 ** 2 / 1)
    assert mixed.sd * math.sqrt(1 / 2 + 1) == pytest.approx(se)
    assert 4 <= mixed.df <= 12 and mixed.df == 8  # the noisy side dominates: about its own df
    assert _measure.welch_df(1.0, 5, 1.0, 5) == pytest.approx(10.0)
    assert _measure.welch_df(1.0, 5, 1e-9, 50) == pytest.approx(5.0, rel=1e-6)
    # a side without degrees of freedom: nothing concluded
    assert math.isinf(_measure.start_ratio_ci(a, b, quiet, 0.95, noise_b=_measure.StartNoise(0.0, 0)).high)


def test_an_early_look_on_one_df_gives_an_open_interval_not_an_overflow():
    """The first of four planned looks spends about 7e-6 of the error: on one degree of freedom
    its t quantile is past exp's range; the interval is (0, inf) in effect, never an error."""
    noise = _measure.StartNoise(ss=0.05 ** 2, df=1)
    alpha = _measure.error_spending(0.025, 4)[0]
    ci = _measure.start_ratio_ci([math.log(30.0)], [math.log(10.0)], noise, 1 - 2 * alpha)
    assert ci.ratio == pytest.approx(3.0) and ci.low < 1.0 and ci.high == math.inf


def test_error_spending_keeps_the_total_and_saves_it_for_the_last_look():
    for looks in (1, 2, 3, 4, 6):
        spend = _measure.error_spending(0.025, looks)
        assert len(spend) == looks and sum(spend) == pytest.approx(0.025)
        assert all(a <= b for a, b in zip(spend, spend[1:]))  # later looks, on more starts, spend more
    assert _measure.error_spending(0.025, 1) == [0.025]
    with pytest.raises(ValueError):
        _measure.error_spending(0.025, 0)
