"""Watching production without a GPU: drift check, realized vs predicted, and the recommendation
fields an SRE needs to apply a config safely.

**What a recommendation was made on** (written by the study into every recommendation):
``traffic`` (tag shares and prompt-length distribution of the replay set), ``engine`` (model,
vLLM version, serve arguments and their fingerprint), ``fidelity`` (production's figures when the
gate ran), and ``predicted`` (what production should show with the recommended config: TPOT
p50/p90, as the replay measured them and as production's TPOT histogram would read them, and their mean,
acceptance length, coverage and tokens per decode step), with ``canary`` ranges and
``kill_criteria`` derived from them.

**Drift check** (``autotune drift check W``): retune only when needed. Reasons, each against the
current recommendation:
- ``expired``: ``expires_at`` has passed;
- ``engine changed``: vLLM version, model or serve arguments differ (fingerprint);
- ``mix changed``: a tag's share of the current replay set moved by more than
  ``drift.tag_share_change`` (absolute);
- ``prompt lengths changed``: prompt-length p50 or p90 moved by more than
  ``drift.prompt_length_change`` (relative);
- ``acceptance changed`` / ``tokens per step changed``: production's acceptance length or tokens
  per decode step at the deployed K (``production.telemetry``) moved by more than
  ``drift.acceptance_length_change`` / ``drift.tokens_per_step_change`` (relative) from the
  figures the recommendation was made on (its fidelity block, else its predictions);
- ``deployed K changed``: production drafts a different number of positions.
Exit codes: 0 no retune needed, 1 retune needed, 2 bad input (spec, telemetry, replay set).

**Realized vs predicted** (``autotune recommend mark-deployed W``, then ``autotune recommend
check W --telemetry FILE``): production's TPOT p50/p90, acceptance length and tokens per step
against the recommendation's ``predicted`` figures; a gap beyond the canary range is flagged.
Exit codes: 0 within the ranges, 1 gap flagged, 2 bad input. Every check (drift or realized) is
appended to ``recommendations/history/<workload>/checks.jsonl``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

from autotune.core import _measure
from autotune.core._files import SHARED, open_append, write_json
from autotune.core._names import check_workload, child
from autotune.search._space import NONE, canonical
from autotune.search._trial import spec_counters
from autotune.trust import _gate, _telemetry

EXIT_OK, EXIT_RETUNE, EXIT_INPUT = 0, 1, 2
# vLLM's buckets of vllm:request_time_per_output_token_seconds (0.32), in ms: how production's
# Prometheus reads TPOT when no production telemetry gave its own bounds
VLLM_TPOT_BOUNDS_MS = [10.0, 25.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 400.0, 500.0, 750.0, 1000.0,
                       2500.0, 5000.0, 7500.0, 10000.0, 20000.0, 40000.0, 80000.0]


# ---- what a recommendation is made on -------------------------------------------------------
def prompt_words(body: dict) -> int:
    """Prompt length in whitespace-separated words (no tokenizer needed; the same unit on both
    sides of every comparison)."""
    if "prompt" in body:
        p = body["prompt"]
        text = p if isinstance(p, str) else " ".join(map(str, p)) if isinstance(p, list) else str(p)
    else:
        parts = []
        for m in body.get("messages") or []:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                parts.append(c)
            elif isinstance(c, list):
                parts += [x.get("text", "") for x in c if isinstance(x, dict)]
        text = " ".join(parts)
    return len(text.split())


def traffic_profile(requests) -> dict:
    """Tag shares and prompt-length distribution (words) of a list of ReplayRequest."""
    n = len(requests)
    tags: dict[str, int] = {}
    for r in requests:
        tags[str(r.tag)] = tags.get(str(r.tag), 0) + 1
    lengths = [float(prompt_words(r.body)) for r in requests]
    pct = _measure.percentiles(lengths) if lengths else {}
    return {"requests": n, "tag_shares": {k: v / n for k, v in sorted(tags.items())} if n else {},
            "prompt_words": {"p50": pct.get("p50"), "p90": pct.get("p90"),
                             "mean": sum(lengths) / n if n else None}}


def engine_fingerprint(model: str, vllm_version: str | None, serve_args: dict) -> dict:
    """What a deploy check compares: the same model, vLLM and serve arguments (speculative keys
    excluded: they are the recommendation itself)."""
    blob = json.dumps({"model": model, "vllm": vllm_version, "serve_args": serve_args}, sort_keys=True, default=str)
    return {"model": model, "vllm_version": vllm_version, "serve_args": serve_args,
            "sha256": hashlib.sha256(blob.encode()).hexdigest()[:16]}


def _pooled(trials, bounds_ms: list[float]) -> dict:
    """Predicted figures from a config's trials: counters pooled, per-request TPOTs pooled."""
    c = spec_counters(trials)  # every trial knows its decode steps: c["itl_counted"] (see _telemetry)
    drafts, accepted = c["drafts"], c["accepted_tokens"]
    first = 0
    tpots: list[float] = []
    k = None
    for t in trials:
        m = t.measurement
        first += (m.get("summary") or {}).get("ok") or 0
        tpots += m.get("tpot_ms") or []
        k = len((m.get("spec_delta") or {}).get("accepted_per_position") or []) or k
    steps = _telemetry.step_figures(c["generated_tokens"], first, accepted, drafts,
                                    c["itl_count"] if c["itl_counted"] else None)
    pct = _measure.percentiles(tpots) if tpots else {}
    p50, p90 = _telemetry.read_as_histogram(tpots, bounds_ms)
    return {"tpot_ms_p50": pct.get("p50"), "tpot_ms_p90": pct.get("p90"), "tpot_p50": p50, "tpot_p90": p90,
            "tpot_mean": sum(tpots) / len(tpots) if tpots else None,
            "acceptance_length": 1 + accepted / drafts if drafts else None,
            "coverage": steps["coverage"], "tokens_per_step": steps["tokens_per_step"],
            "deployed_k": k, "trials": [t.number for t in trials], "requests": len(tpots)}


def _unresolved(predicted: dict, bounds_ms: list[float], tol) -> dict[str, str]:
    """The TPOT quantiles production's histogram cannot check at their tolerance
    (``_telemetry.resolves``), each with why: no canary range for them, since any TPOT inside the
    bucket reads the same; the mean (exact, from the histogram's ``_sum`` and ``_count``) stays."""
    out = {}
    for key, q, t in (("tpot_ms_p50", "p50", tol.tpot_p50), ("tpot_ms_p90", "p90", tol.tpot_p90)):
        exact = predicted.get(f"tpot_ms_{q}")
        if exact is None or t is None or _telemetry.resolves(exact, bounds_ms, t):
            continue
        lo, hi = _telemetry.bucket_of(exact, bounds_ms)
        reads = predicted.get(f"tpot_{q}")
        out[key] = (f"the replay's TPOT {q} {exact:.2f} ms falls in production's {lo:g}-{hi:g} ms histogram bucket, "
                    f"wider than the +-{t:.0%} tolerance: production's {q} reads "
                    f"{'-' if reads is None else f'{reads:.2f} ms'} for any TPOT in that bucket; watch tpot_ms_mean")
    return out


def trust_blocks(study, payload: dict, fidelity: dict) -> dict:
    """``traffic``, ``engine``, ``predicted``, ``canary`` and ``kill_criteria`` of a recommendation,
    from the study's record (``search.StudyRecord``)."""
    spec = study.spec
    tol = spec.production.tolerances
    # production's own TPOT buckets, which the gate read from its telemetry, else vLLM's
    bounds = (fidelity.get("telemetry") or {}).get("tpot_bounds_ms") or VLLM_TPOT_BOUNDS_MS
    deployed = payload.get("speculative_config")
    key = canonical(deployed) if deployed else NONE
    predicted = {**_pooled(study.trials(config_key=key), bounds), "config": deployed,
                 "concurrency": spec.replay.concurrency,
                 "tpot_note": "tpot_p50/p90: the replay's per-request TPOTs read through production's TPOT "
                              "histogram buckets, as Prometheus shows them; tpot_ms_p50/p90: exact"}
    rollback_key = canonical(spec.incumbent) if spec.incumbent else NONE
    rollback = _pooled(study.trials(config_key=rollback_key), bounds) if rollback_key != key else predicted

    def rng(v, t):
        return None if v is None or t is None else [v * (1 - t), v * (1 + t)]

    unresolved = _unresolved(predicted, bounds, tol)  # no range where production cannot see one
    canary = {"tpot_ms_p50": None if "tpot_ms_p50" in unresolved else rng(predicted["tpot_p50"], tol.tpot_p50),
              "tpot_ms_p90": None if "tpot_ms_p90" in unresolved else rng(predicted["tpot_p90"], tol.tpot_p90),
              "tpot_ms_mean": rng(predicted["tpot_mean"], tol.tpot_mean),
              "acceptance_length": rng(predicted["acceptance_length"], tol.acceptance_length),
              "tokens_per_step": rng(predicted["tokens_per_step"], tol.tokens_per_step),
              "deployed_k": predicted["deployed_k"],
              "window": "at least 10 x the concurrency in finished requests, at the workload's concurrency "
                        f"({spec.replay.concurrency}); read with `autotune recommend check {spec.workload} --telemetry FILE`",
              **({"unresolved": unresolved} if unresolved else {})}
    kill = []
    if rollback.get("tpot_mean") is not None and key != rollback_key:  # the mean: exact, the histogram's p50 is not
        kill.append({"figure": "tpot_ms_mean", "above": rollback["tpot_mean"],
                     "why": "slower than the config it replaces measured (roll back)"})
    if canary["acceptance_length"]:
        kill.append({"figure": "acceptance_length", "below": canary["acceptance_length"][0],
                     "why": "production's drafts are accepted less than the study measured: the traffic differs"})
    kill.append({"figure": "failed_requests", "above": 0, "why": "the recommended config failed requests"})
    kill.append({"figure": "preemptions", "above": 0,
                 "why": "drafts take KV cache: preemptions mean the config does not fit production's memory"})
    return {"traffic": traffic_profile(study.replay_set.requests),
            "engine": engine_fingerprint(spec.model, study.vllm_version, dict(spec.engine.serve_args)),
            "predicted": predicted, "canary": canary, "kill_criteria": kill}


# ---- drift check ------------------------------------------------------------------------------
def _rel(a, b):
    return None if a is None or b is None or not a else (b - a) / a


def check_drift(spec, rec: dict | None, requests, telemetry: dict | None, vllm_version: str | None,
                now: dt.datetime | None = None) -> dict:
    """Compare the present (traffic, telemetry, engine, clock) with what ``rec`` was made on."""
    now = now or dt.datetime.now(dt.timezone.utc)
    thr = spec.drift
    reasons: list[str] = []
    figures: dict = {}
    if rec is None:
        return {"retune": True, "reasons": ["no recommendation yet"], "figures": figures,
                "checked_at": now.isoformat(timespec="seconds")}
    exp = rec.get("expires_at")
    if exp:
        when = dt.datetime.fromisoformat(exp.replace("Z", "+00:00"))
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        figures["expires_at"] = exp
        if when <= now:
            reasons.append(f"recommendation expired ({exp})")
    # engine
    eng = rec.get("engine") or {}
    vf = rec.get("valid_for") or {}
    old_v = eng.get("vllm_version") or vf.get("vllm_version")
    figures["vllm_version"] = vllm_version
    if vllm_version and old_v and vllm_version != old_v:
        reasons.append(f"engine changed (vLLM {old_v} -> {vllm_version})")
    old_model = eng.get("model") or vf.get("model")
    if old_model and old_model != spec.model:
        reasons.append(f"engine changed (model {old_model} -> {spec.model})")
    old_args = eng.get("serve_args", vf.get("serve_args"))
    if old_args is not None and old_args != dict(spec.engine.serve_args):
        changed = sorted(k for k in set(old_args) | set(spec.engine.serve_args)
                         if old_args.get(k) != spec.engine.serve_args.get(k))
        reasons.append(f"engine changed (serve args {', '.join(changed)})")
    # traffic
    now_t = traffic_profile(requests)
    figures["traffic"] = now_t
    old_t = rec.get("traffic")
    if old_t is None:
        by_tag = (rec.get("replay_set") or {}).get("by_tag") or {}
        n = sum(by_tag.values())
        old_t = {"tag_shares": {k: v / n for k, v in by_tag.items()} if n else {}, "prompt_words": {}}
    moved = []
    for tag in sorted(set(old_t["tag_shares"]) | set(now_t["tag_shares"])):
        a, b = old_t["tag_shares"].get(tag, 0.0), now_t["tag_shares"].get(tag, 0.0)
        if abs(b - a) > thr.tag_share_change:
            moved.append((abs(b - a), f"{tag} share {a:.2f} -> {b:.2f}"))
    if moved:
        reasons.append("mix changed (" + ", ".join(m for _, m in sorted(moved, reverse=True)) + ")")
    lengths = []
    for q in ("p50", "p90"):
        a, b = (old_t.get("prompt_words") or {}).get(q), now_t["prompt_words"].get(q)
        r = _rel(a, b)
        if r is not None and abs(r) > thr.prompt_length_change:
            lengths.append(f"{q} {a:.0f} -> {b:.0f} words, {r:+.0%}")
    if lengths:
        reasons.append(f"prompt lengths changed ({'; '.join(lengths)})")
    # production telemetry at the deployed K
    if telemetry is not None:
        d = telemetry["derived"]
        now_p = _gate.production_figures(d)
        figures["production"] = {k: now_p[k] for k in ("acceptance_length", "tokens_per_step", "coverage",
                                                       "deployed_k", "tpot_p50")}
        fid = rec.get("fidelity") or {}
        base = fid.get("production") if fid.get("checked") else None
        source = "production when the recommendation was made"
        if base is None:
            base = rec.get("predicted") or {}
            source = "the recommendation's prediction"
        figures["reference"] = {"source": source, **{k: base.get(k) for k in
                                                     ("acceptance_length", "tokens_per_step", "deployed_k")}}
        if base.get("deployed_k") is not None and (now_p["deployed_k"] or None) != (base.get("deployed_k") or None):
            reasons.append(f"deployed K changed ({base.get('deployed_k')} -> {now_p['deployed_k']})")
        for fig, label, t in (("acceptance_length", "acceptance length", thr.acceptance_length_change),
                              ("tokens_per_step", "tokens per step", thr.tokens_per_step_change)):
            r = _rel(base.get(fig), now_p[fig])
            if r is not None and abs(r) > t:
                reasons.append(f"{label} changed ({base[fig]:.2f} -> {now_p[fig]:.2f} at K={now_p['deployed_k']}, "
                               f"{r:+.0%}; {source})")
    return {"retune": bool(reasons), "reasons": reasons, "figures": figures,
            "recommendation": rec.get("id"), "checked_at": now.isoformat(timespec="seconds")}


def drift_lines(result: dict) -> list[str]:
    if result["retune"]:
        return ["retune: " + "; ".join(result["reasons"])]
    f = result["figures"]
    t = f.get("traffic") or {}
    shares = ", ".join(f"{k} {v:.2f}" for k, v in (t.get("tag_shares") or {}).items())
    pw = t.get("prompt_words") or {}
    out = [f"no retune needed: traffic {t.get('requests')} requests ({shares}), prompt words p50 "
           f"{_n(pw.get('p50'))} p90 {_n(pw.get('p90'))}; vLLM {f.get('vllm_version')}; expires {f.get('expires_at')}"]
    p = f.get("production")
    if p:
        ref = f.get("reference") or {}
        out.append(f"  production at K={p['deployed_k']}: acceptance length {_n(p['acceptance_length'], '.2f')} "
                   f"(was {_n(ref.get('acceptance_length'), '.2f')}), tokens per step {_n(p['tokens_per_step'], '.2f')} "
                   f"(was {_n(ref.get('tokens_per_step'), '.2f')}; {ref.get('source')})")
    return out


def _n(v, fmt: str = ".0f") -> str:
    return "-" if v is None else f"{v:{fmt}}"


# ---- realized vs predicted ----------------------------------------------------------------------
def deployed_path(recommendations_dir: str | Path, workload: str) -> Path:
    return child(recommendations_dir, f"{check_workload(workload)}.deployed.json")


def checks_path(recommendations_dir: str | Path, workload: str) -> Path:
    return child(child(Path(recommendations_dir) / "history", check_workload(workload)), "checks.jsonl")


def mark_deployed(recommendations_dir: str | Path, rec: dict, note: str | None = None) -> dict:
    mark = {"workload": rec["workload"], "recommendation": rec.get("id"), "decision": rec.get("decision"),
            "speculative_config": rec.get("speculative_config"),
            "deployed_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "note": note}
    write_json(deployed_path(recommendations_dir, rec["workload"]), mark, SHARED, root=recommendations_dir)
    return mark


def realized(rec: dict, mark: dict | None, telemetry: dict) -> dict:
    """Production's figures against the recommendation's predictions and canary ranges."""
    d = telemetry["derived"]
    prod = _gate.production_figures(d)
    pred = rec.get("predicted") or {}
    canary = rec.get("canary") or {}
    rows, flagged = [], []
    for fig, pkey, ckey in (("tpot_ms_p50", "tpot_p50", "tpot_ms_p50"), ("tpot_ms_p90", "tpot_p90", "tpot_ms_p90"),
                            ("tpot_ms_mean", "tpot_mean", "tpot_ms_mean"),
                            ("acceptance_length", "acceptance_length", "acceptance_length"),
                            ("tokens_per_step", "tokens_per_step", "tokens_per_step")):
        p, r, rng = pred.get(pkey), prod.get(pkey), canary.get(ckey)
        unresolved = (canary.get("unresolved") or {}).get(ckey)
        if p is None or r is None or unresolved:
            rows.append({"figure": fig, "predicted": p, "production": r, "gap": None, "range": rng, "ok": None,
                         **({"unresolved": unresolved} if unresolved else {})})
            continue
        ok = rng is None or rng[0] <= r <= rng[1]
        rows.append({"figure": fig, "predicted": p, "production": r, "gap": (r - p) / p if p else None,
                     "range": rng, "ok": ok})
        if not ok:
            flagged.append(f"{fig}: production {r:.2f} vs predicted {p:.2f} ({(r - p) / p:+.0%}; canary range "
                           f"{rng[0]:.2f}-{rng[1]:.2f})")
    notes = []
    if mark is None:
        notes.append("no deploy mark: `autotune recommend mark-deployed` records when this recommendation went live")
    elif mark.get("recommendation") != rec.get("id"):
        notes.append(f"the deploy mark is for recommendation {mark.get('recommendation')}, not the current "
                     f"{rec.get('id')}")
    pk = pred.get("deployed_k")
    if (pk or None) != (prod.get("deployed_k") or None):
        flagged.insert(0, f"deployed K: production drafts {prod.get('deployed_k') or 0} positions, the "
                          f"recommendation {pk or 0}: is the recommended config deployed?")
    if (d.get("preemptions") or 0) > 0:
        flagged.append(f"preemptions: {d['preemptions']:.0f} in the window (kill criterion)")
    return {"recommendation": rec.get("id"), "deployed_at": (mark or {}).get("deployed_at"),
            "telemetry": {"source": telemetry.get("source"), "started_at": telemetry.get("started_at"),
                          "window_s": telemetry.get("window_s"), "requests": d.get("requests_started")},
            "rows": rows, "flagged": flagged, "gap_flagged": bool(flagged), "notes": notes,
            "checked_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def realized_lines(res: dict) -> list[str]:
    out = [f"realized vs predicted for recommendation {res['recommendation']} (deployed {res['deployed_at'] or '-'}; "
           f"telemetry {res['telemetry']['source']}, {_n(res['telemetry']['requests'])} requests)"]
    for r in res["rows"]:
        rng = r["range"]
        out.append(f"  {r['figure']:18s} predicted {_n(r['predicted'], '8.2f')}  production {_n(r['production'], '8.2f')}  "
                   f"gap {('-' if r['gap'] is None else format(r['gap'], '+.0%')):>5s}  "
                   f"canary {('-' if not rng else f'{rng[0]:.2f}-{rng[1]:.2f}')}  "
                   f"{'unresolved' if r.get('unresolved') else '-' if r['ok'] is None else 'ok' if r['ok'] else 'GAP'}")
    for n in res["notes"] + [f"{r['figure']}: {r['unresolved']}" for r in res["rows"] if r.get("unresolved")]:
        out.append(f"  note: {n}")
    out.append("  LARGE GAP: " + "; ".join(res["flagged"]) if res["flagged"] else "  within the canary ranges")
    return out


def append_check(recommendations_dir: str | Path, workload: str, kind: str, result: dict) -> Path:
    p = checks_path(recommendations_dir, workload)
    with open_append(p, SHARED, root=recommendations_dir) as fh:
        fh.write(json.dumps({"kind": kind, **result}, default=str) + "\n")
    return p
