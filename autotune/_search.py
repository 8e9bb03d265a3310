"""The search step of a study (``objective.search``), after the baseline and each method at K_max.

- ``predictor`` (default): ``_predict.next_step`` picks each next server start from what the
  measured trials predict for the configurations never started, and stops the search when no
  candidate is likely to beat the best by more than the measurement noise. Every trial it
  starts records its prediction (``predicted_tpot_ms``, ``predicted_ci``, ``predicted_basis``),
  so the predictor's error on configurations it had not seen is on record; the final table of
  predictions is the study's ``predictor`` user attribute (for ``autotune report``). With too
  little data (no per-position counters) it hands over to TPE.
- ``grid``: every candidate in order; ``random``: every candidate in a seeded random order
  (both until the budget ends): the references the search benchmark compares with.
- ``tpe``: Optuna's TPE sampler (``Study.run`` itself).
"""

from __future__ import annotations

import itertools
import logging
import random

from . import _bands, _predict
from ._space import SearchSpace, canonical

log = logging.getLogger(__name__)


def enumerate_candidates(space: SearchSpace) -> list[tuple[dict, dict]]:
    """(Optuna params, speculative config) of every candidate of the space but the baseline:
    per method, per knob combination (ngram window, suffix options, draft model, EAGLE head), K
    ascending."""
    out = []
    for m in space.methods:
        kr = space.spec.k_range(m)
        if m == "ngram":
            knobs = [{"ngram.window": w} for w in space._ngram_windows()]
        elif m == "suffix":
            s = space.spec.suffix
            knobs = [{"suffix.max_tree_depth": d, "suffix.max_spec_factor": f, "suffix.min_token_prob": p}
                     for d, f, p in itertools.product(s.max_tree_depth, s.max_spec_factor, s.min_token_prob)]
        elif m == "draft_model":
            knobs = [{"draft_model.model": d} for d in space.spec.draft_models]
        elif m in ("eagle", "eagle3"):
            knobs = [{f"{m}.model": h} for h in space.spec.eagle_heads]
        else:
            knobs = [{}]
        for knob in knobs:
            for k in range(kr.min, kr.max + 1):
                params = {"method": m, f"{m}.k": k, **knob}
                out.append((params, space.config_from_params(params)))
    return out


def study_weights(spec) -> dict[int, float]:
    if spec.replay.mode == "profile" and spec.replay.levels:
        return spec.replay.weights()
    return {int(spec.replay.concurrency): 1.0}


def observations(study) -> list[_predict.Observation]:
    level = int(study.spec.replay.concurrency)
    out = []
    for t in study.trials():
        o = _predict.observation_from_trial(t, level)
        if o is not None:
            out.append(o)
    return out


def failed_keys(study) -> set[str]:
    """Configurations vLLM refused or crashed on (not interrupted ones): never proposed again."""
    return {t.user_attrs.get("config_key") for t in study.study.get_trials(deepcopy=False)
            if t.state.name == "FAIL" and t.user_attrs.get("error") and not t.user_attrs.get("interrupted")}


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


def drive(study, reserve: int) -> bool:
    """Run the spec's search; False hands over to ``Study.run``'s knee + TPE steps."""
    from ._study import ROLE_SEARCH, _params_of

    spec = study.spec
    mode = spec.objective.search
    if mode == "tpe":
        return False
    cands = enumerate_candidates(study.space)
    if mode in ("grid", "random"):
        order = list(cands)
        if mode == "random":
            random.Random(spec.seed).shuffle(order)
        for params, cfg in order:
            if study._budget_left(reserve):
                break
            key = canonical(cfg)
            if not study.trials(config_key=key) and key not in failed_keys(study):
                study._run_enqueued(params, ROLE_SEARCH)
        return True
    weights = study_weights(spec)
    max_batch = None
    if spec.space.bands.enabled and len(weights) >= 2:
        if study.caps.supports_bands():
            max_batch = int(spec.engine.serve_args.get("max_num_seqs") or 256)
        else:
            study.notes.append(f"bands: vLLM {study.caps.version} has no num_speculative_tokens_per_batch_size")
    tried: set[str] = set()
    while True:
        if study._budget_left(reserve):
            return True
        step = _predict.next_step(observations(study), [c for _, c in cands], weights=weights,
                                  failed=failed_keys(study), min_gain=spec.objective.min_gain,
                                  bands_max_batch=max_batch, skip=tried)
        _save(study, step)
        if step.action == "fallback" or (step.action == "measure" and step.config is None):
            study.notes.append(f"predictor: {step.reason}; Optuna's TPE searches instead")
            return False
        if step.action == "stop":
            study.stopped_because = f"predictor: {step.reason}"
            return True
        cfg = step.config
        tried.add(canonical(cfg))
        plain = {k: v for k, v in cfg.items() if k != _bands.BANDS_KEY}
        attrs: dict = {"search_reason": step.reason}
        if step.prediction is not None:
            p = step.prediction
            attrs.update(predicted_tpot_ms=p.mean, predicted_ci=[p.lo, p.hi], predicted_basis=p.basis,
                         predicted_p_beat=step.p_beat,
                         predicted_per_level={str(k): list(v) for k, v in p.per_level.items()})
        if cfg.get(_bands.BANDS_KEY):
            attrs["bands"] = cfg[_bands.BANDS_KEY]
        log.info("predictor: %s (%s)", _predict.label(cfg), step.reason)
        study._run_enqueued(_params_of(plain, study.space), ROLE_SEARCH, attrs=attrs)


def _save(study, step) -> None:
    """The latest table of predictions, for the report (a study user attribute)."""
    try:
        study.study.set_user_attr("predictor", {"action": step.action, "reason": step.reason,
                                                "table": step.table})
    except Exception as e:  # the report's data must never fail a study
        log.warning("cannot record the predictor's table: %s", e)
