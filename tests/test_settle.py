"""Warm-up until the engine stops compiling (``search/_settle``).

The server is the mock, and the test writes the compile lines vLLM's JIT monitor would write
(the real lines, copied from an H200 log); what runs on the GPU is in docs/benchmarks.md and its notes.
These tests pin the rule: rounds at each level until one compiles nothing, a cap, no rounds
where the log cannot be watched, measured requests never reused, late compiles reported.
"""

from __future__ import annotations

import asyncio
import threading

from autotune.engines import _serverlog
from autotune.search import _settle
from autotune.testing import MockServer
from autotune.traffic._replayset import ReplayRequest

MONITOR = ("(EngineCore pid=1) INFO 12-01 10:00:00 [jit_monitor.py:84] JIT monitor activated; monitored JIT "
           "compilations during inference will use mode=warn.\n")
COMPILE = ("(EngineCore pid=1) WARNING 12-01 10:01:00 [jit_monitor.py:135] Triton kernel JIT compilation during "
           "inference: {k}. This causes a latency spike; consider extending warmup to cover this shape/config.\n")


def req(i: int) -> ReplayRequest:
    return ReplayRequest(id=f"r{i}", endpoint="completions",
                         body={"prompt": f"p{i}", "max_tokens": 4, "temperature": 0}, tag="t")


class CompilingLog:
    """Appends a compile line to the log for the first ``n`` requests at each concurrency level
    (a kernel compiled per new shape); ``n=None``: every request compiles."""

    def __init__(self, path, n: int | None, monitor: bool = True):
        self.path, self.n, self.count = path, n, {}
        self.lock = threading.Lock()
        path.write_text("INFO starting\n" + (MONITOR if monitor else ""))

    def __call__(self, rid, body):
        lv = (rid or "").split("~settle")[-1].split(".")[0]
        with self.lock:
            self.count[lv] = self.count.get(lv, 0) + 1
            if self.n is None or self.count[lv] <= self.n:
                with open(self.path, "a") as fh:
                    fh.write(COMPILE.format(k=f"kernel_{lv}_{self.count[lv]}"))


def run_settle(tmp_path, n, levels=(1, 4), max_rounds=3, monitor=True, pool_size=10):
    log = tmp_path / "server.log"
    comp = CompilingLog(log, n, monitor)
    pool = [req(i) for i in range(pool_size)]
    with MockServer(tokens_per_request=3, on_request=comp) as m:
        out = asyncio.run(_settle.settle(m.base_url, "m", pool, list(levels), log, max_rounds))
        seen = [rid for rid, _, _ in m.seen]
    return out, seen, log


def test_rounds_run_until_one_compiles_nothing(tmp_path):
    # the first 5 requests at each level compile: level 1 (a request a round) has 5 compiling
    # rounds and a quiet sixth; level 4 (4 a round) 2 compiling rounds and a quiet third
    out, seen, _ = run_settle(tmp_path, n=5, levels=(1, 4), max_rounds=7)
    assert out["watched"]
    l1, l4 = out["levels"]["1"], out["levels"]["4"]
    assert l1["rounds"] == 6 and l1["quiet"] and [len(r) for r in l1["compiled"]] == [1, 1, 1, 1, 1, 0]
    assert l4["rounds"] == 3 and l4["quiet"] and [len(r) for r in l4["compiled"]] == [4, 1, 0]
    assert len(seen) == 6 * 1 + 3 * 4 and len(set(seen)) == len(seen)
    assert all("~settle" in s for s in seen)  # copies under their own ids
    # only the pool's requests (the warm-up), cycled to fill a wave of 4 from a pool of 10
    assert {s.split("~")[0] for s in seen} <= {f"r{i}" for i in range(10)}


def test_a_wave_larger_than_the_warmup_cycles_it(tmp_path):
    out, seen, _ = run_settle(tmp_path, n=0, levels=(4,), max_rounds=2, pool_size=1)
    assert out["levels"]["4"]["rounds"] == 1 and len(seen) == 4 and len(set(seen)) == 4
    assert {s.split("~")[0] for s in seen} == {"r0"}
    out, seen, _ = run_settle(tmp_path, n=None, pool_size=0)
    assert not out["watched"] and seen == []  # no warm-up requests: nothing to settle with


def test_a_level_still_compiling_stops_at_the_cap_and_says_so(tmp_path):
    out, seen, _ = run_settle(tmp_path, n=None, levels=(2,), max_rounds=3)
    lv = out["levels"]["2"]
    assert lv["rounds"] == 3 and not lv["quiet"] and all(len(r) == 2 for r in lv["compiled"])


def test_a_round_that_fails_whole_is_not_quiet(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(MONITOR)
    with MockServer(tokens_per_request=3, fail_ids=[f"r0~settle1.0r{n}" for n in range(3)]) as m:
        out = asyncio.run(_settle.settle(m.base_url, "m", [req(0)], [1], log, 3))
    assert out["levels"]["1"] == {"rounds": 1, "compiled": [[]], "quiet": False, "failed": 1}


def test_no_rounds_where_the_log_does_not_report_compiles(tmp_path):
    out, seen, _ = run_settle(tmp_path, n=None, monitor=False)
    assert not out["watched"] and out["levels"] == {} and seen == []
    out, seen, _ = run_settle(tmp_path, n=None, max_rounds=0)
    assert not out["watched"] and seen == []


def test_compiles_after_the_rounds_are_the_measured_windows(tmp_path):
    out, _, log = run_settle(tmp_path, n=1, levels=(1,), max_rounds=3)
    assert out["levels"]["1"]["rounds"] == 2
    assert _settle.compiled_after(out, log) == []
    with open(log, "a") as fh:
        fh.write(COMPILE.format(k="late_kernel") + "a line still being writ")
    assert _settle.compiled_after(out, log) == ["late_kernel"]
    assert _settle.compiled_after({"watched": False, "offset": 0}, log) == []


def test_log_reading_takes_whole_lines_only(tmp_path):
    log = tmp_path / "l.log"
    log.write_text(MONITOR + COMPILE.format(k="a") + "WARNING ... JIT compilation during inference: b")
    kernels, end = _serverlog.compiles_since(log, 0)
    assert kernels == ["a"] and _serverlog.reports_compiles(log)
    with open(log, "a") as fh:
        fh.write("_kernel. more\n")
    assert _serverlog.compiles_since(log, end)[0] == ["b_kernel"]
    assert _serverlog.compiles_since(tmp_path / "missing.log", 0) == ([], 0)
