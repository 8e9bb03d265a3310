"""Which failure gets which exit code: the one table the runner and the command line share.

The codes themselves are ``autotune.core._exit``'s. A failure the runner foresees (bad spec, probe
failed, GPU busy, ...) is looked up in ``FORESEEN``, first match wins; anything else reaching the
command line is unforeseen: a missing optional dependency is 3, an OS error the disk or the
permissions raised on a write is 4, a bad ``AUTOTUNE__...`` setting is 2, anything else 70 (a bug).
"""

from __future__ import annotations

import errno

from pydantic import ValidationError

from autotune.core._exit import (EXIT_BUSY, EXIT_ENGINE, EXIT_FIDELITY, EXIT_INPUT, EXIT_INTERRUPTED,
                                 EXIT_SOFTWARE, EXIT_WRITE)
from autotune.core._inputs import InputError
from autotune.core._lock import LockDirError, LockHeld
from autotune.core._names import BadName
from autotune.core._settings import SettingsError
from autotune.core._store import StoreError
from autotune.engines._probe import ProbeError
from autotune.search._trial import TrialFailed
from autotune.trust._gate import FidelityFailed

#: foreseen failures, first match wins (a LockDirError is an OSError, a SpecError a ValueError)
FORESEEN: tuple[tuple[type[BaseException], int], ...] = (
    (KeyboardInterrupt, EXIT_INTERRUPTED),  # SIGTERM/SIGINT (``core._signals`` raises it for both)
    (LockHeld, EXIT_BUSY),                  # another study holds the GPU, or leads the workload
    (LockDirError, EXIT_INPUT),             # an unsafe lock folder
    (FidelityFailed, EXIT_FIDELITY),        # the replay does not reproduce production
    (StoreError, EXIT_ENGINE),              # storage malformed, driver missing, database down
    (ProbeError, EXIT_ENGINE),              # vLLM missing or unusable
    (TrialFailed, EXIT_ENGINE),             # the baseline failed
    (ValueError, EXIT_INPUT),               # spec, replay set, traffic, telemetry, setting, option
    (OSError, EXIT_WRITE),                  # a write refused: the previous files are intact
)

#: errnos that mean the disk or the permissions refused a write
WRITE_REFUSED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG,
                           errno.ELOOP, errno.EXDEV})  # the last two: a link inside autotune's folders refused


def exit_code(exc: BaseException, foreseen: bool = True) -> int:
    """The exit code of ``exc``: a failure the caller foresaw (``FORESEEN``), or, with
    ``foreseen=False``, one that reached the command line's last resort."""
    if foreseen:
        for kind, code in FORESEEN:
            if isinstance(exc, kind):
                return code
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, (InputError, BadName)):  # a FIFO, a huge file, a name with a '/' in it
        return EXIT_INPUT
    if isinstance(exc, ValidationError) and exc.title == "Settings":  # AUTOTUNE__METRICS_PORT=abc
        return EXIT_INPUT
    if isinstance(exc, SettingsError):  # AUTOTUNE__METRICS_ADDR that does not resolve
        return EXIT_INPUT
    if isinstance(exc, ImportError):  # an optional dependency the command needs is not installed
        return EXIT_ENGINE
    if isinstance(exc, OSError) and exc.filename and exc.errno in WRITE_REFUSED:
        return EXIT_WRITE
    return EXIT_SOFTWARE
