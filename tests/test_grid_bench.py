"""benchmarks/grid.py's short protocol: fewer measured requests, each with fewer output tokens,
recorded in the rows."""

from __future__ import annotations

from _bench import benchmark
from autotune.traffic._replayset import ReplayRequest


def _reqs() -> list[ReplayRequest]:
    return [ReplayRequest(id=f"r{i}", endpoint="chat", body={"messages": [], "max_tokens": m})
            for i, m in enumerate([96, 16, 96, 96])]


def test_short_protocol_takes_the_first_requests_and_caps_their_tokens():
    grid = benchmark("grid.py", "bench_grid")
    reqs = _reqs()
    short = grid.shorten(reqs, 2, 32)
    assert [r.id for r in short] == ["r0", "r1"]
    assert [r.body["max_tokens"] for r in short] == [32, 16]   # a request asking for less keeps its own
    assert [r.body["max_tokens"] for r in reqs] == [96, 16, 96, 96]  # the replay set's requests are untouched
    assert grid.shorten(reqs, None, None) == reqs
    assert [r.body["max_tokens"] for r in grid.shorten(reqs, None, 8)] == [8, 8, 8, 8]


def test_rows_of_a_short_protocol_say_so():
    grid = benchmark("grid.py", "bench_grid")
    assert grid.short_protocol(None, None) is None
    assert grid.short_protocol(4, 32) == {"requests": 4, "max_tokens": 32}
    assert grid.short_protocol(None, 32) == {"max_tokens": 32}
