"""The file SREs deploy, ``recommendations/<workload>.json``: the payload of a decision (deployable
fragments, evidence, validity, provenance), the text ``recommend show`` prints of its evidence,
and the atomic write and checked read of the file. The file is written to a temp file and
renamed, so a crash or a full disk leaves the previous recommendation intact.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

from autotune.core._files import SHARED, write_json
from autotune.core._inputs import read_input
from autotune.core._methods import ADAPTIVE_KNOBS, is_adaptive
from autotune.core._names import check_workload, child
from autotune.core._store import safe_url
from autotune.decide._decision import Decision, replay_provenance
from autotune.engines import _registry
from autotune.engines._serverlog import added
from autotune.search._levels import level_evidence
from autotune.search._record import StudyRecord
from autotune.search._space import NONE, canonical

SCHEMA = "autotune.recommendation/1"
EXPIRY_DAYS = 7


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
        out.append(f"look {plan['look']} of {plan['looks']} planned: {plan['confidence']:.2%} at this look "
                   f"(all looks together: {_pct(ev.get('confidence', 0.95))}), "
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
    ro = ev.get("runoff") or {}
    if ro.get("skipped"):
        out.append(f"runoff: skipped, {ro['skipped']}")
    elif ro.get("winner"):
        out.append(f"runoff: {', '.join(ro.get('order') or ro['entrants'])} one more start each; like with like "
                   f"(the first {ro['starts_each']} search starts of each) " + ", ".join(
                       f"{k} {v:.2f} ms" for k, v in ro["tpot_ms"].items()) + f": {ro['winner']} went on to confirmation")
    if (ev.get("nominee") or {}).get("text"):
        out.append(f"nominee: {ev['nominee']['text']}")
    if "indistinguishable" in ev:
        if ev["indistinguishable"]:
            out.append("could not tell apart from: " + ", ".join(
                f"{x['label']} ({x['chance_faster']:.0%} chance of being faster, {x['starts']} "
                f"start{'s' if x['starts'] != 1 else ''}, measured {x['measured_gap']:+.1%}; {x['basis']})"
                for x in ev["indistinguishable"]))
    elif ev.get("contenders"):  # a file written before ``indistinguishable``
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


def build(study: StudyRecord, decision: Decision, outcome) -> dict:
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
                  "dropped_methods": dict(study.dropped_methods),
                  **({"carry": dict(study.carry)} if study.carry else {})},
        "replay_set": {"path": str(study.replay_set.path), "digest": study.replay_set.digest,
                       "requests": len(study.replay_set.requests), "by_tag": {str(k): v for k, v in
                                                                              study.replay_set.by_tag().items()},
                       **replay_provenance(study.replay_set.path)},
        "created_at": now.isoformat(timespec="seconds"),
        "expires_at": (now + dt.timedelta(days=EXPIRY_DAYS)).isoformat(timespec="seconds"),
        **_per_level(study, deploy),
        **_engine_notes(study, winner_trials if deploy else []),
        **_warnings(spec, decision.evidence.get("warning")),
    }
    adaptive = runtime_adaptive(deploy, rec.get("per_level"), spec.replay.concurrency)
    if adaptive and decision.decision == "change":
        rec["runtime_adaptive"] = adaptive
        rec["reason"] = f"{rec['reason']}; {adaptive['note']}"
    if engine.kind != "vllm":  # the engine's own deploy form (llama-server flags and LLAMA_ARG_* env)
        for key in ("vllm_serve_args", "vllm_config_yaml"):
            rec.pop(key)
        rec["rollback"].pop("vllm_serve_args")
        rec.update(engine_kind=engine.kind, **engine.deploy_fields(deploy))
        rec["rollback"].update(engine.deploy_fields(spec.incumbent))
        rec["valid_for"]["engine"] = f"{engine.name} {study.vllm_version}"
    return rec


def runtime_adaptive(deploy: dict | None, per_level: dict | None, concurrency: int) -> dict | None:
    """``runtime_adaptive`` when the deployed config lets vLLM choose the tokens it verifies per
    step (``core._methods.ADAPTIVE_KNOBS``): its knobs, its K (a ceiling), the concurrency levels
    where it was the fastest measured config (a profile study's ``per_level``; else the study's
    one concurrency, where it won), and a note for the reason. SREs should know that the K
    they deploy is not what each step runs, and at which loads that won."""
    if not is_adaptive(deploy):
        return None
    knobs = {k: deploy[k] for k, v in ADAPTIVE_KNOBS.items() if deploy.get(k) == v}
    key = canonical(deploy)
    if per_level and per_level.get("levels"):
        levels = [int(L) for L, v in per_level["levels"].items() if (v.get("best") or {}).get("config_key") == key]
    else:
        levels = [int(concurrency)]
    k = deploy.get("num_speculative_tokens")
    where = f"at concurrency {', '.join(map(str, levels))}" if levels else "on the traffic-weighted TPOT, at no single level"
    note = (f"a runtime-adaptive arm won ({', '.join(knobs)}: vLLM picks the tokens verified per step at run "
            f"time, K={k} is the ceiling); it was the fastest measured {where}")
    return {"knobs": knobs, "k_ceiling": k, "levels": levels, "note": note}


def _per_level(study: StudyRecord, deploy: dict | None) -> dict:
    """``per_level`` for a profile study (see ``_levels``); never costs the recommendation."""
    spec = study.spec
    try:
        ev = level_evidence(study, canonical(deploy), spec.objective.statistic, spec.guards.confidence, spec.seed)
    except Exception as e:  # noqa: BLE001 - an auxiliary block; the decision stands without it
        return {"per_level_error": f"{type(e).__name__}: {e}"}
    return {"per_level": ev} if ev else {}


def _engine_notes(study: StudyRecord, deployed_trials: list) -> dict:
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


def _warnings(spec, likely_faster: str | None = None) -> dict:
    """``warning`` (and ``benchmark_only``) for a recommendation that must not be deployed as is,
    or whose own evidence finds a configuration likely faster than its winner (``likely_faster``)."""
    out: dict = {}
    warns = [] if spec.production_equivalent else ["NOT production-equivalent: engine setup differs"]
    if likely_faster:
        warns.append(f"LIKELY NOT THE FASTEST: {likely_faster}")
    bench = spec.benchmark_only()
    if bench:
        out["benchmark_only"] = bench
        warns.append("BENCHMARK ONLY: measured with synthetic acceptance (benchmark.synthetic_acceptance); "
                     "the figures are a cost benchmark, do not deploy this recommendation")
    if warns:
        out["warning"] = "; ".join(warns)
    return out


def write_atomic(path: str | Path, payload: dict, before_replace=None, root: str | Path | None = None) -> Path:
    """A file SREs read (recommendation, history copy, deploy mark): ``_files.write_json`` at
    ``SHARED`` (0640). Temp file in the same folder, fsync, rename, fsync of the folder: the old
    file survives any failure. ``before_replace()`` runs after the fsync, before the rename (a
    database commit that must succeed for the new file to become current); if it raises, the old
    file stays. With ``root`` (the recommendations folder), never through a link below it."""
    return write_json(path, payload, SHARED, before_replace=before_replace, root=root)


def recommendation_path(recommendations_dir: str | Path, workload: str) -> Path:
    return child(recommendations_dir, f"{check_workload(workload)}.json")


_FIELDS = {"workload": str, "decision": str, "reason": str, "evidence": dict, "study": dict, "created_at": str,
           "expires_at": str}


def load(recommendations_dir: str | Path, workload: str) -> dict:
    """The current recommendation. FileNotFoundError when there is none; ValueError naming the file
    (and line) when it is not JSON or not a recommendation (a list, a hand-edit that dropped a
    field or changed its type): readers then say so instead of failing on a missing key."""
    p = recommendation_path(recommendations_dir, workload)
    try:
        rec = json.loads(read_input(p, "recommendation").decode("utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"no recommendation for workload {workload!r} at {p}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}:{e.lineno}: not valid JSON ({e.msg}); its history copies are in "
                         f"{Path(recommendations_dir) / 'history' / workload}") from None
    except (UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"{p}: not a recommendation file ({type(e).__name__})") from None
    problem = shape_problem(rec)
    if not problem and rec.get("workload", workload) != workload:  # it would steer a deploy mark elsewhere
        problem = f"field 'workload' is {rec.get('workload')!r}, but the file is {workload}'s"
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
