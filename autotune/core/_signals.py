"""SIGTERM and SIGINT become one ``Interrupted`` exception, raised once, in the main thread.

Why an exception and not a flag: a trial can be anywhere when systemd stops the daemon
(waiting for /health, inside the replay's event loop, in a database call), and every one of
those places already cleans up on an exception: ``VllmServer`` kills its process group,
``measure`` stops the server in ``finally``, the objective marks the trial failed with the
reason, Optuna records the FAIL state. Only the first signal raises; later ones are ignored so
that the cleanup they would interrupt (stopping vLLM) runs to the end.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager


class Interrupted(KeyboardInterrupt):
    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame


class StopState:
    signame: str | None = None

    @property
    def requested(self) -> bool:
        return self.signame is not None


@contextmanager
def graceful_stop(state: StopState | None = None):
    """Within the block, SIGTERM/SIGINT raise ``Interrupted`` once; handlers restored after.
    Pass the daemon's ``state`` to share "a stop was requested" with nested blocks."""
    state = state or StopState()

    def handler(signum, frame):
        if state.signame is not None:
            return
        state.signame = signal.Signals(signum).name
        raise Interrupted(state.signame)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield state
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def signame_of(exc: BaseException) -> str:
    return getattr(exc, "signame", None) or "SIGINT"
