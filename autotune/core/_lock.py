"""One study at a time per GPU: an ``fcntl.flock`` on ``<lock dir>/gpu-<id>.lock``.

Two studies on one accelerator would measure each other's load, so the lock must hold across
processes (the daemon, a cron run, an engineer's ``study start``, a ``worker``), and it must not
outlive a dead holder: the kernel drops a flock when its process dies, even on ``kill -9``, so
there is no stale lock to clean up. vLLM servers never inherit the lock's descriptor (Popen
closes it), so an orphaned server cannot keep the GPU locked; the next holder reaps it instead
(see ``_recovery``). The file also says who holds it (pid, host, workload, since), for the
message a second process prints before it waits or exits (exit code 75, EX_TEMPFAIL).

The lock folder is private to the user (0700, owned by them: ``$XDG_RUNTIME_DIR/autotune``, else
``<AUTOTUNE__HOME>/locks``), and lock files are opened with ``O_NOFOLLOW`` and checked to be
regular files the user owns before anything is written to them: a folder or a symlink that
another user planted is refused (``LockDirError``), never followed. A hand-written flock rather
than ``filelock``: ``filelock`` truncates the file when it opens it, before it holds the lock,
which would erase the holder's name that a waiting process prints.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from pathlib import Path

from autotune.core._files import PRIVATE_DIR, make_dirs
from autotune.core._names import check_gpu, check_workload, child
from autotune.core._schedule import iso

EX_TEMPFAIL = 75


def default_lock_dir(home: str | Path = ".autotune") -> Path:
    """``$XDG_RUNTIME_DIR/autotune`` (per user, on tmpfs, shared by all of the user's autotune
    processes whatever their AUTOTUNE__HOME), else ``<home>/locks``. Never a predictable folder
    in a shared ``/tmp``, where another user could plant it first."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        return Path(xdg) / "autotune"
    return Path(home).resolve() / "locks"


class LockDirError(OSError):
    """The lock folder or a lock file is unsafe (not ours, open to others, a symlink) or unusable."""


def private_lock_dir(d: str | Path) -> Path:
    """Create ``d`` 0700 if missing; refuse it unless it is a real folder owned by this user,
    closed to group and others (tightened when it is ours and merely loose)."""
    d = Path(d)
    try:
        make_dirs(d.parent, PRIVATE_DIR)
        with _umask(0o077):
            d.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(d)
    except OSError as e:
        raise LockDirError(e.errno, f"lock folder {d}: cannot create it ({e.strerror}); set AUTOTUNE__LOCK_DIR "
                                    f"to a folder of your own") from None
    if not stat.S_ISDIR(st.st_mode):
        raise LockDirError(errno.ENOTDIR, f"lock folder {d} is not a folder (a symlink or a file): refused; remove "
                                          f"it or set AUTOTUNE__LOCK_DIR to a folder of your own")
    if st.st_uid != os.geteuid():
        raise LockDirError(errno.EPERM, f"lock folder {d} belongs to uid {st.st_uid}, not to you (uid "
                                        f"{os.geteuid()}): refused; set AUTOTUNE__LOCK_DIR to a folder of your own")
    if st.st_mode & 0o077:
        try:
            os.chmod(d, 0o700, follow_symlinks=False)
        except OSError as e:
            raise LockDirError(e.errno, f"lock folder {d} is open to other users and cannot be made private "
                                        f"({e.strerror})") from None
    return d


class _umask:
    def __init__(self, mask: int):
        self.mask = mask

    def __enter__(self):
        self.old = os.umask(self.mask)

    def __exit__(self, *exc):
        os.umask(self.old)


def open_lock_file(path: str | Path, private: bool = True) -> int:
    """A descriptor on the lock file ``path`` (created 0600); never through a symlink, never onto
    anything but a regular file of this user. ``private``: its folder must be a private lock
    folder (``private_lock_dir``); else (a lock beside a database, in the user's own folder) the
    folder is only created."""
    path = Path(path)
    if private:
        private_lock_dir(path.parent)
    else:
        make_dirs(path.parent, PRIVATE_DIR)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LockDirError(e.errno, f"lock file {path} is a symlink: refused (not followed)") from None
        raise LockDirError(e.errno, f"lock file {path}: cannot open it ({e.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise LockDirError(errno.EPERM, f"lock file {path} is not a regular file of yours: refused")
    return fd


class LockHeld(RuntimeError):
    """The lock is held by another process; ``holder`` is what it wrote (may be {})."""

    def __init__(self, path: Path, holder: dict):
        self.path, self.holder = path, holder
        who = (f"pid {holder.get('pid')} on {holder.get('host')}, {holder.get('what', '?')}, "
               f"since {holder.get('since')}") if holder else "another process"
        super().__init__(f"{path} is held by {who}")


class FileLock:
    """An exclusive flock with holder info. Not reentrant; one instance per acquisition."""

    def __init__(self, path: str | Path, private: bool = True):
        self.path = Path(path)
        self.private = private
        self._fd: int | None = None

    def acquire(self, what: str, wait: bool = False, timeout_s: float | None = None,
                poll_s: float = 0.5, on_wait=None, **info) -> "FileLock":
        """Take the lock. Not waiting: raise LockHeld at once. Waiting: poll (so SIGTERM still
        interrupts) until free or ``timeout_s``; ``on_wait(holder)`` is called once first.
        ``info`` (JSON values) is written beside the holder's pid, host, what and since."""
        fd = open_lock_file(self.path, self.private)
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
        data = json.dumps({**info, "pid": os.getpid(), "host": socket.gethostname(), "what": what, "since": iso()})
        os.ftruncate(fd, 0)
        os.pwrite(fd, data.encode() + b"\n", 0)
        return self

    def holder(self) -> dict:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return {}
        try:
            data = json.loads(os.read(fd, 65536) or b"{}")
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}
        finally:
            os.close(fd)

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
    return child(lock_dir, f"gpu-{check_gpu(gpu)}.lock")


def lead_lock_path(lock_dir: str | Path, workload: str) -> Path:
    """Held by the run that leads a workload's study (confirms, decides, writes the recommendation):
    on two GPUs, the second `study start` of one workload exits 75 instead of leading it too."""
    return child(lock_dir, f"lead-{check_workload(workload)}.lock")


def daemon_lock_path(lock_dir: str | Path, gpu: str) -> Path:
    return child(lock_dir, f"daemon-gpu-{check_gpu(gpu)}.lock")


def servers_dir(lock_dir: str | Path, gpu: str) -> Path:
    """Pidfiles of the vLLM servers started under this GPU's lock (see ``_recovery``)."""
    return child(lock_dir, f"gpu-{check_gpu(gpu)}.servers")
