"""Per concurrency level: what each level of a profile study says on its own.

A profile study (``replay.mode: profile``) minimizes the traffic-weighted TPOT over its levels,
so one configuration serves the whole day. When the levels disagree -- speculation wins with one
request in flight and loses with 32, as measured on an H200 with low acceptance -- the weighted
answer hides a gain an SRE could still take (a separate low-concurrency pool, a band schedule).
So the recommendation lists, per level, the no-speculation TPOT, the recommended config's and the
best measured config's, each speedup with a start-then-request bootstrap (descriptive only: the
decision is a t interval on confirmation starts, docs/decisions.md), and says where a level alone
would pick differently. It only reports: the decision stays the weighted one.
"""

from __future__ import annotations

from autotune.core import _measure
from autotune.search._space import NONE, label
from autotune.search._trial import usable_starts


def measurement_objective(levels: dict | None, pooled: list[float], statistic: str) -> float:
    """A trial's objective: the traffic-weighted per-level statistic for a profile measurement
    (``_measure.weighted_statistic``), the statistic of ``pooled`` otherwise."""
    per = {L: d["tpot_ms"] for L, d in (levels or {}).items() if d.get("tpot_ms")}
    if per:
        return _measure.weighted_statistic(per, {L: float(levels[L].get("weight") or 0.0) for L in per}, statistic)
    return _measure.summarize(pooled, statistic)


def profile_groups(trials) -> tuple[dict[str, list[list[float]]], dict[str, float]] | None:
    """Per level, one group of TPOTs per server start, and the level weights; None when the
    trials carry no levels (a single-concurrency study). Which starts count is
    ``_trial.usable_starts``' one rule (stalled starts never, with no fallback)."""
    fresh, _ = usable_starts(trials)
    groups: dict[str, list[list[float]]] = {}
    weights: dict[str, float] = {}
    for t in fresh:
        for L, d in t.levels.items():
            if d.get("tpot_ms"):
                groups.setdefault(L, []).append(list(d["tpot_ms"]))
                weights.setdefault(L, float(d.get("weight") or 0.0))
    return (groups, weights) if groups else None


def _feasible(t) -> bool:
    return not t.constraints or all(c <= 0 for c in t.constraints.values())


def level_evidence(study, recommended_key: str, statistic: str, confidence: float, seed: int = 0) -> dict | None:
    """Per level of a ``_record.StudyRecord`` (keyed by the level as a string): weight, baseline, recommended and best
    measured config with TPOT and speedup CI, and ``advice`` lines; None for a study without
    levels. ``recommended_key``: the canonical key of the config the decision deploys (``none``
    for no speculation)."""
    base = profile_groups(study.trials(config_key=NONE))
    if base is None:
        return None
    b_groups, weights = base
    by_key: dict[str, list] = {}
    for t in study.trials():
        key = t.config_key
        if key and key != NONE and _feasible(t):
            by_key.setdefault(key, []).append(t)
    measured = {key: (ts[0].config, g[0]) for key, ts in by_key.items()
                if (g := profile_groups(ts)) is not None}
    levels = sorted(b_groups, key=int)

    def tpot(groups) -> float:
        return _measure.summarize([v for g in groups for v in g], statistic)

    def no_speculation(t: float) -> dict:
        return {"config": None, "config_key": NONE, "tpot_ms": t, "speedup": 1.0}

    out: dict = {"levels": {}, "advice": []}
    for L in levels:
        b, base_t = b_groups[L], tpot(b_groups[L])
        sides = {}
        for key, (cfg, groups) in measured.items():
            if L in groups:
                ci = _measure.bootstrap_ratio_ci(b, groups[L], statistic=statistic, confidence=confidence, seed=seed)
                sides[key] = {"config": cfg, "config_key": key, "server_starts": len(groups[L]),
                              "tpot_ms": tpot(groups[L]), "speedup": ci.ratio, "speedup_ci": [ci.low, ci.high]}
        rec = no_speculation(base_t) if recommended_key == NONE else sides.get(recommended_key)
        best = min(sides.values(), key=lambda x: x["tpot_ms"], default=None)
        if best is None or best["tpot_ms"] >= base_t:  # nothing beats no speculation at this level
            best = no_speculation(base_t)
        out["levels"][L] = {"weight": weights.get(L), "baseline_tpot_ms": base_t, "recommended": rec, "best": best}
        if best["config_key"] in (NONE, recommended_key) or rec is None:
            continue
        ref = b if recommended_key == NONE else measured[recommended_key][1][L]
        vs = _measure.bootstrap_ratio_ci(ref, measured[best["config_key"]][1][L], statistic=statistic,
                                         confidence=confidence, seed=seed)
        best.update(vs_recommended=vs.ratio, vs_recommended_ci=[vs.low, vs.high])
        if vs.wholly_above(1.0):
            out["advice"].append(
                f"at concurrency {L} alone, {label(best['config'])} is {vs.ratio:.2f}x faster than the "
                f"recommended {label(rec['config'])} ({confidence:.0%} CI {vs.low:.2f}-{vs.high:.2f}; "
                f"{best['tpot_ms']:.2f} vs {rec['tpot_ms']:.2f} ms {statistic} TPOT); the recommendation "
                f"optimizes the traffic-weighted TPOT over levels {', '.join(levels)}")
    return out
