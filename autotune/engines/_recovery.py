"""What a restart cleans up after a process that died without cleaning up (``kill -9``, OOM).

1. Orphaned vLLM servers. ``vllm serve`` runs in its own session (so that stopping it can kill
   the whole group), which also means it outlives a killed parent and keeps the GPU busy. Each
   server therefore leaves a pidfile under the GPU's lock dir (pgid, port, owner pid and start
   time, and a random token put in the server's environment). Whoever takes the GPU lock next
   kills every group whose owner is gone, after checking, through the token in
   ``/proc/<pid>/environ``, that the group still is that server and not a recycled pid.
2. Trials left RUNNING: ``autotune.search._recovery`` (trials are the search's), which asks
   ``owner_alive`` here whether a trial's process still runs.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from pathlib import Path

from autotune.core._files import PRIVATE, write_json
from autotune.core._inputs import read_input

log = logging.getLogger(__name__)

TOKEN_ENV = "AUTOTUNE_SERVER_TOKEN"


# ---- processes ----------------------------------------------------------------------------
def proc_start_time(pid: int) -> int | None:
    """Kernel start time of ``pid`` (clock ticks since boot), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def process_identity() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": proc_start_time(os.getpid())}


def owner_alive(owner: dict) -> bool:
    """Whether the process described by ``process_identity()`` still runs (same host only)."""
    pid = owner.get("pid")
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    start = owner.get("start")
    return start is None or proc_start_time(int(pid)) in (None, start)


def group_members(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
            out.append(int(d.name))
    return out


def _has_token(pid: int, token: str) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{TOKEN_ENV}={token}".encode() in env.split(b"\0")


def kill_group(pgid: int, grace_s: float = 10.0) -> None:
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not group_members(pgid):
                return
            time.sleep(0.2)


# ---- server pidfiles --------------------------------------------------------------------
def write_pidfile(pid_dir: Path, pgid: int, port: int, token: str, argv: list[str], log_path: Path) -> Path:
    return write_json(pid_dir / f"{pgid}.json",
                      {"pgid": pgid, "port": port, "token": token, "owner": process_identity(),
                       "argv0": argv[0], "log_path": str(log_path), "started": time.time()}, PRIVATE)


def reap_orphans(pid_dir: Path) -> list[dict]:
    """Kill the servers whose autotune process is gone; returns what was reaped."""
    reaped = []
    if not pid_dir.is_dir():
        return reaped
    for p in sorted(pid_dir.glob("*.json")):
        try:
            info = json.loads(read_input(p, "state file"))
        except (OSError, ValueError):
            p.unlink(missing_ok=True)
            continue
        owner = info.get("owner") or {}
        if owner.get("host") == socket.gethostname() and owner_alive(owner):
            continue  # its owner still runs and will stop it
        pgid = int(info["pgid"])
        members = [pid for pid in group_members(pgid) if _has_token(pid, info.get("token", ""))]
        if members:
            log.warning("killing orphaned vllm serve (pgid %s, port %s) left by dead pid %s",
                        pgid, info.get("port"), owner.get("pid"))
            kill_group(pgid)
            reaped.append(info)
        p.unlink(missing_ok=True)
    return reaped
