"""Stage 4, search: the search space, the trial (one server start + replay + measurement),
the TPOT predictor, per-batch-size bands, and the Optuna study that spends server starts.

May import: ``core``, ``traffic``, ``replay``, ``engines``.
"""
