"""Fidelity gate: does the replay reproduce what production shows?

A study replays the incumbent (the deployed speculative config, or no speculation when none is
deployed) on the sampled traffic with production's engine setup. When the spec names production
telemetry (``production.telemetry``: a bundle from ``autotune telemetry scrape``), that replay
trial's figures are compared with production's, each within the spec's tolerance
(``production.tolerances``):

- acceptance length at the deployed K (relative), coverage (absolute: drafted steps / decode
  steps), tokens per decode step (relative) — from the trial's /metrics counter deltas, derived
  exactly as ``_telemetry`` derives production's;
- TPOT p50 and p90 (relative): the trial's per-request TPOTs (the engine's own timings) are
  counted into production's histogram buckets and read with the same interpolation, so the
  buckets' coarseness is the same on both sides. vLLM's first TPOT bucket is 0-10 ms: below
  10 ms the percentiles cannot tell values apart (the check says so: ``bucket_limited``), which
  is why the TPOT mean (histogram sum / count, exact) is compared too;
- ITL mean (relative): the server-side ITL histogram mean of both (one observation per engine
  step of a request). The trial keeps no ITL buckets, so ITL p50/p90 are shown for production
  only;
- the deployed K: production's number of draft positions must be the incumbent's K.

A speculating server that drafted nothing in its window has acceptance length 1 here (no token
beyond the verified one per step), so "production drafts, the replay never does" is a mismatch
of acceptance length, coverage and tokens per step, not a skipped comparison.

If any figure is off, the study stops before the search (no server start is spent on a replay
that does not measure production), writes no recommendation and says which figure is off and by
how much (``FidelityFailed``; ``study start`` exits 5). The comparison, passed or not checked,
goes into every recommendation (``fidelity``).
"""

from __future__ import annotations

from autotune.search._record import StudyRecord, study_record
from autotune.search._space import NONE, canonical
from autotune.trust import _telemetry

FIGURES = ("acceptance_length", "coverage", "tokens_per_step", "tpot_p50", "tpot_p90", "tpot_mean", "itl_mean")
ABSOLUTE = {"coverage"}
UNITS = {"tpot_p50": " ms", "tpot_p90": " ms", "tpot_mean": " ms", "itl_mean": " ms"}


class FidelityFailed(RuntimeError):
    """The incumbent's replay does not match production; ``result`` is the fidelity block."""

    def __init__(self, result: dict):
        super().__init__("; ".join(result.get("off") or [result.get("reason", "fidelity gate failed")]))
        self.result = result


def _al(drafts: float, accepted: float, k: int | None) -> float | None:
    if drafts:
        return 1 + accepted / drafts
    return 1.0 if k else None  # speculating, nothing drafted: one token per step


def production_figures(derived: dict) -> dict:
    k = derived.get("deployed_k")
    return {"acceptance_length": _al(derived.get("drafts") or 0, derived.get("accepted_tokens") or 0, k),
            "coverage": derived.get("coverage"), "tokens_per_step": derived.get("tokens_per_step"),
            "tpot_p50": derived["tpot_ms"]["p50"], "tpot_p90": derived["tpot_ms"]["p90"],
            "tpot_mean": derived["tpot_ms"]["mean"],
            "itl_mean": derived["itl_ms"]["mean"], "itl_p50": derived["itl_ms"]["p50"],
            "itl_p90": derived["itl_ms"]["p90"], "deployed_k": k,
            "tpot_first_bound_ms": (derived["tpot_ms"].get("bounds_ms") or [None])[0]}


def replay_figures(measurement: dict, tpot_bounds_ms: list[float]) -> dict:
    """The same figures from one trial's measurement (``Measurement.to_attrs()``)."""
    d = measurement.get("spec_delta") or {}
    s = measurement.get("summary") or {}
    g = d.get("generated_tokens") or 0.0
    a = d.get("accepted_tokens") or 0.0
    drafts = d.get("drafts") or 0.0
    steps = _telemetry.step_figures(g, s.get("ok") or 0, a, drafts, d.get("itl_count"))
    tpots = list(measurement.get("tpot_ms") or [])
    p50, p90 = _telemetry.read_as_histogram(tpots, tpot_bounds_ms)
    k = len(d.get("accepted_per_position") or []) or None
    return {"acceptance_length": _al(drafts, a, k),
            "coverage": steps["coverage"], "tokens_per_step": steps["tokens_per_step"],
            "tpot_p50": p50, "tpot_p90": p90,
            "tpot_mean": sum(tpots) / len(tpots) if tpots else None,
            "itl_mean": d.get("server_itl_ms_mean"), "itl_p50": None, "itl_p90": None,
            "deployed_k": k}


def compare(prod: dict, replay: dict, tolerances: dict, min_figures: int = 3) -> dict:
    """Each figure of FIGURES within its tolerance; a figure missing on either side is skipped
    (and listed), except acceptance figures when production speculates and the replay did not.
    Fewer than ``min_figures`` compared figures is a failure too: a gate that compared nothing
    (telemetry without the histograms, every tolerance null) must not pass."""
    checks, off, skipped = [], [], []
    for fig in FIGURES:
        p, r, tol = prod.get(fig), replay.get(fig), tolerances.get(fig)
        if tol is None:
            continue
        if p is None or r is None:
            skipped.append(fig)
            continue
        diff = r - p
        rel = diff / p if p else None
        if fig in ABSOLUTE:
            ok = abs(diff) <= tol
        else:
            ok = rel is not None and abs(rel) <= tol or (p == 0 and r == 0)
        checks.append({"figure": fig, "production": p, "replay": r, "difference": diff, "relative": rel,
                       "tolerance": tol, "kind": "absolute" if fig in ABSOLUTE else "relative", "ok": bool(ok)})
        first = prod.get("tpot_first_bound_ms")
        if fig in ("tpot_p50", "tpot_p90") and first and p <= first and r <= first:
            checks[-1]["bucket_limited"] = f"both in the histogram's first bucket (0-{first:g} ms): not resolved"
        if not ok:
            off.append(describe(checks[-1]))
    pk, rk = prod.get("deployed_k"), replay.get("deployed_k")
    if pk != rk and (pk or rk):
        off.insert(0, f"deployed K: production drafts {pk or 0} positions, the replayed incumbent {rk or 0}")
    if len(checks) < min_figures:
        off.append(f"only {len(checks)} figure(s) compared ({', '.join(c['figure'] for c in checks) or 'none'}; "
                   f"skipped: {', '.join(skipped) or 'none'}), {min_figures} needed "
                   "(production.min_figures): the replay's fidelity is not shown")
    return {"passed": not off, "checks": checks, "off": off, "skipped": skipped}


def describe(c: dict) -> str:
    unit = UNITS.get(c["figure"], "")
    if c["kind"] == "absolute":
        by = f"{c['difference']:+.2f}, tolerance ±{c['tolerance']:.2f}"
    else:
        by = (f"{c['relative']:+.0%}" if c["relative"] is not None else "from 0") + f", tolerance ±{c['tolerance']:.0%}"
    return f"{c['figure']} off: replay {c['replay']:.2f}{unit} vs production {c['production']:.2f}{unit} ({by})"


def not_checked(reason: str) -> dict:
    return {"checked": False, "passed": None, "reason": reason}


def check_study(study: StudyRecord) -> dict:
    """Compare the study's incumbent replay with the spec's production telemetry; returns the
    fidelity block, raises FidelityFailed when a figure is off or the incumbent was not replayed."""
    prod_spec = study.spec.production
    b = _telemetry.load(prod_spec.telemetry)
    derived = b["derived"]
    prod = production_figures(derived)
    tolerances = prod_spec.tolerances.model_dump()
    incumbent = study.spec.incumbent
    key = canonical(incumbent) if incumbent else NONE
    trials = [t for t in study.trials(config_key=key) if t.role != "confirm"] \
        or study.trials(config_key=key)
    block = {"checked": True, "telemetry": {"source": b.get("source"), "file": str(prod_spec.telemetry),
                                            "started_at": b.get("started_at"), "window_s": b.get("window_s"),
                                            "tpot_bounds_ms": derived["tpot_ms"]["bounds_ms"],
                                            "mean_running_requests": derived.get("mean_running_requests"),
                                            "requests": derived.get("requests_started")},
             "incumbent": incumbent, "tolerances": tolerances, "production": prod}
    if not trials:
        block.update(passed=False, replay=None, checks=[], skipped=[],
                     off=[f"the incumbent {key} was not replayed (outside the spec's space or budget): "
                          "nothing to compare with production"])
        raise FidelityFailed(block)
    t = trials[0]
    replay = replay_figures(t.measurement, derived["tpot_ms"]["bounds_ms"])
    result = compare(prod, replay, tolerances, prod_spec.min_figures)
    block.update(replay={**replay, "trial": t.number, "concurrency": study.spec.replay.concurrency}, **result)
    if not result["passed"]:
        raise FidelityFailed(block)
    return block


def fidelity_check(study) -> dict:
    """``check_study`` on a live ``Study``'s record: the ``fidelity_check`` a study runs after the
    incumbent's trial, before any search."""
    return check_study(study_record(study))


def lines(block: dict) -> list[str]:
    """The fidelity block as text (study output, `recommend show`)."""
    if not block.get("checked"):
        return [f"fidelity: not checked ({block.get('reason')})"]
    head = "fidelity: replay reproduces production" if block.get("passed") else \
        "fidelity: replay does NOT reproduce production"
    out = [head + f" (telemetry {block['telemetry'].get('file')})"]
    for c in block.get("checks") or []:
        unit = UNITS.get(c["figure"], "")
        rel = f"{c['relative']:+.0%}" if c["kind"] == "relative" and c["relative"] is not None else f"{c['difference']:+.2f}"
        tol = f"±{c['tolerance']:.0%}" if c["kind"] == "relative" else f"±{c['tolerance']:.2f}"
        out.append(f"  {c['figure']:18s} production {c['production']:8.2f}{unit:3s} replay {c['replay']:8.2f}{unit:3s} "
                   f"{rel:>6s} (tolerance {tol}) {'ok' if c['ok'] else 'OFF'}"
                   + (f"  [{c['bucket_limited']}]" if c.get("bucket_limited") else ""))
    for s in block.get("skipped") or []:
        out.append(f"  {s:18s} not compared (missing on one side)")
    for o in block.get("off") or []:
        if not o.startswith(tuple(FIGURES)):
            out.append(f"  {o}")
    return out
