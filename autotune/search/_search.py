"""What the search step (``objective.search``) works on: every candidate configuration of the
space, the traffic weights of the concurrency levels, the configurations vLLM refused, and the
concurrency profile that band schedules need. The samplers that walk them are in ``_sampler``.
"""

from __future__ import annotations

import logging

from autotune.search import _bands
from autotune.search._record import config_key_of, error_of, interrupted
from autotune.search._space import SearchSpace

log = logging.getLogger(__name__)


def enumerate_candidates(space: SearchSpace) -> list[tuple[dict, dict]]:
    """(Optuna params, speculative config) of every candidate of the space but the baseline:
    per method, per knob combination (ngram window, suffix options, drafter, an entry's knobs:
    ``SearchSpace.knob_combinations``), K ascending."""
    out = []
    for m in space.methods:
        kr = space.spec.k_range(m)
        for knob in space.knob_combinations(m):
            for k in range(kr.min, kr.max + 1):
                params = {"method": m, f"{m}.k": k, **knob}
                out.append((params, space.config_from_params(params)))
    return out


def study_weights(spec) -> dict[int, float]:
    if spec.replay.mode == "profile" and spec.replay.levels:
        return spec.replay.weights()
    return {int(spec.replay.concurrency): 1.0}


def failed_keys(study) -> set[str]:
    """Configurations vLLM refused or crashed on (not interrupted ones) in an Optuna study:
    never proposed again."""
    return {config_key_of(t) for t in study.get_trials(deepcopy=False)
            if t.state.name == "FAIL" and error_of(t) and not interrupted(t)}


def with_profile(spec, replay_set, notes: list[str]):
    """Bands need each concurrency level measured: when ``space.bands`` is enabled and the spec
    does not set ``replay.mode: profile``, derive the levels and weights from the replay set's
    arrival times (``_bands.levels_from_traffic``, with ``space.bands.tpot_ms``)."""
    b = spec.space.bands
    if not b.enabled or spec.replay.mode == "profile":
        return spec
    if b.tpot_ms is None:
        notes.append("bands: enabled, but neither replay.mode: profile nor space.bands.tpot_ms is set; "
                     "no bands searched")
        return spec
    try:
        levels, weights = _bands.levels_from_traffic(replay_set.requests, b.tpot_ms, b.max_levels,
                                                     max_batch=spec.engine.serve_args.get("max_num_seqs"))
    except ValueError as e:
        notes.append(f"bands: {e}; no bands searched")
        return spec
    if len(levels) < 2:
        notes.append(f"bands: the traffic runs at one concurrency ({levels[0]}); no bands searched")
        return spec
    notes.append("bands: concurrency profile from the traffic: " +
                 ", ".join(f"{lv} ({w:.0%})" for lv, w in zip(levels, weights)))
    replay = spec.replay.model_copy(update={"mode": "profile", "levels": levels, "level_weights": weights})
    return spec.model_copy(update={"replay": replay})
