"""Concurrency profiles: one trial measured at several concurrency levels, one objective.

A deployment's traffic is not at one concurrency: nights run at 1-2 requests in flight, peaks
at 16. ``replay.mode: profile`` measures every level of ``replay.levels`` in one server start
(see ``_replay.run_profile``) and this module combines the per-level measurements, weighted by
``replay.level_weights`` (the share of production traffic at each level; equal by default).

How the levels are combined. **The objective** (a trial's value, the decision's speedup and its
interval) is the traffic-weighted per-level statistic, ``sum_l w_l * statistic(level l)``
(``_measure.weighted_statistic``, ``bootstrap_weighted_ratio_ci``): levels far apart (1.9 ms per
token at one request in flight, 5.3 ms at 32, on an H200) put the median of their mixture
anywhere in the gap between them, and its bootstrap interval across the gap (0.51-1.26 for a
config 1.13x faster at one level and 1.53x slower at the other), while each level's own
statistic is stable.

**The per-request list** (``Measurement.tpot_ms``) is the levels' TPOTs pooled with weights, a
stratified mixture: each level contributes ``round(w_l * N)`` entries (largest remainder; ``N``
the requests measured in all levels' steady windows together), drawn by systematic resampling of
that level's TPOTs sorted ascending (the values at the evenly spaced quantile positions
``(i + 0.5) / m_l``), so each entry is a real request's TPOT with its workload tag and each
level's distribution keeps its shape at its weight. It is what production's requests experience
as a whole, so the per-tag breakdown, the percentiles a recommendation predicts and the canary
ranges read it.

A level with no measured request (all failed, or no steady window) gets no entries and the
other levels' weights are renormalized; its entry in ``levels`` says so.

A level whose steady window held fewer than ``min_in_window`` requests (default twice the level:
at 32 in flight with identical request lengths, a wave of 32 measured requests can leave 1-7
inside the window) or whose in-window requests generated fewer than ``min_window_tokens`` is
flagged: ``thin`` in its ``levels`` entry, its level in the summary's ``thin_levels``. Its
figures stay in the objective, flagged, for the study to report. (The replay first tries to
fill such a window from the replay set's reserve: ``_replay.WindowTarget``.)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from autotune.core._measure import STATISTICS, percentiles, summarize
from autotune.replay._replay import ReplayRun, RequestResult, WindowTarget

__all__ = ["apportion", "weighted_pool", "ProfileRun"]


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Split ``total`` into integers proportional to ``weights`` (largest remainder, ties to
    the earlier entry); zero weights get zero."""
    s = float(sum(weights))
    if total <= 0 or s <= 0:
        return [0] * len(weights)
    quotas = [total * w / s for w in weights]
    counts = [int(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[:total - sum(counts)]:
        counts[i] += 1
    return counts


def weighted_pool(per_level: dict[Any, list[tuple[float, Any]]], weights: dict[Any, float]
                  ) -> list[tuple[float, Any]]:
    """Pool ``(value, tag)`` lists of several levels into one list whose empirical distribution
    is the weighted mixture of the levels' (see the module docstring). Levels without values
    drop out and the others' weights are renormalized."""
    keys = [k for k in per_level if per_level[k] and weights.get(k, 0.0) > 0]
    total = sum(len(per_level[k]) for k in keys)
    counts = apportion(total, [weights[k] for k in keys])
    out: list[tuple[float, Any]] = []
    for k, m in zip(keys, counts):
        vals = sorted(per_level[k], key=lambda x: x[0])
        n = len(vals)
        out += [vals[min(n - 1, int((i + 0.5) * n / m))] for i in range(m)]
    return out


class ProfileRun:
    """The levels of one profile replay, shaped like a ReplayRun where ``_trial.measure`` reads
    one (``ok``, ``failed``, ``results``, ``summary``)."""

    def __init__(self, levels: dict[int, ReplayRun], weights: dict[int, float], min_in_window: int | None = None,
                 min_window_tokens: int | None = None):
        self.levels = levels
        self.min_in_window = min_in_window
        self.min_window_tokens = min_window_tokens
        w = {lv: float(weights.get(lv, 0.0)) for lv in levels}
        s = sum(w.values())
        self.weights = {lv: (v / s if s > 0 else 1.0 / len(w)) for lv, v in w.items()}

    @property
    def results(self) -> list[RequestResult]:
        return [r for run in self.levels.values() for r in run.results]

    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    def failed(self) -> list[RequestResult]:
        return [r for r in self.results if not r.ok]

    def minimum(self, level: int) -> int:
        """Fewest in-window requests a level needs: ``min_in_window``, else twice the level."""
        return WindowTarget.for_level(level, self.min_in_window).min_requests

    @staticmethod
    def window_tokens(run: ReplayRun) -> int:
        """Output tokens of the requests measured inside the level's steady window."""
        return sum(r.output_tokens or 0 for r in run.measured())

    def is_thin(self, level: int) -> bool:
        run = self.levels[level]
        return (len(run.measured()) < self.minimum(level)
                or self.window_tokens(run) < (self.min_window_tokens or 0))

    def thin_levels(self) -> list[int]:
        """Levels whose steady window held fewer requests than ``minimum(level)`` or fewer
        tokens than ``min_window_tokens``."""
        return [lv for lv in self.levels if self.is_thin(lv)]

    def _timed(self, run: ReplayRun, tpot: Callable[[RequestResult], tuple[float | None, str]]
               ) -> list[tuple[float, str | None]]:
        return [(v, r.tag) for r in run.measured() for v in [tpot(r)[0]] if v is not None]

    def weighted_tpots(self, tpot: Callable[[RequestResult], tuple[float | None, str]]
                       ) -> list[tuple[float, str | None]]:
        """The objective's per-request ``(TPOT, tag)`` list: the levels' in-window TPOTs
        (``tpot(result) -> (value, source)``) pooled with the weights."""
        return weighted_pool({lv: self._timed(run, tpot) for lv, run in self.levels.items()}, self.weights)

    def level_details(self, tpot: Callable[[RequestResult], tuple[float | None, str]],
                      statistic: str = "median") -> dict[str, dict]:
        """Per level (keyed by the level as a string, for JSON): weight, in-window TPOTs (the
        engine's where reported) and client-side TPOTs, tags, the level's summary."""
        out: dict[str, dict] = {}
        for lv, run in self.levels.items():
            timed = self._timed(run, tpot)
            d: dict[str, Any] = {
                "level": lv, "weight": self.weights[lv],
                "tpot_ms": [v for v, _ in timed], "tags": [t for _, t in timed],
                "client_tpot_ms": [r.tpot_ms for r in run.measured() if r.tpot_ms is not None],
                "tpot": summarize([v for v, _ in timed], statistic) if timed else None,
                "summary": run.summary(statistic),
            }
            n, need = len(run.measured()), self.minimum(lv)
            d["in_window"], d["min_in_window"] = n, need
            d["in_window_tokens"], d["drawn"] = self.window_tokens(run), run.drawn
            if self.min_window_tokens:
                d["min_window_tokens"] = self.min_window_tokens
            if self.is_thin(lv):
                d["thin"] = True
                d["note"] = (f"{n} request(s) ({d['in_window_tokens']} tokens) inside the steady window, fewer "
                             f"than {need}" + (f" requests or {self.min_window_tokens} tokens" if self.min_window_tokens
                                                else "") + ": few requests")
            if not timed:
                d["note"] = "no request measured inside the steady window: left out of the objective"
            out[str(lv)] = d
        return out

    def summary(self, statistic: str = "median") -> dict:
        """A ReplayRun-shaped summary of all levels (counts, latencies of every in-window
        request, acceptance), with the client-side TPOTs of the weighted mixture in ``tpot_ms``, the weighted per-level
        steady-window throughput in ``output_throughput_tok_s``, a stall when any level
        stalled, and each level's own summary under ``levels``."""
        if statistic not in STATISTICS:
            raise ValueError(f"unknown statistic {statistic!r}; expected one of {', '.join(STATISTICS)}")
        runs = list(self.levels.values())
        pooled = ReplayRun(results=self.results, concurrency=max(self.levels), steady_state=None,
                           wall_s=sum(r.wall_s for r in runs), mode="profile",
                           in_window=[i for r in runs for i in (r.in_window or [])])
        out = pooled.summary(statistic)
        per = {str(lv): run.summary(statistic) for lv, run in self.levels.items()}
        client = weighted_pool({lv: [(r.tpot_ms, r.tag) for r in run.measured() if r.tpot_ms is not None]
                                for lv, run in self.levels.items()}, self.weights)
        vals = [v for v, _ in client]
        if vals:
            out["tpot_ms"] = {"statistic": statistic, "value": summarize(vals, statistic), **percentiles(vals),
                              "mean": summarize(vals, "mean"), "n": len(vals), "weighted": True}
        tps = [(self.weights[lv], s["output_throughput_tok_s"]) for lv, s in zip(self.levels, per.values())
               if s["output_throughput_tok_s"] is not None]
        wsum = sum(w for w, _ in tps)
        out["output_throughput_tok_s"] = sum(w * t for w, t in tps) / wsum if wsum > 0 else None
        stalled = [lv for lv, s in per.items() if (s.get("stall") or {}).get("stalled")]
        if out.get("stall") is not None:
            out["stall"] = {"stalled": bool(stalled), "levels": stalled,
                            "reason": "; ".join(f"level {lv}: {per[lv]['stall'].get('reason')}" for lv in stalled)}
        out["levels"] = per
        out["thin_levels"] = {str(lv): {"in_window": len(self.levels[lv].measured()), "min_in_window": self.minimum(lv),
                                        "in_window_tokens": self.window_tokens(self.levels[lv])}
                              for lv in self.thin_levels()}
        out["level_weights"] = {str(k): v for k, v in self.weights.items()}
        out["max_in_flight"] = {str(lv): run.max_in_flight for lv, run in self.levels.items()}
        out["mean_in_flight"] = {str(lv): run.mean_in_flight for lv, run in self.levels.items()}
        return out
