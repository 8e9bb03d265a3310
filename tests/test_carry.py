"""A night that carries last night's search (objective.carry_search): where tonight's baseline and
last night's winner measure what they did last night, the search ends after those two starts and
the confirmation decides on fresh starts; where the traffic moved, the search runs in full."""

from __future__ import annotations

from test_search_study import FIELDS, RATES, _with_objective, fake_measure, make_spec

from _synthetic import Workload
from autotune.engines._probe import Capabilities
from autotune.search import _carry, _study, study_record
from autotune.search._space import NONE, SearchSpace, canonical

CAPS = Capabilities(version="0.32.0", methods=["ngram"], fields=FIELDS, arctic_inference=False)
NOISE = {"cv": 0.02, "df": 4}


def _night(tmp_path, monkeypatch, w, spec, name, previous=None, seed=0, hardware="cpu-x"):
    from autotune.decide import _decision

    fm = fake_measure(w, seed=seed)
    monkeypatch.setattr(_study, "measure", fm)
    warm = []
    winner = ((previous or {}).get("evidence") or {}).get("winner", {}).get("config")
    if winner:  # what the runner's warm start makes of the recommendation: the incumbent
        spec = spec.model_copy(update={"incumbent": winner})
    st = _study.Study(spec, CAPS, SearchSpace.build(spec.space, CAPS), spec.storage, ["vllm", "serve"],
                      tmp_path / "home", study_name=name, warm_start=warm, previous=previous, hardware=hardware)
    st.confirm_open = lambda: _decision.open_question(study_record(st))
    out = st.run()
    return st, out, fm


def _recommendation(st) -> dict:
    """What a nightly run reads of the recommendation the night wrote (``_payload``'s fields)."""
    return {"evidence": {"winner": {"config": st.best(search_only=True).user_attrs["config"]}},
            "study": {"name": st.name}, "valid_for": {"hardware": st.hardware, "vllm_version": "0.32.0"}}


def _spec(tmp_path, budget=None, **objective):
    return make_spec(tmp_path, budget=budget, objective={"carry_search": True, "start_noise": NOISE, **objective})


SMALL = {"max_trials": 5, "max_server_starts": 9, "max_wall_minutes": 10}
"""Room for a search beyond the warm start and one confirmation round: what a night not carried shows."""


def _search_starts(st) -> int:
    return sum(1 for t in st.trials() if t.user_attrs.get("role") in ("baseline", "search"))


def test_an_unchanged_night_carries_the_search_and_confirms_on_fresh_starts(tmp_path, monkeypatch):
    w = Workload(rates=RATES)
    spec = _spec(tmp_path, nominee=True)
    first, out1, _ = _night(tmp_path, monkeypatch, w, spec, "night-1")
    assert _search_starts(first) >= 4 and "carry" not in first.study.user_attrs  # no previous: a full search
    prev = _recommendation(first)
    winner = canonical(prev["evidence"]["winner"]["config"])

    second, out2, fm = _night(tmp_path, monkeypatch, w, spec, "night-2", previous=prev, seed=1)
    keys = [canonical(c) if c else NONE for c in fm.calls]
    assert _search_starts(second) == 2 and keys[:2] == [NONE, winner]  # the baseline, last night's winner
    assert out2.stopped_because.startswith("last night's search stands")
    carry = second.study.user_attrs["carry"]
    assert carry["carried"] and carry["nights"] == 1 and carry["from"] == "night-1"
    assert abs(carry["z"]) < _carry.Z and carry["acceptance_length_tonight"]
    assert study_record(second).carry == carry  # what the recommendation's study block and `study show` print
    assert second.nominate() is None  # last night's ranking stands: no unmeasured nominee replaces its winner
    # the confirmation ran as on any night: fresh starts of the baseline and the winner decide
    confirm = second.trials(role="confirm")
    assert {t.user_attrs["config_key"] for t in confirm} == {NONE, winner} and len(confirm) >= 2
    assert out2.server_starts < out1.server_starts

    # the next night counts the carried nights; at carry_max_nights it searches in full
    prev2 = {**_recommendation(second), "study": {"name": "night-2"}}
    third, out3, _ = _night(tmp_path, monkeypatch, w, _with_objective(spec, carry_max_nights=1), "night-3",
                            previous=prev2, seed=2)
    c3 = third.study.user_attrs["carry"]
    assert not c3["carried"] and "carry_max_nights 1" in c3["reason"]
    assert _search_starts(third) > 2 and not out3.stopped_because.startswith("last night")


def test_a_night_whose_acceptance_moved_searches_in_full(tmp_path, monkeypatch):
    spec = _spec(tmp_path)
    first, _, _ = _night(tmp_path, monkeypatch, Workload(rates=RATES), spec, "night-1")
    prev = _recommendation(first)
    # the traffic now repeats less: every position accepts half as often
    second, out, _ = _night(tmp_path, monkeypatch, Workload(rates=[r * 0.5 for r in RATES]), spec, "night-2",
                            previous=prev, seed=1)
    carry = second.study.user_attrs["carry"]
    assert not carry["carried"] and carry["reason"].startswith("tonight differs")
    assert _search_starts(second) > 2
    assert any("the search runs in full" in n for n in second.notes)


def test_what_cannot_be_compared_is_not_carried(tmp_path, monkeypatch):
    w = Workload(rates=RATES)
    spec = _spec(tmp_path, SMALL)
    first, _, _ = _night(tmp_path, monkeypatch, w, spec, "night-1")
    prev = _recommendation(first)
    cases = [({**prev, "valid_for": {"hardware": "other-gpu", "vllm_version": "0.32.0"}}, "last night ran on other-gpu"),
             ({**prev, "study": {"name": "gone"}}, "not in this storage"),
             ({**prev, "evidence": {}}, "names no winner")]
    for i, (p, said) in enumerate(cases):
        st, _, _ = _night(tmp_path, monkeypatch, w, spec, f"night-x{i}", previous=p, seed=i + 1)
        assert not st.study.user_attrs["carry"]["carried"] and said in st.study.user_attrs["carry"]["reason"]
        assert _search_starts(st) > 2
    # another space is another ranking
    wide = _spec(tmp_path, SMALL)
    wide = wide.model_copy(update={"space": wide.space.model_copy(update={"k": wide.space.k.model_copy(update={"max": 6})})})
    st, _, _ = _night(tmp_path, monkeypatch, w, wide, "night-y", previous=prev, seed=5)
    assert "another space" in st.study.user_attrs["carry"]["reason"]
    # a study made before the search basis was kept says nothing of what it searched
    first.study.set_user_attr("search_basis", None)
    st, _, _ = _night(tmp_path, monkeypatch, w, spec, "night-v", previous=prev, seed=7)
    assert "predates carry_search" in st.study.user_attrs["carry"]["reason"]
    # off by default: a nightly run without the field searches as before
    st, _, _ = _night(tmp_path, monkeypatch, w, _with_objective(spec, carry_search=False), "night-z",
                      previous=prev, seed=6)
    assert "carry" not in st.study.user_attrs and _search_starts(st) > 2


def test_judge_needs_a_noise_figure_and_agreeing_acceptance():
    class T:
        def __init__(self, key, role, tpot, al=None):
            self.user_attrs = {"config_key": key, "role": role,
                               "measurement": {"tpot_ms": [tpot] * 5,
                                               "spec_delta": {"drafts": 10, "accepted_tokens": 10 * (al - 1)}
                                               if al else {}}}
            self.constraints = {"equivalence": -0.1}

    k = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    key = canonical(k)
    # the confirmation's requests gain more (8.0 against 6.0 ms): they are kept out of the means
    last = [T(NONE, "baseline", 10.0), T(key, "search", 6.0, 3.0), T(key, "confirm", 5.0, 3.6),
            T(key, "confirm", 5.1, 3.6), T(NONE, "confirm", 10.1), T(NONE, "confirm", 10.2)]
    spec = make_spec_stub(start_noise=NOISE)
    same = _carry.judge(spec, last, [T(NONE, "baseline", 10.05), T(key, "search", 6.05, 3.05)], k, nights_before=0)
    assert same.carried and same.detail["search_starts_last_night"] == {"none": 1, key: 1}
    assert same.detail["gain_last_night"] == round(10.0 / 6.0, 4)
    slower = _carry.judge(spec, last, [T(NONE, "baseline", 10.0), T(key, "search", 7.5, 3.0)], k, nights_before=0)
    assert not slower.carried and "differs" in slower.reason
    moved = _carry.judge(spec, last, [T(NONE, "baseline", 10.0), T(key, "search", 6.0, 3.6)], k, nights_before=0)
    assert not moved.carried and "acceptance moved" in moved.reason
    # a guard-failing start tonight is no evidence
    bad = T(key, "search", 6.0, 3.0)
    bad.constraints = {"equivalence": 0.5}
    assert "no feasible start" in _carry.judge(spec, last, [T(NONE, "baseline", 10.0), bad], k, nights_before=0).reason
    # no noise figure and one start each last night: nothing to tell a change from noise with
    bare = make_spec_stub()
    one = [T(NONE, "baseline", 10.0), T(key, "search", 6.0, 3.0)]
    assert "no start-to-start noise" in _carry.judge(bare, one, one, k, nights_before=0).reason


def make_spec_stub(**objective):
    import tempfile
    from pathlib import Path

    return make_spec(Path(tempfile.mkdtemp()), objective=objective)
