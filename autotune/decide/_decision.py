"""The decision: ``change``, ``keep`` or ``disable``, with its reason and evidence.

``change`` only when the winner beats the *incumbent* (the deployed config, measured in the same
study; no speculation when nothing is deployed) by more than ``objective.min_gain`` with the
stated confidence, is not slower than no speculation either (shown faster than it, when a config
is deployed), on confirmation starts that did not select it, with an interval that states the
gain within ``PRECISION``, and passes every guard; ``disable`` only when the incumbent is shown
slower than no speculation (and no winner is shown faster than none); otherwise ``keep``, with
the reason (``evidence.keep_reason``). The intervals and the noise they rest on: ``_noise``.
Confirmation goes on in interleaved rounds while the decision is open (``open_question``).
A pure function of the study's record (``search.StudyRecord``): a test builds one and decides.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

from autotune.core import _measure
from autotune.decide import _guards
from autotune.decide._noise import (FUTILITY_POWER as FUTILITY, LIKELY_FASTER, PRECISION, _ci, _comparisons, _fmt_ci,
                                    _label, _noise_evidence, _plan, _precise, contenders, futility, indistinguishable,
                                    runoff_evidence)
from autotune.search import _equivalence, _nominee
from autotune.search._levels import profile_groups
from autotune.search._record import StudyRecord
from autotune.search._space import NONE, canonical, label
from autotune.search._trial import per_request_acceptance, spec_counters, usable_starts
from autotune.traffic._sampling import read_manifest


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
    per_request = per_request_acceptance(trials)  # the engine's own, per measured request, where it offers it
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
        "acceptance_length": per_request["acceptance_length"] if per_request else counters["acceptance_length"],
        "acceptance_source": ("per_request" if per_request else "counters" if counters["acceptance_length"] is not None
                              else None),
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


def decide(study: StudyRecord, history: list[dict] | None = None) -> Decision:
    """The decision (see the module doc), held back to ``keep`` when the replay set cannot
    measure acceptance: prompts made up from a length-only trace (Mooncake style) say how fast a
    config runs but not how often production's drafts would be accepted, so no speculative
    config is recommended from them; the would-be winner stays in the evidence.

    ``history``: earlier recommendations of the workload, newest first (``_history.history``);
    their own studies' start-to-start variance is pooled into tonight's (same model, vLLM,
    concurrency and statistic; the last ``HISTORY_NIGHTS``)."""
    d = _decide(study, history)
    nom = nominee_evidence(study)
    if nom:
        d.evidence["nominee"] = nom
        d.reason += f"; {nom['text']} (evidence.nominee)"
    likely = d.evidence.get("likely_faster")
    if likely:
        d.evidence["warning"] = likely_faster_warning(d.evidence.get("winner", {}).get("config"), likely)
        d.reason += ("; WARNING: " + ", ".join(f"{x['label']} is likely faster ({_beyond_text(x)})" for x in likely)
                     + " (evidence.likely_faster)")
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


def nominee_evidence(study: StudyRecord) -> dict | None:
    """``evidence.nominee``: the configuration the predictor nominated in place of the search's best
    (``search._nominee``), never a search start: its predicted TPOT and 90% interval, how likely it
    was faster than the best measured start (``than``), the search's best whose place it took
    (``instead_of``), whether the confirmation confirmed it (``confirmed``) or a guard dropped it
    (``dropped``), and all of it in words (``text``). None without a nominee."""
    n = study.nominee or {}
    if not n.get("config_key"):
        return None
    inst = n.get("instead_of") or {}
    out = {"config": n.get("config"), "label": n.get("label"), "searched": False,
           "predicted_tpot_ms": n.get("predicted_tpot_ms"), "predicted_ci": n.get("predicted_ci"),
           "p_faster": n.get("p_beat"), "margin": n.get("margin"), "basis": n.get("basis"),
           "than": {"label": n.get("best_label"), "tpot_ms": n.get("best_tpot_ms")},
           "instead_of": {"config": json.loads(inst["config_key"]) if inst.get("config_key") not in (None, NONE)
                          else None, "label": inst.get("label"), "tpot_ms": inst.get("tpot_ms")},
           "confirmed": study.nominated() is not None, "text": _nominee.text(n)}
    if n.get("dropped"):
        out["dropped"] = n["dropped"]
    return out


def _beyond_text(x: dict) -> str:
    res = x.get("resolution")
    return (f"{x['chance_faster_beyond_resolution']:.0%} by more than the night's "
            f"{res:.1%} start-to-start noise" if res else f"{x['chance_faster_beyond_resolution']:.0%}")


def likely_faster_warning(winner: dict | None, likely: list[dict]) -> str:
    """What the recommendation says when its own evidence finds a measured configuration likely
    faster than the winner by more than the night's resolution (``evidence.likely_faster``)."""
    names = ", ".join(f"{x['label']} ({_beyond_text(x)}; {x['basis']})" for x in likely)
    return (f"the study's own starts say {names}: "
            f"{'it is' if len(likely) == 1 else 'they are'} likely faster than the winner {fmt_config(winner)}; "
            "to settle it, measure both again (a study's runoff, objective.runoff_contenders, does so before "
            "the confirmation for what the search's noise flags)")


def damp(d: Decision, study: StudyRecord, previous: dict | None, now: dt.datetime | None = None) -> Decision:
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


def open_question(study: StudyRecord, history: list[dict] | None = None) -> bool:
    """After a confirmation round: is the decision still open, so that one more interleaved round
    (``objective.confirm_max_starts``) could settle it? Open while the comparison that decides
    straddles its threshold, or while the incumbent looks slower than no speculation without
    being shown slower."""
    d = _decide(study, history)
    return bool(d.evidence.get("open"))


def _decide(study: StudyRecord, history: list[dict] | None = None) -> Decision:
    spec = study.spec
    statistic = spec.objective.statistic
    inc = spec.incumbent
    inc_key = canonical(inc)
    deployed = inc_key != NONE
    gain = spec.objective.min_gain or 0.0
    baseline = study.trials(config_key=NONE)
    best = study.best()  # the search's pick, or the predictor's nominee; a fast confirmation start never re-picks
    c = _comparisons(study, history, best)
    conf_info = study.confirmation or {}
    evidence: dict = {
        "statistic": statistic,
        "method": "t interval on log per-start " + statistic + " TPOT, confirmation starts only; "
                  "start-to-start variance of each side's class (no speculation, speculative) pooled over "
                  "this study's repeated starts of its configs (no prior); Welch's interval where the classes "
                  "differ; the error spent over the planned looks (O'Brien-Fleming shape)",
        "comparison": None, "baseline": _side(baseline, statistic, c["B"]),
        "min_gain": gain, "confidence": spec.guards.confidence, "look_confidence": c["confidence"],
        "stated_confidence": spec.guards.confidence,
        "looks": c["looks"], "look": c["look"],
        "noise": _noise_evidence(c),
        "plan": _plan(c, deployed, (1.0 - spec.guards.confidence) / 2.0),
        "starts": {"baseline": len(c["B"]), "incumbent": len(c["I"]) if deployed else None,
                   "winner": len(c["W"]) if best is not None else None},
        "confirmation": {"fresh_requests": conf_info.get("fresh_requests"), "rounds": conf_info.get("rounds"),
                         "skipped": conf_info.get("skipped"), "order": conf_info.get("order")},
    }
    runoff = runoff_evidence(study)
    if runoff is not None:
        evidence["runoff"] = runoff
    if profile_groups(baseline):  # a concurrency profile: each start's traffic-weighted per-level statistic
        evidence["objective"] = "traffic-weighted per-level " + statistic
    ci_in = _ci(c, "B", "I") if deployed else None  # incumbent vs no speculation
    if deployed:
        evidence["incumbent"] = _side(study.trials(config_key=inc_key), statistic, c["I"])
        evidence["incumbent"]["config"] = inc
        evidence["incumbent_vs_none"] = ci_in.to_dict() if ci_in else None
    keep_cfg = inc if deployed else None
    threshold = 1.0 + gain
    futile: dict = {}

    def still_open(question: str, ref: str, cand: str, bound: float, upward: bool = True) -> bool:
        """An open question stays open unless the rounds left cannot plausibly settle it
        (``_noise.futility``, non-binding: it only ends confirmation early, as ``keep``)."""
        f = futility(c, ref, cand, bound, upward)
        if f is not None:
            futile[question] = f
        return not (f and f["stopped"])

    def keep(code: str, why: str, open_: bool = False) -> Decision:
        stopped = bool(futile) and not open_ and any(f["stopped"] for f in futile.values())
        if futile:
            evidence["futility"] = {**futile, "stopped": stopped}
        if stopped:
            cp = max(f["conditional_power"] for f in futile.values() if f["stopped"])
            why += (f"; confirmation stopped at look {c['look']} of {c['looks']}: at the trend so far the rounds "
                    f"left would settle it in {cp:.0%} of nights (futility bound {FUTILITY:.0%})")
            code = f"futile after {starts_used()} starts"
        evidence["keep_reason"] = code
        evidence["open"] = open_
        tail = "; keep the deployed config" if deployed else "; keep serving without speculation"
        return Decision("keep", why + tail, keep_cfg, evidence)

    def starts_used() -> int:
        return len(c["B"]) + len(c["W"]) + (len(c["I"]) if deployed else 0)

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
            open_ = open_ or (ci_in.ratio < 1.0 and (ci_in.wholly_below(1.0)
                                                    or still_open("disable", "B", "I", 1.0, upward=False)))
            why += (f"; the deployed config is slower than no speculation, but on too few starts to say by how "
                    f"much ({_fmt_ci(ci_in)})" if ci_in.wholly_below(1.0) else
                    f"; the deployed config is not shown slower than no speculation ({_fmt_ci(ci_in)})")
        return keep(code, why, open_)

    agreement = _guards.baseline_agreement(baseline)  # the engine's own reproducibility of greedy outputs
    if best is None:
        evidence["comparison"] = "incumbent_vs_none" if deployed else "none"
        why, failed, blocked = _guards.no_candidate_reason(study.trials(), spec.guards, agreement,
                                                            _mean_value(baseline))
        evidence["equivalence"] = {"baseline_agreement": agreement, "min_match": spec.guards.equivalence_min_match,
                                   **baseline_numerics(baseline)}
        if failed:
            evidence["guard_failures"] = failed
        if blocked:
            evidence["fastest_blocked"] = blocked
        return disable_or("no candidate", why)
    key = best.config_key
    cfg = best.config
    wtrials = study.trials(config_key=key)
    evidence["winner"] = _side(wtrials, statistic, c["W"])
    evidence["winner"]["config"] = cfg
    evidence["contenders"] = contenders(c, key)
    evidence["indistinguishable"] = indistinguishable(study, c, key)
    likely = [x for x in evidence["indistinguishable"] if x["chance_faster_beyond_resolution"] >= LIKELY_FASTER]
    if likely:
        evidence["likely_faster"] = likely
    short = drafts_short(wtrials)
    if short:
        evidence["drafts_short"] = short
    vs_none = _ci(c, "B", "W")
    evidence["winner_vs_none"] = vs_none.to_dict() if vs_none else None
    evidence["equivalence"] = {**equivalence_evidence([t.equivalence for t in wtrials]),
                               "min_compared": spec.guards.equivalence_min_compared,
                               "min_match": spec.guards.equivalence_min_match, "baseline_agreement": agreement,
                               **baseline_numerics(baseline)}
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
        return disable_or("guard", f"best candidate {label} fails a guard: {guard_fail}; against {ref_name} "
                                   f"it measured a speedup of {_fmt_ci(vs)}, given up for the guard")
    ref_side = "I" if deployed else "B"
    if vs.df <= 0:
        return disable_or("noise unmeasured", f"{label} vs {ref_name}: {_fmt_ci(vs)}; the {c['classes']['W']} "
                                              "configurations' start-to-start noise is not measured yet (the "
                                              "winner needs two confirmation starts); inconclusive",
                          open_=still_open("change", ref_side, "W", threshold))
    # never a change to something slower than turning speculation off: against a deployed config,
    # the winner must also be shown faster than no speculation, at the same confidence
    beats_none = not deployed or (vs_none is not None and vs_none.wholly_above(1.0))
    if vs.wholly_above(threshold) and beats_none:
        if not (_precise(vs) and (not deployed or _precise(vs_none))):
            return disable_or(f"imprecise after {starts_used()} starts",
                              f"{label} is faster than {ref_name} ({_fmt_ci(vs)}), but the interval is wider than "
                              f"{PRECISION:g}x either way of its estimate: too few starts to state the gain",
                              open_=True)
        why = (f"{label} is {vs.ratio:.2f}x faster in {statistic} TPOT than {ref_name} "
               f"({_label(vs)} {vs.low:.2f}-{vs.high:.2f}, {vs.n_b} vs {vs.n_a} confirmation starts, "
               f"{vs.df} df" + (f", min_gain {gain:.0%}" if gain else "") + ")")
        evidence["open"] = False
        return Decision("change", why, cfg, evidence)
    if vs.wholly_above(threshold):  # faster than the deployed config, not shown faster than none
        settled = vs_none is not None and vs_none.high <= 1.0
        return disable_or("not faster than no speculation",
                          f"best candidate {label} is faster than {ref_name} ({_fmt_ci(vs)}) but not shown faster "
                          f"than no speculation ({_fmt_ci(vs_none)})",
                          open_=not settled and still_open("change", "B", "W", 1.0))
    if vs.high <= threshold:
        return disable_or("not faster", f"best candidate {label} is not faster than {ref_name} by more than "
                                        f"{gain:.0%} ({_fmt_ci(vs)})")
    return disable_or(f"inconclusive after {starts_used()} starts",
                      f"inconclusive after {starts_used()} confirmation starts: {label} vs {ref_name} "
                      f"{_fmt_ci(vs)}, the interval straddles {threshold:.2f}",
                      open_=still_open("change", ref_side, "W", threshold))


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


def equivalence_evidence(eqs: list) -> dict:
    """The winner's starts' equivalence judgments pooled: counts, the tolerance, the divergences
    (request, token position, the two tokens, the baseline's margin there)."""
    out = {k: sum(e.get(k, 0) for e in eqs) for k in ("compared", "matched")}
    if eqs and all("differs" in e for e in eqs):
        out.update({k: sum(e[k] for e in eqs) for k in ("identical", "near_ties", "differs")})
        out["tolerance"] = max(e["tolerance"] for e in eqs)
        out["tolerance_how"] = eqs[0].get("tolerance_how")
        out["divergences"] = [d for e in eqs for d in e.get("divergences") or []][:_equivalence.SHOWN]
    return out


def _mean_value(trials) -> float | None:
    vals = [t.value for t in trials if t.value is not None]
    return sum(vals) / len(vals) if vals else None


def baseline_numerics(baseline) -> dict:
    """The engine noise the baseline's starts measured (``_equivalence.engine_noise``), if any."""
    noises = [t.equivalence["engine_noise"] for t in baseline if t.equivalence.get("engine_noise")]
    return {"engine_noise": noises} if noises else {}


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
        why = (f"greedy outputs equivalent to the baseline's on {eq['matched']}/{eq['compared']} requests"
               f"{_guards.divergence_text([eq]) if 'differs' in eq else ''} (the guard asks "
               f"{guards.equivalence_min_match:.0%})")
        ba = eq.get("baseline_agreement")
        if ba:
            why += "; " + _guards.agreement_text(ba)
            if eq["matched"] / eq["compared"] >= ba["fraction"]:
                why += ": within that, so the guard measured the engine's non-determinism, not the speculation"
        return why
    if ev["throughput_ratio"] is not None and ev["throughput_ratio"] < guards.throughput_floor:
        return f"throughput {ev['throughput_ratio']:.2f}x of baseline (floor {guards.throughput_floor})"
    return None
