"""autotune: tune vLLM speculative decoding per workload on replayed production traffic.

Data flows one way: traffic -> replay set -> trials (engine + replay + measure) -> study ->
recommendation. Implementation lives in private ``_module.py`` files; this is the public API.
"""

import importlib

#: the public API, each name from its private module: imported on first use, so that
#: ``import autotune`` (and ``autotune --help``) loads neither Optuna nor the engines
_EXPORTS = {
    "RatioCI": "autotune.core._measure", "bootstrap_ratio_ci": "autotune.core._measure",
    "detect_stall": "autotune.core._measure", "summarize": "autotune.core._measure",
    "Settings": "autotune.core._settings", "get_settings": "autotune.core._settings",
    "SpecError": "autotune.core._spec", "StudySpec": "autotune.core._spec", "load_spec": "autotune.core._spec",
    "MethodEntry": "autotune.core._spec",
    "Decision": "autotune.decide._decision", "decide": "autotune.decide._decision",
    "ServerStartError": "autotune.engines._engine", "VllmServer": "autotune.engines._engine",
    "build_argv": "autotune.engines._engine",
    "Capabilities": "autotune.engines._probe", "probe": "autotune.engines._probe",
    "Pause": "autotune.search._budget", "SearchSpace": "autotune.search._space",
    "StudyRecord": "autotune.search._record", "TrialRecord": "autotune.search._record",
    "read_study": "autotune.search._record", "study_record": "autotune.search._record",
    "Study": "autotune.search._study", "StudyOutcome": "autotune.search._study",
    "ReplayRequest": "autotune.traffic._replayset", "ReplaySet": "autotune.traffic._replayset",
    "ReplaySetError": "autotune.traffic._replayset",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__version__ = "0.1.0"

__all__ = [
    "Capabilities", "Decision", "MethodEntry", "Pause", "RatioCI", "ReplayRequest", "ReplaySet", "ReplaySetError", "SearchSpace",
    "ServerStartError", "Settings", "SpecError", "Study", "StudyOutcome", "StudyRecord", "StudySpec", "TrialRecord",
    "VllmServer", "bootstrap_ratio_ci", "build_argv", "decide", "detect_stall", "get_settings", "load_spec", "probe",
    "read_study", "study_record", "summarize",
]
