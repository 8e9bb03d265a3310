"""Which guard a speculative configuration failed, by how much, and what the baseline's own starts
say about the equivalence guard.

A ``keep`` that says only "no configuration passed the guards" hides the one fact an SRE needs:
on one H100 (CUDA vLLM 0.25.0, SmolLM2-135M bf16) ngram K=10 was 1.20x faster on every start
and failed equivalence on 27 of 48 greedy outputs, while two starts of no speculation agreed on
only 38 of 48: the guard measured the engine's non-determinism. So the reason names each guard
with its range, and the evidence holds how often two baseline starts agreed
(``baseline_agreement``). The guards' pass/fail rule is the study's (``_study._record``); this
module only reads the constraints it stored.
"""

from __future__ import annotations

from itertools import combinations

from autotune.search._space import NONE, label

#: the constraints ``_study._record`` (and ``_bands.check_trial``) store, in the order reasons name them
ORDER = ("failed_requests", "equivalence", "throughput_floor", "bands_effective")


def baseline_agreement(trials) -> dict | None:
    """How often two starts of no speculation produced the same greedy output, over every pair of
    starts that share request ids (search and confirmation starts alike): ``compared``,
    ``matched`` and ``fraction`` pooled over the pairs, and the ``lowest`` pair. None with fewer
    than two starts with outputs in common."""
    outs = [(t.number, t.measurement.get("outputs") or {}) for t in trials]
    pairs = []
    for (na, a), (nb, b) in combinations([(n, o) for n, o in outs if o], 2):
        common = a.keys() & b.keys()
        if common:
            pairs.append({"trials": [na, nb], "compared": len(common),
                          "matched": sum(1 for k in common if a[k] == b[k])})
    if not pairs:
        return None
    compared, matched = sum(p["compared"] for p in pairs), sum(p["matched"] for p in pairs)
    return {"pairs": len(pairs), "compared": compared, "matched": matched, "fraction": matched / compared,
            "lowest": min(pairs, key=lambda p: p["matched"] / p["compared"])}


def agreement_text(ba: dict) -> str:
    """"two starts of no speculation agreed on 38 of 48 greedy outputs (79%)"."""
    if ba["pairs"] == 1:
        return f"two starts of no speculation agreed on {ba['matched']} of {ba['compared']} greedy outputs " \
               f"({ba['fraction']:.0%})"
    return f"starts of no speculation agreed on {ba['fraction']:.0%} of greedy outputs ({ba['pairs']} pairs, " \
           f"{ba['matched']} of {ba['compared']})"


def _span(lo, hi, fmt="{}") -> str:
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}-{fmt.format(hi)}"


def _equivalence(trials) -> str:
    """"equivalent on 11 of 16 greedy outputs (2 near-ties within 0.31 nats; real differences at
    margins 1.2-5.0 nats)"."""
    eq = [t.equivalence for t in trials if t.equivalence.get("compared")]
    if not eq:
        return "no greedy outputs compared"
    ns = {e["compared"] for e in eq}
    if len(ns) == 1:
        text = f"equivalent on {_span(min(e['matched'] for e in eq), max(e['matched'] for e in eq))} of {ns.pop()} " \
               "greedy outputs"
    else:
        fr = [e["matched"] / e["compared"] for e in eq]
        text = f"equivalent on {_span(min(fr), max(fr), '{:.0%}')} of {_span(min(ns), max(ns))} greedy outputs"
    return text + divergence_text(eq)


def divergence_text(eqs) -> str:
    """" (2 near-ties within 0.31 nats; real differences at margins 1.2-5.0 nats, 3 beyond the
    baseline's top tokens)": what the judged divergences of some starts were (``_equivalence.judge``)."""
    if "differs" not in eqs[0]:  # recorded before divergences were judged
        return ""
    near = sum(e.get("near_ties", 0) for e in eqs)
    divs = [d for e in eqs for d in e.get("divergences") or [] if d["verdict"] == "differs"]
    parts = []
    tols = [e["tolerance"] for e in eqs if e.get("tolerance") is not None]
    if tols:
        parts.append(f"{near} near-tie{'s' if near != 1 else ''} within {max(tols):.3g} nats")
    gaps = sorted(d["gap"] for d in divs if "gap" in d)
    if gaps:
        parts.append(f"real differences at margins {_span(gaps[0], gaps[-1], '{:.3g}')} nats")
    beyond = sum(1 for d in divs if "gap" not in d)
    if beyond:
        parts.append(f"{beyond} where the baseline had no near alternative")
    return f" ({'; '.join(parts)})" if parts else ""


def _detail(name: str, trials, guards) -> str:
    if name == "failed_requests":
        n = [int(t.summary.get("failed", 0) or 0) for t in trials]
        return f"{_span(min(n), max(n))} failed requests; the guard allows {guards.max_failed_requests}"
    if name == "equivalence":
        return f"{_equivalence(trials)}; the guard asks {guards.equivalence_min_match:.0%}"
    if name == "throughput_floor":  # the constraint is floor - ratio
        r = [guards.throughput_floor - t.constraints[name] for t in trials]
        return f"throughput {_span(min(r), max(r), '{:.2f}')}x of no speculation's; the floor is " \
               f"{guards.throughput_floor:g}x"
    if name == "bands_effective":
        return "the band schedule did not take effect"
    return "constraint " + ", ".join(f"{t.constraints[name]:+.3g}" for t in trials)


def failures(trials, guards) -> dict:
    """Per guard, the completed speculative starts that failed it: ``configs`` (labels),
    ``starts``, ``detail`` (the range, and what the guard asks)."""
    spec_trials = [t for t in trials if t.config_key != NONE and t.constraints]
    names = sorted({k for t in spec_trials for k, v in t.constraints.items() if v > 0},
                   key=lambda k: (ORDER.index(k) if k in ORDER else len(ORDER), k))
    out = {}
    for name in names:
        failed = [t for t in spec_trials if t.constraints.get(name, 0) > 0]
        out[name] = {"configs": sorted({label(t.config) for t in failed}), "starts": len(failed),
                     "detail": _detail(name, failed, guards)}
        if name == "equivalence":  # what was compared, where each start parted, the margins
            out[name]["starts_detail"] = [
                {"trial": t.number, "config": label(t.config),
                 **{k: t.equivalence[k] for k in ("compared", "identical", "near_ties", "differs", "matched",
                                                  "tolerance", "divergences") if k in t.equivalence}}
                for t in failed]
    return out


def fastest_blocked(trials, baseline_ms: float | None) -> dict | None:
    """The fastest speculative configuration a guard blocked, by its mean objective over its
    completed starts, and how it compares with no speculation: what the ``keep`` gave up."""
    by: dict[str, list] = {}
    for t in trials:
        if t.config_key != NONE and t.value is not None and any(v > 0 for v in t.constraints.values()):
            by.setdefault(t.config_key, []).append(t)
    if not by:
        return None
    ts = min(by.values(), key=lambda ts: sum(t.value for t in ts) / len(ts))
    ms = sum(t.value for t in ts) / len(ts)
    out = {"config": ts[0].config, "label": label(ts[0].config), "objective_ms": ms, "starts": len(ts),
           "guards": sorted({k for t in ts for k, v in t.constraints.items() if v > 0})}
    if baseline_ms:
        out.update(baseline_ms=baseline_ms, speedup=baseline_ms / ms)
    return out


def within_engine_noise(trials, ba: dict | None) -> list[str]:
    """The configurations that failed equivalence yet matched the baseline at least as often as
    two baseline starts agree with each other: for them the guard measured the engine."""
    if not ba:
        return []
    by: dict[str, list] = {}
    for t in trials:
        if t.config_key != NONE and t.constraints.get("equivalence", 0) > 0 and t.equivalence.get("compared"):
            by.setdefault(label(t.config), []).append(t)
    return sorted(cfg for cfg, ts in by.items()
                  if sum(t.equivalence["matched"] for t in ts) / sum(t.equivalence["compared"] for t in ts)
                  >= ba["fraction"])


def no_candidate_reason(trials, guards, ba: dict | None,
                        baseline_ms: float | None = None) -> tuple[str, dict, dict | None]:
    """The reason of a ``keep`` without a candidate and its evidence: ``guard_failures``, and the
    fastest blocked configuration's measured speed against ``baseline_ms``, no speculation's."""
    why = "no speculative configuration completed and passed the guards"
    failed = failures(trials, guards)
    if not failed:
        return why, {}, None
    configs = {c for f in failed.values() for c in f["configs"]}
    parts = [f"{name} ({len(f['configs'])} configuration{'s' if len(f['configs']) != 1 else ''}: {f['detail']})"
             for name, f in failed.items()]
    why += (f": every speculative configuration that completed ({len(configs)}) failed a guard: "
            + "; ".join(parts))
    blocked = fastest_blocked(trials, baseline_ms)
    if blocked:
        why += (f"; the fastest blocked, {blocked['label']}, measured {blocked['objective_ms']:.3g} ms"
                + (f" against no speculation's {blocked['baseline_ms']:.3g} ms ({blocked['speedup']:.2f}x)"
                   if blocked.get("baseline_ms") else "")
                + f", blocked by {', '.join(blocked['guards'])}")
    if "equivalence" in failed and ba:
        why += "; " + agreement_text(ba)
        if ba["fraction"] < guards.equivalence_min_match:
            why += f", under the guard's {guards.equivalence_min_match:.0%} itself"
        within = within_engine_noise(trials, ba)
        if within:
            why += (f"; {', '.join(within)} matched the baseline as often as its own starts agree: the guard "
                    "measured the engine's non-determinism, not the speculation")
        elif ba["fraction"] < guards.equivalence_min_match:
            why += ": the guard measures the engine's non-determinism along with the speculation"
    return why, failed, blocked
