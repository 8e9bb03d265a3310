"""Names that become file names: a workload (``recommendations/<workload>.json``, its history
folder, its traffic pool, its lead lock) and a GPU id (``gpu-<id>.lock``).

A name reaches autotune from the command line, a spec, a recommendation file's own fields, a
traffic log's tag or a setting; one with a ``/`` or a ``..`` would steer a read or a write out of
its folder (``recommend mark-deployed`` wrote ``../outside/pwned.deployed.json`` when the file's
``workload`` field said so). Each is checked here, once, where it enters; ``child`` checks again,
on the resolved path, right before a path under a folder is used.
"""

from __future__ import annotations

import re
from pathlib import Path

MAX_NAME = 64
MAX_STUDY_NAME = 128  # autotune-<workload>-<fingerprint>
_WORKLOAD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_GPU = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:,-]*")


def _rule(longest: int) -> str:
    return f"letters, digits, '_', '.' and '-', starting with a letter or digit, at most {longest} characters, no '..'"


WORKLOAD_RULE = _rule(MAX_NAME)
GPU_RULE = (f"a device index or UUID: letters, digits, '_', '.', ':', ',' and '-', at most {MAX_NAME} "
            "characters, no '..'")


class BadName(ValueError):
    """A workload, study or GPU name that could not be a file name (exit 2, like any bad input)."""


def _ok(rx: re.Pattern, name, longest: int = MAX_NAME) -> bool:
    return isinstance(name, str) and len(name) <= longest and rx.fullmatch(name) is not None and ".." not in name


def workload_problem(name) -> str | None:
    """Why ``name`` is no workload name (None: it is one)."""
    return None if _ok(_WORKLOAD, name) else f"{name!r} is not a workload name ({WORKLOAD_RULE})"


def study_name_problem(name) -> str | None:
    """Why ``name`` is no study name (it names the study's log folder); None: it is one."""
    return None if _ok(_WORKLOAD, name, MAX_STUDY_NAME) else (
        f"{name!r} is not a study name ({_rule(MAX_STUDY_NAME)})")


def check_workload(name, where: str | None = None) -> str:
    """``name`` if it is a workload name, else BadName (naming ``where`` it came from)."""
    problem = workload_problem(name)
    if problem:
        raise BadName(f"{where}: {problem}" if where else problem)
    return name


def check_gpu(gpu, where: str | None = None) -> str:
    """``gpu`` if it can name a lock file, else BadName (naming ``where`` it came from)."""
    gpu = str(gpu) if isinstance(gpu, int) and not isinstance(gpu, bool) else gpu
    if not _ok(_GPU, gpu):
        problem = f"{gpu!r} is not a GPU id ({GPU_RULE})"
        raise BadName(f"{where}: {problem}" if where else problem)
    return gpu


def child(folder: str | Path, name: str) -> Path:
    """``folder / name``, once its folder (links resolved) is known to be ``folder`` or one inside
    it: the last check before a read or a write of a path built from a name. The file itself may
    be a link (a write replaces it, never follows it)."""
    folder = Path(folder)
    path = folder / name
    base, parent = folder.resolve(), path.parent.resolve()
    if path.name in ("", ".", "..") or (parent != base and base not in parent.parents):
        raise BadName(f"{path}: outside {folder}: refused")
    return path
