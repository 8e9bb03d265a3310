"""Scrape vLLM's Prometheus /metrics and turn two scrapes into a speculation summary.

Why deltas: vLLM counters are cumulative since server start, and a trial's server
also served warm-up traffic, so a trial's acceptance statistics are the
difference of a scrape taken after the measured run and one taken before it.

Naming: ``prometheus_client``'s parser strips ``_total`` from a counter *family*
name but the *samples* keep it, so everything here is keyed by sample name
(``vllm:spec_decode_num_drafts_total``, ``..._seconds_sum``, ``..._seconds_count``).
``_created`` timestamps and histogram ``_bucket`` samples are dropped: they are
not additive and nothing here needs them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

__all__ = [
    "Snapshot",
    "SpecDelta",
    "parse_exposition",
    "scrape",
    "delta",
    "draft_reach",
    "DRAFTS",
    "DRAFT_TOKENS",
    "ACCEPTED_TOKENS",
    "ACCEPTED_PER_POS",
    "GENERATION_TOKENS",
    "PREEMPTIONS",
]

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
ITERATIONS = "vllm:iteration_tokens_total_count"
"""engine steps (the tokens-per-step histogram's observations): with the decode steps of the
requests, the mean batch a level actually ran at"""
# Histograms, newest name first (older vLLM releases used the second).
TPOT_HISTOGRAMS = ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds")
ITL_HISTOGRAMS = ("vllm:inter_token_latency_seconds",)


# Other engines' sample names for the common counters above (an engine module registers its
# own, e.g. ``llamacpp:spec_decode_num_drafts_total``): a Snapshot is keyed by the common names.
ALIASES: dict[str, str] = {}


@dataclass(frozen=True)
class Snapshot:
    """One scrape: samples summed over all label sets (engines, models, reasons).

    ``per_position`` keeps the ``position`` label of the per-position acceptance
    counter apart, because that breakdown is what predicts a smaller K.
    """

    values: dict[str, float] = field(default_factory=dict)
    per_position: dict[int, float] = field(default_factory=dict)

    def get(self, name: str, default: float | None = None) -> float | None:
        """Value of a sample, tolerating a counter exposed with or without ``_total``."""
        if name in self.values:
            return self.values[name]
        alt = name[: -len("_total")] if name.endswith("_total") else name + "_total"
        return self.values.get(alt, default)


def parse_exposition(text: str) -> Snapshot:
    """Parse a Prometheus text exposition into a Snapshot (see module docstring)."""
    return snapshot_of(text_string_to_metric_families(text))


def snapshot_of(families) -> Snapshot:
    """A Snapshot of already parsed metric families (a caller that also reads the buckets
    parses the text once)."""
    values: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for family in families:
        for s in family.samples:
            name = ALIASES.get(s.name, s.name)
            if name.endswith("_created") or name.endswith("_bucket"):
                continue
            v = float(s.value)
            if not math.isfinite(v):
                continue
            if "position" in s.labels and name.startswith(ACCEPTED_PER_POS[: -len("_total")]):
                try:
                    pos = int(s.labels["position"])
                except ValueError:
                    continue
                per_pos[pos] = per_pos.get(pos, 0.0) + v
            values[name] = values.get(name, 0.0) + v
    return Snapshot(values=values, per_position=per_pos)


async def scrape(client: httpx.AsyncClient | None, base_url: str, timeout_s: float = 10.0) -> Snapshot:
    """GET {base_url}/metrics and parse it; raises httpx errors (a failed scrape is not data).

    The scrape after a replay reuses the connection of the scrape before it, idle for the whole
    replay; vLLM's HTTP server (uvicorn) closes idle keep-alive connections after 5 s, and when
    that close crosses the reuse the request fails without a response. That one case is retried
    once on a fresh connection; a server that is really gone fails the retry too.
    """
    url = base_url.rstrip("/") + "/metrics"
    try:
        resp = await _get(client, url, timeout_s)
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
        if client is None:
            raise
        log.info("/metrics scrape on a kept-alive connection failed (%s: %s); retrying on a fresh one",
                 type(e).__name__, e)
        resp = await _get(None, url, timeout_s)
    resp.raise_for_status()
    return parse_exposition(resp.text)


async def _get(client: httpx.AsyncClient | None, url: str, timeout_s: float) -> httpx.Response:
    if client is None:
        async with httpx.AsyncClient(trust_env=False, timeout=timeout_s) as own:
            return await own.get(url)
    return await client.get(url, timeout=timeout_s)


@dataclass(frozen=True)
class SpecDelta:
    """What happened between two scrapes.

    Acceptance length counts the bonus token: 1 + accepted / drafts, i.e. tokens
    produced per target forward pass of a speculating request.
    """

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: list[float]
    generated_tokens: float
    preemptions: float
    server_tpot_ms_mean: float | None
    server_itl_ms_mean: float | None
    itl_count: float | None = None
    """ITL histogram observations: one per decode step of a request (drafted or not), so the
    decode steps; None when the server has no ITL histogram."""
    iterations: float | None = None
    """engine steps (``ITERATIONS``); None when the server does not report them."""

    @property
    def acceptance_length(self) -> float | None:
        if self.drafts <= 0:
            return None
        return 1.0 + self.accepted_tokens / self.drafts

    @property
    def per_position_rates(self) -> list[float]:
        if self.drafts <= 0:
            return [0.0 for _ in self.accepted_per_position] if self.accepted_per_position else []
        return [a / self.drafts for a in self.accepted_per_position]

    @property
    def acceptance_rate(self) -> float | None:
        if self.draft_tokens <= 0:
            return None
        return self.accepted_tokens / self.draft_tokens

    def acceptance_length_at(self, k: int) -> float | None:
        """Predicted acceptance length with only the first ``k`` draft positions.

        A token at position i is accepted only if all earlier ones were, so
        cutting K to k keeps exactly positions < k.  None when there were no
        drafts or k exceeds the positions measured (a larger K is not predictable).
        """
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        if self.drafts <= 0 or k > len(self.accepted_per_position):
            return None
        return 1.0 + sum(self.accepted_per_position[:k]) / self.drafts

    def to_dict(self) -> dict:
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "generated_tokens": self.generated_tokens,
            "preemptions": self.preemptions,
            "server_tpot_ms_mean": self.server_tpot_ms_mean,
            "server_itl_ms_mean": self.server_itl_ms_mean,
            "itl_count": self.itl_count,
            "iterations": self.iterations,
            "acceptance_length": self.acceptance_length,
            "acceptance_rate": self.acceptance_rate,
            "per_position_rates": self.per_position_rates,
        }


def _counter_delta(before: Snapshot, after: Snapshot, name: str) -> float:
    """after - before; a metric absent from a scrape counts as 0 (e.g. no speculation)."""
    return float(after.get(name, 0.0)) - float(before.get(name, 0.0))


def _histogram_mean_ms(before: Snapshot, after: Snapshot, names: tuple[str, ...]) -> float | None:
    for base in names:
        if after.get(base + "_count") is None:
            continue
        count = _counter_delta(before, after, base + "_count")
        total = _counter_delta(before, after, base + "_sum")
        return 1000.0 * total / count if count > 0 else None
    return None


def delta(before: Snapshot, after: Snapshot) -> SpecDelta:
    """Differences of the counters between two scrapes of the same server.

    Comparing scrapes of different server processes (counters reset) gives
    meaningless, possibly negative, numbers: the caller must not do that.
    """
    positions = set(before.per_position) | set(after.per_position)
    n_pos = max(positions) + 1 if positions else 0
    per_pos = [after.per_position.get(i, 0.0) - before.per_position.get(i, 0.0) for i in range(n_pos)]
    return SpecDelta(
        drafts=_counter_delta(before, after, DRAFTS),
        draft_tokens=_counter_delta(before, after, DRAFT_TOKENS),
        accepted_tokens=_counter_delta(before, after, ACCEPTED_TOKENS),
        accepted_per_position=per_pos,
        generated_tokens=_counter_delta(before, after, GENERATION_TOKENS),
        preemptions=_counter_delta(before, after, PREEMPTIONS),
        server_tpot_ms_mean=_histogram_mean_ms(before, after, TPOT_HISTOGRAMS),
        server_itl_ms_mean=_histogram_mean_ms(before, after, ITL_HISTOGRAMS),
        itl_count=(_counter_delta(before, after, ITL_HISTOGRAMS[0] + "_count")
                   if after.get(ITL_HISTOGRAMS[0] + "_count") is not None else None),
        iterations=_counter_delta(before, after, ITERATIONS) if after.get(ITERATIONS) is not None else None,
    )


def nonsense(d: SpecDelta) -> str | None:
    """What in a start's counter deltas cannot be true, or None: counters only grow over one
    server's life, no draft accepts more tokens than were drafted, and no position more often
    than there were drafts. An engine that reports otherwise (a negative, falling counter) gives
    a start no figure worth keeping: the caller fails that trial with this reason."""
    for name, v in (("spec_decode_num_drafts", d.drafts), ("spec_decode_num_draft_tokens", d.draft_tokens),
                    ("spec_decode_num_accepted_tokens", d.accepted_tokens), ("generation_tokens", d.generated_tokens),
                    ("num_preemptions", d.preemptions), ("inter-token latency count", d.itl_count or 0.0),
                    ("iteration_tokens count", d.iterations or 0.0)):
        if v < 0 or v != v:
            return f"vllm:{name} fell by {-v:g} during the start (a counter only grows)"
    for i, v in enumerate(d.accepted_per_position):
        if v < 0 or v > d.drafts:
            return (f"vllm:spec_decode_num_accepted_tokens_per_pos position {i} changed by {v:g} with "
                    f"{d.drafts:g} drafts")
    if d.accepted_tokens > d.draft_tokens:
        return f"{d.accepted_tokens:g} draft tokens accepted of {d.draft_tokens:g} drafted"
    return None


#: the accepted tokens the next position should have had before zero there counts as a cut
DRAFT_REACH_MIN_EXPECTED = 10.0


def draft_reach(accepted_per_position, drafts: float, k: int,
                min_expected: float = DRAFT_REACH_MIN_EXPECTED) -> dict | None:
    """Whether the drafts stopped short of ``k``: every position after some ``p < k`` accepted
    nothing although position ``p`` accepted enough that the next one should have (its accepted
    count times the conditional acceptance into ``p``, from ``p - 1``, at least ``min_expected``:
    a zero there has Poisson chance ``exp(-min_expected)``). Returns ``{"position", "k",
    "accepted", "expected_next"}`` (positions 1-based), else None. Why: vLLM 0.25's compile
    cache handed a GPU n-gram proposer for K=10 the kernel compiled for K=8, which drafts 8
    tokens into 10 slots; the start then measures K=8 under K=10's name, and nothing else in
    the figures says so. The counters cannot tell that from a drafter that never agrees past
    ``p`` (the tiny ``draft-p5`` misses every 5th token by construction): both are reported, and
    in both the positions past ``p`` bought nothing. Positions the scrape did not report count
    as zero."""
    acc = [float(a) for a in (accepted_per_position or [])][:k]
    if k < 2 or drafts <= 0 or not any(acc):
        return None
    acc += [0.0] * (k - len(acc))
    p = max(i for i, a in enumerate(acc) if a > 0) + 1  # last position that accepted anything, 1-based
    if p >= k:
        return None
    before = acc[p - 2] if p >= 2 else float(drafts)
    expected = acc[p - 1] * min(1.0, acc[p - 1] / before) if before > 0 else 0.0
    if expected < min_expected:
        return None
    return {"position": p, "k": k, "accepted": acc[p - 1], "expected_next": expected}
