"""benchmarks/start_noise.py: the pooled start-to-start noise of recorded grids, the figure a
spec's objective.start_noise takes."""

from __future__ import annotations

import json
import math

from _bench import benchmark


def _rows(path, starts: dict[str, list[list[float]]], failed: int = 0):
    rows = [{"config_key": k, "ok": True, "tpot_ms": t} for k, ts in starts.items() for t in ts]
    rows += [{"config_key": "none", "ok": False, "tpot_ms": [1000.0]}] * failed
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_noise_pools_configs_started_twice_over_files(tmp_path, capsys):
    bench = benchmark("start_noise.py", "bench_start_noise")
    # a: one config twice, medians 10 and 10*e^0.2; its other config once (no df); a failed start ignored
    a = _rows(tmp_path / "a.jsonl", {"none": [[10.0], [10.0 * math.exp(0.2)]], "k8": [[5.0]]}, failed=1)
    # b: same config key in another file is another configuration (files are not pooled by key)
    b = _rows(tmp_path / "b.jsonl", {"none": [[20.0], [20.0], [20.0]]})
    assert bench.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    # a alone: deviations +-0.1 on 1 df -> sd = sqrt(0.02); pooled with b's 2 df of zeros: sqrt(0.02 / 3)
    assert f"a.jsonl: sd of log per-start median {math.sqrt(0.02):.3f} on 1 df" in out
    sd = math.sqrt(0.02 / 3)
    assert f"pooled: sd {sd:.3f} on 3 df -> objective.start_noise: {{cv: {math.exp(sd) - 1:.3f}, df: 3}}" in out


def test_no_repeated_start_is_an_error_not_a_zero(tmp_path, capsys):
    bench = benchmark("start_noise.py", "bench_start_noise")
    once = _rows(tmp_path / "once.jsonl", {"none": [[10.0]], "k8": [[5.0]]})
    assert bench.main([str(once)]) == 1
    assert "no configuration was started twice" in capsys.readouterr().err
    empty = _rows(tmp_path / "empty.jsonl", {}, failed=2)
    assert bench.main([str(empty)]) == 2
    assert "no successful rows" in capsys.readouterr().err


def test_by_class_gives_the_baseline_and_the_speculative_configs_a_figure_each(tmp_path, capsys):
    """Profile starts (the H200 rows: per-level TPOTs and weights) count as the decision counts
    them, the traffic-weighted per-level statistic; a quiet baseline and noisy speculative configs
    get their own figures, the spec block objective.start_noise takes; labelled experiments and
    other workloads' configs of the same key are kept apart."""
    bench = benchmark("start_noise.py", "bench_start_noise")

    def start(key, wl, c1, c32, **kw):
        return {"config_key": key, "workload": wl, "state": "COMPLETE", **kw,
                "levels": {"1": {"tpot_ms": [c1] * 3, "weight": 0.5}, "32": {"tpot_ms": [c32] * 3, "weight": 0.5}}}

    e = math.exp
    rows = [start("none", "*", 5.0, 7.0), start("none", "*", 5.0, 7.0 * e(0.02)),  # weighted: 6.0 and 6.0707
            start("k8", "code", 2.0, 6.0), start("k8", "code", 2.0 * e(0.1), 6.0 * e(0.1)),  # a 0.1 log step
            start("k8", "chat", 3.0, 9.0),  # another workload's k8: a config of its own, once
            start("k8", "code", 9.0, 9.0, label="patched")]  # an experiment: not a grid start
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.main(["--by-class", str(p)]) == 0
    out = capsys.readouterr().out
    none_sd = abs(math.log(6.0 + 3.5 * (e(0.02) - 1)) - math.log(6.0)) / math.sqrt(2)
    assert f"none: sd {none_sd:.3f} on 1 df" in out
    assert f"speculative: sd {0.1 / math.sqrt(2):.3f} on 1 df" in out
    assert (f"by class -> objective.start_noise: {{cv: {e(none_sd) - 1:.3f}, df: 1, "
            f"speculative: {{cv: {e(0.1 / math.sqrt(2)) - 1:.3f}, df: 1}}}}") in out
    # without a speculative repeat there is no figure per class
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    assert bench.main(["--by-class", str(q)]) == 1
    assert "a class has no repeated start" in capsys.readouterr().err
