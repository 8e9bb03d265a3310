"""The predictor's nominee: a configuration the search never started, confirmed in place of its best.

Why: where a spec's budget leaves the search two starts (no speculation, then each method's
largest K), the largest K's per-position counters predict every smaller K, but no start is left
to measure the one they rate fastest, and the confirmation tests the largest K, a fixed point: on
the generated grids that picks within 3% of the best less often than random order
(docs/figures/search.md). The confirmation's starts are fresh starts of the winner and the
decision rests on them alone, so the winner needs no search start of its own: with
``objective.nominee`` (experimental, off by default), when the budget ended the search (not the
predictor's own stop) and the predictor rates an unmeasured configuration more likely than not
(``P_NOMINEE``) faster than the best measured one, the confirmation confirms that nominee instead.

Instead of, not as well as: a third side in every round would cost the rounds the decision's
power lies in, and choosing between two winners on the confirmation's own starts would bring back
the winner's curse the confirmation exists to avoid; with one winner fixed before the first
confirmation start the decision's error rates are what they were, only what it tests changes.

The bar is faster than the best, not faster by ``objective.search_tolerance``: the tolerance is
the gain worth a server start, and the nominee costs none (the confirmation's starts are spent
either way); what is asked is which of the two is likelier the faster, the best's own noise (a
mean of one or two starts) counted. On the generated grids at two search starts the tolerance as
the bar picked within 3% in 57% of runs against 69% without it, and on the recorded grids 74%
against 78% (``benchmarks/two_starts.py``). What the nominee risks is a wrong prediction (an H100
study put ngram K=8 at 2.03 ms, 90% interval 1.95-2.10, and measured 2.39), which is why it is not
on by default: on a recorded H200 grid whose best is the largest K it swapped a right pick for a
wrong one (docs/figures/search.md). Its confirmation starts screen it: one that fails a guard, or
that the engine refuses, is dropped and the search's best is confirmed on the rounds left
(``_confirm``); the decision's guards still judge every start of whichever it decides.

Pure functions of observations, as ``_policy``: the study (``_study.Study.nominate``) and the search
benchmarks (``benchmarks/search.py``'s ``ours``) call the same code.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from autotune.core._methods import is_adaptive
from autotune.search._observations import BANDS, Observation, cost_key, group_key
from autotune.search._policy import known_losers
from autotune.search._predict import Predictor
from autotune.search._space import NONE, canonical, label

P_NOMINEE = 0.5
"""An unmeasured configuration is nominated when its chance of beating the best measured objective
(by ``margin``) is at least this: more likely than not."""


@dataclass(frozen=True)
class Nomination:
    """The nominee and what the predictor said of it, as the study stores it (``to_attrs``)."""

    config: dict
    predicted_tpot_ms: float
    predicted_ci: tuple[float, float]
    p_beat: float
    basis: str
    best_key: str
    best_tpot_ms: float
    margin: float
    noise: float

    @property
    def key(self) -> str:
        return canonical(self.config)

    def to_attrs(self) -> dict:
        return {"config": self.config, "config_key": self.key, "label": label(self.config),
                "predicted_tpot_ms": self.predicted_tpot_ms, "predicted_ci": list(self.predicted_ci),
                "p_beat": self.p_beat, "basis": self.basis, "best_key": self.best_key,
                "best_label": label(_config_of(self.best_key)), "best_tpot_ms": self.best_tpot_ms,
                "margin": self.margin, "noise": self.noise}


def _config_of(key: str) -> dict | None:
    return json.loads(key) if key and key != NONE else None


def nominate(observations: Sequence[Observation], candidates: Sequence[dict], *,
             weights: dict[int, float] | None = None, failed: Iterable[str] = (), margin: float = 0.0,
             noise_prior: tuple[float, int] | None = None, bands_tax: tuple[float, int] | None = None,
             p_min: float = P_NOMINEE) -> Nomination | None:
    """The nominee among ``candidates`` (plain speculative configs of the space), or None.

    Eligible: never measured, not refused by the engine (``failed``), of a method and knobs the
    search measured (the counters it is predicted from are its own), not runtime-adaptive (the
    predictor claims nothing for those), no band schedule, not of a method that lost by far
    (``_policy.known_losers``). The bar is the best measured objective (no speculation included),
    a mean of its starts, less ``margin``: the chance to clear it counts that mean's own noise, as
    the search's ``p_beat`` does. Among those at least ``p_min`` likely to clear it, the one the
    predictor rates fastest."""
    pred = Predictor(observations, weights, None, noise_prior, bands_tax)
    if not pred.ready:
        return None
    best = pred.best()
    if best is None:
        return None
    best_obs, best_v = best
    n_best = pred.means()[best_obs.key][2]
    target = best_v * (1 - margin)
    se_target = pred.noise * target / math.sqrt(n_best)
    measured = {o.key for o in observations}
    failed = set(failed)
    seen = {group_key(o.config) for o in observations if o.config}
    losers = known_losers(observations, weights)
    picks = []
    for c in candidates:
        key = canonical(c)
        if key in measured or key in failed or c.get(BANDS) or is_adaptive(c) or group_key(c) not in seen \
                or cost_key(c) in losers:
            continue
        p = pred.predict(c)
        if p is None:
            continue
        pb = p.p_below(target, se_target)
        if pb >= p_min:
            picks.append((p.mean, -pb, key, c, p, pb))
    if not picks:
        return None
    _, _, _, cfg, p, pb = min(picks, key=lambda x: x[:3])
    return Nomination(config=cfg, predicted_tpot_ms=p.mean, predicted_ci=(p.lo, p.hi), p_beat=pb, basis=p.basis,
                      best_key=best_obs.key, best_tpot_ms=best_v, margin=margin, noise=pred.noise)


def text(plan: dict) -> str:
    """The nominee in words, from its stored plan (``Study.nominate``): what was predicted, against
    what, and the search's best whose place it takes (the study's note, the reason, ``recommend show``)."""
    lo, hi = plan["predicted_ci"]
    bar = f"{plan['best_label']}, {plan['best_tpot_ms']:.2f} ms"
    by = f" by {plan['margin']:.0%}" if plan.get("margin") else ""
    inst = plan.get("instead_of") or {}
    said = (f"{plan['label']} was nominated by the predictor, not searched: predicted {plan['predicted_tpot_ms']:.2f} ms "
            f"(90% interval {lo:.2f}-{hi:.2f}), {plan['p_beat']:.0%} likely faster{by} than the best measured start "
            f"({bar}), in place of the search's best {inst.get('label', plan['best_label'])}")
    if plan.get("dropped"):
        said += f"; dropped, {plan['dropped']}, and the search's best confirmed instead"
    return said
