import asyncio
import json
import socket
import time
from pathlib import Path

import pytest

from autotune.replay._replay import (
    DONE,
    ID_HEADER,
    ReplayRun,
    StreamParser,
    parse_sse_line,
    replay,
    run_closed_loop,
)
from autotune.traffic._replayset import ReplayRequest
from autotune.testing import MockServer

DATA = Path(__file__).parent / "data"
# Read off the capture by eye: 1 + 5 + 5 + 5 tokens, 16 completion tokens.
COMPLETIONS_TEXT = " w786 w572 w187 w630 w5 w885 w711 w106" * 2
CHAT_TEXT = " w3252 w2623 w3355 w3827 w4081 w2401 w2533 w2947"
CAPTURE_SPEC = {"mean_acceptance_length": 5.0, "draft_acceptance_rate": 1.0,
                "acceptance_histogram": [0, 0, 0, 0, 3], "num_spec_steps": 3,
                "num_accepted_draft_tokens": 12, "num_draft_tokens": 12, "num_spec_tokens": 4}


def feed_file(name: str, dt: float = 1.0) -> StreamParser:
    p = StreamParser()
    for i, line in enumerate((DATA / name).read_text().splitlines()):
        p.feed_line(line, i * dt)
    return p


def cmpl(i, **body):
    return ReplayRequest(id=f"r{i}", endpoint="completions", body={"prompt": f"p{i}", **body}, tag="t")


def chat(i, **body):
    return ReplayRequest(id=f"c{i}", endpoint="chat",
                         body={"messages": [{"role": "user", "content": f"q{i}"}], **body})


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# --------------------------------------------------------------------------- SSE parsing


def test_parse_sse_line():
    assert parse_sse_line('data: {"a": 1}') == {"a": 1}
    assert parse_sse_line('data:{"a": 1}\r\n') == {"a": 1}
    assert parse_sse_line("data: [DONE]") == DONE
    for line in ("", "\n", ": keep-alive", "event: message", "id: 3", "data: "):
        assert parse_sse_line(line) is None
    with pytest.raises(ValueError, match="malformed"):
        parse_sse_line("data: {not json")
    with pytest.raises(ValueError, match="expected an object"):
        parse_sse_line("data: [1, 2]")


def test_capture_completions_stream():
    lines = (DATA / "stream_completions.txt").read_text().splitlines()
    events = [parse_sse_line(x) for x in lines]
    assert DONE in events and all(isinstance(e, dict) for e in events if e not in (None, DONE))
    p = feed_file("stream_completions.txt")
    assert p.done
    assert p.text == COMPLETIONS_TEXT
    assert p.usage == {"prompt_tokens": 12, "total_tokens": 28, "completion_tokens": 16}
    assert p.finish_reason == "length"
    assert p.metrics["speculative_decoding"] == CAPTURE_SPEC
    assert p.metrics["time_to_first_token_ms"] == pytest.approx(27.20751599997584)
    # 4 content chunks on lines 0, 2, 4, 6: first token at t=0, three 2 s gaps
    # (token_ids is null in the capture, so gaps are not divided).
    assert p.first_token_at == 0.0
    assert p.itl_ms == [2000.0, 2000.0, 2000.0]


def test_capture_chat_stream():
    p = feed_file("stream_chat.txt")
    assert p.done
    assert p.text == CHAT_TEXT
    assert p.usage["completion_tokens"] == 8
    assert p.finish_reason == "length"
    # The opening role chunk (content "") is not a token: first token is on line 2.
    assert p.first_token_at == 2.0
    assert len(p.itl_ms) == 7
    assert p.metrics["speculative_decoding"]["num_spec_steps"] == 0


def test_itl_divided_by_token_ids():
    p = StreamParser()
    def mk(text, ids):
        return "data: " + json.dumps({"choices": [{"index": 0, "text": text, "token_ids": ids}]})

    p.feed_line(mk(" a", [1]), 1.0)
    p.feed_line(mk(" b c d d", [2, 3, 4, 5]), 1.2)
    p.feed_line(mk(" e", None), 1.3)
    p.feed_line("data: [DONE]", 1.4)
    assert p.text == " a b c d d e"
    assert p.itl_ms == pytest.approx([50.0, 100.0])
    assert p.done_at == 1.4


def test_error_event_in_stream():
    p = StreamParser()
    p.feed_line('data: {"error": {"message": "boom", "code": 500}}', 0.0)
    assert p.error and "boom" in p.error


# --------------------------------------------------------------------------- replay


def test_closed_loop_holds_concurrency():
    reqs = [cmpl(i) if i % 2 else chat(i) for i in range(16)]
    with MockServer(tokens_per_request=8, chunk_delay_s=0.005) as m:
        run = replay(m.base_url, "the-model", reqs, concurrency=4, timeout_s=10)
        assert m.max_in_flight == 4
        assert m.in_flight == 0
        seen = m.seen
    assert isinstance(run, ReplayRun)
    assert [r.id for r in run.results] == [r.id for r in reqs]
    assert len(run.ok()) == 16 and run.failed() == []
    for r in run.results:
        assert r.status == 200 and r.error is None
        assert r.output_tokens == 8 and r.prompt_tokens is not None
        assert r.ttft_ms > 0 and r.e2e_ms > r.ttft_ms
        assert r.tpot_ms == pytest.approx((r.last_token_ms - r.ttft_ms) / 7)
        assert r.ttft_ms < r.last_token_ms <= r.e2e_ms
        assert r.tpot_ms >= 4.0  # 5 ms sleep per later chunk
        assert len(r.itl_ms) == 7
        assert r.text == "".join(f" w{i}" for i in range(8))
        assert r.finish_reason == "length"
        assert r.spec is not None and r.spec["num_spec_tokens"] == 4
        assert "speculative_decoding" not in r.server_metrics
        assert r.started_at <= r.finished_at
        json.dumps(r.to_dict())
    assert run.steady_state is not None and run.steady_state[0] < run.steady_state[1]
    # Body: replayed as logged plus model/stream/stream_options; the request is not mutated.
    by_id = {rid: (path, body) for rid, path, body in seen}
    path, body = by_id["r1"]
    assert path == "/v1/completions"
    assert body == {"prompt": "p1", "model": "the-model", "stream": True,
                    "stream_options": {"include_usage": True}}
    assert by_id["c0"][0] == "/v1/chat/completions"
    assert "model" not in reqs[1].body


def test_concurrency_one_is_sequential():
    with MockServer(tokens_per_request=4, chunk_delay_s=0.002) as m:
        run = replay(m.base_url, "m", [cmpl(i) for i in range(5)], concurrency=1, timeout_s=10)
        assert m.max_in_flight == 1
    assert len(run.ok()) == 5
    for a, b in zip(run.results, run.results[1:]):
        assert a.finished_at <= b.started_at


def test_more_workers_than_requests():
    with MockServer(tokens_per_request=4) as m:
        run = replay(m.base_url, "m", [cmpl(0), cmpl(1)], concurrency=5, timeout_s=10)
    assert len(run.ok()) == 2
    assert run.steady_state is None  # never all 5 slots busy


def test_capture_shaped_spec_and_text():
    """The mock, fed the capture's words and chunking, yields the capture's text and spec dict."""
    words = COMPLETIONS_TEXT.split(" ")[1:]
    with MockServer(words=[" " + w for w in words], tokens_per_request=16, first_chunk_tokens=1,
                    tokens_per_chunk=5, num_spec_tokens=4) as m:
        run = replay(m.base_url, "m", [cmpl(0, max_tokens=16, temperature=0)], concurrency=1)
    (r,) = run.results
    assert r.ok, r.error
    assert r.text == COMPLETIONS_TEXT
    assert r.spec == CAPTURE_SPEC
    assert r.output_tokens == 16
    assert len(r.itl_ms) == 3  # 4 chunks, one gap each
    s = run.summary()
    assert s["spec"]["num_accepted_draft_tokens"] == 12 and s["spec"]["mean_acceptance_length"] == 5.0


def test_warmup_not_recorded():
    warm = [cmpl(100 + i) for i in range(3)]
    reqs = [cmpl(i) for i in range(4)]
    with MockServer(tokens_per_request=4) as m:
        run = replay(m.base_url, "m", reqs, concurrency=2, warmup=warm, timeout_s=10)
        order = [rid for rid, _, _ in m.seen]
    assert [r.id for r in run.results] == ["r0", "r1", "r2", "r3"]
    assert set(order[:3]) == {"r100", "r101", "r102"}
    assert len(order) == 7


def test_error_paths_become_failed_results():
    reqs = [cmpl(i) for i in range(8)]
    with MockServer(tokens_per_request=6, fail_ids={"r1"}, drop_ids={"r2"}, no_done_ids={"r3"},
                    hang_ids={"r4"}) as m:
        t = time.monotonic()
        run = replay(m.base_url, "m", reqs, concurrency=3, timeout_s=0.5)
        assert time.monotonic() - t < 30  # the hung request timed out (0.5 s); it would never end
    res = {r.id: r for r in run.results}
    assert len(res) == 8
    assert {r.id for r in run.failed()} == {"r1", "r2", "r3", "r4"}
    assert all(res[i].ok for i in ("r0", "r5", "r6", "r7"))
    assert res["r1"].status == 500 and res["r1"].error.startswith("HTTP 500") and "mock failure" in res["r1"].error
    assert "RemoteProtocolError" in res["r2"].error
    assert res["r3"].error == "stream ended without [DONE]"
    assert res["r4"].error == "timeout after 0.5s"
    for rid in ("r1", "r2", "r3", "r4"):
        assert res[rid].tpot_ms is None and res[rid].spec is None
    s = run.summary()
    json.dumps(s)
    assert s["n"] == 8 and s["failed"] == 4 and s["ok"] == 4
    assert sum(s["errors"].values()) == 4
    assert s["tpot_ms"]["n"] == 4


def test_connection_refused():
    url = f"http://127.0.0.1:{free_port()}"
    run = replay(url, "m", [cmpl(i) for i in range(3)], concurrency=2, timeout_s=5)
    assert len(run.results) == 3 and len(run.failed()) == 3
    assert all(r.error.startswith("ConnectError") and r.status is None for r in run.results)
    s = run.summary()
    assert s["tpot_ms"] is None and s["ttft_ms"] is None and s["stall"] is None and s["spec"] is None
    json.dumps(s)


def test_summary_contents():
    with MockServer(tokens_per_request=6, tokens_per_chunk=2, spec=False) as m:
        run = asyncio.run(run_closed_loop(m.base_url, "m", [cmpl(i) for i in range(6)], 2, timeout_s=10))
    s = run.summary("trimmed_mean")
    assert s["tpot_ms"]["statistic"] == "trimmed_mean"
    assert set(s["tpot_ms"]) >= {"value", "p50", "p90", "p99", "mean"}
    assert set(s["ttft_ms"]) == {"p50", "p90", "p99"} and set(s["itl_ms"]) == {"p50", "p90", "p99"}
    assert s["output_tokens"] == 36
    assert s["output_throughput_tok_s"] == pytest.approx(36 / run.wall_s)
    assert s["spec"] is None  # no speculation metrics in the stream
    assert set(s["stall"]) >= {"stalled", "reason"}
    json.dumps(s)
    with pytest.raises(ValueError):
        run.summary("mode")


def test_id_header_sent():
    with MockServer(tokens_per_request=2) as m:
        replay(m.base_url, "m", [cmpl(7)], concurrency=1)
        assert m.seen[0][0] == "r7"
    assert ID_HEADER.lower().startswith("x-")


def test_bad_concurrency():
    with pytest.raises(ValueError):
        replay("http://127.0.0.1:1", "m", [cmpl(0)], concurrency=0)
