"""Faults the hardening tests provoke: a disk that fills mid-write, and a folder the process may
not write to (as root, which may write anywhere, that takes a child that dropped to another uid)."""

from __future__ import annotations

import errno
import os
import pickle

from autotune.core import _files

NOBODY = 65534


def full_disk_after(limit: int):
    """An ``AtomicFile`` whose writes fail with ENOSPC once ``limit`` bytes went through; the
    write that crosses the limit lands half (a full disk tears the line it fails in)."""

    class FullDisk(_files.AtomicFile):
        written = 0

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            real, tmp = self.fh, self.tmp

            class Handle:
                def write(self, data):
                    room = limit - FullDisk.written
                    if len(data) > room:
                        real.write(data[:max(room, len(data) // 2)])
                        raise OSError(errno.ENOSPC, "No space left on device", str(tmp))
                    FullDisk.written += len(data)
                    return real.write(data)

                def __getattr__(self, name):
                    return getattr(real, name)

            self.fh = Handle()

    return FullDisk


def as_other_user(fn):
    """``fn()`` in a forked child that runs as an unprivileged uid when this process is root (as
    itself otherwise); returns what it returned (picklable), or re-raises what it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            result = ("ok", fn())
        except BaseException as e:  # noqa: BLE001
            result = ("raised", e)
        try:
            data = pickle.dumps(result)
        except Exception as e:  # noqa: BLE001
            data = pickle.dumps(("raised", RuntimeError(f"unpicklable result: {e}")))
        with os.fdopen(w, "wb") as fh:
            fh.write(data)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "raised":
        raise value
    return value
