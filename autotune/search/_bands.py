"""Per-batch-size bands: ``num_speculative_tokens_per_batch_size`` for a concurrency profile.

A deployment is not at one concurrency: at night 1-2 requests are in flight, at the peak 16.
Speculation pays at small batches (the step is memory-bound, verifying K more tokens is nearly
free) and can lose at large ones, so vLLM lets K depend on the batch size of each step:
``[[start, end, k], ...]``, inclusive ranges, the first starting at 1, k >= 0, every k <= K
(batch sizes in a gap or past the last range get the previous range's k).

This module:
- builds schedules from a choice of K per concurrency level (``schedule_for_levels``) and reads
  them like vLLM does (``k_at``);
- measures the levels of ``replay.mode: profile`` with a /metrics scrape around each level
  (``run_profile_scraped``), so each level has its own draft-token counters;
- verifies that a schedule took effect (``verify``): vLLM versions exist where a schedule
  silently does nothing (issue 51510), so the draft tokens per decode step at each level must
  follow the schedule's k, not the config's K; and compares the k=0 levels with the
  no-speculation baseline at the same level (enabling a schedule has its own cost in some
  versions, issue 49548);
- derives the levels and their traffic weights from the replay set's arrival times
  (``levels_from_traffic``) when the spec does not set them.
"""

from __future__ import annotations

import math
from typing import Sequence

from autotune.engines import _metrics
from autotune.replay import _replay
from autotune.replay._profile import ProfileRun

BANDS_KEY = "num_speculative_tokens_per_batch_size"


# --------------------------------------------------------------------------- schedules


def validate(schedule: Sequence[Sequence[int]], k_max: int) -> list[list[int]]:
    """vLLM's rules, checked before a server start is spent on them; normalized (sorted)."""
    if not schedule:
        raise ValueError("a band schedule needs at least one [start, end, k] range")
    out = []
    for entry in schedule:
        if len(entry) != 3:
            raise ValueError(f"band {entry!r}: expected [start, end, k]")
        a, b, k = (int(x) for x in entry)
        if a < 1 or b < a:
            raise ValueError(f"band {entry!r}: need 1 <= start <= end")
        if not 0 <= k <= k_max:
            raise ValueError(f"band {entry!r}: k must be in 0..{k_max} (num_speculative_tokens)")
        out.append([a, b, k])
    out.sort()
    if out[0][0] != 1:
        raise ValueError("the first band must start at batch size 1")
    for prev, cur in zip(out, out[1:]):
        if cur[0] <= prev[1]:
            raise ValueError(f"bands {prev} and {cur} overlap")
    return out


def k_at(schedule: Sequence[Sequence[int]], batch: int, k_max: int) -> int:
    """K that vLLM uses for a step of ``batch`` requests (gaps and the tail carry the previous
    range's k forward; capped at num_speculative_tokens)."""
    k = None
    for a, b, kk in sorted((int(x), int(y), int(z)) for x, y, z in schedule):
        if a > batch:
            break
        k = kk
        if batch <= b:
            break
    return min(int(k if k is not None else 0), int(k_max))


def schedule_for_levels(choice: dict[int, int], max_batch: int) -> list[list[int]]:
    """Bands from a K per concurrency level: each level owns the batch sizes up to the geometric
    mean with the next level (batch sizes dip below the level as requests finish), adjacent
    bands with the same k merge, the last runs to ``max_batch``."""
    levels = sorted(choice)
    bands: list[list[int]] = []
    start = 1
    for i, L in enumerate(levels):
        end = max_batch if i == len(levels) - 1 else max(L, int(math.floor(math.sqrt(L * levels[i + 1]))))
        end = max(min(end, max_batch), start)
        if bands and bands[-1][2] == choice[L]:
            bands[-1][1] = end
        else:
            bands.append([start, end, int(choice[L])])
        start = end + 1
        if start > max_batch:
            break
    return bands


def apply(config: dict | None, schedule) -> dict | None:
    """A config with a band schedule added (K raised to the schedule's largest k if needed)."""
    if not config or not schedule:
        return config
    sched = [list(map(int, b)) for b in schedule]
    k = max(int(config.get("num_speculative_tokens", 1)), max(b[2] for b in sched), 1)
    return {**config, "num_speculative_tokens": k, BANDS_KEY: sched}


# --------------------------------------------------------------------------- measuring levels


async def run_profile_scraped(client, base_url: str, model: str, pool, levels: Sequence[int],
                              timeout_s: float = 300.0, reserve: Sequence | None = None,
                              min_in_window: int | None = None, min_window_tokens: int | None = None,
                              windows: Sequence[Sequence] = ()):
    """``_replay.run_profile`` one level at a time, with a /metrics scrape before and after each
    level (the loop drains between levels, so each delta is that level's). Returns
    ``(runs, deltas)``: level -> ReplayRun, level -> SpecDelta dict (with ``requests``: warm-up
    and measured requests of the level, which the counters include).

    ``reserve``: further requests a level draws, in order and each once, while its steady window
    holds fewer than ``min_in_window`` (default twice the level) requests or ``min_window_tokens``
    tokens (``_replay.WindowTarget``).

    ``windows``: further pools (``replay.windows``), each split like ``pool``; a level measures its
    window on every pool in turn before the next level, so its delta covers all of them, and its
    run pools them (``_replay.merge_windows``)."""
    levels = list(levels)
    pools = [list(pool), *(list(p) for p in windows)]
    n = (len(pool) - sum(levels)) // len(levels)
    if n < 1 or any(len(p) != len(pool) for p in pools):
        raise ValueError(f"a profile of levels {levels} needs {sum(levels)} warm-up + {len(levels)} x 1 "
                         f"measured requests per window, {[len(p) for p in pools]} given")
    runs, deltas, pos = {}, {}, 0
    spare_reqs = list(reserve or [])
    for lv in levels:
        target = _replay.WindowTarget.for_level(lv, min_in_window, min_window_tokens)
        before = await _metrics.scrape(client, base_url)
        got, sent = [], 0
        for p in pools:
            chunk = p[pos:pos + lv + n]
            out = await _replay.run_profile(base_url, model, chunk, levels=[lv], per_level=n,
                                            warmup_per_level=lv, timeout_s=timeout_s, window=target,
                                            reserve=spare_reqs)
            got.append(out[lv])
            sent += len(chunk) + out[lv].drawn
        after = await _metrics.scrape(client, base_url)
        pos += lv + n
        runs[lv] = _replay.merge_windows(got)
        d = _metrics.delta(before, after)
        bad = _metrics.nonsense(d)
        if bad:  # measure() fails the trial with it
            raise ValueError(f"the engine's /metrics cannot be true at level {lv}: {bad}")
        deltas[lv] = {**d.to_dict(), "requests": sent}
    return runs, deltas


def scraped_profile_run(runs: dict, weights: dict, deltas: dict, min_in_window: int | None = None,
                        min_window_tokens: int | None = None):
    """A ``_profile.ProfileRun`` whose ``level_details`` carry each level's ``spec_delta``."""
    class ScrapedProfileRun(ProfileRun):
        def level_details(self, tpot, statistic: str = "median") -> dict[str, dict]:
            out = super().level_details(tpot, statistic)
            for lv, d in deltas.items():
                if str(lv) in out:
                    out[str(lv)]["spec_delta"] = d
            return out

    return ScrapedProfileRun(runs, weights, min_in_window, min_window_tokens)


# --------------------------------------------------------------------------- verification


def _steps(d: dict) -> float | None:
    g, a = d.get("generated_tokens"), d.get("accepted_tokens")
    if not g or a is None:
        return None
    s = float(g) - float(d.get("requests") or 0) - float(a)
    return s if s > 0 else None


SOLO_BATCH = 1.25
"""A level whose decode steps average fewer running requests than this ran at batch 1 for the
schedule's purpose (a band of batch 2 and up applied to at most a quarter of its steps)."""


def verify(config: dict, levels: dict, baseline_levels: dict | None = None) -> dict:
    """Did the schedule take effect? Per level: the schedule's k, draft tokens per decode step
    (``draft_tokens / steps``); where the schedule's k is below K, that figure must sit nearer
    ``c * k`` than ``c * K`` (``c``: drafted steps per decode step, from the level with the
    largest k). k=0 levels are compared with the baseline's TPOT at the same level. A level
    that ran at a mean batch below ``SOLO_BATCH`` (decode steps of the requests over the engine's
    steps) where batch 1 drafts K gets no verdict: it would draft K whether or not the schedule
    took effect.

    ``levels``: ``Measurement.levels`` (per level ``spec_delta`` and ``tpot``);
    ``baseline_levels``: the same of a no-speculation start. Returns a JSON-able dict with
    ``took_effect`` (True, False, or None when the counters cannot tell) and ``reason``.
    """
    sched = config.get(BANDS_KEY) or []
    K = int(config.get("num_speculative_tokens", 0))
    per: dict[str, dict] = {}
    for name, d in sorted(levels.items(), key=lambda x: int(x[0])):
        L = int(name)
        k = k_at(sched, L, K) if sched else K
        sd = d.get("spec_delta") or {}
        steps = _steps(sd)
        row = {"level": L, "k": k, "tpot_ms": d.get("tpot"), "drafts": sd.get("drafts"),
               "draft_tokens": sd.get("draft_tokens"), "decode_steps": steps,
               "draft_tokens_per_step": (sd.get("draft_tokens") or 0.0) / steps if steps else None,
               "drafted_fraction": (sd.get("drafts") or 0.0) / steps if steps else None,
               "mean_batch": steps / sd["iterations"] if steps and sd.get("iterations") else None}
        base = (baseline_levels or {}).get(name) or {}
        if k == 0 and base.get("tpot") and d.get("tpot"):
            row["k0_vs_no_speculation"] = d["tpot"] / base["tpot"]
        per[name] = row
    known = [r for r in per.values() if r["draft_tokens_per_step"] is not None]
    out: dict = {"schedule": sched, "num_speculative_tokens": K, "levels": per}
    k0 = [r["k0_vs_no_speculation"] for r in per.values() if "k0_vs_no_speculation" in r]
    if k0:
        out["k0_vs_no_speculation"] = sum(k0) / len(k0)
    low = [r for r in known if r["k"] < K]
    top = max((r for r in known if r["k"] > 0), key=lambda r: r["k"], default=None)
    if not low:
        out.update(took_effect=None, reason="no measured level runs below K: nothing to verify")
        return out
    if top is None or not top["draft_tokens_per_step"]:
        if all((r["draft_tokens_per_step"] or 0) == 0 for r in low):
            out.update(took_effect=None, reason="no level drafted at all: the counters cannot tell")
        else:
            out.update(took_effect=True, reason="drafting follows the schedule")
        return out
    c = top["draft_tokens_per_step"] / top["k"]
    bad = [r for r in low if abs(r["draft_tokens_per_step"] - c * r["k"]) >= abs(r["draft_tokens_per_step"] - c * K)]
    # a level the server ran at batch 1 (a client that could not keep the level's requests in
    # flight) drafts what batch 1's band says wherever the schedule took effect: no verdict
    solo = [r for r in bad if r["mean_batch"] is not None and r["mean_batch"] < SOLO_BATCH
            and k_at(sched, 1, K) == K]
    if solo and len(solo) == len(bad):
        r = solo[0]
        out.update(took_effect=None, reason=(
            f"level {r['level']} ran at a mean batch of {r['mean_batch']:.2f}, where the schedule drafts K={K} "
            f"as at batch 1: its drafting cannot tell whether the schedule took effect"))
    elif bad:
        r = next(r for r in bad if r not in solo)
        out.update(took_effect=False, reason=(
            f"level {r['level']} drafted {r['draft_tokens_per_step']:.2f} tokens per step, as with K={K}, "
            f"not the schedule's k={r['k']} (expected about {c * r['k']:.2f}): the schedule did not take effect"))
    else:
        out.update(took_effect=True, reason="; ".join(
            f"level {r['level']}: k={r['k']}, {r['draft_tokens_per_step']:.2f} draft tokens/step"
            for r in per.values() if r["draft_tokens_per_step"] is not None))
    return out


def check_trial(trial, m, baseline_levels: dict | None) -> None:
    """Inside the objective: record the verification of a band trial, and make a schedule that
    did not take effect infeasible (``bands_effective`` constraint), so it is never recommended
    as if it did."""
    cfg = m.config or {}
    if not cfg.get(BANDS_KEY) or not m.levels:
        return
    check = verify(cfg, m.levels, baseline_levels)
    trial.set_user_attr("bands_check", check)
    trial.set_constraint("bands_effective", 1.0 if check.get("took_effect") is False else 0.0)


# --------------------------------------------------------------------------- traffic profile


def levels_from_traffic(requests, tpot_ms: float, max_levels: int = 3, ttft_ms: float = 0.0,
                        max_batch: int | None = None, min_share: float = 0.05) -> tuple[list[int], list[float]]:
    """Concurrency levels and their traffic weights from arrival times (``ts``) and the decode
    time each request would take (``max_tokens * tpot_ms``).

    The in-flight count over time is weighted by tokens (n requests in flight produce n tokens
    per step), binned by powers of two (1, 2, 3-4, 5-8, ...); each bin's level is its
    token-weighted median count, bins under ``min_share`` of the tokens are dropped, and the
    adjacent bins with the smallest joint share merge until at most ``max_levels`` remain.
    Returns (levels, weights), the weights summing to 1."""
    ev = []
    for r in requests:
        if r.ts is None:
            continue
        n = int(r.body.get("max_tokens") or r.body.get("max_completion_tokens") or 16)
        dur = (ttft_ms + n * tpot_ms) / 1000.0
        ev += [(float(r.ts), 1), (float(r.ts) + dur, -1)]
    if not ev:
        raise ValueError("the replay set has no arrival times (ts): set replay.levels in the spec")
    ev.sort()
    share: dict[int, float] = {}
    cur, t_prev = 0, ev[0][0]
    for t, d in ev:
        if cur > 0 and t > t_prev:
            c = min(cur, max_batch) if max_batch else cur
            share[c] = share.get(c, 0.0) + (t - t_prev) * c
        cur += d
        t_prev = t
    total = sum(share.values())
    if total <= 0:
        return [1], [1.0]
    bins: dict[int, dict[int, float]] = {}
    for n, w in share.items():
        bins.setdefault(math.ceil(math.log2(n)) if n > 1 else 0, {})[n] = w / total
    groups = [bins[b] for b in sorted(bins) if sum(bins[b].values()) >= min_share] or [bins[max(bins)]]
    while len(groups) > max_levels:
        i = min(range(len(groups) - 1), key=lambda j: sum(groups[j].values()) + sum(groups[j + 1].values()))
        groups[i:i + 2] = [{**groups[i], **groups[i + 1]}]
    levels, weights = [], []
    for g in groups:
        half, acc = sum(g.values()) / 2, 0.0
        for n in sorted(g):
            acc += g[n]
            if acc >= half:
                levels.append(n)
                break
        weights.append(sum(g.values()))
    s = sum(weights)
    return levels, [w / s for w in weights]
