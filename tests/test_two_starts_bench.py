"""What a search of two server starts could measure second (``benchmarks/two_starts.py``): the rules
pick the K they say, and the scoring runs each on the same grids."""

from __future__ import annotations

import random

from _bench import benchmark

gen = benchmark("grid_gen.py", "grid_gen_bench")
two = benchmark("two_starts.py", "two_starts_bench")


def _k(grid, key):
    cfg = grid.starts[key][0].config
    return cfg["num_speculative_tokens"] if cfg else 0


def test_each_rule_starts_the_k_it_names():
    g = gen.generate(1, seed=2)[0]
    rng = random.Random(0)
    assert _k(g, two.second_start(g, "kmax", rng)) == gen.K_MAX
    assert _k(g, two.second_start(g, "nominee", rng)) == gen.K_MAX  # its counters choose what is confirmed
    assert _k(g, two.second_start(g, "mid", rng)) == 6  # 1..10: 5.5, the larger of the two
    assert {_k(g, two.second_start(g, "random", rng)) for _ in range(60)} == set(range(1, gen.K_MAX + 1))


def test_the_pick_is_none_or_the_second_start_and_the_nominee_may_be_a_k_never_started():
    grids = gen.generate(8, seed=0)
    for g in grids:
        rng = random.Random(g.name)
        second = two.second_start(g, "kmax", random.Random(0))
        assert two.pick(g, "kmax", rng) in ("none", second)
    picks = {two.pick(g, "nominee", random.Random(g.name)) for g in grids}
    assert picks - {"none", two.second_start(grids[0], "kmax", random.Random(0))}  # some K below K_max


def test_scoring_gives_every_rule_its_shares_per_group():
    grids = gen.generate(4, seed=1)
    out = two.score(grids, 2, lambda g: g.name.split("/")[1], lambda g, p: g.ok(p))
    assert set(out["all"]) == set(two.RULES) and out["all"]["kmax"][2] == 4
    for ok, tied, _ in out["all"].values():
        assert 0 <= ok <= tied <= 1
    assert "| generated family | grids | kmax | mid | random | nominee |" in two.table("generated family", out)
