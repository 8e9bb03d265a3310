"""The decision and the file SREs deploy: ``recommendations/<workload>.json``.

``change`` only when the winner beats the *incumbent* (the deployed config, measured in the same
study; no speculation when nothing is deployed) by more than ``objective.min_gain`` with the
stated confidence, is not slower than no speculation either (shown faster than it, when a config
is deployed), on confirmation starts that did not select it, with an interval that states the
gain within ``PRECISION``, and passes every guard; ``disable`` only when the incumbent is shown
slower than no speculation (and no winner is shown faster than none); otherwise ``keep``, with
the reason (``evidence.keep_reason``). The interval is a Student t interval on the log of each
start's statistic, the start-to-start variance pooled over this study's own repeated starts,
separately for no speculation and for the speculative configs (``NOISE_CLASSES``: they vary
differently), with Welch's interval where a comparison mixes the two. A prior (the spec's
``objective.start_noise``, earlier nights) never enters an interval, so the stated error holds on
a machine it does not describe; it plans the confirmation (``evidence.plan``). Confirmation goes on
in interleaved rounds while the decision is open, the error spent over the rounds the budget
allows (``planned_looks``, ``_measure.error_spending``). The method, its assumptions and its
measured error rates: docs/decisions.md. The file is written to a temp file and renamed, so a crash or a
full disk leaves the previous recommendation intact.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from pathlib import Path

from autotune.core import _measure
from autotune.core._files import SHARED, write_json
from autotune.core._spec import NOISE_CLASSES
from autotune.core._store import safe_url
from autotune.engines import _registry
from autotune.engines._serverlog import added
from autotune.search._levels import level_evidence, measurement_objective, profile_groups
from autotune.search._space import NONE, canonical, label
from autotune.search._trial import spec_counters, usable_starts
from autotune.traffic._sampling import read_manifest

SCHEMA = "autotune.recommendation/1"
EXPIRY_DAYS = 7
#: earlier recommendations whose start-to-start variance is pooled into tonight's
HISTORY_NIGHTS = 14
ROLE_CONFIRM = "confirm"


@dataclass
class Decision:
    decision: str           # change | keep | disable
    reason: str
    winner: dict | None     # speculative config recommended (None: no speculation)
    evidence: dict


def fmt_config(cfg: dict | None) -> str:
    """The config label of messages SREs read (``_space.label``; no config: "no speculation")."""
    return label(cfg, none="no speculation")


def _median(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def _side(trials, statistic: str, decided_on: list | None = None) -> dict:
    """Descriptive figures of one config's starts (every usable start pooled) and the starts the
    decision used (``decision_trials``)."""
    used, excluded = usable_starts(trials)
    pooled = [v for t in used for v in t.measurement["tpot_ms"]]
    profile = profile_groups(used)
    counters = spec_counters(trials)
    summaries = [t.measurement["summary"] for t in trials]
    return {
        "tpot_ms": (_measure.weighted_statistic(*profile, statistic) if profile
                    else _measure.summarize(pooled, statistic) if pooled else None),
        "tpot_ms_percentiles": _measure.percentiles(pooled) if pooled else {},
        "server_starts": len(trials), "stalled_starts": sum(1 for t in trials if t.stalled),
        "excluded_starts": excluded,
        "mixed_tpot_starts": [t.number for t in trials if t.measurement.get("tpot_mixed")],
        "requests": len(pooled),
        "output_throughput": (sum(s["output_throughput_tok_s"] for s in summaries) / len(summaries)
                              if summaries else None),
        "acceptance_length": counters["acceptance_length"],
        "ttft_ms_p90": _median([(s.get("ttft_ms") or {}).get("p90") for s in summaries]),
        "trials": [t.number for t in trials],
        "decision_trials": [t.number for t in (decided_on or [])],
        "start_seconds": _median([t.measurement["start_seconds"] for t in trials]),
    }


def replay_provenance(replay_path) -> dict:
    """What the replay set's manifest says about where its requests came from (empty for sets
    written by hand or by ``autotune demo``, which have none)."""
    m = read_manifest(replay_path)
    if not m:
        return {}
    keep = ("workload", "window", "sources", "content_hash", "requests", "synthetic_requests")
    return {"manifest": {k: m[k] for k in keep if k in m},
            "acceptance_measurable": bool(m.get("acceptance_measurable", True))}


def decide(study, history: list[dict] | None = None) -> Decision:
    """The decision (see the module doc), held back to ``keep`` when the replay set cannot
    measure acceptance: prompts made up from a length-only trace (Mooncake style) say how fast a
    config runs but not how often production's drafts would be accepted, so no speculative
    config is recommended from them; the would-be winner stays in the evidence.

    ``history``: earlier recommendations of the workload, newest first (``_history.history``);
    their own studies' start-to-start variance is pooled into tonight's (same model, vLLM,
    concurrency and statistic; the last ``HISTORY_NIGHTS``)."""
    d = _decide(study, history)
    rs = study.replay_set
    prov = replay_provenance(rs.path) if rs is not None else {}
    if prov.get("acceptance_measurable", True) or d.decision != "change":
        return d
    synthetic = prov["manifest"].get("synthetic_requests")
    why = (f"the replay set has synthetic prompts ({synthetic} of {len(study.replay_set.requests)} requests "
           f"from a length-only trace; manifest acceptance_measurable false), so the measured acceptance "
           f"is not production's: {d.reason} -- not recommended")
    incumbent_key = canonical(study.spec.incumbent)
    d.evidence["held_back_winner"] = d.winner
    d.evidence["keep_reason"] = "acceptance not measurable"
    return Decision("keep", why + ("; keep serving without speculation" if incumbent_key == NONE
                                   else "; keep the deployed config"),
                    study.spec.incumbent if incumbent_key != NONE else None, d.evidence)


def damp(d: Decision, study, previous: dict | None, now: dt.datetime | None = None) -> Decision:
    """Hold back a new config within ``drift.min_days_between_changes`` of the last recommendation.

    Nightly retuning on noisy traffic would otherwise flip between near-equal configs and make
    SREs redeploy for nothing. Not damped: a first recommendation, an older one, a ``disable``
    (the deployed speculation is shown slower than none: never wait on that), a change of vLLM
    version, and an incumbent whose acceptance fell below ``drift.min_acceptance_rate`` (the
    traffic moved).
    """
    days = study.spec.drift.min_days_between_changes
    if not days or previous is None or d.decision == "disable":
        return d
    prev_cfg = previous.get("speculative_config")
    if canonical(prev_cfg) == canonical(d.winner):
        return d
    now = now or dt.datetime.now(dt.timezone.utc)
    try:
        made = dt.datetime.fromisoformat(previous["created_at"])
    except (KeyError, TypeError, ValueError):
        return d
    age_days = (now - made).total_seconds() / 86400.0
    if age_days >= days:
        return d
    prev_version = (previous.get("engine") or {}).get("vllm_version") or (previous.get("valid_for") or {}).get("vllm_version")
    if prev_version and prev_version != study.vllm_version:
        return d
    inc = study.spec.incumbent
    rate = spec_counters(study.trials(config_key=canonical(inc)))["acceptance_rate"] if inc else None
    if rate is not None and rate < study.spec.drift.min_acceptance_rate:
        return d
    d.evidence["damped"] = {"held_back_winner": d.winner, "held_back_decision": d.decision,
                            "previous_id": previous.get("id"), "previous_created_at": previous.get("created_at"),
                            "age_days": round(age_days, 2), "min_days_between_changes": days}
    d.evidence["keep_reason"] = "damped"
    why = (f"damped: the last recommendation ({fmt_config(prev_cfg)}, {age_days:.1f} days old) stands for "
           f"{days:g} days unless the traffic drifts or vLLM changes; held back: {d.reason}")
    return Decision("keep", why, prev_cfg, d.evidence)


# ---- the statistics of the decision -----------------------------------------------------------
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


def _matches(rec: dict, study) -> bool:
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


def prior_noise(study, history: list[dict] | None) -> dict[str, _measure.StartNoise]:
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


def _comparisons(study, history, best) -> dict:
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
            "spent": sum(spend[:look]), "confidence": conf, "B": b, "I": i, "W": w, "stat": stat,
            "samples": samples, "classes": {"B": "none", "I": noise_class(inc_key), "W": noise_class(win_key)},
            "logs": {k: start_log_values(v, stat) for k, v in (("B", b), ("I", i), ("W", w))}}


CONTENDER_CHANCE = 0.05
"""A measured configuration is listed as a contender while its chance of being faster than the
winner is at least this."""


def contenders(c: dict, win_key: str | None, limit: int = 5) -> list[dict]:
    """The measured configurations the study cannot rule out as faster than its winner, at its own
    start-to-start noise: for each, its starts, its measured gap to the winner (positive: slower)
    and the one-sided t chance that it is the faster one (each side's class noise; the winner's
    selection start left out where it has confirmation starts, as in the decision). Ks a few
    percent apart under about 10% start-to-start noise stay contenders after a study's few starts
    (docs/benchmarks.md, the search benchmark's pair ceiling): the SRE sees which alternatives are
    as good as far as the study can tell, instead of one K stated as the answer."""
    from scipy.stats import t as t_dist

    samples = c.get("samples") or {}
    w = samples.get(win_key) or []
    if not w:
        return []
    noise = {cls: d["noise"] for cls, d in c["by_class"].items()}
    nw = noise[noise_class(win_key)]
    if nw.df <= 0:
        return []
    out = []
    for key, logs in samples.items():
        nc = noise[noise_class(key)]
        if key == win_key or not logs or nc.df <= 0:
            continue
        d = sum(logs) / len(logs) - sum(w) / len(w)
        se = math.sqrt(nc.sd ** 2 / len(logs) + nw.sd ** 2 / len(w))
        chance = float(t_dist.cdf(-d / se, min(nc.df, nw.df))) if se > 0 else float(d < 0)
        if chance >= CONTENDER_CHANCE:
            cfg = None if key == NONE else json.loads(key)
            out.append({"config": cfg, "label": label(cfg), "starts": len(logs), "measured_gap": math.expm1(d),
                        "chance_faster": chance})
    return sorted(out, key=lambda x: -x["chance_faster"])[:limit]


def _ci(c: dict, ref: str, cand: str):
    """``ref`` over ``cand`` (speedup of ``cand``), each side with its class's start-to-start noise."""
    a, b = c["logs"][ref], c["logs"][cand]
    if not a or not b:
        return None
    na, nb = (c["by_class"][c["classes"][x]]["noise"] for x in (ref, cand))
    return _measure.start_ratio_ci(a, b, na, c["confidence"], noise_b=nb)


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


POWER_GAIN = 0.20
POWER_TARGET = 0.80
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
    effect = math.log1p(POWER_GAIN)

    def power(rounds: int) -> float:
        a = _measure.error_spending(alpha, rounds)[-1]
        if deployed:  # incumbent: its search start and the rounds; winner: the rounds
            df = 2 * rounds - 1
        elif rounds < 2:
            return 0.0
        else:
            df = _measure.welch_df(sd["none"] ** 2 / rounds, rounds, sd["speculative"] ** 2 / rounds, rounds - 1)
        return _measure.detect_power(effect, sd[ref], sd["speculative"], rounds, df, a)

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
    return f"{ci.ratio:.2f}x, {ci.confidence:.1%} CI {ci.low:.2f}-{hi}, {ci.n_a} vs {ci.n_b} starts, {ci.df} df"


def open_question(study, history: list[dict] | None = None) -> bool:
    """After a confirmation round: is the decision still open, so that one more interleaved round
    (``objective.confirm_max_starts``) could settle it? Open while the comparison that decides
    straddles its threshold, or while the incumbent looks slower than no speculation without
    being shown slower."""
    d = _decide(study, history)
    return bool(d.evidence.get("open"))


def _decide(study, history: list[dict] | None = None) -> Decision:
    spec = study.spec
    statistic = spec.objective.statistic
    inc = spec.incumbent
    inc_key = canonical(inc)
    deployed = inc_key != NONE
    gain = spec.objective.min_gain or 0.0
    baseline = study.trials(config_key=NONE)
    best = study.best()  # the search's pick; a fast confirmation start never re-picks
    c = _comparisons(study, history, best)
    conf_info = study.confirmation or {}
    evidence: dict = {
        "statistic": statistic,
        "method": "t interval on log per-start " + statistic + " TPOT, confirmation starts only; "
                  "start-to-start variance of each side's class (no speculation, speculative) pooled over "
                  "this study's repeated starts of its configs (no prior); Welch's interval where the classes "
                  "differ; the error spent over the planned looks (O'Brien-Fleming shape)",
        "comparison": None, "baseline": _side(baseline, statistic, c["B"]),
        "min_gain": gain, "confidence": c["confidence"], "stated_confidence": spec.guards.confidence,
        "looks": c["looks"], "look": c["look"],
        "noise": _noise_evidence(c),
        "plan": _plan(c, deployed, (1.0 - spec.guards.confidence) / 2.0),
        "starts": {"baseline": len(c["B"]), "incumbent": len(c["I"]) if deployed else None,
                   "winner": len(c["W"]) if best is not None else None},
        "confirmation": {"fresh_requests": conf_info.get("fresh_requests"), "rounds": conf_info.get("rounds"),
                         "skipped": conf_info.get("skipped")},
    }
    if profile_groups(baseline):  # a concurrency profile: each start's traffic-weighted per-level statistic
        evidence["objective"] = "traffic-weighted per-level " + statistic
    ci_in = _ci(c, "B", "I") if deployed else None  # incumbent vs no speculation
    if deployed:
        evidence["incumbent"] = _side(study.trials(config_key=inc_key), statistic, c["I"])
        evidence["incumbent"]["config"] = inc
        evidence["incumbent_vs_none"] = ci_in.to_dict() if ci_in else None
    keep_cfg = inc if deployed else None

    def keep(code: str, why: str, open_: bool = False) -> Decision:
        evidence["keep_reason"] = code
        evidence["open"] = open_
        tail = "; keep the deployed config" if deployed else "; keep serving without speculation"
        return Decision("keep", why + tail, keep_cfg, evidence)

    def disable_or(code: str, why: str, open_: bool = False) -> Decision:
        """``disable`` when the incumbent is shown slower than no speculation, else keep. Still
        open (another confirmation round may settle it) while the incumbent looks slower than
        no speculation without being shown slower."""
        if ci_in is not None and ci_in.wholly_below(1.0) and _precise(ci_in):
            evidence["open"] = False
            evidence["disable_because"] = f"the deployed config is slower than no speculation ({_fmt_ci(ci_in)})"
            return Decision("disable", f"{why}; {evidence['disable_because']}; disable the deployed speculation",
                            inc, evidence)
        if ci_in is not None:
            open_ = open_ or ci_in.ratio < 1.0
            why += (f"; the deployed config is slower than no speculation, but on too few starts to say by how "
                    f"much ({_fmt_ci(ci_in)})" if ci_in.wholly_below(1.0) else
                    f"; the deployed config is not shown slower than no speculation ({_fmt_ci(ci_in)})")
        return keep(code, why, open_)

    if best is None:
        evidence["comparison"] = "incumbent_vs_none" if deployed else "none"
        return disable_or("no candidate", "no speculative configuration completed and passed the guards")
    key = best.config_key
    cfg = best.config
    wtrials = study.trials(config_key=key)
    evidence["winner"] = _side(wtrials, statistic, c["W"])
    evidence["winner"]["config"] = cfg
    evidence["contenders"] = contenders(c, key)
    short = drafts_short(wtrials)
    if short:
        evidence["drafts_short"] = short
    vs_none = _ci(c, "B", "W")
    evidence["winner_vs_none"] = vs_none.to_dict() if vs_none else None
    eq = [t.equivalence for t in wtrials]
    evidence["equivalence"] = {"compared": sum(e.get("compared", 0) for e in eq),
                               "matched": sum(e.get("matched", 0) for e in eq),
                               "min_compared": spec.guards.equivalence_min_compared}
    bt, wt = evidence["baseline"]["output_throughput"], evidence["winner"]["output_throughput"]
    evidence["throughput_ratio"] = wt / bt if bt and wt is not None else None
    evidence["failed_requests"] = sum(t.measurement["summary"].get("failed", 0) for t in wtrials)
    evidence["single_start_only"] = len(c["B"]) < 2 or len(c["W"]) < 2
    label = fmt_config(cfg)  # noqa: F811 (a local name: the label of the winner)
    if key == inc_key:
        evidence["comparison"] = "incumbent_vs_none"
        ref = vs_none if vs_none is not None else ci_in
        if ref is not None:
            evidence["speedup"], evidence["speedup_ci"] = ref.ratio, [ref.low, ref.high]
        return disable_or("incumbent is the best", f"the deployed config {label} is still the best measured")
    evidence["comparison"] = "winner_vs_incumbent" if deployed else "winner_vs_none"
    if not c["W"]:
        skipped = conf_info.get("skipped") or (
            "objective.confirm_starts is 0" if not spec.objective.confirm_starts else
            "no usable confirmation start (" + "; ".join(f"trial {x['trial']}: {x['why']}"
                                                        for x in evidence["winner"]["excluded_starts"]) + ")"
            if evidence["winner"]["excluded_starts"] else "the server-start budget was spent")
        evidence["confirmation"]["skipped"] = skipped
        return disable_or("not confirmed", f"best candidate {label} was not confirmed on fresh starts "
                                           f"({skipped}): inconclusive, a change needs confirmation",
                          open_=bool(evidence["winner"]["excluded_starts"]) and not conf_info.get("skipped"))
    vs = _ci(c, "I", "W") if deployed else vs_none
    if vs is None:
        what = f"the deployed config {fmt_config(inc)}" if deployed else "no speculation (the baseline)"
        return keep("reference not confirmed", f"{what} has no usable confirmation start (outside tonight's "
                                               f"space, the budget, or every start excluded): {label} cannot be "
                                               "compared with it; inconclusive")
    evidence["speedup"], evidence["speedup_ci"] = vs.ratio, [vs.low, vs.high]
    ref_name = f"the deployed {fmt_config(inc)}" if deployed else "no speculation"
    guard_fail = _guard_failure(spec.guards, evidence)
    if guard_fail:
        return disable_or("guard", f"best candidate {label} fails a guard: {guard_fail}")
    threshold = 1.0 + gain
    starts_used = len(c["B"]) + len(c["W"]) + (len(c["I"]) if deployed else 0)
    if vs.df <= 0:
        return disable_or("noise unmeasured", f"{label} vs {ref_name}: {_fmt_ci(vs)}; the {c['classes']['W']} "
                                              "configurations' start-to-start noise is not measured yet (the "
                                              "winner needs two confirmation starts); inconclusive", open_=True)
    # never a change to something slower than turning speculation off: against a deployed config,
    # the winner must also be shown faster than no speculation, at the same confidence
    beats_none = not deployed or (vs_none is not None and vs_none.wholly_above(1.0))
    if vs.wholly_above(threshold) and beats_none:
        if not (_precise(vs) and (not deployed or _precise(vs_none))):
            return disable_or(f"imprecise after {starts_used} starts",
                              f"{label} is faster than {ref_name} ({_fmt_ci(vs)}), but the interval is wider than "
                              f"{PRECISION:g}x either way of its estimate: too few starts to state the gain",
                              open_=True)
        why = (f"{label} is {vs.ratio:.2f}x faster in {statistic} TPOT than {ref_name} "
               f"({vs.confidence:.1%} CI {vs.low:.2f}-{vs.high:.2f}, {vs.n_b} vs {vs.n_a} confirmation starts, "
               f"{vs.df} df" + (f", min_gain {gain:.0%}" if gain else "") + ")")
        evidence["open"] = False
        return Decision("change", why, cfg, evidence)
    if vs.wholly_above(threshold):  # faster than the deployed config, not shown faster than none
        settled = vs_none is not None and vs_none.high <= 1.0
        return disable_or("not faster than no speculation",
                          f"best candidate {label} is faster than {ref_name} ({_fmt_ci(vs)}) but not shown faster "
                          f"than no speculation ({_fmt_ci(vs_none)})", open_=not settled)
    if vs.high <= threshold:
        return disable_or("not faster", f"best candidate {label} is not faster than {ref_name} by more than "
                                        f"{gain:.0%} ({_fmt_ci(vs)})")
    return disable_or(f"inconclusive after {starts_used} starts",
                      f"inconclusive after {starts_used} confirmation starts: {label} vs {ref_name} "
                      f"{_fmt_ci(vs)}, the interval straddles {threshold:.2f}", open_=True)


def drafts_short(trials) -> dict | None:
    """``evidence.drafts_short``: the winner's starts in which no draft was accepted past a
    position below its K (``summary.drafts_short``, ``_metrics.draft_reach``): either the engine
    drafted fewer tokens than configured (vLLM 0.25's compile cache gave the GPU n-gram proposer
    another K's kernel) or the drafter never agrees that far; either way the positions past it
    bought nothing, and the figures are not those of the K the config sets."""
    short = [s for t in trials if (s := t.summary.get("drafts_short"))]
    if not short:
        return None
    return {"starts": len(short), "of": len(trials), "position": short[0]["position"], "k": short[0]["k"]}


def _guard_failure(guards, ev: dict) -> str | None:
    if ev["failed_requests"] > guards.max_failed_requests:
        return f"{ev['failed_requests']} failed requests (max {guards.max_failed_requests})"
    eq = ev["equivalence"]
    if eq["compared"] < guards.equivalence_min_compared:
        ev["equivalence"]["checked"] = False
        if guards.equivalence_required:
            return (f"greedy equivalence not checked: {eq['compared']} greedy requests compared, "
                    f"{guards.equivalence_min_compared} needed (guards.equivalence_min_compared; "
                    "guards.equivalence_required: false opts out)")
    elif eq["compared"] and eq["matched"] / eq["compared"] < guards.equivalence_min_match:
        return f"greedy outputs matched the baseline on {eq['matched']}/{eq['compared']} requests"
    if ev["throughput_ratio"] is not None and ev["throughput_ratio"] < guards.throughput_floor:
        return f"throughput {ev['throughput_ratio']:.2f}x of baseline (floor {guards.throughput_floor})"
    return None


def _pct(c: float) -> str:
    return f"{100 * c:.1f}".rstrip("0").rstrip(".") + "%"


def comparison_lines(ev: dict) -> list[str]:
    """What ``recommend show`` prints about the decision: which comparison, the starts on each
    side, the intervals, and why a keep is a keep. Reads older files too (they compared the
    winner with no speculation, on every start)."""
    out = []
    comp = ev.get("comparison") or ("winner_vs_none" if "winner" in ev else None)
    what = {"winner_vs_incumbent": "winner vs the deployed config", "winner_vs_none": "winner vs no speculation",
            "incumbent_vs_none": "deployed config vs no speculation"}.get(comp, comp)
    if ev.get("speedup") is not None and ev.get("speedup_ci"):
        lo, hi = ev["speedup_ci"]
        hi_s = "inf" if hi is None or (isinstance(hi, float) and math.isinf(hi)) else f"{hi:.2f}"
        out.append(f"{what}: speedup {ev['speedup']:.2f}x, {_pct(ev.get('confidence', 0.95))} CI {lo:.2f}-{hi_s}")
    elif what:
        out.append(f"comparison: {what}")
    st = ev.get("starts") or {}
    if st:
        out.append("confirmation starts decided on: " + ", ".join(f"{k} {v}" for k, v in st.items() if v is not None))
    n = ev.get("noise") or {}
    if n.get("df") is not None:
        sd = n.get("sd_log")
        by = n.get("by_class") or {}
        if by and "prior_sd_log" in by.get("none", {}):
            out.append("start-to-start noise of this study's own starts (what the intervals use): " + ", ".join(
                f"{name} {'-' if d.get('sd_log') is None else format(d['sd_log'], '.1%')} on {d.get('df', 0)} df"
                for name, d in (("no speculation", by["none"]), ("speculative configs", by["speculative"]))))
        else:  # a file written when priors entered the intervals
            out.append(f"start-to-start noise: {'-' if sd is None else f'{sd:.1%}'} on {n['df']} df "
                       f"({(n.get('study') or {}).get('df', 0)} from this study, {n.get('prior_df', 0)} prior)")
        pc = n.get("prior_check") or {}
        if pc.get("conflict"):
            too = pc.get("prior_too") or "small"
            out.append(f"noise prior too {too}: this study's own starts vary {pc['own_sd_log']:.1%} on "
                       f"{pc['own_df']} df, the prior (spec and earlier nights) says {pc['prior_sd_log']:.1%} on "
                       f"{pc['prior_df']} df (F test p = {min(pc['p'], pc.get('p_quieter') or 1.0):.2g}); the "
                       "intervals use the study's own starts alone, but the plan and the search's margin use the "
                       "prior: record this machine's noise in objective.start_noise (benchmarks/start_noise.py)")
    plan = ev.get("plan") or {}
    if plan.get("looks"):
        out.append(f"look {plan['look']} of {plan['looks']} planned: {plan['confidence']:.2%} intervals, "
                   f"{plan['alpha_spent']:.2%} of the one-sided error spent"
                   + (f"; a true 20% gain would be seen in about {plan['power_at_20pct']:.0%} of nights"
                      if plan.get("power_at_20pct") is not None else ""))
    if plan.get("short"):
        out.append(f"budget: {plan['short']}")
    sides = [(k, label, ev.get(k)) for k, label in (("baseline", "no speculation"), ("incumbent", "deployed"),
                                                    ("winner", "winner"))]
    figs = [f"{label} {side['tpot_ms']:.2f} ms" + (f" ({side['server_starts']} starts)" if side.get("server_starts") else "")
            for _, label, side in sides if side and side.get("tpot_ms") is not None]
    if figs:
        out.append(f"{ev.get('statistic', '')} TPOT: " + ", ".join(figs))
    if ev.get("contenders"):
        out.append("as good as the winner as far as these starts tell (chance of being faster): " + ", ".join(
            f"{x['label']} {x['chance_faster']:.0%} ({x['starts']} start{'s' if x['starts'] != 1 else ''}, "
            f"measured {x['measured_gap']:+.1%})" for x in ev["contenders"]))
    ds = ev.get("drafts_short")
    if ds:
        out.append(f"drafts cut short: in {ds['starts']} of {ds['of']} starts of the winner no draft was accepted "
                   f"past position {ds['position']} of K={ds['k']} (the engine drafted fewer tokens than set, or "
                   f"the drafter never agrees that far): K={ds['position']} would accept as much")
    if ev.get("keep_reason"):
        out.append(f"kept because: {ev['keep_reason']}")
    skipped = (ev.get("confirmation") or {}).get("skipped")
    if skipped:
        out.append(f"confirmation: {skipped}")
    if (ev.get("confirmation") or {}).get("fresh_requests") is False:
        out.append("confirmation reused the search requests (the replay set is too short for fresh ones)")
    return out


def serve_args_for(config: dict | None) -> list[str]:
    return ["--speculative-config", json.dumps(config, sort_keys=True)] if config else []


def config_yaml(config: dict | None) -> str:
    """A vLLM ``--config`` YAML fragment (keys as vLLM's CLI spells them)."""
    if not config:
        return "# no speculative decoding: leave speculative-config unset\n"
    return "speculative-config: " + json.dumps(config, sort_keys=True) + "\n"


def build(study, decision: Decision, outcome) -> dict:
    spec = study.spec
    now = dt.datetime.now(dt.timezone.utc)
    deploy = decision.winner if decision.decision != "disable" else None
    winner_trials = study.trials(config_key=canonical(decision.winner)) if decision.winner else []
    argv = winner_trials[-1].measurement["argv"] if winner_trials else None
    engine = _registry.for_spec(spec)
    rec = {
        "schema": SCHEMA,
        "workload": spec.workload,
        "decision": decision.decision,
        "reason": decision.reason,
        "speculative_config": deploy,
        "vllm_serve_args": serve_args_for(deploy),
        "vllm_config_yaml": config_yaml(deploy),
        "measured_argv": argv,
        "evidence": decision.evidence,
        "rollback": {"speculative_config": spec.incumbent, "vllm_serve_args": serve_args_for(spec.incumbent)},
        "valid_for": {"model": spec.model, "vllm_version": study.vllm_version,
                      "serve_args": spec.engine.serve_args, "concurrency": spec.replay.concurrency,
                      "production_equivalent": spec.production_equivalent,
                      "hardware": study.hardware},
        "study": {"name": outcome.study_name, "storage": safe_url(outcome.storage), "trials": len(outcome.trials),
                  "server_starts": outcome.server_starts, "interrupted_starts": outcome.interrupted_starts,
                  "wall_s": round(outcome.wall_s, 1),
                  "stopped_because": outcome.stopped_because,
                  "dropped_methods": dict(study.dropped_methods)},
        "replay_set": {"path": str(study.replay_set.path), "digest": study.replay_set.digest,
                       "requests": len(study.replay_set.requests), "by_tag": {str(k): v for k, v in
                                                                              study.replay_set.by_tag().items()},
                       **replay_provenance(study.replay_set.path)},
        "created_at": now.isoformat(timespec="seconds"),
        "expires_at": (now + dt.timedelta(days=EXPIRY_DAYS)).isoformat(timespec="seconds"),
        **_per_level(study, deploy),
        **_engine_notes(study, winner_trials if deploy else []),
        **_warnings(spec),
    }
    if engine.kind != "vllm":  # the engine's own deploy form (llama-server flags and LLAMA_ARG_* env)
        for key in ("vllm_serve_args", "vllm_config_yaml"):
            rec.pop(key)
        rec["rollback"].pop("vllm_serve_args")
        rec.update(engine_kind=engine.kind, **engine.deploy_fields(deploy))
        rec["rollback"].update(engine.deploy_fields(spec.incumbent))
        rec["valid_for"]["engine"] = f"{engine.name} {study.vllm_version}"
    return rec


def _per_level(study, deploy: dict | None) -> dict:
    """``per_level`` for a profile study (see ``_levels``); never costs the recommendation."""
    spec = study.spec
    try:
        ev = level_evidence(study, canonical(deploy), spec.objective.statistic, spec.guards.confidence, spec.seed)
    except Exception as e:  # noqa: BLE001 - an auxiliary block; the decision stands without it
        return {"per_level_error": f"{type(e).__name__}: {e}"}
    return {"per_level": ev} if ev else {}


def _engine_notes(study, deployed_trials: list) -> dict:
    """``engine_notes``: what vLLM's log said about the engine path of the deployed config (its
    last measured start) and which of those the no-speculation baseline's start did not have."""
    if not deployed_trials:
        return {}
    winner = deployed_trials[-1].measurement.get("engine_notes")
    if winner is None:  # measured by a version that did not read the log
        return {}
    base = study.trials(config_key=NONE)
    baseline = (base[-1].measurement.get("engine_notes") if base else None) or {}
    return {"engine_notes": {"config": winner, "baseline": baseline, "not_in_baseline": added(winner, baseline)}}


def _warnings(spec) -> dict:
    """``warning`` (and ``benchmark_only``) for a recommendation that must not be deployed as is."""
    out: dict = {}
    warns = [] if spec.production_equivalent else ["NOT production-equivalent: engine setup differs"]
    bench = spec.benchmark_only()
    if bench:
        out["benchmark_only"] = bench
        warns.append("BENCHMARK ONLY: measured with synthetic acceptance (benchmark.synthetic_acceptance); "
                     "the figures are a cost benchmark, do not deploy this recommendation")
    if warns:
        out["warning"] = "; ".join(warns)
    return out


def write_atomic(path: str | Path, payload: dict, before_replace=None) -> Path:
    """A file SREs read (recommendation, history copy, deploy mark): ``_files.write_json`` at
    ``SHARED`` (0640). Temp file in the same folder, fsync, rename, fsync of the folder: the old
    file survives any failure. ``before_replace()`` runs after the fsync, before the rename (a
    database commit that must succeed for the new file to become current); if it raises, the old
    file stays."""
    return write_json(path, payload, SHARED, before_replace=before_replace)


def recommendation_path(recommendations_dir: str | Path, workload: str) -> Path:
    return Path(recommendations_dir) / f"{workload}.json"


_FIELDS = {"workload": str, "decision": str, "reason": str, "evidence": dict, "study": dict, "created_at": str,
           "expires_at": str}


def load(recommendations_dir: str | Path, workload: str) -> dict:
    """The current recommendation. FileNotFoundError when there is none; ValueError naming the file
    (and line) when it is not JSON or not a recommendation (a list, a hand-edit that dropped a
    field or changed its type): readers then say so instead of failing on a missing key."""
    p = recommendation_path(recommendations_dir, workload)
    try:
        rec = json.loads(p.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"no recommendation for workload {workload!r} at {p}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}:{e.lineno}: not valid JSON ({e.msg}); its history copies are in "
                         f"{Path(recommendations_dir) / 'history' / workload}") from None
    except (UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"{p}: not a recommendation file ({type(e).__name__})") from None
    problem = shape_problem(rec)
    if problem:
        raise ValueError(f"{p}: not a recommendation autotune wrote ({problem}); its history copies are in "
                         f"{Path(recommendations_dir) / 'history' / workload}")
    return rec


def shape_problem(rec) -> str | None:
    """What makes ``rec`` no recommendation (None: an object with a decision, its usual fields of
    the usual types; what lies deeper is checked where it is read, see ``cli._common.hand_edited``)."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__} where an object is expected"
    if rec.get("decision") not in ("keep", "change", "disable"):
        return ("field 'decision' is missing" if "decision" not in rec else
                f"field 'decision' is {rec['decision']!r}, not keep, change or disable")
    for key, kind in _FIELDS.items():
        if key in rec and not isinstance(rec[key], kind):
            return f"field '{key}' is a {type(rec[key]).__name__}, not a {kind.__name__}"
    if not isinstance(rec.get("speculative_config"), (dict, type(None))):
        return "field 'speculative_config' is no object"
    return None
