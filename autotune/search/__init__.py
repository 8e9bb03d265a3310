"""Stage 4, search: the search space, the trial (one server start + replay + measurement),
the TPOT predictor, per-batch-size bands, and the Optuna study that spends server starts.

May import: ``core``, ``traffic``, ``replay``, ``engines``.
"""

from autotune.search._record import StudyRecord, TrialRecord, read_study, study_record, trial_record

__all__ = ["StudyRecord", "TrialRecord", "read_study", "study_record", "trial_record"]
