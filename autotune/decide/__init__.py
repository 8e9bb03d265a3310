"""Stage 5, decide: the keep / change / disable decision, the recommendation file and its
history (damping between nights). A pure function of the study's record
(``search.StudyRecord``): ``_noise`` (the statistics), ``_decision`` (the decision),
``_payload`` (the file), ``_history`` (earlier nights).

May import: every stage below (``core`` .. ``search``).
"""

from autotune.decide._decision import Decision, damp, decide, drafts_short, fmt_config, open_question, replay_provenance
from autotune.decide._noise import (CONTENDER_CHANCE, HISTORY_NIGHTS, LIKELY_FASTER, MAX_PLAN_ROUNDS, POWER_GAIN,
                                    POWER_TARGET, PRECISION, PRIOR_CHECK_P, ROLE_CONFIRM, contenders, indistinguishable,
                                    noise_class, planned_looks, prior_noise, start_log_values)
from autotune.decide._payload import (EXPIRY_DAYS, SCHEMA, build, comparison_lines, config_yaml, load,
                                      recommendation_path, serve_args_for, shape_problem, write_atomic)

__all__ = [
    "CONTENDER_CHANCE", "Decision", "EXPIRY_DAYS", "HISTORY_NIGHTS", "LIKELY_FASTER", "MAX_PLAN_ROUNDS", "POWER_GAIN", "POWER_TARGET",
    "PRECISION", "PRIOR_CHECK_P", "ROLE_CONFIRM", "SCHEMA", "build",
    "comparison_lines", "config_yaml", "contenders", "damp", "decide", "drafts_short", "fmt_config",
    "indistinguishable", "load",
    "noise_class", "open_question", "planned_looks", "prior_noise", "recommendation_path", "replay_provenance",
    "serve_args_for", "shape_problem", "start_log_values", "write_atomic",
]
