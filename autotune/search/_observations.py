"""Measured server starts as plain data for the predictor (``Observation``), and the keys it groups
configurations by.

A study's trials (``observation_from_trial``) and a grid benchmark's rows (``observation_from_row``)
become the same ``Observation``, so the predictor and its policy run alike inside a study and in the
offline search benchmark (``benchmarks/search.py``). The speculative counters give the tokens per
decode step: vLLM counts drafts only for request-steps that carried draft tokens, so the
**coverage** ``c = drafts / decode steps`` (decode steps = generated - requests - accepted tokens)
says how often that happens (ngram and suffix often draft nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.core._measure import summarize
from autotune.search import _bands
from autotune.search._record import config_of, measurement_of, predicted_tpot_of
from autotune.search._space import canonical, extra_knobs

DRAFTERS = ("draft_model", "eagle", "eagle3", "mtp")
BANDS = _bands.BANDS_KEY


# --------------------------------------------------------------------------- configs


def k_of(config: dict | None) -> int:
    return int(config.get("num_speculative_tokens", 0)) if config else 0


def group_key(config: dict | None) -> str:
    """Method and knobs, without K or bands: configurations sharing acceptance per position."""
    if not config:
        return "none"
    return canonical({k: v for k, v in config.items() if k not in ("num_speculative_tokens", BANDS)})


def cost_key(config: dict | None) -> str:
    """What a decode step costs depends on the method, the drafter and an entry's knobs
    (adaptive verification, parallel drafting...), not on ngram windows."""
    if not config:
        return "none"
    m = config["method"]
    key = f"{m}:{config.get('model')}" if m in DRAFTERS or config.get("model") else m
    extra = extra_knobs(config)
    return f"{key}|{canonical(extra)}" if extra else key


def level_k(config: dict | None, level: int) -> int:
    """K used at batch size ``level``: the band schedule's (vLLM's lookup) or the config's K."""
    if not config:
        return 0
    if config.get(BANDS):
        return _bands.k_at(config[BANDS], level, k_of(config))
    return k_of(config)


# --------------------------------------------------------------------------- observations


@dataclass
class LevelObs:
    """One concurrency level of one server start."""

    value: float
    """the objective statistic of per-request TPOT at this level (ms)."""
    delta: dict | None = None
    """speculative counters of this level alone (``_metrics.SpecDelta.to_dict``), when scraped."""
    requests: int | None = None


@dataclass
class Observation:
    """One measured server start, as the predictor sees it."""

    config: dict | None
    levels: dict[int, LevelObs]
    delta: dict | None = None
    """counters of the whole measured run."""
    requests: int | None = None
    feasible: bool = True
    number: int | None = None
    predicted: float | None = None

    @property
    def key(self) -> str:
        return canonical(self.config)

    def objective(self, weights: dict[int, float]) -> float | None:
        """Traffic-weighted statistic over the levels (renormalized over the levels present)."""
        ws = {lv: w for lv, w in weights.items() if lv in self.levels and w > 0}
        if not ws:
            if len(self.levels) == 1:
                return next(iter(self.levels.values())).value
            return None
        s = sum(ws.values())
        return sum(w * self.levels[lv].value for lv, w in ws.items()) / s


def decode_steps(delta: dict | None, requests: int | None) -> float | None:
    """Request-steps of decoding: every generated token but each request's first (from the
    prefill) came from a step, and a step emits 1 + its accepted tokens."""
    if not delta:
        return None
    g, a = delta.get("generated_tokens"), delta.get("accepted_tokens")
    if not g or a is None:
        return None
    s = float(g) - float(requests or 0) - float(a)
    return s if s > 0 else None


def tokens_per_step(delta: dict | None, requests: int | None) -> float | None:
    s = decode_steps(delta, requests)
    if s is None:
        return None
    return (s + float(delta.get("accepted_tokens") or 0.0)) / s


def coverage_of(delta: dict | None, requests: int | None) -> float | None:
    s = decode_steps(delta, requests)
    if s is None or delta.get("drafts") is None:
        return None
    return min(1.0, float(delta["drafts"]) / s)


def observation_from_trial(t, default_level: int) -> Observation | None:
    """A completed Optuna trial (live or frozen) of ``_study.Study`` as an Observation."""
    m = measurement_of(t)
    value = t.value if getattr(t, "state", None) is None or t.state.name == "COMPLETE" else None
    if not m or value is None or not math.isfinite(value):
        return None
    summ = m.get("summary") or {}
    levels: dict[int, LevelObs] = {}
    for name, d in (m.get("levels") or {}).items():
        if d.get("tpot") is None:
            continue
        sd = d.get("spec_delta")
        levels[int(name)] = LevelObs(value=float(d["tpot"]), delta=sd,
                                     requests=(sd or {}).get("requests") or (d.get("summary") or {}).get("n"))
    if not levels:
        levels = {int(default_level): LevelObs(value=float(value), delta=m.get("spec_delta"), requests=summ.get("n"))}
    cons = getattr(t, "constraints", None) or {}
    feasible = all(c <= 0 for c in (cons.values() if isinstance(cons, dict) else cons))
    return Observation(config=m.get("config", config_of(t)), levels=levels,
                       delta=m.get("spec_delta"), requests=_profile_requests(m) or summ.get("n"),
                       feasible=feasible, number=t.number, predicted=predicted_tpot_of(t))


def _profile_requests(m: dict) -> int | None:
    lv = m.get("levels") or {}
    if not lv:
        return None
    return sum(int((d.get("spec_delta") or {}).get("requests") or (d.get("summary") or {}).get("n") or 0)
               for d in lv.values()) or None


def observation_from_row(row: dict, statistic: str = "median") -> Observation | None:
    """A row of ``benchmarks/grid.py`` (one server start) as an Observation."""
    if not row.get("ok") or not row.get("tpot_ms"):
        return None
    delta = dict(row.get("spec_delta") or {})
    if not delta and row.get("per_position_rates") is not None:
        delta = {"per_position_rates": row["per_position_rates"], "acceptance_length": row.get("acceptance_length")}
    conc = int(row.get("concurrency") or 1)
    n = row.get("requests")
    return Observation(config=row.get("config"), levels={conc: LevelObs(summarize(row["tpot_ms"], statistic),
                                                                        delta or None, n)},
                       delta=delta or None, requests=n)
