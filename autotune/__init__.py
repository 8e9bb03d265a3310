"""autotune: tune vLLM speculative decoding per workload on replayed production traffic.

Data flows one way: traffic -> replay set -> trials (engine + replay + measure) -> study ->
recommendation. Implementation lives in private ``_module.py`` files; this is the public API.
"""

from autotune.core._measure import RatioCI, bootstrap_ratio_ci, detect_stall, summarize
from autotune.core._settings import Settings, get_settings
from autotune.core._spec import SpecError, StudySpec, load_spec
from autotune.decide._decision import Decision, decide
from autotune.engines._engine import ServerStartError, VllmServer, build_argv
from autotune.engines._probe import Capabilities, probe
from autotune.search._budget import Pause
from autotune.search._record import StudyRecord, TrialRecord, read_study, study_record
from autotune.search._space import SearchSpace
from autotune.search._study import Study, StudyOutcome
from autotune.traffic._replayset import ReplayRequest, ReplaySet, ReplaySetError

__version__ = "0.1.0"

__all__ = [
    "Capabilities", "Decision", "Pause", "RatioCI", "ReplayRequest", "ReplaySet", "ReplaySetError", "SearchSpace",
    "ServerStartError", "Settings", "SpecError", "Study", "StudyOutcome", "StudyRecord", "StudySpec", "TrialRecord",
    "VllmServer", "bootstrap_ratio_ci", "build_argv", "decide", "detect_stall", "get_settings", "load_spec", "probe",
    "read_study", "study_record", "summarize",
]
