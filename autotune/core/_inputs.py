"""Every file autotune reads as input is opened here: a regular file, of a size its kind may have.

An input path is the operator's, or anyone's who can write where it points: a FIFO would block a
command forever, ``/dev/zero`` (or a link to it) would be read until memory runs out, a 50 MB
one-line spec would keep the YAML parser busy for a minute. So an input is refused at once,
never read, unless it is a regular file once links are resolved, and refused when it is larger
than its kind may be (``LIMITS``, one table). Files read line by line (traffic logs, their gzip,
pools) have no size cap but a cap on one line, decompressed (``LINE_LIMIT``), read in bounded
chunks: a gzip that inflates to one 1 GiB line costs at most one cap of memory.

``InputError`` (a ValueError, so exit 2) names the file (and the line); a missing or unreadable
file stays the ``OSError`` it was, for the caller's own message.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path
from typing import BinaryIO, Iterator

KiB = 1024
MiB = 1024 * KiB

#: the largest file of each kind (bytes): generous for real use, far below what hurts
LIMITS: dict[str, int] = {
    "study spec": 1 * MiB,            # the annotated example is 10 KiB
    "replay set": 1024 * MiB,         # prompts: thousands of long requests
    "recommendation": 16 * MiB,       # about 10 KiB; its evidence grows with the trials
    "deploy mark": 1 * MiB,
    "telemetry file": 256 * MiB,      # a bundle holds two /metrics expositions
    "storage file": 64 * KiB,         # one URL, or the systemd environment file
    "manifest": 64 * MiB,             # a replay set's or a pool's metadata (its sources)
    "model config": 16 * MiB,         # a model's config.json
    "state file": 1 * MiB,            # pidfiles, the probe cache
}
#: the longest line (decompressed) of a file read line by line: traffic logs and pools
LINE_LIMIT = 64 * MiB

_KINDS_OF_FILE = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                  (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class InputError(ValueError):
    """An input file that is not what its kind must be; the message names the file (and line)."""

    def __init__(self, path: str | Path, reason: str, line: int | None = None):
        self.path, self.line = str(path), line
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n // KiB} KiB" if n >= KiB else f"{n} bytes"


def _not_regular(path: str | Path, mode: int, kind: str) -> InputError:
    what = next((name for test, name in _KINDS_OF_FILE if test(mode)), "not a regular file")
    return InputError(path, f"is {what}, not a regular file: refused, not read (a {kind} must be a regular file)")


def open_input(path: str | Path, kind: str) -> BinaryIO:
    """``path`` opened for reading in binary, once it is known to be a regular file (links
    resolved) no larger than ``LIMITS[kind]`` (kinds missing from ``LIMITS`` have no size cap:
    read them with ``read_lines``). Never blocks on a FIFO, never reads a device."""
    st = os.stat(path)  # follows links; a missing file is the caller's FileNotFoundError
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode, kind)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)  # what was opened, should the path have changed since
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode, kind)
        _check_size(path, st.st_size, kind)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check_size(path: str | Path, size: int, kind: str) -> None:
    cap = LIMITS.get(kind)
    if cap is not None and size > cap:
        raise InputError(path, f"{size} bytes, more than a {kind} may have ({_size(cap)}): refused, not read")


def read_input(path: str | Path, kind: str) -> bytes:
    """The bytes of an input file (see ``open_input``); a file that grows past its cap while
    read is refused as well."""
    with open_input(path, kind) as fh:
        cap = LIMITS.get(kind)
        data = fh.read() if cap is None else fh.read(cap + 1)
    _check_size(path, len(data), kind)
    return data


def read_text(path: str | Path, kind: str) -> str:
    """``read_input`` decoded as UTF-8; an InputError names the line of a byte that is not."""
    raw = read_input(path, kind)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(path, f"not UTF-8 text (byte 0x{raw[e.start]:02x})",
                         line=raw[:e.start].count(b"\n") + 1) from None


def read_lines(fh: BinaryIO, path: str | Path, limit: int = LINE_LIMIT) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of every line of ``fh`` (plain or a decompressing reader), each
    read in bounded chunks: a line longer than ``limit`` is an InputError naming file and line,
    raised as soon as ``limit`` bytes of it are read."""
    i = 0
    while True:
        raw = fh.readline(limit + 1)
        if not raw:
            return
        i += 1
        if len(raw) > limit:
            raise InputError(path, f"a line longer than {_size(limit)} (decompressed): refused, read no further",
                             line=i)
        yield i, raw


def input_lines(path: str | Path, kind: str, limit: int = LINE_LIMIT) -> Iterator[tuple[int, bytes]]:
    """``read_lines`` of an input file opened with ``open_input``."""
    with open_input(path, kind) as fh:
        yield from read_lines(fh, path, limit)
