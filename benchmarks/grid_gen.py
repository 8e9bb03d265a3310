"""Generated grids: a judge of the search that it cannot be tuned to.

Every recorded grid the search is judged on has its best where the search's fixed opening lands
(the largest K, the acceptance knee, or no speculation). These grids are drawn from a seed
instead, from the shapes real rows show, so that the best K lies anywhere in 1..K_max or at no
speculation:

- **acceptance** per draft position (what the engine reports as ``per_position_rates``):
  ``geometric`` (each position accepted with the same conditional chance, 0.3-0.9), ``knee``
  (0.85-0.95 up to a position, 0.15-0.5 after: a drafter that is right on a run, then wrong),
  ``decline`` (a conditional chance falling by a step per position), ``poor`` (0.05-0.3: prose for
  a prompt-lookup proposer, where no speculation should win);
- **step cost**: a step verifies K+1 tokens at ``1 + s (K+1)`` times a one-token step (s 0.01-0.12:
  cheap on an idle GPU, dear at high concurrency), times a jump where K+1 crosses a kernel or
  CUDA-graph size (4, 8, 16: each on half the grids, 0-15%), plus the proposer's own share (0-30%);
- **noise** between starts: the speculative configurations' CV 2-15%, no speculation's 0.2-1x
  of that, one start in 20 a host hiccup 1.2-1.5x slower, every configuration recorded
  ``starts`` times (the search draws one of them per start, as on a recorded grid).

The truth of a grid is the generating TPOT, not the mean of its drawn starts, so a pick is judged
against the grid's real best. ``python benchmarks/grid_gen.py`` scores the search (``ours``,
the study's code) against random order and TPE at the same number of starts on every family,
and writes ``benchmarks/results/search-generated.json``.

Two figures per strategy. **Within 3%**: the pick's true TPOT is within 3% of the grid's best.
**Within 3% or indistinguishable at the grid's resolution** (``indistinguishable``): the pick is
within 3%, or the grid's own noise cannot tell it from the best at the budget: told to compare
exactly the best and the pick, ``budget // 2`` starts each (3 of 6; the baseline's start given
away, as in ``search.pair_ceiling``), each start drawn as the search draws it (one of the
configuration's recorded starts, hiccups included), the pick's mean comes out lower in at least 5%
of the draws (exact over every combination of draws), i.e. that pair is ordered right less than
95% of the time, the same 5% by which ``search.resolution`` calls a configuration one that may be
the best. It forgives a miss only where the noise, not the search, makes it: at 15% start-to-start
noise a pick 15% slower can be indistinguishable, at 2% one 5% slower is not. Beside them, the
**pair ceiling** (``pair_ceiling``): how often that told search, 3 starts each of the best and its
nearest rival beyond 3%, picks within 3%; it bounds what the within-3% figure can reach at these
grids' noise by a search without a prior preference between the two (a search that measures more
configurations once each meets more lucky starts, not fewer).

    python benchmarks/grid_gen.py                      # 500 grids, 10 seeds each, 6 starts
    python benchmarks/grid_gen.py --grids 100 --seeds 4 --budget 8
    python benchmarks/grid_gen.py --grids 200 --seeds 4 --strategies ours --no-docs --out /tmp/x.json
    python benchmarks/grid_gen.py --spec benchmarks/gpu/code-smollm2-night.yaml --no-docs --out ...
                                  # the starts a spec's budget leaves the search (``_budget.plan``)
    python benchmarks/grid_gen.py --profile --no-docs --out ...
                                  # two levels each, scored on the traffic-weighted objective
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from autotune.search._observations import LevelObs, Observation  # noqa: E402
from autotune.search._space import canonical  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "search-generated.json"
DOCS = ROOT / "docs" / "figures" / "search.md"
SECTION = "## Search: generated grids, the best K anywhere"
FAMILIES = ("geometric", "knee", "decline", "poor")
K_MAX = 10
LEVEL = 16
STRATEGIES = ("ours", "random", "tpe")
INDISTINGUISHABLE = 0.05
"""A pick the grid cannot tell from its best: told the pair, ``budget // 2`` starts each, the pick's
mean is lower in at least this share of draws (``search.resolution``'s "may be the best" share)."""
PROFILE = (2, 16)
"""``--profile``: the two levels of a generated concurrency profile (the GPU specs' levels)."""
OBJECTIVE = 0
"""The level key that holds a profile start's traffic-weighted objective (no concurrency is 0)."""
JUMPS = (4, 8, 16)
"""Tokens per verify step where a kernel or CUDA-graph size is crossed: the step cost jumps."""


def ngram(k: int) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def acceptance(family: str, rng: random.Random, k_max: int = K_MAX) -> list[float]:
    """Per-position unconditional acceptance rates (position i accepted: all before it were)."""
    if family == "geometric":
        cond = [rng.uniform(0.3, 0.9)] * k_max
    elif family == "knee":
        at, hi, lo = rng.randint(1, k_max - 1), rng.uniform(0.85, 0.95), rng.uniform(0.15, 0.5)
        cond = [hi if i < at else lo for i in range(k_max)]
    elif family == "decline":
        a, step = rng.uniform(0.8, 0.97), rng.uniform(0.03, 0.12)
        cond = [max(0.02, a - step * i) for i in range(k_max)]
    elif family == "poor":
        cond = [rng.uniform(0.05, 0.3)] * k_max
    else:
        raise ValueError(f"unknown family {family!r}")
    rates, p = [], 1.0
    for c in cond:
        p *= c
        rates.append(p)
    return rates


def step_cost(k: int, slope: float, jumps: dict[int, float], proposer: float) -> float:
    """A speculative step's cost relative to a one-token step of no speculation."""
    tokens = k + 1
    c = 1.0 + slope * tokens
    for size, j in jumps.items():
        if tokens > size:
            c *= 1.0 + j
    return c * (1.0 + proposer)


def generate(n: int, seed: int, starts: int = 6, families=FAMILIES, profile: bool = False) -> list:
    """``n`` grids (families in turn), each drawn from ``random.Random(f"{seed}/{i}")``.

    ``profile``: each grid a concurrency profile of two levels (``PROFILE``), as a profile study
    measures: the same acceptance at both, a verify step cheap at the low level (slope 0.005-0.04)
    and dear at the high one (its own slope 0.03-0.15, at least the low one's), so the best K often
    differs between them; traffic weights drawn (the low level's 0.2-0.8); a start's noise shared
    by its levels (one server, one host) with 1-3% of each level's own. The grid is scored on the
    traffic-weighted objective (``_measure.weighted_statistic``: the weighted mean of the levels'
    TPOT), the predictor sees each level (``Grid.weights``)."""
    from search import Grid

    grids = []
    for i in range(n):
        family = families[i % len(families)]
        rng = random.Random(f"{seed}/{i}")
        rates = acceptance(family, rng)
        slope = rng.uniform(0.01, 0.12)
        jumps = {s: rng.uniform(0.0, 0.15) for s in JUMPS if rng.random() < 0.5}
        proposer = rng.uniform(0.0, 0.3)
        base = rng.uniform(1.5, 12.0)  # ms per token without speculation
        cv = rng.uniform(0.02, 0.15)
        cv_none = cv * rng.uniform(0.2, 1.0)
        if profile:
            lo_slope = rng.uniform(0.005, 0.04)
            slopes = {PROFILE[0]: lo_slope, PROFILE[1]: max(lo_slope, rng.uniform(0.03, 0.15))}
            bases = {PROFILE[0]: base, PROFILE[1]: base * rng.uniform(1.2, 2.5)}
            w_lo = rng.uniform(0.2, 0.8)
            weights = {PROFILE[0]: w_lo, PROFILE[1]: 1.0 - w_lo}
            own = rng.uniform(0.01, 0.03)
        else:
            slopes, bases, weights, own = {LEVEL: slope}, {LEVEL: base}, None, 0.0
        configs: list[dict | None] = [None]
        per_level = {lv: {canonical(None): bases[lv]} for lv in slopes}
        for k in range(1, K_MAX + 1):
            cfg = ngram(k)
            configs.append(cfg)
            for lv in slopes:
                per_level[lv][canonical(cfg)] = (bases[lv] * step_cost(k, slopes[lv], jumps, proposer)
                                                 / (1.0 + sum(rates[:k])))
        truth = {key: (sum(weights[lv] * per_level[lv][key] for lv in slopes) if weights else per_level[LEVEL][key])
                 for key in per_level[next(iter(slopes))]}
        recorded: dict[str, list[Observation]] = {}
        for cfg in configs:
            key = canonical(cfg)
            sd = math.log1p(cv if cfg else cv_none)
            k = cfg["num_speculative_tokens"] if cfg else 0
            obs = []
            for _ in range(starts):
                f = math.exp(rng.gauss(0.0, sd))
                if rng.random() < 0.05:
                    f *= rng.uniform(1.2, 1.5)
                delta = None
                if cfg:
                    measured = [max(0.0, min(1.0, r + rng.gauss(0.0, 0.01))) for r in rates[:k]]
                    delta = {"per_position_rates": measured, "acceptance_length": 1.0 + sum(measured)}
                values = {lv: per_level[lv][key] * f * (math.exp(rng.gauss(0.0, own)) if weights else 1.0)
                          for lv in slopes}
                o = Observation(config=cfg, levels={lv: LevelObs(v, delta) for lv, v in values.items()}, delta=delta)
                if weights:  # the study's own objective of the start (Observation.objective)
                    o.levels[OBJECTIVE] = LevelObs(o.objective(weights), delta)
                obs.append(o)
            recorded[key] = obs
        prior = (cv * rng.uniform(0.5, 2.0), 20)  # the spec's start_noise: right within a factor of two
        grids.append(Grid(name=f"gen{'-profile' if profile else ''}/{family}/{i}", source=f"grid_gen seed {seed}",
                          configs=configs, starts=recorded, level=OBJECTIVE if weights else LEVEL, truth=truth,
                          noise_prior=prior, weights=weights))
    return grids


def best_k(grid) -> int:
    """The grid's best configuration's K (0: no speculation)."""
    cfg = grid.starts[grid.best_key][0].config
    return cfg["num_speculative_tokens"] if cfg else 0


def score(grid, seeds: int, budget: int, strategies=STRATEGIES) -> dict:
    """Per strategy, over ``seeds`` draws: the pick within 3% of the grid's best, within 3% or
    indistinguishable from it at the grid's resolution (``indistinguishable``), its regret, and the
    starts spent; random order and TPE pick the best of their first ``budget`` starts, ours its own
    pick (it may stop earlier)."""
    import search

    out = {}
    search.OURS["budget"], before = budget, search.OURS["budget"]
    try:
        for name in strategies:
            out[name] = _score_one(search, grid, name, seeds, budget)
    finally:
        search.OURS["budget"] = before
    return out


def _means(grid, key: str, n: int) -> list[float]:
    """Every mean of ``n`` starts of ``key`` drawn as the search draws them (one of its recorded
    starts each, with replacement), sorted: each combination once, so the shares are exact."""
    vals = [o.levels[grid.level].value for o in grid.starts[key]]
    return sorted(sum(c) / n for c in itertools.product(vals, repeat=n))


def p_lower(grid, key: str, than: str, each: int) -> float:
    """The chance that ``each`` starts of ``key`` have a lower mean than ``each`` of ``than``."""
    a, b = _means(grid, than, each), _means(grid, key, each)
    return sum(bisect.bisect_left(b, x) for x in a) / (len(a) * len(b))


def indistinguishable(grid, pick: str, budget: int, cache: dict | None = None) -> bool:
    """The pick is within 3% of the grid's best, or the grid's noise cannot tell it from the best
    with ``budget // 2`` starts each (see the module docstring)."""
    if grid.ok(pick):
        return True
    cache = {} if cache is None else cache
    if pick not in cache:
        cache[pick] = p_lower(grid, pick, grid.best_key, max(budget // 2, 1)) >= INDISTINGUISHABLE
    return cache[pick]


def pair_ceiling(grid, budget: int) -> float:
    """How often a search told the best and its nearest rival beyond 3%, ``budget // 2`` starts
    each, picks within 3% (the lower mean; every configuration within 3%: 1)."""
    slower = [k for k in grid.truth if not grid.ok(k)]
    if not slower:
        return 1.0
    return 1.0 - p_lower(grid, min(slower, key=grid.truth.get), grid.best_key, max(budget // 2, 1))


def _score_one(search, grid, name: str, seeds: int, budget: int) -> dict:
    """One strategy's picks on ``grid`` over ``seeds`` draws."""
    ok, tied, regret, used = [], [], [], []
    cache: dict = {}
    for s in range(seeds):
        rng = random.Random(f"{grid.name}-{name}-{s}")
        if name == "ours":
            tr = search.run_ours(grid, rng)
            pick = tr.pick or tr.incumbent(len(tr.keys))
            n = len(tr.keys)
        else:
            tr = search.run_random(grid, rng) if name == "random" else search.run_tpe(grid, rng, seed=s)
            n = min(budget, len(tr.keys))
            pick = tr.incumbent(n)
        ok.append(grid.ok(pick))
        tied.append(indistinguishable(grid, pick, budget, cache))
        regret.append(grid.excess(pick))
        used.append(n)
    return {"within_3pct": statistics.mean(ok), "indistinguishable": statistics.mean(tied),
            "regret_mean": statistics.mean(regret), "regret_max": max(regret), "starts": statistics.mean(used)}


def main(argv=None) -> int:
    import search

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grids", type=int, default=500)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=search.GPU_BUDGET, help="server starts the search is given")
    ap.add_argument("--repeats", action="store_true", help="ours with objective.search_repeats on")
    ap.add_argument("--nominee", choices=("on", "off"), help="ours with objective.nominee on or off (default: the "
                                                             "spec's default)")
    ap.add_argument("--profile", action="store_true", help="grids of two levels scored on the traffic-weighted "
                                                           "objective (generate(profile=True))")
    ap.add_argument("--spec", help="a study spec: the search gets the starts its budget leaves after the "
                                   "confirmation's reserve (_budget.plan), instead of --budget")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--no-docs", action="store_true", help="do not touch docs/figures/search.md")
    ap.add_argument("--no-rows", action="store_true", help="the results file holds the per-family figures only, "
                                                           "not each grid's row (a small file)")
    ap.add_argument("--strategies", default=",".join(STRATEGIES),
                    help="comma-separated, of %(default)s (TPE is the slow one); the docs only with all three")
    args = ap.parse_args(argv)
    strategies = tuple(x for x in args.strategies.split(",") if x)
    search.OURS["repeats"] = True if args.repeats else None
    if args.nominee:
        search.OURS["nominee"] = args.nominee == "on"
    if args.spec:
        from autotune.core._spec import load_spec
        from autotune.search._budget import plan

        spec = load_spec(args.spec)
        args.budget = plan(spec, spec.space.methods)["search"]
    if set(strategies) - set(STRATEGIES):
        ap.error(f"--strategies: of {', '.join(STRATEGIES)}")
    t0 = time.monotonic()
    rows = []
    for g in generate(args.grids, args.seed, profile=args.profile):
        rows.append({"grid": g.name, "family": g.name.split("/")[1], "best_k": best_k(g),
                     "within_3pct_of_best": sum(g.ok(k) for k in g.truth), "pair_ceiling": pair_ceiling(g, args.budget),
                     **score(g, args.seeds, args.budget, strategies)})
    by_family: dict[str, dict] = {}
    for fam in [*FAMILIES, "all"]:
        rs = [r for r in rows if fam == "all" or r["family"] == fam]
        if not rs:
            continue
        by_family[fam] = {"grids": len(rs),
                          "best_k": {str(k): sum(r["best_k"] == k for r in rs) for k in range(K_MAX + 1)},
                          "pair_ceiling": statistics.mean(r["pair_ceiling"] for r in rs),
                          **{s: {m: statistics.mean(r[s][m] for r in rs)
                                 for m in ("within_3pct", "indistinguishable", "regret_mean", "starts")}
                             for s in strategies}}
    command = (f"python benchmarks/grid_gen.py --grids {args.grids} --seeds {args.seeds} "
               + (f"--spec {args.spec}" if args.spec else f"--budget {args.budget}") + f" --seed {args.seed}"
               + (" --profile" if args.profile else "") + (" --repeats" if args.repeats else "")
               + (f" --nominee {args.nominee}" if args.nominee else ""))
    if strategies != STRATEGIES:
        command += f" --strategies {','.join(strategies)}"
    print(f"{len(rows)} generated grids x {args.seeds} seeds, {args.budget} starts ({time.monotonic() - t0:.0f} s)")
    text = table(by_family, args.budget)
    print(text)
    Path(args.out).write_text(json.dumps({"command": command, "by_family": by_family,
                                          **({} if args.no_rows else {"rows": rows})}, indent=1) + "\n")
    print(f"wrote {args.out}")
    if not args.no_docs and strategies == STRATEGIES:
        write_docs(text, command, args)
    return 0


def table(by_family: dict, budget: int) -> str:
    """Per family: within 3% / within 3% or indistinguishable, for each strategy scored."""
    names = [s for s in STRATEGIES if s in next(iter(by_family.values()))]
    heads = {"ours": "ours", "random": f"random order, {budget} starts", "tpe": f"TPE, {budget} starts"}
    lines = ["| family | grids | grids whose best is none, K=1 ... K=10 | "
             + " | ".join(f"{heads[s]}: within 3% / or indistinguishable" for s in names)
             + (" | ours: its starts | ours: mean regret" if "ours" in names else "")
             + f" | told the pair, {budget // 2} starts each |",
             "|---|---|---|" + "---|" * (len(names) + 2 * ("ours" in names) + 1)]
    for fam, d in by_family.items():
        ks = " ".join(str(d["best_k"][str(k)]) for k in range(K_MAX + 1))
        cells = [f"{d[s]['within_3pct']:.0%} / {d[s]['indistinguishable']:.0%}" for s in names]
        if "ours" in names:
            cells += [f"{d['ours']['starts']:.1f}", f"{d['ours']['regret_mean']:.1%}"]
        lines.append(f"| {fam} | {d['grids']} | {ks} | " + " | ".join(cells) + f" | {d['pair_ceiling']:.0%} |")
    return "\n".join(lines)


def write_docs(text: str, command: str, args) -> None:
    from _docs import replace_section

    body = f"""{SECTION}

The recorded grids have their best where the search's opening lands (the largest K, the acceptance
knee, no speculation), so they cannot show whether the search finds a best K inside the range.
`benchmarks/grid_gen.py` draws grids instead ({args.grids}, seed {args.seed}; the families and their
ranges in its docstring): acceptance per position geometric, with a knee, declining, or poor; a
verify step's cost growing with its tokens and jumping at kernel and CUDA-graph sizes; start-to-start
noise of 2-15% with host hiccups; the truth is the generating TPOT. Each grid is searched
{args.seeds} times with at most {args.budget} server starts: the study's search ("ours", its own stop
and runoff), random order and Optuna's TPE (each the best of its first {args.budget} starts). A pick
counts when its true TPOT is within {search_tolerance():.0%} of the grid's best; "or indistinguishable"
also counts a pick the grid's own noise cannot tell from the best at the budget (told to compare just
the two, {args.budget // 2} starts each drawn as the search draws them, the pick's mean is lower in at
least {INDISTINGUISHABLE:.0%} of the draws). "Told the pair" is how often such a told search, {args.budget // 2}
starts each of the best and its nearest rival beyond {search_tolerance():.0%}, picks within {search_tolerance():.0%}:
what the noise leaves of the within-{search_tolerance():.0%} figure (definitions in the module docstring).

    {command}

{text}
"""
    replace_section(DOCS, SECTION, body, "# Benchmarks\n")


def search_tolerance() -> float:
    import search

    return search.TOLERANCE


if __name__ == "__main__":
    sys.exit(main())
