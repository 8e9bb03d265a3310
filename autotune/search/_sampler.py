"""The search step as an Optuna sampler: each trial of ``study.optimize`` is one whole configuration.

``CandidateSampler`` proposes configurations of the space (``_search.enumerate_candidates``):

- ``predictor`` (default): ``_policy.next_step`` picks each next server start from what the
  measured trials predict for the configurations never started, and decides when to stop: no
  candidate is likely to beat the best by more than ``objective.search_tolerance`` (3%; the
  measured noise widens what "likely" means, it is not the margin). With ``search_repeats`` a
  measured configuration may be started again (a search trial with ``repeat``, its own claim). Every trial it
  proposes records its prediction (``predicted_tpot_ms``, ``predicted_ci``, ``predicted_basis``),
  so the predictor's error on configurations it had not seen is on record; the latest table of
  predictions is the study's ``predictor`` user attribute (for ``autotune report``). With too
  little data (no per-position counters) it hands every later trial to Optuna's TPE.
- ``grid``: every candidate in order; ``random``: every candidate in a seeded random order: the
  references the search benchmark compares with.

The decision to stop ends the optimization through Optuna itself: the trial that receives a
``stop`` proposal calls ``study.stop()`` and is pruned before any server starts (``Study.objective``).
Everything the sampler reads comes from the study's storage, so it works with any Optuna storage,
with several workers (each proposes from the shared trials; claims stop two workers measuring the
same configuration), and the study shows in optuna-dashboard like any other.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field

import optuna
from optuna.samplers import BaseSampler
from optuna.trial import TrialState

from autotune.search import _bands, _observations, _policy
from autotune.search._record import config_key_of
from autotune.search._search import enumerate_candidates, failed_keys, study_weights
from autotune.search._space import NONE, SearchSpace, canonical, label, params_of

log = logging.getLogger(__name__)

MODES = ("predictor", "grid", "random")


@dataclass
class Proposal:
    """What the sampler proposes for one trial."""

    action: str
    """``measure`` or ``stop``."""
    params: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)
    """user attributes for the trial (search reason, prediction, ``bands``)."""
    reason: str = ""


class CandidateSampler(BaseSampler):
    """Proposes one configuration of the space per trial (see the module docstring).

    ``fallback``: the sampler every later trial is handed to when the predictor has too little
    data (Optuna's TPE by default). Enqueued trials (baseline, incumbent, each method at its
    largest K, confirmations) keep their fixed parameters and are not proposed here.
    """

    def __init__(self, spec, space: SearchSpace, *, mode: str = "predictor", bands_max_batch: int | None = None,
                 fallback: BaseSampler | None = None, notes: list[str] | None = None):
        if mode not in MODES:
            raise ValueError(f"objective.search: {mode!r} is not one of {', '.join(MODES)}")
        self.spec, self.space, self.mode = spec, space, mode
        self.cands = enumerate_candidates(space)
        if mode == "random":
            random.Random(spec.seed).shuffle(self.cands)
        self.weights = study_weights(spec)
        self.level = int(spec.replay.concurrency)
        self.bands_max_batch = bands_max_batch
        self.fallback = fallback or optuna.samplers.TPESampler(seed=spec.seed, n_startup_trials=4)
        self.notes = notes if notes is not None else []
        self.fallen_back = False
        self.stopped_because = ""
        sn = spec.objective.start_noise
        sp = sn.for_class("speculative") if sn is not None else None
        self.noise_prior: tuple[float, int] | None = (sp.cv, sp.df) if sp is not None else None
        """(relative start-to-start sd, degrees of freedom) known before the study: the spec's
        recorded A/A figure for speculative configs (the candidates), or with ``set_noise_prior``
        that pooled with earlier nights."""
        tax = spec.space.bands.tax
        self.bands_tax: tuple[float, int] | None = (tax.ratio, tax.df) if tax is not None else None
        """(band schedule's step cost over plain K, degrees of freedom): ``space.bands.tax``."""
        self._proposals: dict[int, Proposal] = {}
        self._tried: set[str] = set()

    def set_noise_prior(self, sd: float, df: int) -> None:
        """The start-to-start noise known before tonight (``decide._noise.prior_noise``: the
        spec's A/A figure and earlier nights' repeats), pooled with this study's own repeats."""
        if df > 0 and sd > 0:
            self.noise_prior = (float(sd), int(df))

    def set_bands_tax_prior(self, ratio: float, df: int) -> None:
        """The bands tax measured on earlier nights (``_predict.measured_bands_tax`` of their trials),
        pooled with the spec's ``space.bands.tax`` on the log scale by degrees of freedom."""
        if df <= 0 or ratio <= 0:
            return
        if self.bands_tax is None or self.bands_tax[1] <= 0:
            self.bands_tax = (float(ratio), int(df))
            return
        r0, d0 = self.bands_tax
        n = d0 + int(df)
        self.bands_tax = (math.exp((d0 * math.log(r0) + int(df) * math.log(ratio)) / n), n)

    # ---- what Study.objective asks -----------------------------------------------------------
    def proposal(self, number: int) -> Proposal | None:
        """The proposal for trial ``number`` (None: enqueued, or handed to the fallback)."""
        return self._proposals.get(number)

    # ---- optuna.samplers.BaseSampler -----------------------------------------------------------
    def infer_relative_search_space(self, study, trial):
        return self.fallback.infer_relative_search_space(study, trial) if self.fallen_back else {}

    def sample_relative(self, study, trial, search_space):
        return self.fallback.sample_relative(study, trial, search_space) if self.fallen_back else {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        p = self._proposals.get(trial.number)
        if p is not None and param_name in p.params:
            return p.params[param_name]
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial) -> None:
        if "fixed_params" in trial.system_attrs:
            return  # enqueued: its parameters are fixed
        if not self.fallen_back:
            p = self._propose(study)
            if p is not None:
                self._proposals[trial.number] = p
                return
        self.fallback.before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:
        if self.fallen_back:
            self.fallback.after_trial(study, trial, state, values)

    # ---- proposing -------------------------------------------------------------------------------
    def _stop(self, reason: str) -> Proposal:
        self.stopped_because = reason
        return Proposal("stop", params={"method": NONE}, reason=reason)

    def _busy_keys(self, study, measured: bool = True) -> set[str]:
        """Refused, or being measured (by any worker), and with ``measured`` the measured ones:
        never proposed (again). Without ``measured``, a completed configuration may be proposed
        for another start (``objective.search_repeats``)."""
        states = (TrialState.COMPLETE, TrialState.RUNNING) if measured else (TrialState.RUNNING,)
        busy = {config_key_of(t) for t in study.get_trials(deepcopy=False, states=states)}
        done = {config_key_of(t) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
        return busy | failed_keys(study) | (self._tried if measured else self._tried - done)

    def _propose(self, study) -> Proposal | None:
        if self.mode in ("grid", "random"):
            busy = self._busy_keys(study)
            for params, cfg in self.cands:
                key = canonical(cfg)
                if key not in busy:
                    self._tried.add(key)
                    return Proposal("measure", params=params, reason=f"{self.mode}: next candidate")
            return self._stop(f"{self.mode}: every candidate was measured")
        obs = [o for o in (_observations.observation_from_trial(t, self.level) for t in study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,))) if o is not None]
        obj = self.spec.objective
        step = _policy.next_step(obs, [c for _, c in self.cands], weights=self.weights,
                                 failed=failed_keys(study), min_gain=obj.search_min_gain(),
                                 bands_max_batch=self.bands_max_batch,
                                 skip=self._busy_keys(study, measured=not obj.search_repeats),
                                 noise_prior=self.noise_prior, repeats=obj.search_repeats,
                                 bands_tax=self.bands_tax)
        _save(study, step)
        if step.action == "fallback" or (step.action == "measure" and step.config is None):
            self.notes.append(f"predictor: {step.reason}; Optuna's TPE searches instead")
            self.fallen_back = True
            return None
        if step.action == "stop":
            return self._stop(f"predictor: {step.reason}")
        cfg = step.config
        self._tried.add(canonical(cfg))
        plain = {k: v for k, v in cfg.items() if k != _bands.BANDS_KEY}
        attrs: dict = {"search_reason": step.reason}
        if step.repeat:
            attrs["repeat"] = True
        if step.prediction is not None:
            p = step.prediction
            attrs.update(predicted_tpot_ms=p.mean, predicted_ci=[p.lo, p.hi], predicted_basis=p.basis,
                         predicted_p_beat=step.p_beat,
                         predicted_per_level={str(k): list(v) for k, v in p.per_level.items()})
        if cfg.get(_bands.BANDS_KEY):
            attrs["bands"] = cfg[_bands.BANDS_KEY]
        log.info("predictor: %s (%s)", label(cfg), step.reason)
        return Proposal("measure", params=params_of(plain, self.space), attrs=attrs, reason=step.reason)


def _save(study, step) -> None:
    """The latest table of predictions, for the report (a study user attribute)."""
    try:
        study.set_user_attr("predictor", {"action": step.action, "reason": step.reason, "table": step.table})
    except Exception as e:  # the report's data must never fail a study
        log.warning("cannot record the predictor's table: %s", e)
