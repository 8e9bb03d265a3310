import asyncio
import json
from pathlib import Path

import httpx
import pytest

from autotune.engines._metrics import Snapshot, delta, parse_exposition, scrape
from autotune.replay._replay import replay
from autotune.traffic._replayset import ReplayRequest
from autotune.testing import MockServer

DATA = Path(__file__).parent / "data"
LAB = 'engine="0",model_name="m"'


def expo(drafts=None, draft_tokens=None, accepted=None, per_pos=None, gen=0.0, preempt=0.0,
         tpot=None, itl=None, tpot_name="vllm:request_time_per_output_token_seconds"):
    """Small exposition in vLLM's naming; spec metrics omitted when None."""
    lines = []

    def counter(name, v):
        lines.extend([f"# TYPE {name} counter", f"{name}{{{LAB}}} {v}", f"# TYPE {name[:-6]}_created gauge",
                      f"{name[:-6]}_created{{{LAB}}} 1.7e9"])

    if drafts is not None:
        counter("vllm:spec_decode_num_drafts_total", drafts)
        counter("vllm:spec_decode_num_draft_tokens_total", draft_tokens)
        counter("vllm:spec_decode_num_accepted_tokens_total", accepted)
        lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
        for i, v in enumerate(per_pos):
            lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{LAB},position="{i}"}} {v}')
    counter("vllm:generation_tokens_total", gen)
    counter("vllm:num_preemptions_total", preempt)
    for name, sc in ((tpot_name, tpot), ("vllm:inter_token_latency_seconds", itl)):
        if sc is not None:
            s, c = sc
            lines += [f"# TYPE {name} histogram", f'{name}_bucket{{{LAB},le="0.1"}} {c}',
                      f'{name}_bucket{{{LAB},le="+Inf"}} {c}', f"{name}_count{{{LAB}}} {c}",
                      f"{name}_sum{{{LAB}}} {s}"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- real capture


def test_parse_real_capture():
    snap = parse_exposition((DATA / "metrics_ngram.txt").read_text())
    v = snap.values
    # Samples keep _total even though the parser strips it from family names.
    assert v["vllm:spec_decode_num_drafts_total"] == 6.0
    assert v["vllm:spec_decode_num_draft_tokens_total"] == 24.0
    assert v["vllm:spec_decode_num_accepted_tokens_total"] == 24.0
    assert v["vllm:generation_tokens_total"] == 40.0
    assert v["vllm:request_success_total"] == 3.0  # summed over finished_reason labels
    assert v["vllm:request_time_per_output_token_seconds_count"] == 3.0
    assert not any(k.endswith("_created") or k.endswith("_bucket") for k in v)
    assert snap.per_position == {0: 6.0, 1: 6.0, 2: 6.0, 3: 6.0}
    assert snap.get("vllm:spec_decode_num_drafts") == 6.0  # lookup without _total too

    d = delta(Snapshot(), snap)
    assert (d.drafts, d.draft_tokens, d.accepted_tokens) == (6.0, 24.0, 24.0)
    assert d.accepted_per_position == [6.0, 6.0, 6.0, 6.0]
    assert d.acceptance_length == 5.0
    assert d.acceptance_rate == 1.0
    assert d.per_position_rates == [1.0, 1.0, 1.0, 1.0]
    assert d.acceptance_length_at(2) == 3.0
    assert d.acceptance_length_at(0) == 1.0
    assert d.acceptance_length_at(4) == 5.0
    assert d.acceptance_length_at(5) is None  # larger K than measured: not predictable
    with pytest.raises(ValueError):
        d.acceptance_length_at(-1)
    assert d.generated_tokens == 40.0
    assert d.preemptions == 0.0
    assert d.server_tpot_ms_mean == pytest.approx(1000 * 0.00989838894286203 / 3)
    assert d.server_itl_ms_mean == pytest.approx(1000 * 0.11017332100004751 / 13)
    out = d.to_dict()
    json.dumps(out)
    assert out["acceptance_length"] == 5.0 and out["per_position_rates"] == [1.0] * 4


# --------------------------------------------------------------------------- deltas


def test_delta_between_snapshots():
    a = parse_exposition(expo(10, 40, 20, [8, 6, 4, 2], gen=100, preempt=1, tpot=(0.5, 10), itl=(1.0, 100)))
    b = parse_exposition(expo(30, 120, 60, [20, 18, 14, 8], gen=300, preempt=3, tpot=(0.9, 18), itl=(1.4, 180)))
    d = delta(a, b)
    assert (d.drafts, d.draft_tokens, d.accepted_tokens) == (20, 80, 40)
    assert d.accepted_per_position == [12, 12, 10, 6]
    assert d.acceptance_length == pytest.approx(3.0)
    assert d.acceptance_rate == pytest.approx(0.5)
    assert d.per_position_rates == pytest.approx([0.6, 0.6, 0.5, 0.3])
    assert d.acceptance_length_at(1) == pytest.approx(1.6)
    assert d.acceptance_length_at(3) == pytest.approx(2.7)
    assert d.generated_tokens == 200 and d.preemptions == 2
    assert d.server_tpot_ms_mean == pytest.approx(50.0)  # 0.4 s / 8 requests
    assert d.server_itl_ms_mean == pytest.approx(5.0)    # 0.4 s / 80 intervals


def test_labels_summed_across_engines():
    text = ("# TYPE vllm:spec_decode_num_drafts_total counter\n"
            'vllm:spec_decode_num_drafts_total{engine="0"} 3\n'
            'vllm:spec_decode_num_drafts_total{engine="1"} 4\n'
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n"
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 2\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="0"} 1\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="1"} 1\n')
    snap = parse_exposition(text)
    assert snap.values["vllm:spec_decode_num_drafts_total"] == 7
    assert snap.per_position == {0: 3, 1: 1}


def test_no_speculation_server_gives_none():
    a = parse_exposition(expo(gen=10, tpot=(0.1, 1)))
    b = parse_exposition(expo(gen=50, tpot=(0.3, 3)))
    d = delta(a, b)
    assert d.drafts == 0 and d.accepted_per_position == []
    assert d.acceptance_length is None
    assert d.acceptance_rate is None
    assert d.acceptance_length_at(1) is None
    assert d.per_position_rates == []
    assert d.generated_tokens == 40
    assert d.server_itl_ms_mean is None  # histogram absent
    json.dumps(d.to_dict())


def test_empty_and_no_new_requests():
    d = delta(parse_exposition(""), parse_exposition(""))
    assert d.acceptance_length is None and d.server_tpot_ms_mean is None
    same = parse_exposition(expo(5, 20, 10, [5, 3, 2, 0], tpot=(0.1, 2)))
    d = delta(same, same)
    assert d.acceptance_length is None  # no drafts in between
    assert d.server_tpot_ms_mean is None  # no requests in between, not a division by zero


def test_old_tpot_histogram_name():
    a = parse_exposition(expo(tpot=(0.0, 0), tpot_name="vllm:time_per_output_token_seconds"))
    b = parse_exposition(expo(tpot=(0.2, 10), tpot_name="vllm:time_per_output_token_seconds"))
    assert delta(a, b).server_tpot_ms_mean == pytest.approx(20.0)


def test_counter_without_total_suffix():
    snap = parse_exposition("# TYPE vllm:generation_tokens counter\nvllm:generation_tokens 12\n")
    assert delta(Snapshot(), snap).generated_tokens == 12


# --------------------------------------------------------------------------- scrape


def test_scrape_static_text_and_own_client():
    text = (DATA / "metrics_ngram.txt").read_text()
    with MockServer(metrics_text=text) as m:
        snap = asyncio.run(scrape(None, m.base_url))
        assert snap.per_position == {0: 6.0, 1: 6.0, 2: 6.0, 3: 6.0}

        async def with_client():
            async with httpx.AsyncClient(trust_env=False) as c:
                return await scrape(c, m.base_url + "/")

        assert asyncio.run(with_client()).values == snap.values


def test_scrape_delta_around_replay():
    reqs = [ReplayRequest(id=f"r{i}", endpoint="completions", body={"prompt": "x", "max_tokens": 16})
            for i in range(6)]
    with MockServer(first_chunk_tokens=1, tokens_per_chunk=3, num_spec_tokens=4) as m:
        before = asyncio.run(scrape(None, m.base_url))
        run = replay(m.base_url, "m", reqs, concurrency=3, timeout_s=10)
        after = asyncio.run(scrape(None, m.base_url))
    assert len(run.ok()) == 6
    d = delta(before, after)
    # 16 tokens = 1 + 5 chunks of 3: 5 steps, 2 accepted of 4 drafts each.
    assert d.drafts == 30 and d.draft_tokens == 120 and d.accepted_tokens == 60
    assert d.accepted_per_position == [30, 30, 0, 0]
    assert d.acceptance_length == 3.0
    assert d.acceptance_length_at(1) == 2.0
    assert d.generated_tokens == 96
    assert d.server_tpot_ms_mean is not None
    # Client-side per-request stats agree with the server counters.
    assert run.summary()["spec"]["mean_acceptance_length"] == 3.0


def test_scrape_error_raises():
    with MockServer(metrics_text="") as m:
        bad = m.base_url + "/nope"
        with pytest.raises(httpx.HTTPStatusError):
            asyncio.run(scrape(None, bad))


def test_scrape_retries_once_when_a_kept_alive_connection_was_closed():
    """The server closed the idle connection as the client reused it: one retry on a fresh one."""
    text = (DATA / "metrics_ngram.txt").read_text()

    class Stale:
        calls = 0

        async def get(self, url, timeout=None):
            Stale.calls += 1
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")

    with MockServer(metrics_text=text) as m:
        snap = asyncio.run(scrape(Stale(), m.base_url))
        assert Stale.calls == 1 and snap.per_position == {0: 6.0, 1: 6.0, 2: 6.0, 3: 6.0}
    # a server that is gone fails the retry too: the error surfaces (the trial names the death)
    with pytest.raises(httpx.ConnectError):
        asyncio.run(scrape(Stale(), m.base_url))
    assert Stale.calls == 2


# --------------------------------------------------------------------------- draft reach

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def _h200_starts():
    """Every recorded H200 start of one K (no band schedule), whole and per level, with its
    file, config and per-position counters."""
    for f in sorted(RESULTS.glob("h200-points-*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line) if line.strip() else {}
            cfg = r.get("config") or {}
            if not cfg or cfg.get("num_speculative_tokens_per_batch_size"):
                continue
            parts = [r.get("spec_delta")] + [lv.get("spec_delta") for lv in (r.get("levels") or {}).values()]
            for d in filter(None, parts):
                yield f.name, r, cfg, d


def test_draft_reach_finds_the_starts_that_ran_another_ks_kernel_and_no_other():
    """On the H200 rows: vLLM 0.25's compile cache gave ngram_gpu K=9 and 10 (rounds 12 and 13)
    K=8's kernel, and those starts accepted nothing past position 8; the K=10 start with the cache
    off (round 14, "fresh-compile") accepted at 9 and 10. No other recorded start, of any method
    and K, is flagged."""
    from autotune.engines._metrics import draft_reach

    flagged, clean_k10 = [], []
    for name, r, cfg, d in _h200_starts():
        k = int(cfg["num_speculative_tokens"])
        got = draft_reach(d["accepted_per_position"], d["drafts"], k)
        stale = cfg["method"] == "ngram_gpu" and k > 8 and name.endswith(("r12.jsonl", "r13.jsonl"))
        assert bool(got) == stale, (name, cfg, d["accepted_per_position"], got)
        if got:
            assert got["position"] == 8 and got["k"] == k and got["expected_next"] > 100
            flagged.append(k)
        if r.get("label") == "fresh-compile":
            clean_k10.append(d["accepted_per_position"])
    assert sorted(set(flagged)) == [9, 10] and len(flagged) >= 9
    assert clean_k10 and all(p[8] > 0 and p[9] > 0 for p in clean_k10)


def test_draft_reach_lets_acceptance_that_dies_out_by_itself_be():
    from autotune.engines._metrics import draft_reach

    # few accepted near the end: zero after them is what the decay predicts
    assert draft_reach([100, 30, 8, 2, 0, 0], 400, 6) is None
    # the same start with a healthy count at position 3 and nothing after: cut
    cut = draft_reach([300, 250, 200, 0, 0, 0], 400, 6)
    assert cut == {"position": 3, "k": 6, "accepted": 200.0, "expected_next": 160.0}
    # positions the scrape did not report count as zero; a full K or no drafts is never cut
    assert draft_reach([300, 250, 200], 400, 6)["position"] == 3
    assert draft_reach([300, 250, 200], 400, 3) is None and draft_reach([0, 0], 0, 2) is None


def test_a_band_schedule_drafts_fewer_tokens_on_purpose():
    from autotune.engines._metrics import SpecDelta
    from autotune.search._bands import BANDS_KEY
    from autotune.search._trial import drafted_short

    d = SpecDelta(drafts=400, draft_tokens=3200, accepted_tokens=750, accepted_per_position=[300, 250, 200, 0, 0, 0, 0, 0],
                  generated_tokens=1000, preemptions=0, server_tpot_ms_mean=None, server_itl_ms_mean=None)
    cfg = {"method": "ngram", "num_speculative_tokens": 8}
    assert drafted_short(cfg, d)["position"] == 3
    assert drafted_short({**cfg, BANDS_KEY: [[1, 4, 3], [5, 32, 0]]}, d) is None
    assert drafted_short(None, d) is None


def test_counters_that_fall_or_overrun_are_named_as_nonsense():
    """An engine whose speculative counters go negative and fall during a start: the trial fails
    with a reason naming the counter (the study exited 70 with ZeroDivisionError before)."""
    from autotune.engines._metrics import nonsense

    a = parse_exposition(expo(10, 40, 20, [8, 6, 4, 2], gen=100))
    b = parse_exposition(expo(30, 120, 60, [20, 18, 14, 8], gen=300))
    assert nonsense(delta(a, b)) is None
    assert "vllm:spec_decode_num_drafts fell by 20" in nonsense(delta(b, a))
    over = parse_exposition(expo(30, 120, 130, [20, 18, 14, 8], gen=300))
    assert "110 draft tokens accepted of 80 drafted" in nonsense(delta(a, over))
    bad_pos = parse_exposition(expo(30, 120, 60, [20, 18, 14, 99], gen=300))
    assert "position 3 changed by 97 with 20 drafts" in nonsense(delta(a, bad_pos))
