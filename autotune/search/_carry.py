"""A night that starts from last night's search (experimental: ``objective.carry_search``).

Most of a GPU night is server start-up, and most nights the traffic is what it was: the search
would measure again what last night ranked. A nightly run measures the baseline and last night's
winner first anyway (the warm start); where those two starts measure what last night's did (the
winner's gain over no speculation within the start-to-start noise, its acceptance length within
``AL_TOLERANCE``), nothing the ranking rests on has moved, so last night's search stands and
tonight's starts go to the confirmation, which decides on fresh starts as on any night. Where they
do not agree, the search runs as any night's: the starts go where the traffic changed.

Last night's study must be comparable: the same storage, hardware, engine version and search
basis (space, levels and weights, statistic: ``search_basis``). A full search comes back at least
every ``objective.carry_max_nights`` nights, so a ranking never goes stale unseen.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field

from autotune.core._measure import StartNoise, pooled_start_noise
from autotune.search._levels import measurement_objective
from autotune.search._record import config_key_of, measurement_of, role_of
from autotune.search._space import NONE, canonical, label
from autotune.search._trials import ROLE_BASELINE, ROLE_CONFIRM, ROLE_SEARCH, stored_trials

AL_TOLERANCE = 0.10
"""Largest relative change of the winner's acceptance length that still counts as the same
traffic: acceptance moves with what the requests repeat, and a start measures it to about 1-2%
(five H100 starts of ngram K=10: 5.31-5.43)."""

Z = 1.645
"""The gain must agree within this many standard errors (90% two-sided): a change read as none
costs a search missed, a false alarm only the search any night runs."""


def search_basis(spec) -> str:
    """What last night's ranking is a ranking of: the space, the levels with their weights and the
    statistic (a hash kept on every study, ``search_basis`` user attribute)."""
    r = spec.replay
    basis = {"space": spec.space.model_dump(mode="json"), "levels": r.levels, "weights": r.level_weights,
             "concurrency": r.concurrency, "mode": r.mode, "statistic": spec.objective.statistic,
             "model": spec.model}
    return hashlib.sha256(json.dumps(basis, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class CarryVerdict:
    carried: bool
    reason: str
    detail: dict = field(default_factory=dict)


def _al(t) -> float | None:
    d = measurement_of(t).get("spec_delta") or {}
    return 1 + d["accepted_tokens"] / d["drafts"] if d.get("drafts") else None


def _log_objectives(trials, statistic: str) -> list[float]:
    out = []
    for t in trials:
        m = measurement_of(t)
        if not m.get("tpot_ms") or (t.constraints and any(c > 0 for c in t.constraints.values())):
            continue
        v = measurement_objective(m.get("levels"), m["tpot_ms"], statistic)
        if v > 0 and math.isfinite(v):
            out.append(math.log(v))
    return out


def _class_sd(spec, samples: dict[tuple[str, bool], list[float]], cls: str) -> float | None:
    """The start-to-start sd of log objective of one class (none, speculative): the spec's prior
    pooled with last night's repeated starts (of one configuration on one request set: ``samples``
    keyed by config and confirmation or not), weighted by degrees of freedom."""
    noise = pooled_start_noise({k: v for k, v in samples.items() if (k[0] == NONE) == (cls == "none")})
    if spec.objective.start_noise is not None:
        p = spec.objective.start_noise.for_class(cls)
        noise += StartNoise(math.log1p(p.cv) ** 2 * p.df, p.df)
    return noise.sd if noise.df else None


def judge(spec, previous_trials, tonight_trials, winner: dict, *, nights_before: int) -> CarryVerdict:
    """Does tonight's warm start measure what last night's study did? ``previous_trials``: last
    night's completed trials; ``tonight_trials``: tonight's completed ones (the baseline and the
    winner's search starts are read); ``winner``: last night's winner config;
    ``nights_before``: how many nights in a row before tonight carried their search."""
    most = spec.objective.carry_max_nights
    if nights_before >= most:
        return CarryVerdict(False, f"{nights_before} nights in a row carried their search (carry_max_nights "
                                   f"{most}): tonight searches in full")
    wkey, stat = canonical(winner), spec.objective.statistic
    tonight = [t for t in tonight_trials if role_of(t) in (ROLE_BASELINE, ROLE_SEARCH)]
    b_t = _log_objectives([t for t in tonight if config_key_of(t) == NONE], stat)
    w_t = _log_objectives([t for t in tonight if config_key_of(t) == wkey], stat)
    if not b_t or not w_t:
        return CarryVerdict(False, f"tonight has no feasible start of {'the baseline' if not b_t else label(winner)} to "
                                   "compare with last night's")
    # like with like: tonight's warm start replays the search requests, and the confirmation's requests are
    # others (their gain differs: 3.0x against 3.8x on the demo's code set), so the means are of last night's
    # search starts; its confirmation starts add to the noise figure only, each set apart
    samples: dict[tuple[str, bool], list[float]] = {}
    for t in previous_trials:
        samples.setdefault((config_key_of(t), role_of(t) == ROLE_CONFIRM), []).extend(_log_objectives([t], stat))
    b_y, w_y = samples.get((NONE, False)) or [], samples.get((wkey, False)) or []
    if not b_y or not w_y:
        return CarryVerdict(False, "last night's study has no feasible search start of the baseline and its winner")
    sd_n, sd_s = _class_sd(spec, samples, "none"), _class_sd(spec, samples, "speculative")
    if sd_n is None or sd_s is None:
        return CarryVerdict(False, "no start-to-start noise known (objective.start_noise, or repeated starts last "
                                   "night): tonight cannot tell a changed gain from noise")
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    gain_t, gain_y = mean(b_t) - mean(w_t), mean(b_y) - mean(w_y)  # log speedup over no speculation
    se = math.sqrt(sd_s ** 2 * (1 / len(w_t) + 1 / len(w_y)) + sd_n ** 2 * (1 / len(b_t) + 1 / len(b_y)))
    al_t = [a for a in map(_al, (t for t in tonight if config_key_of(t) == wkey)) if a]
    al_y = [a for a in map(_al, (t for t in previous_trials if config_key_of(t) == wkey
                                 and role_of(t) != ROLE_CONFIRM)) if a]
    al_change = (mean(al_t) / mean(al_y) - 1) if al_t and al_y else None
    detail = {"gain_tonight": round(math.exp(gain_t), 4), "gain_last_night": round(math.exp(gain_y), 4),
              "z": round((gain_t - gain_y) / se, 2), "bound_z": Z, "se_log": round(se, 4),
              "acceptance_length_tonight": round(mean(al_t), 3) if al_t else None,
              "acceptance_length_last_night": round(mean(al_y), 3) if al_y else None,
              "search_starts_last_night": {"none": len(b_y), wkey: len(w_y)},
              "sd_log": {"none": round(sd_n, 4), "speculative": round(sd_s, 4)}}
    said = (f"{label(winner)} ran {math.exp(gain_t):.2f}x of no speculation tonight against {math.exp(gain_y):.2f}x last "
            f"night ({(gain_t - gain_y) / se:+.1f} standard errors)")
    if al_change is not None:
        said += f", acceptance length {mean(al_t):.2f} against {mean(al_y):.2f}"
    if abs(gain_t - gain_y) > Z * se:
        return CarryVerdict(False, f"tonight differs from last night: {said}", detail)
    if al_change is not None and abs(al_change) > AL_TOLERANCE:
        return CarryVerdict(False, f"the traffic's acceptance moved: {said} ({al_change:+.0%}, more than "
                                   f"{AL_TOLERANCE:.0%})", detail)
    return CarryVerdict(True, f"last night's search stands: {said}", detail)


def against_last_night(study) -> tuple[CarryVerdict, str | None, int]:
    """The verdict on the study ``study.previous`` (a nightly run's current recommendation) names,
    that study's name, and how many nights in a row before it carried: ``judge`` where the two are
    comparable (same hardware, vLLM, storage and ``search_basis``), else why not."""
    import optuna

    prev = study.previous or {}
    winner = ((prev.get("evidence") or {}).get("winner") or {}).get("config")
    name, vf = (prev.get("study") or {}).get("name"), prev.get("valid_for") or {}
    if not winner:
        return CarryVerdict(False, "last night's recommendation names no winner"), name, 0
    if (vf.get("hardware"), vf.get("vllm_version")) != (study.hardware, study.caps.version):
        return CarryVerdict(False, f"last night ran on {vf.get('hardware')}, vLLM {vf.get('vllm_version')}; "
                                   f"tonight on {study.hardware}, vLLM {study.caps.version}"), name, 0
    if not name or name == study.name:
        return CarryVerdict(False, "last night's study is tonight's (the same replay set): nothing to carry"), name, 0
    try:
        old = optuna.load_study(study_name=name, storage=study.storage)
    except KeyError:
        return CarryVerdict(False, f"last night's study {name} is not in this storage"), name, 0
    basis = old.user_attrs.get("search_basis")
    if basis != study.study.user_attrs.get("search_basis"):
        return CarryVerdict(False, f"last night's study {name} " + (
            "searched another space, levels or statistic" if basis else "does not say what it searched (it "
            "predates carry_search)")), name, 0
    last = old.user_attrs.get("carry") or {}
    before = int(last.get("nights") or 0) if last.get("carried") else 0
    return judge(study.spec, stored_trials(old), study.trials(), winner, nights_before=before), name, before
