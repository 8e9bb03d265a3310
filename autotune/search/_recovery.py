"""What a restart does with the trials of a process that died without cleaning up (``kill -9``, OOM).

A trial whose owner process on this host is gone (``engines._recovery.owner_alive``), or whose
run in this process has ended (``ENDED_RUNS``: a daemon's run ended by its database failing
mid-trial), or, on any host,
whose Optuna heartbeat is older than the grace period is marked FAIL with the reason, and
re-enqueued once (Optuna's RetryHeartbeatStaleTrialCallback shape), so a resumed study neither
loses it nor measures a finished one twice. The orphaned servers such a process leaves are
``engines._recovery``'s.
"""

from __future__ import annotations

import os
import socket

from autotune.engines._recovery import owner_alive
from autotune.search._record import owner_of, what_to_run


ENDED_RUNS: set[str] = set()
"""Runs of this process that ended leaving a trial of theirs RUNNING in the storage (the database
failed mid-trial, so the trial could not be failed): the process outlives them (a daemon), so
``owner_alive`` cannot tell that those trials are dead; the process's next run recovers them."""


def end_run(run_id: str) -> None:
    """Mark ``run_id`` ended: its trials still RUNNING are dead (``ENDED_RUNS``)."""
    ENDED_RUNS.add(run_id)


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
        owner = owner_of(t)
        mine = owner.get("host") == me and owner.get("pid") == os.getpid() and \
            t.user_attrs.get("run_id") in ENDED_RUNS
        local_dead = owner.get("host") == me and not owner_alive(owner)
        tid = trial_id(study, storage, t.number, study_id)
        if not (mine or local_dead or tid in stale):
            continue
        where = f" (pid {owner.get('pid')} on {owner.get('host')})" if owner else ""
        why = (f"its run in this process{where} ended" if mine else "its autotune process" + where
               + (" died" if local_dead else " stopped sending heartbeats"))
        reason = f"interrupted: {why} during the trial; retried"
        try:
            storage.set_trial_user_attr(tid, "error", reason)
            storage.set_trial_user_attr(tid, "interrupted", True)
            storage.set_trial_user_attr(tid, "process_died", True)  # its start does not count (``_budget``)
            if not storage.set_trial_state_values(tid, state=TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another process recovered it first
        retry(study, storage.get_trial(tid))
        done.append(t.number)
        if on_failed:
            on_failed(storage.get_trial(tid))
    return done


def retry(study, failed, max_retry: int = 2) -> None:
    """Enqueue the failed trial again, as Optuna's RetryHeartbeatStaleTrialCallback does, but with
    only the attributes that say what to run (not the dead attempt's error or measurement)."""
    import optuna

    history = [*failed.system_attrs.get("retry_history", []), failed.number]
    if len(history) > max_retry:
        return
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.WAITING, params=failed.params, distributions=failed.distributions,
        user_attrs={**what_to_run(failed), "retry_of": failed.number},
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
