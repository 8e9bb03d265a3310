"""autotune: tune vLLM speculative decoding per workload on replayed production traffic.

Data flows one way: traffic -> replay set -> trials (engine + replay + measure) -> study ->
recommendation. Implementation lives in private ``_module.py`` files; this is the public API.
"""

from ._engine import ServerStartError, VllmServer, build_argv
from ._measure import RatioCI, bootstrap_ratio_ci, detect_stall, summarize
from ._probe import Capabilities, probe
from ._recommend import Decision, decide
from ._replayset import ReplayRequest, ReplaySet, ReplaySetError
from ._settings import Settings, get_settings
from ._space import SearchSpace
from ._spec import SpecError, StudySpec, load_spec
from ._study import Study, StudyOutcome

__version__ = "0.1.0"

__all__ = [
    "Capabilities", "Decision", "RatioCI", "ReplayRequest", "ReplaySet", "ReplaySetError", "SearchSpace",
    "ServerStartError", "Settings", "SpecError", "Study", "StudyOutcome", "StudySpec", "VllmServer",
    "bootstrap_ratio_ci", "build_argv", "decide", "detect_stall", "get_settings", "load_spec", "probe", "summarize",
]
