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


def test_a_night_sized_for_its_confirmation_says_what_the_search_misses(tmp_path):
    # the GPU night's shape: 10 starts, 8 for four confirmation rounds, 2 for the search
    s = _spec(tmp_path, "budget:\n  max_trials: 4\n  max_server_starts: 10\n")
    p = plan(s, s.space.methods)
    assert (p["confirmation"], p["search"], p["opening"], p["runoff"]) == (8, 2, 3, 2) == \
        (confirm_reserve(s), 10 - confirm_reserve(s), 3, 2)
    assert "the search gets 2 of 10 server starts" in p["short"]
    assert "budget.max_trials 5 and budget.max_server_starts 13 would pay for both" in p["short"]


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
