"""The statistics of the decision: each start's log statistic, the start-to-start variance of
each class of configs (``NOISE_CLASSES``: no speculation and the speculative configs vary
differently) pooled over this study's own repeated starts, the intervals of the comparisons, the
contenders, and the plan of the confirmation rounds.

The interval is a Student t interval on the log of each start's statistic, with Welch's interval
where a comparison mixes the two classes. A prior (the spec's ``objective.start_noise``, earlier
nights) never enters an interval, so the stated error holds on a machine it does not describe; it
plans the confirmation (``evidence.plan``), the error spent over the rounds the budget allows
(``planned_looks``, ``_measure.error_spending``). The method, its assumptions and its measured
error rates: docs/decisions.md.
"""

from __future__ import annotations

import dataclasses
import json
import math

from autotune.core import _measure
from autotune.core._measure import POWER_GAIN, POWER_TARGET, confirmation_power  # noqa: F401 (decide re-exports POWER_GAIN)
from autotune.core._spec import NOISE_CLASSES
from autotune.search._levels import measurement_objective
from autotune.search import _runoff
from autotune.search._record import StudyRecord
from autotune.search._space import NONE, canonical, label
from autotune.search._trial import usable_starts

#: earlier recommendations whose start-to-start variance is pooled into tonight's
HISTORY_NIGHTS = 14
ROLE_CONFIRM = "confirm"


def start_log_values(trials, statistic: str) -> list[float]:
    """log of each start's objective (the statistic of its per-request TPOT; the traffic-weighted
    per-level statistic for a profile study)."""
    out = []
    for t in trials:
        m = t.measurement
        v = measurement_objective(m.get("levels"), m["tpot_ms"], statistic)
        if v > 0 and math.isfinite(v):
            out.append(math.log(v))
    return out


def _matches(rec: dict, study: StudyRecord) -> bool:
    ev = rec.get("evidence") or {}
    vf = rec.get("valid_for") or {}
    spec = study.spec
    return (vf.get("model") == spec.model and vf.get("concurrency") == spec.replay.concurrency
            and vf.get("vllm_version") == (study.vllm_version if study.vllm_version is not None else vf.get("vllm_version"))
            and ev.get("statistic") == spec.objective.statistic
            and vf.get("hardware") == (study.hardware if study.hardware is not None else vf.get("hardware")))


def noise_class(key: str | None) -> str:
    """The class of ``NOISE_CLASSES`` whose start-to-start variance a config's starts share."""
    return "none" if key in (None, NONE) else "speculative"


def prior_noise(study: StudyRecord, history: list[dict] | None) -> dict[str, _measure.StartNoise]:
    """Start-to-start variance known before tonight, per class of ``NOISE_CLASSES`` and for
    ``"all"`` configurations pooled (each figure counted once): the spec's
    recorded A/A prior (``objective.start_noise``: a CV on ``df`` degrees of freedom, with the
    speculative configs' own figure where it gives one) and the own-study variance of up to
    ``HISTORY_NIGHTS`` earlier recommendations of the same model, vLLM, concurrency, hardware and
    statistic (each night measures the baseline two or more times: free A/A data; a night written
    before the classes counts its pooled figure for both)."""
    noise = {cls: _measure.StartNoise(0.0, 0) for cls in (*NOISE_CLASSES, "all")}

    def add(classes, ss, df, part):
        for cls in classes:
            noise[cls] += _measure.StartNoise(ss, df, (part,))

    sn = study.spec.objective.start_noise
    if sn is not None:
        sp = sn.speculative
        for p, classes, tag in ((sn, ("none", "all") if sp else (*NOISE_CLASSES, "all"), {}),
                                (sp, ("speculative", "all"), {"class": "speculative"})):
            if p is not None:
                add(classes, p.df * math.log1p(p.cv) ** 2, p.df,
                    {"source": "objective.start_noise", "cv": p.cv, "df": p.df, **tag})
    seen = {study.name}  # a rerun of tonight's study: its starts are already tonight's
    for rec in (history or [])[:HISTORY_NIGHTS]:
        n = (rec.get("evidence") or {}).get("noise") or {}
        sid = (rec.get("study") or {}).get("name")
        if not (n.get("study") or {}).get("df") or not _matches(rec, study) or sid in seen:
            continue  # a resumed study writes one recommendation per run: count its starts once
        seen.add(sid)
        by_class = n.get("by_class") or {}
        for cls in (*NOISE_CLASSES, "all"):
            own = (by_class.get(cls) or {}).get("study") if by_class and cls != "all" else n["study"]
            if own and own.get("df"):
                add((cls,), float(own["ss"]), int(own["df"]),
                    {"source": "history", "id": rec.get("id"), "study": sid, "df": int(own["df"])})
    return noise


PRIOR_CHECK_P = 0.01


def _prior_check(own: _measure.StartNoise, prior: _measure.StartNoise) -> dict:
    """``prior_check`` for the evidence when both have degrees of freedom: this study's own
    start-to-start sd against the prior's (spec and earlier nights), with the one-sided F tests
    both ways. The intervals never use the prior, so a conflict changes no decision; it says the
    plan (how many rounds the budget needs) and the search's stopping margin rest on a wrong
    figure, and that the machine's noise should be recorded again."""
    p_high = _measure.noisier_than_prior(own, prior)
    if p_high is None:
        return {}
    p_low = _measure.noisier_than_prior(prior, own)
    too = "small" if p_high < PRIOR_CHECK_P else "large" if p_low is not None and p_low < PRIOR_CHECK_P else None
    return {"prior_check": {"own_sd_log": own.sd, "own_df": own.df, "prior_sd_log": prior.sd,
                            "prior_df": prior.df, "p": p_high, "p_quieter": p_low, "conflict": too is not None,
                            "prior_too": too}}


def planned_looks(spec, starts_left: int | None = None, sides: int | None = None) -> int:
    """``ObjectiveSpec.planned_looks``: the confirmation rounds the error is spent over."""
    return spec.objective.planned_looks(starts_left, sides)


PRECISION = 2.0
"""A decision's interval must be no wider than this factor either way of its estimate: on one or
two degrees of freedom a 4x speedup can clear its threshold with an interval of 1.8-17x, which
says nothing an SRE can plan with; the decision stays open for another round instead."""


def _precise(ci) -> bool:
    return ci is not None and ci.low > 0 and math.isfinite(ci.high) \
        and ci.ratio / ci.low <= PRECISION and ci.high / ci.ratio <= PRECISION


def _comparisons(study: StudyRecord, history, best) -> dict:
    """Everything the decision compares, from the stored trials."""
    spec = study.spec
    stat = spec.objective.statistic
    inc = spec.incumbent
    inc_key = canonical(inc)
    win_key = best.config_key if best is not None else None
    by_key: dict[str, list] = {}
    for t in study.trials():
        by_key.setdefault(t.config_key, []).append(t)

    def confirmed(key):
        used, _ = usable_starts([t for t in by_key.get(key, []) if t.role == ROLE_CONFIRM])
        return used

    # start-to-start variance: every config with 2+ usable starts, the winner's selection start
    # excluded (it was picked for being fast: its deviation is biased); each class's own starts
    # alone (a prior, recorded or from earlier nights, may be another machine's or day's noise,
    # and a night's one or two contradicting starts cannot overrule twenty prior df); a class
    # with none of its own has no interval (the winner needs a second start), never another's
    samples = {}
    for key, ts in by_key.items():
        used, _ = usable_starts(ts)
        if key == win_key and key != inc_key:
            used = [t for t in used if t.role == ROLE_CONFIRM]
        samples[key] = start_log_values(used, stat)
    own = _measure.pooled_start_noise(samples)
    prior = prior_noise(study, history)
    by_class = {}
    for cls in NOISE_CLASSES:
        own_c = _measure.pooled_start_noise({k: v for k, v in samples.items() if noise_class(k) == cls})
        by_class[cls] = {"own": own_c, "prior": prior[cls], "noise": own_c}
    conf_info = study.confirmation or {}
    looks = int(conf_info.get("looks") or planned_looks(spec))
    if win_key and not samples.get(win_key):  # unconfirmed winner: its selection start is all there is
        samples[win_key] = start_log_values(usable_starts(by_key.get(win_key, []))[0], stat)
    b = confirmed(NONE)
    i = confirmed(inc_key) if inc else []
    w = confirmed(win_key) if win_key else []
    # the look: confirmation rounds run so far (a stalled start still spent its round)
    ran = [len([t for t in by_key.get(k, []) if t.role == ROLE_CONFIRM])
           for k in {NONE, inc_key, win_key} if k is not None]
    look = min(looks, max(1, max(ran, default=0)))
    alpha = (1.0 - spec.guards.confidence) / 2.0  # one-sided, per question
    spend = _measure.error_spending(alpha, looks)
    conf = 1.0 - 2.0 * spend[look - 1]
    return {"own": own, "prior": prior["all"], "noise": own, "by_class": by_class, "looks": looks, "look": look,
            "spent": sum(spend[:look]), "spent_per_look": spend, "confidence": conf, "stated": spec.guards.confidence, "B": b, "I": i, "W": w, "stat": stat,
            "samples": samples, "classes": {"B": "none", "I": noise_class(inc_key), "W": noise_class(win_key)},
            "logs": {k: start_log_values(v, stat) for k, v in (("B", b), ("I", i), ("W", w))}}


CONTENDER_CHANCE = 0.05
"""A measured configuration is listed as a contender while its chance of being faster than the
winner is at least this."""


def _versus(c: dict, key: str, win_key: str) -> tuple[float, float, float, float] | None:
    """(log gap, chance of being faster, its standard error, df) of config ``key`` against the
    winner in the decision's terms: all its usable starts against the winner's (its confirmation starts where it has them),
    one-sided t at each side's class noise. None where a class has no noise of its own yet."""
    from scipy.stats import t as t_dist

    samples = c.get("samples") or {}
    w, logs = samples.get(win_key) or [], samples.get(key) or []
    noise = {cls: d["noise"] for cls, d in c["by_class"].items()}
    nw, nc = noise[noise_class(win_key)], noise[noise_class(key)]
    if not w or not logs or nw.df <= 0 or nc.df <= 0:
        return None
    d = sum(logs) / len(logs) - sum(w) / len(w)
    se = math.sqrt(nc.sd ** 2 / len(logs) + nw.sd ** 2 / len(w))
    df = min(nc.df, nw.df)
    return d, (float(t_dist.cdf(-d / se, df)) if se > 0 else float(d < 0)), se, df


def contenders(c: dict, win_key: str | None, limit: int = 5) -> list[dict]:
    """The measured configurations the study cannot rule out as faster than its winner, at its own
    start-to-start noise: for each, its starts, its measured gap to the winner (positive: slower)
    and the one-sided t chance that it is the faster one (each side's class noise; the winner's
    selection start left out where it has confirmation starts, as in the decision). Ks a few
    percent apart under about 10% start-to-start noise stay contenders after a study's few starts
    (docs/benchmarks.md, the search benchmark's pair ceiling): the SRE sees which alternatives are
    as good as far as the study can tell, instead of one K stated as the answer. Its starts and
    the winner's may have run different requests (search, confirmation): ``indistinguishable``
    compares like with like where it can."""
    out = []
    for key, logs in (c.get("samples") or {}).items():
        v = _versus(c, key, win_key) if key != win_key and logs else None
        if v is not None and v[1] >= CONTENDER_CHANCE:
            cfg = None if key == NONE else json.loads(key)
            out.append({"config": cfg, "label": label(cfg), "starts": len(logs), "measured_gap": math.expm1(v[0]),
                        "chance_faster": v[1]})
    return sorted(out, key=lambda x: -x["chance_faster"])[:limit]


LIKELY_FASTER = 0.8
"""A configuration is likely faster than the winner when its chance of being faster by more than
the night's own resolution (its speculative start-to-start noise) is at least this: then the
recommendation says so in a warning (``evidence.likely_faster``) rather than present the winner as
the answer. A mere "more likely than not" fired on a quarter of the nights whose two best were 1%
apart, and was right on little more than half of them: a coin flip presented as an alarm. Below
it, the configuration stays in ``indistinguishable``."""


def chance_beyond(d: float, se: float, df: float, margin: float) -> float:
    """One-sided t chance that a configuration measured ``d`` (log gap to the winner, negative:
    faster) is truly faster than the winner by more than ``margin`` (log scale)."""
    from scipy.stats import t as t_dist

    if se <= 0:
        return float(d < -margin)
    return float(t_dist.cdf((-d - margin) / se, df))


def search_starts(study: StudyRecord) -> dict[str, list[float]]:
    """Each feasible speculative configuration's starts on the search requests (search and runoff
    starts; the objective, in the order measured): the same figures ``Study.search_starts`` gives
    the runoff, so the evidence judges like with like as the runoff did."""
    stat = study.spec.objective.statistic
    out: dict[str, list[float]] = {}
    for t in sorted(study.trials(), key=lambda t: t.number):
        if t.config_key == NONE or t.role == ROLE_CONFIRM or not t.constraints \
                or not all(v <= 0 for v in t.constraints.values()):
            continue
        m = t.measurement
        v = measurement_objective(m.get("levels"), m["tpot_ms"], stat) if m.get("tpot_ms") else t.value
        if v is not None and v > 0 and math.isfinite(v):
            out.setdefault(t.config_key, []).append(v)
    return out


def runoff_entrants(study: StudyRecord, starts: dict[str, list[float]]) -> list[str]:
    """The runoff's entrants that have their runoff start (``_study.runoff_winner``'s set)."""
    ran = {t.config_key for t in study.trials() if t.runoff_round is not None}
    return [k for k in (study.runoff or {}).get("entrants") or [] if k in ran and k in starts]


def indistinguishable(study: StudyRecord, c: dict, win_key: str | None, limit: int = 5) -> list[dict]:
    """The speculative configurations the study could not tell apart from its winner: each one's
    chance of being faster than the winner at the study's own speculative start-to-start noise
    (one-sided t), listed from ``CONTENDER_CHANCE`` up. Like with like where both have two or more
    starts on the search requests (a runoff's, or the search's repeats): the mean log of the same
    number of first starts each (the runoff's own ``n`` between its entrants, ``_runoff.like_with_like``),
    so a runoff's winner is never listed as likely slower than an entrant it beat. Otherwise, as
    ``contenders``: all the configuration's starts against the winner's confirmation starts."""
    from scipy.stats import t as t_dist

    if not win_key or win_key == NONE:
        return []
    nz = c["by_class"]["speculative"]["noise"]
    starts = search_starts(study)
    entrants = runoff_entrants(study, starts)
    w = starts.get(win_key) or []
    out = []
    for key, sx in starts.items():
        if key == win_key:
            continue
        if len(sx) >= 2 and len(w) >= 2 and nz.df > 0:
            keys = entrants if key in entrants and win_key in entrants else [key, win_key]
            n, means = _runoff.like_with_like(starts, keys)
            d = means[key] - means[win_key]
            se, df = nz.sd * math.sqrt(2.0 / n), nz.df
            chance = float(t_dist.cdf(-d / se, nz.df)) if se > 0 else float(d < 0)
            basis, count = f"like with like: the first {n} search starts of each", n
        else:
            v = _versus(c, key, win_key)
            if v is None:
                continue
            d, chance, se, df = v
            basis, count = "against the winner's confirmation starts", len((c.get("samples") or {}).get(key) or [])
        if chance >= CONTENDER_CHANCE:
            cfg = json.loads(key)
            out.append({"config": cfg, "label": label(cfg), "starts": count, "measured_gap": math.expm1(d),
                        "chance_faster": chance, "resolution": math.expm1(nz.sd) if nz.df > 0 else None,
                        "chance_faster_beyond_resolution": chance_beyond(d, se, df, nz.sd if nz.df > 0 else 0.0),
                        "basis": basis})
    return sorted(out, key=lambda x: -x["chance_faster"])[:limit]


def runoff_evidence(study: StudyRecord) -> dict | None:
    """``evidence.runoff``: who ran off (labels), in which order, the figures the winner was chosen
    on (mean TPOT of the first ``n`` search starts of each), or why there was none."""
    plan = study.runoff or {}
    if not plan:
        return None
    lab = {k: label(json.loads(k)) for k in plan.get("entrants") or []}
    out: dict = {"entrants": list(lab.values()), "chances": {lab[k]: p for k, p in (plan.get("chances") or {}).items()
                                                             if k in lab},
                 "noise": plan.get("noise")}
    for k in ("skipped", "trimmed"):
        if plan.get(k):
            out[k] = plan[k]
    if plan.get("order"):
        out["order"] = [lab[k] for k in plan["order"]]
    starts = search_starts(study)
    ran = runoff_entrants(study, starts)
    if len(ran) >= 2:
        n, means = _runoff.like_with_like(starts, ran)
        won = _runoff.winner(starts, ran)
        out.update(starts_each=n, tpot_ms={lab[k]: math.exp(means[k]) for k in ran}, winner=lab[won])
    return out


def _ci(c: dict, ref: str, cand: str):
    """``ref`` over ``cand`` (speedup of ``cand``), each side with its class's start-to-start noise."""
    a, b = c["logs"][ref], c["logs"][cand]
    if not a or not b:
        return None
    na, nb = (c["by_class"][c["classes"][x]]["noise"] for x in (ref, cand))
    ci = _measure.start_ratio_ci(a, b, na, c["confidence"], noise_b=nb)
    return dataclasses.replace(ci, label=c["stated"])


FUTILITY_POWER = 0.10
"""Confirmation stops early for futility when the chance that the planned rounds left would
still settle the question, at the trend measured so far, falls below this."""


def _futility_sd(c: dict, cls: str) -> float | None:
    """The start-to-start sd the futility bound uses for a class: the smallest figure known for it
    (this study's own starts, its prior), or, where it has neither, the smallest of the other
    class's. The smallest, because a larger figure stops more nights whose gain is real: with the
    plan's figure (own and prior pooled) and a prior twice the truth, power at a true 20% gain
    fell to 75%; with the smallest it stays at 83% (benchmarks/decisions.py)."""
    own = c["by_class"][cls]
    pool = [own] if own["own"].df > 0 or own["prior"].df > 0 else list(c["by_class"].values())
    figs = [n.sd for d in pool for n in (d["own"], d["prior"]) if n.df > 0]
    return min(figs) if figs else None


def futility(c: dict, ref: str, cand: str, threshold: float, upward: bool = True) -> dict | None:
    """Conditional power of one question at this look: the chance that the rounds left until the
    last planned look would still show ``cand`` faster than ``ref`` by more than ``threshold``
    (``upward``; else slower than ``threshold``), if the trend measured so far is the truth
    (Lan, Simon and Halperin's stochastic curtailment on the B-value scale: with information
    fraction ``t``, ``CP = 1 - Phi((z_L - Z_t / sqrt(t)) / sqrt(1 - t))``, ``z_L`` the last look's
    boundary). Non-binding: stopping for it turns an open question into ``keep``, never into a
    ``change`` or ``disable``, so it cannot raise either error, whatever noise figure it uses;
    it uses the smallest the study knows, which exists from the first round (``_futility_sd``).
    None at the last look, or where no noise figure is known."""
    from scipy.stats import norm

    looks, look = c["looks"], c["look"]
    a, b = c["logs"][ref], c["logs"][cand]
    if look >= looks or not a or not b:
        return None
    sa, sb = _futility_sd(c, c["classes"][ref]), _futility_sd(c, c["classes"][cand])
    if sa is None or sb is None or not (sa > 0 or sb > 0):
        return None
    left = looks - look
    se = math.sqrt(sa ** 2 / len(a) + sb ** 2 / len(b))
    se_last = math.sqrt(sa ** 2 / (len(a) + left) + sb ** 2 / (len(b) + left))
    d = sum(a) / len(a) - sum(b) / len(b) - math.log(threshold)
    z = (d if upward else -d) / se
    t = (se_last / se) ** 2
    alpha = c["spent_per_look"][-1]
    cp = float(1.0 - norm.cdf((norm.ppf(1.0 - alpha) - z / math.sqrt(t)) / math.sqrt(1.0 - t)))
    return {"conditional_power": cp, "look": look, "looks": looks, "stopped": cp < FUTILITY_POWER}


def _noise_evidence(c: dict) -> dict:
    """``evidence.noise``: every class pooled (what older readers and the F test read), and
    ``by_class``: each class's own figure, the one its intervals use, beside its prior (spec and
    earlier nights: the plan's figure, never an interval's). ``study`` is what later nights read
    as their history."""
    by_class = {cls: {**d["noise"].to_dict(), "study": {"ss": d["own"].ss, "df": d["own"].df},
                      "prior_df": d["prior"].df, "prior_sd_log": d["prior"].sd if d["prior"].df else None}
                for cls, d in c["by_class"].items()}
    return {**c["noise"].to_dict(), "study": {"ss": c["own"].ss, "df": c["own"].df},
            "prior_df": c["prior"].df, **_prior_check(c["own"], c["prior"]), "by_class": by_class}


MAX_PLAN_ROUNDS = 12


def _plan(c: dict, deployed: bool, alpha: float) -> dict:
    """``evidence.plan``: the looks planned, this one, the error spent so far; and about how often
    the planned rounds would see a true 20% gain at the noise expected (each class's own starts
    pooled with its prior: everything known, since this only plans), with the rounds that would
    reach 80% where they fall short, so a budget too small for this machine says so."""
    out = {"looks": c["looks"], "look": c["look"], "alpha_spent": c["spent"], "confidence": c["confidence"]}
    sd = {}
    for cls, d in c["by_class"].items():
        known = d["own"] + d["prior"]
        sd[cls] = known.sd if known.df > 0 else None
    ref = "speculative" if deployed else "none"
    if sd["speculative"] is None or sd[ref] is None:
        return out

    def power(rounds: int) -> float:
        return confirmation_power(sd[ref], sd["speculative"], rounds, deployed, alpha)

    p = power(c["looks"])
    out.update(expected_sd_log={"reference": sd[ref], "winner": sd["speculative"]}, power_at_20pct=p)
    if p < POWER_TARGET:
        need = next((r for r in range(c["looks"] + 1, MAX_PLAN_ROUNDS + 1) if power(r) >= POWER_TARGET), None)
        out["short"] = (f"at the expected start-to-start noise ({sd['speculative']:.1%} for speculative configs), "
                        f"{c['looks']} confirmation round{'s' * (c['looks'] != 1)} see a true 20% gain in about "
                        f"{p:.0%} of nights (target 80%); "
                        + (f"{need} rounds would: raise objective.confirm_max_starts to {need} and "
                           f"budget.max_server_starts by {(need - c['looks']) * (3 if deployed else 2)}"
                           if need else f"not even {MAX_PLAN_ROUNDS} rounds would: lower the noise "
                                        "(replay.windows, more requests per start)"))
    return out


def _fmt_ci(ci) -> str:
    if ci is None:
        return "not measured"
    hi = "inf" if math.isinf(ci.high) else f"{ci.high:.2f}"
    return f"{ci.ratio:.2f}x, {_label(ci)} {ci.low:.2f}-{hi}, {ci.n_a} vs {ci.n_b} starts, {ci.df} df"


def _label(ci) -> str:
    """"95% CI" for a plain interval; for a look of the sequential confirmation, what all its
    looks promise together and this look's share."""
    if ci.label is None or ci.label == ci.confidence:
        return f"{ci.confidence:.1%} CI"
    return f"{ci.label:.0%} CI (repeated: {ci.confidence:.1%} at this look)"
