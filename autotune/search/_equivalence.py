"""Greedy equivalence judged against the engine's own numerics: a near-tie flip is not a wrong output.

Speculative decoding is lossless up to floating point: with speculation a greedy token comes out
of a verify pass over K+1 positions, without it out of a one-token decode step, and in bfloat16
the two paths round differently. Where the baseline's best two tokens are nearly tied, the two
paths may pick different ones, and from there on the outputs differ although neither is wrong.
On one H100 (CUDA vLLM 0.25.0, SmolLM2-135M) every ngram and suffix start, any K, matched the
baseline on 11 of 16 greedy outputs, the same 5 each time: exact match blocked every candidate.

So a candidate's output is judged where it first leaves the baseline's. The baseline's greedy
replays ask for their top log-probabilities (``replay._logprobs``); at that token the baseline's
margin between its own token and the candidate's is read (``gap``, in nats). A divergence is a
*near-tie* when the margin is within the tolerance the engine's numerics justify, and a real
difference otherwise, or when the candidate's token is not among the baseline's top tokens.
Equivalent outputs are the identical ones and the near-ties.

The tolerance is measured in the baseline's own start (``engine_noise``): the same greedy requests
are replayed a second time in another batching (concurrently when the first replay was one at a
time), a different kernel path of the same engine, no speculation involved. Along the tokens both
replays share, the margin between the best and the second-best token moves by ``shift``; where the
two replays part, the first one's margin is a flip that numerics alone made. The tolerance is
``NEAR_TIE_FACTOR`` times the largest of these, at most ``NEAR_TIE_CAP``: the verify pass is a
third path whose rounding the batched one stands for only roughly. A batch-invariant engine
(vLLM on CPU) computes both replays alike: the tolerance is 0, the rule exact match.
"""

from __future__ import annotations

NEAR_TIE_FACTOR = 2.0
"""The tolerance is this many times the largest margin shift measured between two baseline replays."""
NEAR_TIE_CAP = 1.0
"""...and never more than this many nats (e^1: the baseline preferred its token 2.7 to 1), so an
engine whose own replays disagree widely cannot open the guard to a lossy configuration."""
BAND = 4.0
"""Alternatives the reference keeps per position: those within this many nats of the chosen token
(beyond it a divergence is a real difference whatever the tolerance), so a reference stays small."""
SHOWN = 12
"""Divergences listed in a trial's record (the counts cover all)."""


def reference(rows: list[list] | None) -> list[list] | None:
    """The baseline's log-probabilities of one output, kept for judging divergences: per generated
    token ``[token, [[alternative, gap], ...]]``, alternatives within ``BAND`` nats, nearest first."""
    if not rows:
        return None
    out = []
    for tok, lp, top in rows:
        alts = [[t, round(lp - alp, 5)] for t, alp in top if t != tok and lp - alp <= BAND]
        out.append([tok, sorted(alts, key=lambda a: a[1])])
    return out


def _runner_up(tok: str, lp: float, top: list[list]) -> tuple[str, float] | None:
    for t, alp in top:
        if t != tok:
            return t, lp - alp
    return None


def engine_noise(first: dict[str, list[list]], second: dict[str, list[list]]) -> dict | None:
    """How far two replays of the same greedy requests on one server, in different batchings,
    move the baseline's margins (``first``, ``second``: request id -> ``_logprobs`` rows).
    ``shift``: the largest change of the margin between the chosen and the second-best token
    along the shared tokens (``positions`` of them); ``flips``: where the replays parted, the
    first one's margin there (``flip_gaps``). None without two replays of a request."""
    shifts: list[float] = []
    flips: list[float] = []
    compared = 0
    for rid, a in first.items():
        b = second.get(rid)
        if not a or not b:
            continue
        compared += 1
        for (ta, la, topa), (tb, lb, topb) in zip(a, b):
            if ta != tb:
                ru = dict(topa).get(tb)
                flips.append(round(la - ru, 5) if ru is not None else float("inf"))
                break
            ra = _runner_up(ta, la, topa)
            if ra is None:
                continue
            rb = dict(topb).get(ra[0])
            if rb is not None:
                shifts.append(abs(ra[1] - (lb - rb)))
    if not compared:
        return None
    finite = [g for g in flips if g != float("inf")]
    return {"requests": compared, "positions": len(shifts), "shift": max(shifts, default=0.0),
            "shift_p99": sorted(shifts)[int(0.99 * (len(shifts) - 1))] if shifts else 0.0,
            "flips": len(flips), "flip_gaps": sorted(finite)[:SHOWN], "flip_gap_max": max(finite, default=0.0),
            "flips_outside_top": len(flips) - len(finite)}


def measured(noise: dict) -> float:
    """The largest margin move a baseline's two batchings showed: along shared tokens, or as a
    flip (the first replay's margin where they parted)."""
    return max(noise["shift"], noise.get("flip_gap_max", max(noise.get("flip_gaps") or [0.0])))


def tolerance(noise: dict | None, setting: float | str) -> dict:
    """The near-tie tolerance in nats and how it was set: ``setting`` is the spec's
    ``guards.equivalence_near_tie`` (a number of nats, or ``auto``: measured, ``engine_noise``)."""
    if setting != "auto":
        return {"nats": float(setting), "how": "set by guards.equivalence_near_tie"}
    if not noise:
        return {"nats": 0.0, "how": "auto: no second baseline replay to measure the engine's numerics (exact match)"}
    moved = measured(noise)
    nats = min(NEAR_TIE_CAP, NEAR_TIE_FACTOR * moved)
    how = (f"auto: {NEAR_TIE_FACTOR:g} x {moved:.3g} nats, the largest margin shift between two batchings of "
           f"the baseline ({noise['positions']} tokens, {noise['flips']} of {noise['requests']} outputs parted)")
    if nats < NEAR_TIE_FACTOR * moved:
        how += f", capped at {NEAR_TIE_CAP:g}"
    return {"nats": nats, "how": how}


def baseline_reference(measurements: list[dict], setting: float | str) -> tuple[dict, dict, dict, dict]:
    """The baseline's starts (their ``Measurement.to_attrs()``, in order) as one reference: output
    digests, texts and log-probabilities, each request's from the same start (a later start's
    replaces an earlier's), and the tolerance from the largest engine noise any start measured."""
    outputs: dict[str, str] = {}
    texts: dict[str, str] = {}
    refs: dict[str, list] = {}
    noises = []
    for m in measurements:
        outputs.update(m.get("outputs") or {})
        texts.update(m.get("texts") or {})
        for rid in m.get("outputs") or {}:
            refs.pop(rid, None)
        refs.update(m.get("logprobs") or {})
        if m.get("engine_noise"):
            noises.append(m["engine_noise"])
    noise = max(noises, key=measured, default=None)
    return outputs, texts, refs, tolerance(noise, setting)


def _token_at(ref: list[list], offset: int) -> tuple[int, int] | None:
    """(token index, its start offset) of the reference token holding character ``offset``."""
    start = 0
    for i, (tok, _) in enumerate(ref):
        tok = str(tok)
        if start + len(tok) > offset or (not tok and start == offset):
            return i, start
        start += len(tok)
    return None


def divergence(base: str, cand: str, ref: list[list] | None, tol: float, ids: list[int] | None = None) -> dict:
    """Where the candidate first leaves the baseline and the baseline's margin there. ``verdict``:
    ``near_tie`` (margin within ``tol``) or ``differs``, with ``why`` when no margin is known.
    With the candidate's token ``ids`` and a reference of token ids, the two are compared token by
    token; otherwise by text (``base``, ``cand``), the reference's tokens spelling ``base``."""
    if ref and ids is not None and all(isinstance(t, int) for t, _ in ref):
        return _divergence_ids(ref, ids, tol)
    offset = next((i for i, (x, y) in enumerate(zip(base, cand)) if x != y), min(len(base), len(cand)))
    out = {"offset": offset, "verdict": "differs"}
    if not ref:
        return {**out, "why": "the baseline has no log-probabilities for this request"}
    if "".join(str(t) for t, _ in ref) != base:
        return {**out, "why": "the baseline's tokens do not spell its text"}
    at = _token_at(ref, offset)
    if at is None:
        return {**out, "why": "the candidate runs past the baseline's tokens"}
    i, start = at
    tok, alts = ref[i]
    rest = cand[start:]
    # the token holds the first differing character, so ``rest`` does not begin with it
    # (an empty alternative is the end of the output: only a candidate that ended there took it)
    gaps = [(gap, alt) for alt, gap in alts if rest.startswith(alt) and (alt or not rest)]
    return _verdict({**out, "position": i, "token": tok}, gaps, rest[:max(len(tok), 1)], tol)


def _divergence_ids(ref: list[list], ids: list[int], tol: float) -> dict:
    base = [t for t, _ in ref]
    i = next((k for k, (x, y) in enumerate(zip(base, ids)) if x != y), min(len(base), len(ids)))
    out = {"position": i, "verdict": "differs"}
    if i == len(base):
        return {**out, "why": "the candidate runs past the baseline's tokens"}
    if i == len(ids):
        return {**out, "token": base[i], "why": "the candidate ended where the baseline went on"}
    tok, alts = ref[i]
    return _verdict({**out, "token": tok}, [(gap, alt) for alt, gap in alts if alt == ids[i]], ids[i], tol)


def _verdict(out: dict, gaps: list[tuple[float, object]], seen, tol: float) -> dict:
    if not gaps:
        return {**out, "candidate": seen, "why": f"not within {BAND:g} nats of the baseline's token"}
    gap, alt = min(gaps)
    return {**out, "candidate": alt, "gap": gap, "verdict": "near_tie" if gap <= tol else "differs"}


def judge(base_outputs: dict[str, str], base_texts: dict[str, str], refs: dict[str, list[list]],
          outputs: dict[str, str], texts: dict[str, str], tol: float,
          token_ids: dict[str, list[int]] | None = None) -> dict:
    """A candidate's greedy outputs against the baseline's: ``compared``, ``identical``,
    ``near_ties``, ``differs``, ``matched`` (identical + near-ties: equivalent), the tolerance,
    and the divergences (request, token position, the two tokens, the baseline's margin).
    ``token_ids``: the candidate's, where the engine returned them (``divergence``)."""
    token_ids = token_ids or {}
    compared = sorted(rid for rid in outputs if rid in base_outputs)
    identical = [rid for rid in compared if outputs[rid] == base_outputs[rid]]
    found = []
    for rid in compared:
        if outputs[rid] == base_outputs[rid]:
            continue
        if rid in token_ids or (rid in base_texts and rid in texts):
            d = divergence(base_texts.get(rid, ""), texts.get(rid, ""), refs.get(rid), tol, token_ids.get(rid))
        else:
            d = {"verdict": "differs", "why": "no text kept to locate the divergence"}
        found.append({"request": rid, **d})
    near = [d for d in found if d["verdict"] == "near_tie"]
    gaps = sorted(d["gap"] for d in found if "gap" in d)
    return {"compared": len(compared), "identical": len(identical), "near_ties": len(near),
            "differs": len(found) - len(near), "matched": len(identical) + len(near), "tolerance": tol,
            **({"gaps": [round(g, 4) for g in gaps]} if gaps else {}),
            "divergences": sorted(found, key=lambda d: d["verdict"] == "near_tie")[:SHOWN]}

