"""Which server start next: the predictor's policy (``next_step``).

The baseline, then each method at its largest K, then the acceptance knee of each method that beat
the baseline there (``_knee_step``: a second K where the acceptance flattens, measured before the
cost model decides; GPU step costs are not smooth in K; from the mean accepted tokens per drafted
step where a method reports no per-position counters), then each runtime-adaptive knob variant at
its largest K (``_adaptive_look``: measured, never predicted), then, among the candidates with at least
``P_STOP`` probability of beating the best measured objective by more than the gain worth a start
(``min_gain``: a study passes ``objective.search_tolerance``, 3%, or ``min_gain`` when larger; the
probability counts the best's own noise, a mean of few starts, as well as the candidate's
interval), the one with the lowest plausible TPOT (its interval's low end); when no candidate is
that likely, stop, except while a neighbour of the best K (K-1 or K+1 of the same method and knobs)
is unmeasured and has at least ``P_NEIGHBOUR`` probability of being faster than the best at all,
the best's own noise counted: an interior optimum is often one K away from where the fit put it,
and a single measured start of the best is itself noisy. With ``repeats`` (experimental,
``objective.search_repeats``) a measured rival that may still beat the best by the margin gets
another start too (of whichever of the pair has fewer). With several levels, band schedules
(``Predictor.band_candidates``) compete too. A method that lost by far at every level
(``LOSER_RATIO``, ``known_losers``) gets no more starts, plain or banded.

The policy only chooses what to measure: every recommendation still rests on measured trials
(``decide``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from autotune.core._methods import is_adaptive
from autotune.search._cost import Z90
from autotune.search._observations import BANDS, Observation, cost_key, group_key, k_of
from autotune.search._predict import Prediction, Predictor, _phi
from autotune.search._space import canonical, knee, label

P_STOP = 0.2
"""Stop when no candidate beats the best by more than the noise with at least this probability."""
P_NEIGHBOUR = 0.15
"""...unless an unmeasured neighbour K of the best is faster than the best with at least this probability."""
KNEE_SHARE = 0.9
"""The acceptance knee: the smallest K keeping this share of K_max's accepted tokens per step."""
LOSER_RATIO = 1.5
"""A method whose every measured start was at least this many times slower than no speculation at
every level is a known loser: no further K of it, no band schedule of it, gets a start. The
predictor's optimistic corner for an unmeasured K (a step cost on the line through the baseline,
no fixed cost per step) would still give a smaller K of it a chance, but that corner is what the
GPU rows refute: vLLM 0.25's draft_model measured 2.0x (K=1, c=1) to 4.7x (K=6, c=32) the
baseline on the H200, ngram on SmolLM2-135M on an H100 1.2x (K=4) and 1.6x (K=2) while K=8 was faster; a smaller
K of a method that lost by half at its largest K has never won."""


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
        # the first static knob variant: its counters predict the method's other Ks (an adaptive
        # variant's do not, and it gets its own look, ``_adaptive_look``)
        first_group = group_key(next((c for c in cs if not is_adaptive(c)), cs[0]))
        top = max((c for c in cs if group_key(c) == first_group), key=k_of, default=top)
        if top and canonical(top) not in failed | skip:
            return Step("measure", top, reason=f"{m} at its largest K: per-position acceptance for every K")
    knee = _knee_step(observations, candidates, weights, measured | failed | skip)
    if knee is not None:
        return knee
    look = _adaptive_look(observations, candidates, measured | failed | skip)
    if look is not None:
        return look
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
    return {ck: f"{ck.split('|')[0].split(':')[0]} (every start {min(rs):.1f}x or more the baseline's TPOT at every level)"
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
        mine = [o for o in observations if o.config and o.config["method"] == m and not o.config.get(BANDS)
                and not is_adaptive(o.config)]
        if not mine or len({k_of(o.config) for o in mine}) != 1:
            continue
        top = mine[0]
        v = top.objective(w)
        kn, basis = _knee_of(top.delta or {})
        if v is None or v >= min(base) or kn is None:
            continue
        same = sorted((c for c in candidates if group_key(c) == group_key(top.config) and not c.get(BANDS)
                       and k_of(c) < k_of(top.config)), key=k_of)
        pick = next((c for c in same if k_of(c) >= kn), None)
        if pick is not None and canonical(pick) not in done:
            return Step("measure", pick, reason=f"{m}'s acceptance knee (K={k_of(pick)} keeps {KNEE_SHARE:.0%} of the "
                                                f"accepted tokens per step at K={k_of(top.config)}{basis}): a second K "
                                                "for the cost fit where the acceptance flattens")
    return None


def _knee_of(delta: dict) -> tuple[int | None, str]:
    """(the acceptance knee, how it was found) of a run's counters. Without per-position counters
    (a method or vLLM that reports only totals), the mean accepted tokens per drafted step ``a``
    stands in: no K below ``a / KNEE_SHARE`` can keep that share of them. Nothing counted: None."""
    kn = knee(delta.get("per_position_rates") or [], KNEE_SHARE)
    if kn is not None:
        return kn, ""
    drafts, accepted = delta.get("drafts") or 0, delta.get("accepted_tokens") or 0
    if drafts > 0 and accepted > 0:
        return max(1, math.ceil(accepted / drafts / KNEE_SHARE)), \
            "; no per-position counters: from the mean accepted tokens per drafted step"
    return None, ""


def _adaptive_look(observations: Sequence[Observation], candidates: Sequence[dict], done: set[str]) -> Step | None:
    """A runtime-adaptive knob variant (``core._methods.ADAPTIVE_KNOBS``) never measured gets one
    start at its largest K, the ceiling vLLM adapts under: the predictor claims nothing for it (its
    K is not what each step verifies), so it is compared on what it measures, like the baseline."""
    seen = {group_key(o.config) for o in observations if o.config}
    groups: dict[str, list[dict]] = {}
    for c in candidates:
        if is_adaptive(c) and not c.get(BANDS):
            groups.setdefault(group_key(c), []).append(c)
    for g, cs in groups.items():
        top = max(cs, key=k_of)
        if g not in seen and canonical(top) not in done:
            return Step("measure", top, reason=f"{label(top)}: runtime-adaptive verification, measured at its "
                                               "largest K (the predictor claims nothing for it)")
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
