"""One study at a time per GPU: an ``fcntl.flock`` on ``<lock dir>/gpu-<id>.lock``.

Two studies on one accelerator would measure each other's load, so the lock must hold across
processes (the daemon, a cron run, an engineer's ``study start``, a ``worker``), and it must not
outlive a dead holder: the kernel drops a flock when its process dies, even on ``kill -9``, so
there is no stale lock to clean up. vLLM servers never inherit the lock's descriptor (Popen
closes it), so an orphaned server cannot keep the GPU locked; the next holder reaps it instead
(see ``_recovery``). The file also says who holds it (pid, host, workload, since), for the
message a second process prints before it waits or exits (exit code 75, EX_TEMPFAIL).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from autotune.core._schedule import iso

EX_TEMPFAIL = 75


def default_lock_dir() -> Path:
    """Shared by every autotune on the host (whatever its AUTOTUNE__HOME), so they exclude each other."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / "autotune-locks"


class LockHeld(RuntimeError):
    """The lock is held by another process; ``holder`` is what it wrote (may be {})."""

    def __init__(self, path: Path, holder: dict):
        self.path, self.holder = path, holder
        who = (f"pid {holder.get('pid')} on {holder.get('host')}, {holder.get('what', '?')}, "
               f"since {holder.get('since')}") if holder else "another process"
        super().__init__(f"{path} is held by {who}")


class FileLock:
    """An exclusive flock with holder info. Not reentrant; one instance per acquisition."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, what: str, wait: bool = False, timeout_s: float | None = None,
                poll_s: float = 0.5, on_wait=None) -> "FileLock":
        """Take the lock. Not waiting: raise LockHeld at once. Waiting: poll (so SIGTERM still
        interrupts) until free or ``timeout_s``; ``on_wait(holder)`` is called once first."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        told = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder = self.holder()
                    if not wait or (deadline is not None and time.monotonic() >= deadline):
                        raise LockHeld(self.path, holder) from None
                    if not told and on_wait:
                        on_wait(holder)
                        told = True
                    time.sleep(poll_s)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "what": what, "since": iso()})
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode() + b"\n", 0)
        return self

    def holder(self) -> dict:
        try:
            return json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "FileLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def gpu_lock_path(lock_dir: str | Path, gpu: str) -> Path:
    return Path(lock_dir) / f"gpu-{gpu}.lock"


def daemon_lock_path(lock_dir: str | Path, gpu: str) -> Path:
    return Path(lock_dir) / f"daemon-gpu-{gpu}.lock"


def servers_dir(lock_dir: str | Path, gpu: str) -> Path:
    """Pidfiles of the vLLM servers started under this GPU's lock (see ``_recovery``)."""
    return Path(lock_dir) / f"gpu-{gpu}.servers"
