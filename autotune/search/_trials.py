"""Optuna glue of a study: its storage, the trials it keeps and what each trial carries.

A study lives in Optuna's RDB storage (SQLite by default) with heartbeats, so a trial whose
process stopped beating is failed and retried by whichever worker looks next (``_recovery``).
Each trial's user attributes say what it is (``role``, ``config_key``, the ``claim_key`` of what it
measures, ``owner``) and how it ended (``measurement``, ``error``, ``interrupted_by``); this module
reads and writes them for ``_study.Study``, and turns a finished trial into its row of
``autotune_trials`` (``trial_row``) for SRE reports and the exporter.
"""

from __future__ import annotations

import os
import warnings
from typing import Callable

from autotune.core._store import open_optuna_storage
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
    if study.user_attrs.get("hardware") is None:
        study.set_user_attr("hardware", hardware)
        study.set_user_attr("inputs", inputs)
    if study.user_attrs.get("workload") != workload:
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
                 and s.user_attrs.get("hardware") not in (None, hardware)]
    elif not leader and not any(s.study_name == default_name for s in summaries):
        other = [s for s in summaries if s.user_attrs.get("inputs") == inputs
                 and s.user_attrs.get("hardware") not in (None, hardware)]
    else:
        other = []
    if other:
        s = other[0]
        raise HardwareMismatch(
            f"study {s.study_name} was measured on {s.user_attrs['hardware']}, this host has {hardware}: trials from "
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
        if role and t.user_attrs.get("role") != role:
            continue
        if config_key and t.user_attrs.get("config_key") != config_key:
            continue
        out.append(t)
    return out


def in_state(study, states, claim_key: str | None = None) -> list:
    """The study's trials in ``states`` that claim ``claim_key`` (any, when None)."""
    return [t for t in study.get_trials(deepcopy=False, states=states)
            if claim_key is None or claim_key_of(t) == claim_key]


def claim_key_of(t) -> str | None:
    return t.user_attrs.get("claim_key") or t.user_attrs.get("config_key")


def may_take_over(holder, role: str) -> bool:
    """A claim passes on when its trial (``holder``, frozen) gave up: pruned, interrupted, or
    failed. A search trial does not retry a configuration vLLM already refused (that would only
    spend a start)."""
    if holder.state.name == "PRUNED":
        return True
    if holder.state.name == "FAIL":
        return role != ROLE_SEARCH or bool(holder.user_attrs.get("interrupted")) or "error" not in holder.user_attrs
    return False


def failed_here(trials, config_key: str) -> bool:
    """A trial of ``config_key`` failed in this process (not by a signal's interruption)."""
    return any(t.user_attrs.get("config_key") == config_key and t.state.name == "FAIL"
               and (t.user_attrs.get("owner") or {}).get("pid") == os.getpid()
               and not t.user_attrs.get("interrupted")
               for t in trials)


def interrupted_attrs(signame: str) -> dict:
    """What a trial stopped by the signal ``signame`` carries: the reason, and the mark that
    ``stopped_by_signal`` reads (such a start does not count against the budget)."""
    return {"error": f"interrupted by {signame}: vllm serve stopped, trial not measured", "interrupted": True,
            "interrupted_by": signame}


def stopped_by_signal(t) -> bool:
    """The trial's start was stopped by SIGINT or SIGTERM (``interrupted_by``; storages written before
    that mark say it in the error: ``interrupted by SIGINT: ...``), not by its process dying."""
    return bool(t.user_attrs.get("interrupted_by")) or \
        str(t.user_attrs.get("error") or "").startswith("interrupted by SIG")


def fail_own_running(study, storage, signame: str, on_failed: Callable) -> None:
    """After the signal ``signame``: any trial of this process still RUNNING is failed, marked as
    stopped by it (``interrupted_attrs``); ``on_failed`` gets each one so failed."""
    from optuna.trial import TrialState

    for t in in_state(study, (TrialState.RUNNING,)):
        if (t.user_attrs.get("owner") or {}).get("pid") == os.getpid():
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
    m = frozen.user_attrs.get("measurement") or {}
    d = m.get("spec_delta") or {}
    cfg = frozen.user_attrs.get("config") or {}
    owner = frozen.user_attrs.get("owner") or {}
    return {
        "study_name": study_name, "trial_number": frozen.number,
        "run_id": frozen.user_attrs.get("run_id") or run_id, "workload": workload,
        "role": frozen.user_attrs.get("role"), "config_key": frozen.user_attrs.get("config_key"),
        "method": cfg.get("method") if cfg else ("none" if "config" in frozen.user_attrs else None),
        "k": cfg.get("num_speculative_tokens") if cfg else None, "state": frozen.state.name,
        "tpot_ms": frozen.value if frozen.state.name == "COMPLETE" and frozen.value != float("inf") else None,
        "acceptance_length": d.get("acceptance_length"), "acceptance_rate": d.get("acceptance_rate"),
        "output_tok_s": (m.get("summary") or {}).get("output_throughput_tok_s"),
        "failed_requests": (m.get("summary") or {}).get("failed"),
        "server_starts": int(frozen.user_attrs.get("server_starts", 0)),
        "start_seconds": m.get("start_seconds"),
        "error": frozen.user_attrs.get("error") or (str(frozen.system_attrs.get("fail_reason", ""))[:500] or None),
        "host": owner.get("host"), "log_path": frozen.user_attrs.get("log_path")}
