"""The decision and the file SREs deploy: ``recommendations/<workload>.json``.

A speculative config is recommended only when every start of it and of the baseline, pooled
(resampled by start, then by request), gives a speedup whose confidence interval lies wholly
above 1, and it passes every guard. Otherwise the decision is ``keep`` (the incumbent stays) or
``disable`` (the deployed speculation loses to none). The file is written to a temp file and
renamed, so a crash or a full disk leaves the previous recommendation intact.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import _measure
from ._levels import profile_groups
from ._serverlog import added
from ._space import NONE, canonical

SCHEMA = "autotune.recommendation/1"
EXPIRY_DAYS = 7


@dataclass
class Decision:
    decision: str           # change | keep | disable
    reason: str
    winner: dict | None     # speculative config recommended (None: no speculation)
    evidence: dict


def _groups(trials, use_stalled: bool = False) -> tuple[list[list[float]], int]:
    groups = [t.user_attrs["measurement"]["tpot_ms"] for t in trials
              if use_stalled or not t.user_attrs.get("stalled")]
    stalled = sum(1 for t in trials if t.user_attrs.get("stalled"))
    if not groups:  # every start stalled: keep them rather than decide on nothing, but say so
        groups = [t.user_attrs["measurement"]["tpot_ms"] for t in trials]
    return [g for g in groups if g], stalled


def _side(trials, statistic: str) -> dict:
    groups, stalled = _groups(trials)
    pooled = [v for g in groups for v in g]
    profile = profile_groups(trials)
    spec_tot = {"drafts": 0.0, "accepted": 0.0}
    for t in trials:
        d = t.user_attrs["measurement"].get("spec_delta", {})
        spec_tot["drafts"] += d.get("drafts") or 0
        spec_tot["accepted"] += d.get("accepted_tokens") or 0
    summaries = [t.user_attrs["measurement"]["summary"] for t in trials]
    return {
        "tpot_ms": (_measure.weighted_statistic(*profile, statistic) if profile
                    else _measure.summarize(pooled, statistic) if pooled else None),
        "tpot_ms_percentiles": _measure.percentiles(pooled) if pooled else {},
        "server_starts": len(trials), "stalled_starts": stalled,
        "requests": len(pooled),
        "output_throughput": sum(s["output_throughput_tok_s"] for s in summaries) / len(summaries),
        "acceptance_length": (1 + spec_tot["accepted"] / spec_tot["drafts"]) if spec_tot["drafts"] else None,
        "ttft_ms_p90": _median([(s.get("ttft_ms") or {}).get("p90") for s in summaries]),
        "trials": [t.number for t in trials],
        "start_seconds": _median([t.user_attrs["measurement"]["start_seconds"] for t in trials]),
    }


def _median(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def replay_provenance(replay_path) -> dict:
    """What the replay set's manifest says about where its requests came from (empty for sets
    written by hand or by ``autotune demo``, which have none)."""
    from ._sampling import read_manifest

    m = read_manifest(replay_path)
    if not m:
        return {}
    keep = ("workload", "window", "sources", "content_hash", "requests", "synthetic_requests")
    return {"manifest": {k: m[k] for k in keep if k in m},
            "acceptance_measurable": bool(m.get("acceptance_measurable", True))}


def decide(study) -> Decision:
    """The decision, held back to ``keep``/``disable`` when the replay set cannot measure
    acceptance: prompts made up from a length-only trace (Mooncake style) say how fast a config
    runs but not how often production's drafts would be accepted, so no speculative config is
    recommended from them; the would-be winner stays in the evidence."""
    d = _decide(study)
    rs = getattr(study, "replay_set", None)
    prov = replay_provenance(rs.path) if rs is not None else {}
    if prov.get("acceptance_measurable", True) or d.decision != "change":
        return d
    synthetic = prov["manifest"].get("synthetic_requests")
    why = (f"the replay set has synthetic prompts ({synthetic} of {len(study.replay_set.requests)} requests "
           f"from a length-only trace; manifest acceptance_measurable false), so the measured acceptance "
           f"is not production's: {d.reason} -- not recommended")
    incumbent_key = canonical(study.spec.incumbent)
    d.evidence["held_back_winner"] = d.winner
    return Decision("keep", why + ("; keep serving without speculation" if incumbent_key == NONE
                                   else "; keep the deployed config"),
                    study.spec.incumbent if incumbent_key != NONE else None, d.evidence)


def damp(d: Decision, study, previous: dict | None, now: dt.datetime | None = None) -> Decision:
    """Hold back a new config within ``drift.min_days_between_changes`` of the last recommendation.

    Nightly retuning on noisy traffic would otherwise flip between near-equal configs and make
    SREs redeploy for nothing. Not damped: a first recommendation, an older one, a ``disable``
    (the deployed speculation loses to none: never wait on that), a change of vLLM version, and
    an incumbent whose acceptance fell below ``drift.min_acceptance_rate`` (the traffic moved).
    """
    from ._history import fmt_config, incumbent_acceptance

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
    if prev_version and prev_version != study.caps.version:
        return d
    acc = incumbent_acceptance(study, study.spec.incumbent)
    if acc["rate"] is not None and acc["rate"] < study.spec.drift.min_acceptance_rate:
        return d
    d.evidence["damped"] = {"held_back_winner": d.winner, "held_back_decision": d.decision,
                            "previous_id": previous.get("id"), "previous_created_at": previous.get("created_at"),
                            "age_days": round(age_days, 2), "min_days_between_changes": days}
    why = (f"damped: the last recommendation ({fmt_config(prev_cfg)}, {age_days:.1f} days old) stands for "
           f"{days:g} days unless the traffic drifts or vLLM changes; held back: {d.reason}")
    return Decision("keep", why, prev_cfg, d.evidence)


def _decide(study) -> Decision:
    """Compare the best feasible candidate with the baseline, on every start of each."""
    spec = study.spec
    statistic = spec.objective.statistic
    baseline = study.trials(config_key=NONE)
    incumbent_key = canonical(spec.incumbent)
    best = study.best()
    evidence: dict = {"statistic": statistic, "baseline": _side(baseline, statistic)}
    if best is None:
        reason = "no speculative configuration completed and passed the guards"
        return Decision(*_no_winner(incumbent_key, reason), winner=spec.incumbent if incumbent_key != NONE else None,
                        evidence=evidence)
    key = best.user_attrs["config_key"]
    wtrials = study.trials(config_key=key)
    evidence["winner"] = _side(wtrials, statistic)
    evidence["winner"]["config"] = best.user_attrs["config"]
    b_groups, _ = _groups(baseline)
    w_groups, _ = _groups(wtrials)
    b_prof, w_prof = profile_groups(baseline), profile_groups(wtrials)
    if b_prof and w_prof:  # a concurrency profile: the traffic-weighted per-level statistic
        ci = _measure.bootstrap_weighted_ratio_ci(b_prof[0], w_prof[0], b_prof[1], statistic=statistic,
                                                  confidence=spec.guards.confidence, seed=spec.seed)
        evidence["objective"] = "traffic-weighted per-level " + statistic
    else:
        ci = _measure.bootstrap_ratio_ci(b_groups, w_groups, statistic=statistic,
                                         confidence=spec.guards.confidence, seed=spec.seed)
    eq = [t.user_attrs.get("equivalence", {}) for t in wtrials]
    evidence["speedup"] = ci.ratio
    evidence["speedup_ci"] = [ci.low, ci.high]
    evidence["confidence"] = ci.confidence
    evidence["equivalence"] = {"compared": sum(e.get("compared", 0) for e in eq),
                               "matched": sum(e.get("matched", 0) for e in eq)}
    evidence["throughput_ratio"] = (evidence["winner"]["output_throughput"]
                                    / evidence["baseline"]["output_throughput"])
    evidence["failed_requests"] = sum(t.user_attrs["measurement"]["summary"].get("failed", 0) for t in wtrials)
    evidence["single_start_only"] = len(b_groups) < 2 or len(w_groups) < 2
    guard_fail = _guard_failure(spec.guards, evidence)
    if guard_fail:
        return Decision(*_no_winner(incumbent_key, f"best candidate {key} fails a guard: {guard_fail}"),
                        winner=None if incumbent_key == NONE else spec.incumbent, evidence=evidence)
    if not ci.wholly_above(1.0):
        return Decision(*_no_winner(incumbent_key, (
            f"best candidate {key} is not faster with {ci.confidence:.0%} confidence "
            f"(speedup {ci.ratio:.2f}, CI {ci.low:.2f}-{ci.high:.2f})")),
            winner=None if incumbent_key == NONE else spec.incumbent, evidence=evidence)
    why = (f"{best.user_attrs['config']['method']} K={best.user_attrs['config']['num_speculative_tokens']} "
           f"is {ci.ratio:.2f}x faster in {statistic} TPOT than no speculation "
           f"({ci.confidence:.0%} CI {ci.low:.2f}-{ci.high:.2f})")
    if key == incumbent_key:
        return Decision("keep", "the deployed config is still the best: " + why, best.user_attrs["config"], evidence)
    return Decision("change", why, best.user_attrs["config"], evidence)


def _no_winner(incumbent_key: str, reason: str) -> tuple[str, str]:
    if incumbent_key == NONE:
        return "keep", reason + "; keep serving without speculation"
    return "disable", reason + "; disable the deployed speculation"


def _guard_failure(guards, ev: dict) -> str | None:
    if ev["failed_requests"] > guards.max_failed_requests:
        return f"{ev['failed_requests']} failed requests (max {guards.max_failed_requests})"
    eq = ev["equivalence"]
    if eq["compared"] and eq["matched"] / eq["compared"] < guards.equivalence_min_match:
        return f"greedy outputs matched the baseline on {eq['matched']}/{eq['compared']} requests"
    if ev["throughput_ratio"] < guards.throughput_floor:
        return f"throughput {ev['throughput_ratio']:.2f}x of baseline (floor {guards.throughput_floor})"
    return None


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
    argv = winner_trials[-1].user_attrs["measurement"]["argv"] if winner_trials else None
    return {
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
        "valid_for": {"model": spec.model, "vllm_version": study.caps.version,
                      "serve_args": spec.engine.serve_args, "concurrency": spec.replay.concurrency,
                      "production_equivalent": spec.production_equivalent},
        "study": {"name": outcome.study_name, "storage": outcome.storage, "trials": len(outcome.trials),
                  "server_starts": outcome.server_starts, "wall_s": round(outcome.wall_s, 1),
                  "stopped_because": outcome.stopped_because,
                  "dropped_methods": study.space.dropped},
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


def _per_level(study, deploy: dict | None) -> dict:
    """``per_level`` for a profile study (see ``_levels``); never costs the recommendation."""
    from ._levels import level_evidence

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
    winner = deployed_trials[-1].user_attrs["measurement"].get("engine_notes")
    if winner is None:  # measured by a version that did not read the log
        return {}
    base = study.trials(config_key=NONE)
    baseline = (base[-1].user_attrs["measurement"].get("engine_notes") if base else None) or {}
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
    """Temp file in the same directory, fsync, rename: the old file survives any failure.
    ``before_replace()`` runs after the fsync, before the rename (a database commit that must
    succeed for the new file to become current); if it raises, the old file stays."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def recommendation_path(recommendations_dir: str | Path, workload: str) -> Path:
    return Path(recommendations_dir) / f"{workload}.json"


def load(recommendations_dir: str | Path, workload: str) -> dict:
    p = recommendation_path(recommendations_dir, workload)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no recommendation for workload {workload!r} at {p}") from None
