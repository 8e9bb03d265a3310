"""Optuna glue of a study: its storage, the trials it keeps and what each trial carries.

A study lives in Optuna's RDB storage (SQLite by default) with heartbeats, so a trial whose
process stopped beating is failed and retried by whichever worker looks next (``_recovery``).
Each trial's user attributes say what it is (``role``, ``config_key``, the ``claim_key`` of what it
measures, ``owner``) and how it ended (``measurement``, ``error``, ``interrupted_by``); this module
writes them for ``_study.Study`` and reads them through ``_record``'s readers, and turns a finished trial into its row of
``autotune_trials`` (``trial_row``) for SRE reports and the exporter.
"""

from __future__ import annotations

import os
import warnings
from typing import Callable

from autotune.core._store import open_optuna_storage
from autotune.search._record import (claim_key_of, config_key_of, config_of, error_of, failed_with_error, interrupted,
                                     log_path_of, measurement_of, owner_of, role_of, run_id_of, says_config,
                                     server_starts_of, study_hardware, study_inputs, study_workload)
from autotune.search._record import stopped_by_signal  # noqa: F401 (re-exported: the budget and its tests)
from autotune.search._recovery import StaleTrialCallback, trial_id

ROLE_BASELINE, ROLE_SEARCH, ROLE_CONFIRM = "baseline", "search", "confirm"
# Optuna heartbeats: a trial whose process stopped beating for the grace period is failed and
# retried by whichever worker looks next (same-host deaths are caught at once, by pid).
HEARTBEAT_INTERVAL_S, HEARTBEAT_GRACE_S = 60, 180


def open_storage(url: str, on_failed: Callable):
    """The study's Optuna storage with heartbeats; ``on_failed``: called with each trial a
    heartbeat check fails (its process died elsewhere)."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return open_optuna_storage(
            url, heartbeat_interval=HEARTBEAT_INTERVAL_S, grace_period=HEARTBEAT_GRACE_S,
            heartbeat_stale_trial_callback=StaleTrialCallback(on_failed=on_failed))


def open_study(storage, name: str, sampler, *, hardware: str, inputs: str, workload: str, replay_digest: str,
               vllm_version: str):
    """Create or load the Optuna study ``name`` and label it: the hardware and inputs it was
    first measured on (``check_hardware`` reads them), and the workload and replay set it runs."""
    import optuna

    study = optuna.create_study(study_name=name, storage=storage, direction="minimize",
                                sampler=sampler, load_if_exists=True)
    if study_hardware(study) is None:
        study.set_user_attr("hardware", hardware)
        study.set_user_attr("inputs", inputs)
    if study_workload(study) != workload:
        study.set_user_attr("workload", workload)
        study.set_user_attr("replay_digest", replay_digest)
        study.set_user_attr("vllm_version", vllm_version)
    return study


class HardwareMismatch(ValueError):
    """A process on other hardware tried to add trials to a study: they would not be comparable."""


def check_hardware(storage, study_name: str | None, default_name: str, inputs: str, hardware: str,
                   leader: bool) -> None:
    """Refuse to pool trials from other hardware into one study (raises HardwareMismatch).

    ``study_name`` given: that study, when it exists, must have been measured on ``hardware``. A
    worker (``leader`` False) without a name looks for a study of the same inputs (``inputs``: the
    fingerprint without hardware) on other hardware: that is the study it was meant to join."""
    import optuna

    summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    if study_name:
        other = [s for s in summaries if s.study_name == study_name
                 and study_hardware(s) not in (None, hardware)]
    elif not leader and not any(s.study_name == default_name for s in summaries):
        other = [s for s in summaries if study_inputs(s) == inputs
                 and study_hardware(s) not in (None, hardware)]
    else:
        other = []
    if other:
        s = other[0]
        raise HardwareMismatch(
            f"study {s.study_name} was measured on {study_hardware(s)}, this host has {hardware}: trials from "
            f"other hardware are not pooled into one decision (TPOT on one accelerator says nothing about another); "
            f"run this host's own study (`autotune study start` without --study-name), or set AUTOTUNE__HARDWARE "
            f"if the detection is wrong")


def stored_trials(study, role: str | None = None, config_key: str | None = None, complete=True) -> list:
    """The study's trials of ``role`` and ``config_key`` (either may be None: any), COMPLETE ones
    only unless ``complete`` is False."""
    import optuna

    out = []
    for t in study.get_trials(deepcopy=False):
        if complete and t.state != optuna.trial.TrialState.COMPLETE:
            continue
        if role and role_of(t) != role:
            continue
        if config_key and config_key_of(t) != config_key:
            continue
        out.append(t)
    return out


def in_state(study, states, claim_key: str | None = None) -> list:
    """The study's trials in ``states`` that claim ``claim_key`` (any, when None)."""
    return [t for t in study.get_trials(deepcopy=False, states=states)
            if claim_key is None or claim_key_of(t) == claim_key]


def may_take_over(holder, role: str) -> bool:
    """A claim passes on when its trial (``holder``, frozen) gave up: pruned, interrupted, or
    failed. A search trial does not retry a configuration vLLM already refused (that would only
    spend a start)."""
    if holder.state.name == "PRUNED":
        return True
    if holder.state.name == "FAIL":
        return role != ROLE_SEARCH or interrupted(holder) or not failed_with_error(holder)
    return False


def failed_here(trials, config_key: str) -> bool:
    """A trial of ``config_key`` failed in this process (not by a signal's interruption)."""
    return any(config_key_of(t) == config_key and t.state.name == "FAIL"
               and owner_of(t).get("pid") == os.getpid() and not interrupted(t)
               for t in trials)


def interrupted_attrs(signame: str) -> dict:
    """What a trial stopped by the signal ``signame`` carries: the reason, and the mark that
    ``stopped_by_signal`` reads (such a start does not count against the budget)."""
    return {"error": f"interrupted by {signame}: vllm serve stopped, trial not measured", "interrupted": True,
            "interrupted_by": signame}


def fail_own_running(study, storage, signame: str, on_failed: Callable) -> None:
    """After the signal ``signame``: any trial of this process still RUNNING is failed, marked as
    stopped by it (``interrupted_attrs``); ``on_failed`` gets each one so failed."""
    from optuna.trial import TrialState

    for t in in_state(study, (TrialState.RUNNING,)):
        if owner_of(t).get("pid") == os.getpid():
            try:
                tid = trial_id(study, storage, t.number)
                for k, v in interrupted_attrs(signame).items():
                    storage.set_trial_user_attr(tid, k, v)
                storage.set_trial_state_values(tid, state=TrialState.FAIL)
                on_failed(storage.get_trial(tid))
            except Exception:
                pass


def trial_row(frozen, study_name: str, run_id: str | None, workload: str) -> dict:
    """A finished trial's headline numbers: its row of autotune_trials (``run_id``: this run's,
    for a trial that carries none)."""
    m = measurement_of(frozen)
    d = m.get("spec_delta") or {}
    cfg = config_of(frozen) or {}
    owner = owner_of(frozen)
    return {
        "study_name": study_name, "trial_number": frozen.number,
        "run_id": run_id_of(frozen) or run_id, "workload": workload,
        "role": role_of(frozen), "config_key": config_key_of(frozen),
        "method": cfg.get("method") if cfg else ("none" if says_config(frozen) else None),
        "k": cfg.get("num_speculative_tokens") if cfg else None, "state": frozen.state.name,
        "tpot_ms": frozen.value if frozen.state.name == "COMPLETE" and frozen.value != float("inf") else None,
        "acceptance_length": d.get("acceptance_length"), "acceptance_rate": d.get("acceptance_rate"),
        "output_tok_s": (m.get("summary") or {}).get("output_throughput_tok_s"),
        "failed_requests": (m.get("summary") or {}).get("failed"),
        "server_starts": server_starts_of(frozen),
        "start_seconds": m.get("start_seconds"),
        "error": error_of(frozen) or (str(frozen.system_attrs.get("fail_reason", ""))[:500] or None),
        "host": owner.get("host"), "log_path": log_path_of(frozen)}
