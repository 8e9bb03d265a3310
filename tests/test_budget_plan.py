"""The budget's plan (``_budget.plan``): what the search gets once the confirmation's reserve is
kept, against what its opening and runoff need, and which field would pay for what is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.core._spec import load_spec
from autotune.search._budget import confirm_reserve, plan

from test_spec import VALID, _write

ROOT = Path(__file__).resolve().parent.parent


def _spec(tmp_path, budget: str, space: str = "space:\n  methods: [ngram]\n  k: {min: 1, max: 10}\n",
          objective: str = "objective:\n  confirm_starts: 1\n  confirm_max_starts: 4\n"):
    return load_spec(_write(tmp_path, VALID + space + budget + objective))


QUIET = "objective:\n  confirm_starts: 1\n  confirm_max_starts: 4\n  start_noise: {cv: 0.02, df: 5}\n"
"""A spec that expects 2% start-to-start noise: two confirmation rounds see a 20% gain in 98% of nights."""


def test_a_night_sized_for_its_confirmation_says_what_the_search_misses(tmp_path):
    # the GPU night's shape: 10 starts, up to four confirmation rounds. Quiet starts: the search
    # gets its opening (none, K=10, the knee) before the fourth round, max_trials 4 takes the start left
    s = _spec(tmp_path, "budget:\n  max_trials: 4\n  max_server_starts: 10\n", objective=QUIET)
    p = plan(s, s.space.methods)
    assert (p["confirmation"], p["search"], p["opening"], p["runoff"]) == (6, 4, 3, 2) == \
        (confirm_reserve(s), 10 - confirm_reserve(s), 3, 2)
    assert "the search gets 4 of 10 server starts (6 kept for the confirmation" in p["short"]
    assert "budget.max_trials 5 and budget.max_server_starts 13 would pay for both" in p["short"]
    # no start noise expected: no claim on the decision's power, the four rounds are kept
    bare = _spec(tmp_path, "budget:\n  max_trials: 4\n  max_server_starts: 10\n")
    p = plan(bare, bare.space.methods)
    assert (p["confirmation"], p["search"]) == (8, 2) and "the search gets 2 of 10 server starts" in p["short"]


@pytest.mark.parametrize("starts, methods, reserve", [
    (8, 1, 4),    # none, K_max, a guided start, one more; two rounds
    (10, 1, 6),   # three rounds, not four: the guided start comes first
    (12, 1, 8),   # both fit: four rounds, the search 4
    (6, 1, 4),    # the guided start does not fit beside two rounds: they keep the starts, as before
    (7, 2, 4),    # two methods' largest K and a guided start would leave one round: two kept, the search 3
    (8, 3, 6),    # three methods: the opening cannot pay for itself, the confirmation keeps three rounds
])
def test_the_search_gets_a_start_after_its_largest_ks_before_rounds_beyond_two(tmp_path, starts, methods, reserve):
    """The order of claim (``confirm_reserve``): the search's least (none and a candidate), two
    confirmation rounds, the start after each method's largest K that uses its counters (where it
    fits beside the two rounds and they keep the power), then more rounds up to confirm_max_starts."""
    names = ["ngram", "suffix", "ngram_gpu"][:methods]
    space = f"space:\n  methods: [{', '.join(names)}]\n  k: {{min: 1, max: 8}}\n"
    s = _spec(tmp_path, f"budget:\n  max_trials: 20\n  max_server_starts: {starts}\n", space=space, objective=QUIET)
    assert confirm_reserve(s) == reserve


@pytest.mark.parametrize("noise, reserve, power_3, power_4", [
    ("", 8, False, False),                                                       # no figure, no claim
    ("  start_noise: {cv: 0.03, df: 5}\n", 6, True, True),                       # 3 rounds: 100%
    ("  start_noise: {cv: 0.06, df: 5}\n", 8, False, True),                      # 75%, 4 rounds 91%
    ("  start_noise: {cv: 0.01, df: 5, speculative: {cv: 0.08, df: 5}}\n", 8, False, False),  # 50%, 76%
])
def test_rounds_go_to_the_search_only_where_the_rest_keep_the_power_at_the_specs_noise(tmp_path, noise, reserve,
                                                                                       power_3, power_4):
    """The fourth round yields to the search's guided start only where three rounds still see a
    true 20% gain in 80% of nights at the start noise the spec expects (``keeps_power``)."""
    from autotune.search._budget import keeps_power

    s = _spec(tmp_path, "budget:\n  max_trials: 9\n  max_server_starts: 10\n",
              objective="objective:\n  confirm_starts: 1\n  confirm_max_starts: 4\n" + noise)
    assert confirm_reserve(s) == reserve
    assert (keeps_power(s, 3), keeps_power(s, 4)) == (power_3, power_4)


def test_confirm_starts_and_confirm_max_starts_still_bound_the_reserve(tmp_path):
    three = _spec(tmp_path, "budget:\n  max_trials: 9\n  max_server_starts: 6\n",
                  objective="objective:\n  confirm_starts: 3\n  confirm_max_starts: 4\n  start_noise: {cv: 0.02, df: 5}\n")
    assert confirm_reserve(three) == 6  # confirm_starts rounds whatever the budget
    one = _spec(tmp_path, "budget:\n  max_trials: 9\n  max_server_starts: 10\n",
                objective="objective:\n  confirm_starts: 1\n  confirm_max_starts: 1\n  start_noise: {cv: 0.02, df: 5}\n")
    assert confirm_reserve(one) == 2  # one round at most
    inc = _spec(tmp_path, "budget:\n  max_trials: 9\n  max_server_starts: 12\nincumbent: "
                "{method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 2, prompt_lookup_max: 4}\n",
                objective=QUIET)
    assert confirm_reserve(inc) == 6  # three sides: none, incumbent, K_max and a guided start leave 8, two rounds


def test_enough_budget_says_nothing_and_a_k_range_of_two_has_no_knee(tmp_path):
    s = _spec(tmp_path, "budget:\n  max_trials: 9\n  max_server_starts: 18\n")
    assert plan(s, s.space.methods)["short"] is None
    narrow = _spec(tmp_path, "budget:\n  max_trials: 4\n  max_server_starts: 12\n",
                   space="space:\n  methods: [ngram]\n  k: {min: 4, max: 5}\n")
    p = plan(narrow, narrow.space.methods)
    assert p["opening"] == 2 and p["short"] is None  # none and K=5: nothing between for a knee


def test_the_trial_cap_alone_is_named_when_starts_are_plenty(tmp_path):
    s = _spec(tmp_path, "budget:\n  max_trials: 3\n  max_server_starts: 30\n")
    p = plan(s, s.space.methods)
    assert p["search"] == 3 and p["short"].endswith("budget.max_trials 5 would pay for both")


@pytest.mark.parametrize("name", ["code", "chat", "code-smollm2", "chat-smollm2", "mixed-smollm2", "code-llamacpp",
                                  "chat-llamacpp", "random"])
def test_every_shipped_spec_leaves_room_for_its_opening_and_runoff(name):
    s = load_spec(ROOT / "studies" / f"{name}.yaml")
    assert plan(s, s.space.methods)["short"] is None, plan(s, s.space.methods)["short"]
