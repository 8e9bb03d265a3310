"""A search of two server starts: what its second start could be, on the generated and the recorded grids.

A night whose budget leaves the search two starts (the baseline, then one speculative start) has no
search: its winner is the one speculative start. What should that start be? Four rules, each
judged by the pick's share within 3% of the grid's best / within 3% or indistinguishable at the
grid's own resolution (``grid_gen.indistinguishable`` on the generated grids, ``search.resolution``
on the recorded ones):

- ``kmax``: the search's opening, the method's largest K (its counters, which would predict every
  smaller K, go unused: no start follows);
- ``mid``: the K in the middle of the method's range (a prior with no data: nearest the best K
  wherever it lies, in the worst case);
- ``random``: a speculative configuration drawn at random (random order's second start; TPE's
  second start is its first random draw, the same rule);
- ``nominee``: the study's own path with ``objective.nominee`` on (``search.run_ours`` at two
  starts: the largest K, then ``_nominee.nominate``): the winner is the unmeasured configuration the
  predictor rates fastest among those more likely than not (``_nominee.P_NOMINEE``) faster than the
  best measured start, else the largest K.

Each rule's winner is then confirmed against no speculation on four fresh starts each (the GPU
night's rounds), as a study confirms its winner; the pick is the lower mean.

    python benchmarks/two_starts.py                 # 500 generated grids (seed 0) and every recorded grid;
                                                    # writes benchmarks/results/two-starts.json
    python benchmarks/two_starts.py --grids 100 --draws 20 --out /tmp/two.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import search  # noqa: E402
from autotune.search._observations import k_of  # noqa: E402
from autotune.search._space import NONE, canonical, label  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "two-starts.json"
RULES = ("kmax", "mid", "random", "nominee")
CONFIRM_ROUNDS = 4
"""Fresh starts each of the winner and no speculation (the GPU night's four rounds until 2026-12-07)."""


def second_start(grid, rule: str, rng: random.Random) -> str:
    """The key of the second start under ``rule`` (``nominee`` starts the largest K)."""
    cands = [c for c in grid.configs if c]
    if rule == "random":
        return canonical(rng.choice(cands))
    first = [c for c in cands if c["method"] == cands[0]["method"]]
    ks = sorted({k_of(c) for c in first})
    if rule == "mid":
        mid = (ks[0] + ks[-1]) / 2
        k = min(ks, key=lambda x: (abs(x - mid), -x))
    else:
        k = ks[-1]
    return canonical(next(c for c in first if k_of(c) == k))


def pick(grid, rule: str, rng: random.Random) -> str:
    """The decision of a two-start search under ``rule``: its winner (the speculative start, or the
    ``nominee``) against no speculation on ``CONFIRM_ROUNDS`` fresh starts each, as a study confirms
    its winner; the lower mean is the pick."""
    if rule == "nominee":  # the study's own search at two starts, and its nominee
        saved = dict(search.OURS)
        search.OURS.update(budget=2, nominee=True)
        try:
            tr = search.run_ours(grid, rng)
        finally:
            search.OURS.update(saved)
        winner = tr.nominee or next(k for k in tr.keys if k != NONE)
    else:
        winner = second_start(grid, rule, rng)
        grid.draw("none", rng), grid.draw(winner, rng)  # the two search starts

    def mean(k):
        return statistics.mean(grid.draw(k, rng).levels[grid.level].value for _ in range(CONFIRM_ROUNDS))
    return winner if mean(winner) < mean("none") else "none"


def score(grids, draws: int, group, tied) -> dict:
    """Per group and rule: (within 3%, or indistinguishable) shares of the picks."""
    out: dict = {}
    for g in grids:
        for rule in RULES:
            rng = random.Random(f"{g.name}-{rule}")
            picks = [pick(g, rule, rng) for _ in range(draws)]
            ok = statistics.mean(g.ok(p) for p in picks)
            ind = statistics.mean(tied(g, p) for p in picks)
            for grp in (group(g), "all"):
                out.setdefault(grp, {}).setdefault(rule, []).append((ok, ind))
    return {grp: {rule: (statistics.mean(x[0] for x in v), statistics.mean(x[1] for x in v), len(v))
                  for rule, v in rules.items()} for grp, rules in sorted(out.items(), key=lambda x: x[0] == "all")}


def table(title: str, figures: dict) -> str:
    lines = [f"| {title} | grids | " + " | ".join(RULES) + " |", "|---|---|" + "---|" * len(RULES)]
    for grp, rules in figures.items():
        n = next(iter(rules.values()))[2]
        lines.append(f"| {grp} | {n} | " + " | ".join(f"{rules[r][0]:.0%} / {rules[r][1]:.0%}" for r in RULES) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import grid_gen

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grids", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--draws", type=int, default=10, help="searches per grid and rule")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    gen = grid_gen.generate(args.grids, args.seed)
    caches: dict = {}

    def gen_tied(g, p):
        return grid_gen.indistinguishable(g, p, 2, caches.setdefault(g.name, {}))
    figures = score(gen, args.draws, lambda g: g.name.split("/")[1], gen_tied)
    order = [*grid_gen.FAMILIES, "all"]
    print(table("generated family", {f: figures[f] for f in order if f in figures}))
    recorded = search.load_all()
    res = {g.name: set((search.resolution(g) or {}).get("may_be_best") or {}) for g in recorded}

    def rec_tied(g, p):
        return g.ok(p) or label(g.starts[p][0].config) in res[g.name]
    rec = score(recorded, args.draws, lambda g: "GPU grids" if search.is_gpu(g) else "CPU grids", rec_tied)
    print()
    print(table("recorded", rec))

    def shares(figs):
        return {grp: {r: {"within_3pct": v[0], "indistinguishable": v[1], "grids": v[2]} for r, v in rules.items()}
                for grp, rules in figs.items()}
    Path(args.out).write_text(json.dumps({
        "command": f"python benchmarks/two_starts.py --grids {args.grids} --seed {args.seed} --draws {args.draws}",
        "confirm_rounds": CONFIRM_ROUNDS, "generated": shares({f: figures[f] for f in order if f in figures}),
        "recorded": shares(rec)}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
