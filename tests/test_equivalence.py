"""The equivalence guard's near-tie rule on recorded outputs and log-probabilities.

A candidate's greedy output is judged where it first leaves the baseline's: a near-tie (the
baseline's margin between the two tokens within the tolerance the engine's numerics justify) is
equivalent, a divergence where the baseline was confident is a real difference."""

from __future__ import annotations

import pytest

from autotune.replay._logprobs import chunk_rows, request_fields
from autotune.replay._replay import StreamParser
from autotune.search import _equivalence as eq
from autotune.search._trial import digest


def rows(tokens: list[tuple[str, float, list[tuple[str, float]]]]) -> list[list]:
    """``_logprobs`` rows: (token, logprob, alternatives with their logprobs)."""
    return [[t, lp, sorted([[t, lp], *[[a, alp] for a, alp in alts]], key=lambda p: -p[1])] for t, lp, alts in tokens]


# the baseline's greedy output "def f(x):\n    return x" with its top tokens; position 3 is a near-tie
BASE = rows([("def", -0.01, [("class", -5.0)]), (" f", -0.2, [(" g", -2.5)]), ("(x", -0.05, [("(", -3.5)]),
             ("):", -0.70, [(",", -0.74), (")", -3.0)]), ("\n", -0.01, []), ("    return", -0.1, [("    pass", -2.9)]),
             (" x", -0.3, [(" None", -1.6)])])
BASE_TEXT = "def f(x):\n    return x"


def judge_one(cand: str, tol: float, base_rows=BASE) -> dict:
    ref = eq.reference(base_rows)
    return eq.judge({"r": digest(BASE_TEXT)}, {"r": BASE_TEXT}, {"r": ref}, {"r": digest(cand)}, {"r": cand}, tol)


def test_identical_outputs_match():
    j = judge_one(BASE_TEXT, 0.1)
    assert (j["compared"], j["identical"], j["matched"], j["differs"]) == (1, 1, 1, 0) and j["divergences"] == []


def test_a_flip_at_a_near_tie_is_equivalent_and_says_where():
    # the candidate took "," where the baseline's "):" led by 0.04 nats, then went its own way
    j = judge_one("def f(x, y):\n    pass", tol=0.1)
    assert (j["identical"], j["near_ties"], j["differs"], j["matched"]) == (0, 1, 0, 1)
    d = j["divergences"][0]
    assert d["verdict"] == "near_tie" and d["position"] == 3 and d["token"] == "):" and d["candidate"] == ","
    assert d["gap"] == pytest.approx(0.04) and d["offset"] == len("def f(x")


def test_the_same_flip_beyond_the_tolerance_is_a_real_difference():
    j = judge_one("def f(x, y):\n    pass", tol=0.01)
    assert (j["near_ties"], j["differs"], j["matched"]) == (0, 1, 0)
    assert j["divergences"][0]["verdict"] == "differs" and j["gaps"] == [pytest.approx(0.04)]


def test_a_divergence_where_the_baseline_was_confident_differs():
    # "    pass" was 2.8 nats behind "    return": a lossy verify, not numerics
    j = judge_one("def f(x):\n    pass", tol=1.0)
    d = j["divergences"][0]
    assert d["verdict"] == "differs" and d["position"] == 5 and d["gap"] == pytest.approx(2.8)


def test_a_token_the_baseline_did_not_rank_differs():
    j = judge_one("def f(x):\n    yield x", tol=1.0)
    d = j["divergences"][0]
    assert d["verdict"] == "differs" and "gap" not in d and "not within" in d["why"]


def test_a_divergence_inside_a_token_finds_the_alternative_that_spells_the_candidate():
    # "(" is a prefix of the baseline's "(x": the candidate's "(y" is read as the alternative "("
    j = judge_one("def f(y):\n    return y", tol=5.0)
    d = j["divergences"][0]
    assert d["position"] == 2 and d["candidate"] == "(" and d["gap"] == pytest.approx(3.45)


def test_an_output_that_ends_early_matches_only_an_end_of_text_alternative():
    ends = rows([("def", -0.01, []), (" f", -0.3, [("", -0.32)])])  # "" (the end of text) nearly tied with " f"
    ref = eq.reference(ends)
    j = eq.judge({"r": digest("def f")}, {"r": "def f"}, {"r": ref}, {"r": digest("def")}, {"r": "def"}, 0.1)
    assert j["near_ties"] == 1 and j["divergences"][0]["candidate"] == ""
    # an alternative that is empty does not match a candidate that went on
    k = eq.judge({"r": digest("def f")}, {"r": "def f"}, {"r": ref}, {"r": digest("def g")}, {"r": "def g"}, 0.1)
    assert k["differs"] == 1


def test_without_the_baselines_log_probabilities_a_divergence_differs():
    j = eq.judge({"r": digest(BASE_TEXT)}, {"r": BASE_TEXT}, {}, {"r": digest("x")}, {"r": "x"}, 1.0)
    assert j["differs"] == 1 and "no log-probabilities" in j["divergences"][0]["why"]
    # tokens that do not spell the text (a detokenizer's replacement characters): not judged
    bad = eq.reference(rows([("d\ufffd", -0.1, [])]))
    j = eq.judge({"r": digest("de")}, {"r": "de"}, {"r": bad}, {"r": digest("dx")}, {"r": "dx"}, 1.0)
    assert j["differs"] == 1 and "do not spell" in j["divergences"][0]["why"]


def test_only_requests_both_sides_have_are_compared():
    j = eq.judge({"a": "1", "b": "2"}, {}, {}, {"b": "2", "c": "3"}, {}, 0.0)
    assert j["compared"] == 1 and j["identical"] == 1


def test_the_reference_keeps_only_alternatives_within_the_band():
    ref = eq.reference(rows([("a", -0.1, [("b", -0.2), ("c", -0.1 - eq.BAND - 0.01)])]))
    assert ref == [["a", [["b", pytest.approx(0.1)]]]]
    assert eq.reference(None) is None and eq.reference([]) is None


def test_engine_noise_measures_margin_shifts_and_flips_between_two_batchings():
    a = {"r1": rows([("x", -0.1, [("y", -1.0)]), ("z", -0.5, [("w", -0.6)])]),
         "r2": rows([("p", -0.2, [("q", -0.25)]), ("s", -0.1, [])])}
    b = {"r1": rows([("x", -0.12, [("y", -0.9)]), ("z", -0.4, [("w", -0.7)])]),  # margins 0.9->0.78, 0.1->0.3
         "r2": rows([("q", -0.21, [("p", -0.22)])])}  # parted at once: a's margin there was 0.05
    n = eq.engine_noise(a, b)
    assert n["requests"] == 2 and n["positions"] == 2 and n["shift"] == pytest.approx(0.2)
    assert n["flips"] == 1 and n["flip_gaps"] == [pytest.approx(0.05)] and n["flip_gap_max"] == pytest.approx(0.05)
    # a flip whose margin is larger than any shift sets the measurement
    assert eq.measured({**n, "flip_gap_max": 0.3}) == 0.3 and eq.measured(n) == pytest.approx(0.2)
    assert eq.engine_noise(a, {}) is None


def test_the_tolerance_is_twice_the_largest_shift_capped_or_what_the_spec_sets():
    noise = {"shift": 0.12, "flip_gaps": [0.05], "positions": 900, "flips": 2, "requests": 16}
    t = eq.tolerance(noise, "auto")
    assert t["nats"] == pytest.approx(0.24) and "900 tokens" in t["how"] and "2 of 16" in t["how"]
    wide = eq.tolerance({**noise, "shift": 3.0}, "auto")
    assert wide["nats"] == eq.NEAR_TIE_CAP and "capped" in wide["how"]
    assert eq.tolerance(None, "auto")["nats"] == 0.0  # nothing measured (an invariant engine): exact match
    assert eq.tolerance(noise, 0.5) == {"nats": 0.5, "how": "set by guards.equivalence_near_tie"}


def test_completions_and_chat_log_probabilities_parse_to_one_shape():
    comp = {"text": " x", "logprobs": {"tokens": [" x"], "token_logprobs": [-0.1],
                                       "top_logprobs": [{" x": -0.1, " y": -2.0}]}}
    chat = {"delta": {"content": " x"}, "logprobs": {"content": [
        {"token": " x", "logprob": -0.1, "top_logprobs": [{"token": " y", "logprob": -2.0},
                                                         {"token": " x", "logprob": -0.1}]}]}}
    assert chunk_rows(comp) == chunk_rows(chat) == [[" x", -0.1, [[" x", -0.1], [" y", -2.0]]]]
    assert chunk_rows({"text": "a"}) == [] and chunk_rows({"text": "a", "logprobs": None}) == []
    assert {"logprobs": True, "top_logprobs": 5}.items() <= request_fields("chat").items()
    assert request_fields("completions", 3)["logprobs"] == 3


def test_the_stream_parser_collects_log_probabilities_of_choice_zero():
    p = StreamParser()
    for i, tok in enumerate(["a", "b"]):
        p.feed_event({"choices": [{"index": 0, "text": tok, "logprobs": {
            "tokens": [tok], "token_logprobs": [-0.5], "top_logprobs": [{tok: -0.5}]}},
            {"index": 1, "text": "z", "logprobs": {"tokens": ["z"], "token_logprobs": [-1.0]}}]}, float(i))
    assert p.text == "ab" and [r[0] for r in p.logprobs] == ["a", "b"]


# the same judgment by token ids: vLLM names tokens ``token_id:N`` (``return_tokens_as_token_ids``)
# and streams the candidate's ids (``return_token_ids``), whatever the tokenizer spells
ID_ROWS = rows([(11, -0.01, [(12, -5.0)]), (21, -0.70, [(22, -0.74), (23, -3.0)]), (31, -0.1, [(32, -2.9)])])


def judge_ids(cand: list[int], tol: float) -> dict:
    return eq.judge({"r": "b"}, {"r": "text"}, {"r": eq.reference(ID_ROWS)}, {"r": "c"}, {"r": "other"}, tol,
                    {"r": cand})


def test_token_ids_locate_the_divergence_without_spelling_the_text():
    j = judge_ids([11, 22, 99], 0.1)  # took 22 where 21 led by 0.04 nats
    d = j["divergences"][0]
    assert j["near_ties"] == 1 and d["position"] == 1 and (d["token"], d["candidate"]) == (21, 22)
    assert d["gap"] == pytest.approx(0.04)
    assert judge_ids([11, 21, 32], 1.0)["divergences"][0]["gap"] == pytest.approx(2.8)
    assert judge_ids([11, 21, 32], 1.0)["differs"] == 1
    assert "not within" in judge_ids([11, 77], 1.0)["divergences"][0]["why"]
    assert "ended" in judge_ids([11], 1.0)["divergences"][0]["why"]
    assert "past the baseline" in judge_ids([11, 21, 31, 40], 1.0)["divergences"][0]["why"]


def test_token_id_names_parse_to_ints_and_the_chunk_ids_are_kept():
    from autotune.replay._logprobs import chunk_ids

    comp = {"text": " x", "token_ids": [7], "logprobs": {"tokens": ["token_id:7"], "token_logprobs": [-0.1],
                                                         "top_logprobs": [{"token_id:7": -0.1, "token_id:9": -1.0}]}}
    assert chunk_rows(comp) == [[7, -0.1, [[7, -0.1], [9, -1.0]]]] and chunk_ids(comp) == [7]
    assert request_fields("completions")["return_tokens_as_token_ids"] is True
    p = StreamParser()
    p.feed_event({"choices": [comp]}, 0.0)
    assert p.token_ids == [7]


# ---- a study judged by the rule (the synthetic workload's measurements, greedy outputs as token ids) ----
def _study_run(tmp_path, monkeypatch, take, budget, min_match=0.9):
    """A study of the synthetic workload whose baseline outputs tokens 1..6 per request, with a
    near-tie at position 2 (token 9, 0.05 nats behind) and engine noise of 0.04 nats measured by
    its second batching; ``take(config)`` is what a speculative start puts at the first token it
    changes, as (position, token), or None for identical outputs."""
    from dataclasses import replace as dc_replace

    from _synthetic import Workload
    from test_search_study import RATES, fake_measure, make_spec

    from autotune.decide import _decision
    from autotune.engines._probe import Capabilities
    from autotune.search import _study
    from autotune.search._record import study_record
    from autotune.search._space import SearchSpace

    spec = make_spec(tmp_path, budget=budget)
    spec = spec.model_copy(update={"guards": spec.guards.model_copy(update={"equivalence_min_match": min_match})})
    inner = fake_measure(Workload(rates=RATES))
    base_rows = rows([(t, -0.01, [(9, -0.06)] if t == 3 else [(50 + t, -4.0)]) for t in range(1, 7)])

    def measure(spec, config, requests, warmup, *a, **kw):
        m = inner(spec, config, requests, warmup, *a)
        ids = {r.id: list(range(1, 7)) for r in requests[:16]}
        if config is None:
            return dc_replace(m, outputs={r: digest(str(v)) for r, v in ids.items()}, token_ids=ids,
                              logprobs={r: eq.reference(base_rows) for r in ids},
                              engine_noise={"requests": 16, "positions": 96, "shift": 0.04, "shift_p99": 0.03,
                                            "flips": 0, "flip_gaps": [], "flips_outside_top": 0})
        change = take(config)
        if change:
            pos, tok = change
            ids = {r: v[:pos] + [tok] + [70 + i for i in range(5 - pos)] for r, v in ids.items()}
        return dc_replace(m, outputs={r: digest(str(v)) for r, v in ids.items()}, token_ids=ids)

    monkeypatch.setattr(_study, "measure", measure)
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=["method", "num_speculative_tokens",
                        "prompt_lookup_min", "prompt_lookup_max"], arctic_inference=False)
    study = _study.Study(spec, caps, SearchSpace.build(spec.space, caps), spec.storage, ["vllm", "serve"],
                         tmp_path / "home")
    study.confirm_open = lambda: _decision.open_question(study_record(study))
    study.run()
    return study, _decision.decide(study_record(study))


def test_a_study_whose_candidates_flip_only_near_ties_changes(tmp_path, monkeypatch):
    study, d = _study_run(tmp_path, monkeypatch, lambda cfg: (2, 9),
                          {"max_trials": 6, "max_server_starts": 12, "max_wall_minutes": 10})
    assert d.decision == "change", d.reason
    ev = d.evidence["equivalence"]
    assert ev["near_ties"] == ev["compared"] and ev["differs"] == 0 and ev["tolerance"] == pytest.approx(0.08)
    assert ev["divergences"][0]["gap"] == pytest.approx(0.05) and ev["divergences"][0]["position"] == 2
    assert "2 x 0.04 nats" in ev["tolerance_how"] and ev["engine_noise"][0]["shift"] == 0.04


def test_a_lossy_study_keeps_names_the_margins_and_spends_the_confirmations_starts_on_the_search(tmp_path,
                                                                                                    monkeypatch):
    budget = {"max_trials": 12, "max_server_starts": 10, "max_wall_minutes": 10}
    study, d = _study_run(tmp_path, monkeypatch, lambda cfg: (1, 50 + 2), budget)
    assert d.decision == "keep" and d.evidence["keep_reason"] == "no candidate"
    assert "real differences at margins 3.99 nats" in d.reason and "the fastest blocked" in d.reason
    assert d.evidence["fastest_blocked"]["speedup"] > 1.5 and d.evidence["fastest_blocked"]["guards"] == ["equivalence"]
    detail = d.evidence["guard_failures"]["equivalence"]["starts_detail"][0]
    assert detail["differs"] == 16 and detail["divergences"][0]["position"] == 1
    # no confirmation could happen, so its reserve went to the search: more starts than budget - reserve
    from autotune.search._budget import confirm_reserve

    starts = study.server_starts()
    assert starts > budget["max_server_starts"] - confirm_reserve(study.spec), starts
    assert any("no confirmation can happen until one passes" in n for n in study.notes)
    assert not [t for t in study.trials() if t.user_attrs.get("role") == "confirm"]
