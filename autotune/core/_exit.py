"""autotune's exit codes: stable, because cron, systemd and the daemon read them.

The codes live here, at the bottom of the pipeline, so that every stage and the command line
name them alike; which failure gets which code is ``autotune.ops._exit.exit_code``.
"""

from __future__ import annotations

from autotune.core._lock import EX_TEMPFAIL

EXIT_OK = 0
EXIT_FLAG = 1
"""`drift check`'s "retune needed" and `recommend check`'s "large gap", nothing else."""
EXIT_INPUT = 2
"""Bad input: spec, replay set, traffic, model path, option, setting, a field this vLLM lacks."""
EXIT_ENGINE = 3
"""Engine or database unusable: vLLM missing, probe or baseline failed, storage unreachable."""
EXIT_WRITE = 4
"""Not writable (full disk, read-only folder): the previous files are intact."""
EXIT_FIDELITY = 5
"""The replay does not reproduce production (fidelity gate): no recommendation written."""
EXIT_SOFTWARE = 70
"""EX_SOFTWARE: an error autotune has no message for (a bug; ``-vv`` prints the traceback)."""
EXIT_BUSY = EX_TEMPFAIL
"""75, EX_TEMPFAIL: another study holds this GPU, or leads this workload's study."""
EXIT_INTERRUPTED = 130
"""SIGTERM/SIGINT: the running server stopped, the running trial failed; a rerun resumes."""
