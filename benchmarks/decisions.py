"""Calibration of the keep / change / disable decision: error rates and power, old rule vs new.

Simulated nights of a study as the product runs it (baseline, incumbent, four candidates, the
search's pick, confirmation, the decision), with noise drawn from recorded server starts:

- **noise model**: per-request TPOT of start s of config c is ``T_c * exp(b_s) * r``: a
  start effect ``b_s ~ N(0, sigma_b^2)`` and a request factor ``r`` drawn from the recorded
  per-request residuals (each request over its own start's median). ``sigma_b`` is fitted on
  A/A data: the pooled variance of the log per-start median of configs started several times,
  less the part the request noise alone gives a median of that many requests. Three profiles:
  vllm-cpu (``benchmarks/results/aa-vllm-cpu.jsonl``: the same configs started 10 times each,
  ``benchmarks/grid.py``; the tiny models' grid-*.jsonl starts too), smollm2 (the SmolLM2
  grids) and the H200 (``h200-*.jsonl``: the configs measured in more than one start); each
  also with a heavy tail (``OUTLIERS``: one start in 20 slowed 1.42x), where the decision as
  shipped runs beside the same decision pooling its prior regardless (``-pool``);
- **old rule**: the decision as it was: every start of baseline and winner (selection start
  included), percentile bootstrap by start then request, CI wholly above 1 -> change, against
  no speculation only; otherwise keep, or disable when a config is deployed; confirmation one
  start each of baseline and winner;
- **new rule**: ``autotune.decide._recommend.decide`` itself on the simulated trials
  (confirmation starts only, winner vs incumbent, t interval with pooled variance,
  sequential rounds ``confirm_starts: 1`` .. ``confirm_max_starts: 3``), on a first night (no
  history) and after 7 nights of history (each earlier night's own start-to-start variance).

Scenarios (true TPOT relative to no speculation): ``no-gain``: incumbent 0.80 and four
candidates 0.80 (false change); ``no-gain-none``: nothing deployed, four candidates 1.00 (false
change); ``inc-5pct``: incumbent 5% faster than no speculation, candidates equal to it (false
disable); ``gain-10`` / ``gain-20``: one candidate truly 10% / 20% faster than the incumbent
(0.80), three equal to it (power).

    python benchmarks/decisions.py                 # 1000 nights per cell, writes results/decisions.json
    python benchmarks/decisions.py --nights 200    # quicker
    python benchmarks/decisions.py --fit-only      # the noise model and its fit to the A/A data
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.core import _measure  # noqa: E402
from autotune.core._spec import load_spec  # noqa: E402
from autotune.search._space import NONE, canonical  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CANDIDATES = [{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
              for k in (2, 3, 4, 6)]
INCUMBENT = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
RULES = (("old", 0), ("new", 0), ("new", 7), ("prior", 0))
#: the heavy-tail table: the decision as shipped against the same decision pooling its prior even
#: where the night's own starts contradict it (``-pool``: what it did before ``with_prior``)
OUTLIER_RULES = (("new", 7), ("new-pool", 7), ("prior", 0), ("prior-pool", 0))
OUTLIERS = (0.05, 1.42)  # a start 1.42x slower, one start in 20
PROFILES = ("vllm-cpu", "smollm2", "h200")
SCENARIOS = {  # name: (incumbent TPOT or None, candidate TPOTs, the correct decision)
    "no-gain": (0.80, [0.80, 0.80, 0.80, 0.80], "keep"),
    "no-gain-none": (None, [1.00, 1.00, 1.00, 1.00], "keep"),
    "inc-5pct": (1 / 1.05, [1 / 1.05] * 4, "keep"),
    "gain-10": (0.80, [0.80 / 1.10, 0.80, 0.80, 0.80], "change"),
    "gain-20": (0.80, [0.80 / 1.20, 0.80, 0.80, 0.80], "change"),
}


# ---- A/A data and the noise model -------------------------------------------------------------
def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def aa_starts(profile: str) -> tuple[dict[str, list[float]], list[list[float]]]:
    """A/A data: per config, the statistic (median TPOT) of each recorded start, configs started
    twice or more; and the per-request TPOTs of the starts that kept them (the request noise)."""
    medians: dict[str, list[float]] = {}
    requests: list[list[float]] = []
    if profile in ("vllm-cpu", "smollm2"):
        # vllm-cpu: the tiny models' A/A run and grids; smollm2: the real model's grids, twice as
        # noisy (its specs carry their own prior); llama.cpp's grids are another engine
        aa = RESULTS / "aa-vllm-cpu.jsonl"
        grids = [f for f in sorted(RESULTS.glob("grid-*.jsonl")) if "llamacpp" not in f.stem
                 and ("smollm2" in f.stem) == (profile == "smollm2")]
        for f in ([aa] if profile == "vllm-cpu" else []) + grids:
            for r in _rows(f):
                if r.get("ok") and r.get("tpot_ms") and r.get("tpot_source", "server") == "server":
                    medians.setdefault(f"{f.stem}:{r['config_key']}", []).append(float(np.median(r["tpot_ms"])))
                    if f == aa or profile == "smollm2" or (not aa.exists() and "mixed" not in f.stem):
                        requests.append(r["tpot_ms"])
    else:
        # H200 at one request in flight (the c=32 windows hold 1-13 requests): no speculation in
        # the three studies' baselines (its TPOT does not depend on the prompts' text) and chat's
        # ngram K=8 in two studies; plain configs only (labelled points were experiments)
        for f in sorted(RESULTS.glob("h200-*.jsonl")):
            for r in _rows(f):
                if r.get("state", "COMPLETE") != "COMPLETE" or r.get("ok") is False or r.get("label"):
                    continue
                cfg = r.get("config") or {}
                wl = str(r.get("workload", ""))
                if cfg and not (wl.startswith("chat") and cfg.get("method") == "ngram"
                                and cfg.get("num_speculative_tokens") == 8 and len(cfg) == 4):
                    continue
                lv = (r.get("levels") or {}).get("1")
                if lv and lv.get("tpot_ms"):
                    t = lv["tpot_ms"]
                    requests.append(t)
                    v = float(np.median(t))
                elif not r.get("levels") and wl.endswith("-c1") and r.get("value"):
                    v = float(r["value"])
                else:
                    continue
                medians.setdefault(f"h200:c1:{r['config_key']}", []).append(v)
    return {k: v for k, v in medians.items() if len(v) >= 2}, requests


def start_log_tpots(model: dict, rng: np.random.Generator) -> np.ndarray:
    """Log per-request TPOT factors of one simulated start: the start effect ``b ~ N(0, sigma_b^2)``
    plus one recorded start's per-request residuals as they were (the replay sends the same
    requests every start: their spread is fixed, the start moves them together). With
    ``model["outliers"] = (q, f)`` a start is also slowed by ``f`` with probability ``q``: the
    heavy tail the normal fit does not have (a busy host; on vllm-cpu one start of ngram K=8
    came out 1.42x slower than the equal K=7 beside it)."""
    t = model["residuals"][int(rng.integers(len(model["residuals"])))]
    b = rng.normal(0, model["sigma_b"])
    q, f = model.get("outliers") or (0.0, 1.0)
    if q and rng.random() < q:
        b += math.log(f)
    return b + t


def fit(profile: str, rng: np.random.Generator, sims: int = 4000) -> dict:
    """``sigma_b``: the pooled start-to-start sd of the log per-start median over the A/A configs
    (the request part is inside it: the same requests are replayed every start); request
    residuals: each recorded start's log TPOTs less its own log median. Fit check: the pooled sd
    and the largest standardized deviation the model gives for the same layout (configs x starts)
    against the observed ones, and the request-level sd within a start."""
    medians, requests = aa_starts(profile)
    if not medians:
        raise SystemExit(f"no A/A starts recorded for {profile}")
    resid = [np.log(np.asarray(g)) - math.log(float(np.median(g))) for g in requests]
    n_req = int(np.median([len(g) for g in requests]))
    logs = {k: [math.log(m) for m in v] for k, v in medians.items()}
    noise = _measure.pooled_start_noise(logs)
    sigma_b = noise.sd
    model = {"profile": profile, "sigma_b": sigma_b, "residuals": resid, "requests": n_req}

    def max_z(ls):
        n = _measure.pooled_start_noise(ls)
        return max(abs(x - np.mean(v)) / n.sd for v in ls.values() for x in v) if n.df and n.sd > 0 else 0.0

    draws, zs = [], []
    for _ in range(sims):
        sim = {k: list(rng.normal(0, sigma_b, len(v))) for k, v in logs.items()}
        draws.append(_measure.pooled_start_noise(sim).sd)
        zs.append(max_z(sim))
    req_sd_obs = [float(np.std(r, ddof=1)) for r in resid]
    from scipy.stats import shapiro  # normality of the log per-start medians of a config started 8+ times

    normal = {k: float(shapiro(v).pvalue) for k, v in logs.items() if len(v) >= 8}
    lo, hi = np.percentile(draws, [5, 95])
    return {**model, "fit": {
        "configs": len(medians), "starts": sum(len(v) for v in medians.values()), "df": noise.df,
        "requests_per_start": n_req, "starts_with_requests": len(requests),
        "observed_start_sd_log": noise.sd, "sigma_b": sigma_b,
        "model_start_sd_log_90pct": [float(lo), float(hi)],
        "observed_max_standardized_deviation": max_z(logs),
        "model_max_standardized_deviation_90pct": [float(x) for x in np.percentile(zs, [5, 95])],
        "observed_request_sd_log_median": float(np.median(req_sd_obs)),
        "observed_request_sd_log_range": [float(min(req_sd_obs)), float(max(req_sd_obs))],
        "shapiro_p_log_medians": normal,
        "per_config": {k: [round(x, 3) for x in v] for k, v in medians.items()}}}


# ---- one simulated night ------------------------------------------------------------------------
class Night:
    """What decide() reads (spec, trials, best, objective_of; confirmation), over in-memory Optuna."""

    def __init__(self, spec):
        import optuna

        from autotune.search._study import Study

        self.trials, self.best, self.objective_of = (Study.trials.__get__(self), Study.best.__get__(self),
                                                     Study.objective_of.__get__(self))
        self.spec = spec
        self.study = optuna.create_study()
        self.starts = 0
        self.confirmation = {"fresh_requests": True, "rounds": 0, "skipped": None}


def _trial(spec, config, tpot, role):
    import optuna

    g = spec.guards
    return optuna.trial.create_trial(
        value=float(np.median(tpot)),
        user_attrs={"role": role, "config": config, "config_key": canonical(config),
                    "measurement": {"tpot_ms": [float(x) for x in tpot], "start_seconds": 20.0,
                                    "summary": {"output_throughput_tok_s": 100.0, "failed": 0, "ttft_ms": {}},
                                    "spec_delta": {"drafts": 100, "accepted_tokens": 200} if config else {}},
                    "equivalence": {"compared": 32, "matched": 32}, "stalled": False},
        constraints={"failed_requests": -1.0, "equivalence": 0.0, "throughput_floor": g.throughput_floor - 1.0})


def simulate(model, scenario, rule, rng, spec, history_nights=0):
    if rule.endswith("-pool"):  # the prior pooled whatever the night's own starts say
        from autotune.decide import _recommend

        saved, _recommend.PRIOR_CONFLICT_P = _recommend.PRIOR_CONFLICT_P, 0.0
        try:
            return simulate(model, scenario, rule.removesuffix("-pool"), rng, spec, history_nights)
        finally:
            _recommend.PRIOR_CONFLICT_P = saved
    if rule == "prior":  # the shipped setting: a recorded A/A prior (objective.start_noise) from the fit
        from autotune.core._spec import StartNoiseSpec

        # the fitted figure as it is, worth the A/A data's own degrees of freedom (at most 20)
        o = spec.objective.model_copy(update={"start_noise": StartNoiseSpec(
            cv=math.expm1(model["sigma_b"]), df=max(1, min(20, model["fit"]["df"])))})
        spec, rule = spec.model_copy(update={"objective": o}), "new"
    return _simulate(model, scenario, rule, rng, spec, history_nights)


def _simulate(model, scenario, rule, rng, spec, history_nights=0):
    """One night; returns (decision, chose the truly best config, server starts, confirmation starts)."""
    inc_t, cand_t, _ = SCENARIOS[scenario]
    incumbent = INCUMBENT if inc_t is not None else None
    truth = {NONE: 1.0, **({canonical(INCUMBENT): inc_t} if incumbent else {}),
             **{canonical(c): t for c, t in zip(CANDIDATES, cand_t)}}
    configs = {NONE: None, canonical(INCUMBENT): INCUMBENT, **{canonical(c): c for c in CANDIDATES}}
    s = spec.model_copy(update={"incumbent": incumbent})
    night = Night(s)

    def start(key, role):
        t = 20.0 * truth[key] * np.exp(start_log_tpots(model, rng))
        night.study.add_trial(_trial(s, configs[key], t, role))
        night.starts += 1

    start(NONE, "baseline")
    if incumbent:
        start(canonical(INCUMBENT), "search")
    for c in CANDIDATES:
        start(canonical(c), "search")
    best = night.best(search_only=True)
    wkey = best.user_attrs["config_key"]
    search_starts = night.starts
    if rule == "old":
        start(NONE, "confirm")
        start(wkey, "confirm")
        d = old_decide(night, s)
    else:
        from autotune.decide import _recommend

        history = [_history_rec(model, rng, s, i) for i in range(history_nights)]
        sides = [NONE] + ([canonical(INCUMBENT)] if incumbent and canonical(INCUMBENT) != wkey else []) + [wkey]
        o = s.objective
        for i in range(o.max_confirm_starts()):
            if i >= o.confirm_starts and not _recommend.open_question(night, history):
                break
            for key in sides:
                start(key, "confirm")
            night.confirmation["rounds"] = i + 1
        d = _recommend.decide(night, history).decision
    right = d == SCENARIOS[scenario][2] and (d != "change" or truth[wkey] == min(truth.values()))
    return d, right, night.starts, night.starts - search_starts


def _history_rec(model, rng, spec, i) -> dict:
    """An earlier night's recommendation as the pipeline stores it: its own study's variance from
    two starts each of baseline and incumbent (the least a night measures twice)."""
    logs = {k: [math.log(float(np.median(np.exp(start_log_tpots(model, rng))))) for _ in range(2)]
            for k in ("none", "incumbent")}
    own = _measure.pooled_start_noise(logs)
    return {"id": f"h{i}", "study": {"name": f"night-{i}"},
            "valid_for": {"model": spec.model, "concurrency": spec.replay.concurrency, "vllm_version": None},
            "evidence": {"statistic": spec.objective.statistic, "noise": {"study": {"ss": own.ss, "df": own.df}}}}


def old_decide(night, spec) -> str:
    """The rule as it was (``_recommend._decide`` before docs/decisions.md): winner vs no
    speculation on every start of each, bootstrap by start then request."""
    stat = spec.objective.statistic
    b = [t.user_attrs["measurement"]["tpot_ms"] for t in night.trials(config_key=NONE)]
    best = night.best()
    key = best.user_attrs["config_key"]
    w = [t.user_attrs["measurement"]["tpot_ms"] for t in night.trials(config_key=key)]
    ci = _measure.bootstrap_ratio_ci(b, w, statistic=stat, confidence=spec.guards.confidence, seed=spec.seed)
    inc = canonical(spec.incumbent)
    if not ci.wholly_above(1.0):
        return "keep" if inc == NONE else "disable"
    return "keep" if key == inc else "change"


# ---- the table ------------------------------------------------------------------------------------
def run_cell(args):
    model, scenario, rule, nights, seed, history = args
    spec = base_spec()
    rng = np.random.default_rng(seed)
    out = {"change": 0, "keep": 0, "disable": 0, "right_change": 0, "starts": 0, "confirm_starts": 0}
    for _ in range(nights):
        d, right, starts, conf = simulate(model, scenario, rule, rng, spec, history)
        out[d] += 1
        out["right_change"] += int(d == "change" and right)
        out["starts"] += starts
        out["confirm_starts"] += conf
    return {"scenario": scenario, "rule": rule, "history_nights": history, "nights": nights,
            "change_rate": out["change"] / nights, "disable_rate": out["disable"] / nights,
            "keep_rate": out["keep"] / nights, "correct_change_rate": out["right_change"] / nights,
            "mean_server_starts": out["starts"] / nights, "mean_confirmation_starts": out["confirm_starts"] / nights}


def base_spec():
    s = load_spec(ROOT / "studies" / "code.yaml")
    o = s.objective.model_copy(update={"confirm_starts": 1, "confirm_max_starts": 3, "min_gain": None,
                                       "start_noise": None})
    return s.model_copy(update={"objective": o})


def main(argv=None) -> int:
    import logging
    import multiprocessing

    import optuna

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nights", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--fit-only", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "decisions.json"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    rng = np.random.default_rng(args.seed)
    models = {p: fit(p, rng) for p in PROFILES}
    for p, m in models.items():
        f = m["fit"]
        print(f"{p}: {f['configs']} configs, {f['starts']} starts ({f['df']} df), {f['requests_per_start']} "
              f"requests per start; start-to-start sd of log median {f['observed_start_sd_log']:.4f} "
              f"(model's 90% range for this layout {f['model_start_sd_log_90pct'][0]:.4f}-"
              f"{f['model_start_sd_log_90pct'][1]:.4f}); largest standardized deviation "
              f"{f['observed_max_standardized_deviation']:.2f} (model 90% "
              f"{f['model_max_standardized_deviation_90pct'][0]:.2f}-{f['model_max_standardized_deviation_90pct'][1]:.2f}); "
              f"request sd of log TPOT within a start: median {f['observed_request_sd_log_median']:.4f}"
              + "".join(f"; {k}: Shapiro-Wilk p {v:.2f} on its log medians" for k, v in f["shapiro_p_log_medians"].items()))
    if args.fit_only:
        return 0
    cells = []
    for pi, p in enumerate(models):
        heavy = {**models[p], "outliers": OUTLIERS}
        for si, sc in enumerate(SCENARIOS):
            for model, rules in ((models[p], RULES), (heavy, OUTLIER_RULES)):
                for rule, hist in rules:  # a rule and its -pool variant see the same nights
                    cells.append((model, sc, rule, args.nights, args.seed * 1000 + pi * 100 + si * 10 + hist, hist))
    t0 = time.monotonic()
    with multiprocessing.Pool(args.jobs) as pool:
        rows = pool.map(run_cell, cells)
    for (model, *_), r in zip(cells, rows):
        r["profile"], r["outliers"] = model["profile"], model.get("outliers")
    print(f"{len(cells)} cells x {args.nights} nights in {time.monotonic() - t0:.0f}s")
    print(table([r for r in rows if not r["outliers"]], RULES))
    q, f = OUTLIERS
    print(f"\nheavy tail: one start in {round(1 / q)} also {f}x slower")
    print(table([r for r in rows if r["outliers"]], OUTLIER_RULES))
    out = {"command": "python benchmarks/decisions.py" + (f" --nights {args.nights}" if args.nights != 1000 else ""),
           "seed": args.seed, "nights": args.nights,
           "settings": {"confirm_starts": 1, "confirm_max_starts": 3, "confidence": 0.95, "min_gain": 0,
                        "candidates": len(CANDIDATES), "requests_per_start": {p: m["requests"] for p, m in models.items()},
                        "outliers": {"share": OUTLIERS[0], "slowdown": OUTLIERS[1]}},
           "noise_models": {p: m["fit"] for p, m in models.items()}, "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def table(rows, rules=RULES) -> str:
    """Markdown: per profile and rule, false change (no-gain, no-gain-none), false disable
    (inc-5pct), power at 10% and 20%, mean server starts."""
    head = ("| hardware | rule | false change (4 equal candidates, incumbent) | false change (nothing deployed) | "
            "false disable (incumbent 5% faster) | power at 10% | power at 20% | mean starts (confirmation) |")
    lines = [head, "|" + "---|" * 8]
    key = {(r["profile"], r["rule"], r["history_nights"], r["scenario"]): r for r in rows}
    for p in dict.fromkeys(r["profile"] for r in rows):
        for rule, hist in rules:
            g = lambda sc: key[(p, rule, hist, sc)]  # noqa: E731
            base = rule.removesuffix("-pool")
            name = {"old": "old: bootstrap vs none", "prior": "new, recorded A/A prior (first night)"}.get(
                base, f"new, {'first night, no prior' if not hist else f'{hist} nights of history, no prior'}")
            if rule != base:
                name += ", pooled even where contradicted"
            starts = np.mean([g(sc)["mean_server_starts"] for sc in SCENARIOS])
            conf = np.mean([g(sc)["mean_confirmation_starts"] for sc in SCENARIOS])
            lines.append(f"| {p} | {name} | {g('no-gain')['change_rate']:.1%} | {g('no-gain-none')['change_rate']:.1%} | "
                         f"{g('inc-5pct')['disable_rate']:.1%} | {g('gain-10')['correct_change_rate']:.1%} | "
                         f"{g('gain-20')['correct_change_rate']:.1%} | {starts:.1f} ({conf:.1f}) |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
