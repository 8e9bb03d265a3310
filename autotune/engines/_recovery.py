"""What a restart cleans up after a process that died without cleaning up (``kill -9``, OOM).

1. Orphaned vLLM servers. ``vllm serve`` runs in its own session (so that stopping it can kill
   the whole group), which also means it outlives a killed parent and keeps the GPU busy. Each
   server therefore leaves a pidfile under the GPU's lock dir (pgid, port, owner pid and start
   time, and a random token put in the server's environment). Whoever takes the GPU lock next
   kills every group whose owner is gone, after checking, through the token in
   ``/proc/<pid>/environ``, that the group still is that server and not a recycled pid.
2. Trials left RUNNING. A trial whose owner process on this host is gone (or, on any host,
   whose Optuna heartbeat is older than the grace period) is marked FAIL with the reason, and
   re-enqueued once (Optuna's RetryHeartbeatStaleTrialCallback shape), so a resumed study neither
   loses it nor measures a finished one twice.
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
            info = json.loads(p.read_text())
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


# ---- trials -------------------------------------------------------------------------------
def trial_id(study, storage, number: int, study_id: int | None = None) -> int:
    """The storage's id of trial ``number`` of ``study`` (public storage API)."""
    if study_id is None:
        study_id = storage.get_study_id_from_name(study.study_name)
    return storage.get_trial_id_from_study_id_trial_number(study_id, number)


def stale_trial_ids(study, storage) -> set[int]:
    """Ids of RUNNING trials whose heartbeat is older than the storage's grace period.

    Optuna has no public call that lists them without failing them first (``fail_stale_trials``
    sets FAIL before any reason can be recorded), so this is ``RDBStorage._get_stale_trial_ids``:
    pyproject.toml pins the Optuna range it is tested with (tests/test_recovery.py)."""
    interval = getattr(storage, "get_heartbeat_interval", None)
    if interval is None or interval() is None:
        return set()  # no heartbeats (or a storage without them): only the same-host check applies
    return set(storage._get_stale_trial_ids(storage.get_study_id_from_name(study.study_name)))


def recover_trials(study, storage, on_failed=None) -> list[int]:
    """Fail RUNNING trials whose process is gone; re-enqueue each once. Returns their numbers."""
    import optuna
    from optuna.trial import TrialState

    me = socket.gethostname()
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if not running:
        return []
    stale = stale_trial_ids(study, storage)
    study_id = storage.get_study_id_from_name(study.study_name)
    done = []
    for t in running:
        owner = t.user_attrs.get("owner") or {}
        local_dead = owner.get("host") == me and not owner_alive(owner)
        tid = trial_id(study, storage, t.number, study_id)
        if not (local_dead or tid in stale):
            continue
        why = ("its autotune process" + (f" (pid {owner.get('pid')} on {owner.get('host')})" if owner else "")
               + (" died" if local_dead else " stopped sending heartbeats"))
        reason = f"interrupted: {why} during the trial; retried"
        try:
            storage.set_trial_user_attr(tid, "error", reason)
            storage.set_trial_user_attr(tid, "interrupted", True)
            if not storage.set_trial_state_values(tid, state=TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another process recovered it first
        retry(study, storage.get_trial(tid))
        done.append(t.number)
        if on_failed:
            on_failed(storage.get_trial(tid))
    return done


_KEEP_ON_RETRY = ("role", "config_key", "claim_key")


def retry(study, failed, max_retry: int = 2) -> None:
    """Enqueue the failed trial again, as Optuna's RetryHeartbeatStaleTrialCallback does, but with
    only the attributes that say what to run (not the dead attempt's error or measurement)."""
    import optuna

    history = [*failed.system_attrs.get("retry_history", []), failed.number]
    if len(history) > max_retry:
        return
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.WAITING, params=failed.params, distributions=failed.distributions,
        user_attrs={**{k: failed.user_attrs[k] for k in _KEEP_ON_RETRY if k in failed.user_attrs},
                    "retry_of": failed.number},
        system_attrs={**({"fixed_params": failed.system_attrs["fixed_params"]}
                         if "fixed_params" in failed.system_attrs else {}),
                      "failed_trial": history[0], "retry_history": history}))


class StaleTrialCallback:
    """For RDBStorage(heartbeat_stale_trial_callback=...): Optuna's own fail_stale_trials (run by
    every worker before each trial) has already set FAIL; enqueue the retry and record it."""

    def __init__(self, on_failed=None):
        self.on_failed = on_failed

    def __call__(self, study, trial) -> None:
        retry(study, trial)
        if self.on_failed:
            self.on_failed(trial)
