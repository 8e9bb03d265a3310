"""Every file autotune writes goes through here: atomic, durable, with explicit permissions.

One guarantee for all of them: the data goes to a fresh temp file in the target's own folder,
created with the final permissions (never the umask's), is fsynced, renamed over the target, and
the folder is fsynced, so a crash or a full disk leaves either the old file or the new one, never
a torn one, and never a moment where prompt text or a credential sits in a world-readable file.

Three permission classes:
- ``PRIVATE`` (0600, folders 0700): anything that may hold prompt text or credentials: traffic
  pools and manifests, replay sets, vLLM server logs, the SQLite database, server pidfiles,
  caches.
- ``SHARED`` (0640, folders 0750): what SREs read: the recommendation file, its history copies, deploy marks,
  checks, telemetry bundles. Readable by the file's group (give the recommendations folder the
  SRE group and the setgid bit, ``chgrp sre recommendations && chmod 2750 recommendations``, and
  new files inherit it), never by everyone.
- ``PUBLIC`` (0644, folders 0755): built artefacts with nothing private in them (the demo models, their
  checksums), which another user's engine may need to read.

Every folder is made by ``make_dirs``, with its mode whatever the umask.

Files another library writes (a GGUF writer, ``save_pretrained``) are written to a temp path and
made current with ``commit_file`` / ``commit_dir``: the same fsync, rename and permissions.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import IO, Any, Callable

PRIVATE = 0o600
SHARED = 0o640
PRIVATE_DIR = 0o700
PUBLIC = 0o644
PUBLIC_DIR = 0o755
SHARED_DIR = 0o750


def dir_mode(mode: int) -> int:
    """The folder mode of a file mode: who may read a file may list its folder (0600 -> 0700,
    0640 -> 0750, 0644 -> 0755)."""
    return mode | ((mode & 0o444) >> 2)


class LinkRefused(OSError):
    """A write whose path runs through a link inside one of autotune's folders."""


def refuse_links(path: str | Path, root: str | Path) -> Path:
    """Raise :class:`LinkRefused` when a component of ``path`` below ``root`` is a symbolic link.

    autotune makes no links in its folders, so one there was put by someone else, and writing
    through it would change a file outside them (a history folder linked elsewhere received the
    next night's copies; an append through a linked checks log changed its target). ``root``
    itself may be a link: an operator may put the recommendations folder on a shared volume.
    """
    root, path = Path(root), Path(path)
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise LinkRefused(errno.EXDEV, f"not inside {root}: refused", str(path)) from None
    p = root
    for part in rel.parts:
        p = p / part
        if p.is_symlink():
            raise LinkRefused(errno.ELOOP, f"a link (to {os.readlink(p)}) inside {root}: autotune writes nothing "
                              "through a link it did not make; remove the link (the folder itself may be one)", str(p))
    return path


def make_dirs(d: str | Path, mode: int = PRIVATE_DIR) -> Path:
    """Create ``d`` and its missing parents, each with exactly ``mode`` whatever the umask (under
    umask 000 ``mkdir -p`` makes them 0777: anyone could plant a recommendation). Folders that
    exist are left as they are (a shared, setgid recommendations folder stays so); a new folder
    keeps the setgid bit it inherits, so its files keep the folder's group."""
    d = Path(d)
    missing = []
    p = d
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            os.mkdir(p, mode)  # never looser than ``mode`` (the umask only takes bits away)
        except FileExistsError:
            continue  # made meanwhile by another process: theirs to set
        os.chmod(p, mode | (os.stat(p).st_mode & stat.S_ISGID))
    if not d.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(d))
    return d


def private_dir(d: str | Path) -> Path:
    """Create ``d`` (and parents) 0700, and tighten ``d`` to 0700 when it exists looser (and is ours)."""
    d = make_dirs(d, PRIVATE_DIR)
    with contextlib.suppress(OSError):
        if os.stat(d).st_mode & 0o077:
            os.chmod(d, PRIVATE_DIR)
    return d


def fsync_dir(d: str | Path) -> None:
    """Make a rename or a new file in ``d`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems refuse fsync on a folder; the rename still happened
        if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


class AtomicFile:
    """A temp file beside ``path`` with ``mode`` permissions; ``commit()`` makes it ``path``.

    ``commit(before_replace)`` flushes and fsyncs the temp file, calls ``before_replace()`` (a
    database commit that must succeed for the new file to become current; if it raises, the old
    file stays), renames, fsyncs the folder. ``abort()`` (or any exception inside ``with``)
    removes the temp file and leaves the old file as it was.
    """

    def __init__(self, path: str | Path, mode: int, text: bool = True, root: str | Path | None = None):
        self.path = Path(path)
        self.mode = mode
        if root is not None:
            refuse_links(self.path, root)
        make_dirs(self.path.parent, dir_mode(mode))
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        self.tmp = Path(tmp)
        try:
            os.fchmod(fd, mode)  # mkstemp makes 0600; the final mode is set before any byte is written
            self.fh: IO = os.fdopen(fd, "w", encoding="utf-8") if text else os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            self.tmp.unlink(missing_ok=True)
            raise
        self.done = False

    def write(self, data) -> int:
        return self.fh.write(data)

    def stage(self) -> None:
        """Flush, fsync and close the temp file: ready to be renamed, nothing current changed."""
        if not self.fh.closed:
            self.fh.flush()
            os.fsync(self.fh.fileno())
            self.fh.close()

    def commit(self, before_replace: Callable[[], Any] | None = None) -> Path:
        try:
            self.stage()
            if before_replace is not None:
                before_replace()
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise
        self.done = True
        fsync_dir(self.path.parent)
        return self.path

    def abort(self) -> None:
        if self.done:
            return
        self.done = True
        with contextlib.suppress(OSError):
            self.fh.close()
        with contextlib.suppress(OSError):
            self.tmp.unlink()

    def __enter__(self) -> "AtomicFile":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def commit_together(files: list[AtomicFile]) -> list[Path]:
    """Make every file current, or none: several files that describe one state (the traffic
    pools of one import and their metadata) must never be left half old, half new.

    Each is staged (fsynced) first, each current file is kept under a hard link beside it, then
    the renames run; a failure among them (a full disk, an I/O error) puts the kept files back,
    removes the new ones that had no predecessor and every temp file, and re-raises."""
    kept: list[tuple[Path, Path | None]] = []
    done: list[AtomicFile] = []
    try:
        for f in files:
            f.stage()
        for f in files:
            kept.append((f.path, _keep_current(f)))
        for f in files:
            os.replace(f.tmp, f.path)
            f.done = True
            done.append(f)
    except BaseException:
        for f in reversed(done):
            old = dict(kept).get(f.path)
            with contextlib.suppress(OSError):
                if old is not None:
                    os.replace(old, f.path)
                else:
                    f.path.unlink()
        for f in files:
            f.abort()
        _drop_kept(kept)
        raise
    _drop_kept(kept)
    for d in dict.fromkeys(f.path.parent for f in files):
        fsync_dir(d)
    return [f.path for f in files]


def _keep_current(f: AtomicFile) -> Path | None:
    """A second name for ``f``'s current file (None when there is none) to restore it from."""
    if not f.path.is_file() or f.path.is_symlink():
        return None
    old = f.tmp.with_name(f.tmp.name + ".old")  # unique: the temp file's own random name
    try:
        os.link(f.path, old)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(f.path, old)  # a filesystem without hard links
    return old


def _drop_kept(kept: list[tuple[Path, Path | None]]) -> None:
    for _, old in kept:
        if old is not None:
            with contextlib.suppress(OSError):
                old.unlink()


def write_text(path: str | Path, text: str, mode: int = PRIVATE,
               before_replace: Callable[[], Any] | None = None) -> Path:
    f = AtomicFile(path, mode)
    try:
        f.write(text)
    except BaseException:
        f.abort()
        raise
    return f.commit(before_replace)


def write_bytes(path: str | Path, data: bytes, mode: int = PRIVATE) -> Path:
    f = AtomicFile(path, mode, text=False)
    try:
        f.write(data)
    except BaseException:
        f.abort()
        raise
    return f.commit()


def temp_path(path: str | Path) -> Path:
    """A fresh name beside ``path`` for a file or folder another library writes (removed first)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp)
    else:
        tmp.unlink(missing_ok=True)
    make_dirs(tmp.parent, PUBLIC_DIR)
    return tmp


def _fsync_file(p: Path, mode: int) -> None:
    fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_file(tmp: str | Path, path: str | Path, mode: int = PRIVATE) -> Path:
    """Make ``tmp`` (written by another library) ``path``: permissions, fsync, rename, folder fsync."""
    tmp, path = Path(tmp), Path(path)
    _fsync_file(tmp, mode)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path


def commit_dir(tmp: str | Path, folder: str | Path, mode: int = PRIVATE) -> Path:
    """Make the folder ``tmp`` ``folder``: each file gets ``mode`` and is fsynced, then the old
    folder (if any) is removed and ``tmp`` renamed in its place. A crash leaves the old folder,
    the new one, or none (never a torn one): a reader checks its manifest either way."""
    tmp, folder = Path(tmp), Path(folder)
    for p in tmp.rglob("*"):
        if p.is_file() and not p.is_symlink():
            _fsync_file(p, mode)
    os.chmod(tmp, PRIVATE_DIR if mode == PRIVATE else PUBLIC_DIR)
    fsync_dir(tmp)
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    fsync_dir(folder.parent)
    return folder


def write_json(path: str | Path, data: Any, mode: int = PRIVATE, *, sort_keys: bool = False,
               before_replace: Callable[[], Any] | None = None, root: str | Path | None = None) -> Path:
    """JSON (indent 2, a final newline; Paths and other objects as their str) written atomically;
    with ``root``, refused through a link below it (:func:`refuse_links`)."""
    f = AtomicFile(path, mode, root=root)
    try:
        json.dump(data, f.fh, indent=2, sort_keys=sort_keys, default=str)
        f.write("\n")
    except BaseException:
        f.abort()
        raise
    return f.commit(before_replace)


def open_append(path: str | Path, mode: int = PRIVATE, binary: bool = False,
                root: str | Path | None = None) -> IO:
    """Open for appending (a log, a JSONL of checks), creating it with ``mode``; an existing
    file with looser permissions is tightened to ``mode`` first. Never through a link: the file
    itself is opened with O_NOFOLLOW, and with ``root`` no folder below it may be one."""
    path = Path(path)
    if root is not None:
        refuse_links(path, root)
    make_dirs(path.parent, dir_mode(mode))
    fd = _open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, mode)
    try:
        if os.fstat(fd).st_mode & 0o777 & ~mode:
            os.fchmod(fd, mode)
        return os.fdopen(fd, "ab" if binary else "a", **({} if binary else {"encoding": "utf-8"}))
    except BaseException:
        os.close(fd)
        raise


def _open_nofollow(path: Path, flags: int, mode: int) -> int:
    try:
        return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), mode)
    except OSError as e:
        if e.errno == errno.ELOOP and path.is_symlink():
            raise LinkRefused(errno.ELOOP, f"a link (to {os.readlink(path)}): autotune writes nothing through a "
                              "link it did not make; remove the link", str(path)) from None
        raise


def open_new(path: str | Path, mode: int = PRIVATE) -> IO:
    """Open for writing from scratch (binary), created or truncated with ``mode`` permissions
    even when the file existed with looser ones (a vLLM server log, reopened per start)."""
    path = Path(path)
    make_dirs(path.parent, dir_mode(mode))
    fd = _open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


def ensure_private_file(path: str | Path) -> Path:
    """Create ``path`` empty with 0600 if it is missing, else tighten it to 0600 (when we own it):
    for files another library creates (the SQLite database). A missing folder is left missing
    (the library's own error then names it)."""
    path = Path(path)
    if not path.parent.is_dir():
        return path
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE)
        os.close(fd)
        fsync_dir(path.parent)
    except FileExistsError:
        with contextlib.suppress(OSError):
            if path.stat().st_mode & 0o077:
                os.chmod(path, PRIVATE)
    return path
